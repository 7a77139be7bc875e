//! Anthropic messages (`POST /v1/messages`, `/v1/messages/count_tokens`):
//! error shape, model list, and the stream's grammar — `message_start`
//! opens, `content_block_start` opens a block, deltas carry text or tool
//! input, `ping` keeps alive, `event: error` fails, `message_stop` ends.

pub mod stream;
pub mod turn;

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

use super::ErrorKind;
use super::events::{Hole, HoleKind, Kind, Seen, Text, TextSink, sse_event, unreadable};
use super::walk::{Walk, once};

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
    // The walker reads a usual event; serde_json whatever it gives up on.
    let walked = read_event(data, Some(seen.holes.start()));
    let whole = walked.is_some();
    let event = walked.or_else(|| serde_json::from_str::<Event<'_>>(data).ok());
    let kind = name.map(Cow::Borrowed).or_else(|| event.as_ref().map(|e| e.kind.clone()));
    let Some(kind) = kind else {
        return if unreadable(data) { Kind::Unreadable } else { Kind::Content };
    };
    match kind.as_ref() {
        "ping" => return Kind::KeepAlive,
        "error" => return Kind::Error,
        "message_stop" => return Kind::Done,
        _ => {}
    }
    let Some(event) = event else {
        return if unreadable(data) { Kind::Unreadable } else { Kind::Content };
    };
    if let Some(u) = event.message.as_ref().and_then(|m| m.usage.as_ref()).or(event.usage.as_ref()) {
        seen.usage.take_anthropic(
            u.input_tokens,
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
            u.output_tokens,
        );
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
        _ => {
            if whole {
                // The one string read as text is the delta's text.
                seen.holes.read_as(HoleKind::Text);
            }
            Kind::Content
        }
    }
}

/// The request to continue a broken text answer. Anthropic rejects a
/// final assistant turn ending in whitespace, so the partial text is
/// trimmed at the end.
pub fn continuation_body(original: &[u8], partial: &str, model: &str) -> Option<Bytes> {
    super::append_assistant_turn(original, partial.trim_end(), model)
}

/// An event as [`Walk`] reads it: the same [`Event`] serde_json would
/// give, or `None` where it leaves the event to serde_json (see
/// [`super::walk`]). `message` (once per answer, in `message_start`) and
/// `usage` are small parts serde_json reads.
fn read_event<'a>(data: &'a str, holes: Option<&mut Vec<Hole>>) -> Option<Event<'a>> {
    let (mut kind, mut delta, mut usage, mut message, mut block) = (None, None, None, None, None);
    let mut w = Walk::recording(data, holes);
    w.object(|w, key| match key {
        b"type" => once(&mut kind, w.string()),
        b"delta" => once(&mut delta, if w.null() { Some(None) } else { read_delta(w).map(Some) }),
        b"usage" => once(&mut usage, w.part::<EventUsage>()),
        b"message" => once(&mut message, w.part::<Message>()),
        b"content_block" => once(&mut block, w.typed().map(|kind| kind.map(|kind| Block { kind }))),
        _ => w.skip(),
    })?;
    w.end()?;
    Some(Event {
        kind: kind?,
        delta: delta.flatten(),
        usage: usage.flatten(),
        message: message.flatten(),
        content_block: block.flatten(),
    })
}

fn read_delta<'a>(w: &mut Walk<'a, '_>) -> Option<Delta<'a>> {
    if !w.at_object() {
        return None;
    }
    let (mut text, mut partial_json) = (None, None);
    w.object(|w, key| match key {
        b"text" => once(&mut text, w.text()),
        b"partial_json" => once(&mut partial_json, w.present()),
        _ => w.skip(),
    })?;
    Some(Delta { text: text.flatten(), partial_json: partial_json.flatten() })
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
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
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Delta<'a> {
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(default)]
    partial_json: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Message {
    #[serde(default)]
    usage: Option<EventUsage>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct EventUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events as the Messages API sends them, and odd ones.
    const EVENTS: &[&str] = &[
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"line\nwith \"quotes\" é 漢字"}}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        r#" { "type" : "content_block_delta" , "delta" : { "text" : null , "partial_json" : null } , "content_block" : null , "usage" : null } "#,
    ];

    #[test]
    fn the_walker_reads_an_event_as_serde_json_does_or_leaves_it_to_serde_json() {
        // Every usual event is read by the walker, and where it answers a
        // mutated one, it answers what serde_json does.
        super::super::walk::agrees(EVENTS, |text| match read_event(text, None) {
            Some(fast) => {
                assert_eq!(Some(fast), serde_json::from_str::<Event<'_>>(text).ok(), "{text}");
                true
            }
            None => false,
        });
        // What it leaves to serde_json: a duplicate, a `\u` escape, a
        // missing `type`.
        for event in [
            r#"{"type":"a","type":"b"}"#,
            r#"{"type":"content_block_delta","delta":{"text":"\u00e9"}}"#,
            r#"{"delta":{"text":"x"}}"#,
        ] {
            assert!(read_event(event, None).is_none(), "{event}");
        }
    }

    #[test]
    fn an_event_gives_its_text_tool_use_and_usage() {
        let mut seen = Seen::default();
        assert_eq!(inspect(Some("message_start"), EVENTS[0], &mut seen, 100), Kind::Start);
        assert_eq!(inspect(Some("content_block_delta"), EVENTS[2], &mut seen, 100), Kind::Content);
        assert_eq!(seen.text, "line\nwith \"quotes\" é 漢字");
        assert!(!seen.tool_call);
        assert_eq!(inspect(Some("content_block_start"), EVENTS[3], &mut seen, 100), Kind::BlockStart);
        assert!(seen.tool_call);
        assert_eq!(inspect(None, EVENTS[5], &mut seen, 100), Kind::Content);
        assert_eq!((seen.usage.input, seen.usage.output), (Some(10), Some(2)));
        assert_eq!(inspect(Some("ping"), EVENTS[6], &mut seen, 100), Kind::KeepAlive);
        assert_eq!(inspect(None, EVENTS[7], &mut seen, 100), Kind::Error);
        // The `\u` escape goes to serde_json and is still read.
        let mut seen = Seen::default();
        inspect(None, r#"{"type":"content_block_delta","delta":{"text":"\u00e9"}}"#, &mut seen, 100);
        assert_eq!(seen.text, "é");
    }
}
