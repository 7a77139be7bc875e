//! Errors tidegate answers by itself, each mapped to a status and a
//! protocol-shaped body in one `match`.
//!
//! Upstream errors are not here: they are relayed verbatim. These are the
//! cases where tidegate is the one saying no (bad input, bad key, nothing to
//! route to) or where it could not get any answer from an upstream.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

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
        /// Add `x-should-retry: false` so SDKs do not retry on top.
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
    /// The gateway is shutting down: requests go elsewhere.
    #[error("this tidegate is shutting down; send the request again (to another replica)")]
    ShuttingDown,
    /// `x-tidegate-deadline` is not a duration.
    #[error("x-tidegate-deadline: {0:?} is not a duration like 30s")]
    BadDeadline(String),
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
        }
    }

    /// A short label for metrics (`tidegate_rejected_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) => "bad_request",
            GatewayError::Unauthorized => "bad_key",
            GatewayError::UnknownModel(_) => "unknown_model",
            GatewayError::TooLarge { .. } => "too_large",
            GatewayError::NoRoute(_) => "unknown_path",
            GatewayError::GaveUp { .. } => "gave_up",
            GatewayError::QueueFull { .. } => "queue_full",
            GatewayError::ClientLimit { .. } => "client_limit",
            GatewayError::BadDeadline(_) => "bad_deadline",
            GatewayError::BodyTimeout { .. } => "body_timeout",
            GatewayError::Forbidden(_) => "foreign_origin",
            GatewayError::WrongMethod(_) => "wrong_method",
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

    /// Renders the error in the client's protocol.
    pub fn into_response(self, protocol: Protocol) -> Response {
        let (status, kind, code) = self.status_kind();
        let message = format!("tidegate: {self}");
        let body = match protocol {
            // Google's clients read when to come back from the body.
            Protocol::Gemini => {
                crate::protocol::gemini::answer_error(status.as_u16(), kind, &message, code, self.retry_after())
            }
            _ => protocol.error_body(kind, &message, code),
        };
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let GatewayError::QueueFull { retry_after, .. } | GatewayError::ClientLimit { retry_after, .. } = &self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after.as_secs().max(1)));
        }
        if matches!(self, GatewayError::TooLarge { .. } | GatewayError::BodyTimeout { .. }) {
            // What is left of the body is not read: this connection ends.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let GatewayError::ShuttingDown = &self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let GatewayError::GaveUp { retry_after, stop_client_retries, .. } = &self {
            if let Some(wait) = retry_after {
                // Whole seconds, rounded up: never tell a client to come back early.
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            }
            if *stop_client_retries {
                headers.insert("x-should-retry", HeaderValue::from_static("false"));
            }
        }
        resp
    }
}
