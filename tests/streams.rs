//! Streams that never lie: handshake retries, honest mid-stream failures,
//! keep-alive while waiting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use futures_util::StreamExt;
use tidegate::protocol::Protocol;
use tidegate_simulate::{Behavior, Fault, sse_frames};

const OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
const BUSY_FRAME: &str = r#"{"error":{"code":"TM.00001041","message":"concurrency limit: 3 sessions"}}"#;

fn scripted(script: Vec<Fault>) -> Behavior {
    Behavior { script, ..Default::default() }
}

async fn stream(
    gw: &tidegate::server::Running,
    path: &str,
    model: &str,
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, String) {
    let resp = client()
        .post(url(gw, path))
        .body(format!(
            r#"{{"model":"{model}","stream":true,"max_tokens":16,"messages":[{{"role":"user","content":"hi"}}]}}"#
        ))
        .send()
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap())
}

#[tokio::test(start_paused = true)]
async fn error_frame_under_200_is_retried_and_never_shown() {
    let sim = sim(&[
        ("real-gpt", scripted(vec![Fault::error_frame(BUSY_FRAME)])),
        ("claude", scripted(vec![Fault::error_frame(OVERLOADED)])),
    ]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, headers, text) = stream(&gw, "/v1/chat/completions", "gpt").await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-tidegate-attempts"], "2");
    let expected = String::from_utf8(sse_frames(Protocol::OpenAiChat, "real-gpt", 5).concat()).unwrap();
    assert_eq!(text, expected, "exactly one clean answer, nothing of the failed attempt");
    let (status, _, text) = stream(&gw, "/v1/messages", "claude").await;
    assert_eq!(status, 200);
    assert_eq!(text, String::from_utf8(sse_frames(Protocol::Anthropic, "claude", 5).concat()).unwrap());
}

#[tokio::test(start_paused = true)]
async fn empty_stream_is_retried() {
    let sim = sim(&[("claude", scripted(vec![Fault::empty_stream(), Fault::empty_stream()]))]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, headers, text) = stream(&gw, "/v1/messages", "claude").await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-tidegate-attempts"], "3");
    assert_eq!(text, String::from_utf8(sse_frames(Protocol::Anthropic, "claude", 5).concat()).unwrap());
}

#[tokio::test(start_paused = true)]
async fn error_frame_matched_by_an_operator_rule() {
    // Seed 001: the same "3 sessions" rejection as a 200 error frame.
    let rules = "    retry:\n      - { on_body_contains: [\"TM.00001041\"], delay: 20ms, max_attempts: 5 }";
    let sim = sim(&[("real-gpt", scripted(vec![Fault::error_frame(BUSY_FRAME), Fault::error_frame(BUSY_FRAME)]))]);
    let gw = gateway(&yaml(&sim, "", rules, "")).await;
    let (status, headers, text) = stream(&gw, "/v1/chat/completions", "gpt").await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-tidegate-attempts"], "3");
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test(start_paused = true)]
async fn mid_stream_drop_ends_with_an_error_event_not_a_clean_end() {
    let sim =
        sim(&[("real-gpt", scripted(vec![Fault::drop_after(4)])), ("claude", scripted(vec![Fault::drop_after(5)]))]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, _, text) = stream(&gw, "/v1/chat/completions", "gpt").await;
    assert_eq!(status, 200);
    let frames = sse_frames(Protocol::OpenAiChat, "real-gpt", 5);
    let sent: String = frames[..4].iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    assert!(text.starts_with(&sent), "content before the drop must arrive once, unchanged:\n{text}");
    let rest = &text[sent.len()..];
    assert!(rest.starts_with(r#"data: {"error":{"#), "{rest}");
    assert!(rest.contains("broke after"), "{rest}");
    assert!(!text.contains("[DONE]"), "a broken stream must not end with [DONE]");
    assert_eq!(text.matches("tok0 ").count(), 1, "content duplicated");
    assert_eq!(sim.state.received().len(), 1, "no retry after content reached the client");

    let (_, _, text) = stream(&gw, "/v1/messages", "claude").await;
    assert!(text.contains("event: error\ndata: {\"type\":\"error\",\"error\":{"), "{text}");
    assert!(!text.contains("message_stop"));
}

#[tokio::test(start_paused = true)]
async fn upstream_error_event_mid_stream_is_passed_on_and_ends_the_stream() {
    let oa_error = r#"{"error":{"message":"server overloaded mid-answer","type":"server_error"}}"#;
    let sim = sim(&[
        ("claude", scripted(vec![Fault::error_mid_stream(5, OVERLOADED)])),
        ("real-gpt", scripted(vec![Fault::error_mid_stream(3, oa_error)])),
    ]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let (status, _, text) = stream(&gw, "/v1/messages", "claude").await;
    assert_eq!(status, 200);
    let head: String = sse_frames(Protocol::Anthropic, "claude", 5)[..5]
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert_eq!(
        text,
        format!("{head}event: error\ndata: {OVERLOADED}\n\n"),
        "the provider's own error event ends the stream"
    );

    let (_, _, text) = stream(&gw, "/v1/chat/completions", "gpt").await;
    let head: String = sse_frames(Protocol::OpenAiChat, "real-gpt", 5)[..3]
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert_eq!(text, format!("{head}data: {oa_error}\n\n"), "no [DONE] after an error");
    assert_eq!(sim.state.received().len(), 2, "no retry once content was sent");
}

#[tokio::test(start_paused = true)]
async fn slow_first_event_gets_keepalive_comments_then_content() {
    let sim = sim(&[("claude", Behavior { first_chunk_delay_ms: 1200, ..Default::default() })]);
    let top = "defaults:\n  stream_keepalive_after: 300ms\n  stream_keepalive_every: 300ms";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let started = Instant::now();
    let resp =
        client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude","stream":true}"#).send().await.unwrap();
    let headers_after = started.elapsed();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(headers_after < Duration::from_millis(1000), "headers not committed early: {headers_after:?}");
    let text = resp.text().await.unwrap();
    let content = String::from_utf8(sse_frames(Protocol::Anthropic, "claude", 5).concat()).unwrap();
    let (comments, rest) = text.split_at(text.find("event: message_start").unwrap());
    assert!(comments.starts_with(": waiting for capacity — attempt 1 on sim-anthropic\n\n"), "{comments}");
    assert!(comments.matches(": waiting").count() >= 2, "{comments}");
    assert_eq!(rest, content);
}

#[tokio::test(start_paused = true)]
async fn failure_after_keepalive_arrives_as_an_in_stream_error() {
    let session = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You've hit your session limit"}}"#;
    let sim = sim(&[("claude", Behavior { status: Some(429), error_body: session.into(), ..Default::default() })]);
    let top = "defaults:\n  stream_keepalive_after: 200ms\n  stream_keepalive_every: 200ms\n  retry: { base_delay: 150ms, max_delay: 150ms }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let started = Instant::now();
    let resp =
        post_with(&gw, "/v1/messages", ("x-tidegate-deadline", "1s"), r#"{"model":"claude","stream":true}"#).await;
    assert_eq!(resp.status(), 200, "committed before the failure");
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(text.starts_with(": waiting for capacity"), "{text}");
    let event = &text[text.find("event: error").expect("no error event")..];
    assert!(event.contains(r#""type":"rate_limit_error""#), "{event}");
    assert!(event.contains("session limit"), "{event}");
}

#[tokio::test(start_paused = true)]
async fn keepalive_off_answers_with_the_plain_status() {
    let sim = sim(&[("claude", Behavior { status: Some(529), error_body: OVERLOADED.into(), ..Default::default() })]);
    let top = "defaults:\n  stream_keepalive_after: \"off\"\n  deadline: 600ms\n  retry: { base_delay: 100ms, max_delay: 100ms }";
    let gw = gateway(&yaml(&sim, top, "", "")).await;
    let (status, headers, _) = stream(&gw, "/v1/messages", "claude").await;
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
}

#[tokio::test(start_paused = true)]
async fn broken_text_stream_is_resumed_into_one_answer() {
    let sim = sim(&[
        ("claude", Behavior { chunks: 8, script: vec![Fault::drop_after(5)], ..Default::default() }),
        ("real-gpt", Behavior { chunks: 8, script: vec![Fault::drop_after(4)], ..Default::default() }),
    ]);
    let models = "  claude-resume:\n    targets: [{ upstream: sim-anthropic, model: claude }]\n    stream_resume: true\n  gpt-resume:\n    targets: [{ upstream: sim-openai, model: real-gpt }]\n    stream_resume: true";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    let (status, _, text) = stream(&gw, "/v1/messages", "claude-resume").await;
    assert_eq!(status, 200);
    let whole = String::from_utf8(sse_frames(Protocol::Anthropic, "claude", 8).concat()).unwrap();
    assert_eq!(text, whole, "the client sees one uninterrupted answer");
    let got = sim.state.received();
    assert_eq!(got.len(), 2);
    let continuation: serde_json::Value = serde_json::from_slice(&got[1].body).unwrap();
    assert_eq!(continuation["messages"].as_array().unwrap().last().unwrap()["content"], "tok0 tok1");

    let (_, _, text) = stream(&gw, "/v1/chat/completions", "gpt-resume").await;
    let first: Vec<u8> = sse_frames(Protocol::OpenAiChat, "real-gpt", 8)[..4].concat();
    let rest: Vec<u8> = tidegate_simulate::sse_frames_from(Protocol::OpenAiChat, "real-gpt", 3, 8).concat();
    assert_eq!(text.as_bytes(), [first, rest].concat().as_slice());
    assert_eq!(text.matches("tok2 ").count(), 1, "no text repeated");
}

#[tokio::test(start_paused = true)]
async fn resume_is_off_by_default_and_fails_honestly_when_the_continuation_fails() {
    let script = vec![Fault::drop_after(5), Fault::drop_after(2), Fault::drop_after(5)];
    let sim = sim(&[("claude", Behavior { chunks: 8, script, ..Default::default() })]);
    let models = "  resumable:\n    targets: [{ upstream: sim-anthropic, model: claude }]\n    stream_resume: true";
    let gw = gateway(&yaml(&sim, "", "", models)).await;
    // The continuation drops before any content: the stream ends in an
    // error event saying so.
    let (_, _, text) = stream(&gw, "/v1/messages", "resumable").await;
    let event = &text[text.find("event: error").expect("no error event")..];
    assert!(event.contains("resuming failed"), "{event}");
    assert_eq!(sim.state.received().len(), 2);
    // The default alias never asks for a continuation.
    let (_, _, text) = stream(&gw, "/v1/messages", "claude").await;
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("resuming"), "{text}");
    assert_eq!(sim.state.received().len(), 3);
}
