//! Failover and health: equivalent targets, cooldowns, breakers that heal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use tidegate_simulate::{Behavior, Fault};

/// A second simulator as upstream `backup`, and alias `multi` over
/// `sim-openai` (model `prim`) then `backup` (model `sec`).
fn two_targets(
    primary: &tidegate_simulate::Simulator,
    backup: &tidegate_simulate::Simulator,
    extra: &str,
    model_extra: &str,
) -> String {
    let text = yaml(
        primary,
        "",
        extra,
        &format!(
            "  multi:\n    targets: [{{ upstream: sim-openai, model: prim }}, {{ upstream: backup, model: sec }}]\n{model_extra}"
        ),
    );
    text.replace(
        "models:\n",
        &format!(
            "  - {{ name: backup, protocol: openai, base_url: \"{}\", api_key: k2 }}\nmodels:\n",
            backup.openai_url()
        ),
    )
}

async fn ask(gw: &tidegate::server::Running, body: &str) -> (u16, String) {
    let resp = client().post(url(gw, "/v1/chat/completions")).body(body.to_string()).send().await.unwrap();
    let upstream = resp.headers()["x-tidegate-upstream"].to_str().unwrap().to_string();
    let status = resp.status().as_u16();
    resp.bytes().await.unwrap();
    (status, upstream)
}

#[tokio::test(start_paused = true)]
async fn broken_primary_fails_over_with_the_same_request() {
    let primary =
        sim(&[("prim", Behavior { status: Some(503), error_body: "overloaded".into(), ..Default::default() })]);
    let backup = sim(&[]);
    let gw = gateway(&two_targets(&primary, &backup, "", "")).await;
    let body = r#"{"model":"multi","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"temperature":0.3,"x_unknown":[1,{"a":null}]}"#;
    for _ in 0..10 {
        assert_eq!(ask(&gw, body).await, (200, "backup".to_string()));
    }
    let first = &primary.state.received()[0].body;
    let second = &backup.state.received()[0].body;
    assert_eq!(std::str::from_utf8(first).unwrap(), body.replace(r#""multi""#, r#""prim""#));
    assert_eq!(std::str::from_utf8(second).unwrap(), body.replace(r#""multi""#, r#""sec""#));
    // Cooling down after its 503, the primary is not asked again at once.
    assert!(primary.state.received().len() < 5, "primary hit {} times", primary.state.received().len());
}

#[tokio::test(start_paused = true)]
async fn three_flaky_targets_still_serve_almost_everything() {
    let flaky = |_| Behavior { fail_rate: 0.7, ..Default::default() };
    let sim = sim(&[("a", flaky(0)), ("b", flaky(1)), ("c", flaky(2))]);
    let models = "  flaky:\n    targets: [{ upstream: sim-openai, model: a }, { upstream: u2, model: b }, { upstream: u3, model: c }]";
    let top =
        "defaults:\n  retry: { base_delay: 10ms, max_delay: 50ms, max_attempts: 20, budget_min_per_second: 1000 }";
    let text = yaml(&sim, top, "", models).replace(
        "models:\n",
        &format!(
            "  - {{ name: u2, protocol: openai, base_url: \"{0}\" }}\n  - {{ name: u3, protocol: openai, base_url: \"{0}\" }}\nmodels:\n",
            sim.openai_url()
        ),
    );
    let gw = gateway(&text).await;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let u = url(&gw, "/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let resp = client().post(u).body(r#"{"model":"flaky"}"#).send().await.unwrap();
            let attempts: u32 = resp.headers()["x-tidegate-attempts"].to_str().unwrap().parse().unwrap();
            (resp.status().as_u16(), attempts)
        }));
    }
    let mut ok = 0;
    let mut histogram = BTreeMap::new();
    for t in tasks {
        let (status, attempts) = t.await.unwrap();
        ok += usize::from(status == 200);
        *histogram.entry(attempts).or_insert(0) += 1;
    }
    eprintln!("3 targets failing 70%: {ok}/200 succeeded; attempts → requests: {histogram:?}");
    assert!(ok >= 198, "only {ok}/200 succeeded");
}

#[tokio::test(start_paused = true)]
async fn an_auth_failure_benches_the_primary_until_a_probe_succeeds() {
    let primary = sim(&[(
        "prim",
        Behavior {
            script: vec![Fault::new(401, r#"{"error":{"message":"Incorrect API key"}}"#)],
            ..Default::default()
        },
    )]);
    let backup = sim(&[]);
    let gw = gateway(&two_targets(&primary, &backup, "", "")).await;
    let body = r#"{"model":"multi"}"#;
    assert_eq!(ask(&gw, body).await, (200, "backup".into()), "auth failure on primary: secondary serves");
    // Benched at the first auth failure: the primary is skipped.
    assert_eq!(ask(&gw, body).await, (200, "backup".into()));
    assert_eq!(ask(&gw, body).await, (200, "backup".into()));
    assert_eq!(primary.state.received().len(), 1);
    // After the first interval one probe goes through; the key works again.
    tokio::time::sleep(tidegate::health::BENCH_FIRST + Duration::from_secs(1)).await;
    assert_eq!(ask(&gw, body).await, (200, "sim-openai".into()), "the probe");
    assert_eq!(ask(&gw, body).await, (200, "sim-openai".into()), "serving again");
    assert_eq!(primary.state.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn every_target_failing_gives_one_answer_naming_each() {
    let primary = sim(&[(
        "prim",
        Behavior {
            status: Some(503),
            error_body: r#"{"error":{"message":"overloaded"}}"#.into(),
            ..Default::default()
        },
    )]);
    let backup = sim(&[(
        "sec",
        Behavior { status: Some(500), error_body: r#"{"error":{"message":"boom"}}"#.into(), ..Default::default() },
    )]);
    let gw = gateway(&two_targets(&primary, &backup, "", "    deadline: 2s")).await;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"multi"}"#).send().await.unwrap();
    assert!(resp.status().is_server_error());
    let v: serde_json::Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("sim-openai (capacity error") && msg.contains("backup (transient error"), "{msg}");
    assert!(msg.contains("overloaded") && msg.contains("boom"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn balance_spreads_in_proportion_to_free_capacity() {
    let a = sim(&[("prim", Behavior { latency_ms: 400, ..Default::default() })]);
    let b = sim(&[("sec", Behavior { latency_ms: 400, ..Default::default() })]);
    let text = two_targets(&a, &b, "", "    strategy: balance")
        .replace(
            &format!("base_url: {}\n    api_key", a.openai_url()),
            &format!("base_url: {}\n    max_concurrent: 30\n    api_key", a.openai_url()),
        )
        .replace("api_key: k2 }", "api_key: k2, max_concurrent: 10 }");
    let gw = gateway(&text).await;
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let u = url(&gw, "/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let resp = client().post(u).body(r#"{"model":"multi"}"#).send().await.unwrap();
            resp.headers()["x-tidegate-upstream"].to_str().unwrap().to_string()
        }));
    }
    let mut counts = BTreeMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    eprintln!("balance over limits 30/10: {counts:?}");
    let (on_a, on_b) = (counts.get("sim-openai").copied().unwrap_or(0), counts.get("backup").copied().unwrap_or(0));
    assert!((26..=34).contains(&on_a) && (6..=14).contains(&on_b), "{counts:?}");
}

/// A request refused before any attempt — every target's provider asked
/// for a wait beyond its deadline — is answered about the target it would
/// have waited on (the one free soonest), not about the first in the list.
#[tokio::test(start_paused = true)]
async fn a_hold_beyond_the_deadline_names_the_target_it_waits_on() {
    let body = r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
    let held =
        |secs: &str| Behavior { script: vec![Fault::new(429, body).header("retry-after", secs)], ..Default::default() };
    let sim = sim(&[("first", held("300")), ("second", held("100"))]);
    let yaml = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\nupstreams:\n  - {{ name: u0, protocol: openai, base_url: \"{url}\" }}\n  - {{ name: u1, protocol: openai, base_url: \"{url}\" }}\nmodels:\n  m:\n    deadline: 10s\n    targets: [{{ upstream: u0, model: first }}, {{ upstream: u1, model: second }}]\n",
        url = sim.openai_url()
    );
    let gw = gateway(&yaml).await;
    let ask = || client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"m","messages":[]}"#).send();
    // Both providers refuse once, each asking for a wait past the deadline.
    let first = ask().await.unwrap();
    assert_eq!(first.headers()["x-tidegate-attempts"], "2");
    assert_eq!(first.headers()["x-tidegate-upstream"], "u1");
    // Now no attempt is made at all: the answer says whose wait it is.
    let second = ask().await.unwrap();
    assert_eq!(second.headers()["x-tidegate-attempts"], "0");
    assert_eq!(second.headers()["x-tidegate-upstream"], "u1", "the soonest-free target, not the first listed");
    let message = second.text().await.unwrap();
    assert!(message.contains("u1") && !message.contains("u0"), "{message}");
    assert_eq!(sim.state.received().len(), 2, "no attempt on the second request");
}
