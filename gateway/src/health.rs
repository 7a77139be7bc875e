//! Upstream health: cooldowns after capacity errors and circuit breakers
//! that heal.
//!
//! A capacity error or a provider's `Retry-After`/reset hint puts the
//! upstream into cooldown until then; other targets are preferred
//! meanwhile, and a new hint only ever extends a cooldown. A streak of
//! transient, auth or entitlement failures opens the breaker; after its
//! cooldown exactly one probe request is let through (half-open): success
//! closes it, failure reopens it with a doubled cooldown, capped. A breaker
//! never stays open forever, and state lives in memory, so a restart resets
//! it.

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

#[derive(Debug)]
struct State {
    cooldown_until: Option<Instant>,
    /// Set only by a provider's own wait hint (here or on another replica).
    hold_until: Option<Instant>,
    streak: u32,
    breaker: Breaker,
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
}

impl Health {
    /// A healthy upstream.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State { cooldown_until: None, hold_until: None, streak: 0, breaker: Breaker::Closed }),
        }
    }

    /// Whether a request may go now; claims the probe when half-open.
    pub fn check(&self, now: Instant) -> Availability {
        let Ok(mut s) = self.state.lock() else { return Availability::Ready };
        let availability = Self::availability(&s, now);
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
        }
    }

    /// A request failed with `class`; `hint` is the provider's wait.
    pub fn on_failure(&self, class: Class, hint: Option<Duration>, now: Instant) {
        let Ok(mut s) = self.state.lock() else { return };
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
        match s.breaker {
            Breaker::Open { until, .. } if until > now => Some((HoldKind::Open, until - now)),
            _ => s.hold_until.filter(|u| *u > now).map(|u| (HoldKind::Hold, u - now)),
        }
    }

    /// For the admin API.
    pub fn snapshot(&self, now: Instant) -> HealthSnapshot {
        let Ok(s) = self.state.lock() else { return HealthSnapshot { state: "ok", for_ms: 0, streak: 0 } };
        let left = |t: Instant| t.saturating_duration_since(now).as_millis() as u64;
        let (state, for_ms) = match s.breaker {
            Breaker::Open { until, .. } => ("open", left(until)),
            Breaker::HalfOpen { .. } => ("half_open", 0),
            Breaker::Closed => match s.cooldown_until {
                Some(u) if u > now => ("cooling_down", left(u)),
                _ => ("ok", 0),
            },
        };
        HealthSnapshot { state, for_ms, streak: s.streak }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig { failures: 3, cooldown: Duration::from_secs(10), max_cooldown: Duration::from_secs(25) }
    }

    #[test]
    fn cooldown_only_extends() {
        let h = Health::new(cfg());
        let t0 = Instant::now();
        h.on_failure(Class::Capacity, Some(Duration::from_secs(30)), t0);
        h.on_failure(Class::Capacity, Some(Duration::from_secs(5)), t0);
        // A provider's own wait holds new requests back, not just prefers others.
        assert_eq!(h.check(t0 + Duration::from_secs(10)), Availability::Held(t0 + Duration::from_secs(30)));
        assert_eq!(h.check(t0 + Duration::from_secs(31)), Availability::Ready);
        assert_eq!(h.snapshot(t0).state, "cooling_down");
        // Without a hint: a short cooldown that only sets preferences.
        let h = Health::new(cfg());
        h.on_failure(Class::Capacity, None, t0);
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
            h.on_failure(Class::Auth, None, t0);
        }
        assert_eq!(h.check(t0), Availability::Open(t0 + Duration::from_secs(10)));
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.check(t1), Availability::Probe);
        assert!(matches!(h.check(t1), Availability::Open(_)), "exactly one probe");
        // The probe fails: open again, twice as long.
        h.on_failure(Class::Auth, None, t1);
        assert_eq!(h.check(t1), Availability::Open(t1 + Duration::from_secs(20)));
        let t2 = t1 + Duration::from_secs(20);
        assert_eq!(h.check(t2), Availability::Probe);
        h.on_failure(Class::Transient, None, t2);
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
            h.on_failure(Class::Transient, None, t0);
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
            h.on_failure(Class::Request, None, t0);
            h.on_failure(Class::Capacity, None, t0);
        }
        assert_eq!(h.check(t0 + Duration::from_secs(2)), Availability::Ready);
    }
}
