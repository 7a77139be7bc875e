//! Pass-through: bodies byte-exact but for `model`, headers, streaming.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use futures_util::StreamExt;
use tidegate::protocol::Protocol;
use tidegate_simulate::{Behavior, sse_frames};

#[tokio::test]
async fn openai_renames_model_and_keeps_every_other_byte() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = r#"{"z_first":true,  "model" : "gpt","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],"tools":[{"type":"function","function":{"name":"model","parameters":{"type":"object","properties":{}}}}],"unknown_field":{"nested":[1,2.50,null,"\u00e9"]},"temperature":0.70}"#;
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .header("authorization", "Bearer client-key-should-not-travel")
        .header("openai-organization", "org-1")
        .header("cookie", "c=1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "sim-openai");
    assert!(!resp.headers()["x-tidegate-request-id"].is_empty());
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["model"], "real-gpt");

    let got = sim.state.received();
    assert_eq!(got.len(), 1);
    let expected = body.replacen(r#""gpt""#, r#""real-gpt""#, 1);
    assert_eq!(std::str::from_utf8(&got[0].body).unwrap(), expected);
    assert_eq!(got[0].path, "/v1/chat/completions");
    let h = &got[0].headers;
    assert_eq!(h["authorization"], format!("Bearer {UPSTREAM_KEY}"));
    assert_eq!(h["openai-organization"], "org-1");
    assert!(h.get("cookie").is_none());
    for (_, value) in h {
        assert!(!value.to_str().unwrap_or("").contains("client-key-should-not-travel"));
    }
}

#[tokio::test]
async fn unchanged_model_name_sends_identical_bytes() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = "{\n  \"model\": \"claude\",\n  \"max_tokens\": 10,\n  \"messages\": [{\"role\":\"user\",\"content\":\"hi\"}]\n}";
    let resp = client().post(url(&gw, "/v1/messages")).body(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(&sim.state.received()[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn anthropic_stream_is_relayed_byte_for_byte_with_protocol_headers() {
    let sim = sim(&[("claude", Behavior { chunks: 12, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = r#"{"model":"claude","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = client()
        .post(url(&gw, "/v1/messages"))
        .header("x-api-key", "client-key-should-not-travel")
        .header("anthropic-beta", "tools-2099-01-01")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let got = resp.bytes().await.unwrap();
    let expected: Vec<u8> = sse_frames(Protocol::Anthropic, "claude", 12).concat();
    assert_eq!(&got[..], &expected[..]);

    let h = &sim.state.received()[0].headers;
    assert_eq!(h["x-api-key"], UPSTREAM_KEY);
    assert_eq!(h["anthropic-version"], "2023-06-01");
    assert_eq!(h["anthropic-beta"], "tools-2099-01-01");
    assert!(h.get("authorization").is_none());

    // A client's own anthropic-version wins over the default.
    let resp = client()
        .post(url(&gw, "/v1/messages"))
        .header("anthropic-version", "2099-12-31")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(sim.state.received()[1].headers["anthropic-version"], "2099-12-31");
}

#[tokio::test]
async fn openai_stream_arrives_chunk_by_chunk() {
    // 10 chunks 300 ms apart: a buffering proxy would deliver nothing for 3 s.
    let sim = sim(&[("real-gpt", Behavior { chunks: 10, chunk_delay_ms: 300, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let started = Instant::now();
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .body(r#"{"model":"gpt","stream":true,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut received = Vec::new();
    let first = stream.next().await.unwrap().unwrap();
    let first_at = started.elapsed();
    received.extend_from_slice(&first);
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    let total = started.elapsed();
    assert!(first_at < Duration::from_millis(1500), "first chunk took {first_at:?}");
    assert!(total >= Duration::from_millis(2700), "stream ended too early: {total:?}");
    let expected: Vec<u8> = sse_frames(Protocol::OpenAiChat, "real-gpt", 10).concat();
    assert_eq!(received, expected);
}

#[tokio::test]
async fn static_headers_and_connection_close_reach_the_upstream() {
    let sim = sim(&[]);
    let extra = "    connection_close: true\n    headers: { Session-Id: stable-42 }";
    let gw = gateway(&yaml(&sim, "", extra, "")).await;
    for _ in 0..2 {
        let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    for r in sim.state.received() {
        assert_eq!(r.headers["session-id"], "stable-42");
        assert_eq!(r.headers["connection"], "close");
    }
}

#[tokio::test]
async fn request_errors_are_returned_verbatim_after_one_attempt() {
    let context = r#"{"error":{"message":"maximum context length is 128000 tokens","type":"invalid_request_error"}}"#;
    let html = "<html><body><h1>422 Unprocessable</h1></body></html>";
    let sim = sim(&[
        ("real-gpt", Behavior { status: Some(400), error_body: context.into(), ..Default::default() }),
        (
            "claude",
            Behavior {
                status: Some(422),
                error_body: html.into(),
                error_content_type: "text/html".into(),
                ..Default::default()
            },
        ),
    ]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(resp.headers()["x-tidegate-upstream"], "sim-openai");
    assert_eq!(resp.headers()["x-tidegate-attempts"], "1");
    assert_eq!(resp.text().await.unwrap(), context);
    let resp = client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 422);
    assert_eq!(resp.headers()["content-type"], "text/html");
    assert_eq!(resp.text().await.unwrap(), html);
    assert_eq!(sim.state.received().len(), 2, "request errors are never retried");
}

#[tokio::test]
async fn models_and_health_endpoints() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "  gpt-mini:\n    targets: [{ upstream: sim-openai }]")).await;
    let v: serde_json::Value = client().get(url(&gw, "/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    // Every alias, whatever its targets speak: each is served on every
    // endpoint (translated where needed).
    assert_eq!(ids, ["gpt", "claude", "gpt-mini"]);
    let v: serde_json::Value = client()
        .get(url(&gw, "/v1/models"))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][1]["id"], "claude");
    assert_eq!(v["data"][1]["type"], "model");
    let resp = client().get(url(&gw, "/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "ok\n");
}

#[tokio::test]
async fn a_burst_of_events_leaves_in_few_writes_and_spaced_events_are_not_held() {
    // 40 events written back to back: gathered, not one write each.
    let sim = sim(&[
        ("real-gpt", Behavior { chunks: 40, ..Default::default() }),
        ("slow-gpt", Behavior { chunks: 5, chunk_delay_ms: 200, ..Default::default() }),
    ]);
    let models = "  slow:\n    targets: [{ upstream: sim-openai, model: slow-gpt }]";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    let pieces =
        arrivals(post(&gw, "/v1/chat/completions", r#"{"model":"gpt","stream":true,"messages":[]}"#).await).await;
    let received: Vec<u8> = pieces.iter().flat_map(|(_, piece)| piece.to_vec()).collect();
    assert_eq!(received, sse_frames(Protocol::OpenAiChat, "real-gpt", 40).concat());
    assert!(pieces.len() <= 10, "41 events arrived in {} pieces", pieces.len());

    // Events 200 ms apart: each is forwarded when it comes, not held for
    // the next.
    let pieces =
        arrivals(post(&gw, "/v1/chat/completions", r#"{"model":"slow","stream":true,"messages":[]}"#).await).await;
    let received: Vec<u8> = pieces.iter().flat_map(|(_, piece)| piece.to_vec()).collect();
    assert_eq!(received, sse_frames(Protocol::OpenAiChat, "slow-gpt", 5).concat());
    let events: Vec<Instant> = pieces
        .iter()
        .flat_map(|(at, piece)| std::iter::repeat_n(*at, piece.windows(2).filter(|w| w == b"\n\n").count()))
        .collect();
    for (i, pair) in events.windows(2).take(4).enumerate() {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(150), "event {} came {gap:?} after the one before: held", i + 1);
    }
}

/// The pieces of a streamed answer as they arrived, with their times.
async fn arrivals(resp: reqwest::Response) -> Vec<(Instant, bytes::Bytes)> {
    let mut stream = resp.bytes_stream();
    let mut pieces = Vec::new();
    while let Some(piece) = stream.next().await {
        pieces.push((Instant::now(), piece.unwrap()));
    }
    pieces
}
