//! The retry engine end to end: capacity errors absorbed, real errors
//! immediate, honest answers when waiting runs out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault};
use tokio::io::AsyncWriteExt;

const C3009: &str = r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#;
const SESSION: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You've hit your session limit · resets 3:20am (America/New_York)"}}"#;

fn scripted(script: Vec<Fault>) -> Behavior {
    Behavior { script, ..Default::default() }
}

fn always(status: u16, body: &str) -> Behavior {
    Behavior { status: Some(status), error_body: body.into(), ..Default::default() }
}

#[tokio::test(start_paused = true)]
async fn concurrency_429_without_retry_after_is_absorbed() {
    let sim = sim(&[("real-gpt", scripted(vec![Fault::new(429, C3009), Fault::new(429, C3009)]))]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}],"temperature":0.2}"#;
    let resp = post(&gw, "/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "3");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    // Every attempt carried byte-identical bodies.
    let got = sim.state.received();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| r.body == got[0].body));
}

#[tokio::test(start_paused = true)]
async fn each_answer_decides_its_own_wait() {
    let sim = sim(&[(
        "real-gpt",
        scripted(vec![
            Fault::new(429, C3009).header("retry-after-ms", "300"),
            Fault::new(429, C3009).header("retry-after", "1"),
        ]),
    )]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 200);
    let at: Vec<Instant> = sim.state.received().iter().map(|r| r.at).collect();
    assert_eq!(at.len(), 3);
    let (first, second) = (at[1] - at[0], at[2] - at[1]);
    assert!(first >= Duration::from_millis(300) && first < Duration::from_millis(900), "first wait {first:?}");
    assert!(second >= Duration::from_secs(1), "Retry-After: 1 not honoured: {second:?}");
}

#[tokio::test(start_paused = true)]
async fn unmatched_400_is_one_hit_and_verbatim() {
    let no_plan = r#"{"error_code":"TM.00001005","error_msg":"无正常可用套餐"}"#;
    let rules = "    retry:\n      - { on_status: [400, 429], on_body_contains: [\"TM.00001041\"], delay: 10ms, max_attempts: 18 }";
    let sim = sim(&[("real-gpt", always(400, no_plan))]);
    let gw = gateway(&yaml(&sim, "", rules, "")).await;
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "1");
    assert_eq!(resp.text().await.unwrap(), no_plan);
    assert_eq!(sim.state.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn operator_rule_retries_a_vendor_400_and_fatal_rule_stops() {
    let busy = r#"{"error_code":"TM.00001041","error_msg":"并发会话数已达上限(3个)"}"#;
    let no_plan = r#"{"error_code":"TM.00001005","error_msg":"无正常可用套餐"}"#;
    let rules = "    retry:\n      - { on_status: [400, 429], on_body_contains: [\"TM.00001041\", \"TPM limit\"], delay: 50ms, max_attempts: 18 }\n    fatal:\n      - { on_body_contains: [\"TM.00001005\"] }";
    let sim = sim(&[
        (
            "real-gpt",
            scripted(vec![Fault::new(400, busy), Fault::new(400, busy), Fault::new(429, "TPM limit reached")]),
        ),
        // A fatal body even under a capacity status: one attempt.
        ("claude", always(429, no_plan)),
    ]);
    let gw = gateway(&yaml(&sim, "", rules, "")).await;
    let started = Instant::now();
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "4");
    assert!(started.elapsed() >= Duration::from_millis(150), "rule delay not used");
    let resp = post(&gw, "/v1/messages", r#"{"model":"claude"}"#).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "1");
    assert_eq!(resp.text().await.unwrap(), no_plan);
}

#[tokio::test(start_paused = true)]
async fn insufficient_quota_is_not_retried() {
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let sim = sim(&[("real-gpt", always(429, quota))]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.text().await.unwrap(), quota);
    assert_eq!(sim.state.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn session_limit_ends_within_the_deadline_with_an_honest_answer() {
    let sim = sim(&[("claude", always(429, SESSION))]);
    let top = "defaults:\n  deadline: 60s\n  retry: { base_delay: 100ms, max_delay: 400ms, max_attempts: 50 }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let started = Instant::now();
    let resp =
        post_with(&gw, "/v1/messages", ("x-tidegate-deadline", "2s"), r#"{"model":"claude","max_tokens":10}"#).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2600), "deadline not kept: {took:?}");
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let attempts: u32 = resp.headers()["x-tidegate-attempts"].to_str().unwrap().parse().unwrap();
    assert!(attempts >= 3, "only {attempts} attempts");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let msg = v["error"]["message"].as_str().unwrap();
    for needle in ["sim-anthropic", "session limit", "projects a reset at", "capacity", "attempts", "Retry after"] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    assert_eq!(sim.state.received().len() as u32, attempts);
}

#[tokio::test(start_paused = true)]
async fn hint_longer_than_the_deadline_answers_at_once() {
    // Every answer says "come back in 60 s"; the deadline is 5 s.
    let sim = sim(&[(
        "real-gpt",
        scripted(vec![
            Fault::new(429, C3009).header("retry-after", "60"),
            Fault::new(429, C3009).header("retry-after", "60"),
        ]),
    )]);
    let gw = gateway(&yaml(&sim, "defaults:\n  deadline: 5s", "", "")).await;
    let started = Instant::now();
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert!(started.elapsed() < Duration::from_secs(2), "slept on a hopeless hint");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "60");
    assert_eq!(sim.state.received().len(), 1);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("60s"));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_after_the_client_is_gone() {
    let sim = sim(&[("real-gpt", always(503, r#"{"error":{"message":"overloaded"}}"#))]);
    let top = "defaults:\n  retry: { base_delay: 600ms, max_delay: 600ms }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = r#"{"model":"gpt"}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    eventually("first attempt", || sim.state.received().len() == 1).await;
    drop(conn);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(sim.state.received().len(), 1, "an attempt was made for a client that had gone");
}

#[tokio::test(start_paused = true)]
async fn a_chained_tidegate_makes_one_attempt_and_relays_verbatim() {
    let sim = sim(&[("real-gpt", always(429, C3009))]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-hop", "1"), r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("x-should-retry").is_none(), "the outer tidegate must stay free to retry");
    assert_eq!(resp.text().await.unwrap(), C3009);
    assert_eq!(sim.state.received().len(), 1);
    // tidegate marks its own upstream requests so the next hop knows.
    assert_eq!(sim.state.received()[0].headers["x-tidegate-hop"], "1");
}

#[tokio::test(start_paused = true)]
async fn retry_budget_paces_blind_retries_and_fails_only_when_time_runs_out() {
    let busy = r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#;
    let sim = sim(&[
        // Eight refusals, then answers: an outage that ends.
        ("real-gpt", scripted((0..8).map(|_| Fault::new(503, busy)).collect())),
        ("down", always(503, busy)),
    ]);
    // Budget: no ratio, a floor of 0.5 retries/s — a ten-second burst of 5
    // (plus the one due now), then one every 2 s. The backoff itself is tiny.
    let top = "defaults:\n  deadline: 10s\n  retry: { base_delay: 10ms, max_delay: 10ms, budget_ratio: 0, budget_min_per_second: 0.5 }";
    let models = "  down:\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(&sim, top, "", models)).await;
    let started = Instant::now();
    let resp = post(&gw, "/v1/chat/completions", r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 200, "the budget paced the retries, it did not fail the request");
    let took = started.elapsed();
    assert_eq!(sim.state.received().len(), 9, "1 attempt + 6 at once + 2 paced");
    assert!(took >= Duration::from_millis(3500) && took < Duration::from_secs(8), "paced: {took:?}");
    // An outage that does not end, a 2 s deadline, the budget used up by
    // the request above: the next free retry is beyond the deadline — an
    // honest 503 at once, not a wait that cannot end well.
    let started = Instant::now();
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "2s"), r#"{"model":"down"}"#).await;
    assert_eq!(resp.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // Capacity expected to free within what an SDK waits: "come back".
    assert_eq!(resp.headers()["x-should-retry"], "true");
    let retry_after: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry_after), "{retry_after}");
    let retry_after_ms: u64 = resp.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!(retry_after_ms <= retry_after * 1000 && retry_after_ms + 1000 > retry_after * 1000, "{retry_after_ms}");
    let v: Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("retry budget") && !msg.contains("provider asked"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn stream_request_is_retried_before_any_byte() {
    let sim = sim(&[(
        "claude",
        scripted(vec![Fault::new(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )]),
    )]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = post(&gw, "/v1/messages", r#"{"model":"claude","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "2");
    let text = resp.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(!text.contains("overloaded_error"));
}

#[tokio::test(start_paused = true)]
async fn malformed_deadline_header_is_a_clear_400() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "soonish"), r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("x-tidegate-deadline"));
    assert_serves(&gw).await;
}

#[tokio::test(start_paused = true)]
async fn a_providers_retry_after_holds_new_requests_until_then() {
    let limited = rate_limited_once("1");
    let sim = sim(&[("real-gpt", limited)]);
    let top = "defaults:\n  stream_keepalive_after: 200ms\n  stream_keepalive_every: 200ms";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#;
    // The first request meets the 429 and, with only 500 ms to spend,
    // answers at once with the provider's wait.
    let first = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "500ms"), body).await;
    assert_eq!(first.status(), 429);
    // A new streaming request is held until the second is over — nothing
    // is sent upstream meanwhile — and the client hears why.
    let started = Instant::now();
    let stream = r#"{"model":"gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "10s"), stream).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(700), "sent before the provider's Retry-After ran out");
    assert!(text.starts_with(": waiting for capacity — before the first attempt\n\n"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(sim.state.received().len(), 2, "one refused request, one held then sent");
}
