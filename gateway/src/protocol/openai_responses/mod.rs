//! The OpenAI Responses API (`POST /v1/responses`), which Codex and the
//! newer SDK helpers speak.
//!
//! Stream grammar: `response.created` / `response.in_progress` /
//! `response.queued` open the answer without content (held back by the
//! handshake, so a `response.failed` right after them is a failed attempt
//! the client never sees); `response.output_item.added`, text and
//! argument deltas, reasoning and the rest carry the answer;
//! `response.completed` and `response.incomplete` are terminal;
//! `response.failed` and `error` are failures. HTTP errors have the
//! OpenAI shape ([`super::openai_chat::error_body`]).
//!
//! A non-stream answer is a response object whose `status` may be
//! `failed` under HTTP 200: [`read_answer`] finds that, so it is
//! classified and retried like the error status it stands for.

pub mod turn;

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::ErrorKind;
use super::events::{Hole, HoleKind, Kind, Seen, Text, TextSink, sse_event, unreadable};
use super::openai_chat;
use super::walk::{Walk, once};

/// HTTP errors: the OpenAI shape.
pub fn error_body(kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
    openai_chat::error_body(kind, message, code)
}

/// The `code` a Responses error carries for a tidegate error kind (the
/// codes OpenAI uses, so clients that branch on them — Codex does —
/// treat tidegate's failure like the provider's).
fn code(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::RateLimit => "rate_limit_exceeded",
        // Not `server_is_overloaded`: Codex answers that one with "Selected
        // model is at capacity. Please try a different model." and stops.
        ErrorKind::Api | ErrorKind::Timeout | ErrorKind::Overloaded => "server_error",
        ErrorKind::InvalidRequest | ErrorKind::TooLarge => "invalid_request_error",
        ErrorKind::Authentication => "invalid_api_key",
        ErrorKind::Permission => "permission_denied",
        ErrorKind::NotFound => "not_found",
    }
}

/// A mid-stream failure, told twice in the protocol's own words:
/// `response.failed` (the terminal event Codex reads, never a
/// `response.completed`), then `error` carrying an `error` object (the
/// OpenAI SDKs raise on it).
pub fn error_event(kind: ErrorKind, message: &str) -> Bytes {
    error_event_coded(kind, code(kind), message)
}

/// [`error_event`] with a chosen `code`: Codex stops on some codes and
/// retries the rest (see [`crate::client`]).
pub fn error_event_coded(kind: ErrorKind, code: &str, message: &str) -> Bytes {
    let failed = json!({"type": "response.failed", "response": {
        "id": "resp_tidegate", "object": "response", "status": "failed", "output": [],
        "error": {"code": code, "message": message}}});
    let error = json!({"type": "error", "code": code, "message": message, "param": null,
        "error": openai_chat::error_object(kind, message, Some(code))});
    let (failed, error) = (failed.to_string(), error.to_string());
    [sse_event(Some("response.failed"), failed.as_bytes()), sse_event(Some("error"), error.as_bytes())].concat().into()
}

/// What one Responses stream event is.
pub fn inspect(name: Option<&str>, data: &str, seen: &mut Seen, text_cap: usize) -> Kind {
    // The walker reads a usual event; serde_json whatever it gives up on.
    let walked = read_event(data, Some(seen.holes.start()));
    let whole = walked.is_some();
    let event = walked.or_else(|| serde_json::from_str::<Event<'_>>(data).ok());
    let kind = event.as_ref().map(|e| e.kind.clone()).or_else(|| name.map(Cow::Borrowed));
    let Some(kind) = kind else {
        return if unreadable(data) { Kind::Unreadable } else { Kind::Content };
    };
    let Some(event) = event else {
        return match kind.as_ref() {
            "error" => Kind::Error,
            _ if unreadable(data) => Kind::Unreadable,
            _ => Kind::Content,
        };
    };
    match kind.as_ref() {
        "response.created" | "response.in_progress" | "response.queued" => {
            if seen.response_id.is_none() {
                seen.response_id = event.response.as_ref().and_then(|r| r.id.as_deref()).map(str::to_owned);
            }
            Kind::Start
        }
        "response.failed" | "error" => Kind::Error,
        "response.completed" | "response.incomplete" => {
            if let Some(u) = event.response.as_ref().and_then(|r| r.usage.as_ref()) {
                let cached = u.input_tokens_details.as_ref().and_then(|d| d.cached_tokens);
                let reasoning = u.output_tokens_details.as_ref().and_then(|d| d.reasoning_tokens);
                seen.usage.take_openai(u.input_tokens, u.output_tokens, cached, reasoning);
            }
            Kind::Done
        }
        "response.output_text.delta" => {
            if let Some(delta) = &event.delta {
                TextSink { text: &mut seen.text, cap: text_cap }.push(delta);
            }
            // The delta is the text (a `response` here would be read too).
            if whole && event.response.is_none() {
                seen.holes.read_as(HoleKind::Text);
            }
            Kind::Content
        }
        other => {
            match other {
                "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                    seen.tool_call = true;
                }
                "response.output_item.added" if event.item.as_ref().is_some_and(|i| i.kind.ends_with("call")) => {
                    seen.tool_call = true;
                }
                _ => {}
            }
            // Nothing read as text (a delta, an id) is used by these.
            if whole {
                seen.holes.read_as(HoleKind::Skipped);
            }
            Kind::Content
        }
    }
}

/// What a non-stream answer (a response object) says, read in one pass:
/// its id (the stored state) and, when its `status` is `failed`, its error
/// object, to be classified like an error answer. `incomplete` (cut by
/// `max_output_tokens`) and `completed` are answers; a body that is not a
/// response object says nothing.
pub fn read_answer(body: &[u8]) -> super::ReadAnswer {
    let Ok(head) = serde_json::from_slice::<Answer<'_>>(body) else { return super::ReadAnswer::default() };
    let failed = (head.status.as_deref() == Some("failed")).then(|| {
        let error = head.error.map_or("{}", RawValue::get);
        Bytes::from(format!(r#"{{"error":{error}}}"#))
    });
    super::ReadAnswer { id: head.id.map(|id| id.0.into_owned()), failed }
}

/// Responses cannot be continued from partial text as a new turn the way
/// chat messages can: a broken Responses stream fails honestly instead.
pub fn continuation_body(_original: &[u8], _partial: &str, _model: &str) -> Option<Bytes> {
    None
}

/// An event as [`Walk`] reads it: the same [`Event`] serde_json would
/// give, or `None` where it leaves the event to serde_json (see
/// [`super::walk`]). A `response` object (at the start and the end) is
/// walked for its `id` and `usage`, the rest of it skipped.
fn read_event<'a>(data: &'a str, holes: Option<&mut Vec<Hole>>) -> Option<Event<'a>> {
    let (mut kind, mut delta, mut response, mut item) = (None, None, None, None);
    let mut w = Walk::recording(data, holes);
    w.object(|w, key| match key {
        b"type" => once(&mut kind, w.string()),
        b"delta" => once(&mut delta, w.text()),
        b"response" => once(&mut response, if w.null() { Some(None) } else { read_response(w).map(Some) }),
        b"item" => once(&mut item, w.typed().map(|kind| kind.map(|kind| Item { kind }))),
        _ => w.skip(),
    })?;
    w.end()?;
    Some(Event { kind: kind?, delta: delta.flatten(), response: response.flatten(), item: item.flatten() })
}

fn read_response<'a>(w: &mut Walk<'a, '_>) -> Option<EventResponse<'a>> {
    if !w.at_object() {
        return None;
    }
    let (mut id, mut usage) = (None, None);
    w.object(|w, key| match key {
        b"id" => once(&mut id, w.text()),
        b"usage" => once(&mut usage, w.part::<ResponseUsage>()),
        _ => w.skip(),
    })?;
    Some(EventResponse { id: id.flatten(), usage: usage.flatten() })
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    delta: Option<Text<'a>>,
    #[serde(borrow, default)]
    response: Option<EventResponse<'a>>,
    #[serde(borrow, default)]
    item: Option<Item<'a>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct EventResponse<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(default)]
    usage: Option<ResponseUsage>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Item<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct ResponseUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<super::openai_chat::turn::CachedIn>,
    #[serde(default)]
    output_tokens_details: Option<super::openai_chat::turn::ReasoningIn>,
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(borrow, default)]
    status: Option<Text<'a>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events as the Responses API streams them (what Codex reads), and odd ones.
    const EVENTS: &[&str] = &[
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1733000000,"status":"in_progress","model":"m","output":[],"parallel_tool_calls":true,"tools":[],"usage":null,"metadata":{}}}"#,
        r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}"#,
        r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"line\nwith \"quotes\" é","logprobs":[]}"#,
        r#"{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":""}}"#,
        r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{\"cmd\":"}"#,
        r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi","annotations":[]}]}],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}}}"#,
        r#"{"type":"error","code":"rate_limit_exceeded","message":"busy","param":null}"#,
        r#" { "type" : "response.in_progress" , "response" : { "id" : null , "usage" : null } , "item" : null , "delta" : null } "#,
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
        for event in [
            r#"{"type":"response.output_text.delta","delta":"a","delta":"b"}"#,
            r#"{"type":"response.output_item.added","item":{"id":"x"}}"#,
            r#"{"type":"response.output_text.delta","delta":"\u00e9"}"#,
        ] {
            assert!(read_event(event, None).is_none(), "{event}");
        }
    }

    #[test]
    fn an_event_gives_its_id_text_tool_call_and_usage() {
        let mut seen = Seen::default();
        assert_eq!(inspect(None, EVENTS[0], &mut seen, 100), Kind::Start);
        assert_eq!(seen.response_id.as_deref(), Some("resp_1"));
        assert_eq!(inspect(None, EVENTS[1], &mut seen, 100), Kind::Content);
        assert!(!seen.tool_call);
        assert_eq!(inspect(None, EVENTS[2], &mut seen, 100), Kind::Content);
        assert_eq!(seen.text, "line\nwith \"quotes\" é");
        assert_eq!(inspect(None, EVENTS[3], &mut seen, 100), Kind::Content);
        assert!(seen.tool_call);
        assert_eq!(inspect(None, EVENTS[5], &mut seen, 100), Kind::Done);
        assert_eq!((seen.usage.input, seen.usage.output), (Some(12), Some(3)));
        assert_eq!(inspect(Some("error"), EVENTS[6], &mut seen, 100), Kind::Error);
    }
}
