//! The attempt loop: from a routed request to the answer the client gets.
//!
//! Plain async code, top to bottom: send the same bytes, classify the
//! answer ([`crate::classify`]), ask [`crate::retry::decide`] what to do,
//! wait or stop. A 2xx is relayed as it streams; an error body is read (it
//! is small) so it can be classified and, if it is the final answer,
//! returned verbatim. Waiting ends the moment the client goes away: hyper
//! drops this future, and with it the sleep and any upstream call.

mod answer;

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;
use http::header::{self, HeaderName};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use crate::classify::{self, Class, TransportFailure};
use crate::config::ModelRoute;
use crate::protocol::{self, Protocol, RequestHead};
use crate::retry::{self, Decision, GiveUp, Policy, Situation};
use crate::stream::RelayBody;
use crate::upstream::{SendError, Upstream};

/// Largest error body read for classification.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// Response headers that describe one hop and must not be relayed.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// Request-wide settings the loop needs.
pub struct Settings<'a> {
    /// Retry policy.
    pub policy: &'a Policy,
    /// Send `x-should-retry: false` when giving up.
    pub stop_client_retries: bool,
}

/// One request as the loop sees it.
pub struct RelayRequest<'a> {
    /// The client's protocol (for tidegate's own answers).
    pub protocol: Protocol,
    /// The alias's route.
    pub route: &'a ModelRoute,
    /// `model`/`stream` and the model's byte span.
    pub head: &'a RequestHead,
    /// The client's body, untouched.
    pub body: &'a Bytes,
    /// The client's headers (an allowlist is forwarded).
    pub client_headers: &'a HeaderMap,
    /// When the request must be answered.
    pub deadline: Instant,
    /// Another tidegate in front retries; this one makes one attempt.
    pub chained: bool,
}

/// What one attempt did, for the log line, the journal and messages.
#[derive(Debug, Clone)]
pub struct AttemptLog {
    /// Upstream index.
    pub upstream: usize,
    /// Upstream status, if an answer arrived.
    pub status: Option<u16>,
    /// Class of a failed attempt (`None` for success).
    pub class: Option<Class>,
    /// What the provider said.
    pub summary: String,
    /// `ok`, `retry_same`, `give_up` or `fatal`.
    pub verdict: &'static str,
    /// Wait before the next attempt.
    pub wait: Option<Duration>,
}

/// The client's answer and how it came about.
pub struct Relayed {
    /// What to send the client.
    pub response: Response,
    /// The upstream that gave the final answer, if any.
    pub upstream: Option<usize>,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptLog>,
}

/// Runs attempts against the route's first target until success, a final
/// error, or the deadline.
pub async fn relay(upstreams: &[Upstream], settings: &Settings<'_>, req: RelayRequest<'_>) -> Relayed {
    let started = Instant::now();
    let mut attempts: Vec<AttemptLog> = Vec::new();
    let Some((index, upstream, target)) =
        req.route.targets.first().and_then(|t| upstreams.get(t.upstream).map(|u| (t.upstream, u, t)))
    else {
        let error = crate::error::GatewayError::UnknownModel("model has no usable target".into());
        return Relayed { response: error.into_response(req.protocol), upstream: None, attempts };
    };
    // One body for every attempt: byte-identical retries.
    let body = protocol::body_for_target(req.body, req.head, &target.model);
    upstream.budget.record_request(std::time::Instant::now());
    loop {
        let remaining = req.deadline.saturating_duration_since(Instant::now());
        let timeout = upstream.config.header_timeout.min(remaining);
        let sent = upstream.send(upstream.request(body.clone(), req.client_headers), timeout).await;
        let (outcome, answer) = match sent {
            Ok(resp) if resp.status().is_success() => {
                attempts.push(AttemptLog {
                    upstream: index,
                    status: Some(resp.status().as_u16()),
                    class: None,
                    summary: String::new(),
                    verdict: "ok",
                    wait: None,
                });
                return Relayed { response: stream_to_client(resp, upstream), upstream: Some(index), attempts };
            }
            Ok(resp) => {
                let (parts, bytes) = read_error(resp, remaining).await;
                let outcome = classify::classify(
                    parts.status,
                    &parts.headers,
                    &bytes,
                    &upstream.config.rules,
                    jiff::Timestamp::now(),
                );
                (outcome, Some((parts, bytes)))
            }
            Err(SendError::Transport(detail)) => {
                (classify::classify_transport(&TransportFailure::Connection(detail)), None)
            }
            Err(SendError::Timeout(after)) => {
                let failure = TransportFailure::Timeout(format!("no response headers within {after:?}"));
                (classify::classify_transport(&failure), None)
            }
        };
        let now = Instant::now();
        let situation = Situation {
            outcome: &outcome,
            attempts: attempts.len() as u32 + 1,
            policy: settings.policy,
            remaining: req.deadline.saturating_duration_since(now),
            budget_ok: upstream.budget.has_room(std::time::Instant::now()),
            chained: req.chained,
            jitter: fastrand::f64(),
        };
        let decision = retry::decide(&situation);
        let verdict = match &decision {
            Decision::Retry { .. } => "retry_same",
            Decision::GiveUp(GiveUp::NotRetryable) if outcome.rule.as_ref().is_some_and(|r| r.fatal) => "fatal",
            Decision::GiveUp(_) => "give_up",
        };
        attempts.push(AttemptLog {
            upstream: index,
            status: outcome.status,
            class: Some(outcome.class),
            summary: outcome.summary.clone(),
            verdict,
            wait: match &decision {
                Decision::Retry { wait, .. } => Some(*wait),
                Decision::GiveUp(_) => None,
            },
        });
        match decision {
            Decision::Retry { wait, source } => {
                if source == "backoff" {
                    upstream.budget.spend(std::time::Instant::now());
                }
                tracing::debug!(upstream = %upstream.config.name, class = outcome.class.as_str(), ?wait, source, "retrying");
                tokio::time::sleep(wait).await;
            }
            Decision::GiveUp(why) => {
                let ctx = answer::Context {
                    protocol: req.protocol,
                    upstream,
                    attempts: attempts.len() as u32,
                    elapsed: started.elapsed(),
                    policy: settings.policy,
                    stop_client_retries: settings.stop_client_retries,
                };
                let response = answer::give_up(&ctx, why, &outcome, answer);
                return Relayed { response, upstream: Some(index), attempts };
            }
        }
    }
}

/// Reads a (small) error body; on failure or overflow, whatever could be
/// read is enough to classify and report.
async fn read_error(resp: http::Response<hyper::body::Incoming>, limit: Duration) -> (http::response::Parts, Bytes) {
    let (parts, incoming) = resp.into_parts();
    let read = tokio::time::timeout(limit, Limited::new(incoming, MAX_ERROR_BODY).collect()).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) | Err(_) => Bytes::new(),
    };
    (parts, bytes)
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

fn stream_to_client(resp: http::Response<hyper::body::Incoming>, upstream: &Upstream) -> Response {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = RelayBody::new(incoming, upstream.config.stream_idle_timeout);
    Response::from_parts(parts, Body::new(body))
}
