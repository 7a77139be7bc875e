//! Keeping a waiting stream alive.
//!
//! A streaming request that has waited (backoff, queue) longer than
//! `stream_keepalive_after` gets `200` and SSE headers at once, then a
//! comment line every few seconds saying what it waits for, so clients and
//! proxies in between do not time out. The attempt loop keeps running inside
//! this body; when it ends, the upstream's events follow, or the failure
//! arrives as the protocol's error event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use super::{Answer, Relayed};
use crate::protocol::Protocol;
use crate::record::Outcome;
use crate::report::Report;

/// Where the attempt loop stands, readable while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Attempts started so far.
    pub attempt: AtomicU32,
    /// Upstream of the current attempt.
    pub upstream: AtomicUsize,
}

impl Progress {
    /// Records a new attempt.
    pub fn attempt(&self, upstream: usize) {
        self.upstream.store(upstream, Ordering::Relaxed);
        self.attempt.fetch_add(1, Ordering::Relaxed);
    }
}

/// The attempt loop, owned.
pub type RelayFuture = Pin<Box<dyn Future<Output = Relayed> + Send>>;

/// A committed SSE response whose answer is still being fetched.
pub struct WaitingBody {
    relay: Option<RelayFuture>,
    tick: Pin<Box<Sleep>>,
    every: Duration,
    progress: Arc<Progress>,
    names: Arc<[String]>,
    protocol: Protocol,
    then: Option<Body>,
    last: Option<Bytes>,
    report: Option<Report>,
}

impl WaitingBody {
    /// Takes over `relay`; `names` are upstream names for the comments.
    pub fn new(
        relay: RelayFuture,
        every: Duration,
        progress: Arc<Progress>,
        names: Arc<[String]>,
        protocol: Protocol,
        report: Report,
    ) -> Self {
        Self {
            relay: Some(relay),
            tick: Box::pin(tokio::time::sleep(Duration::ZERO)),
            every,
            progress,
            names,
            protocol,
            then: None,
            last: None,
            report: Some(report),
        }
    }

    fn comment(&self) -> Bytes {
        let attempt = self.progress.attempt.load(Ordering::Relaxed);
        let upstream = self.names.get(self.progress.upstream.load(Ordering::Relaxed)).map_or("-", String::as_str);
        if attempt == 0 {
            // Nothing sent yet: queued, or held by a provider's Retry-After.
            return Bytes::from_static(": waiting for capacity — before the first attempt\n\n".as_bytes());
        }
        Bytes::from(format!(": waiting for capacity — attempt {attempt} on {upstream}\n\n"))
    }

    fn settle(&mut self, relayed: Relayed) {
        let Some(mut report) = self.report.take() else { return };
        report.upstream = relayed.upstream.and_then(|i| self.names.get(i).cloned());
        report.attempts = relayed.attempts;
        report.queue_wait = relayed.queue_wait;
        report.pass = relayed.pass;
        match relayed.answer {
            Answer::Stream(_, mut body) => {
                body.attach(report);
                self.then = Some(Body::new(*body));
            }
            other => {
                let (event, class, message) = other.error_event(self.protocol);
                report.class = class;
                report.error = Some(message);
                self.last = Some(event);
                report.finish(Outcome::Failed);
            }
        }
    }
}

impl http_body::Body for WaitingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(body) = this.then.as_mut() {
                return Pin::new(body).poll_frame(cx);
            }
            if let Some(last) = this.last.take() {
                return Poll::Ready(Some(Ok(Frame::data(last))));
            }
            let Some(relay) = this.relay.as_mut() else { return Poll::Ready(None) };
            if let Poll::Ready(relayed) = relay.as_mut().poll(cx) {
                this.relay = None;
                this.settle(relayed);
                continue;
            }
            if this.tick.as_mut().poll(cx).is_ready() {
                let next = tokio::time::Instant::now() + this.every;
                this.tick.as_mut().reset(next);
                return Poll::Ready(Some(Ok(Frame::data(this.comment()))));
            }
            return Poll::Pending;
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
