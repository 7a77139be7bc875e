//! What tidegate answers by itself: bad input, bad keys, unreachable
//! upstreams, each in the client's protocol, each followed by a request
//! that must be served normally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use tidegate_simulate::Behavior;

async fn post(gw: &tidegate::server::Running, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = client().post(url(gw, path)).body(body).send().await.unwrap();
    let status = resp.status().as_u16();
    assert!(resp.headers().contains_key("x-tidegate-request-id"));
    assert_eq!(resp.headers()["content-type"], "application/json");
    (status, resp.json().await.unwrap())
}

/// OpenAI shape: `{"error":{"message","type","code"}}`.
fn openai_error(v: &Value) -> (&str, &str) {
    let e = &v["error"];
    assert!(e.get("code").is_some(), "no code in {v}");
    (e["type"].as_str().unwrap(), e["message"].as_str().unwrap())
}

/// Anthropic shape: `{"type":"error","error":{"type","message"}}`.
fn anthropic_error(v: &Value) -> (&str, &str) {
    assert_eq!(v["type"], "error", "{v}");
    (v["error"]["type"].as_str().unwrap(), v["error"]["message"].as_str().unwrap())
}

#[tokio::test]
async fn malformed_json_is_400_then_serves() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, v) = post(&gw, "/v1/chat/completions", r#"{"model":"gpt","messages":[}"#).await;
    assert_eq!(status, 400);
    let (kind, msg) = openai_error(&v);
    assert_eq!(kind, "invalid_request_error");
    assert!(msg.contains("not a JSON object"), "{msg}");
    assert_serves(&gw).await;
    let (status, v) = post(&gw, "/v1/messages", "not json at all").await;
    assert_eq!(status, 400);
    assert_eq!(anthropic_error(&v).0, "invalid_request_error");
    assert_serves(&gw).await;
    assert_eq!(sim.state.received().len(), 2, "bad requests must not reach the upstream");
}

#[tokio::test]
async fn missing_model_is_400_then_serves() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, v) = post(&gw, "/v1/chat/completions", r#"{"messages":[]}"#).await;
    assert_eq!(status, 400);
    assert!(openai_error(&v).1.contains("\"model\""));
    let (status, v) = post(&gw, "/v1/messages", r#"{"model":42}"#).await;
    assert_eq!(status, 400);
    assert!(anthropic_error(&v).1.contains("must be a string"));
    assert_serves(&gw).await;
}

#[tokio::test]
async fn unknown_model_is_404_listing_aliases_then_serves() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "  gpt-mini:\n    targets: [{ upstream: sim-openai }]")).await;
    let (status, v) = post(&gw, "/v1/chat/completions", r#"{"model":"gpt-7"}"#).await;
    assert_eq!(status, 404);
    let (kind, msg) = openai_error(&v);
    assert_eq!(kind, "invalid_request_error");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(msg.contains("gpt-7") && msg.contains("gpt, claude, gpt-mini"), "{msg}");
    // An alias of the other protocol is reached translated; a body that
    // cannot be translated is refused at the boundary, the field named,
    // in the client's shape, and never sent.
    let before = sim.state.received().len();
    let (status, v) = post(&gw, "/v1/messages", r#"{"model":"gpt"}"#).await;
    assert_eq!(status, 400, "{v}");
    let (kind, msg) = anthropic_error(&v);
    assert_eq!(kind, "invalid_request_error");
    assert!(msg.contains("messages: must be an array") && msg.contains("sim-openai"), "{msg}");
    assert_eq!(sim.state.received().len(), before);
    assert_serves(&gw).await;
}

#[tokio::test]
async fn body_over_limit_is_413_then_serves() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "max_body: 1KiB", "", "")).await;
    let big = format!(r#"{{"model":"gpt","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(4096));
    let (status, v) = post(&gw, "/v1/chat/completions", big.clone()).await;
    assert_eq!(status, 413);
    assert!(openai_error(&v).1.contains("1024 bytes"));
    // Without Content-Length (chunked), the limit holds while reading.
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(big[..2000].to_string()), Ok(big[2000..].to_string())];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let (status, v) = post(&gw, "/v1/messages", body).await;
    assert_eq!(status, 413);
    assert_eq!(anthropic_error(&v).0, "request_too_large");
    assert_serves(&gw).await;
    assert_eq!(sim.state.received().len(), 1);
}

#[tokio::test]
async fn unreachable_upstream_is_502_then_serves() {
    let sim = sim(&[]);
    // A port that was free a moment ago: nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let models = "  dead:\n    targets: [{ upstream: dead }]\n  dead-claude:\n    targets: [{ upstream: dead-a }]\n";
    let mut text = yaml(&sim, "", "", models);
    text = text.replace(
        "models:\n",
        &format!(
            "  - {{ name: dead, protocol: openai, base_url: \"http://{dead}/v1\" }}\n  - {{ name: dead-a, protocol: anthropic, base_url: \"http://{dead}\" }}\nmodels:\n"
        ),
    );
    let gw = gateway(&text).await;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"dead"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "dead");
    let v: Value = resp.json().await.unwrap();
    let (kind, msg) = openai_error(&v);
    assert_eq!(kind, "api_error");
    assert!(msg.contains("dead") && msg.contains("unreachable"), "{msg}");
    let (status, v) = post(&gw, "/v1/messages", r#"{"model":"dead-claude"}"#).await;
    assert_eq!(status, 502);
    assert_eq!(anthropic_error(&v).0, "api_error");
    assert_serves(&gw).await;
}

#[tokio::test]
async fn client_keys_are_required_and_checked() {
    let sim = sim(&[]);
    let top = "client_keys:\n  - { name: alice, key: ck-alice-777 }\n  - { name: bob, key: ck-bob-888 }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let body = r#"{"model":"gpt"}"#;
    let c = client();

    let resp = c.post(url(&gw, "/v1/chat/completions")).body(body).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(openai_error(&v).0, "authentication_error");

    let resp = c
        .post(url(&gw, "/v1/messages"))
        .header("x-api-key", "ck-alice-778")
        .body(r#"{"model":"claude"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(anthropic_error(&v).0, "authentication_error");

    let resp = c.get(url(&gw, "/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(sim.state.received().len(), 0, "rejected requests must not reach the upstream");

    let resp = c.post(url(&gw, "/v1/chat/completions")).bearer_auth("ck-bob-888").body(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = c
        .post(url(&gw, "/v1/messages"))
        .header("x-api-key", "ck-alice-777")
        .body(r#"{"model":"claude"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = c.get(url(&gw, "/v1/models")).bearer_auth("ck-alice-777").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    for r in sim.state.received() {
        for (_, value) in &r.headers {
            let v = value.to_str().unwrap_or("");
            assert!(!v.contains("ck-alice") && !v.contains("ck-bob"), "client key forwarded: {v}");
        }
    }
    let resp = c.get(url(&gw, "/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "health needs no key");
}

#[tokio::test]
async fn unknown_path_is_a_protocol_shaped_404() {
    let sim = sim(&[("x", Behavior::default())]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = client().post(url(&gw, "/v1/completions")).body("{}").send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert!(openai_error(&v).1.contains("/v1/completions"));
}
