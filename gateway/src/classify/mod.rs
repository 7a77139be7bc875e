//! What an upstream answer means: a pure function from (status, headers,
//! body) or a transport failure to a [`Classified`] value — a class, the hints it
//! carried, and one line of what the provider said.
//!
//! Built-in knowledge is protocol-level and generic (status codes, the
//! OpenAI/Anthropic error types, common wording). Vendor knowledge is data:
//! the upstream's `retry:` and `fatal:` rules ([`Rules`]). A
//! matching `fatal:` rule wins over everything, a matching `retry:` rule
//! over the built-in class. Anything not recognised as retryable is not.

pub mod advertised;
pub mod hints;
pub mod rules;
pub mod summary;

use http::{HeaderMap, StatusCode};
use jiff::Timestamp;

pub use hints::Hints;

pub use rules::{Rule, RuleMatch, Rules};

/// The error classes tidegate reasons about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Busy: rate limit, concurrency cap, overload. Retried with backoff.
    Capacity,
    /// Broken for a moment: 5xx, connect/reset, timeout. Retried.
    Transient,
    /// The request itself is wrong. Never retried; returned verbatim.
    Request,
    /// Key rejected. Not retried on that upstream.
    Auth,
    /// Billing, quota, plan. Not retried on that upstream.
    Entitlement,
}

impl Class {
    /// Every class, in the order of the docs.
    pub const ALL: [Class; 5] = [Class::Capacity, Class::Transient, Class::Request, Class::Auth, Class::Entitlement];

    /// The class a lower-case name (as [`Class::as_str`] writes it) names.
    pub fn parse(name: &str) -> Option<Class> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// Lower-case name for messages, logs and the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Capacity => "capacity",
            Class::Transient => "transient",
            Class::Request => "request",
            Class::Auth => "auth",
            Class::Entitlement => "entitlement",
        }
    }

    /// Whether waiting and trying again can help at all.
    pub fn retryable(self) -> bool {
        match self {
            Class::Capacity | Class::Transient => true,
            Class::Request | Class::Auth | Class::Entitlement => false,
        }
    }
}

/// A failure before any response headers arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportFailure {
    /// Connect refused/reset, TLS failure, connection dropped.
    Connection(String),
    /// No response headers in time.
    Timeout(String),
}

/// What one attempt's answer means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    /// The class after rules.
    pub class: Class,
    /// Upstream status, if an HTTP answer arrived.
    pub status: Option<u16>,
    /// Waiting hints from headers and body.
    pub hints: Hints,
    /// One line: status and what the provider said.
    pub summary: String,
    /// The operator rule that matched, if any.
    pub rule: Option<RuleMatch>,
    /// The provider spoke of concurrency or sessions (for adaptive limits).
    pub concurrency: bool,
    /// The refusal is about the model asked for, not the whole account
    /// (a model not found, a per-model quota): the upstream is not
    /// benched for it, since its other models still serve.
    pub model_scoped: bool,
}

const CAPACITY_WORDS: &[&str] = &[
    "concurren",
    "rate limit",
    "rate_limit",
    "ratelimit",
    "too many requests",
    "tpm limit",
    "rpm limit",
    "tokens per minute",
    "requests per minute",
    "overloaded",
    "capacity",
    "session limit",
    "resource_exhausted",
    "server is busy",
];

const ENTITLEMENT_WORDS: &[&str] = &["insufficient_quota", "billing", "credit balance", "payment required", "no plan"];

/// Classifies an HTTP answer. `body` is the (bounded) error body; `now` is
/// used for date-valued hints.
pub fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8], rules: &Rules, now: Timestamp) -> Classified {
    let text = String::from_utf8_lossy(body);
    let lower = text.to_ascii_lowercase();
    let mut hints = hints::from_headers(headers, now);
    hints.projected_reset = hints::projected_reset(&text, now);
    let rule = rules.find(status.as_u16(), &text);
    let mut builtin = builtin(status, &lower, hints.should_retry);
    // Google's capacity contract: when to come back is in the body; a
    // daily quota, or one that resets only after longer than a client
    // waits, is this target's entitlement until then (failover, no wait).
    let google = hints::google_wait(&text);
    if hints.retry_after.is_none()
        && let Some(wait) = google.retry
    {
        hints.retry_after = Some(wait);
        hints.source = Some("retryInfo");
    }
    let long = google.reset_after.filter(|d| *d > hints::LONG_RESET);
    let exhausted = status == StatusCode::TOO_MANY_REQUESTS && lower.contains("resource_exhausted");
    if exhausted && !google.daily && long.is_none() && (google.per_minute || google.retry.is_some()) {
        builtin = Class::Capacity;
    }
    if (builtin == Class::Capacity || exhausted) && (google.daily || long.is_some()) {
        builtin = Class::Entitlement;
        hints.projected_reset = hints.projected_reset.or_else(|| match long {
            Some(after) => jiff::SignedDuration::try_from(after).ok().and_then(|d| now.checked_add(d).ok()),
            None => hints::next_pacific_midnight(now),
        });
    } else if hints.retry_after.is_none()
        && let Some(after) = google.reset_after
    {
        hints.retry_after = Some(after);
        hints.source = Some("quota reset");
    }
    // A rule says what the answer means: its `class:`, else capacity for
    // a retry rule; a fatal rule keeps the built-in class when that is
    // already final, else the answer is the request's own fault.
    let class = match &rule {
        Some(RuleMatch { class: Some(declared), .. }) => *declared,
        Some(m) if m.fatal => match builtin {
            Class::Request | Class::Auth | Class::Entitlement => builtin,
            Class::Capacity | Class::Transient => Class::Request,
        },
        Some(_) => Class::Capacity,
        None => builtin,
    };
    Classified {
        class,
        status: Some(status.as_u16()),
        hints,
        summary: format!("{} {}", status.as_u16(), summary::summarize(body)),
        rule,
        concurrency: lower.contains("concurren") || lower.contains("session"),
        model_scoped: status == StatusCode::NOT_FOUND || lower.contains("permodel"),
    }
}

/// Classifies a failure that produced no HTTP answer: always transient.
pub fn classify_transport(failure: &TransportFailure) -> Classified {
    let summary = match failure {
        TransportFailure::Connection(s) => format!("connection failed: {s}"),
        TransportFailure::Timeout(s) => format!("timed out: {s}"),
    };
    Classified {
        class: Class::Transient,
        status: None,
        hints: Hints::default(),
        summary,
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

/// No credentials to send a request with (a cloud token that could not be
/// had, a signature that could not be made): auth, so this upstream is
/// left for the rest of the request and its breaker counts it.
pub fn classify_credentials(detail: &str) -> Classified {
    Classified {
        class: Class::Auth,
        status: None,
        hints: Hints::default(),
        summary: format!("credentials: {detail}"),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

/// An answer that is no answer: a `1xx`, `204`/`205`, an HTML page or an
/// unasked-for compression under 2xx. Transient: a wrong `base_url`, a
/// captive portal or a misbehaving proxy may be gone on the next attempt
/// or target; it is never relayed as the model's answer.
pub fn classify_odd(status: u16, what: &str) -> Classified {
    Classified {
        class: Class::Transient,
        status: Some(status),
        hints: Hints::default(),
        summary: format!("{status} {what}"),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

fn has_any(lower: &str, words: &[&str]) -> bool {
    words.iter().any(|w| lower.contains(w))
}

/// The generic, protocol-level reading of an answer.
fn builtin(status: StatusCode, lower: &str, should_retry: Option<bool>) -> Class {
    let code = status.as_u16();
    let class = match code {
        401 | 403 if has_any(lower, ENTITLEMENT_WORDS) => Class::Entitlement,
        401 | 403 => Class::Auth,
        402 => Class::Entitlement,
        // The model is gone on this upstream: another target may have it.
        404 if lower.contains("model_not_found") || (lower.contains("model") && lower.contains("does not exist")) => {
            Class::Entitlement
        }
        408 | 409 => Class::Transient,
        429 if has_any(lower, ENTITLEMENT_WORDS) => Class::Entitlement,
        429 | 503 | 529 => Class::Capacity,
        400..=499 if has_any(lower, ENTITLEMENT_WORDS) => Class::Entitlement,
        // Other 4xx are the request's fault unless the body carries a
        // protocol-level capacity type; wording alone is not trusted here
        // (an operator rule says when a vendor abuses 400 for "busy").
        400..=499 if lower.contains("overloaded_error") || lower.contains("rate_limit_error") => Class::Capacity,
        400..=499 => Class::Request,
        500..=599 if has_any(lower, CAPACITY_WORDS) => Class::Capacity,
        500..=599 => Class::Transient,
        // A 2xx here is an error carried in a success status (an SSE error
        // frame): judge it by its words.
        200..=299 if has_any(lower, ENTITLEMENT_WORDS) => Class::Entitlement,
        200..=299 if has_any(lower, CAPACITY_WORDS) => Class::Capacity,
        200..=299 => Class::Transient,
        _ => Class::Request,
    };
    match (class, should_retry) {
        (Class::Request, Some(true)) => Class::Transient,
        (c, _) => c,
    }
}

#[cfg(test)]
mod tests;
