//! `/admin/upstreams`: limits and health visible, and only with the key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use tidegate_simulate::Behavior;

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
async fn learned_limits_and_benched_upstreams_are_visible() {
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
    // An auth refusal benches the upstream at the first answer.
    assert_eq!(anthropic["health"]["state"], "benched", "{anthropic}");
    assert!(anthropic["health"]["reason"].as_str().unwrap().starts_with("auth error: 401"), "{anthropic}");
    assert!(anthropic["health"]["for_ms"].as_u64().unwrap() > 50_000);
}

#[tokio::test]
async fn metrics_count_requests_and_never_show_a_key() {
    let client_key = "ck-metrics-secret-9";
    let sim = sim(&[(
        "claude",
        Behavior { status: Some(400), error_body: r#"{"error":{"message":"bad"}}"#.into(), ..Default::default() },
    )]);
    let top = format!("admin_key: adm\nclient_keys: [{{ name: alice, key: {client_key} }}]");
    let gw = gateway(&yaml(&sim, &top, "    max_concurrent: 7", "")).await;
    let ok = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth(client_key)
        .body(r#"{"model":"gpt"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    ok.bytes().await.unwrap();
    let bad = client()
        .post(url(&gw, "/v1/messages"))
        .bearer_auth(client_key)
        .body(r#"{"model":"claude"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    // An unknown model must not become a label.
    let unknown = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth(client_key)
        .body(r#"{"model":"made-up-by-client"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    assert_eq!(client().get(url(&gw, "/metrics")).send().await.unwrap().status(), 401);
    let mut text = String::new();
    for _ in 0..50 {
        text = client().get(url(&gw, "/metrics")).bearer_auth("adm").send().await.unwrap().text().await.unwrap();
        if text.contains(r#"outcome="failed""#) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        text.contains(r#"tidegate_requests_total{class="-",model="gpt",outcome="completed",upstream="sim-openai"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tidegate_requests_total{class="request",model="claude",outcome="failed",upstream="sim-anthropic"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"tidegate_upstream_state{upstream="sim-openai",what="effective_limit"} 7"#), "{text}");
    assert!(text.contains("tidegate_ttfb_seconds_bucket"), "{text}");
    assert!(text.contains(r#"tidegate_attempts_total{upstream="sim-openai",verdict="ok"} 1"#), "{text}");
    assert!(!text.contains("made-up-by-client"), "client-supplied label");
    for secret in [client_key, UPSTREAM_KEY, "adm\n"] {
        assert!(!text.contains(secret), "a key in /metrics");
    }
}

#[tokio::test]
async fn dashboard_page_is_static_and_its_data_needs_the_key() {
    let sim = sim(&[("broken", Behavior { status: Some(500), ..Default::default() })]);
    let models = "  broken:\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(
        &sim,
        "admin_key: adm-secret-1\ndefaults:\n  retry: { max_attempts: 2, base_delay: 5ms, max_delay: 10ms }",
        "",
        models,
    ))
    .await;
    let page = client().get(url(&gw, "/ui")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("default-src 'self'"), "nothing fetched from elsewhere: {csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"login-form\"") && html.contains("/ui/app.js"), "{html}");
    let js = client().get(url(&gw, "/ui/app.js")).send().await.unwrap();
    assert_eq!(js.headers()["content-type"], "text/javascript; charset=utf-8");
    let js = js.text().await.unwrap();
    assert!(js.contains("sessionStorage") && !js.contains("innerHTML"), "key in session storage, data as text");
    assert_eq!(client().get(url(&gw, "/ui/secret.txt")).send().await.unwrap().status(), 404);

    assert_serves(&gw).await;
    let failed = client()
        .post(url(&gw, "/v1/chat/completions"))
        .body(r#"{"model":"broken","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 502);

    for key in [None, Some("wrong")] {
        let mut req = client().get(url(&gw, "/admin/stats"));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        assert!(!resp.text().await.unwrap().contains("sim-openai"));
    }
    let stats: Value =
        client().get(url(&gw, "/admin/stats")).bearer_auth("adm-secret-1").send().await.unwrap().json().await.unwrap();
    let openai = &stats["upstreams"][0];
    assert_eq!(openai["name"], "sim-openai");
    let sum = |k: &str| openai["buckets"].as_array().unwrap().iter().map(|b| b[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("completed"), sum("failed"), sum("transient")), (1, 1, 2), "{stats}");
    assert_eq!(stats["upstreams"][1]["name"], "sim-anthropic");
}
