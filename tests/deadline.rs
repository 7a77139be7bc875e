//! A capacity error ends a request only at its deadline: refusals at
//! random are absorbed within it (one target or three), the retry budget
//! paces instead of failing, a client that gives up early cannot open a
//! breaker for everyone, and keep-alives cannot stretch a handshake past
//! the deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault, SimConfig, Simulator};
use tokio::time::Instant;

/// A provider refusing `rate` of all requests at random (`503 overloaded`),
/// seeded so runs repeat.
fn flaky(rate: f64, seed: u64) -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::refusing(rate, seed)).unwrap()
}

/// `n` concurrent chat requests; the statuses and the time each took.
async fn burst(gw: &tidegate::server::Running, n: usize) -> Vec<(u16, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let url = url(gw, "/v1/chat/completions");
            tokio::spawn(async move {
                let started = Instant::now();
                let resp = reqwest::Client::builder()
                    .timeout(Duration::from_secs(40))
                    .build()
                    .unwrap()
                    .post(url)
                    .body(format!(r#"{{"model":"m","messages":[{{"role":"user","content":"request {i}"}}]}}"#))
                    .send()
                    .await
                    .unwrap();
                (resp.status().as_u16(), started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Default settings but for a 25 s deadline, `targets` upstreams each in
/// front of its own flaky simulator.
fn config(sims: &[&Simulator]) -> String {
    let upstreams: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  - {{ name: u{i}, protocol: openai, base_url: \"{}\" }}\n", s.openai_url()))
        .collect();
    let targets: Vec<String> = (0..sims.len()).map(|i| format!("{{ upstream: u{i} }}")).collect();
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  deadline: 25s\nupstreams:\n{upstreams}models:\n  m:\n    targets: [{}]\n",
        targets.join(", ")
    )
}

#[tokio::test(start_paused = true)]
async fn seventy_percent_refusals_on_one_target_are_absorbed_within_the_deadline() {
    let sim = flaky(0.7, 17);
    let gw = gateway(&config(&[&sim])).await;
    let results = burst(&gw, 30).await;
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    let attempts = sim.state.received().len();
    assert!(ok >= 27, "{ok}/30 succeeded: {results:?}");
    for (status, took) in &results {
        if *status != 200 {
            // Failures come only when time is up, never "the budget is spent" early.
            assert!(*took >= Duration::from_secs(20), "failed after {took:?} with deadline left");
        }
    }
    // Upstream traffic stays within the budget: 30 first attempts, 20% of
    // them, 5/s over the run plus its burst; at 70% refusals a success
    // costs 1/0.3 = 3.3 attempts on average.
    let per_success = attempts as f64 / ok as f64;
    assert!(per_success < 6.0, "{attempts} attempts for {ok} answers");
}

#[tokio::test(start_paused = true)]
async fn seventy_percent_refusals_on_three_targets_are_all_absorbed() {
    let sims = [flaky(0.7, 1), flaky(0.7, 2), flaky(0.7, 3)];
    let gw = gateway(&config(&[&sims[0], &sims[1], &sims[2]])).await;
    let results = burst(&gw, 30).await;
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(ok, 30, "{results:?}");
    let attempts: usize = sims.iter().map(|s| s.state.received().len()).sum();
    assert!(attempts as f64 / 30.0 < 6.0, "{attempts} attempts");
}

/// Requests their own clients abandon (here: an 50 ms deadline against a
/// 300 ms answer) say nothing about the upstream: its breaker stays closed
/// and the next client is served.
#[tokio::test(start_paused = true)]
async fn abandoned_requests_do_not_open_the_breaker_for_others() {
    let sim = sim(&[("real-gpt", Behavior { latency_ms: 300, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "admin_key: adm", "    breaker_failures: 3", "")).await;
    for _ in 0..8 {
        let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "50ms"), r#"{"model":"gpt"}"#).await;
        assert_eq!(resp.status(), 504);
        let v: Value = resp.json().await.unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("still answering"), "{v}");
    }
    let health: Value =
        client().get(url(&gw, "/admin/upstreams")).bearer_auth("adm").send().await.unwrap().json().await.unwrap();
    let openai = &health["upstreams"][0];
    assert_eq!(openai["health"]["state"], "ok", "{health}");
    assert_eq!(openai["health"]["failure_streak"], 0, "{health}");
    assert_serves(&gw).await;
}

/// An upstream that only sends SSE comments does not hold the request
/// past its deadline.
#[tokio::test(start_paused = true)]
async fn keepalives_do_not_stretch_a_handshake_past_the_deadline() {
    let pinging = Behavior { first_chunk_delay_ms: 30_000, ping_every_ms: Some(100), ..Default::default() };
    let sim = sim(&[("real-gpt", pinging)]);
    let top =
        "defaults:\n  deadline: 1s\n  stream_keepalive_after: \"off\"\n  retry: { base_delay: 10ms, max_delay: 50ms }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let started = Instant::now();
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .body(r#"{"model":"gpt","stream":true,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "answered after {took:?}");
    assert!(resp.text().await.unwrap().contains("deadline"));
    eventually("the upstream stream closed", || sim.state.cancelled.load(std::sync::atomic::Ordering::SeqCst) >= 1)
        .await;
}

/// Whose wait it was, said truly: a provider's `Retry-After` beyond the
/// deadline is the provider's; tidegate's own backoff is never put on it.
#[tokio::test(start_paused = true)]
async fn the_give_up_message_says_who_asked_for_the_wait() {
    let body = r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
    let sim = sim(&[
        (
            "real-gpt",
            Behavior { script: vec![Fault::new(429, body).header("retry-after", "29")], ..Default::default() },
        ),
        ("busy", Behavior { status: Some(503), error_body: body.into(), ..Default::default() }),
    ]);
    let top = "defaults:\n  deadline: 3s\n  retry: { base_delay: 500ms, max_delay: 30s }";
    let models = "  busy:\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(&sim, top, "", models)).await;
    // A second gateway: the first one's upstream is held for 29 s now.
    let fresh = gateway(&yaml(&sim, top, "", models)).await;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await.unwrap();
    assert_eq!(resp.headers()["retry-after"], "29");
    let v: Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("the provider asked (retry-after) for 29s"), "{msg}");

    let started = Instant::now();
    let resp = client().post(url(&fresh, "/v1/chat/completions")).body(r#"{"model":"busy"}"#).send().await.unwrap();
    let took = started.elapsed();
    assert_eq!(resp.status(), 503);
    let retry_after: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after <= 30, "{retry_after}");
    let v: Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(!msg.contains("provider asked"), "tidegate's backoff put on the provider: {msg}");
    assert!(msg.contains("tidegate's backoff"), "{msg}");
    // The backoff was clipped to the deadline: the last attempt went out
    // with base_delay to spare, and the answer came before the deadline.
    assert!(took > Duration::from_millis(2000) && took < Duration::from_secs(3), "{took:?}");
}
