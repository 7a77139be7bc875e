//! What coding agents need besides completions: Claude Code's
//! count_tokens and base-URL probe, model patterns so any model name a
//! client defaults to is served, embeddings, and their own headers
//! reaching the provider.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault};
use tokio::time::Instant;

const OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

async fn post(gw: &tidegate::server::Running, path: &str, body: &str) -> (u16, Value) {
    let resp = client().post(url(gw, path)).body(body.to_string()).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn model_sent(sim: &tidegate_simulate::Simulator, n: usize) -> String {
    let got = sim.state.received();
    serde_json::from_slice::<Value>(&got[n].body).unwrap()["model"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn count_tokens_is_retried_and_does_not_spend_the_token_budget() {
    let sim = sim(&[("claude", Behavior { script: vec![Fault::new(529, OVERLOADED)], ..Default::default() })]);
    // 600 tokens a minute: one messages request (1024 reserved) would wait.
    let gw = gateway(&yaml(&sim, "", "    tpm: 600", "")).await;
    let started = Instant::now();
    for i in 0..20 {
        let (status, v) = post(&gw, "/v1/messages/count_tokens", r#"{"model":"claude","messages":[]}"#).await;
        assert_eq!((status, v["input_tokens"].as_u64()), (200, Some(10)), "request {i}");
    }
    assert!(started.elapsed() < Duration::from_secs(3), "count_tokens waited for the tpm bucket");
    let got = sim.state.received();
    assert_eq!(got.len(), 21, "the 529 was retried");
    assert!(got.iter().all(|r| r.path == "/v1/messages/count_tokens"));
}

#[tokio::test]
async fn the_base_url_answers_a_probe() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    for method in [reqwest::Method::HEAD, reqwest::Method::GET] {
        let resp = client().request(method.clone(), url(&gw, "/")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{method}");
    }
    // Other paths still get a protocol-shaped 404.
    let resp = client().get(url(&gw, "/v1/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_serves(&gw).await;
}

#[tokio::test]
async fn model_patterns_serve_any_name_with_exact_and_longer_prefixes_first() {
    let sim = sim(&[]);
    let models = "  \"claude-*\":\n    targets: [{ upstream: sim-anthropic }]\n  \"claude-opus-*\":\n    targets: [{ upstream: sim-anthropic, model: opus-real }]\n  \"*\":\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    let messages =
        |m: &str| format!(r#"{{"model":"{m}","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}"#);
    // A name no alias lists: served under its own name.
    assert_eq!(post(&gw, "/v1/messages", &messages("claude-sonnet-4-5")).await.0, 200);
    assert_eq!(model_sent(&sim, 0), "claude-sonnet-4-5");
    // The longer literal prefix wins.
    assert_eq!(post(&gw, "/v1/messages", &messages("claude-opus-5-5")).await.0, 200);
    assert_eq!(model_sent(&sim, 1), "opus-real");
    // An exact alias wins over every pattern.
    assert_eq!(post(&gw, "/v1/messages", &messages("claude")).await.0, 200);
    assert_eq!(model_sent(&sim, 2), "claude");
    // "*" catches the rest, on every endpoint: an Anthropic client
    // reaches the OpenAI upstream translated to chat completions.
    assert_eq!(post(&gw, "/v1/chat/completions", &messages("gpt-5.1-codex")).await.0, 200);
    assert_eq!(model_sent(&sim, 3), "gpt-5.1-codex");
    let (status, v) = post(&gw, "/v1/messages", &messages("gpt-5.1-codex")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["type"].as_str(), v["content"][0]["type"].as_str()), (Some("message"), Some("text")), "{v}");
    let sent = &sim.state.received()[4];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(model_sent(&sim, 4), "gpt-5.1-codex");
    // /v1/models lists exact aliases only (of every protocol).
    let list: Value = client().get(url(&gw, "/v1/models")).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["gpt", "claude"]);
}

#[test]
fn check_reports_a_pattern_that_can_never_match() {
    let yaml = "upstreams:\n  - { name: u, protocol: openai, base_url: \"http://127.0.0.1:1/v1\" }\nmodels:\n  \"gpt-*\":\n    targets: [{ upstream: u }]\n  \"gpt-*-mini\":\n    targets: [{ upstream: u }]\n  \"gpt-5*\":\n    targets: [{ upstream: u }]\n";
    let err = tidegate::config::Config::parse(yaml, &|_| None).unwrap_err().to_string();
    assert!(err.contains("models.gpt-*-mini: this pattern can never match"), "{err}");
    assert!(!err.contains("models.gpt-5*"), "a longer prefix is tried first: {err}");
}

#[tokio::test]
async fn embeddings_are_forwarded_with_retries() {
    let busy = r#"{"error":{"message":"Rate limit reached for text-embedding tokens per min","type":"tokens"}}"#;
    let sim = sim(&[("real-gpt", Behavior { script: vec![Fault::new(429, busy)], ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, v) = post(&gw, "/v1/embeddings", r#"{"model":"gpt","input":["a","b"]}"#).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][0]["object"], "embedding");
    let got = sim.state.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].path, "/v1/embeddings");
    assert_eq!(&got[1].body[..], br#"{"model":"real-gpt","input":["a","b"]}"#);
}

#[tokio::test]
async fn client_headers_are_forwarded_except_credentials_and_hop_by_hop() {
    let sim = sim(&[]);
    let top = "client_keys: [{ name: agent, key: client-key-1 }]";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let resp = client()
        .post(url(&gw, "/v1/responses"))
        .bearer_auth("client-key-1")
        .header("session-id", "s-123")
        .header("x-codex-turn-metadata", "t-9")
        .header("originator", "codex_exec")
        .header("openai-beta", "responses=experimental")
        .header("x-client-request-id", "r-1")
        .header("cookie", "sid=secret")
        .header("x-api-key", "client-key-1")
        .header("x-tidegate-deadline", "30s")
        .header("connection", "keep-alive, x-hop-only")
        .header("x-hop-only", "1")
        .header("x-multi", "first")
        .header("x-multi", "second, and more")
        .body(r#"{"model":"gpt","input":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let headers = &sim.state.received()[0].headers;
    for (name, value) in [
        ("session-id", "s-123"),
        ("x-codex-turn-metadata", "t-9"),
        ("originator", "codex_exec"),
        ("openai-beta", "responses=experimental"),
        ("x-client-request-id", "r-1"),
    ] {
        assert_eq!(headers.get(name).and_then(|v| v.to_str().ok()), Some(value), "{name} forwarded");
    }
    let multi: Vec<&str> = headers.get_all("x-multi").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(multi, ["first", "second, and more"], "every value of a repeated header, in order");
    for name in ["cookie", "x-api-key", "x-tidegate-deadline", "x-hop-only"] {
        assert!(!headers.contains_key(name), "{name} must not be forwarded");
    }
    let auth = headers.get("authorization").unwrap().to_str().unwrap();
    assert_eq!(auth, format!("Bearer {UPSTREAM_KEY}"), "the upstream's key, never the client's");
}
