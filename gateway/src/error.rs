//! Errors tidegate answers by itself, each mapped to a status and a
//! protocol-shaped body in one `match`.
//!
//! Upstream errors are not here: they are relayed verbatim. These are the
//! cases where tidegate is the one saying no (bad input, bad key, nothing to
//! route to) or where it could not get any answer from an upstream.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use std::time::Duration;

use crate::classify::Class;
use crate::client::{Advice, Client};
use crate::protocol::{ErrorKind, Protocol};

/// A failure answered by tidegate itself.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Body not JSON / missing model / model not a string.
    #[error("{0}")]
    BadRequest(String),
    /// Missing or unknown client key.
    #[error("missing or invalid API key for this gateway (send Authorization: Bearer <key> or x-api-key)")]
    Unauthorized,
    /// The alias is not configured for this endpoint.
    #[error("{0}")]
    UnknownModel(String),
    /// Body larger than `max_body`.
    #[error("request body is larger than this gateway's limit of {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// Endpoint that tidegate does not serve.
    #[error("no such endpoint: {0}")]
    NoRoute(String),
    /// Retrying stopped: capacity or transient failures outlasted the
    /// attempts, the budget or the deadline. The message says what was
    /// tried and what the provider said.
    #[error("{message}")]
    GaveUp {
        /// Status that tells the truth (429, 503, 502, 504).
        status: StatusCode,
        /// Protocol error kind.
        kind: ErrorKind,
        /// Class of the last failure.
        class: crate::classify::Class,
        /// The whole account.
        message: String,
        /// When coming back may help.
        retry_after: Option<std::time::Duration>,
        /// When the provider projects its limit to clear, if it said.
        reset: Option<jiff::Timestamp>,
        /// Tell a client told to stop not to retry (`x-should-retry:
        /// false`, `defaults.retry.stop_client_retries`).
        stop_client_retries: bool,
    },
    /// The upstream's queue is full: shed at once.
    #[error("upstream {upstream} is at its concurrency limit and its queue is full ({queued} waiting); retry after {}s", retry_after.as_secs().max(1))]
    QueueFull {
        /// Upstream name.
        upstream: String,
        /// Requests waiting.
        queued: usize,
        /// Estimated from the drain rate.
        retry_after: std::time::Duration,
    },
    /// The client key is over its own limits (lane full, or its rate
    /// would not allow the request before its deadline).
    #[error("{message}")]
    ClientLimit {
        /// What limit, and how full.
        message: String,
        /// When the key's lane will have room.
        retry_after: std::time::Duration,
    },
    /// The client did not send its body within `body_timeout`.
    #[error("the request body did not arrive within {}s", limit.as_secs())]
    BodyTimeout {
        /// The configured limit.
        limit: std::time::Duration,
    },
    /// Keyless mode and a request from a foreign host or web page.
    #[error("{0}")]
    Forbidden(String),
    /// A known path with a method it does not serve.
    #[error("method not allowed: {0}")]
    WrongMethod(String),
    /// A WebSocket upgrade (Codex's Responses transport): tidegate serves
    /// HTTP only, and `426` is the answer Codex falls back on silently
    /// (a `405` makes it print a warning every session).
    #[error("{0} is served over HTTP only (no WebSocket transport); send the request as an HTTP POST")]
    NoWebSocket(String),
    /// The gateway is shutting down: requests go elsewhere.
    #[error("this tidegate is shutting down; send the request again (to another replica)")]
    ShuttingDown,
    /// `x-tidegate-deadline` is not a duration.
    #[error("x-tidegate-deadline: {0:?} is not a duration like 30s")]
    BadDeadline(String),
    /// A `previous_response_id` this client may not continue: unknown,
    /// expired, or another client key's. One answer for all three (as
    /// OpenAI answers an id it does not have), so it tells a client
    /// nothing of other keys' ids.
    #[error("Previous response with id '{0}' not found (tidegate keeps responses for the client key that made them)")]
    PreviousResponseNotFound(String),
}

impl GatewayError {
    /// Status and protocol error kind; the single place that decides both.
    fn status_kind(&self) -> (StatusCode, ErrorKind, Option<&'static str>) {
        match self {
            GatewayError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, None),
            GatewayError::Unauthorized => {
                (StatusCode::UNAUTHORIZED, ErrorKind::Authentication, Some("invalid_api_key"))
            }
            GatewayError::UnknownModel(_) => (StatusCode::NOT_FOUND, ErrorKind::NotFound, Some("model_not_found")),
            GatewayError::PreviousResponseNotFound(_) => {
                (StatusCode::NOT_FOUND, ErrorKind::NotFound, Some("previous_response_not_found"))
            }
            GatewayError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, ErrorKind::TooLarge, None),
            GatewayError::NoRoute(_) => (StatusCode::NOT_FOUND, ErrorKind::NotFound, None),
            GatewayError::GaveUp { status, kind, .. } => (*status, *kind, Some("upstream_unavailable")),
            GatewayError::BadDeadline(_) => (StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, None),
            GatewayError::QueueFull { .. } => (StatusCode::TOO_MANY_REQUESTS, ErrorKind::RateLimit, Some("queue_full")),
            GatewayError::ClientLimit { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, ErrorKind::RateLimit, Some("client_limit"))
            }
            GatewayError::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorKind::Overloaded, Some("shutting_down"))
            }
            GatewayError::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, ErrorKind::Timeout, None),
            GatewayError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorKind::Authentication, Some("forbidden")),
            GatewayError::WrongMethod(_) => (StatusCode::METHOD_NOT_ALLOWED, ErrorKind::InvalidRequest, None),
            GatewayError::NoWebSocket(_) => {
                (StatusCode::UPGRADE_REQUIRED, ErrorKind::InvalidRequest, Some("websocket_not_served"))
            }
        }
    }

    /// A short label for metrics (`tidegate_rejected_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) => "bad_request",
            GatewayError::Unauthorized => "bad_key",
            GatewayError::UnknownModel(_) => "unknown_model",
            GatewayError::PreviousResponseNotFound(_) => "previous_response_not_found",
            GatewayError::TooLarge { .. } => "too_large",
            GatewayError::NoRoute(_) => "unknown_path",
            GatewayError::GaveUp { .. } => "gave_up",
            GatewayError::QueueFull { .. } => "queue_full",
            GatewayError::ClientLimit { .. } => "client_limit",
            GatewayError::BadDeadline(_) => "bad_deadline",
            GatewayError::BodyTimeout { .. } => "body_timeout",
            GatewayError::Forbidden(_) => "foreign_origin",
            GatewayError::WrongMethod(_) => "wrong_method",
            GatewayError::NoWebSocket(_) => "websocket",
            GatewayError::ShuttingDown => "shutting_down",
        }
    }

    /// The protocol error kind (for in-stream error events).
    pub fn kind(&self) -> ErrorKind {
        self.status_kind().1
    }

    /// The upstream failure class behind this error, if any.
    pub fn class(&self) -> Option<crate::classify::Class> {
        match self {
            GatewayError::GaveUp { class, .. } => Some(*class),
            GatewayError::QueueFull { .. } => Some(crate::classify::Class::Capacity),
            _ => None,
        }
    }

    /// When coming back may help, if tidegate says so.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            GatewayError::QueueFull { retry_after, .. } | GatewayError::ClientLimit { retry_after, .. } => {
                Some(*retry_after)
            }
            GatewayError::GaveUp { retry_after, .. } => *retry_after,
            GatewayError::ShuttingDown => Some(std::time::Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.status_kind().0
    }

    /// Renders the error in the client's protocol, for an SDK (see
    /// [`GatewayError::into_response_for`]).
    pub fn into_response(self, protocol: Protocol) -> Response {
        self.into_response_for(protocol, Client::Sdk)
    }

    /// What tidegate's give-up answer tells `client`: come back after a
    /// wait it sits out, or stop. `None` for answers that are not a
    /// give-up.
    pub fn advice(&self, client: Client) -> Option<Advice> {
        match self {
            GatewayError::GaveUp { class, retry_after, reset, .. } => {
                Some(client.advice(*class, wait_until(*retry_after, *reset)))
            }
            _ => None,
        }
    }

    /// What `client` is told, in words its retry loop does not misread
    /// (a stop to opencode holds none of the words it retries on).
    pub fn message_for(&self, client: Client) -> String {
        let message = format!("tidegate: {self}");
        match (client, self.advice(client)) {
            (Client::Opencode, Some(Advice::Stop(_))) => crate::client::without_retry_words(&message),
            _ => message,
        }
    }

    /// Renders the error in the client's protocol, with the retry signals
    /// that make `client`'s own retry loop do what tidegate means (the
    /// table is in [`crate::client`] and the README).
    pub fn into_response_for(self, protocol: Protocol, client: Client) -> Response {
        let (mut status, mut kind, code) = self.status_kind();
        let advice = self.advice(client);
        let message = self.message_for(client);
        if let (Some(Advice::Stop(wait)), GatewayError::GaveUp { class, .. }) = (advice, &self) {
            (status, kind) = stop_status(client, *class, wait, status, kind);
        }
        // Google's clients read when to come back from the body; so does
        // Gemini CLI, which stops on a RetryInfo over 300 s.
        let gemini_wait = match advice {
            Some(Advice::ComeBack(wait)) => Some(wait),
            Some(Advice::Stop(wait)) if status == StatusCode::TOO_MANY_REQUESTS => wait,
            Some(Advice::Stop(_)) => None,
            None => self.retry_after(),
        };
        let body = match (protocol, advice, &self) {
            (Protocol::Gemini, ..) => {
                crate::protocol::gemini::answer_error(status.as_u16(), kind, &message, code, gemini_wait)
            }
            // Codex names a limit and its reset to the user only for this
            // error type, and stops on it (every other 429 it retries).
            (
                Protocol::OpenAiResponses | Protocol::OpenAiChat,
                Some(Advice::Stop(wait)),
                GatewayError::GaveUp { reset, .. },
            ) if client == Client::Codex && status == StatusCode::TOO_MANY_REQUESTS => {
                let resets_at = reset.or_else(|| wait.and_then(|w| jiff::Timestamp::now().checked_add(w).ok()));
                let mut error = serde_json::json!({"type": "usage_limit_reached", "code": "usage_limit_reached", "message": message});
                if let Some(at) = resets_at {
                    error["resets_at"] = serde_json::Value::from(at.as_second());
                }
                axum::body::Bytes::from(serde_json::json!({ "error": error }).to_string())
            }
            _ => protocol.error_body(kind, &message, code),
        };
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let GatewayError::QueueFull { retry_after, .. } | GatewayError::ClientLimit { retry_after, .. } = &self {
            come_back(headers, *retry_after, client);
        }
        if matches!(self, GatewayError::TooLarge { .. } | GatewayError::BodyTimeout { .. }) {
            // What is left of the body is not read: this connection ends.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let GatewayError::ShuttingDown = &self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let GatewayError::GaveUp { stop_client_retries, .. } = &self {
            match advice {
                Some(Advice::ComeBack(wait)) => come_back(headers, wait, client),
                Some(Advice::Stop(wait)) => {
                    if let Some(wait) = stop_retry_after(client, wait) {
                        headers.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
                    }
                    if *stop_client_retries {
                        headers.insert("x-should-retry", HeaderValue::from_static("false"));
                    }
                }
                None => {}
            }
        }
        resp
    }
}

/// The longer of a wait and the time to a projected reset.
fn wait_until(retry_after: Option<Duration>, reset: Option<jiff::Timestamp>) -> Option<Duration> {
    let to_reset = reset.and_then(|at| Duration::try_from(at.duration_since(jiff::Timestamp::now())).ok());
    match (retry_after, to_reset) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Whole seconds, rounded up (never tell a client to come back early), at
/// least one.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// "Come back after `wait`": `Retry-After`, the SDKs' `retry-after-ms`,
/// and `x-should-retry: true` (an SDK then retries even a status it would
/// not, and waits as told).
fn come_back(headers: &mut http::HeaderMap, wait: Duration, client: Client) {
    // A queue's drain estimate may be longer than the client waits: told
    // the most it waits, it comes back then instead of ignoring the wait.
    let wait = wait.min(client.waits_up_to());
    headers.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
    headers.insert("retry-after-ms", HeaderValue::from(wait.as_millis().max(1) as u64));
    headers.insert("x-should-retry", HeaderValue::from_static("true"));
}

/// The `Retry-After` of a stop, where it helps: the SDKs read
/// `x-should-retry` first and show the real wait; Claude Code stops only
/// on a `Retry-After` over 60 s; Codex and Qwen Code would sleep it out
/// (hours), opencode ignores it, Gemini CLI reads the body.
fn stop_retry_after(client: Client, wait: Option<Duration>) -> Option<Duration> {
    match client {
        Client::Sdk => wait,
        Client::ClaudeCode => Some(wait.unwrap_or_default().max(client.waits_up_to() + Duration::from_secs(1))),
        Client::Codex | Client::QwenCode | Client::Opencode | Client::GeminiCli => None,
    }
}

/// The status and kind of a stop: the truthful one where the client stops
/// on it, else the one status its retry loop does not retry.
fn stop_status(
    client: Client,
    class: Class,
    wait: Option<Duration>,
    status: StatusCode,
    kind: ErrorKind,
) -> (StatusCode, ErrorKind) {
    let limit = class == Class::Capacity;
    match client {
        Client::Sdk | Client::ClaudeCode => (status, kind),
        // `usage_limit_reached` (a 429) for a limit; Codex retries every
        // other status but 400, whose body it prints.
        Client::Codex if limit => (StatusCode::TOO_MANY_REQUESTS, ErrorKind::RateLimit),
        Client::Codex => (StatusCode::BAD_REQUEST, kind),
        // A RetryInfo over 300 s stops it; so does any 4xx but 429.
        Client::GeminiCli if limit && wait.is_some() => (StatusCode::TOO_MANY_REQUESTS, ErrorKind::RateLimit),
        // They retry every 429 and 5xx whatever the headers say (GitHub's
        // API answers a spent limit 403 too).
        Client::GeminiCli | Client::Opencode | Client::QwenCode => (StatusCode::FORBIDDEN, ErrorKind::Permission),
    }
}
