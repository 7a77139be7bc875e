//! A minimal keep-alive upstream for bench/core.py: not tidegate's
//! simulator, so the proxy under test is the only tidegate code measured.
//!
//! Every POST gets a fixed chat completion, except: a body containing
//! `"stream":true` gets 20 SSE chunks written back to back and `[DONE]`;
//! a body containing `"model":"slow"` is answered after 200 ms.
//!
//! Usage: cargo run --release --example upstream -- 127.0.0.1:19100
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 tok3 tok4 "},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn sse() -> Body {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..20)
        .map(|i| {
            let chunk = format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n"
            );
            Ok(Frame::data(Bytes::from(chunk)))
        })
        .collect();
    frames.push(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))));
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

async fn answer(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let text = std::str::from_utf8(&body).unwrap_or("");
    if text.contains("\"model\":\"slow\"") {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let response = if text.contains("\"stream\":true") {
        Response::builder().header("content-type", "text/event-stream").body(sse())
    } else {
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(ANSWER.as_bytes())).boxed())
    };
    Ok(response.unwrap())
}

fn main() {
    let addr: std::net::SocketAddr =
        std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:19100".into()).parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(answer);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
