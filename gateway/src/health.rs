//! Upstream health: cooldowns after capacity errors and circuit breakers
//! that heal.
//!
//! A capacity error or a provider's `Retry-After`/reset hint puts the
//! upstream into cooldown until then; other targets are preferred
//! meanwhile, and a new hint only ever extends a cooldown. A streak of
//! transient failures opens the breaker; after its cooldown exactly one
//! probe request is let through (half-open): success closes it, failure
//! reopens it with a doubled cooldown, capped. A breaker never stays open
//! forever, and state lives in memory, so a restart resets it.
//!
//! An answer that says this upstream (or pool account) cannot serve at
//! all — auth, entitlement (no plan, quota exhausted), or a provider's
//! wait longer than [`LONG_HOLD`] — *benches* it at the first answer: no
//! request goes to it until one probe succeeds. Probes come at a growing
//! interval ([`BENCH_FIRST`], doubling, up to [`BENCH_LONGEST`]) but never
//! later than the reset the provider projected: a projection is an upper
//! bound, not a promise (limits often clear much sooner).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::Class;

/// What one replica tells the others about an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// The provider asked for a wait (`Retry-After`, a reset header).
    Hold,
    /// The circuit breaker opened.
    Open,
}

impl HoldKind {
    /// Both kinds, for reading them back from the shared store.
    pub const ALL: [HoldKind; 2] = [HoldKind::Hold, HoldKind::Open];

    /// The label used in the shared store and its messages.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::Hold => "hold",
            HoldKind::Open => "open",
        }
    }

    /// The kind a stored label names.
    pub fn parse(label: &str) -> Option<HoldKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == label)
    }
}

/// Breaker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// First open period.
    pub cooldown: Duration,
    /// Longest open period.
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self { failures: 5, cooldown: Duration::from_secs(10), max_cooldown: Duration::from_secs(300) }
    }
}

/// Can a request go to this upstream now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Yes.
    Ready,
    /// Yes, as the single half-open probe (report its result).
    Probe,
    /// Busy: usable, but others are preferred until this instant.
    Cooling(Instant),
    /// The provider asked (`Retry-After`, a reset header) that nothing be
    /// sent before this instant: new requests wait or go elsewhere.
    Held(Instant),
    /// Broken: not before this instant.
    Open(Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breaker {
    Closed,
    Open {
        until: Instant,
        period: Duration,
    },
    /// `claimed`: when the probe was handed out. A probe whose request
    /// never reports (refused by the queue, client gone) expires after
    /// `period`, so a lost probe cannot hold the breaker half-open forever.
    HalfOpen {
        claimed: Option<Instant>,
        period: Duration,
    },
}

/// A wait a provider asks for above which the upstream is benched and
/// probed (rather than held: nothing is sent to it for that long).
pub const LONG_HOLD: Duration = Duration::from_secs(300);

/// The first interval before a benched upstream is probed.
pub const BENCH_FIRST: Duration = Duration::from_secs(60);

/// The longest interval between probes of a benched upstream.
pub const BENCH_LONGEST: Duration = Duration::from_secs(3600);

/// Why an upstream is benched, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bench {
    /// When the answer that benched it (or its last failed probe) came.
    since: Instant,
    /// No request before this (then one probe).
    until: Instant,
    /// The interval that led here (doubles on each failed probe).
    period: Duration,
    /// When the probe was handed out (a lost probe expires after
    /// [`BENCH_FIRST`]).
    claimed: Option<Instant>,
    /// What the answer that benched it meant.
    class: Class,
    /// That answer, in one line.
    reason: String,
    /// The reset the provider projected, if it did.
    reset: Option<jiff::Timestamp>,
}

/// What the pick and the final answer say of a benched upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Benched {
    /// The class of the answer that benched it.
    pub class: Class,
    /// That answer, in one line.
    pub reason: String,
    /// When the next probe is due.
    pub probe_at: Instant,
    /// The reset the provider projected, if any.
    pub reset: Option<jiff::Timestamp>,
}

/// What a failed answer tells the upstream's health.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// Its class.
    pub class: Class,
    /// The provider's wait, if it gave one.
    pub hint: Option<Duration>,
    /// The reset the provider projected, if it did.
    pub reset: Option<jiff::Timestamp>,
    /// The answer in one line (kept as a bench's reason).
    pub summary: &'a str,
    /// It is about one model, not the account: never benches.
    pub model_scoped: bool,
}

#[derive(Debug)]
struct State {
    cooldown_until: Option<Instant>,
    /// Set only by a provider's own wait hint (here or on another replica).
    hold_until: Option<Instant>,
    streak: u32,
    breaker: Breaker,
    bench: Option<Bench>,
}

/// One upstream's health.
#[derive(Debug)]
pub struct Health {
    config: BreakerConfig,
    state: Mutex<State>,
}

/// What the admin API shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// `ok`, `cooling_down`, `open` or `half_open`.
    pub state: &'static str,
    /// Time left in a cooldown or open breaker.
    pub for_ms: u64,
    /// Consecutive failures.
    pub streak: u32,
    /// Why it is benched (`state: benched`).
    pub reason: Option<String>,
    /// The reset the provider projected for a benched upstream.
    pub reset: Option<jiff::Timestamp>,
}

impl Health {
    /// A healthy upstream.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                cooldown_until: None,
                hold_until: None,
                streak: 0,
                breaker: Breaker::Closed,
                bench: None,
            }),
        }
    }

    /// Whether a request may go now; claims the probe when half-open.
    pub fn check(&self, now: Instant) -> Availability {
        let Ok(mut s) = self.state.lock() else { return Availability::Ready };
        let availability = Self::availability(&s, now);
        if availability == Availability::Probe
            && let Some(bench) = s.bench.as_mut()
        {
            bench.claimed = Some(now);
            return availability;
        }
        if availability == Availability::Probe {
            let period = match s.breaker {
                Breaker::Open { period, .. } | Breaker::HalfOpen { period, .. } => period,
                Breaker::Closed => self.config.cooldown,
            };
            s.breaker = Breaker::HalfOpen { claimed: Some(now), period };
        }
        availability
    }

    /// Like [`Health::check`] without claiming a probe.
    pub fn peek(&self, now: Instant) -> Availability {
        self.state.lock().map_or(Availability::Ready, |s| Self::availability(&s, now))
    }

    fn availability(s: &State, now: Instant) -> Availability {
        if let Some(bench) = &s.bench {
            return match bench.claimed {
                _ if now < bench.until => Availability::Open(bench.until),
                Some(at) if now < at + BENCH_FIRST => Availability::Open(at + BENCH_FIRST),
                _ => Availability::Probe,
            };
        }
        match s.breaker {
            Breaker::Open { until, .. } if now < until => Availability::Open(until),
            Breaker::HalfOpen { claimed: Some(at), period } if now < at + period => Availability::Open(at + period),
            Breaker::Open { .. } | Breaker::HalfOpen { .. } => Availability::Probe,
            Breaker::Closed => match (s.hold_until, s.cooldown_until) {
                (Some(until), _) if until > now => Availability::Held(until),
                (_, Some(until)) if until > now => Availability::Cooling(until),
                _ => Availability::Ready,
            },
        }
    }

    /// A request succeeded: the streak ends, a half-open breaker closes.
    pub fn on_success(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.streak = 0;
            s.breaker = Breaker::Closed;
            s.bench = None;
        }
    }

    /// Benches the upstream after an answer that says it cannot serve
    /// (see the module doc); a failed probe doubles the interval.
    fn bench(s: &mut State, failure: &Failure<'_>, now: Instant) {
        let period = match &s.bench {
            Some(bench) => (bench.period * 2).min(BENCH_LONGEST),
            None => BENCH_FIRST,
        };
        // Never later than the provider's own projection (nor its wait).
        let projected = failure.reset.and_then(|reset| {
            let left = jiff::Timestamp::now().duration_until(reset);
            Duration::try_from(left).ok()
        });
        let until_reset = match (projected, failure.hint) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next = until_reset.map_or(period, |left| period.min(left.max(Duration::from_secs(1))));
        let reset = failure.reset.or_else(|| {
            let hint = jiff::SignedDuration::try_from(failure.hint?).ok()?;
            jiff::Timestamp::now().checked_add(hint).ok()
        });
        s.bench = Some(Bench {
            since: now,
            until: now + next,
            period,
            claimed: None,
            class: failure.class,
            reason: failure.summary.to_owned(),
            reset,
        });
    }

    /// Whether it was benched after `t` (a request that chose it at `t`
    /// and waited for a slot learns that it should go elsewhere).
    pub fn benched_after(&self, t: Instant) -> bool {
        self.state.lock().ok().and_then(|s| s.bench.as_ref().map(|b| b.since > t)).unwrap_or(false)
    }

    /// Why this upstream is benched, if it is.
    pub fn benched(&self) -> Option<Benched> {
        let s = self.state.lock().ok()?;
        let bench = s.bench.as_ref()?;
        Some(Benched { class: bench.class, reason: bench.reason.clone(), probe_at: bench.until, reset: bench.reset })
    }

    /// A request failed; see [`Failure`].
    pub fn on_failure(&self, failure: &Failure<'_>, now: Instant) {
        let Ok(mut s) = self.state.lock() else { return };
        let (class, hint) = (failure.class, failure.hint);
        match class {
            // A wait too long to hold requests for: probe instead.
            Class::Capacity if hint.is_some_and(|h| h > LONG_HOLD) => {
                Self::bench(&mut s, failure, now);
                return;
            }
            Class::Auth | Class::Entitlement if !failure.model_scoped => {
                Self::bench(&mut s, failure, now);
                return;
            }
            // A probe of a benched upstream that is merely busy now: it
            // serves again (the bench was about a plan, key or long wait).
            Class::Capacity if s.bench.is_some() => {
                s.bench = None;
            }
            _ => {}
        }
        match class {
            Class::Capacity => {
                // Busy is not broken: cool down, do not count toward the breaker.
                let until = now + hint.unwrap_or(Duration::from_secs(1));
                s.cooldown_until = Some(s.cooldown_until.map_or(until, |u| u.max(until)));
                if hint.is_some() {
                    s.hold_until = Some(s.hold_until.map_or(until, |u| u.max(until)));
                }
                if let Breaker::HalfOpen { period, .. } = s.breaker {
                    s.breaker = Breaker::HalfOpen { claimed: None, period };
                }
                return;
            }
            // The request's own fault says nothing about the upstream.
            Class::Request => return,
            Class::Transient | Class::Auth | Class::Entitlement => {}
        }
        if let Some(bench) = s.bench.as_mut() {
            // A probe that met a broken upstream: the bench stands, the
            // next probe comes after the same interval again.
            bench.claimed = None;
            bench.until = now + bench.period;
            return;
        }
        s.streak += 1;
        s.breaker = match s.breaker {
            Breaker::HalfOpen { period, .. } => {
                let period = (period * 2).min(self.config.max_cooldown);
                Breaker::Open { until: now + period, period }
            }
            Breaker::Closed if s.streak >= self.config.failures => {
                Breaker::Open { until: now + self.config.cooldown, period: self.config.cooldown }
            }
            other => other,
        };
        if let Some(h) = hint {
            let until = now + h;
            s.cooldown_until = Some(s.cooldown_until.map_or(until, |u| u.max(until)));
        }
    }

    /// Another replica announced a provider's wait or an open breaker with
    /// `left` to go: this replica holds off too. Holds only extend; an open
    /// breaker opens a closed one.
    pub fn absorb(&self, kind: HoldKind, left: Duration, now: Instant) {
        let Ok(mut s) = self.state.lock() else { return };
        let until = now + left;
        match kind {
            HoldKind::Hold => {
                s.cooldown_until = Some(s.cooldown_until.map_or(until, |u| u.max(until)));
                s.hold_until = Some(s.hold_until.map_or(until, |u| u.max(until)));
            }
            HoldKind::Open if s.breaker == Breaker::Closed => s.breaker = Breaker::Open { until, period: left },
            HoldKind::Open => {}
        }
    }

    /// What to tell other replicas after a failure: an open breaker or a
    /// provider's wait, and the time left, if either is in force.
    pub fn announcement(&self, now: Instant) -> Option<(HoldKind, Duration)> {
        let s = self.state.lock().ok()?;
        if let Some(bench) = s.bench.as_ref().filter(|b| b.until > now) {
            return Some((HoldKind::Open, bench.until - now));
        }
        match s.breaker {
            Breaker::Open { until, .. } if until > now => Some((HoldKind::Open, until - now)),
            _ => s.hold_until.filter(|u| *u > now).map(|u| (HoldKind::Hold, u - now)),
        }
    }

    /// For the admin API.
    pub fn snapshot(&self, now: Instant) -> HealthSnapshot {
        let Ok(s) = self.state.lock() else {
            return HealthSnapshot { state: "ok", for_ms: 0, streak: 0, reason: None, reset: None };
        };
        let left = |t: Instant| t.saturating_duration_since(now).as_millis() as u64;
        if let Some(bench) = &s.bench {
            return HealthSnapshot {
                state: "benched",
                for_ms: left(bench.until),
                streak: s.streak,
                reason: Some(format!("{} error: {}", bench.class.as_str(), bench.reason)),
                reset: bench.reset,
            };
        }
        let (state, for_ms) = match s.breaker {
            Breaker::Open { until, .. } => ("open", left(until)),
            Breaker::HalfOpen { .. } => ("half_open", 0),
            Breaker::Closed => match s.cooldown_until {
                Some(u) if u > now => ("cooling_down", left(u)),
                _ => ("ok", 0),
            },
        };
        HealthSnapshot { state, for_ms, streak: s.streak, reason: None, reset: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(h: &Health, class: Class, hint: Option<Duration>, now: Instant) {
        h.on_failure(&Failure { class, hint, reset: None, summary: "refused", model_scoped: false }, now);
    }

    #[test]
    fn an_account_without_a_plan_is_benched_at_once_and_probed_at_growing_intervals() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        fail(&h, Class::Entitlement, None, t0);
        assert_eq!(h.check(t0), Availability::Open(t0 + BENCH_FIRST), "benched at the first answer");
        assert_eq!(h.snapshot(t0).state, "benched");
        let t1 = t0 + BENCH_FIRST;
        assert_eq!(h.check(t1), Availability::Probe);
        assert!(matches!(h.check(t1), Availability::Open(_)), "exactly one probe");
        fail(&h, Class::Entitlement, None, t1);
        assert_eq!(h.check(t1), Availability::Open(t1 + BENCH_FIRST * 2), "the interval doubles");
        let mut t = t1 + BENCH_FIRST * 2;
        for _ in 0..10 {
            assert_eq!(h.check(t), Availability::Probe);
            fail(&h, Class::Auth, None, t);
            let Availability::Open(until) = h.check(t) else { panic!("not benched") };
            assert!(until - t <= BENCH_LONGEST, "probes at most an hour apart");
            t = until;
        }
        assert_eq!(h.check(t), Availability::Probe);
        h.on_success();
        assert_eq!(h.check(t), Availability::Ready);
    }

    #[test]
    fn a_long_wait_is_probed_before_the_reset_and_a_near_reset_comes_first() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        // Two hours' Retry-After: not held for two hours, probed in a minute.
        fail(&h, Class::Capacity, Some(Duration::from_secs(7200)), t0);
        assert_eq!(h.check(t0), Availability::Open(t0 + BENCH_FIRST));
        assert!(h.benched().is_some_and(|b| b.reset.is_some()), "the provider's reset is kept");
        // A projected reset sooner than the interval: probed at the reset.
        let h = Health::new(cfg());
        let reset = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(20)).unwrap();
        let quota = Failure {
            class: Class::Entitlement,
            hint: None,
            reset: Some(reset),
            summary: "quota",
            model_scoped: false,
        };
        h.on_failure(&quota, t0);
        let Availability::Open(until) = h.check(t0) else { panic!("not benched") };
        assert!(until - t0 <= Duration::from_secs(20) && until - t0 >= Duration::from_secs(18), "{:?}", until - t0);
        // A short wait is still held, not benched.
        let h = Health::new(cfg());
        fail(&h, Class::Capacity, Some(Duration::from_secs(30)), t0);
        assert_eq!(h.check(t0), Availability::Held(t0 + Duration::from_secs(30)));
    }

    fn cfg() -> BreakerConfig {
        BreakerConfig { failures: 3, cooldown: Duration::from_secs(10), max_cooldown: Duration::from_secs(25) }
    }

    #[test]
    fn cooldown_only_extends() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        fail(&h, Class::Capacity, Some(Duration::from_secs(30)), t0);
        fail(&h, Class::Capacity, Some(Duration::from_secs(5)), t0);
        // A provider's own wait holds new requests back, not just prefers others.
        assert_eq!(h.check(t0 + Duration::from_secs(10)), Availability::Held(t0 + Duration::from_secs(30)));
        assert_eq!(h.check(t0 + Duration::from_secs(31)), Availability::Ready);
        assert_eq!(h.snapshot(t0).state, "cooling_down");
        // Without a hint: a short cooldown that only sets preferences.
        let h = Health::new(cfg());
        fail(&h, Class::Capacity, None, t0);
        assert_eq!(h.check(t0), Availability::Cooling(t0 + Duration::from_secs(1)));
        // Another replica's announcement holds this one too, extend-only.
        h.absorb(HoldKind::Hold, Duration::from_secs(5), t0);
        h.absorb(HoldKind::Hold, Duration::from_secs(2), t0);
        assert_eq!(h.check(t0 + Duration::from_secs(3)), Availability::Held(t0 + Duration::from_secs(5)));
        assert_eq!(h.announcement(t0), Some((HoldKind::Hold, Duration::from_secs(5))));
    }

    #[test]
    fn breaker_opens_probes_once_and_heals() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&h, Class::Transient, None, t0);
        }
        assert_eq!(h.check(t0), Availability::Open(t0 + Duration::from_secs(10)));
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.check(t1), Availability::Probe);
        assert!(matches!(h.check(t1), Availability::Open(_)), "exactly one probe");
        // The probe fails: open again, twice as long.
        fail(&h, Class::Transient, None, t1);
        assert_eq!(h.check(t1), Availability::Open(t1 + Duration::from_secs(20)));
        let t2 = t1 + Duration::from_secs(20);
        assert_eq!(h.check(t2), Availability::Probe);
        fail(&h, Class::Transient, None, t2);
        // Capped at max_cooldown: never open forever.
        assert_eq!(h.check(t2), Availability::Open(t2 + Duration::from_secs(25)));
        let t3 = t2 + Duration::from_secs(25);
        assert_eq!(h.check(t3), Availability::Probe);
        h.on_success();
        assert_eq!(h.check(t3), Availability::Ready);
        assert_eq!(h.snapshot(t3).state, "ok");
    }

    #[test]
    fn a_probe_that_never_reports_expires() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&h, Class::Transient, None, t0);
        }
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.check(t1), Availability::Probe);
        // Its request was dropped (client gone) and reports nothing.
        assert_eq!(h.check(t1 + Duration::from_secs(5)), Availability::Open(t1 + Duration::from_secs(10)));
        assert_eq!(h.check(t1 + Duration::from_secs(10)), Availability::Probe, "a lost probe must not stick");
    }

    #[test]
    fn request_errors_and_capacity_do_not_open_the_breaker() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        for _ in 0..10 {
            fail(&h, Class::Request, None, t0);
            fail(&h, Class::Capacity, None, t0);
        }
        assert_eq!(h.check(t0 + Duration::from_secs(2)), Availability::Ready);
    }
}
