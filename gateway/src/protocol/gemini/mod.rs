//! The Gemini API (`POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent?alt=sse`, `:countTokens`, `:embedContent`):
//! the model is named in the path, not the body; errors are Google RPC
//! statuses (`{"error":{"code","message","status","details"}}`) whose
//! `RetryInfo` tells a client when to come back; the stream is `data:`
//! chunks of the same `GenerateContentResponse` shape, with no terminal
//! event: a candidate's `finishReason` ends the answer.

pub mod array;
pub mod turn;

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};

use super::events::{Kind, Seen, Text, TextSink, sse_event, unreadable};
use super::{Endpoint, ErrorKind, PeekError, RequestHead};

/// The `@type` of a detail saying when to retry.
pub const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
/// The `@type` of a detail naming the quota that ran out.
pub const QUOTA_FAILURE: &str = "type.googleapis.com/google.rpc.QuotaFailure";
/// The `@type` of a detail with a machine-readable reason.
pub const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The Google RPC status name of an error kind.
fn status_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::TooLarge => "INVALID_ARGUMENT",
        ErrorKind::Authentication => "UNAUTHENTICATED",
        ErrorKind::Permission => "PERMISSION_DENIED",
        ErrorKind::NotFound => "NOT_FOUND",
        ErrorKind::RateLimit => "RESOURCE_EXHAUSTED",
        ErrorKind::Api => "INTERNAL",
        ErrorKind::Overloaded => "UNAVAILABLE",
        ErrorKind::Timeout => "DEADLINE_EXCEEDED",
    }
}

/// The HTTP status Google answers an error kind with.
fn code_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidRequest => 400,
        ErrorKind::Authentication => 401,
        ErrorKind::Permission => 403,
        ErrorKind::NotFound => 404,
        ErrorKind::TooLarge => 413,
        ErrorKind::RateLimit => 429,
        ErrorKind::Api => 500,
        ErrorKind::Overloaded => 503,
        ErrorKind::Timeout => 504,
    }
}

/// `{"error":{"code","message","status"}}` (no details): the shape the
/// Google SDKs raise as `APIError`.
pub fn error_body(kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
    answer_error(code_of(kind), kind, message, code, None)
}

/// tidegate's own error as Google answers it: `code` (the HTTP status),
/// `status`, the message, an `ErrorInfo` with tidegate's `reason`, and,
/// when coming back later helps, a `RetryInfo` with the wait: Gemini CLI
/// and the SDKs read when to retry from the body, not from `Retry-After`.
pub fn answer_error(
    status: u16,
    kind: ErrorKind,
    message: &str,
    reason: Option<&str>,
    retry: Option<Duration>,
) -> Bytes {
    let mut details = Vec::new();
    if let Some(reason) = reason {
        details.push(json!({"@type": ERROR_INFO, "reason": reason, "domain": "tidegate"}));
    }
    if let Some(wait) = retry {
        // Whole seconds, rounded up, as Google writes them ("31s").
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        details.push(json!({"@type": RETRY_INFO, "retryDelay": format!("{}s", secs.max(1))}));
    }
    let mut error = json!({"code": status, "message": message, "status": status_name(kind)});
    if !details.is_empty() {
        error["details"] = Value::Array(details);
    }
    Bytes::from(json!({ "error": error }).to_string())
}

/// A mid-stream failure: a last `data: {"error":...}` chunk, which the
/// Google SDKs raise on.
pub fn error_event(kind: ErrorKind, message: &str) -> Bytes {
    sse_event(None, &error_body(kind, message, None))
}

/// `GET /v1beta/models` in Google's shape: every alias as a model that
/// generates content.
pub fn models_list<'a>(aliases: impl Iterator<Item = &'a str>) -> Bytes {
    let models: Vec<Value> = aliases.map(model_entry).collect();
    Bytes::from(json!({ "models": models }).to_string())
}

/// One model of the list (also `GET /v1beta/models/{model}`).
pub fn model_entry(alias: &str) -> Value {
    json!({
        "name": format!("models/{alias}"),
        "displayName": alias,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    })
}

/// A Gemini model path, `/v1beta/models/{model}:{method}` (or `/v1/…`):
/// the endpoint and the model (percent-decoded); `None` for any other
/// path.
pub fn parse_path(path: &str) -> Option<(Endpoint, String)> {
    let (endpoint, model) = split_path(path)?;
    let model = percent_encoding::percent_decode_str(model).decode_utf8().ok()?;
    if model.is_empty() || model.contains('/') {
        return None;
    }
    Some((endpoint, model.into_owned()))
}

/// The endpoint a Gemini model path names, and its model as written
/// (still percent-encoded): what the front service needs to route it,
/// without decoding the model (the handler does, once).
pub fn split_path(path: &str) -> Option<(Endpoint, &str)> {
    let rest = path.strip_prefix("/v1beta/models/").or_else(|| path.strip_prefix("/v1/models/"))?;
    let (model, method) = rest.rsplit_once(':')?;
    let endpoint = match method {
        "generateContent" => Endpoint::GenerateContent,
        "streamGenerateContent" => Endpoint::StreamGenerateContent,
        "countTokens" => Endpoint::GeminiCountTokens,
        "embedContent" => Endpoint::EmbedContent,
        _ => return None,
    };
    Some((endpoint, model))
}

/// Whether a Gemini stream request asked for SSE (`alt=sse`); without it
/// Google streams one JSON array ([`array::JsonArray`]).
pub fn wants_sse(query: Option<&str>) -> bool {
    query.is_some_and(|q| url::form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "alt" && v == "sse"))
}

/// The path of `endpoint` for `model` on a Gemini upstream, after its
/// version prefix (`/v1beta` on Google AI Studio, a project's publisher
/// path on Vertex); a stream asks for SSE (`alt=sse`).
pub fn upstream_path(endpoint: Endpoint, model: &str, stream: bool) -> String {
    let model = percent_encoding::utf8_percent_encode(model, super::PATH_LABEL);
    let method = match endpoint {
        Endpoint::GeminiCountTokens => "countTokens",
        Endpoint::EmbedContent => "embedContent",
        _ if stream => "streamGenerateContent?alt=sse",
        _ => "generateContent",
    };
    format!("/models/{model}:{method}")
}

#[derive(Deserialize)]
struct Peek {
    #[serde(default, rename = "generationConfig")]
    generation_config: Option<PeekConfig>,
}

#[derive(Deserialize)]
struct PeekConfig {
    #[serde(default, rename = "maxOutputTokens")]
    max_output_tokens: Option<u64>,
}

/// What tidegate needs of a Gemini request: the model (from the path),
/// whether it streams (the method), `maxOutputTokens`; the body must be a
/// JSON object. It carries no model, so nothing is spliced into it.
pub fn peek(body: &[u8], model: &str, stream: bool) -> Result<RequestHead, PeekError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(PeekError::Malformed("expected an object".into()));
    }
    let peek: Peek = serde_json::from_slice(body).map_err(|e| PeekError::Malformed(e.to_string()))?;
    Ok(RequestHead {
        model: model.to_owned(),
        model_span: 0..0,
        stream,
        max_tokens: peek.generation_config.and_then(|c| c.max_output_tokens),
        previous_response_id: None,
        store: None,
    })
}

/// Finish reasons that say the model failed rather than answered
/// (Gemini CLI retries them): before any content, such a candidate is a
/// failed attempt, retried before the client sees a byte.
pub fn failed_finish(reason: &str) -> bool {
    matches!(reason, "MALFORMED_FUNCTION_CALL" | "OTHER" | "FINISH_REASON_UNSPECIFIED" | "UNEXPECTED_TOOL_CALL")
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default)]
    candidates: Vec<Candidate<'a>>,
    #[serde(default, rename = "usageMetadata")]
    usage: Option<UsageIn>,
    #[serde(default, rename = "promptFeedback")]
    prompt_feedback: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Candidate<'a> {
    #[serde(borrow, default)]
    content: Option<ContentIn<'a>>,
    #[serde(borrow, default, rename = "finishReason")]
    finish_reason: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct ContentIn<'a> {
    #[serde(borrow, default)]
    parts: Vec<PartIn<'a>>,
}

#[derive(Deserialize)]
struct PartIn<'a> {
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(default, rename = "functionCall")]
    function_call: Option<IgnoredAny>,
}

/// `usageMetadata`, as the journal counts it.
#[derive(Deserialize)]
pub(crate) struct UsageIn {
    #[serde(default, rename = "promptTokenCount")]
    pub prompt: Option<u64>,
    #[serde(default, rename = "candidatesTokenCount")]
    pub candidates: Option<u64>,
    #[serde(default, rename = "thoughtsTokenCount")]
    pub thoughts: Option<u64>,
    #[serde(default, rename = "cachedContentTokenCount")]
    pub cached: Option<u64>,
}

/// What one Gemini stream chunk is: an `error` object fails; a candidate
/// with text or a function call is content (a finish reason ends the
/// answer; one of the [failed](failed_finish) kinds before any content is
/// an error); a chunk with neither opens the answer only.
pub fn inspect(_name: Option<&str>, data: &str, seen: &mut Seen, text_cap: usize) -> Kind {
    let Ok(chunk) = serde_json::from_str::<Chunk<'_>>(data) else {
        return if unreadable(data) { Kind::Unreadable } else { Kind::Content };
    };
    if chunk.error.is_some() {
        return Kind::Error;
    }
    if let Some(u) = &chunk.usage {
        seen.usage.take_gemini(u.prompt, u.candidates, u.thoughts, u.cached);
    }
    let mut carried = false;
    let mut text = TextSink { text: &mut seen.text, cap: text_cap };
    for candidate in &chunk.candidates {
        for part in candidate.content.iter().flat_map(|c| &c.parts) {
            if part.function_call.is_some() {
                seen.tool_call = true;
                carried = true;
            }
            if let Some(t) = &part.text {
                if part.thought != Some(true) {
                    text.push(t);
                }
                carried = true;
            }
        }
    }
    let finish = chunk.candidates.iter().find_map(|c| c.finish_reason.as_deref());
    match finish {
        Some(reason) if failed_finish(reason) && !carried && !seen.content => Kind::Error,
        Some(_) => {
            seen.complete = true;
            Kind::Content
        }
        // A prompt blocked before any candidate: that is the answer.
        None if chunk.candidates.is_empty() && chunk.prompt_feedback.is_some() => {
            seen.complete = true;
            Kind::Content
        }
        None if carried => Kind::Content,
        None => Kind::Start,
    }
}

/// The HTTP status a Google error object stands for (`code`, else its
/// `status` name); 200 when it names none.
pub fn status_of(error: &Value) -> Option<u16> {
    if let Some(code) = error.get("code").and_then(Value::as_u64).filter(|c| (400..=599).contains(c)) {
        return Some(code as u16);
    }
    Some(match error.get("status").and_then(Value::as_str)? {
        "RESOURCE_EXHAUSTED" => 429,
        "UNAVAILABLE" => 503,
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => 400,
        "UNAUTHENTICATED" => 401,
        "PERMISSION_DENIED" => 403,
        "NOT_FOUND" => 404,
        "DEADLINE_EXCEEDED" => 504,
        "INTERNAL" | "UNKNOWN" => 500,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_method_and_model() {
        assert_eq!(
            parse_path("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some((Endpoint::StreamGenerateContent, "gemini-2.5-pro".into()))
        );
        assert_eq!(parse_path("/v1/models/a%20b:countTokens"), Some((Endpoint::GeminiCountTokens, "a b".into())));
        assert_eq!(parse_path("/v1beta/models/x:predict"), None);
        assert_eq!(parse_path("/v1beta/models/:generateContent"), None);
        assert_eq!(parse_path("/v1/chat/completions"), None);
        assert_eq!(upstream_path(Endpoint::GenerateContent, "g", true), "/models/g:streamGenerateContent?alt=sse");
        assert_eq!(upstream_path(Endpoint::GenerateContent, "a/b", false), "/models/a%2Fb:generateContent");
    }

    #[test]
    fn errors_carry_retry_info() {
        let body =
            answer_error(429, ErrorKind::RateLimit, "busy", Some("queue_full"), Some(Duration::from_millis(1500)));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], 429);
        assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(v["error"]["details"][1]["retryDelay"], "2s");
        assert_eq!(v["error"]["details"][0]["reason"], "queue_full");
        let plain: Value = serde_json::from_slice(&error_body(ErrorKind::NotFound, "no", None)).unwrap();
        assert!(plain["error"].get("details").is_none());
    }

    #[test]
    fn stream_chunks_are_read() {
        let mut seen = Seen::default();
        let start = r#"{"candidates":[{"content":{"role":"model","parts":[]}}]}"#;
        assert_eq!(inspect(None, start, &mut seen, 100), Kind::Start);
        let failed = r#"{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL"}]}"#;
        assert_eq!(inspect(None, failed, &mut seen, 100), Kind::Error);
        let text = r#"{"candidates":[{"content":{"parts":[{"text":"hi","thought":true},{"text":"yo"}]}}]}"#;
        assert_eq!(inspect(None, text, &mut seen, 100), Kind::Content);
        assert_eq!(seen.text, "yo");
        let end = r#"{"candidates":[{"content":{"parts":[{"text":"!"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":3,"thoughtsTokenCount":2}}"#;
        assert_eq!(inspect(None, end, &mut seen, 100), Kind::Content);
        assert!(seen.complete);
        assert_eq!((seen.usage.input, seen.usage.output), (Some(7), Some(5)));
        assert_eq!(inspect(None, r#"{"error":{"code":503}}"#, &mut Seen::default(), 10), Kind::Error);
    }
}
