//! The two client-facing wire protocols, reduced to what tidegate reads.
//!
//! tidegate never re-serialises a request: it reads `model` and `stream`
//! from the raw bytes and, when a target renames the model, splices the new
//! value into the same bytes. Field order, unknown fields, tools and images
//! reach the upstream exactly as the client sent them.

pub mod anthropic;
pub mod openai;

use std::fmt;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A client-facing API dialect; also what an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OpenAI chat completions.
    OpenAi,
    /// Anthropic messages.
    Anthropic,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::OpenAi => "openai",
            Protocol::Anthropic => "anthropic",
        })
    }
}

impl Protocol {
    /// The client endpoint that serves this protocol.
    pub fn endpoint(self) -> &'static str {
        match self {
            Protocol::OpenAi => "/v1/chat/completions",
            Protocol::Anthropic => "/v1/messages",
        }
    }

    /// Path appended to an upstream's `base_url` (each as its official SDK
    /// takes it: OpenAI's includes `/v1`, Anthropic's does not).
    pub fn upstream_path(self) -> &'static str {
        match self {
            Protocol::OpenAi => "/chat/completions",
            Protocol::Anthropic => "/v1/messages",
        }
    }
}

/// What tidegate needs from a request body, with the byte span of the
/// `model` value so it can be replaced without touching anything else.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The model the client asked for.
    pub model: String,
    /// Byte range of the JSON string literal (quotes included).
    pub model_span: Range<usize>,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// `max_tokens` (or `max_completion_tokens`), for token-rate limits.
    pub max_tokens: Option<u64>,
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
        max_tokens: peek.max_tokens.or(peek.max_completion_tokens),
    })
}

/// The body to send upstream: the same bytes, with the `model` value
/// replaced only if the target's name differs from the client's.
pub fn body_for_target(body: &Bytes, head: &RequestHead, target_model: &str) -> Bytes {
    if head.model == target_model {
        return body.clone();
    }
    let literal = serde_json::Value::String(target_model.to_owned()).to_string();
    let mut out = BytesMut::with_capacity(body.len() - head.model_span.len() + literal.len());
    out.extend_from_slice(&body[..head.model_span.start]);
    out.extend_from_slice(literal.as_bytes());
    out.extend_from_slice(&body[head.model_span.end..]);
    out.freeze()
}

/// Error categories tidegate itself answers with, mapped to each
/// protocol's type names by [`openai::error_body`] / [`anthropic::error_body`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad request body.
    InvalidRequest,
    /// Missing or wrong client key.
    Authentication,
    /// Unknown model or path.
    NotFound,
    /// Body over the size limit.
    TooLarge,
    /// Rate limited (queue full, still limited after retries).
    RateLimit,
    /// Upstream failure or unreachable.
    Api,
    /// Upstream overloaded.
    Overloaded,
    /// Deadline spent.
    Timeout,
}

/// Serialises a tidegate error in `protocol`'s shape.
pub fn error_body(protocol: Protocol, kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
    match protocol {
        Protocol::OpenAi => openai::error_body(kind, message, code),
        Protocol::Anthropic => anthropic::error_body(kind, message),
    }
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
}
