//! The floor under tidegate's hot path, for bench/core.py: a bare reverse
//! proxy on the same stack (tokio current-thread runtime, hyper's HTTP/1
//! server, hyper's connection-level client under a LIFO pool, as
//! `upstream/pool.rs`, a connection back in it only once its answer's
//! body has ended, so a stream's connection is never handed to another
//! request) that forwards and does nothing else — no auth,
//! routing, limits, classification, journal or metrics. The gap between it
//! and nginx is the stack's; the gap between it and tidegate is tidegate's
//! own work.
//!
//! With `--journal FILE` it is the **floor** instead: the bare proxy plus
//! the per-request work no LLM gateway with a journal can skip — the
//! request's body read whole and its `model` read from the JSON (a gateway
//! routes by it), a request id, and one row a request in tidegate's own
//! journal (the same writer thread, batching and SQLite table). No auth,
//! routing table, limits, attempts, classification, metrics or logging.
//! What tidegate costs over the floor is what those cost; what the floor
//! costs over nginx is the least any gateway on this stack with a journal
//! can cost (bench/core.py, bench/instructions.py: the column "floor").
//!
//! Usage: cargo run --release --example bare_proxy -- 127.0.0.1:19102 127.0.0.1:19100 [--journal FILE]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tidegate::journal::{Journal, Record, Retention, micros};
use tidegate::protocol::Protocol;
use tidegate::record::Outcome;

type Body = BoxBody<Bytes, hyper::Error>;

type Idle<B> = Arc<Mutex<Vec<SendRequest<B>>>>;

/// An answer's body that gives its connection back to the pool when it
/// ends (or is dropped: `ready()` then tells a dead connection apart).
struct Returning<B> {
    body: Incoming,
    conn: Option<SendRequest<B>>,
    idle: Idle<B>,
}

impl<B> hyper::body::Body for Returning<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None))
            && let Some(conn) = this.conn.take()
        {
            this.idle.lock().unwrap().push(conn);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Returning<B> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.idle.lock().unwrap().push(conn);
        }
    }
}

/// Idle connections to the one upstream, most recent last.
struct Pool<B> {
    addr: String,
    idle: Idle<B>,
}

impl<B> Clone for Pool<B> {
    fn clone(&self) -> Self {
        Pool { addr: self.addr.clone(), idle: self.idle.clone() }
    }
}

impl<B> Pool<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    async fn send(&self, req: Request<B>) -> Response<Returning<B>> {
        let mut conn = loop {
            let reused = self.idle.lock().unwrap().pop();
            match reused {
                Some(mut conn) => {
                    if conn.ready().await.is_ok() {
                        break conn;
                    }
                }
                None => {
                    let stream = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
                    stream.set_nodelay(true).unwrap();
                    let (conn, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
                    tokio::spawn(driver);
                    break conn;
                }
            }
        };
        let answer = conn.send_request(req).await.unwrap();
        let idle = self.idle.clone();
        answer.map(|body| Returning { body, conn: Some(conn), idle })
    }
}

/// What the floor reads of a request: the model it routes by and
/// whether it streams (a field of the journal's row).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    model: Option<&'a str>,
    #[serde(default)]
    stream: bool,
}

/// The floor's answer body: the pooled one, and the request's journal row
/// handed to the writer when the body ends (or is dropped).
struct Journaled {
    body: Returning<Full<Bytes>>,
    row: Option<(Record, Instant)>,
    journal: Journal,
}

impl Journaled {
    fn record(&mut self) {
        if let Some((mut row, start)) = self.row.take() {
            row.total_us = micros(start.elapsed());
            self.journal.record(row);
        }
    }
}

impl hyper::body::Body for Journaled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.record();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        self.record();
    }
}

/// The floor's request: read whole, its model read, forwarded, journaled.
async fn floor(pool: Pool<Full<Bytes>>, journal: Journal, req: Request<Incoming>) -> Response<Body> {
    let start = Instant::now();
    let id = tidegate::request_id::next();
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Response::builder().status(400).body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed()).unwrap();
    };
    let (model, stream) = match serde_json::from_slice::<Head>(&body) {
        Ok(head) => (head.model.map(Arc::from), head.stream),
        Err(_) => (None, false),
    };
    let answer = pool.send(Request::from_parts(parts, Full::new(body))).await;
    let row = Record {
        id,
        client: None,
        model,
        queue_us: 0,
        total_us: 0,
        ttfb_us: std::num::NonZeroI64::new(micros(start.elapsed()).max(1)),
        tokens: tidegate::journal::TokenCounts::of(&Default::default()),
        status: answer.status().as_u16(),
        n_attempts: 1,
        upstream: Some(0),
        outcome: Outcome::Completed,
        class: None,
        stream,
        anomaly: false,
        protocol: Some(Protocol::OpenAiChat),
        via: None,
        generation: 0,
        detail: None,
    };
    answer.map(|body| Journaled { body, row: Some((row, start)), journal }.boxed())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr: std::net::SocketAddr = args.next().unwrap_or_else(|| "127.0.0.1:19102".into()).parse().unwrap();
    let upstream = args.next().unwrap_or_else(|| "127.0.0.1:19100".into());
    let journal = match (args.next().as_deref(), args.next()) {
        (Some("--journal"), Some(path)) => Some(path),
        (None, _) => None,
        _ => panic!("usage: bare_proxy LISTEN UPSTREAM [--journal FILE]"),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match journal {
        None => {
            // The bare proxy: each request forwarded as it comes.
            let pool = Pool::<Incoming> { addr: upstream, idle: Arc::default() };
            rt.block_on(serve(addr, move |req| {
                let pool = pool.clone();
                async move { pool.send(req).await.map(|b| b.boxed()) }
            }))
        }
        Some(path) => {
            // tidegate's default retention.
            let retention = Retention { max_age: Duration::from_secs(30 * 24 * 3600), max_rows: 1_000_000 };
            let journal = Journal::start(std::path::Path::new(&path), retention);
            journal.register(Arc::from(vec!["up".to_string()]));
            let pool = Pool { addr: upstream, idle: Arc::default() };
            rt.block_on(serve(addr, move |req| floor(pool.clone(), journal.clone(), req)))
        }
    }
}

/// Accepts connections on `addr` and answers each request with `handle`.
async fn serve<F, Fut>(addr: std::net::SocketAddr, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answer = handle(req);
                async move { Ok::<Response<Body>, Infallible>(answer.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
