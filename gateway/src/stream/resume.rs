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
//! The continuation is an attempt like any other: the request's owner
//! ([`crate::exchange`]) runs it through the same attempt loop as the
//! first answer, so it goes through target choice, the limiter,
//! classification, health feedback and the journal's attempt rows. This
//! module only says what a started continuation hands over; the stream
//! body says when to ask and splices the answer in.

use crate::upstream::UpstreamBody;
use bytes::Bytes;

use crate::ids::UpstreamId;

/// A continuation that started: the rest of its body and what its
/// handshake read (the stream body drops the opening events from it).
pub struct Reopened {
    /// The continuation's body after `first`.
    pub inner: UpstreamBody,
    /// Bytes read so far, opening events included.
    pub first: Bytes,
    /// The upstream that continues (index, name).
    pub upstream: (UpstreamId, String),
}
