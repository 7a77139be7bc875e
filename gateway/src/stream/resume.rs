//! Resuming a broken text stream instead of failing it (`stream_resume`).
//!
//! When a text-only stream dies mid-way (connection drop, idle gap, end
//! without its terminal event) and the request has deadline left, tidegate
//! asks for a continuation from the text already delivered — sent as the
//! assistant's partial turn, built by the protocol — and splices the
//! continuation's events into the same client stream, minus its opening
//! events (dropped by the stream body), so the client sees one answer. Never while a tool call is being
//! streamed: half a tool call cannot be continued as text.
//!
//! The continuation is an attempt like any other: the relay builds the
//! [`Reopen`] function, so it goes through target choice, the limiter,
//! classification, health feedback and the journal's attempt rows. This
//! module only says when to ask and how to splice the answer in.

use std::future::Future;
use std::pin::Pin;

use crate::upstream::UpstreamBody;
use bytes::Bytes;
use tokio::time::Instant;

use crate::limits::Permit;
use crate::record::AttemptLog;

/// Starts a continuation from the text delivered so far; `None` when the
/// request cannot be continued (the protocol or body does not allow it).
pub type Reopen = Box<dyn FnMut(&str) -> Option<Reopening> + Send>;

/// A continuation on its way: its result and the attempts it made.
pub type Reopening = Pin<Box<dyn Future<Output = (Result<Reopened, String>, Vec<AttemptLog>)> + Send>>;

/// When and how a stream may be continued.
pub struct Resume {
    /// Asks the relay for a continuation.
    pub reopen: Reopen,
    /// The request's deadline: no continuation is asked for after it.
    pub deadline: Instant,
    /// Resumes left.
    pub tries: u8,
}

/// A continuation that started: the rest of its body and what its
/// handshake read (the stream body drops the opening events from it).
pub struct Reopened {
    /// The continuation's body after `first`.
    pub inner: UpstreamBody,
    /// Bytes read so far, opening events included.
    pub first: Bytes,
    /// The continuation's upstream slot, held to its last byte.
    pub permit: Option<Permit>,
    /// The upstream that continues (index, name).
    pub upstream: (usize, String),
}
