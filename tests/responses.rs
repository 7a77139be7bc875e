//! The OpenAI Responses API (what Codex speaks): JSON and SSE relayed as
//! sent, failures hidden inside 200 answers found and retried, mid-stream
//! failures told in the protocol's own events, stored state pinned to the
//! upstream that holds it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate::protocol::Protocol;
use tidegate_simulate::{Behavior, Fault, sse_frames};

const RATE_LIMITED: &str =
    r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#;
const NO_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;

fn scripted(script: Vec<Fault>) -> Behavior {
    Behavior { chunks: 6, script, ..Default::default() }
}

async fn respond(gw: &tidegate::server::Running, body: &str) -> (reqwest::StatusCode, String) {
    let resp = client().post(url(gw, "/v1/responses")).body(body.to_string()).send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

fn request(model: &str, stream: bool) -> String {
    format!(r#"{{"model":"{model}","input":"hi","stream":{stream},"tools":[{{"type":"function","name":"f"}}]}}"#)
}

#[tokio::test]
async fn json_and_stream_are_relayed_as_sent_with_only_the_model_spliced() {
    let sim = sim(&[("real-gpt", Behavior { chunks: 6, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, text) = respond(&gw, &request("gpt", false)).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], "tok0 tok1 tok2 tok3 tok4 tok5 ");
    let got = sim.state.received();
    assert_eq!(got[0].path, "/v1/responses");
    assert_eq!(&got[0].body[..], request("real-gpt", false).as_bytes(), "every other byte as the client sent it");

    let (status, text) = respond(&gw, &request("gpt", true)).await;
    assert_eq!(status, 200);
    assert!(text.starts_with("event: response.created"), "{text}");
    assert!(text.trim_end().ends_with('}') && text.contains("event: response.completed"), "{text}");
    assert_eq!(text.matches("event: response.output_text.delta").count(), 6);
    // Usage read from response.completed reaches the metrics.
    let metrics = client().get(url(&gw, "/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"tidegate_tokens_total{direction="out",model="gpt"} 12"#), "{metrics}");
}

#[tokio::test]
async fn refusals_in_every_shape_are_retried_before_the_client_sees_anything() {
    let sim = sim(&[
        // A 429 without Retry-After (what made Codex quit).
        ("by-status", scripted(vec![Fault::new(429, RATE_LIMITED)])),
        // HTTP 200 whose first meaningful event is response.failed.
        ("by-frame", scripted(vec![Fault::error_frame(RATE_LIMITED)])),
        // HTTP 200, a response object with status "failed" (non-stream).
        ("by-object", scripted(vec![Fault::error_frame(RATE_LIMITED)])),
        // A stream that ends before any content.
        ("by-empty", scripted(vec![Fault::empty_stream()])),
    ]);
    let models = "  by-*:\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    for (model, stream) in [("by-status", true), ("by-frame", true), ("by-object", false), ("by-empty", true)] {
        let (status, text) = respond(&gw, &request(model, stream)).await;
        assert_eq!(status, 200, "{model}: {text}");
        assert!(!text.contains("failed") && !text.contains("rate_limit"), "{model}: the refusal leaked: {text}");
        if stream {
            let whole = String::from_utf8(sse_frames(Protocol::OpenAiResponses, model, 6).concat()).unwrap();
            let text = (0..10).fold(text, |t, n| t.replace(&format!("resp_sim_{n}\""), "resp_sim\""));
            assert_eq!(text, whole, "{model}: one whole answer");
        } else {
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["status"], "completed");
        }
        let tried = sim
            .state
            .received()
            .iter()
            .filter(|r| r.body.windows(model.len() + 2).any(|w| w == format!("\"{model}\"").as_bytes()))
            .count();
        assert_eq!(tried, 2, "{model}: one refusal, one answer");
    }
}

#[tokio::test]
async fn no_quota_is_final_and_incomplete_is_an_answer() {
    let incomplete = r#"{"id":"resp_x","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}"#;
    let sim = sim(&[
        ("quota", scripted(vec![Fault::error_frame(NO_QUOTA)])),
        ("short", Behavior { status: Some(200), error_body: incomplete.into(), ..Default::default() }),
    ]);
    let models = "  quota:\n    targets: [{ upstream: sim-openai }]\n  short:\n    targets: [{ upstream: sim-openai }]";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    let (status, text) = respond(&gw, &request("short", false)).await;
    assert_eq!((status.as_u16(), text.as_str()), (200, incomplete));
    // (An account out of quota is benched: asked second.)
    let (status, text) = respond(&gw, &request("quota", false)).await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("insufficient_quota"), "the provider's own error: {text}");
    assert_eq!(sim.state.received().len(), 2, "neither was retried");
}

#[tokio::test]
async fn a_mid_stream_failure_ends_with_response_failed_and_is_journaled_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("j.db");
    let sim = sim(&[("real-gpt", scripted(vec![Fault::drop_after(6)]))]);
    let top = format!("journal: {}\nadmin_key: adm", db.display());
    let gw = gateway(&yaml(&sim, &top, "", "")).await;
    let (status, text) = respond(&gw, &request("gpt", true)).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"delta\":\"tok1 \""), "{text}");
    assert!(!text.contains("response.completed"), "never a completed answer: {text}");
    let failed = text.find("event: response.failed").expect("response.failed");
    let error = text.find("event: error").expect("error event the SDKs raise on");
    assert!(failed < error, "{text}");
    assert!(text[error..].contains(r#""error":{"#), "{text}");
    let mut row = Value::Null;
    for _ in 0..200 {
        let v = admin_json(&gw, "/admin/requests?outcome=incomplete").await;
        if let Some(r) = v["requests"].as_array().and_then(|a| a.first()) {
            row = r.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(row["outcome"], "incomplete", "{row}");
    let detail = admin_json(&gw, &format!("/admin/requests/{}", row["id"].as_str().unwrap())).await;
    assert_eq!(detail["partial"], "tok0 tok1 ", "{detail}");
    assert_eq!(sim.state.received().len(), 1, "content had reached the client: never retried");
}

/// Two accounts: `a` (first) and `b`. A response stored at `a` is continued
/// at `a` only — retried there, never moved to `b` (which would answer
/// "not found") — while a `store: false` request fails over freely.
#[tokio::test]
async fn stored_state_is_pinned_to_the_upstream_that_holds_it() {
    let busy = r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#;
    let a = sim(&[(
        "m",
        scripted(vec![Fault::drop_after(100), Fault::new(503, busy), Fault::drop_after(100), Fault::new(503, busy)]),
    )]);
    let b = sim(&[]);
    let top = "defaults:\n  retry: { base_delay: 10ms, max_delay: 50ms }";
    let config = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\n{top}\nupstreams:\n  - {{ name: a, protocol: openai, base_url: \"{}\" }}\n  - {{ name: b, protocol: openai, base_url: \"{}\" }}\nmodels:\n  m:\n    targets: [{{ upstream: a }}, {{ upstream: b }}]\n  only-b:\n    targets: [{{ upstream: b, model: m }}]\n",
        a.openai_url(),
        b.openai_url()
    );
    let gw = gateway(&config).await;
    let (status, text) = respond(&gw, r#"{"model":"m","input":"hi"}"#).await;
    assert_eq!(status, 200);
    let id = serde_json::from_str::<Value>(&text).unwrap()["id"].as_str().unwrap().to_owned();
    // Continuing it: a refuses once (503), b is free — and still a it is.
    let next = format!(r#"{{"model":"m","input":"more","previous_response_id":"{id}"}}"#);
    let (status, text) = respond(&gw, &next).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!((a.state.received().len(), b.state.received().len()), (3, 0), "retried at a only");
    // Without stored state the same situation — a just refused — sends
    // the request to b, which is ready while a cools down.
    let (status, _) = respond(&gw, r#"{"model":"m","input":"x","store":false}"#).await;
    assert_eq!(status, 200);
    assert_eq!((a.state.received().len(), b.state.received().len()), (3, 1), "went to b");
    // An alias that cannot reach the holder says so instead of asking b.
    let elsewhere = format!(r#"{{"model":"only-b","input":"x","previous_response_id":"{id}"}}"#);
    let (status, text) = respond(&gw, &elsewhere).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("stored at upstream a"), "{text}");
    assert_eq!(b.state.received().len(), 1);
}
