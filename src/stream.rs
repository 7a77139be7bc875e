//! The response body relayed to the client, chunk by chunk as it arrives.
//!
//! It wraps the upstream body without buffering and enforces the upstream's
//! `stream_idle_timeout`: a stream silent for longer than that is ended with
//! an error instead of hanging the client forever. Dropping it (the client
//! went away) drops the upstream body, which closes that upstream
//! connection at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// Why a relayed body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The upstream connection failed mid-body.
    #[error("upstream body failed: {0}")]
    Upstream(#[from] hyper::Error),
    /// No chunk within the idle limit.
    #[error("upstream sent nothing for {0:?}")]
    Idle(Duration),
}

/// Upstream body with an idle timeout.
pub struct RelayBody {
    inner: Incoming,
    idle: Duration,
    last_frame: Instant,
    /// Armed lazily: a body that is always ready never touches the timer.
    timer: Option<Pin<Box<Sleep>>>,
}

impl RelayBody {
    /// Wraps `inner`; `idle` is the longest allowed gap between frames.
    pub fn new(inner: Incoming, idle: Duration) -> Self {
        Self { inner, idle, last_frame: Instant::now(), timer: None }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.last_frame = Instant::now();
                return Poll::Ready(frame.map(|r| r.map_err(BodyError::from)));
            }
            Poll::Pending => {}
        }
        let deadline = this.last_frame + this.idle;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::Idle(this.idle)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
