//! Rate buckets as GCRA (generic cell rate algorithm): one timestamp per
//! bucket, variable cost per request, refunds and surcharges when the real
//! cost is known. The same arithmetic runs in a Redis script when state is
//! shared, which is why it is written here rather than taken from a crate.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// `limit` units per `period`, bursting up to a full period's worth.
#[derive(Debug)]
pub struct Gcra {
    /// Time one unit "costs".
    interval: Duration,
    /// How far ahead of now the theoretical arrival time may run.
    burst: Duration,
    tat: Mutex<Option<Instant>>,
}

impl Gcra {
    /// A bucket of `limit` units per `period` (e.g. 60 requests per minute).
    pub fn new(limit: u64, period: Duration) -> Self {
        let interval = period / u32::try_from(limit.max(1)).unwrap_or(u32::MAX);
        Self { interval, burst: period, tat: Mutex::new(None) }
    }

    /// Reserves `cost` units and returns how long to wait before using
    /// them (zero when the bucket has room). A reservation is never
    /// refused: waiting is queueing. A single request costing more than the
    /// whole burst waits until the bucket is empty.
    pub fn reserve(&self, cost: u64, now: Instant) -> Duration {
        let Ok(mut tat) = self.tat.lock() else { return Duration::ZERO };
        let start = tat.map_or(now, |t| t.max(now));
        let cost = self.interval.saturating_mul(u32::try_from(cost).unwrap_or(u32::MAX));
        let new_tat = start + cost;
        *tat = Some(new_tat);
        let allowed_at = new_tat.checked_sub(self.burst.max(cost)).unwrap_or(now);
        allowed_at.saturating_duration_since(now)
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
    /// positive `delta` charges more, negative refunds (never into the past).
    pub fn adjust(&self, delta: i64, now: Instant) {
        let Ok(mut tat) = self.tat.lock() else { return };
        let Some(t) = *tat else { return };
        let step = self.interval.saturating_mul(u32::try_from(delta.unsigned_abs()).unwrap_or(u32::MAX));
        *tat = Some(if delta >= 0 { t + step } else { t.checked_sub(step).unwrap_or(now).max(now) });
    }
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
}
