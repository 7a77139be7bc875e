//! Codex's Responses WebSocket transport, against a real socket: a turn
//! whose first attempt gets `429 3009` completes with no error message on
//! the socket; several responses on one socket, the next continuing the
//! last by `previous_response_id` sent whole to an HTTP upstream; a
//! translated target; one journal row per response; the key checked at
//! the upgrade; Codex's warm-up; `websocket: off` keeps the `426`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tidegate_simulate::{Behavior, Fault};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const C3009: &str = r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(gw: &tidegate::server::Running, key: Option<&str>) -> Result<Socket, u16> {
    let mut request = format!("ws://{}/v1/responses", gw.addr).into_client_request().unwrap();
    if let Some(key) = key {
        request.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    match tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(request)).await {
        Ok(Ok((socket, _))) => Ok(socket),
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => Err(resp.status().as_u16()),
        other => panic!("connect: {other:?}"),
    }
}

/// Sends `request` as `response.create` and reads events up to the
/// response's end (`response.completed`/`failed`/`incomplete`, or an
/// `error` message).
async fn turn(socket: &mut Socket, mut request: Value) -> Vec<Value> {
    request["type"] = json!("response.create");
    socket.send(Message::Text(request.to_string().into())).await.unwrap();
    let mut events = Vec::new();
    for _ in 0..500 {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next()).await.expect("an event in time");
        let Some(Ok(Message::Text(text))) = message else { panic!("socket ended: {message:?}") };
        let v: Value = serde_json::from_str(text.as_str()).unwrap();
        let kind = v["type"].as_str().unwrap_or_default().to_owned();
        events.push(v);
        if matches!(kind.as_str(), "response.completed" | "response.failed" | "response.incomplete" | "error") {
            return events;
        }
    }
    panic!("no end of response in 500 events");
}

fn text_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn codex_over_a_websocket_gets_its_turns_through_the_attempt_loop() {
    // First attempt: 429 3009 (no Retry-After); then answers.
    let sim = sim(&[
        ("real-gpt", Behavior { chunks: 3, script: vec![Fault::new(429, C3009)], ..Default::default() }),
        ("claude-real", Behavior { chunks: 2, ..Default::default() }),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("j.db");
    let top =
        format!("journal: {}\nadmin_key: adm\nclient_keys:\n  - {{ name: codex, key: sk-codex }}", journal.display());
    let models = "  on-claude:\n    targets: [{ upstream: sim-anthropic, model: claude-real }]";
    let gw = gateway(&yaml(&sim, &top, "", models)).await;

    // The key is checked at the upgrade: no socket without it.
    assert_eq!(connect(&gw, None).await.err(), Some(401));
    assert_eq!(connect(&gw, Some("sk-wrong")).await.err(), Some(401));

    let mut socket = connect(&gw, Some("sk-codex")).await.unwrap();
    let input = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]);
    // Codex's warm-up first: answered at once, continued by the next turn.
    let warm = turn(&mut socket, json!({"model": "gpt", "input": input, "store": false, "generate": false})).await;
    assert_eq!(warm.last().unwrap()["type"], "response.completed", "{warm:?}");
    let warm_id = warm.last().unwrap()["response"]["id"].as_str().unwrap().to_owned();
    assert!(sim.state.received().is_empty(), "a warm-up goes nowhere");

    let first =
        turn(&mut socket, json!({"model": "gpt", "input": [], "store": false, "previous_response_id": warm_id})).await;
    assert!(!first.iter().any(|e| e["type"] == "error"), "the 429 reached the client: {first:?}");
    assert_eq!(first.last().unwrap()["type"], "response.completed", "{first:?}");
    assert_eq!(text_of(&first), "tok0 tok1 tok2 ");
    let sent = sim.state.received();
    assert_eq!(sent.len(), 2, "the 429, then the answer");
    let body: Value = serde_json::from_slice(&sent[1].body).unwrap();
    assert_eq!(body["input"], input, "the warm-up's input sent whole: {body}");
    assert!(body.get("previous_response_id").is_none() && body.get("generate").is_none(), "{body}");
    assert_eq!(body["stream"], true);
    let first_id = first.last().unwrap()["response"]["id"].as_str().unwrap().to_owned();

    // The next turn continues the last by id with only the new input:
    // the upstream (HTTP, store false) gets the whole conversation.
    let more = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]}]);
    let second =
        turn(&mut socket, json!({"model": "gpt", "input": more, "store": false, "previous_response_id": first_id}))
            .await;
    assert_eq!(second.last().unwrap()["type"], "response.completed", "{second:?}");
    let body: Value = serde_json::from_slice(&sim.state.received()[2].body).unwrap();
    let items = body["input"].as_array().unwrap();
    assert_eq!(items.len(), 3, "first input, first output, new input: {body}");
    assert_eq!(items[1]["type"], "message");
    assert_eq!(items[1]["role"], "assistant");
    assert_eq!(items[2], more[0]);

    // A translated target on the same socket.
    let third = turn(&mut socket, json!({"model": "on-claude", "input": "hello", "store": false})).await;
    assert_eq!(third.last().unwrap()["type"], "response.completed", "{third:?}");
    assert_eq!(text_of(&third), "tok0 tok1 ");

    // An unknown alias: an error message, and the socket goes on.
    let unknown = turn(&mut socket, json!({"model": "nope", "input": "x"})).await;
    assert_eq!(unknown.last().unwrap()["type"], "error", "{unknown:?}");
    assert_eq!(unknown.last().unwrap()["status"], 404, "{unknown:?}");
    let again = turn(&mut socket, json!({"model": "gpt", "input": "x", "store": false})).await;
    assert_eq!(again.last().unwrap()["type"], "response.completed");
    socket.close(None).await.unwrap();

    // One journal row per response served (the warm-up is not one).
    let completed =
        |rows: &Value| rows.as_array().map_or(0, |r| r.iter().filter(|r| r["outcome"] == "completed").count());
    let mut rows = Value::Null;
    for _ in 0..100 {
        rows = admin_json(&gw, "/admin/requests?limit=20").await["requests"].clone();
        if completed(&rows) >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(completed(&rows), 4, "{rows}");
    let rows = rows.as_array().unwrap();
    assert!(rows.iter().all(|r| r["client"] == "codex" && r["protocol"] == "openai-responses"), "{rows:?}");
    let retried = rows.iter().find(|r| r["n_attempts"] == 2).expect("the turn retried after the 429");
    assert_eq!(retried["outcome"], "completed");
}

#[tokio::test]
async fn websocket_off_keeps_the_426_that_sends_codex_to_http() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "websocket: false", "", "")).await;
    assert_eq!(connect(&gw, None).await.err(), Some(426));
    // A plain GET (no upgrade) is not served either.
    let resp = client().get(url(&gw, "/v1/responses")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    let gw = gateway(&yaml(&sim, "websocket_idle: 200ms", "", "")).await;
    let mut socket = connect(&gw, None).await.unwrap();
    // Idle past the limit: closed with 1000.
    let message = tokio::time::timeout(Duration::from_secs(5), socket.next()).await.unwrap();
    match message {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(u16::from(frame.code), 1000),
        other => panic!("expected a close: {other:?}"),
    }
}
