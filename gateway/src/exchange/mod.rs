//! One request's owner, from arrival to its last byte.
//!
//! An [`Exchange`] is made when a request arrives and moves, whole, into
//! whatever ends the request: tidegate's own refusal, the answer the
//! attempt loop produced, or the response body ([`body::ExchangeBody`])
//! that relays a stream, keeps a waiting stream alive, or continues a
//! broken one. It holds the request's id, arrival and deadline, its place
//! in its key's lane, the upstream slot of the answer being relayed, and
//! the record of what happened; it starts every run of the attempt loop
//! (the first answer, after a keep-alive commit, a continuation) through
//! the same path, and it is the one place a request is reported — once,
//! with an honest outcome. Dropped unfinished, it records the request as
//! cancelled (the client went away).

pub mod body;
pub mod route;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::Response;
use http::{HeaderValue, header};
use tokio::time::Instant;

use crate::anomaly::Volume;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::headers;
use crate::lanes::Pass;
use crate::limits::Permit;
use crate::protocol::Endpoint;
use crate::protocol::{self, Protocol};
use crate::record::Outcome;
use crate::relay::progress::Progress;
use crate::relay::{self, Answer, Job, Relayed};
use crate::report::{Report, Sink};
use crate::stream::resume::Reopened;
use crate::stream::{End, RelayBody};
use body::ExchangeBody;

/// Continuations per request when `stream_resume` is on.
pub const MAX_RESUMES: u8 = 2;

/// A run of the attempt loop, owned (it may outlive the handler): gives
/// the job back with what happened.
pub type Running = Pin<Box<dyn Future<Output = (Job, Relayed)> + Send>>;

/// Why a continuation did not start.
#[derive(Debug, thiserror::Error)]
pub enum NotReopened {
    /// The continuation's answer was not a stream.
    #[error("the continuation was not a stream")]
    NotAStream,
    /// The upstream refused it (status, its answer in one line).
    #[error("the continuation was answered {0}: {1}")]
    Answered(u16, String),
    /// tidegate's own answer (deadline, no target left, …).
    #[error(transparent)]
    Gateway(GatewayError),
}

/// One request from arrival to its last byte (see the module doc).
pub struct Exchange {
    /// What happened so far; written out once, at the end.
    report: Report,
    sink: Arc<Sink>,
    /// The routed request, kept only for an answer that may still ask for
    /// a continuation (boxed: that is rare, and every request's exchange
    /// lives in its futures and body).
    job: Option<Box<Job>>,
    /// The place in the key's lane, held to the last byte.
    pass: Option<Pass>,
    /// The slot of the answer being relayed, held to its last byte.
    permit: Option<Permit>,
    done: bool,
}

impl Exchange {
    /// A request that just arrived (`headers`: the client's, which say
    /// what program sent it): counted in flight (a graceful shutdown waits
    /// for it) until it is reported.
    pub fn arrive(id: uuid::Uuid, arrived: Instant, sink: Arc<Sink>, headers: &http::HeaderMap) -> Self {
        sink.active.fetch_add(1, Ordering::AcqRel);
        let mut report = Report::new(id, arrived);
        report.agent = crate::client::Client::recognise(headers);
        Self { report, sink, job: None, pass: None, permit: None, done: false }
    }

    /// The request's id.
    pub fn id(&self) -> uuid::Uuid {
        self.report.id
    }

    /// A model endpoint's request from its arrival to the answer's head,
    /// every step owned by one exchange: admission ([`crate::admission`]:
    /// the key, the body), routing ([`route`]), the client's volume
    /// checked against its baseline, the attempt loop — and, for a stream
    /// still waiting after `stream_keepalive_after`, the head committed
    /// with keep-alive comments while the loop goes on in the body — then
    /// the answer (`reframe` last: a Gemini stream re-framed as a JSON
    /// array). `headers`: the client's (a Gemini key in the query moved
    /// in), `named`: a model named in the path (Gemini).
    ///
    /// One future for all of it, not one per step: a future awaited in
    /// another is kept in it whole, and the request's is the one a
    /// connection holds while the request is served.
    #[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
    pub fn serve(
        gw: Arc<Gateway>,
        endpoint: Endpoint,
        headers: http::HeaderMap,
        body: impl crate::admission::body::ClientBody,
        named: Option<String>,
        reframe: fn(Response) -> Response,
    ) -> impl Future<Output = Response> + Send {
        async move {
            let protocol = endpoint.protocol();
            // One clock read for the request's arrival: its report,
            // deadline, lane and volume count all start from it.
            let mut exchange = Exchange::arrive(crate::request_id::next(), Instant::now(), gw.sink.clone(), &headers);
            if gw.draining.load(Ordering::Acquire) {
                // Shutting down: an honest 503 at once.
                crate::admission::body::discard(body, &headers, gw.config.body_timeout).await;
                return exchange.reject(GatewayError::ShuttingDown, protocol);
            }
            let body = match crate::admission::admit(&gw, &headers, body).await {
                Ok((client, body)) => {
                    exchange.report.client = client;
                    body
                }
                Err(error) => return exchange.reject(error, protocol),
            };
            // The job is moved into the loop: scoped, so its room in this
            // future ends there.
            let (mut running, keepalive) = {
                let mut asked = route::Asked::default();
                let client = exchange.report.client.clone();
                let started = exchange.report.started;
                let routed =
                    route::route(&gw, endpoint, named, headers, body, client.as_deref(), started, &mut asked).await;
                exchange.asked(asked);
                let mut job = match routed {
                    Ok(route::Routed::Relay(job)) => job,
                    Ok(route::Routed::Estimate(tokens)) => return exchange.estimate(tokens, protocol),
                    Err(error) => return exchange.reject(error, protocol),
                };
                exchange.observe_volume(&gw, &mut job);
                let after = match job.head.stream && protocol.keeps_alive_with_comments() {
                    true => gw.config.stream_keepalive_after,
                    false => None,
                };
                let keepalive = after.map(|after| (after, job.progress.clone()));
                (exchange.start(job), keepalive)
            };
            let ran = match keepalive {
                Some((after, progress)) => {
                    tokio::select! {
                        ran = &mut running => ran,
                        () = tokio::time::sleep(after) => {
                            return reframe(exchange.commit_waiting(&gw, protocol, running, progress));
                        }
                    }
                }
                None => running.await,
            };
            let answer = exchange.absorb(ran);
            reframe(exchange.respond(answer, protocol))
        }
    }

    /// Takes in what routing learned of the request (also when it refused
    /// it): the model, whether it streams, its protocol, its trace.
    fn asked(&mut self, asked: route::Asked) {
        self.report.model = asked.model;
        self.report.stream = asked.stream;
        self.report.protocol = asked.protocol;
        self.report.trace = asked.trace;
    }

    /// The client's volume against its own baseline: a flood is recorded,
    /// warned about once, and — with an `anomaly_action` — this request
    /// already goes at the penalty's priority.
    fn observe_volume(&mut self, gw: &Gateway, job: &mut Job) {
        let Volume::Flood { first, count, baseline } = gw.anomaly.observe(&job.who.name, self.report.started) else {
            return;
        };
        self.report.anomaly = true;
        let penalised = job.lane.as_ref().is_some_and(|lane| lane.flagged(Instant::now()));
        if let (true, Some(lane)) = (penalised, &job.lane) {
            job.who = lane.who(Some(job.who.priority), Instant::now());
        }
        if first {
            gw.sink.metrics.anomaly(&job.who.name);
            tracing::warn!(client = %job.who.name, count, baseline, penalised, "request volume far above this client's baseline");
        }
    }

    /// The loop is still waiting after `stream_keepalive_after`: commit 200
    /// and SSE headers now, and let the body own the rest of the request.
    fn commit_waiting(
        mut self,
        gw: &Gateway,
        protocol: Protocol,
        running: Running,
        progress: Arc<Progress>,
    ) -> Response {
        self.report.status = 200;
        let id = self.report.id;
        let attempts = progress.attempts() as usize;
        let body = ExchangeBody::waiting(self, running, gw.config.stream_keepalive_every, progress, protocol);
        let mut response = Response::new(axum::body::Body::new(body));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers::label(headers, id, None, attempts);
        response
    }

    /// Starts a run of the attempt loop on the routed request. Every run
    /// goes this way; [`Exchange::absorb`] takes its result (and the
    /// request back).
    fn start(&mut self, job: Job) -> Running {
        Box::pin(relay::relay(job))
    }

    /// Takes what a run of the loop did into the record; returns its
    /// answer.
    pub fn absorb(&mut self, (job, relayed): (Job, Relayed)) -> Answer {
        if let Answer::Stream(_, body) = &relayed.answer
            && body.may_be_continued()
            && job.gw.config.route(job.route).is_some_and(|(_, route)| route.stream_resume)
        {
            self.job = Some(Box::new(job));
        }
        self.report.upstream = relayed.upstream;
        self.report.attempts.extend(relayed.attempts);
        self.report.queue_wait += relayed.queue_wait;
        self.report.class = relayed.answer.class();
        if relayed.pass.is_some() {
            self.pass = relayed.pass;
        }
        self.permit = relayed.permit;
        if relayed.dropped.is_some() {
            self.report.dropped = relayed.dropped;
        }
        relayed.answer
    }

    /// The client still waits for headers: answer it with the loop's
    /// answer (a 2xx is relayed by an [`ExchangeBody`] that takes this
    /// exchange; anything else is final, and reported now).
    pub fn respond(mut self, answer: Answer, protocol: Protocol) -> Response {
        let (id, attempts, upstream) = (self.report.id, self.report.attempts.len(), self.report.upstream);
        match answer {
            Answer::Stream(mut parts, mut body) => {
                self.report.status = parts.status.as_u16();
                headers::label(&mut parts.headers, id, self.sink.name(upstream), attempts);
                self.keep_for(&mut body);
                Response::from_parts(parts, axum::body::Body::new(ExchangeBody::relaying(self, body)))
            }
            other => {
                let outcome = match &other {
                    Answer::Gateway(GatewayError::QueueFull { .. } | GatewayError::ClientLimit { .. }) => {
                        Outcome::Rejected
                    }
                    // tidegate's own account of a failure, or the
                    // upstream's own error passed on: the request failed.
                    Answer::Gateway(_) | Answer::Verbatim { .. } | Answer::Stream(..) => Outcome::Failed,
                };
                if let Answer::Gateway(error) = &other {
                    self.report.error = Some(error.to_string());
                }
                let mut response = other.into_response_for(protocol, self.report.agent);
                self.report.status = response.status().as_u16();
                headers::label(response.headers_mut(), id, self.sink.name(upstream), attempts);
                self.finish(outcome);
                response
            }
        }
    }

    /// tidegate answers itself: a `count_tokens` estimate (header
    /// `x-tidegate-estimate` says how it was made), reported completed.
    pub fn estimate(mut self, tokens: u64, protocol: Protocol) -> Response {
        self.report.status = 200;
        self.report.usage.input = Some(tokens);
        let id = self.report.id;
        self.finish(Outcome::Completed);
        let body = match protocol {
            Protocol::Gemini => serde_json::json!({"totalTokens": tokens}),
            _ => serde_json::json!({"input_tokens": tokens}),
        }
        .to_string();
        let mut response = Response::new(axum::body::Body::from(body));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(headers::ESTIMATE, HeaderValue::from_static("characters/4"));
        headers::label(headers, id, None, 0);
        response
    }

    /// tidegate refuses the request before any attempt (admission,
    /// routing, draining): its answer in the client's protocol, reported
    /// now. Refusals before routing beyond the flood sample are counted
    /// only (see [`crate::flood`]).
    pub fn reject(mut self, error: GatewayError, protocol: Protocol) -> Response {
        self.report.status = error.status().as_u16();
        self.report.error = Some(error.to_string());
        if let GatewayError::Unauthorized | GatewayError::Forbidden(_) = &error {
            self.report.counted_only = !self.sink.refused(error.reason());
        }
        let close = matches!(error, GatewayError::ShuttingDown);
        let (id, agent) = (self.report.id, self.report.agent);
        self.finish(Outcome::Rejected);
        let mut response = error.into_response_for(protocol, agent);
        headers::label(response.headers_mut(), id, None, 0);
        if close {
            // Shutting down: no keep-alive, so the client goes to another
            // replica.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// Lets a stream ask for continuations when its route allows them
    /// (the request was kept by [`Exchange::absorb`] for that); lets the
    /// request go otherwise (its body can be large, and an answer can
    /// stream for minutes).
    fn keep_for(&mut self, body: &mut RelayBody) {
        if let Some(job) = &self.job {
            body.allow_resumes(MAX_RESUMES, job.deadline);
        }
        if !body.may_resume() {
            self.job = None;
        }
    }

    /// Starts a continuation of a stream that broke after delivering
    /// `text`: the same request with that text as the assistant's turn,
    /// run through the same attempt loop ([`relay::relay`]). `None` when
    /// the protocol cannot continue this request.
    pub fn reopen(&mut self, text: &str) -> Option<Running> {
        let job = self.job.as_ref()?;
        let protocol = job.endpoint.protocol();
        let body = protocol.continuation_body(&job.body, text, &job.head.model)?;
        let head = protocol::peek(&body).ok()?;
        let mut next = Job::clone(job);
        next.body = body;
        next.head = head;
        // Still the same request: its lane pass is held by this exchange.
        next.lane = None;
        next.progress = Arc::default();
        Some(Box::pin(relay::relay(next)))
    }

    /// Takes what a continuation's run did into the record: a stream that
    /// started is handed over (its slot replaces the broken one's), any
    /// other answer is why resuming failed.
    pub fn reopened(&mut self, (_, relayed): (Job, Relayed)) -> Result<Reopened, NotReopened> {
        self.report.attempts.extend(relayed.attempts);
        self.report.queue_wait += relayed.queue_wait;
        match relayed.answer {
            Answer::Stream(_, body) => {
                let reopened = body.into_continuation().ok_or(NotReopened::NotAStream)?;
                self.report.upstream = Some(reopened.upstream.0);
                self.permit = relayed.permit;
                Ok(reopened)
            }
            Answer::Verbatim { parts, body, .. } => {
                Err(NotReopened::Answered(parts.status.as_u16(), crate::classify::summary::summarize(&body)))
            }
            Answer::Gateway(error) => Err(NotReopened::Gateway(error)),
        }
    }

    /// The first byte of the answer went out.
    pub fn first_byte(&mut self) {
        if self.report.ttfb.is_none() {
            self.report.ttfb = Some(self.report.started.elapsed());
        }
    }

    /// The answer's body ended (completed, or incomplete): settles the
    /// slot's tokens with the usage and reports the request.
    pub fn ended(&mut self, end: End) {
        let used = end.usage.total();
        if let Some(mut permit) = self.permit.take() {
            permit.settle(used);
        }
        self.report.usage = end.usage;
        self.report.completion_from = end.completion_from;
        if end.partial.is_some() {
            self.report.partial = end.partial;
        }
        if end.class.is_some() {
            self.report.class = end.class;
        }
        self.report.error = end.error.or(self.report.error.take());
        self.end(end.outcome);
    }

    /// The client went away mid-answer after this much was delivered.
    pub fn cut(&mut self, usage: crate::record::Usage, partial: Option<String>) {
        self.report.usage = usage;
        if partial.is_some() {
            self.report.partial = partial;
        }
    }

    /// Reports the request with `outcome`.
    pub fn finish(mut self, outcome: Outcome) {
        self.end(outcome);
    }

    /// The one place a request is reported.
    fn end(&mut self, outcome: Outcome) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(mut pass) = self.pass.take() {
            pass.settle(self.report.usage.total());
        }
        self.permit = None;
        self.job = None;
        let fresh = Report::new(self.report.id, self.report.started);
        let report = std::mem::replace(&mut self.report, fresh);
        report.write(outcome, &self.sink);
        self.sink.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Nobody saw the end: the client went away (hyper dropped the
        // handler or the body) before it came.
        self.end(Outcome::Cancelled);
    }
}
