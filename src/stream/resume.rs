//! Resuming a broken text stream instead of failing it (`stream_resume`).
//!
//! When a text-only stream dies mid-way (connection drop, idle gap, end
//! without its end marker) and the request has deadline left, tidegate asks
//! the alias's target to continue from the text already delivered — sent as
//! the assistant's partial turn — and splices the continuation's events into
//! the same client stream, minus the continuation's own opening events, so
//! the client sees one answer. Never while a tool call is being streamed:
//! half a tool call cannot be continued as text.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::time::Instant;

use super::sse::{Kind, Scanner};
use crate::protocol::Protocol;
use crate::server::Gateway;

/// Everything needed to ask for a continuation.
pub struct Resume {
    /// Shared gateway state.
    pub gw: Arc<Gateway>,
    /// Index of the alias in `config.models`.
    pub route: usize,
    /// The client's original body.
    pub body: Bytes,
    /// The client's headers (an allowlist is forwarded).
    pub headers: HeaderMap,
    /// The request's deadline.
    pub deadline: Instant,
    /// The stream's protocol.
    pub protocol: Protocol,
    /// Resumes left.
    pub tries: u8,
}

/// A continuation that started: the rest of its body, and its first events
/// (opening events removed) to relay.
pub struct Reopened {
    /// The continuation's body after `first`.
    pub inner: Incoming,
    /// Events to relay first (and any partial tail).
    pub first: Bytes,
    /// Upstream index that continues.
    pub upstream: usize,
}

/// The pending continuation request.
pub type Reopening = Pin<Box<dyn Future<Output = Result<Reopened, String>> + Send>>;

impl Resume {
    /// Starts a continuation from `partial`, the text delivered so far.
    pub fn reopen(&self, partial: String) -> Reopening {
        let gw = self.gw.clone();
        let (route, body, headers) = (self.route, self.body.clone(), self.headers.clone());
        let (deadline, protocol) = (self.deadline, self.protocol);
        Box::pin(async move { reopen(&gw, route, &body, &headers, deadline, protocol, &partial).await })
    }
}

async fn reopen(
    gw: &Gateway,
    route: usize,
    body: &[u8],
    headers: &HeaderMap,
    deadline: Instant,
    protocol: Protocol,
    partial: &str,
) -> Result<Reopened, String> {
    let target = gw.config.models.get_index(route).and_then(|(_, r)| r.targets.first()).ok_or("no target")?;
    let upstream = gw.upstreams.get(target.upstream).ok_or("no upstream")?;
    let body = continuation_body(body, protocol, partial, &target.model)
        .ok_or("the request body has no messages to continue")?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err("no deadline left".into());
    }
    let timeout = upstream.config.header_timeout.min(remaining);
    let resp = upstream.send(upstream.request(body, headers), timeout).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("the continuation was answered {}", resp.status()));
    }
    let mut inner = resp.into_body();
    let mut scanner = Scanner::new(protocol, 0);
    let mut first = BytesMut::new();
    let wait = upstream.config.stream_idle_timeout.min(remaining);
    loop {
        let frame = match tokio::time::timeout(wait, inner.frame()).await {
            Err(_) => return Err(format!("the continuation sent nothing for {wait:?}")),
            Ok(None) => return Err("the continuation ended before any content".into()),
            Ok(Some(Err(err))) => return Err(format!("the continuation failed: {err}")),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        scanner.feed(&data);
        while let Some((kind, end)) = scanner.next_event() {
            let event = scanner.take(end);
            match kind {
                // The client already has the answer's opening.
                Kind::KeepAlive | Kind::Start | Kind::BlockStart => {}
                Kind::Content => {
                    first.extend_from_slice(&event);
                    let tail = scanner.take(scanner.held());
                    first.extend_from_slice(&tail);
                    return Ok(Reopened { inner, first: first.freeze(), upstream: target.upstream });
                }
                Kind::Error => return Err("the continuation opened with an error".into()),
                Kind::Done => return Err("the continuation ended before any content".into()),
            }
        }
    }
}

/// The original body with `model` set for the target and the partial
/// answer appended as the assistant's turn (merged into a trailing
/// assistant message if the client had one).
pub fn continuation_body(original: &[u8], protocol: Protocol, partial: &str, model: &str) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(original).ok()?;
    let obj = v.as_object_mut()?;
    obj.insert("model".into(), Value::String(model.into()));
    // Anthropic rejects a final assistant turn ending in whitespace.
    let partial = match protocol {
        Protocol::Anthropic => partial.trim_end(),
        Protocol::OpenAi => partial,
    };
    let messages = obj.get_mut("messages")?.as_array_mut()?;
    let last_is_assistant = messages.last().is_some_and(|m| m["role"] == "assistant");
    match messages.last_mut().filter(|_| last_is_assistant).map(|m| &mut m["content"]) {
        Some(Value::String(text)) => text.push_str(partial),
        Some(Value::Array(blocks)) => blocks.push(serde_json::json!({"type": "text", "text": partial})),
        _ => messages.push(serde_json::json!({"role": "assistant", "content": partial})),
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_answer_becomes_the_assistant_turn() {
        let body = br#"{"model":"alias","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let out = continuation_body(body, Protocol::Anthropic, "tok0 tok1 ", "real").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"real","max_tokens":50,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"tok0 tok1"}],"stream":true}"#
        );
        let prefilled =
            br#"{"model":"a","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure: "}]}"#;
        let out = continuation_body(prefilled, Protocol::OpenAi, "one two ", "a").unwrap();
        assert!(std::str::from_utf8(&out).unwrap().contains(r#"{"role":"assistant","content":"Sure: one two "}"#));
        assert!(continuation_body(br#"{"model":"a"}"#, Protocol::OpenAi, "x", "a").is_none());
    }
}
