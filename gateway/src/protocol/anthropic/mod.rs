//! Anthropic messages (`POST /v1/messages`, `/v1/messages/count_tokens`):
//! error shape, model list, and the stream's grammar — `message_start`
//! opens, `content_block_start` opens a block, deltas carry text or tool
//! input, `ping` keeps alive, `event: error` fails, `message_stop` ends.

pub mod turn;

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

use super::ErrorKind;
use super::events::{Kind, Seen, Text, TextSink, sse_event};

/// `{"type":"error","error":{"type","message"}}`, the shape the Anthropic
/// SDKs parse into their typed exceptions.
pub fn error_body(kind: ErrorKind, message: &str) -> Bytes {
    let kind = match kind {
        ErrorKind::InvalidRequest => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Permission => "permission_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::TooLarge => "request_too_large",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api | ErrorKind::Timeout => "api_error",
        ErrorKind::Overloaded => "overloaded_error",
    };
    Bytes::from(json!({"type": "error", "error": {"type": kind, "message": message}}).to_string())
}

/// A mid-stream failure: `event: error` with the error body, which the
/// Anthropic SDKs raise as an exception.
pub fn error_event(kind: ErrorKind, message: &str) -> Bytes {
    sse_event(Some("error"), &error_body(kind, message))
}

/// `GET /v1/models` in Anthropic's shape, for clients that send
/// `anthropic-version` (the Anthropic SDK's `models.list()`).
pub fn models_list<'a>(aliases: impl Iterator<Item = &'a str>) -> Bytes {
    let data: Vec<_> = aliases
        .map(|id| json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"}))
        .collect();
    let first = data.first().and_then(|m| m["id"].as_str()).map(str::to_owned);
    let last = data.last().and_then(|m| m["id"].as_str()).map(str::to_owned);
    Bytes::from(json!({"data": data, "has_more": false, "first_id": first, "last_id": last}).to_string())
}

/// What one messages-stream event is.
pub fn inspect(name: Option<&str>, data: &str, seen: &mut Seen, text_cap: usize) -> Kind {
    let event = serde_json::from_str::<Event<'_>>(data).ok();
    let kind = name.map(Cow::Borrowed).or_else(|| event.as_ref().map(|e| e.kind.clone()));
    let Some(kind) = kind else { return Kind::Content };
    match kind.as_ref() {
        "ping" => return Kind::KeepAlive,
        "error" => return Kind::Error,
        "message_stop" => return Kind::Done,
        _ => {}
    }
    let Some(event) = event else { return Kind::Content };
    if let Some(u) = event.message.as_ref().and_then(|m| m.usage.as_ref()).or(event.usage.as_ref()) {
        seen.usage.input = u.input_tokens.or(seen.usage.input);
        seen.usage.output = u.output_tokens.or(seen.usage.output);
    }
    if let Some(delta) = &event.delta {
        if let Some(t) = &delta.text {
            TextSink { text: &mut seen.text, cap: text_cap }.push(t);
        }
        if delta.partial_json.is_some() {
            seen.tool_call = true;
        }
    }
    if event.content_block.as_ref().is_some_and(|b| b.kind == "tool_use") {
        seen.tool_call = true;
    }
    match kind.as_ref() {
        "message_start" => Kind::Start,
        "content_block_start" => Kind::BlockStart,
        _ => Kind::Content,
    }
}

/// The request to continue a broken text answer. Anthropic rejects a
/// final assistant turn ending in whitespace, so the partial text is
/// trimmed at the end.
pub fn continuation_body(original: &[u8], partial: &str, model: &str) -> Option<Bytes> {
    super::append_assistant_turn(original, partial.trim_end(), model)
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<EventUsage>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(borrow, default)]
    content_block: Option<Block<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(default)]
    partial_json: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    usage: Option<EventUsage>,
}

#[derive(Deserialize)]
struct EventUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}
