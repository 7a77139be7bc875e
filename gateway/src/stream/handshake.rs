//! Holding a stream until it proves itself.
//!
//! Some providers reject an over-limit stream with HTTP 200 whose only event
//! is an error, or close it before any content ("empty stream"). tidegate
//! reads until the first meaningful event before committing anything to the
//! client, so such an attempt is classified and retried like any other
//! failed answer, and the client never sees a byte of it.

use std::time::Duration;

use crate::upstream::UpstreamBody;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::PARTIAL_CAP;
use super::sse::Scanner;
use crate::protocol::Protocol;
use crate::protocol::events::Kind;

/// How a stream's opening went.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per stream and matched at once: boxing the large `Open` would add an allocation to every stream for no saving"
)]
pub enum Handshake {
    /// Content started: relay it. `ready` bytes of the scanner are complete
    /// events to send first (keep-alives and the opening included).
    Open {
        /// The rest of the upstream body.
        inner: UpstreamBody,
        /// What was read so far.
        scanner: Scanner,
        /// Bytes ready to forward.
        ready: usize,
    },
    /// The first real event was an error; its data.
    Rejected(Bytes),
    /// The stream ended (or said `[DONE]`) before any content.
    Empty,
    /// The connection failed or went silent before any content.
    Broken(String),
    /// The request's deadline came first (keep-alives do not extend it).
    Deadline,
}

/// Reads `inner` up to its first meaningful event; `idle` bounds each gap,
/// `deadline` the whole handshake (comments and pings do not extend it),
/// `max_event` the bytes of one unfinished event. `translated`: the
/// client speaks another protocol, so an event that is not JSON is a
/// broken stream (retried like one), not content.
pub async fn handshake(
    mut inner: UpstreamBody,
    protocol: Protocol,
    idle: Duration,
    deadline: Instant,
    max_event: usize,
    translated: bool,
) -> Handshake {
    let mut scanner = Scanner::with_limit(protocol, PARTIAL_CAP, max_event);
    loop {
        let gap = Instant::now() + idle;
        let frame = match tokio::time::timeout_at(gap.min(deadline), inner.frame()).await {
            Err(_) if deadline <= gap => return Handshake::Deadline,
            Err(_) => return Handshake::Broken(format!("no event within {idle:?}")),
            Ok(None) => return Handshake::Empty,
            Ok(Some(Err(err))) => return Handshake::Broken(format!("connection failed: {err}")),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        scanner.feed_bytes(data);
        if scanner.oversized() {
            return Handshake::Broken(format!("an event exceeded {max_event} bytes (max_stream_event)"));
        }
        while let Some((kind, end)) = scanner.next_event() {
            match kind {
                Kind::KeepAlive | Kind::Start => {}
                Kind::Unreadable if translated => {
                    return Handshake::Broken("the upstream sent an event that is not JSON before any content".into());
                }
                Kind::Content | Kind::BlockStart | Kind::Unreadable => {
                    return Handshake::Open { inner, scanner, ready: end };
                }
                Kind::Error => return Handshake::Rejected(scanner.seen.error.take().unwrap_or_default()),
                Kind::Done => return Handshake::Empty,
            }
        }
    }
}
