//! Retry policy as plain data and a pure [`decide`]: given what an attempt's
//! answer meant and where the request stands, wait and try again or give up
//! (and why). No I/O, no clock: the relay passes everything in, tables test
//! it.

mod budget;

use std::time::Duration;

pub use budget::RetryBudget;

use crate::classify::{Class, Outcome};
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
        Self { max_attempts: 6, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(30) }
    }
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// What the last attempt's answer meant.
    pub outcome: &'a Outcome,
    /// Attempts made so far, the last one included.
    pub attempts: u32,
    /// Request-wide policy.
    pub policy: &'a Policy,
    /// Time left before the request's deadline.
    pub remaining: Duration,
    /// The upstream's retry budget allows one more blind retry.
    pub budget_ok: bool,
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
        /// Who asked for the wait: the provider, a rule, or tidegate's backoff.
        source: WaitSource,
    },
    /// Try the alias's next target at once, the same bytes but its model.
    NextTarget,
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
    /// Attempt limit reached.
    Exhausted,
    /// The upstream's retry budget is spent (outage protection).
    BudgetSpent,
    /// Every target left has an open circuit breaker; `wait` is the time
    /// until the first probe is due.
    BreakerOpen {
        /// Until the first probe.
        wait: Duration,
    },
    /// The wait needed exceeds the time left; `wait` is what a client
    /// should wait before trying again.
    BeyondDeadline {
        /// The wait that did not fit.
        wait: Duration,
    },
}

/// Decides the next step after a failed attempt. Pure.
pub fn decide(s: &Situation<'_>) -> Decision {
    let outcome = s.outcome;
    let rule = outcome.rule.as_ref().filter(|r| !r.fatal);
    let max_attempts = rule.and_then(|r| r.max_attempts).unwrap_or(s.policy.max_attempts);
    match outcome.class {
        Class::Request => return Decision::GiveUp(GiveUp::NotRetryable),
        // Not on this target; another may serve the same request.
        Class::Auth | Class::Entitlement if s.other_target_left && !s.chained && s.attempts < max_attempts => {
            return Decision::NextTarget;
        }
        Class::Auth | Class::Entitlement => return Decision::GiveUp(GiveUp::NotRetryable),
        Class::Capacity | Class::Transient => {}
    }
    if s.chained {
        return Decision::GiveUp(GiveUp::Chained);
    }
    if outcome.hints.should_retry == Some(false) && rule.is_none() {
        return Decision::GiveUp(GiveUp::ProviderSaidNo);
    }
    if s.attempts >= max_attempts {
        return Decision::GiveUp(GiveUp::Exhausted);
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
        (None, None) => (backoff(s.attempts, s.policy, s.jitter), WaitSource::Backoff),
    };
    // The budget limits blind retries; a wait the provider or the operator
    // asked for is already paced.
    if source == WaitSource::Backoff && !s.budget_ok {
        return Decision::GiveUp(GiveUp::BudgetSpent);
    }
    if wait >= s.remaining {
        return Decision::GiveUp(GiveUp::BeyondDeadline { wait });
    }
    Decision::Retry { wait, source }
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
