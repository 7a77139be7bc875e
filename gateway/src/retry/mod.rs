//! Retry policy as plain data and a pure [`decide`]: given what an attempt's
//! answer meant and where the request stands, wait and try again or give up
//! (and why). No I/O, no clock: the relay passes everything in, tables test
//! it.

mod budget;

use std::time::Duration;

pub use budget::RetryBudget;

use crate::classify::{Class, Classified};
use crate::record::WaitSource;

/// Request-wide retry settings (`defaults.retry`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Attempts per request, first included.
    pub max_attempts: u32,
    /// First backoff step and the least any backoff waits.
    pub base_delay: Duration,
    /// Cap of a backoff step (provider hints may ask for longer).
    pub max_delay: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self { max_attempts: 6, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(8) }
    }
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// What the last attempt's answer meant.
    pub outcome: &'a Classified,
    /// Attempts made so far on every target, the last one included.
    pub attempts: u32,
    /// Attempts made on the last attempt's target, the last one included:
    /// attempt limits count per target, and the backoff grows with it.
    pub target_attempts: u32,
    /// Request-wide policy.
    pub policy: &'a Policy,
    /// Time left before the request's deadline.
    pub remaining: Duration,
    /// How long until the upstream's retry budget has room for a blind
    /// retry (zero: now).
    pub budget_wait: Duration,
    /// The request already passed through another tidegate: that one retries.
    pub chained: bool,
    /// Another target of the alias is available right now.
    pub other_target_ready: bool,
    /// Another target of the alias has not been ruled out for this request.
    pub other_target_left: bool,
    /// Other requests hold slots on this upstream: a concurrency refusal
    /// can wait for one of them to finish instead of a blind backoff.
    pub others_in_flight: bool,
    /// Uniform random number in [0, 1) for jitter.
    pub jitter: f64,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Wait this long, then try again.
    Retry {
        /// The wait.
        wait: Duration,
        /// Who asked for the wait: the provider, a rule, tidegate's backoff
        /// or its retry budget.
        source: WaitSource,
    },
    /// Try the alias's next target at once, the same bytes but its model.
    NextTarget,
    /// This target used its attempts: leave it out, go on with the others.
    LeaveTarget,
    /// A concurrency refusal while others hold slots: wait in the
    /// upstream's queue (whose limit was just lowered) for a free slot.
    Requeue,
    /// Stop and answer.
    GiveUp(GiveUp),
}

/// Why a request stops retrying.
#[derive(Debug, Clone, PartialEq)]
pub enum GiveUp {
    /// The class is not retryable (request, auth, entitlement, fatal rule).
    NotRetryable,
    /// The provider said `x-should-retry: false`.
    ProviderSaidNo,
    /// A tidegate in front of this one does the retrying.
    Chained,
    /// Every target left used its attempts (transient failures, or a
    /// rule's `max_attempts`).
    Exhausted,
    /// Every target left has an open circuit breaker; `wait` is the time
    /// until the first probe is due.
    BreakerOpen {
        /// Until the first probe.
        wait: Duration,
    },
    /// Every target left is benched (an answer said it cannot serve:
    /// auth, entitlement, a wait of hours); `wait` is the time until the
    /// first probe is due.
    Benched {
        /// Until the first probe.
        wait: Duration,
    },
    /// The next attempt cannot start before the deadline: `wait` is what a
    /// client should wait before trying again, and `source` who asked for
    /// it (never the provider unless it did).
    BeyondDeadline {
        /// The wait that did not fit.
        wait: Duration,
        /// Who asked for it.
        source: WaitSource,
    },
    /// The deadline passed while an attempt was still under way (the
    /// upstream was working, not failing).
    DeadlinePassed,
}

/// Decides the next step after a failed attempt. Pure.
///
/// A capacity error ends a request only at its deadline: it has no
/// attempt limit of its own (a retry rule's `max_attempts` still applies,
/// per target), and the retry budget delays a blind retry instead of
/// refusing it. Transient failures get `max_attempts` per target. A
/// backoff that would outlast the deadline is clipped so one last attempt
/// starts with `base_delay` to spare; a provider's or a rule's wait is
/// never shortened.
pub fn decide(s: &Situation<'_>) -> Decision {
    let outcome = s.outcome;
    // A fatal rule: the request cannot succeed anywhere (no other target).
    if outcome.rule.as_ref().is_some_and(|r| r.fatal) {
        return Decision::GiveUp(GiveUp::NotRetryable);
    }
    let rule = outcome.rule.as_ref().filter(|r| !r.fatal);
    match outcome.class {
        Class::Request => return Decision::GiveUp(GiveUp::NotRetryable),
        // Not on this target; another may serve the same request.
        Class::Auth | Class::Entitlement if s.other_target_left && !s.chained => return Decision::NextTarget,
        Class::Auth | Class::Entitlement => return Decision::GiveUp(GiveUp::NotRetryable),
        Class::Capacity | Class::Transient => {}
    }
    if s.chained {
        return Decision::GiveUp(GiveUp::Chained);
    }
    if outcome.hints.should_retry == Some(false) && rule.is_none() {
        return Decision::GiveUp(GiveUp::ProviderSaidNo);
    }
    let limit = match (rule.and_then(|r| r.max_attempts), outcome.class) {
        (Some(limit), _) => Some(limit),
        (None, Class::Transient) => Some(s.policy.max_attempts),
        (None, Class::Capacity | Class::Request | Class::Auth | Class::Entitlement) => None,
    };
    if limit.is_some_and(|limit| s.target_attempts >= limit) {
        return if s.other_target_left { Decision::LeaveTarget } else { Decision::GiveUp(GiveUp::Exhausted) };
    }
    // Busy or broken here, free elsewhere: move on without waiting.
    if s.other_target_ready {
        return Decision::NextTarget;
    }
    let paced = outcome.hints.retry_after.is_some() || rule.and_then(|r| r.delay).is_some();
    if outcome.class == Class::Capacity && outcome.concurrency && s.others_in_flight && !paced {
        return Decision::Requeue;
    }
    let (wait, source) = match (outcome.hints.retry_after, rule.and_then(|r| r.delay)) {
        (Some(hint), _) => (hint, WaitSource::Provider(outcome.hints.source.unwrap_or("retry-after"))),
        (None, Some(delay)) => (delay, WaitSource::Rule),
        // The backoff grows with the attempts on this target: moving on to
        // another target is not a reason to wait longer here.
        (None, None) => (backoff(s.target_attempts, s.policy, s.jitter), WaitSource::Backoff),
    };
    match source {
        // A wait the provider or the operator asked for is honoured as is.
        WaitSource::Provider(_) | WaitSource::Rule | WaitSource::Budget if wait >= s.remaining => {
            Decision::GiveUp(GiveUp::BeyondDeadline { wait, source })
        }
        WaitSource::Provider(_) | WaitSource::Rule | WaitSource::Budget => Decision::Retry { wait, source },
        WaitSource::Backoff => {
            // The last attempt starts with this much of the deadline left.
            let spare = s.policy.base_delay;
            let Some(latest) = s.remaining.checked_sub(spare).filter(|l| !l.is_zero()) else {
                return Decision::GiveUp(GiveUp::BeyondDeadline { wait, source });
            };
            if s.budget_wait > latest {
                // Blind retries are paced; the next free one is too late.
                return Decision::GiveUp(GiveUp::BeyondDeadline { wait: s.budget_wait, source: WaitSource::Budget });
            }
            if s.budget_wait > wait {
                return Decision::Retry { wait: s.budget_wait, source: WaitSource::Budget };
            }
            Decision::Retry { wait: wait.min(latest), source }
        }
    }
}

/// Exponential backoff with full jitter: after attempt `n`, a wait drawn
/// uniformly between `base_delay` and `min(max_delay, base_delay·2^(n-1))`.
pub fn backoff(attempts: u32, policy: &Policy, jitter: f64) -> Duration {
    let base = policy.base_delay;
    let step = base.saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
    let cap = step.min(policy.max_delay).max(base);
    let spread = cap - base;
    base + spread.mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests;
