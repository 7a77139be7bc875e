//! Rate buckets as GCRA (generic cell rate algorithm): one timestamp per
//! bucket, variable cost per request, refunds and surcharges when the real
//! cost is known. The same arithmetic runs in a Redis script when state is
//! shared, which is why it is written here rather than taken from a crate.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// `limit` units per `period`, bursting up to a full period's worth.
///
/// Costs come from clients (`max_tokens`) and providers (reported usage),
/// so every cost is first bounded by [`Gcra::bounded`]: no single request
/// can reserve or be charged more than the bucket holds, which keeps one
/// client's absurd number from pushing everyone else's turn days ahead.
#[derive(Debug)]
pub struct Gcra {
    /// Time one unit "costs".
    interval: Duration,
    /// How far ahead of now the theoretical arrival time may run.
    burst: Duration,
    /// Units per period: the most one request may hold.
    limit: u64,
    tat: Mutex<Option<Instant>>,
}

impl Gcra {
    /// A bucket of `limit` units per `period` (e.g. 60 requests per minute).
    pub fn new(limit: u64, period: Duration) -> Self {
        let limit = limit.max(1);
        let interval = period / u32::try_from(limit).unwrap_or(u32::MAX);
        Self { interval, burst: period, limit, tat: Mutex::new(None) }
    }

    /// `cost` as this bucket can hold it: at most one full period's units.
    pub fn bounded(&self, cost: u64) -> u64 {
        cost.min(self.limit)
    }

    /// Time `cost` units (already bounded) take to drain.
    fn span(&self, cost: u64) -> Duration {
        self.interval.saturating_mul(u32::try_from(cost).unwrap_or(u32::MAX)).min(self.burst)
    }

    /// Reserves `cost` units and returns how long to wait before using
    /// them (zero when the bucket has room). A reservation is never
    /// refused: waiting is queueing. A request costing more than the whole
    /// bucket reserves the whole bucket (see [`Gcra::bounded`]) and waits
    /// until the bucket is full again, never longer.
    pub fn reserve(&self, cost: u64, now: Instant) -> Duration {
        let Ok(mut tat) = self.tat.lock() else { return Duration::ZERO };
        let start = tat.map_or(now, |t| t.max(now));
        let new_tat = start + self.span(self.bounded(cost));
        *tat = Some(new_tat);
        let allowed_at = new_tat.checked_sub(self.burst).unwrap_or(now);
        allowed_at.saturating_duration_since(now)
    }

    /// Follows a bucket kept elsewhere (the shared store's): its time is
    /// `ahead` of now.
    pub fn follow(&self, ahead: Duration, now: Instant) {
        if let Ok(mut tat) = self.tat.lock() {
            // Beyond a full bucket is the backlog of reservations made
            // (requests waiting their turn): kept, so a reservation made
            // here next waits behind them.
            *tat = Some(now + ahead);
        }
    }

    /// How far the bucket's time is ahead of `now` (how full it is).
    pub fn ahead(&self, now: Instant) -> Duration {
        self.tat.lock().ok().and_then(|t| *t).map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Units reserved within the last period, as far as the bucket can
    /// tell (its theoretical arrival time ahead of now, in units).
    pub fn used(&self, now: Instant) -> u64 {
        let Ok(tat) = self.tat.lock() else { return 0 };
        let ahead = tat.map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let interval = self.interval.as_nanos().max(1);
        ahead.as_nanos().div_ceil(interval) as u64
    }

    /// Corrects an earlier reservation once the real cost is known:
    /// positive `delta` charges more, negative refunds (never into the
    /// past). Either way by at most one period's units.
    pub fn adjust(&self, delta: i64, now: Instant) {
        let Ok(mut tat) = self.tat.lock() else { return };
        let Some(t) = *tat else { return };
        let step = self.span(self.bounded(delta.unsigned_abs()));
        *tat = Some(if delta >= 0 { t + step } else { t.checked_sub(step).unwrap_or(now).max(now) });
    }
}

/// The correction that turns a reservation of `reserved` units into a
/// charge of `used`, both bounded by `limit` first: exact for every pair
/// of numbers a client or provider can send (no cast can wrap), so
/// settling returns exactly what was reserved.
pub fn correction(reserved: u64, used: u64, limit: u64) -> i64 {
    let bound = |n: u64| i64::try_from(n.min(limit)).unwrap_or(i64::MAX);
    // Both are in 0..=i64::MAX: the difference cannot overflow.
    bound(used) - bound(reserved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_over_the_limit_is_spread_out() {
        let g = Gcra::new(60, Duration::from_secs(60));
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..70).map(|_| g.reserve(1, t0)).collect();
        // The first 60 fit in the burst; the rest wait one second each more.
        assert!(waits[..60].iter().all(|w| w.is_zero()));
        assert_eq!(waits[60], Duration::from_secs(1));
        assert_eq!(waits[69], Duration::from_secs(10));
        // A minute later the bucket is full again.
        assert_eq!(g.reserve(1, t0 + Duration::from_secs(130)), Duration::ZERO);
    }

    #[test]
    fn token_costs_and_corrections() {
        let g = Gcra::new(1000, Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(g.reserve(800, t0), Duration::ZERO);
        // 800 estimated, 300 really used: refund 500.
        g.adjust(-500, t0);
        assert_eq!(g.reserve(600, t0), Duration::ZERO);
        // Now 900 used of 1000: 200 more must wait for 100 to drain (6 s).
        assert_eq!(g.reserve(200, t0), Duration::from_secs(6));
        // Oversized single request waits for an empty bucket, not forever.
        let h = Gcra::new(100, Duration::from_secs(60));
        assert_eq!(h.reserve(500, t0), Duration::ZERO);
    }

    #[test]
    fn no_single_cost_holds_more_than_the_bucket() {
        let g = Gcra::new(60_000, Duration::from_secs(60));
        let t0 = Instant::now();
        // A client's max_tokens of 4e9 (and of u64::MAX) reserves one
        // minute's tokens, not 50 days' (or an overflow).
        assert_eq!(g.reserve(4_000_000_000, t0), Duration::ZERO);
        assert_eq!(g.used(t0), 60_000);
        // The next client waits for the bucket to refill, at most a minute.
        let next = g.reserve(1_000, t0);
        assert!(next <= Duration::from_secs(60) && next >= Duration::from_secs(1), "{next:?}");
        let h = Gcra::new(60_000, Duration::from_secs(60));
        assert_eq!(h.reserve(u64::MAX, t0), Duration::ZERO);
        assert!(h.reserve(1, t0) <= Duration::from_secs(60));
        // A provider's usage of u64::MAX is charged as one full bucket.
        let k = Gcra::new(60_000, Duration::from_secs(60));
        k.reserve(100, t0);
        k.adjust(i64::MAX, t0);
        assert!(k.reserve(1, t0) <= Duration::from_secs(61));
    }

    #[test]
    fn settling_returns_exactly_what_was_reserved() {
        // Reserved and used both beyond any i64: the correction is zero,
        // not a wrapped charge.
        assert_eq!(correction(u64::MAX, 0, 60_000), -60_000);
        assert_eq!(correction(10_000_000_000_000_000_000, 10_000_000_000_000_000_000, 60_000), 0);
        assert_eq!(correction(500, 200, 60_000), -300);
        assert_eq!(correction(200, 500, 60_000), 300);
        assert_eq!(correction(u64::MAX, u64::MAX, u64::MAX), 0);
        assert_eq!(correction(0, u64::MAX, u64::MAX), i64::MAX);
        let g = Gcra::new(60_000, Duration::from_secs(60));
        let t0 = Instant::now();
        g.reserve(u64::MAX, t0);
        g.adjust(correction(u64::MAX, 0, 60_000), t0);
        assert_eq!(g.used(t0), 0, "a refused request's reservation comes back whole");
        assert_eq!(g.reserve(60_000, t0), Duration::ZERO);
    }
}
