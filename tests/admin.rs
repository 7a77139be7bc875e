//! `/admin/upstreams`: limits and health visible, and only with the key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use tidegate::simulate::Behavior;

async fn admin(gw: &tidegate::server::Running, key: Option<&str>) -> (u16, String) {
    let mut req = client().get(url(gw, "/admin/upstreams"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn admin_needs_its_key() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, body) = admin(&gw, Some("anything")).await;
    assert_eq!(status, 401, "no admin_key configured: admin is closed");
    assert!(!body.contains("upstreams"));

    let gw = gateway(&yaml(&sim, "admin_key: adm-secret-1", "", "")).await;
    for key in [None, Some("adm-secret-2"), Some("adm-secret")] {
        let (status, body) = admin(&gw, key).await;
        assert_eq!(status, 401, "{key:?}");
        assert!(!body.contains("sim-openai"), "data leaked without the key: {body}");
    }
    let (status, body) = admin(&gw, Some("adm-secret-1")).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = v["upstreams"].as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sim-openai", "sim-anthropic"]);
    assert_eq!(v["upstreams"][0]["health"]["state"], "ok");
    assert!(!body.contains(UPSTREAM_KEY), "an upstream key in the admin answer");
}

#[tokio::test]
async fn learned_limits_and_open_breakers_are_visible() {
    let sim = sim(&[
        ("real-gpt", Behavior { reject_over: Some(2), latency_ms: 100, ..Default::default() }),
        (
            "claude",
            Behavior {
                status: Some(401),
                error_body: r#"{"error":{"message":"bad key"}}"#.into(),
                ..Default::default()
            },
        ),
    ]);
    let gw = gateway(&yaml(&sim, "admin_key: adm", "    breaker_failures: 1\n    breaker_cooldown: 60s", "")).await;
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let u = url(&gw, "/v1/chat/completions");
            tokio::spawn(async move { client().post(u).body(r#"{"model":"gpt"}"#).send().await.unwrap().status() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let resp = client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let (_, body) = admin(&gw, Some("adm")).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let openai = &v["upstreams"][0];
    let limit = openai["effective_limit"].as_u64().unwrap();
    assert!(limit < 10, "learned limit not visible: {openai}");
    assert_eq!(openai["in_flight"], 0);
    let anthropic = &v["upstreams"][1];
    assert_eq!(anthropic["health"]["state"], "open", "{anthropic}");
    assert!(anthropic["health"]["for_ms"].as_u64().unwrap() > 50_000);
}
