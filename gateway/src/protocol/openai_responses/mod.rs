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
use super::events::{Kind, Seen, Text, TextSink, sse_event};
use super::openai_chat;

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
    let event = serde_json::from_str::<Event<'_>>(data).ok();
    let kind = event.as_ref().map(|e| e.kind.clone()).or_else(|| name.map(Cow::Borrowed));
    let Some(kind) = kind else { return Kind::Content };
    let Some(event) = event else {
        return if kind == "error" { Kind::Error } else { Kind::Content };
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
                seen.usage.input = u.input_tokens.or(seen.usage.input);
                seen.usage.output = u.output_tokens.or(seen.usage.output);
            }
            Kind::Done
        }
        "response.output_text.delta" => {
            if let Some(delta) = &event.delta {
                TextSink { text: &mut seen.text, cap: text_cap }.push(delta);
            }
            Kind::Content
        }
        "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
            seen.tool_call = true;
            Kind::Content
        }
        "response.output_item.added" => {
            if event.item.as_ref().is_some_and(|i| i.kind.ends_with("call")) {
                seen.tool_call = true;
            }
            Kind::Content
        }
        _ => Kind::Content,
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

#[derive(Deserialize)]
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
struct EventResponse<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(default)]
    usage: Option<ResponseUsage>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ResponseUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
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
