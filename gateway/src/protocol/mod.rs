//! The wire protocols tidegate speaks, one module each, reduced to what
//! tidegate reads.
//!
//! A protocol module owns everything specific to its format: the error
//! shapes (tidegate's own and how an upstream's error event maps to a
//! status), the stream's event grammar (which events open the answer,
//! carry it, end it or fail it, and where usage sits), how a mid-stream
//! failure is told to the client, and how a broken answer is continued.
//! The relay and the stream body ask through [`Protocol`]'s methods and
//! never match on a protocol's strings themselves; adding a protocol is a
//! module, a variant here and a route.
//!
//! tidegate never re-serialises a request: [`peek`] reads `model`,
//! `stream` and a few routing fields from the raw bytes and, when a
//! target renames the model, [`body_for_target`] splices the new value
//! into the same bytes. Field order, unknown fields, tools and images
//! reach the upstream exactly as the client sent them.

pub mod anthropic;
pub mod bounds;
pub mod events;
pub mod gemini;
pub mod head;
pub mod json;
pub mod openai_chat;
pub mod openai_responses;
pub mod refusal;
pub mod stream_turn;
pub mod turn;
pub mod walk;

use std::fmt;

use bytes::Bytes;

use events::{Kind, Seen};
pub use head::{PeekError, RequestHead, body_for_target, peek};

/// Characters a URL path segment built from a name (a model id, ARN or
/// deployment) keeps as they are: RFC 3986's unreserved ones.
pub const PATH_LABEL: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// What an upstream speaks (an upstream's `protocol:` in the config): the
/// family decides its auth header and which endpoints it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// OpenAI-compatible: chat completions, Responses, embeddings.
    OpenAi,
    /// OpenAI-compatible without the Responses API (`openai-chat`): chat
    /// completions and embeddings; Responses requests reach it translated.
    OpenAiChat,
    /// Anthropic: messages and count_tokens.
    Anthropic,
    /// Google's Gemini API: generateContent (and its stream),
    /// countTokens, embedContent.
    Gemini,
}

impl Family {
    /// Its name in config and in traces (`gen_ai.provider.name`).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::OpenAi => "openai",
            Family::OpenAiChat => "openai-chat",
            Family::Anthropic => "anthropic",
            Family::Gemini => "gemini",
        }
    }

    /// Whether an upstream of this family serves `endpoint` in its own
    /// protocol.
    pub fn serves(self, endpoint: Endpoint) -> bool {
        match self {
            Family::OpenAi => {
                matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Embeddings)
            }
            Family::OpenAiChat => matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Embeddings),
            Family::Anthropic => matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens),
            Family::Gemini => endpoint.protocol() == Protocol::Gemini,
        }
    }

    /// Whether its key goes in `Authorization: Bearer` (else its own
    /// header: `x-api-key`, `x-goog-api-key`).
    pub fn bearer(self) -> bool {
        !matches!(self, Family::Anthropic | Family::Gemini)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a request reaches a target (see `UpstreamConfig::way`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// In the client's own protocol: its bytes, as they are.
    Native,
    /// Translated to this protocol ([`crate::translate`]).
    Translate(Protocol),
}

/// A client-facing wire protocol: error shapes and stream grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OpenAI chat completions (and embeddings, which share its errors).
    OpenAiChat,
    /// The OpenAI Responses API.
    OpenAiResponses,
    /// Anthropic messages.
    Anthropic,
    /// The Gemini API.
    Gemini,
}

impl Protocol {
    /// The upstream family that serves this protocol.
    pub fn family(self) -> Family {
        match self {
            Protocol::OpenAiChat | Protocol::OpenAiResponses => Family::OpenAi,
            Protocol::Anthropic => Family::Anthropic,
            Protocol::Gemini => Family::Gemini,
        }
    }

    /// Its name in the journal, headers and `tidegate check`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::OpenAiChat => "openai-chat",
            Protocol::OpenAiResponses => "openai-responses",
            Protocol::Anthropic => "anthropic",
            Protocol::Gemini => "gemini",
        }
    }

    /// The protocol named `name` (see [`Protocol::name`]).
    pub fn parse(name: &str) -> Option<Protocol> {
        [Protocol::OpenAiChat, Protocol::OpenAiResponses, Protocol::Anthropic, Protocol::Gemini]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// The endpoint a translated request of this protocol is sent to.
    pub fn endpoint(self) -> Endpoint {
        match self {
            Protocol::OpenAiChat => Endpoint::ChatCompletions,
            Protocol::OpenAiResponses => Endpoint::Responses,
            Protocol::Anthropic => Endpoint::Messages,
            Protocol::Gemini => Endpoint::GenerateContent,
        }
    }

    /// tidegate's own error answer in this protocol's shape.
    pub fn error_body(self, kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
        match self {
            Protocol::OpenAiChat => openai_chat::error_body(kind, message, code),
            Protocol::OpenAiResponses => openai_responses::error_body(kind, message, code),
            Protocol::Anthropic => anthropic::error_body(kind, message),
            Protocol::Gemini => gemini::error_body(kind, message, code),
        }
    }

    /// A failure after the stream was committed, as this protocol's
    /// error event(s): what the client's SDK raises on.
    pub fn error_event(self, kind: ErrorKind, message: &str) -> Bytes {
        match self {
            Protocol::OpenAiChat => openai_chat::error_event(kind, message),
            Protocol::OpenAiResponses => openai_responses::error_event(kind, message),
            Protocol::Anthropic => anthropic::error_event(kind, message),
            Protocol::Gemini => gemini::error_event(kind, message),
        }
    }

    /// What one complete SSE event is (`name`: its `event:` field;
    /// `data`: its joined `data:` lines), noting text, usage and tool
    /// calls in `seen`.
    pub fn inspect(self, name: Option<&str>, data: &str, seen: &mut Seen, text_cap: usize) -> Kind {
        match self {
            Protocol::OpenAiChat => openai_chat::inspect(name, data, seen, text_cap),
            Protocol::OpenAiResponses => openai_responses::inspect(name, data, seen, text_cap),
            Protocol::Anthropic => anthropic::inspect(name, data, seen, text_cap),
            Protocol::Gemini => gemini::inspect(name, data, seen, text_cap),
        }
    }

    /// The request that continues a broken text answer from `partial`
    /// (`stream_resume`); `None` when this protocol or body cannot be
    /// continued.
    pub fn continuation_body(self, original: &[u8], partial: &str, model: &str) -> Option<Bytes> {
        match self {
            Protocol::OpenAiChat => openai_chat::continuation_body(original, partial, model),
            Protocol::OpenAiResponses => openai_responses::continuation_body(original, partial, model),
            Protocol::Anthropic => anthropic::continuation_body(original, partial, model),
            // The model is in the path; a continuation is not built.
            Protocol::Gemini => None,
        }
    }

    /// Whether its clients read SSE comments as keep-alives (Google's SDKs
    /// parse every line as JSON and fail on one): only then may a waiting
    /// stream be committed early with comments (`stream_keepalive_after`).
    pub fn keeps_alive_with_comments(self) -> bool {
        !matches!(self, Protocol::Gemini)
    }

    /// Whether a 2xx JSON answer must be read whole before it is relayed
    /// (to find a failure under 200, or the id state is pinned to).
    pub fn reads_json_answers(self) -> bool {
        match self {
            Protocol::OpenAiResponses => true,
            Protocol::OpenAiChat | Protocol::Anthropic | Protocol::Gemini => false,
        }
    }

    /// What a 2xx JSON answer read whole says (see [`ReadAnswer`]); only
    /// protocols that [read them](Protocol::reads_json_answers) say anything.
    pub fn read_answer(self, body: &[u8]) -> ReadAnswer {
        match self {
            Protocol::OpenAiResponses => openai_responses::read_answer(body),
            Protocol::OpenAiChat | Protocol::Anthropic | Protocol::Gemini => ReadAnswer::default(),
        }
    }
}

/// A 2xx JSON answer, read once: the id of the state it stored, and the
/// error it carries if it is really a failure (a Responses object with
/// `status: failed`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReadAnswer {
    /// The stored response's id.
    pub id: Option<String>,
    /// The error object of a failed answer, as `{"error":...}`.
    pub failed: Option<Bytes>,
}

/// A client endpoint tidegate serves: its path, the path appended to an
/// upstream's `base_url`, and the protocol its answers are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `POST /v1beta/models/{model}:generateContent`.
    GenerateContent,
    /// `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`.
    StreamGenerateContent,
    /// `POST /v1beta/models/{model}:countTokens`.
    GeminiCountTokens,
    /// `POST /v1beta/models/{model}:embedContent`.
    EmbedContent,
}

impl Endpoint {
    /// Every endpoint.
    pub const ALL: [Endpoint; 9] = [
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Embeddings,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::GenerateContent,
        Endpoint::StreamGenerateContent,
        Endpoint::GeminiCountTokens,
        Endpoint::EmbedContent,
    ];

    /// The endpoints at a fixed path (the Gemini ones name the model in
    /// theirs: [`gemini::parse_path`]).
    pub const FIXED: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Embeddings,
        Endpoint::Messages,
        Endpoint::CountTokens,
    ];

    /// The client-facing path (for Gemini's, its pattern).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::GenerateContent => "/v1beta/models/{model}:generateContent",
            Endpoint::StreamGenerateContent => "/v1beta/models/{model}:streamGenerateContent",
            Endpoint::GeminiCountTokens => "/v1beta/models/{model}:countTokens",
            Endpoint::EmbedContent => "/v1beta/models/{model}:embedContent",
        }
    }

    /// Path appended to an upstream's `base_url` (each as its official SDK
    /// takes it: OpenAI's includes `/v1`, Anthropic's does not); Gemini's
    /// are built per request ([`gemini::upstream_path`]).
    pub fn upstream_path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Responses => "/responses",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::GenerateContent
            | Endpoint::StreamGenerateContent
            | Endpoint::GeminiCountTokens
            | Endpoint::EmbedContent => "",
        }
    }

    /// The protocol of its answers and errors.
    pub fn protocol(self) -> Protocol {
        match self {
            Endpoint::ChatCompletions | Endpoint::Embeddings => Protocol::OpenAiChat,
            Endpoint::Responses => Protocol::OpenAiResponses,
            Endpoint::Messages | Endpoint::CountTokens => Protocol::Anthropic,
            Endpoint::GenerateContent
            | Endpoint::StreamGenerateContent
            | Endpoint::GeminiCountTokens
            | Endpoint::EmbedContent => Protocol::Gemini,
        }
    }

    /// Whether a request to it may be translated for a target of another
    /// protocol (a conversation turn; embeddings and token counts are not).
    pub fn translatable(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions
                | Endpoint::Responses
                | Endpoint::Messages
                | Endpoint::GenerateContent
                | Endpoint::StreamGenerateContent
        )
    }

    /// Whether it counts a request's tokens (answered with an estimate
    /// when no target of its protocol can count them).
    pub fn counts_tokens(self) -> bool {
        matches!(self, Endpoint::CountTokens | Endpoint::GeminiCountTokens)
    }

    /// Whether its requests spend the upstream's token budget (`tpm`):
    /// counting tokens does not generate any.
    pub fn spends_tokens(self) -> bool {
        match self {
            Endpoint::ChatCompletions
            | Endpoint::Responses
            | Endpoint::Embeddings
            | Endpoint::Messages
            | Endpoint::GenerateContent
            | Endpoint::StreamGenerateContent
            | Endpoint::EmbedContent => true,
            Endpoint::CountTokens | Endpoint::GeminiCountTokens => false,
        }
    }

    /// `gen_ai.operation.name` of its requests (OpenTelemetry GenAI
    /// conventions; token counting has no name there).
    pub fn operation(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions
            | Endpoint::Responses
            | Endpoint::Messages
            | Endpoint::GenerateContent
            | Endpoint::StreamGenerateContent => "chat",
            Endpoint::Embeddings | Endpoint::EmbedContent => "embeddings",
            Endpoint::CountTokens | Endpoint::GeminiCountTokens => "count_tokens",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

/// Error categories tidegate itself answers with, mapped to each
/// protocol's type names by [`openai::error_body`] / [`anthropic::error_body`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad request body.
    InvalidRequest,
    /// Missing or wrong client key.
    Authentication,
    /// The key is valid but may not do this (a cloud's access denial).
    Permission,
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

/// The HTTP status an error event (or failed answer) stands for, so it
/// is classified like the non-200 answer it replaces: a numeric
/// `status`/`code` in the error object, else the error type or code the
/// protocols use, else 200 (then judged by its words). The error object is
/// found at `error`, `response.error` (Responses) or the top level.
pub fn error_status(data: &[u8]) -> u16 {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return 200 };
    let err = v.get("error").or_else(|| v.get("response").and_then(|r| r.get("error"))).unwrap_or(&v);
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
    let named = |key: &str| err.get(key).and_then(|t| t.as_str());
    named("type").into_iter().chain(named("code")).find_map(status_of_name).unwrap_or(200)
}

/// The error kind an upstream status stands for, so a translated error
/// keeps its class in the client's protocol (a rate limit stays a rate
/// limit error).
pub fn kind_of_status(status: u16) -> ErrorKind {
    match status {
        400 | 422 => ErrorKind::InvalidRequest,
        401 => ErrorKind::Authentication,
        402 | 403 => ErrorKind::Permission,
        404 => ErrorKind::NotFound,
        413 => ErrorKind::TooLarge,
        429 => ErrorKind::RateLimit,
        408 | 504 => ErrorKind::Timeout,
        503 | 529 => ErrorKind::Overloaded,
        _ => ErrorKind::Api,
    }
}

fn status_of_name(name: &str) -> Option<u16> {
    Some(match name {
        "overloaded_error" | "server_is_overloaded" | "overloaded" => 529,
        "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" => 429,
        "api_error" | "server_error" => 500,
        "invalid_request_error" | "context_length_exceeded" => 400,
        "authentication_error" | "invalid_api_key" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        _ => return None,
    })
}

/// The original body with `model` set for the target and `partial`
/// appended as the assistant's turn (merged into a trailing assistant
/// message if the client had one): how chat-style protocols continue a
/// broken answer.
fn append_assistant_turn(original: &[u8], partial: &str, model: &str) -> Option<Bytes> {
    use serde_json::Value;
    let mut v: Value = serde_json::from_slice(original).ok()?;
    let obj = v.as_object_mut()?;
    obj.insert("model".into(), Value::String(model.into()));
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
    fn error_events_map_to_statuses() {
        assert_eq!(error_status(br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#), 529);
        assert_eq!(error_status(br#"{"error":{"code":429,"message":"busy"}}"#), 429);
        assert_eq!(error_status(br#"{"error":{"code":"TM.00001041","message":"3 sessions"}}"#), 200);
        assert_eq!(error_status(br#"{"error":{"status":"503"}}"#), 503);
        assert_eq!(error_status(b"not json"), 200);
        // Responses: the error sits in `response.error`, named by its code.
        let failed = br#"{"type":"response.failed","response":{"status":"failed","error":{"code":"rate_limit_exceeded","message":"slow down"}}}"#;
        assert_eq!(error_status(failed), 429);
        assert_eq!(error_status(br#"{"error":{"code":"server_is_overloaded"}}"#), 529);
    }

    #[test]
    fn partial_answer_becomes_the_assistant_turn() {
        let body = br#"{"model":"alias","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let out = Protocol::Anthropic.continuation_body(body, "tok0 tok1 ", "real").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"real","max_tokens":50,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"tok0 tok1"}],"stream":true}"#
        );
        let prefilled =
            br#"{"model":"a","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure: "}]}"#;
        let out = Protocol::OpenAiChat.continuation_body(prefilled, "one two ", "a").unwrap();
        assert!(std::str::from_utf8(&out).unwrap().contains(r#"{"role":"assistant","content":"Sure: one two "}"#));
        assert!(Protocol::OpenAiChat.continuation_body(br#"{"model":"a"}"#, "x", "a").is_none());
        assert!(Protocol::OpenAiResponses.continuation_body(body, "x", "a").is_none(), "Responses are not continued");
    }
}
