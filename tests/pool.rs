//! Upstream connection reuse (`upstream/pool.rs`): connections are reused,
//! never while an answer is half-read, and a connection the upstream
//! closed costs the client nothing. The upstream here is a small hyper
//! server in this file that counts the connections it accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{gateway, post};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

/// How the test upstream treats its connections.
#[derive(Clone, Copy)]
enum Mode {
    /// Keep-alive, as most providers.
    KeepAlive,
    /// `Connection: close` after every answer.
    CloseEach,
    /// Keep-alive, but an idle connection is closed after 100 ms without a
    /// word (like a server with a short keep-alive timeout).
    IdleClose,
}

struct Upstream {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// Connections that ended (either side closed them).
    closed: Arc<AtomicUsize>,
}

type Body = BoxBody<Bytes, Infallible>;

/// A body `"stream":true` gets one SSE event at once and the rest after
/// 3 s (a client can hang up in between); any other body gets [`ANSWER`],
/// whose content says how many requests this connection served before.
async fn answer(req: Request<Incoming>, on_conn: usize) -> Result<Response<Body>, Infallible> {
    let bedrock = req.uri().path().ends_with("/invoke-with-response-stream");
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    if bedrock {
        // A whole Anthropic stream as Bedrock frames it; the text says
        // how many requests this connection served before.
        let text = format!("served {on_conn} before");
        let events = [
            serde_json::json!({"type":"message_start","message":{"id":"m1","type":"message","role":"assistant",
                "model":"claude","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":0}}}),
            serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
            serde_json::json!({"type":"content_block_stop","index":0}),
            serde_json::json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}),
            serde_json::json!({"type":"message_stop"}),
        ];
        let mut frames = bytes::BytesMut::new();
        for event in &events {
            frames.extend_from_slice(&tidegate::upstream::eventstream::encode_chunk(event.to_string().as_bytes()));
        }
        let sized = body.windows(5).any(|w| w == b"sized");
        let body = match sized {
            // With its length (a proxy in front of Bedrock may buffer it).
            true => Full::new(frames.freeze()).boxed(),
            // Chunked, its end after the frames (as Bedrock sends it).
            false => BodyExt::boxed(StreamBody::new(futures_util::stream::iter([
                Ok::<_, Infallible>(Frame::data(frames.freeze())),
                Ok(Frame::data(Bytes::new())),
            ]))),
        };
        return Ok(Response::builder()
            .header("content-type", "application/vnd.amazon.eventstream")
            .body(body)
            .unwrap());
    }
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if has(b"\"quick\":true") || has(b"\"linger\":true") {
        // A whole stream at once; with "linger", the body's end only 3 s
        // after its `[DONE]`.
        let events = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"all\"}}]}\n\ndata: [DONE]\n\n",
        )))]);
        let linger = has(b"\"linger\":true");
        let end = futures_util::stream::once(async move {
            if linger {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            Ok::<_, Infallible>(Frame::data(Bytes::new()))
        });
        use futures_util::StreamExt;
        let body = BodyExt::boxed(StreamBody::new(events.chain(end)));
        return Ok(Response::builder().header("content-type", "text/event-stream").body(body).unwrap());
    }
    if has(b"\"stream\":true") {
        let first = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n",
        )))]);
        let later = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))
        });
        use futures_util::StreamExt;
        let body = BodyExt::boxed(StreamBody::new(first.chain(later)));
        return Ok(Response::builder().header("content-type", "text/event-stream").body(body).unwrap());
    }
    let text = ANSWER.replace("\"ok\"", &format!("\"served {on_conn} before\""));
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)).boxed())
        .unwrap())
}

async fn upstream(mode: Mode) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let (a, r, c) = (accepted.clone(), requests.clone(), closed.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            a.fetch_add(1, Ordering::SeqCst);
            let (r, c) = (r.clone(), c.clone());
            tokio::spawn(async move {
                let on_conn = Arc::new(AtomicUsize::new(0));
                let service = hyper::service::service_fn(move |req| {
                    r.fetch_add(1, Ordering::SeqCst);
                    answer(req, on_conn.fetch_add(1, Ordering::SeqCst))
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                match mode {
                    Mode::KeepAlive => {}
                    Mode::CloseEach => {
                        builder.keep_alive(false);
                    }
                    Mode::IdleClose => {
                        builder.timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(100));
                    }
                }
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Upstream { addr, accepted, requests, closed }
}

fn config(up: &Upstream) -> String {
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  retry: {{ base_delay: 10ms, max_delay: 50ms }}\n  \
         stream_keepalive_after: \"off\"\nupstreams:\n  - {{ name: up, protocol: openai, base_url: \"http://{}/v1\" }}\n\
         models:\n  m: {{ targets: [{{ upstream: up }}] }}\n",
        up.addr
    )
}

/// Waits until the upstream has seen a connection end, at most `tries`
/// times 10 ms.
async fn closed_within(up: &Upstream, tries: u32) {
    for _ in 0..tries {
        if up.closed.load(Ordering::SeqCst) >= 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn ask(gw: &tidegate::server::Running, body: &str) -> (u16, String, String) {
    let resp = post(gw, "/v1/chat/completions", body).await;
    let attempts = resp.headers()["x-tidegate-attempts"].to_str().unwrap().to_string();
    (resp.status().as_u16(), attempts, resp.text().await.unwrap())
}

#[tokio::test]
async fn sequential_requests_share_one_connection_and_a_burst_opens_no_more_than_it_needs() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    for i in 0..20 {
        let (status, _, text) = ask(&gw, r#"{"model":"m"}"#).await;
        assert_eq!(status, 200);
        assert!(text.contains(&format!("served {i} before")), "request {i} not on the first connection: {text}");
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    for _ in 0..3 {
        let burst: Vec<_> = (0..8).map(|_| ask(&gw, r#"{"model":"m"}"#)).collect();
        for (status, _, _) in futures_util::future::join_all(burst).await {
            assert_eq!(status, 200);
        }
    }
    let opened = up.accepted.load(Ordering::SeqCst);
    assert!(opened <= 8, "44 requests, at most 8 at once, opened {opened} connections");
    assert_eq!(up.requests.load(Ordering::SeqCst), 44);
}

#[tokio::test]
async fn an_upstream_that_closes_each_connection_costs_no_attempt() {
    let up = upstream(Mode::CloseEach).await;
    let gw = gateway(&config(&up)).await;
    for _ in 0..6 {
        let (status, attempts, text) = ask(&gw, r#"{"model":"m"}"#).await;
        assert_eq!((status, attempts.as_str()), (200, "1"), "{text}");
        // A closed connection is never written to again.
        assert!(text.contains("served 0 before"), "{text}");
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 6);
    assert_eq!(up.requests.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn a_connection_the_upstream_dropped_while_idle_is_not_used() {
    let up = upstream(Mode::IdleClose).await;
    let gw = gateway(&config(&up)).await;
    for _ in 0..4 {
        let (status, attempts, _) = ask(&gw, r#"{"model":"m"}"#).await;
        assert_eq!((status, attempts.as_str()), (200, "1"));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 4, "each request after 300 ms idle needs a new connection");
    assert_eq!(up.requests.load(Ordering::SeqCst), 4, "no request was sent on a dropped connection");
}

#[tokio::test]
async fn an_answer_left_half_read_never_lends_its_connection() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    // The client hangs up after the first event; the upstream still has
    // the rest of that answer to send on its connection.
    let mut resp = post(&gw, "/v1/chat/completions", r#"{"model":"m","stream":true}"#).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("first"));
    drop(resp);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, attempts, text) = ask(&gw, r#"{"model":"m"}"#).await;
    assert_eq!((status, attempts.as_str()), (200, "1"));
    assert!(text.contains("served 0 before"), "answered on the half-read connection: {text}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    // The finished answer's connection is lent again.
    let (_, _, text) = ask(&gw, r#"{"model":"m"}"#).await;
    assert!(text.contains("served 1 before"), "{text}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_is_not_lent_while_its_answer_is_still_streaming() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    let mut stream = post(&gw, "/v1/chat/completions", r#"{"model":"m","stream":true}"#).await;
    assert!(String::from_utf8_lossy(&stream.chunk().await.unwrap().unwrap()).contains("first"));
    // The stream's connection is busy for 3 s more: the next request gets
    // its own at once instead of queueing behind it.
    let started = tokio::time::Instant::now();
    let (status, _, text) = ask(&gw, r#"{"model":"m"}"#).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(1), "waited {:?} behind a stream", started.elapsed());
    assert!(text.contains("served 0 before"), "{text}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    let mut rest = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
}

#[tokio::test]
async fn a_connection_idle_for_a_minute_is_closed_without_another_request() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    let (status, _, _) = ask(&gw, r#"{"model":"m"}"#).await;
    assert_eq!(status, 200);
    // Virtual time from here: the idle minute passes at once.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(50)).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(up.closed.load(Ordering::SeqCst), 0, "closed before a minute idle");
    tokio::time::advance(Duration::from_secs(11)).await;
    closed_within(&up, 1000).await;
    assert_eq!(up.closed.load(Ordering::SeqCst), 1, "the idle connection was not closed");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_finished_stream_lends_its_connection_again() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    // Nothing is read after a stream's `[DONE]` for the stream itself; the
    // body's end is read apart, so the connection goes back to the pool
    // (dropped there, every stream would open a connection of its own).
    for i in 0..5 {
        let (status, _, text) = ask(&gw, r#"{"model":"m","stream":true,"quick":true}"#).await;
        assert_eq!(status, 200);
        assert!(text.contains("all") && text.contains("[DONE]"), "stream {i}: {text}");
        // The end is read by a task of its own: give it its turn.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _, text) = ask(&gw, r#"{"model":"m"}"#).await;
    assert_eq!(status, 200);
    assert!(text.contains("served 5 before"), "not on the streams' connection: {text}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "a stream opened a connection of its own");
    assert_eq!(up.closed.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_upstream_that_lingers_after_done_delays_no_client_and_loses_the_connection() {
    let up = upstream(Mode::KeepAlive).await;
    let gw = gateway(&config(&up)).await;
    let started = tokio::time::Instant::now();
    let (status, _, text) = ask(&gw, r#"{"model":"m","stream":true,"linger":true}"#).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the client waited {:?} for the upstream's end",
        started.elapsed()
    );
    // Its end is waited for 2 s (the upstream sends it after 3): then the
    // connection is closed, not lent.
    closed_within(&up, 400).await;
    assert_eq!(up.closed.load(Ordering::SeqCst), 1, "the lingering connection was kept");
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "closed only at the upstream's end: {:?}",
        started.elapsed()
    );
    let (status, _, text) = ask(&gw, r#"{"model":"m"}"#).await;
    assert_eq!(status, 200);
    assert!(text.contains("served 0 before"), "{text}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bedrock_streams_lend_their_connection_again_and_one_with_a_length_is_not_cut() {
    let up = upstream(Mode::KeepAlive).await;
    let config = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  stream_keepalive_after: \"off\"\nupstreams:\n  \
         - {{ name: bedrock, kind: bedrock, region: us-east-1, base_url: \"http://{}\", aws_access_key_id: AKIDTEST, \
         aws_secret_access_key: secret }}\nmodels:\n  claude: {{ targets: [{{ upstream: bedrock, model: anthropic.claude-v1 }}] }}\n",
        up.addr
    );
    let gw = gateway(&config).await;
    // Chunked answers (the stream's end read apart), then one with its
    // length (its length is not the events': dropped, not passed on).
    for (i, content) in ["hi", "hi", "hi", "sized"].into_iter().enumerate() {
        let resp = common::client()
            .post(common::url(&gw, "/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .json(&serde_json::json!({"model": "claude", "max_tokens": 16, "stream": true,
                "messages": [{"role": "user", "content": content}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        assert!(text.contains("message_stop"), "stream {i}: {text}");
        assert!(text.contains(&format!("served {i} before")), "stream {i} not on the first connection: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "a Bedrock stream opened a connection of its own");
}
