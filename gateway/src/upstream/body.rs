//! The body of an upstream answer as the rest of tidegate reads it: the
//! bytes the provider sent, or, for a Bedrock stream, its event-stream
//! frames already turned into the SSE events the client's protocol uses.
//!
//! An enum rather than a boxed trait object: the common case (a plain
//! body) stays a direct call on the hot path.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::eventstream::EventStreamSse;
use super::{PooledBody, ReadError};

/// An upstream answer's body.
pub enum UpstreamBody {
    /// As the provider sent it.
    Plain(PooledBody),
    /// AWS event-stream frames re-emitted as Anthropic SSE.
    EventStream(Box<EventStreamSse>),
}

impl From<PooledBody> for UpstreamBody {
    fn from(inner: PooledBody) -> Self {
        UpstreamBody::Plain(inner)
    }
}

impl UpstreamBody {
    /// Its reader is done with it (a stream's terminal event came): the
    /// rest is read in the background so its connection can be reused
    /// (see [`PooledBody::settle`]).
    pub fn settle(self) {
        match self {
            UpstreamBody::Plain(inner) => inner.settle(),
            UpstreamBody::EventStream(inner) => inner.settle(),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        match self.get_mut() {
            UpstreamBody::Plain(inner) => Pin::new(inner).poll_frame(cx).map_err(ReadError::from),
            UpstreamBody::EventStream(inner) => Pin::new(inner.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Plain(inner) => inner.is_end_stream(),
            UpstreamBody::EventStream(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Plain(inner) => inner.size_hint(),
            UpstreamBody::EventStream(_) => SizeHint::default(),
        }
    }
}
