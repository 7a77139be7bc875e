//! The attempt loop: from a routed request to the answer the client gets.
//!
//! Plain async code, one named step per phase of an attempt:
//!
//! ```text
//! pick target ─► acquire slot ─► send ─► classify ─► feed back ─► decide
//!      ▲                                                            │
//!      └──────────── wait (hint, rule, backoff) / next target ◄─────┘
//! ```
//!
//! One attempt — sending, and reading what came back into an answer or
//! a classified failure — is `attempt.rs`; which target, and what is sent
//! to it, `targets.rs`; the give-up answers, `answer.rs`. Waiting ends the moment the client
//! goes away: hyper drops this future, and with it the sleep and any
//! upstream call. A stream continuation (`stream_resume`) is one more run
//! of this same loop, asked for by the request's owner
//! ([`crate::exchange`]).

mod answer;
mod attempt;
pub mod progress;
mod targets;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::time::Instant;

pub use answer::Answer;

use crate::classify::{Class, Classified, advertised};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::ids::{RouteId, TargetId, UpstreamId};
use crate::lanes::{Lane, Pass};
use crate::limits::{Permit, Refused, Who};
use crate::protocol::{Endpoint, RequestHead};
use crate::record::{AttemptLog, Verdict, WaitSource};
use crate::retry::{self, Decision, GiveUp, Situation};
use crate::translate;
use crate::upstream::Upstream;
use attempt::{Attempt, attempt};
use progress::Progress;
use targets::{Pick, Sent, Targets};

/// Token estimate for a request without `max_tokens` (rate limits).
const DEFAULT_MAX_TOKENS: u64 = 1024;

/// One routed request, owned by the attempt loop while it runs (the loop
/// can outlive the handler: a committed keep-alive stream polls it in its
/// body) and given back to the request's owner when it ends.
#[derive(Clone)]
pub struct Job {
    /// Shared gateway state.
    pub gw: Arc<Gateway>,
    /// The endpoint asked (its protocol shapes tidegate's own answers).
    pub endpoint: Endpoint,
    /// Index of the alias in `config.models`.
    pub route: RouteId,
    /// `model`/`stream` and the model's byte span.
    pub head: RequestHead,
    /// The client's body, untouched.
    pub body: Bytes,
    /// The client's headers (forwarded except credentials and hop-by-hop).
    pub client_headers: HeaderMap,
    /// When the request must be answered.
    pub deadline: Instant,
    /// Another tidegate in front retries; this one makes one attempt.
    pub chained: bool,
    /// Where the loop stands (for keep-alive comments).
    pub progress: Arc<Progress>,
    /// The client key as the queues see it: name, weight, priority.
    pub who: Who,
    /// The key's lane, entered before the first attempt (`None`: no
    /// client keys, or a continuation of a request already in it).
    pub lane: Option<Arc<Lane>>,
    /// Its trace (ids, attempt times), when `otel` is configured.
    pub trace: Option<Arc<crate::otel::TraceCtx>>,
    /// The upstream that stores the state this request continues
    /// (`previous_response_id`): the only one it may go to.
    pub pin: Option<UpstreamId>,
    /// Its conversation and the target that holds its prompt cache, when
    /// the alias keeps sessions where they were (`affinity: session`).
    pub session: Option<Arc<crate::affinity::Session>>,
    /// Whose what this request makes tidegate keep is (its key's, or its
    /// group's; `None` without client keys).
    pub owner: crate::kept::Owner,
}

/// The client's answer and how it came about.
pub struct Relayed {
    /// What to send the client.
    pub answer: Answer,
    /// The upstream that gave the final answer, if any.
    pub upstream: Option<UpstreamId>,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptLog>,
    /// Time spent waiting for slots and rate buckets (the key's lane's
    /// included).
    pub queue_wait: Duration,
    /// The request's place in its key's lane, held until its last byte.
    pub pass: Option<Pass>,
    /// The upstream slot of a 2xx answer, held until its last byte.
    pub permit: Option<Permit>,
    /// What translation left out of the request that was answered.
    pub dropped: Option<String>,
}

impl Relayed {
    /// tidegate's own answer, before any attempt.
    fn gateway(error: GatewayError) -> Self {
        Relayed {
            answer: Answer::Gateway(error),
            upstream: None,
            attempts: Vec::new(),
            queue_wait: Duration::ZERO,
            pass: None,
            permit: None,
            dropped: None,
        }
    }
}

/// An answer that says a subscription window is used up benches its
/// account until the reset is near (probed as any bench: the reset is a
/// projection, not a promise); a shorter wait holds it as a provider's
/// wait does.
fn used_up(upstream: &Upstream) {
    let now = Instant::now();
    let Some(left) = upstream.limiter.windows().exhausted(now) else { return };
    let reset = jiff::SignedDuration::try_from(left).ok().and_then(|d| jiff::Timestamp::now().checked_add(d).ok());
    let summary = format!("its subscription window is used up; it resets in {}s", left.as_secs());
    let failure = crate::health::Failure {
        class: Class::Capacity,
        hint: Some(left),
        reset,
        summary: &summary,
        model_scoped: false,
    };
    upstream.health.on_failure(&failure, now);
}

/// Tokens a request reserves from tpm buckets before its usage is known.
fn tokens_of(job: &Job) -> u64 {
    if job.endpoint.spends_tokens() {
        // Client-supplied: added without overflow (the limiters then bound
        // it by what their buckets hold).
        job.head.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).saturating_add(job.body.len() as u64 / 4)
    } else {
        0
    }
}

/// Enters the client key's lane, then runs attempts across the alias's
/// targets until success, a final error, or the deadline; gives the job
/// back with the result.
///
/// Not an `async fn`: one keeps each argument twice in its future, the
/// argument and the local it is moved into, and this future is boxed and
/// resident for every request in flight.
#[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
pub fn relay(job: Job) -> impl Future<Output = (Job, Relayed)> + Send {
    async move {
        let relayed = in_lane(&job).await;
        (job, relayed)
    }
}

/// The key's lane (when it has one), then the attempts.
async fn in_lane(job: &Job) -> Relayed {
    let Some(lane) = job.lane.clone() else { return attempts(job).await };
    let started = Instant::now();
    let entered = tokio::select! {
        biased;
        entered = lane.enter(&job.who, job.route, tokens_of(job), job.deadline) => entered,
        () = job.gw.closing.cancelled() => Err(GatewayError::ShuttingDown),
    };
    let in_lane = started.elapsed();
    match entered {
        Ok(pass) => {
            let mut relayed = attempts(job).await;
            relayed.queue_wait += in_lane;
            relayed.pass = Some(pass);
            relayed
        }
        Err(error) => Relayed {
            answer: Answer::Gateway(error),
            upstream: None,
            attempts: Vec::new(),
            queue_wait: in_lane,
            pass: None,
            permit: None,
            dropped: None,
        },
    }
}

/// The attempt loop proper (borrowing the job [`relay`] owns: one copy
/// of it in the request's future).
async fn attempts(job: &Job) -> Relayed {
    let Some((_, route)) = job.gw.config.route(job.route) else {
        return Relayed::gateway(GatewayError::UnknownModel("model has no usable target".into()));
    };
    let mut run = Run {
        job,
        targets: Targets::new(&job.gw, route, job.endpoint, (job.pin, job.who.priority), job.session.as_deref()),
        started: Instant::now(),
        attempts: Vec::new(),
        queue_wait: Duration::ZERO,
        last: None,
        refused: None,
        via: None,
    };
    let tokens = tokens_of(job);
    loop {
        let (ti, now) = match run.pick().await {
            Ok(picked) => picked,
            Err(stop) => return stop,
        };
        // A target whose protocol cannot say this request is left out
        // before it takes a slot; the request goes on with the others.
        let sent = match run.targets.sent(ti, job) {
            Ok(sent) => sent,
            Err(why) => {
                run.refuse(ti, why);
                continue;
            }
        };
        // In a pool, the account that gave the slot.
        let picked = now;
        let (ti, mut permit) = match run.acquire(ti, tokens, now).await {
            Ok(acquired) => acquired,
            Err(stop) => return stop,
        };
        // Benched while this request waited for its slot (the request
        // ahead met "no plan"): the slot goes back, the pick again.
        if run.targets.benched_after(ti, picked) {
            permit.settle(0);
            drop(permit);
            continue;
        }
        let back = sent.back.clone();
        run.via = back.as_ref().map(|b| b.target.name());
        let (outcome, buffered) = match run.send(ti, sent).await {
            Attempt::Success(answer) => return run.succeed(ti, answer, permit, back.as_deref()),
            Attempt::Failure(outcome, buffered) => (outcome, buffered),
            // The deadline, not the upstream, ended it: nothing to learn
            // about the upstream (no breaker, cooldown or limit change).
            Attempt::Ended(outcome) => {
                drop(permit);
                run.log(ti, &outcome, &Decision::GiveUp(GiveUp::DeadlinePassed));
                return run.give_up(ti, GiveUp::DeadlinePassed, &outcome, None);
            }
        };
        // Give the slot back before any wait: others may use it meanwhile.
        // A refused attempt generated nothing: its token estimate comes
        // back whole (a retried request reserves again for its next try).
        permit.settle(0);
        if let Some((parts, _)) = &buffered {
            permit.observe(&advertised::read(&parts.headers, jiff::Timestamp::now), run.targets.model(ti, run.job));
        }
        // What the answer says of the upstream first (a lowered limit, a
        // bench), then the slot: a request waiting for it sees the news.
        if outcome.class == Class::Capacity && outcome.concurrency {
            permit.refused_for_concurrency();
        }
        run.feed_back(ti, &outcome);
        drop(permit);
        let decision = run.decide(ti, &outcome);
        run.log(ti, &outcome, &decision);
        if let Err(stop) = run.act(ti, decision, &outcome, buffered).await {
            return stop;
        }
        run.last = Some((outcome, ti));
    }
}

pin_project_lite::pin_project! {
    /// A wait that ends early (`None`) when the shutdown grace ends; `wait`
    /// is polled first. A type rather than an `async fn` around `select!`:
    /// that held `wait` twice, as its argument and in the select, and the
    /// limiter's wait is a kilobyte of every request in flight.
    struct UnlessClosing<'a, F> {
        #[pin]
        wait: F,
        #[pin]
        closing: tokio_util::sync::WaitForCancellationFuture<'a>,
    }
}

impl<F: Future> Future for UnlessClosing<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        if let std::task::Poll::Ready(out) = this.wait.poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        this.closing.poll(cx).map(|()| None)
    }
}

/// One request's walk through the loop: what was tried and waited.
struct Run<'a> {
    job: &'a Job,
    targets: Targets<'a>,
    started: Instant,
    attempts: Vec<AttemptLog>,
    queue_wait: Duration,
    /// The last failure and its target, for a give-up before any attempt.
    last: Option<(Classified, TargetId)>,
    /// Why the last target left out for its protocol could not take the
    /// request: the answer when no target could.
    refused: Option<String>,
    /// The protocol the current attempt is sent in, when translated.
    via: Option<&'static str>,
}

impl<'a> Run<'a> {
    fn upstream(&self, ti: TargetId) -> &Upstream {
        &self.job.gw.upstreams[self.targets.upstream(ti)]
    }

    /// Runs `wait` unless the shutdown grace ends first (`None`).
    fn unless_closing<F: Future>(&self, wait: F) -> UnlessClosing<'a, F> {
        UnlessClosing { wait, closing: self.job.gw.closing.cancelled() }
    }

    /// The answer to a request still waiting when the shutdown grace ends.
    fn closed(&mut self, ti: TargetId) -> Relayed {
        self.stop(Answer::Gateway(GatewayError::ShuttingDown), Some(ti))
    }

    fn stop(&mut self, answer: Answer, ti: Option<TargetId>) -> Relayed {
        Relayed {
            answer,
            upstream: ti.map(|ti| self.targets.upstream(ti)),
            attempts: std::mem::take(&mut self.attempts),
            queue_wait: self.queue_wait,
            pass: None,
            permit: None,
            dropped: None,
        }
    }

    /// Leaves out a target that cannot be sent this request in its
    /// protocol, keeping the reason.
    fn refuse(&mut self, ti: TargetId, why: crate::protocol::turn::Refusal) {
        let upstream = self.upstream(ti);
        tracing::debug!(upstream = %upstream.config.name, %why, "request not translatable for this target");
        self.refused = Some(format!(
            "this request cannot be translated for upstream {} ({}): {why}",
            upstream.config.name, upstream.config.protocol
        ));
        self.targets.exclude(ti);
    }

    /// Act on the decision about a failed attempt on `ti`: wait and try
    /// again, leave the target, fail over, requeue — or give up (`Err`,
    /// with the answer; `buffered` is the upstream's own, verbatim).
    async fn act(
        &mut self,
        ti: TargetId,
        decision: Decision,
        outcome: &Classified,
        buffered: Option<(http::response::Parts, Bytes)>,
    ) -> Result<(), Relayed> {
        let name = &self.upstream(ti).config.name;
        match decision {
            Decision::Retry { wait, source } => {
                let upstream = self.upstream(ti);
                tracing::debug!(upstream = %upstream.config.name, class = outcome.class.as_str(), ?wait, source = source.as_str(), "retrying");
                let go = match source {
                    // A blind retry takes its place in the budget's schedule.
                    WaitSource::Backoff | WaitSource::Budget => upstream.budget.reserve(Instant::now() + wait),
                    WaitSource::Provider(_) | WaitSource::Rule => Instant::now() + wait,
                };
                if self.unless_closing(tokio::time::sleep_until(go)).await.is_none() {
                    return Err(self.closed(ti));
                }
            }
            Decision::LeaveTarget => {
                tracing::debug!(upstream = %name, "attempts used here: trying the other targets");
                self.targets.exclude(ti);
            }
            Decision::NextTarget => {
                tracing::debug!(upstream = %name, class = outcome.class.as_str(), "failing over");
            }
            Decision::Requeue => tracing::debug!(upstream = %name, "concurrency refusal: back in the queue"),
            Decision::GiveUp(why) => return Err(self.give_up(ti, why, outcome, buffered)),
        }
        Ok(())
    }

    /// Pick: the target for the next attempt. A provider's hold is waited
    /// out within the deadline; every breaker open fails fast.
    async fn pick(&mut self) -> Result<(TargetId, Instant), Relayed> {
        loop {
            let now = Instant::now();
            let (why, fallback, target) = match self.targets.pick(now) {
                Pick::Use(ti) => return Ok((ti, now)),
                // The provider asked for nothing before `until`: wait for
                // it within the deadline, else say so at once with that wait.
                Pick::HoldUntil(until, held) if until < self.job.deadline => {
                    if self.unless_closing(tokio::time::sleep_until(until)).await.is_none() {
                        return Err(self.closed(held));
                    }
                    continue;
                }
                Pick::HoldUntil(until, held) => {
                    let wait = until.saturating_duration_since(Instant::now());
                    let why = GiveUp::BeyondDeadline { wait, source: WaitSource::Provider("retry-after") };
                    (why, answer::held_off(), Some(held))
                }
                // Every target left is broken: fail fast, saying when the
                // first probe is due, rather than queueing behind a breaker.
                Pick::WaitUntil(until, open) => {
                    let wait = until.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
                    let benched = self.targets.benched();
                    if benched.is_empty() {
                        (GiveUp::BreakerOpen { wait }, answer::breakers_open(), Some(open))
                    } else {
                        (GiveUp::Benched { wait }, answer::benched(&self.job.gw, &benched), Some(open))
                    }
                }
                Pick::NoneLeft => (GiveUp::BreakerOpen { wait: Duration::from_secs(1) }, answer::breakers_open(), None),
            };
            // No target could be sent the request in its protocol: that
            // is the client's request, refused with the field named.
            if self.last.is_none()
                && matches!(why, GiveUp::BreakerOpen { .. } | GiveUp::Benched { .. })
                && target.is_none()
                && let Some(refused) = self.refused.take()
            {
                return Err(self.stop(Answer::Gateway(GatewayError::BadRequest(refused)), None));
            }
            // The account names the last target that failed, else the one
            // the pick was about.
            return Err(match (self.last.take(), target) {
                (Some((outcome, ti)), _) => self.give_up(ti, why, &outcome, None),
                (None, Some(ti)) => self.give_up(ti, why, &fallback, None),
                (None, None) => {
                    let error = GatewayError::UnknownModel("no target of this model can take the request".into());
                    self.stop(Answer::Gateway(error), None)
                }
            });
        }
    }

    /// Acquire: wait for the upstream's rate buckets and a concurrency
    /// slot. Returns the target that gave it, the permit and when.
    ///
    /// A pool's account without a free slot does not make the request wait
    /// for that account alone: it waits for every account of the pool that
    /// can serve at once (in each one's fair queue) and takes the first
    /// slot any of them frees; the target returned is that account's.
    async fn acquire(&mut self, ti: TargetId, tokens: u64, now: Instant) -> Result<(TargetId, Permit), Relayed> {
        let gw = &self.job.gw;
        self.job.progress.attempt(self.targets.upstream(ti));
        let alone = self.targets.has_room(ti) || self.targets.staying(ti);
        // A lone target (the common case) needs no list of members.
        let pooled = if alone { None } else { Some(self.targets.pool_of(ti, now)) };
        let (who, deadline) = (&self.job.who, self.job.deadline);
        let single = match pooled.as_deref() {
            None => Some(ti),
            Some(&[only]) => Some(only),
            Some(_) => None,
        };
        let several = pooled.as_ref().is_some_and(|m| m.len() > 1);
        let acquired = if let Some(only) = single {
            let limiter = &gw.upstreams[self.targets.upstream(only)].limiter;
            let model = self.targets.model(only, self.job);
            self.unless_closing(limiter.acquire_for(model, who, tokens, deadline)).await.map(|r| (only, r))
        } else {
            let mut members = pooled.unwrap_or_default();
            loop {
                let waits = members
                    .iter()
                    .map(|&m| {
                        let limiter = &gw.upstreams[self.targets.upstream(m)].limiter;
                        let model = self.targets.model(m, self.job);
                        Box::pin(limiter.acquire_for(model, who, tokens, deadline)) as Acquiring<'_>
                    })
                    .collect();
                let got = self.unless_closing(first_slot(waits)).await.map(|(k, r)| (members[k], r));
                // An account benched (or broken) while the request waited
                // for it gives its slot back; the wait goes on for the rest.
                if let Some((m, Ok(_))) = &got
                    && !self.targets.serving(*m, Instant::now())
                {
                    members = self.targets.pool_of(ti, Instant::now());
                    members.retain(|k| k != m);
                    if !members.is_empty() {
                        continue;
                    }
                }
                break got;
            }
        };
        self.targets.arrived();
        let Some((ti, acquired)) = acquired else { return Err(self.closed(ti)) };
        let index = self.targets.upstream(ti);
        let upstream = &gw.upstreams[index];
        if self.targets.first_use(ti) {
            upstream.budget.record_request(now);
        }
        if several {
            self.job.progress.attempt(index);
        }
        match acquired {
            Ok(permit) => {
                self.queue_wait += Instant::now().saturating_duration_since(now);
                Ok((ti, permit))
            }
            Err(refused) => {
                let error = answer::refused(upstream, refused, self.attempts.len(), self.started.elapsed());
                Err(self.stop(Answer::Gateway(error), Some(ti)))
            }
        }
    }

    /// Send and classify: one attempt on target `ti`.
    async fn send(&mut self, ti: TargetId, sent: Sent) -> Attempt {
        let index = self.targets.upstream(ti);
        let model = self.targets.model(ti, self.job);
        attempt(self.job, index, &self.job.gw.upstreams[index], (sent, model)).await
    }

    /// The attempt succeeded: its answer goes to the client, holding the
    /// slot until its last byte.
    fn succeed(
        &mut self,
        ti: TargetId,
        mut answer: Answer,
        mut permit: Permit,
        back: Option<&translate::Back>,
    ) -> Relayed {
        let upstream = self.upstream(ti);
        if let Answer::Stream(parts, _) | Answer::Verbatim { parts, .. } = &answer {
            permit.observe(&advertised::read(&parts.headers, jiff::Timestamp::now), self.targets.model(ti, self.job));
        }
        upstream.limiter.on_success(permit.level());
        upstream.health.on_success();
        used_up(upstream);
        let index = self.targets.upstream(ti);
        if let Some(session) = &self.job.session {
            // The conversation's prompt is cached here now (renewed).
            self.job.gw.sessions.remember(&self.job.owner, &session.key, index);
        }
        self.attempts.push(AttemptLog { protocol: self.via, ..AttemptLog::ok(index) });
        let dropped = back.and_then(|b| b.dropped.clone());
        match &mut answer {
            Answer::Stream(parts, body) => {
                if let Some(back) = back {
                    translate::declare(back, &mut parts.headers);
                }
                if self.job.endpoint == Endpoint::Responses
                    && self.job.head.store != Some(false)
                    && let Some(id) = body.response_id()
                {
                    self.job.gw.pins.remember(&self.job.owner, &id, index);
                }
                let mut relayed = self.stop(answer, Some(ti));
                relayed.permit = Some(permit);
                relayed.dropped = dropped;
                return relayed;
            }
            Answer::Verbatim { .. } | Answer::Gateway(_) => permit.settle(0),
        }
        let mut relayed = self.stop(answer, Some(ti));
        relayed.dropped = dropped;
        relayed
    }

    /// Feed back: the one place a failed attempt's outcome reaches the
    /// upstream's health, its learned limit, the other replicas and this
    /// request's view of its targets.
    fn feed_back(&mut self, ti: TargetId, outcome: &Classified) {
        let index = self.targets.upstream(ti);
        let gw = &self.job.gw;
        let upstream = &gw.upstreams[index];
        let now = Instant::now();
        let failure = crate::health::Failure {
            class: outcome.class,
            hint: outcome.hints.retry_after,
            reset: outcome.hints.projected_reset,
            summary: &outcome.summary,
            model_scoped: outcome.model_scoped,
        };
        upstream.health.on_failure(&failure, now);
        if let (Some(shared), Some((kind, left))) = (&upstream.shared, upstream.health.announcement(now))
            && shared.is_up()
            && left >= Duration::from_millis(500)
        {
            let (shared, name) = (shared.clone(), upstream.config.name.clone());
            gw.tasks.spawn(async move { shared.announce(&name, kind, left).await });
        }
        if matches!(outcome.class, Class::Auth | Class::Entitlement) {
            self.targets.exclude(ti);
        }
        self.targets.failed(ti, outcome.class, &outcome.summary);
    }

    /// Decide: the retry policy's verdict on this failure (pure; the
    /// situation is gathered here).
    fn decide(&self, ti: TargetId, outcome: &Classified) -> Decision {
        let upstream = self.upstream(ti);
        let now = Instant::now();
        retry::decide(&Situation {
            outcome,
            attempts: self.attempts.len() as u32 + 1,
            target_attempts: self.targets.attempts_on(ti),
            policy: &self.job.gw.config.retry,
            remaining: self.job.deadline.saturating_duration_since(now),
            budget_wait: upstream.budget.wait(now),
            chained: self.job.chained,
            other_target_ready: self.targets.other_ready(ti, now),
            other_target_left: self.targets.other_left(ti),
            others_in_flight: upstream.limiter.in_flight() > 0,
            jitter: fastrand::f64(),
        })
    }

    /// Records the failed attempt and what was decided about it.
    fn log(&mut self, ti: TargetId, outcome: &Classified, decision: &Decision) {
        let fatal = outcome.rule.as_ref().is_some_and(|r| r.fatal);
        let (verdict, wait) = match decision {
            Decision::Retry { wait, .. } => (Verdict::RetrySame, Some(*wait)),
            Decision::NextTarget | Decision::LeaveTarget => (Verdict::NextTarget, None),
            Decision::Requeue => (Verdict::Requeue, None),
            Decision::GiveUp(GiveUp::NotRetryable) if fatal => (Verdict::Fatal, None),
            Decision::GiveUp(_) => (Verdict::GiveUp, None),
        };
        self.attempts.push(AttemptLog {
            upstream: self.targets.upstream(ti),
            status: outcome.status,
            class: Some(outcome.class),
            summary: outcome.summary.clone(),
            verdict,
            wait,
            protocol: self.via,
        });
    }

    /// The one place the give-up answer is built: the upstream's own
    /// answer verbatim when it is final as sent, else tidegate's account.
    fn give_up(
        &mut self,
        ti: TargetId,
        why: GiveUp,
        outcome: &Classified,
        buffered: Option<(http::response::Parts, Bytes)>,
    ) -> Relayed {
        let ctx = answer::Context::new(
            &self.job.gw,
            self.upstream(ti),
            self.attempts.len(),
            self.started,
            &self.targets.tried,
        );
        let answer = answer::give_up(&ctx, why, outcome, buffered);
        self.stop(answer, Some(ti))
    }
}

/// One account's wait for a slot (a pool waits for several at once).
type Acquiring<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Permit, Refused>> + Send + 'a>>;

/// The first slot any of `waits` gives, with its index; a wait refused
/// (full queue) leaves the others waiting, and only when every one is
/// refused is the last refusal the answer. Dropping it leaves every queue.
fn first_slot(mut waits: Vec<Acquiring<'_>>) -> impl Future<Output = (usize, Result<Permit, Refused>)> + Send + '_ {
    let mut open: Vec<bool> = vec![true; waits.len()];
    std::future::poll_fn(move |cx| {
        let mut last = None;
        for (k, wait) in waits.iter_mut().enumerate() {
            if !open[k] {
                continue;
            }
            if let std::task::Poll::Ready(result) = wait.as_mut().poll(cx) {
                match result {
                    Ok(permit) => return std::task::Poll::Ready((k, Ok(permit))),
                    Err(refused) => {
                        open[k] = false;
                        last = Some((k, refused));
                    }
                }
            }
        }
        match last {
            Some((k, refused)) if open.iter().all(|o| !o) => std::task::Poll::Ready((k, Err(refused))),
            _ => std::task::Poll::Pending,
        }
    })
}
