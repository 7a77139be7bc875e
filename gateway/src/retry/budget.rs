//! Retry budget per upstream: blind retries (tidegate's own backoff, no
//! provider hint) may add at most `ratio` of the upstream's recent
//! requests plus a small floor per second, so an outage cannot be
//! multiplied by the gateway in front of it.
//!
//! The budget *paces*; it never fails a request. It is a GCRA schedule at
//! the allowed retry rate (`floor + ratio × requests of the last 10 s ÷
//! 10 s`) with ten seconds of burst: a retry that fits goes at once, one
//! that does not is given the next free time — in the order retries asked
//! — and waits for it within its deadline. Only when that time lies beyond
//! the deadline does the request end (see `retry::decide`).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const WINDOW_SECS: u64 = 10;

/// The burst a quiet upstream allows: this long's worth of retries.
const BURST: Duration = Duration::from_secs(WINDOW_SECS);

/// Sliding ten-second window of first attempts, and the retry schedule.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    floor_per_sec: f64,
    origin: Instant,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// (second, requests) per slot, slot = second % WINDOW_SECS.
    slots: [(u64, u32); WINDOW_SECS as usize],
    /// GCRA's theoretical arrival time of the next retry.
    tat: Instant,
}

impl State {
    fn requests(&self, sec: u64) -> u32 {
        self.slots.iter().filter(|(s, _)| sec.saturating_sub(*s) < WINDOW_SECS && *s <= sec).map(|(_, n)| *n).sum()
    }
}

impl RetryBudget {
    /// A budget allowing `ratio` × requests + `floor_per_sec` retries per
    /// second, averaged over ten seconds.
    pub fn new(ratio: f64, floor_per_sec: f64) -> Self {
        let origin = Instant::now();
        Self { ratio, floor_per_sec, origin, state: Mutex::new(State { slots: Default::default(), tat: origin }) }
    }

    fn sec(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    /// Time between two retries at the rate allowed now.
    fn interval(&self, state: &State, now: Instant) -> Duration {
        let rate = self.floor_per_sec + self.ratio * f64::from(state.requests(self.sec(now))) / WINDOW_SECS as f64;
        Duration::from_secs_f64(1.0 / rate.max(0.01))
    }

    /// Counts a request's first attempt.
    pub fn record_request(&self, now: Instant) {
        let sec = self.sec(now);
        if let Ok(mut s) = self.state.lock() {
            let slot = &mut s.slots[(sec % WINDOW_SECS) as usize];
            if slot.0 != sec {
                *slot = (sec, 0);
            }
            slot.1 += 1;
        }
    }

    /// How long from `now` until a blind retry fits (zero: it fits now).
    pub fn wait(&self, now: Instant) -> Duration {
        let Ok(s) = self.state.lock() else { return Duration::ZERO };
        s.tat.checked_sub(BURST).map_or(Duration::ZERO, |free| free.saturating_duration_since(now))
    }

    /// Takes the first retry slot at or after `at`; returns its time (the
    /// retry waits until then).
    pub fn reserve(&self, at: Instant) -> Instant {
        let Ok(mut s) = self.state.lock() else { return at };
        let free = s.tat.checked_sub(BURST).unwrap_or(s.tat);
        let go = at.max(free);
        let interval = self.interval(&s, go);
        s.tat = s.tat.max(go) + interval;
        go
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retries granted without waiting at `now`.
    fn granted(b: &RetryBudget, now: Instant, asked: usize) -> usize {
        (0..asked).filter(|_| b.wait(now).is_zero() && b.reserve(now) == now).count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate_of_ratio_plus_floor() {
        let b = RetryBudget::new(0.2, 1.0);
        let t0 = Instant::now();
        for _ in 0..100 {
            b.record_request(t0);
        }
        // 100 requests in the window: 1/s + 20% of 10/s = 3 retries/s,
        // ten seconds of it at once (and the one due now).
        let now = t0 + Duration::from_millis(500);
        assert_eq!(granted(&b, now, 1000), 31);
        // The next one is paced, not refused: a third of a second later.
        let next = b.reserve(now);
        assert!(next > now && next - now <= Duration::from_millis(340), "{:?}", next - now);
        assert!(b.wait(now) >= next - now, "the slot is taken: the next asker waits longer");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_scheduled_in_the_order_they_ask() {
        let b = RetryBudget::new(0.0, 2.0);
        let now = Instant::now();
        let slots: Vec<Instant> = (0..30).map(|_| b.reserve(now)).collect();
        // 20 fit the burst; then one every 500 ms, first come first served.
        assert!(slots[..20].iter().all(|t| *t == now));
        for pair in slots[20..].windows(2) {
            assert_eq!(pair[1] - pair[0], Duration::from_millis(500));
        }
        assert_eq!(b.wait(now), slots[29] + Duration::from_millis(500) - now);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_outage_cannot_multiply_load() {
        // 50 requests/s for 30 s, every one failing and wanting 5 retries:
        // the retries that fit within each request's 2 s are the budget's.
        let b = RetryBudget::new(0.2, 1.0);
        let t0 = Instant::now();
        let (mut sent, mut retried) = (0u32, 0u32);
        for s in 0..30u64 {
            let now = t0 + Duration::from_secs(s);
            for _ in 0..50 {
                b.record_request(now);
                sent += 1;
                for _ in 0..5 {
                    if b.wait(now) < Duration::from_secs(2) {
                        b.reserve(now);
                        retried += 1;
                    }
                }
            }
        }
        let amplification = f64::from(sent + retried) / f64::from(sent);
        // 20% + the floor (1/s over 50/s) + the initial burst.
        assert!(amplification <= 1.2 + 1.0 / 50.0 + 0.1, "amplification {amplification}");
        assert!(retried > 0);
    }
}
