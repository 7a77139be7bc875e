//! Holding a stream until it proves itself.
//!
//! Some providers reject an over-limit stream with HTTP 200 whose only event
//! is an error, or close it before any content ("empty stream"). tidegate
//! reads until the first meaningful event before committing anything to the
//! client, so such an attempt is classified and retried like any other
//! failed answer, and the client never sees a byte of it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::PARTIAL_CAP;
use super::sse::{Kind, Scanner};
use crate::protocol::Protocol;

/// How a stream's opening went.
pub enum Handshake {
    /// Content started: relay it. `ready` bytes of the scanner are complete
    /// events to send first (keep-alives and the opening included).
    Open {
        /// The rest of the upstream body.
        inner: Incoming,
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
}

/// Reads `inner` up to its first meaningful event; `wait` bounds each gap.
pub async fn handshake(mut inner: Incoming, protocol: Protocol, wait: Duration) -> Handshake {
    let mut scanner = Scanner::new(protocol, PARTIAL_CAP);
    loop {
        let frame = match tokio::time::timeout(wait, inner.frame()).await {
            Err(_) => return Handshake::Broken(format!("no event within {wait:?}")),
            Ok(None) => return Handshake::Empty,
            Ok(Some(Err(err))) => return Handshake::Broken(format!("connection failed: {err}")),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        scanner.feed(&data);
        while let Some((kind, end)) = scanner.next_event() {
            match kind {
                Kind::KeepAlive | Kind::Start => {}
                Kind::Content | Kind::BlockStart => return Handshake::Open { inner, scanner, ready: end },
                Kind::Error => return Handshake::Rejected(scanner.seen.error.take().unwrap_or_default()),
                Kind::Done => return Handshake::Empty,
            }
        }
    }
}

/// The HTTP status an error event stands for, so it is classified like the
/// non-200 answer it replaces: a numeric `status`/`code` in the error
/// object, else the protocol error type, else 200 (judged by its words).
pub fn frame_status(data: &[u8]) -> u16 {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return 200 };
    let err = v.get("error").unwrap_or(&v);
    for key in ["status", "code", "status_code"] {
        let n = match err.get(key).or_else(|| v.get(key)) {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        if let Some(n) = n.filter(|n| (400..=599).contains(n)) {
            return n as u16;
        }
    }
    match err.get("type").and_then(|t| t.as_str()) {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") => 429,
        Some("api_error") => 500,
        Some("invalid_request_error") => 400,
        Some("authentication_error") => 401,
        Some("permission_error") => 403,
        Some("not_found_error") => 404,
        Some("request_too_large") => 413,
        _ => 200,
    }
}

#[cfg(test)]
mod tests {
    use super::frame_status;

    #[test]
    fn error_frames_map_to_statuses() {
        assert_eq!(frame_status(br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#), 529);
        assert_eq!(frame_status(br#"{"error":{"code":429,"message":"busy"}}"#), 429);
        assert_eq!(frame_status(br#"{"error":{"code":"TM.00001041","message":"3 sessions"}}"#), 200);
        assert_eq!(frame_status(br#"{"error":{"status":"503"}}"#), 503);
        assert_eq!(frame_status(b"not json"), 200);
    }
}
