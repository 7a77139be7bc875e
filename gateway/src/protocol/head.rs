//! The request's head: the few fields tidegate reads of a request body
//! (`model` and where its value sits, `stream`, the token cap, the
//! Responses API's `previous_response_id` and `store`), and the splice
//! that renames the model in the same bytes.
//!
//! serde_json reads it: a faster reader was measured and dropped
//! (2026-12-05). The event walker ([`super::walk`]) took half of
//! serde_json's instructions on a 64-byte chat body but ran at half its
//! speed on a 237 KB agent body, and coding agents send the latter.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

/// What tidegate needs from a request body, with the byte span of the
/// `model` value so it can be replaced without touching anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The model the client asked for.
    pub model: String,
    /// Byte range of the JSON string literal (quotes included).
    pub model_span: Range<usize>,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// `max_tokens` (or `max_completion_tokens`, `max_output_tokens`), for
    /// token-rate limits.
    pub max_tokens: Option<u64>,
    /// Responses API: the stored response this one continues; such a
    /// request can only be served by the upstream that stored it.
    pub previous_response_id: Option<String>,
    /// Responses API: `store` as sent (`false`: nothing stored upstream,
    /// so nothing to pin).
    pub store: Option<bool>,
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeekError {
    /// Not JSON, or not an object.
    #[error("request body is not a JSON object: {0}")]
    Malformed(String),
    /// No `model` field.
    #[error("request body has no \"model\" field")]
    MissingModel,
    /// `model` present but not a string.
    #[error("\"model\" must be a string")]
    ModelNotString,
}

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
}

/// Reads `model` and `stream` from a request body in one pass (the rest is
/// skipped, but still checked to be well-formed JSON).
pub fn peek(body: &[u8]) -> Result<RequestHead, PeekError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(PeekError::Malformed("expected an object".into()));
    }
    let peek: Peek<'_> = serde_json::from_slice(body).map_err(|e| PeekError::Malformed(e.to_string()))?;
    let raw = peek.model.ok_or(PeekError::MissingModel)?;
    let model: String = serde_json::from_str(raw.get()).map_err(|_| PeekError::ModelNotString)?;
    // `raw` borrows from `body`, so its position is a plain pointer offset.
    let start = (raw.get().as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let span = start..start + raw.get().len();
    if body.get(span.clone()) != Some(raw.get().as_bytes()) {
        return Err(PeekError::Malformed("could not locate \"model\"".into()));
    }
    Ok(RequestHead {
        model,
        model_span: span,
        stream: peek.stream.unwrap_or(false),
        max_tokens: peek.max_tokens.or(peek.max_completion_tokens).or(peek.max_output_tokens),
        previous_response_id: peek.previous_response_id,
        store: peek.store,
    })
}

/// The body to send upstream: the same bytes, with the `model` value
/// replaced only if the target's name differs from the client's.
pub fn body_for_target(body: &Bytes, head: &RequestHead, target_model: &str) -> Bytes {
    // An empty span: the model is not in the body (Gemini names it in the path).
    if head.model == target_model || head.model_span.is_empty() {
        return body.clone();
    }
    let literal = serde_json::Value::String(target_model.to_owned()).to_string();
    let mut out = BytesMut::with_capacity(body.len() - head.model_span.len() + literal.len());
    out.extend_from_slice(&body[..head.model_span.start]);
    out.extend_from_slice(literal.as_bytes());
    out.extend_from_slice(&body[head.model_span.end..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_finds_model_span_and_stream() {
        let body = br#"{"messages":[{"role":"user","content":"model"}], "model" : "a\"b", "stream":true}"#;
        let head = peek(body).unwrap();
        assert_eq!(head.model, "a\"b");
        assert_eq!(&body[head.model_span.clone()], br#""a\"b""#);
        assert!(head.stream);
    }

    #[test]
    fn peek_rejects_bad_bodies() {
        assert!(matches!(peek(b"{not json"), Err(PeekError::Malformed(_))));
        assert!(matches!(peek(b"[1,2]"), Err(PeekError::Malformed(_))));
        assert!(matches!(peek(b""), Err(PeekError::Malformed(_))));
        assert_eq!(peek(br#"{"messages":[]}"#), Err(PeekError::MissingModel));
        assert_eq!(peek(br#"{"model":3}"#), Err(PeekError::ModelNotString));
        assert!(matches!(peek(br#"{"model":"a","stream":"yes"}"#), Err(PeekError::Malformed(_))));
    }

    #[test]
    fn rewrite_touches_only_the_model_value() {
        let body =
            Bytes::from_static(br#"{"z":1,  "model":"alias","tools":[{"x":"model"}],"unknown":{"deep":[1,2.50]}}"#);
        let head = peek(&body).unwrap();
        let out = body_for_target(&body, &head, "real-\"model\"");
        assert_eq!(
            &out[..],
            &br#"{"z":1,  "model":"real-\"model\"","tools":[{"x":"model"}],"unknown":{"deep":[1,2.50]}}"#[..]
        );
        // Same name: the very same bytes, no copy.
        let same = body_for_target(&body, &head, "alias");
        assert_eq!(same.as_ptr(), body.as_ptr());
    }

    #[test]
    fn peek_reads_the_responses_fields() {
        let head =
            peek(br#"{"model":"m","input":"hi","previous_response_id":"resp_1","max_output_tokens":99}"#).unwrap();
        assert_eq!(head.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(head.max_tokens, Some(99));
    }
}
