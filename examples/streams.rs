//! Many concurrent token streams, for bench/streams.py: both ends of the
//! measurement, so the proxy under test is the only thing between them.
//!
//! `streams upstream ADDR EVENTS INTERVAL_MS`: every POST is answered with
//! an SSE stream of EVENTS chat chunks, one every INTERVAL_MS from the
//! request's arrival (the first at once), then `[DONE]`; each chunk's id is
//! `t` + the wall-clock µs it was written, so a client can tell how late
//! each event reached it.
//!
//! `streams load TARGET N RAMP_MS`: opens N streams through TARGET, one
//! connection each (as N agents would), spread evenly over RAMP_MS, and
//! keeps them all open until each ends. Prints one JSON line: streams that
//! ended with `[DONE]`, events received, time to first event (request
//! written → first event read) p50/p99 in ms, and each event's delay from
//! when the upstream wrote it to when it was read, p50/p99 in ms.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

const BODY: &str = r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"hello"}]}"#;

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn chunk(i: u32) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"t{}\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n",
        unix_us()
    ))
}

async fn upstream(addr: String, events: u32, interval: Duration) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                let _ = req.into_body().collect().await;
                let start = tokio::time::Instant::now();
                let frames = futures_util::stream::unfold(0u32, move |i| async move {
                    if i > events {
                        return None;
                    }
                    if i == events {
                        return Some((
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))),
                            i + 1,
                        ));
                    }
                    tokio::time::sleep_until(start + interval * i).await;
                    Some((Ok(Frame::data(chunk(i))), i + 1))
                });
                let response = Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(StreamBody::new(frames).boxed())
                    .unwrap();
                Ok::<_, Infallible>(response)
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// One stream: (ended with `[DONE]`, time to first event in µs, each
/// event's delay in µs).
async fn one(target: String) -> (bool, Option<u32>, Vec<u32>) {
    let mut delays = Vec::with_capacity(256);
    let Ok(stream) = tokio::net::TcpStream::connect(&target).await else { return (false, None, delays) };
    let _ = stream.set_nodelay(true);
    let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await else {
        return (false, None, delays);
    };
    tokio::spawn(conn);
    let req = Request::post("/v1/chat/completions")
        .header("host", &target)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    let asked = tokio::time::Instant::now();
    let Ok(answer) = send.send_request(req).await else { return (false, None, delays) };
    if !answer.status().is_success() {
        return (false, None, delays);
    }
    let mut body = answer.into_body();
    let (mut first, mut done, mut pending) = (None, false, Vec::<u8>::new());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Some(data) = frame.data_ref() else { continue };
        let now = unix_us();
        if first.is_none() {
            first = Some(asked.elapsed().as_micros() as u32);
        }
        pending.extend_from_slice(data);
        // Whole events only: a proxy may split or join them.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event = &pending[..end];
            if event.ends_with(b"[DONE]") {
                done = true;
            } else if let Some(at) = event.windows(7).position(|w| w == b"\"id\":\"t") {
                let digits: Vec<u8> = event[at + 7..].iter().copied().take_while(u8::is_ascii_digit).collect();
                if let Some(sent) = std::str::from_utf8(&digits).ok().and_then(|s| s.parse::<u64>().ok()) {
                    delays.push(now.saturating_sub(sent) as u32);
                }
            }
            pending.drain(..end + 2);
        }
    }
    (done, first, delays)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

async fn load(target: String, n: u32, ramp: Duration) {
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let target = target.clone();
            let at = start + ramp * i / n.max(1);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                one(target).await
            })
        })
        .collect();
    let (mut done, mut ttfe, mut delays) = (0u32, Vec::new(), Vec::new());
    for task in tasks {
        let Ok((ok, first, d)) = task.await else { continue };
        done += u32::from(ok);
        ttfe.extend(first);
        delays.extend(d);
    }
    ttfe.sort_unstable();
    delays.sort_unstable();
    println!(
        "{{\"streams\":{n},\"done\":{done},\"events\":{},\"ttfe_p50\":{:.3},\"ttfe_p99\":{:.3},\"delay_p50\":{:.3},\"delay_p99\":{:.3},\"secs\":{:.2}}}",
        delays.len(),
        percentile(&ttfe, 0.5),
        percentile(&ttfe, 0.99),
        percentile(&delays, 0.5),
        percentile(&delays, 0.99),
        start.elapsed().as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match arg(0).as_str() {
        "upstream" => {
            rt.block_on(upstream(arg(1), arg(2).parse().unwrap(), Duration::from_millis(arg(3).parse().unwrap())))
        }
        "load" => rt.block_on(load(arg(1), arg(2).parse().unwrap(), Duration::from_millis(arg(3).parse().unwrap()))),
        _ => eprintln!("usage: streams upstream ADDR EVENTS INTERVAL_MS | streams load TARGET N RAMP_MS"),
    }
}
