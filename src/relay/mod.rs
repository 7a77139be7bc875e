//! The attempt loop: from a routed request to the answer the client gets.
//!
//! Plain async code, top to bottom: send the same bytes, classify the
//! answer ([`crate::classify`]), ask [`crate::retry::decide`] what to do,
//! wait or stop. A 2xx JSON answer is relayed as it streams; a 2xx SSE
//! answer first passes the stream handshake ([`crate::stream::handshake`]);
//! an error body is read (it is small) so it can be classified and, if it
//! is the final answer, returned verbatim. Waiting ends the moment the
//! client goes away: hyper drops this future, and with it the sleep and any
//! upstream call.

mod answer;
mod targets;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

pub use answer::Answer;

use crate::classify::{self, Class, Outcome, TransportFailure};
use crate::protocol::{Protocol, RequestHead};
use crate::retry::{self, Decision, GiveUp, Situation};
use crate::server::Gateway;
use crate::stream::RelayBody;
use crate::stream::handshake::{self, Handshake};
use crate::stream::resume::Resume;
use crate::stream::waiting::Progress;
use crate::upstream::{SendError, Upstream};
use targets::{Pick, Targets};

/// Token estimate for a request without `max_tokens` (rate limits).
const DEFAULT_MAX_TOKENS: u64 = 1024;

/// Continuations per request when `stream_resume` is on.
const MAX_RESUMES: u8 = 2;

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

/// One request, owned, so the loop can outlive the handler (a committed
/// keep-alive stream runs it inside its body).
pub struct Job {
    /// Shared gateway state.
    pub gw: Arc<Gateway>,
    /// The client's protocol (for tidegate's own answers).
    pub protocol: Protocol,
    /// Index of the alias in `config.models`.
    pub route: usize,
    /// `model`/`stream` and the model's byte span.
    pub head: RequestHead,
    /// The client's body, untouched.
    pub body: Bytes,
    /// The client's headers (an allowlist is forwarded).
    pub client_headers: HeaderMap,
    /// When the request must be answered.
    pub deadline: Instant,
    /// Another tidegate in front retries; this one makes one attempt.
    pub chained: bool,
    /// Where the loop stands (for keep-alive comments).
    pub progress: Arc<Progress>,
    /// Client key name, for fair queueing.
    pub client: String,
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
    pub answer: Answer,
    /// The upstream that gave the final answer, if any.
    pub upstream: Option<usize>,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptLog>,
    /// Time spent waiting for slots and rate buckets.
    pub queue_wait: Duration,
}

/// What a single attempt produced.
enum Attempt {
    /// A usable answer: done.
    Success(Answer),
    /// A failure to classify: its outcome and, for an HTTP answer, the
    /// buffered answer to return verbatim if it is final.
    Failure(Outcome, Option<(http::response::Parts, Bytes)>),
}

/// Runs attempts across the alias's targets until success, a final error,
/// or the deadline.
pub async fn relay(job: Job) -> Relayed {
    let gw = &job.gw;
    let started = Instant::now();
    let mut attempts: Vec<AttemptLog> = Vec::new();
    let mut queue_wait = Duration::ZERO;
    let Some((_, route)) = gw.config.models.get_index(job.route) else {
        let error = crate::error::GatewayError::UnknownModel("model has no usable target".into());
        return Relayed { answer: Answer::Gateway(error), upstream: None, attempts, queue_wait };
    };
    let mut targets = Targets::new(gw, route);
    let tokens = job.head.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) + job.body.len() as u64 / 4;
    let mut last: Option<(Outcome, usize)> = None;
    loop {
        let ti = match targets.pick(Instant::now()) {
            Pick::Use(ti) => ti,
            // The provider asked for nothing before `until`: wait for it
            // within the deadline, else say so at once with that wait.
            Pick::HoldUntil(until) => {
                if until >= job.deadline {
                    let (outcome, ti) = last.take().unwrap_or_else(|| (answer::held_off(), 0));
                    let index = route.targets[ti].upstream;
                    let upstream = &gw.upstreams[index];
                    let wait = until.saturating_duration_since(Instant::now());
                    let ctx = answer::Context::new(gw, upstream, attempts.len(), started, &targets.tried);
                    let answer = answer::give_up(&ctx, GiveUp::BeyondDeadline { wait }, &outcome, None);
                    return Relayed { answer, upstream: Some(index), attempts, queue_wait };
                }
                tokio::time::sleep_until(until).await;
                continue;
            }
            // Every target left is broken: fail fast, saying when the
            // first probe is due, rather than queueing behind a breaker.
            pick @ (Pick::WaitUntil(_) | Pick::NoneLeft) => {
                let probe = match pick {
                    Pick::WaitUntil(until) => until.saturating_duration_since(Instant::now()),
                    Pick::Use(_) | Pick::HoldUntil(_) | Pick::NoneLeft => Duration::ZERO,
                };
                let (outcome, ti) = last.take().unwrap_or_else(|| (answer::breakers_open(), 0));
                let index = route.targets[ti].upstream;
                let upstream = &gw.upstreams[index];
                let wait = probe.max(Duration::from_secs(1));
                let ctx = answer::Context::new(gw, upstream, attempts.len(), started, &targets.tried);
                let answer = answer::give_up(&ctx, GiveUp::BreakerOpen { wait }, &outcome, None);
                return Relayed { answer, upstream: Some(index), attempts, queue_wait };
            }
        };
        let index = route.targets[ti].upstream;
        let upstream = &gw.upstreams[index];
        if targets.first_use(ti) {
            upstream.budget.record_request(std::time::Instant::now());
        }
        job.progress.attempt(index);
        // Wait for the upstream's rate buckets and a concurrency slot.
        let queued_at = Instant::now();
        let mut permit = match upstream.limiter.acquire(&job.client, tokens, job.deadline).await {
            Ok(permit) => permit,
            Err(refused) => {
                let error = answer::refused(upstream, refused, attempts.len(), started.elapsed());
                return Relayed { answer: Answer::Gateway(error), upstream: Some(index), attempts, queue_wait };
            }
        };
        queue_wait += queued_at.elapsed();
        let held = upstream.limiter.in_flight();
        let remaining = job.deadline.saturating_duration_since(Instant::now());
        let body = targets.body(ti, &job);
        let (outcome, buffered) = match attempt(&job, upstream, body, remaining).await {
            Attempt::Success(mut answer) => {
                upstream.limiter.on_success();
                upstream.health.on_success();
                attempts.push(AttemptLog {
                    upstream: index,
                    status: Some(200),
                    class: None,
                    summary: String::new(),
                    verdict: "ok",
                    wait: None,
                });
                if let Answer::Stream(_, body) = &mut answer {
                    // The slot is held until the last byte is relayed.
                    body.hold(permit);
                } else {
                    permit.settle(0);
                }
                return Relayed { answer, upstream: Some(index), attempts, queue_wait };
            }
            Attempt::Failure(outcome, buffered) => (outcome, buffered),
        };
        // Give the slot back before any wait: others may use it meanwhile.
        drop(permit);
        let now = Instant::now();
        upstream.health.on_failure(outcome.class, outcome.hints.retry_after, now);
        if let (Some(shared), Some((kind, left))) = (&upstream.shared, upstream.health.announcement(now)) {
            if shared.is_up() && left >= Duration::from_millis(500) {
                let (shared, name) = (shared.clone(), upstream.config.name.clone());
                tokio::spawn(async move { shared.announce(&name, kind, left).await });
            }
        }
        if outcome.class == Class::Capacity && outcome.concurrency {
            upstream.limiter.on_concurrency_error(held);
        }
        if matches!(outcome.class, Class::Auth | Class::Entitlement) {
            targets.exclude(ti);
        }
        targets.failed(ti, outcome.class, &outcome.summary);
        let situation = Situation {
            outcome: &outcome,
            attempts: attempts.len() as u32 + 1,
            policy: &gw.config.retry,
            remaining: job.deadline.saturating_duration_since(now),
            budget_ok: upstream.budget.has_room(std::time::Instant::now()),
            chained: job.chained,
            other_target_ready: targets.other_ready(ti, now),
            other_target_left: targets.other_left(ti),
            others_in_flight: upstream.limiter.in_flight() > 0,
            jitter: fastrand::f64(),
        };
        let decision = retry::decide(&situation);
        attempts.push(AttemptLog {
            upstream: index,
            status: outcome.status,
            class: Some(outcome.class),
            summary: outcome.summary.clone(),
            verdict: match &decision {
                Decision::Retry { .. } => "retry_same",
                Decision::NextTarget => "next_target",
                Decision::Requeue => "requeue",
                Decision::GiveUp(GiveUp::NotRetryable) if outcome.rule.as_ref().is_some_and(|r| r.fatal) => "fatal",
                Decision::GiveUp(_) => "give_up",
            },
            wait: match &decision {
                Decision::Retry { wait, .. } => Some(*wait),
                Decision::NextTarget | Decision::Requeue | Decision::GiveUp(_) => None,
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
            Decision::NextTarget => {
                tracing::debug!(upstream = %upstream.config.name, class = outcome.class.as_str(), "failing over");
            }
            Decision::Requeue => {
                tracing::debug!(upstream = %upstream.config.name, held, "concurrency refusal: back in the queue");
            }
            Decision::GiveUp(why) => {
                let ctx = answer::Context::new(gw, upstream, attempts.len(), started, &targets.tried);
                let answer = answer::give_up(&ctx, why, &outcome, buffered);
                return Relayed { answer, upstream: Some(index), attempts, queue_wait };
            }
        }
        last = Some((outcome, ti));
    }
}

/// One attempt: send, and turn whatever came back into an answer or a
/// classified failure.
async fn attempt(job: &Job, upstream: &Upstream, body: Bytes, remaining: Duration) -> Attempt {
    let timeout = upstream.config.header_timeout.min(remaining);
    let rules = &upstream.config.rules;
    let now = jiff::Timestamp::now;
    let resp = match upstream.send(upstream.request(body, &job.client_headers), timeout).await {
        Ok(resp) => resp,
        Err(SendError::Transport(detail)) => {
            return Attempt::Failure(classify::classify_transport(&TransportFailure::Connection(detail)), None);
        }
        Err(SendError::Timeout(after)) => {
            let failure = TransportFailure::Timeout(format!("no response headers within {after:?}"));
            return Attempt::Failure(classify::classify_transport(&failure), None);
        }
    };
    if !resp.status().is_success() {
        let (parts, bytes) = read_error(resp, remaining).await;
        let outcome = classify::classify(parts.status, &parts.headers, &bytes, rules, now());
        return Attempt::Failure(outcome, Some((parts, bytes)));
    }
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let idle = upstream.config.stream_idle_timeout;
    let name = &upstream.config.name;
    if !is_sse(&parts.headers) {
        return Attempt::Success(Answer::Stream(parts, Box::new(RelayBody::raw(incoming, idle, job.protocol, name))));
    }
    let wait = idle.min(job.deadline.saturating_duration_since(Instant::now()));
    match handshake::handshake(incoming, job.protocol, wait).await {
        Handshake::Open { inner, scanner, ready } => {
            let mut body = RelayBody::sse(inner, idle, scanner, ready, job.protocol, name);
            if job.gw.config.models.get_index(job.route).is_some_and(|(_, r)| r.stream_resume) {
                body.enable_resume(Resume {
                    gw: job.gw.clone(),
                    route: job.route,
                    body: job.body.clone(),
                    headers: job.client_headers.clone(),
                    deadline: job.deadline,
                    protocol: job.protocol,
                    tries: MAX_RESUMES,
                });
            }
            Attempt::Success(Answer::Stream(parts, Box::new(body)))
        }
        Handshake::Rejected(data) => {
            let status = StatusCode::from_u16(handshake::frame_status(&data)).unwrap_or(StatusCode::OK);
            let outcome = classify::classify(status, &parts.headers, &data, rules, now());
            let mut error = http::Response::new(());
            *error.status_mut() = if status.is_success() { StatusCode::BAD_GATEWAY } else { status };
            error.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
            Attempt::Failure(outcome, Some((error.into_parts().0, data)))
        }
        Handshake::Empty => {
            let note = b"empty stream: the upstream ended the stream before any content";
            Attempt::Failure(classify::classify(StatusCode::OK, &parts.headers, note, rules, now()), None)
        }
        Handshake::Broken(detail) => {
            let failure = TransportFailure::Connection(format!("stream broke before any content: {detail}"));
            Attempt::Failure(classify::classify_transport(&failure), None)
        }
    }
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
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
