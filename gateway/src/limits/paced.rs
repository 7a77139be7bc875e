//! Pacing to what a provider advertises (see `classify::advertised`): a
//! model of the provider's own bucket, corrected by every answer, that
//! spaces requests so the bucket is never found empty.
//!
//! The provider's bucket holds `limit` units and refills at a rate read
//! from its own figures: `limit − remaining` units come back over `reset`.
//! Each request reserves its cost from the model; when the model's level
//! is below the cost the request waits for the refill, behind those
//! already waiting (the level runs into debt, so a crowd is spread out at
//! the refill rate, not released together when the bucket is full).
//!
//! An answer's figures are the truth as of its request: the level becomes
//! `remaining`, refilled since the request was sent (the provider admitted
//! it a network hop later), less what was reserved after that request
//! (still in flight or waiting). An answer to a request older than the
//! last one applied is not applied.
//! With shared state, the level and the rate are this replica's share of
//! them (the provider's figures count every replica's requests).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::advertised::Quota;

/// How long figures are believed without a new answer: a request that
/// would wait longer than this, when no answer has come for this long,
/// goes anyway (one at a time) to hear the provider again — a provider
/// that said "nothing left for a day" is asked again each minute, never
/// trusted to stop traffic for the day. While answers keep coming, a wait
/// is what the figures say (the limiter refuses at once, with the wait as
/// `Retry-After`, a request it would keep past its deadline).
pub const LONGEST_PACE: Duration = Duration::from_secs(60);

/// Models one upstream keeps apart at most: beyond, the rest share one
/// scope (a target without `model` forwards whatever name a client asks,
/// and a client must not grow this without bound).
pub const MOST_SCOPES: usize = 32;

/// The advertised buckets (requests, tokens) of one quota scope.
pub type Buckets = [Pacer; 2];

/// One upstream's advertised buckets, per model sent: OpenAI and
/// Anthropic both scope rpm and tpm by model (an organisation's limits
/// for one model are not another's), so a model told "nothing left"
/// does not hold back another. A provider that scopes them by account
/// instead tells each model the same figures, and each model's answers
/// correct its own reckoning: the cost is what two models send between
/// two answers, never a wait the provider did not ask for.
#[derive(Debug, Default)]
pub struct Scopes {
    /// An answer advertised something: until then, a request costs an
    /// atomic load here.
    told: AtomicBool,
    list: Mutex<Vec<(Box<str>, Arc<Buckets>)>>,
}

impl Scopes {
    /// The buckets of `model` for a request, once the upstream has
    /// advertised anything (`None` before: nothing to pace to).
    pub fn told(&self, model: &str) -> Option<Arc<Buckets>> {
        self.told.load(Ordering::Acquire).then(|| self.of(model))
    }

    /// The buckets of `model` (created empty: no pacing until an answer
    /// of that model advertises something), for an answer's figures.
    pub fn of(&self, model: &str) -> Arc<Buckets> {
        self.told.store(true, Ordering::Release);
        let Ok(mut list) = self.list.lock() else { return Arc::default() };
        if let Some((_, b)) = list.iter().find(|(m, _)| &**m == model) {
            return b.clone();
        }
        if list.len() >= MOST_SCOPES {
            return list.last().map(|(_, b)| b.clone()).unwrap_or_default();
        }
        let b = Arc::<Buckets>::default();
        list.push((model.into(), b.clone()));
        b
    }

    /// Each model's buckets as tidegate reckons them now, for those the
    /// provider has said anything of.
    pub fn snapshot(&self, now: Instant) -> Vec<(String, [Option<Paced>; 2])> {
        let Ok(list) = self.list.lock() else { return Vec::new() };
        list.iter()
            .map(|(m, b)| (m.to_string(), [b[0].snapshot(now), b[1].snapshot(now)]))
            .filter(|(_, p)| p.iter().any(Option::is_some))
            .collect()
    }
}

impl Paced {
    /// The part of the bucket left (below zero: owed), to find the
    /// tightest of several.
    pub fn left_part(&self) -> f64 {
        self.level as f64 / (self.limit.max(1) as f64)
    }
}

/// One advertised bucket (requests, or tokens) of one quota scope.
#[derive(Debug, Default)]
pub struct Pacer {
    /// A figure was seen: until then, reserving costs an atomic load.
    active: AtomicBool,
    model: Mutex<Model>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Model {
    limit: f64,
    /// Units per second.
    rate: f64,
    /// Units left as of `at` (below zero: owed by requests waiting).
    level: f64,
    at: Option<Instant>,
    /// When an answer's figures were last applied.
    heard: Option<Instant>,
    /// Units reserved ever, as a sequence: a reservation's ticket is the
    /// total after it.
    reserved: u64,
    /// The ticket of the answer last applied.
    seen: u64,
    /// When a request last went to hear stale figures again.
    probed: Option<Instant>,
}

/// What the admin API shows of an advertised bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paced {
    /// Units the bucket holds (this replica's share).
    pub limit: u64,
    /// Units left now, as tidegate reckons (negative: owed by waiters).
    pub level: i64,
    /// Units per minute it refills by.
    pub per_minute: u64,
}

impl Model {
    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            self.level = (self.level + self.rate * dt).min(self.limit);
        }
        self.at = Some(now);
    }
}

impl Pacer {
    /// Reserves `cost` units: how long to wait before sending, and the
    /// reservation's ticket for its answer ([`Pacer::observe`]). `None`
    /// before the provider advertised anything.
    pub fn reserve(&self, cost: u64, now: Instant) -> Option<(Duration, u64)> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut m = self.model.lock().ok()?;
        m.refill(now);
        let cost = (cost as f64).min(m.limit);
        m.level -= cost;
        m.reserved = m.reserved.saturating_add(cost as u64);
        let mut wait = if m.level >= 0.0 || m.rate <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-m.level / m.rate).min(crate::classify::hints::LONGEST_HINT.as_secs_f64()))
        };
        let stale = m.heard.is_none_or(|h| now.saturating_duration_since(h) >= LONGEST_PACE);
        let probe_due = m.probed.is_none_or(|p| now.saturating_duration_since(p) >= LONGEST_PACE);
        if wait > LONGEST_PACE && stale && probe_due {
            m.probed = Some(now);
            wait = Duration::ZERO;
        }
        Some((wait, m.reserved))
    }

    /// Gives back a reservation never sent (its request gave up waiting).
    pub fn unreserve(&self, cost: u64) {
        if let Ok(mut m) = self.model.lock() {
            let cost = (cost as f64).min(m.limit);
            m.level = (m.level + cost).min(m.limit);
        }
    }

    /// Applies an answer's figure: `ticket` is its request's reservation
    /// (`None`: sent before pacing began) and `sent` when it went,
    /// `share` the part of the bucket that is this replica's (1 alone).
    pub fn observe(&self, quota: Quota, (ticket, sent): (Option<u64>, Instant), share: f64, now: Instant) {
        let Ok(mut m) = self.model.lock() else { return };
        let ticket = ticket.unwrap_or(0);
        if ticket < m.seen {
            return;
        }
        let share = share.clamp(1e-3, 1.0);
        let (limit, remaining) = (quota.limit as f64 * share, quota.remaining as f64 * share);
        let used = limit - remaining;
        let reset = quota.reset.as_secs_f64();
        if used > 0.0 && reset > 0.0 {
            // `remaining` is a whole number below the provider's level (by
            // up to one) while `reset` is the provider's exact time to full:
            // half a unit less is the middle of what the figures allow.
            // Smoothed over answers; at least the bucket once a day, at
            // most a thousand times a second.
            let sample = ((used - 0.5 * share).max(0.5 * share) / reset).clamp(limit / 86_400.0, limit * 1000.0);
            m.rate = if m.rate > 0.0 { 0.8 * m.rate + 0.2 * sample } else { sample };
        } else if m.rate <= 0.0 {
            // Full, or no reset said: a bucket a minute (OpenAI's rpm and
            // tpm, Anthropic's) until a figure says otherwise.
            m.rate = limit / 60.0;
        }
        m.limit = limit;
        let refilled = m.rate * now.saturating_duration_since(sent).as_secs_f64();
        m.level = (remaining + refilled).min(limit) - m.reserved.saturating_sub(ticket) as f64;
        m.at = Some(now);
        m.heard = Some(now);
        m.seen = ticket;
        self.active.store(true, Ordering::Release);
    }

    /// The bucket as tidegate reckons it now, once advertised.
    pub fn snapshot(&self, now: Instant) -> Option<Paced> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut m = *self.model.lock().ok()?;
        m.refill(now);
        Some(Paced { limit: m.limit as u64, level: m.level.floor() as i64, per_minute: (m.rate * 60.0) as u64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: u64, remaining: u64, reset_ms: u64) -> Quota {
        Quota { limit, remaining, reset: Duration::from_millis(reset_ms) }
    }

    #[test]
    fn each_model_has_its_buckets_and_a_flood_of_names_shares_the_last() {
        let scopes = Scopes::default();
        let t0 = Instant::now();
        scopes.of("a")[0].observe(quota(10, 0, 10_000), (None, t0), 1.0, t0);
        assert!(scopes.of("a")[0].reserve(1, t0).unwrap().0 > Duration::ZERO);
        assert!(scopes.of("b")[0].reserve(1, t0).is_none(), "b was told nothing");
        for i in 0..100 {
            scopes.of(&format!("m{i}"));
        }
        assert_eq!(scopes.list.lock().unwrap().len(), MOST_SCOPES);
        assert!(Arc::ptr_eq(&scopes.of("m99"), &scopes.of("m98")), "past the bound, names share one scope");
        let seen: Vec<String> = scopes.snapshot(t0).into_iter().map(|(m, _)| m).collect();
        assert_eq!(seen, ["a"], "only scopes told something are shown");
    }

    #[tokio::test(start_paused = true)]
    async fn a_crowd_is_spread_at_the_refill_rate_and_answers_correct_the_model() {
        let p = Pacer::default();
        let t0 = Instant::now();
        assert!(p.reserve(1, t0).is_none(), "nothing advertised: no pacing");
        // 10 a 5 s bucket with 4 left: 6 used (5.5, the whole number
        // being rounded down) come back over 2.75 s: 2 a second.
        p.observe(quota(10, 4, 2750), (None, t0), 1.0, t0);
        let waits: Vec<Duration> = (0..8).map(|_| p.reserve(1, t0).unwrap().0).collect();
        assert!(waits[..4].iter().all(|w| w.is_zero()), "{waits:?}");
        assert_eq!(waits[4], Duration::from_millis(500));
        assert_eq!(waits[7], Duration::from_millis(2000), "spread at 2 a second");
        // The answer to the 2nd says 1 left (another client used one): the
        // six reserved after it are owed, so the next waits for 6 units.
        p.observe(quota(10, 1, 4250), (Some(2), t0), 1.0, t0);
        let (wait, _) = p.reserve(1, t0).unwrap();
        assert_eq!(wait, Duration::from_secs(3));
        // An older answer is not applied over a newer one.
        p.observe(quota(10, 10, 0), (Some(1), t0), 1.0, t0);
        let snap = p.snapshot(t0).unwrap();
        assert_eq!((snap.limit, snap.level, snap.per_minute), (10, -6, 120));
        // Two replicas: each paces to half of what is left.
        let shared = Pacer::default();
        shared.observe(quota(60, 30, 29_500), (None, t0), 0.5, t0);
        let snap = shared.snapshot(t0).unwrap();
        assert_eq!((snap.limit, snap.level, snap.per_minute), (30, 15, 30));
        // "Nothing left for a day": believed while fresh, then one request
        // a LONGEST_PACE goes to ask again.
        let dry = Pacer::default();
        dry.observe(quota(1_000_000, 0, 86_400_000), (None, t0), 1.0, t0);
        let (wait, _) = dry.reserve(1_000_000, t0).unwrap();
        assert!(wait > Duration::from_secs(3600), "{wait:?}");
        let later = t0 + LONGEST_PACE;
        assert_eq!(dry.reserve(1, later).unwrap().0, Duration::ZERO, "no probe after a minute unheard");
        assert!(dry.reserve(1, later).unwrap().0 > LONGEST_PACE, "two probes at once");
        // A reservation given back is room again.
        let q = Pacer::default();
        q.observe(quota(2, 1, 1000), (None, t0), 1.0, t0);
        q.reserve(1, t0);
        assert!(q.reserve(1, t0).unwrap().0 > Duration::ZERO);
        q.unreserve(1);
        q.unreserve(1);
        assert_eq!(q.reserve(1, t0).unwrap().0, Duration::ZERO);
    }
}
