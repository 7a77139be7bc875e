//! Reading a request's body, and throwing one away.
//!
//! Both bounded in size and time. Every answer tidegate gives before it
//! reads a body — a wrong key, a foreign origin, an unknown path, a
//! draining replica, a body too large — first reads what the client is
//! sending (up to [`DISCARD_AT_MOST`]) and drops it: HTTP/1 clients send
//! their whole body before they read the answer, and a connection closed
//! on unread bytes reaches them as a reset instead of the answer (async
//! clients — httpx's `AsyncClient`, so `AsyncOpenAI` and `AsyncAnthropic`
//! — then report a connection error, not the 401, and may upload it all
//! again). A client that asked `Expect: 100-continue` has not sent its
//! body yet: it gets the answer at once, and the body is never invited.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body_util::BodyExt;

use crate::error::GatewayError;

/// A client's request body: hyper's own on the model endpoints (`Front`
/// hands it over unboxed), axum's behind the router.
pub trait ClientBody: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin {}

impl<B: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin> ClientBody for B {}

/// Request bodies up to this size are copied out of hyper's read buffer
/// (see `handlers::unpinned`: held to the request's end they would pin
/// it); a larger one filled buffers of its own.
const PINNED_COPY_MAX: usize = 16 * 1024;

/// Most bytes of a refused body read (and thrown away) before the answer
/// is sent (see the module's doc); past it the connection is closed.
const DISCARD_AT_MOST: usize = 256 * 1024 * 1024;

/// Reads the whole request body, refusing more than `max` bytes, within
/// `limit` (a client trickling its body cannot hold a request open). An
/// oversized body is read to its end (up to [`DISCARD_AT_MOST`]) and
/// dropped, so the client reads the 413 instead of a reset connection.
pub async fn read(
    body: impl ClientBody,
    headers: &HeaderMap,
    max: usize,
    limit: Duration,
) -> Result<Bytes, GatewayError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let read = async {
        let mut body = body;
        // Frames are kept as they arrive: a body in one frame (the usual
        // case) is passed on without a copy or a list.
        let mut first: Option<Bytes> = None;
        let mut frames: Vec<Bytes> = Vec::new();
        let mut seen = 0usize;
        let mut too_large = declared.is_some_and(|n| n > max as u64);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| GatewayError::BadRequest(format!("could not read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            seen += data.len();
            if seen > max {
                too_large = true;
                first = None;
                frames.clear();
            }
            if too_large {
                if seen > DISCARD_AT_MOST {
                    break;
                }
                continue;
            }
            if first.is_none() && frames.is_empty() {
                first = Some(data);
            } else {
                frames.extend(first.take());
                frames.push(data);
            }
        }
        if too_large {
            return Err(GatewayError::TooLarge { limit: max });
        }
        Ok(match first {
            // Like the headers (see `unpinned`), a small body is copied
            // out of hyper's read buffer.
            Some(only) if only.len() <= PINNED_COPY_MAX => Bytes::copy_from_slice(&only),
            Some(only) => only,
            None if frames.is_empty() => Bytes::new(),
            None => Bytes::from(frames.concat()),
        })
    };
    // A body that came with its head (the usual small request) is read
    // at the first poll, without arming a timer for it.
    let mut read = std::pin::pin!(read);
    let at_once = std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
        std::task::Poll::Ready(result) => std::task::Poll::Ready(Some(result)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    if let Some(result) = at_once {
        return result;
    }
    match tokio::time::timeout(limit, read).await {
        Ok(result) => result,
        Err(_) => Err(GatewayError::BodyTimeout { limit }),
    }
}

/// Reads and drops what the client sends of a body tidegate refuses
/// before using it, so the client reads the refusal (see the module's
/// doc): up to [`DISCARD_AT_MOST`] bytes, within `limit`. Nothing is read
/// when the client waits for `100 Continue` or sent no body.
pub async fn discard(body: impl ClientBody, headers: &HeaderMap, limit: Duration) {
    let waits_for_continue =
        headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if waits_for_continue || http_body::Body::is_end_stream(&body) {
        return;
    }
    let drain = async {
        let mut body = body;
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > DISCARD_AT_MOST {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, drain).await;
}
