//! The answer when retrying stops: the upstream's own answer verbatim when
//! the request cannot succeed as sent, or tidegate's honest account when
//! waiting ran out — status that tells the truth, `Retry-After`, and a
//! message a user can act on.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;

use crate::classify::{Class, Classified};
use crate::client::{Advice, Client};
use crate::error::GatewayError;
use crate::headers::strip_hop_by_hop;
use crate::health::Benched;
use crate::limits::Refused;
use crate::protocol::{ErrorKind, Protocol};
use crate::record::WaitSource;
use crate::retry::{self, GiveUp, Policy};
use crate::stream::RelayBody;
use crate::upstream::Upstream;

/// The final answer of the attempt loop.
pub enum Answer {
    /// A 2xx answer, relayed as it streams.
    Stream(http::response::Parts, Box<RelayBody>),
    /// The upstream's own error answer, returned as it was.
    Verbatim {
        /// Status and headers.
        parts: http::response::Parts,
        /// Body.
        body: Bytes,
        /// Its class.
        class: Class,
    },
    /// tidegate's own answer.
    Gateway(GatewayError),
}

impl Answer {
    /// The HTTP response for a client still waiting for headers.
    pub fn into_response(self, protocol: Protocol) -> Response {
        match self {
            // The box itself is the body: not moved into a second one.
            Answer::Stream(parts, body) => Response::from_parts(parts, Body::new(body)),
            Answer::Verbatim { mut parts, body, .. } => {
                parts.headers.remove(http::header::CONTENT_LENGTH);
                Response::from_parts(parts, Body::from(body))
            }
            Answer::Gateway(error) => error.into_response(protocol),
        }
    }

    /// [`Answer::into_response`] with tidegate's own answer in the words
    /// of `client`'s retry contract ([`GatewayError::into_response_for`]).
    ///
    /// A coding agent is not handed the provider's own answer about the
    /// account (auth, entitlement) either: a provider's `401` makes Claude
    /// Code retry and blame its own key, a `403` or `429 insufficient_quota`
    /// makes Codex, opencode and Qwen Code retry (for ever, for some). It
    /// gets tidegate's account of it, with the signals that stop it. The
    /// SDKs get the provider's answer as it was (they do not retry 401/403,
    /// and a provider's own error code is what their users match on).
    pub fn into_response_for(self, protocol: Protocol, client: Client) -> Response {
        match self {
            Answer::Gateway(error) => error.into_response_for(protocol, client),
            Answer::Verbatim { parts, body, class: class @ (Class::Auth | Class::Entitlement) }
                if client != Client::Sdk =>
            {
                account_refused(&parts, &body, class).into_response_for(protocol, client)
            }
            other => other.into_response(protocol),
        }
    }

    /// For a stream already committed (keep-alive): the failure as the
    /// protocol's error event, with its class and message for the report,
    /// in the words that make `client`'s retry loop do what tidegate
    /// means: a give-up that says "come back" is an event the client
    /// retries (for Codex a `rate_limit_exceeded` saying "try again in
    /// Ns", which it waits), one that says "stop" an event it does not
    /// (Codex prints an `invalid_prompt`'s message and stops; Claude Code
    /// retries only overloaded and rate-limit events).
    pub fn error_event_for(self, protocol: Protocol, client: Client) -> (Bytes, Option<Class>, String) {
        if let Answer::Gateway(error) = &self
            && let Some(advice) = error.advice(client)
        {
            let class = error.class();
            let mut message = error.message_for(client);
            let event = match advice {
                Advice::ComeBack(wait) => {
                    let kind = match class {
                        Some(Class::Capacity) => ErrorKind::RateLimit,
                        _ => error.kind(),
                    };
                    message.push_str(&format!(" Please try again in {}s.", wait.as_secs_f64().ceil().max(1.0)));
                    protocol.error_event(kind, &message)
                }
                Advice::Stop(_) if protocol == Protocol::OpenAiResponses && client == Client::Codex => {
                    crate::protocol::openai_responses::error_event_coded(
                        ErrorKind::InvalidRequest,
                        "invalid_prompt",
                        &message,
                    )
                }
                Advice::Stop(_) => {
                    let kind = match protocol {
                        Protocol::Anthropic => ErrorKind::Api,
                        _ => ErrorKind::Permission,
                    };
                    protocol.error_event(kind, &message)
                }
            };
            return (event, class, message);
        }
        match self {
            Answer::Stream(..) => (Bytes::new(), None, String::new()),
            Answer::Verbatim { parts, body, class } => {
                let kind = match parts.status.as_u16() {
                    429 => ErrorKind::RateLimit,
                    503 | 529 => ErrorKind::Overloaded,
                    401 | 403 => ErrorKind::Authentication,
                    404 => ErrorKind::NotFound,
                    400..=499 => ErrorKind::InvalidRequest,
                    _ => ErrorKind::Api,
                };
                let message = format!(
                    "tidegate: upstream answered {} ({} error): {}",
                    parts.status.as_u16(),
                    class.as_str(),
                    crate::classify::summary::summarize(&body)
                );
                (protocol.error_event(kind, &message), Some(class), message)
            }
            Answer::Gateway(error) => {
                let (kind, message) = (error.kind(), format!("tidegate: {error}"));
                (protocol.error_event(kind, &message), error.class(), message)
            }
        }
    }

    /// The class of a failed answer.
    pub fn class(&self) -> Option<Class> {
        match self {
            Answer::Stream(..) => None,
            Answer::Verbatim { class, .. } => Some(*class),
            Answer::Gateway(error) => error.class(),
        }
    }
}

/// tidegate's stop for an upstream's own answer about its account.
fn account_refused(parts: &http::response::Parts, body: &Bytes, class: Class) -> GatewayError {
    GatewayError::GaveUp {
        status: StatusCode::BAD_GATEWAY,
        kind: ErrorKind::Api,
        class,
        message: format!(
            "the upstream's account cannot serve this request ({} error; the client's own key is fine), and no other target is left to try. Last answer: {} {}.",
            class.as_str(),
            parts.status.as_u16(),
            crate::classify::summary::summarize(body)
        ),
        retry_after: None,
        reset: None,
        stop_client_retries: true,
    }
}

/// The OpenAI SDKs honour `Retry-After` up to 60 s… the Anthropic ones
/// less; past this, the wait is also spelled out in the message.
const SDK_HONOURED: Duration = Duration::from_secs(60);

pub(super) struct Context<'a> {
    pub upstream: &'a Upstream,
    pub attempts: u32,
    pub elapsed: Duration,
    pub policy: &'a Policy,
    pub stop_client_retries: bool,
    /// Each target's last failure, when more than one was tried.
    pub tried: String,
}

impl<'a> Context<'a> {
    pub fn new(
        gw: &'a crate::gateway::Gateway,
        upstream: &'a Upstream,
        attempts: usize,
        started: tokio::time::Instant,
        tried: &[super::targets::Tried],
    ) -> Self {
        let tried = if tried.len() > 1 {
            tried
                .iter()
                .map(|t| {
                    let name = gw.upstreams.get(t.upstream).map_or("?", |u| u.config.name.as_str());
                    let s = if t.attempts == 1 { "" } else { "s" };
                    format!("{name} ({} error, {} attempt{s}: {})", t.class.as_str(), t.attempts, t.last)
                })
                .collect::<Vec<_>>()
                .join("; ")
        } else {
            String::new()
        };
        Self {
            upstream,
            attempts: attempts as u32,
            elapsed: started.elapsed(),
            policy: &gw.config.retry,
            stop_client_retries: gw.config.stop_client_retries,
            tried,
        }
    }
}

/// The outcome standing for "no target could be tried at all".
/// The reason for a request that was never sent: the provider had asked
/// (in an answer to an earlier request, possibly on another replica) for
/// nothing before a time beyond this request's deadline.
pub(super) fn held_off() -> Classified {
    Classified {
        class: Class::Capacity,
        status: Some(429),
        hints: crate::classify::Hints::default(),
        summary: "the provider asked for no requests until later (Retry-After on an earlier answer)".into(),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

/// The reason for a request that found every target left benched: each
/// one's name and the answer that benched it, and the earliest reset a
/// provider projected.
pub(super) fn benched(gw: &crate::gateway::Gateway, benched: &[(crate::ids::UpstreamId, Benched)]) -> Classified {
    let all_capacity = benched.iter().all(|(_, b)| b.class == Class::Capacity);
    let class = benched.first().map_or(Class::Entitlement, |(_, b)| b.class);
    let each = benched
        .iter()
        .map(|(id, b)| {
            let name = gw.upstreams.get(*id).map_or("?", |u| u.config.name.as_str());
            format!("{name}: {} error, {}", b.class.as_str(), b.reason)
        })
        .collect::<Vec<_>>()
        .join("; ");
    Classified {
        class,
        status: all_capacity.then_some(429),
        hints: crate::classify::Hints {
            projected_reset: benched.iter().filter_map(|(_, b)| b.reset).min(),
            ..Default::default()
        },
        summary: format!("benched ({each})"),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

pub(super) fn breakers_open() -> Classified {
    Classified {
        class: Class::Transient,
        status: None,
        hints: crate::classify::Hints::default(),
        summary:
            "every target's circuit breaker is open (repeated failures); the first probe is not due before the deadline"
                .into(),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

pub(super) fn give_up(
    ctx: &Context<'_>,
    why: GiveUp,
    outcome: &Classified,
    answer: Option<(http::response::Parts, Bytes)>,
) -> Answer {
    let verbatim = match why {
        GiveUp::NotRetryable | GiveUp::ProviderSaidNo | GiveUp::Chained => true,
        GiveUp::Exhausted
        | GiveUp::BeyondDeadline { .. }
        | GiveUp::BreakerOpen { .. }
        | GiveUp::Benched { .. }
        | GiveUp::DeadlinePassed => false,
    };
    if verbatim && let Some((mut parts, body)) = answer {
        strip_hop_by_hop(&mut parts.headers);
        return Answer::Verbatim { parts, body, class: outcome.class };
    }
    Answer::Gateway(tidegate_answer(ctx, why, outcome))
}

fn tidegate_answer(ctx: &Context<'_>, why: GiveUp, outcome: &Classified) -> GatewayError {
    let name = &ctx.upstream.config.name;
    let timed_out = outcome.status.is_none() && outcome.summary.starts_with("timed out");
    let (status, kind, state) = match outcome.class {
        Class::Capacity if outcome.status == Some(429) => {
            (StatusCode::TOO_MANY_REQUESTS, ErrorKind::RateLimit, "rate-limited")
        }
        Class::Capacity => (StatusCode::SERVICE_UNAVAILABLE, ErrorKind::Overloaded, "overloaded"),
        Class::Transient if timed_out => (StatusCode::GATEWAY_TIMEOUT, ErrorKind::Timeout, "not answering"),
        Class::Transient if outcome.status.is_none() => (StatusCode::BAD_GATEWAY, ErrorKind::Api, "unreachable"),
        Class::Transient => (StatusCode::BAD_GATEWAY, ErrorKind::Api, "failing"),
        Class::Request | Class::Auth | Class::Entitlement => (StatusCode::BAD_GATEWAY, ErrorKind::Api, "refusing"),
    };
    let next_backoff = retry::backoff(ctx.attempts + 1, ctx.policy, 0.5);
    let (status, kind, retry_after, reason) = match why {
        GiveUp::BeyondDeadline { wait, source } => {
            let who = match source {
                WaitSource::Provider(header) => format!("the provider asked ({header}) for {}", secs(wait)),
                WaitSource::Rule => format!("the upstream's retry rule waits {} between attempts", secs(wait)),
                WaitSource::Backoff => "tidegate's backoff leaves no time for another attempt".to_owned(),
                WaitSource::Budget => format!(
                    "tidegate's retry budget for it (which keeps retries a fraction of its traffic) has no room for another attempt for {}",
                    secs(wait)
                ),
            };
            (status, kind, wait, format!("{who}, longer than this request's deadline allows"))
        }
        GiveUp::DeadlinePassed => (
            StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Timeout,
            next_backoff,
            "the request's deadline passed while the upstream was still answering (it was working, not failing)".into(),
        ),
        GiveUp::Benched { wait } => (
            status,
            kind,
            wait,
            format!(
                "an earlier answer said it cannot serve now, so it is benched; one probe request goes in {} (earlier if the provider's reset comes first)",
                secs(wait)
            ),
        ),
        GiveUp::BreakerOpen { wait } => (
            status,
            kind,
            wait,
            format!("its circuit breaker is open after repeated failures; the next probe is due in {}", secs(wait)),
        ),
        GiveUp::Exhausted => {
            (status, kind, outcome.hints.retry_after.unwrap_or(next_backoff), format!("{} attempts used", ctx.attempts))
        }
        GiveUp::NotRetryable | GiveUp::ProviderSaidNo | GiveUp::Chained => {
            (status, kind, outcome.hints.retry_after.unwrap_or(next_backoff), "it cannot be retried".into())
        }
    };
    // Never "come back at once": that would only continue tidegate's own
    // retrying past the deadline.
    let retry_after = retry_after.max(crate::client::COME_BACK_AFTER);
    let mut message = if ctx.tried.is_empty() {
        format!(
            "upstream {name} is still {state} ({} error) after {} attempt{} over {}; {reason}. Last answer: {}.",
            outcome.class.as_str(),
            ctx.attempts,
            if ctx.attempts == 1 { "" } else { "s" },
            secs(ctx.elapsed),
            outcome.summary,
        )
    } else {
        format!(
            "every target is still unavailable after {} attempts over {}; {reason}. Tried: {}.",
            ctx.attempts,
            secs(ctx.elapsed),
            ctx.tried
        )
    };
    if let Some(reset) = outcome.hints.projected_reset {
        message.push_str(&format!(
            " The provider projects a reset at {reset} (a projection: limits often clear much sooner)."
        ));
    }
    message.push_str(&format!(" Retry after {}", secs(retry_after)));
    if retry_after > SDK_HONOURED {
        message.push_str(" (longer than SDKs wait on their own)");
    }
    message.push('.');
    GatewayError::GaveUp {
        status,
        kind,
        class: outcome.class,
        message,
        retry_after: Some(retry_after),
        reset: outcome.hints.projected_reset,
        stop_client_retries: ctx.stop_client_retries,
    }
}

/// The answer when the upstream's queue refused the request.
pub(super) fn refused(upstream: &Upstream, refused: Refused, attempts: usize, elapsed: Duration) -> GatewayError {
    let name = upstream.config.name.clone();
    match refused {
        Refused::QueueFull { queued, retry_after } => GatewayError::QueueFull { upstream: name, queued, retry_after },
        Refused::Deadline { waited, retry_after } => GatewayError::GaveUp {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: ErrorKind::Timeout,
            class: Class::Capacity,
            message: format!(
                "the request's deadline passed while it waited {} for upstream {name} (queue or rate limit; {} in flight, limit {}) after {attempts} attempt{}, {} in all; no slot was taken. Retry after {}.",
                secs(waited),
                upstream.limiter.in_flight(),
                upstream.limiter.effective_limit(),
                if attempts == 1 { "" } else { "s" },
                secs(elapsed),
                secs(retry_after),
            ),
            retry_after: Some(retry_after),
            reset: None,
            stop_client_retries: true,
        },
    }
}

fn secs(d: Duration) -> String {
    if d < Duration::from_millis(100) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(10) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}s", d.as_secs_f64().round() as u64)
    }
}
