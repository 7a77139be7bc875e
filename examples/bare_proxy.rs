//! The floor under tidegate's hot path, for bench/core.py: a bare reverse
//! proxy on the same stack (tokio current-thread runtime, hyper's HTTP/1
//! server, hyper's connection-level client under a LIFO pool, as
//! `upstream/pool.rs`) that forwards and does nothing else — no auth,
//! routing, limits, classification, journal or metrics. The gap between it
//! and nginx is the stack's; the gap between it and tidegate is tidegate's
//! own work.
//!
//! Usage: cargo run --release --example bare_proxy -- 127.0.0.1:19102 127.0.0.1:19100
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

type Body = BoxBody<Bytes, hyper::Error>;

/// Idle connections to the one upstream, most recent last.
#[derive(Clone)]
struct Pool {
    addr: String,
    idle: Arc<Mutex<Vec<SendRequest<Incoming>>>>,
}

impl Pool {
    async fn send(&self, req: Request<Incoming>) -> Response<Incoming> {
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
        // Simplest correct reuse for this bench: the next request's
        // `ready()` waits until this answer is read.
        self.idle.lock().unwrap().push(conn);
        answer
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
