//! A client that goes away cancels its upstream request at once, and a
//! silent upstream stream is cut by `stream_idle_timeout`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use futures_util::StreamExt;
use tidegate_simulate::Behavior;
use tokio::io::AsyncWriteExt;

#[tokio::test(start_paused = true)]
async fn disconnect_while_waiting_for_headers_cancels_upstream() {
    let sim = sim(&[("slow", Behavior { latency_ms: 30_000, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "  slow:\n    targets: [{ upstream: sim-openai }]")).await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = r#"{"model":"slow"}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    eventually("upstream request in flight", || sim.state.in_flight.load(SeqCst) == 1).await;
    drop(conn);
    eventually("upstream sees the cancellation", || sim.state.cancelled.load(SeqCst) == 1).await;
    assert_eq!(sim.state.in_flight.load(SeqCst), 0);
    assert_serves(&gw).await;
}

#[tokio::test(start_paused = true)]
async fn disconnect_mid_stream_cancels_upstream() {
    let sim = sim(&[("claude", Behavior { chunks: 500, chunk_delay_ms: 50, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp =
        client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude","stream":true}"#).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    eventually("upstream sees the cancellation", || sim.state.cancelled.load(SeqCst) == 1).await;
    assert_eq!(sim.state.completed.load(SeqCst), 0);
    assert_serves(&gw).await;
}

/// Gaps under the idle limit, a stream far longer than it: relayed whole
/// (the idle timer, armed once, fires early and is re-armed from the last
/// event each time, never cutting a stream that keeps talking).
#[tokio::test(start_paused = true)]
async fn a_stream_longer_than_the_idle_limit_with_short_gaps_is_not_cut() {
    let sim = sim(&[("real-gpt", Behavior { chunks: 8, chunk_delay_ms: 200, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "    stream_idle_timeout: 300ms", "")).await;
    let started = Instant::now();
    let resp =
        client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt","stream":true}"#).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(10), resp.text()).await.expect("stream never ended").unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1_400), "{:?}", started.elapsed());
    assert_eq!(text.matches(r#""content":"tok"#).count(), 8, "{text}");
    assert!(text.contains("[DONE]") && !text.contains("sent nothing for"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn silent_stream_is_cut_after_idle_timeout() {
    let sim = sim(&[("real-gpt", Behavior { chunks: 3, chunk_delay_ms: 5_000, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "    stream_idle_timeout: 300ms", "")).await;
    let started = Instant::now();
    let resp =
        client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt","stream":true}"#).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text =
        tokio::time::timeout(Duration::from_secs(4), resp.text()).await.expect("silent stream kept open").unwrap();
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(text.contains("chat.completion.chunk"), "first chunk missing: {text}");
    // Not a clean end: an OpenAI-shaped error event, and no [DONE].
    assert!(text.contains(r#"data: {"error":{"#), "{text}");
    assert!(text.contains(r#""message":"tidegate: the stream from upstream sim-openai broke"#), "{text}");
    assert!(text.contains("sent nothing for"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    eventually("upstream sees the cancellation", || sim.state.cancelled.load(SeqCst) == 1).await;
}
