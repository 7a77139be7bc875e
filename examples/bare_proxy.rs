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
//! Usage: cargo run --release --example bare_proxy -- 127.0.0.1:19102 127.0.0.1:19100
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

type Body = BoxBody<Bytes, hyper::Error>;

type Idle = Arc<Mutex<Vec<SendRequest<Incoming>>>>;

/// An answer's body that gives its connection back to the pool when it
/// ends (or is dropped: `ready()` then tells a dead connection apart).
struct Returning {
    body: Incoming,
    conn: Option<SendRequest<Incoming>>,
    idle: Idle,
}

impl hyper::body::Body for Returning {
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

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.idle.lock().unwrap().push(conn);
        }
    }
}

/// Idle connections to the one upstream, most recent last.
#[derive(Clone)]
struct Pool {
    addr: String,
    idle: Idle,
}

impl Pool {
    async fn send(&self, req: Request<Incoming>) -> Response<Returning> {
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

fn main() {
    let mut args = std::env::args().skip(1);
    let addr: std::net::SocketAddr = args.next().unwrap_or_else(|| "127.0.0.1:19102".into()).parse().unwrap();
    let pool = Pool { addr: args.next().unwrap_or_else(|| "127.0.0.1:19100".into()), idle: Arc::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let pool = pool.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let pool = pool.clone();
                    async move { Ok::<Response<Body>, Infallible>(pool.send(req).await.map(|b| b.boxed())) }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
}
