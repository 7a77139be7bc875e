//! Retry budget per upstream: retries may add at most `ratio` of the
//! upstream's recent requests plus a small floor per second, so a hard
//! outage cannot multiply the load on it.

use std::sync::Mutex;

use tokio::time::Instant;

const WINDOW_SECS: u64 = 10;

/// Sliding ten-second window of first attempts and retries.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    floor_per_sec: f64,
    origin: Instant,
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// (second, requests, retries) per slot, slot = second % WINDOW_SECS.
    slots: [(u64, u32, u32); WINDOW_SECS as usize],
}

impl Window {
    fn slot(&mut self, sec: u64) -> &mut (u64, u32, u32) {
        let slot = &mut self.slots[(sec % WINDOW_SECS) as usize];
        if slot.0 != sec {
            *slot = (sec, 0, 0);
        }
        slot
    }

    fn totals(&self, sec: u64) -> (u32, u32) {
        self.slots
            .iter()
            .filter(|(s, _, _)| sec.saturating_sub(*s) < WINDOW_SECS && *s <= sec)
            .fold((0, 0), |(req, ret), (_, a, b)| (req + a, ret + b))
    }
}

impl RetryBudget {
    /// A budget allowing `ratio` × requests + `floor_per_sec` × 10 s retries
    /// per ten seconds.
    pub fn new(ratio: f64, floor_per_sec: f64) -> Self {
        Self { ratio, floor_per_sec, origin: Instant::now(), window: Mutex::new(Window::default()) }
    }

    fn sec(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    /// Counts a request's first attempt.
    pub fn record_request(&self, now: Instant) {
        let sec = self.sec(now);
        if let Ok(mut w) = self.window.lock() {
            w.slot(sec).1 += 1;
        }
    }

    /// Whether one more retry fits (does not take it).
    pub fn has_room(&self, now: Instant) -> bool {
        let sec = self.sec(now);
        let Ok(w) = self.window.lock() else {
            return true;
        };
        let (requests, retries) = w.totals(sec);
        f64::from(retries) < self.floor_per_sec * WINDOW_SECS as f64 + self.ratio * f64::from(requests)
    }

    /// Counts a retry against the budget.
    pub fn spend(&self, now: Instant) {
        let sec = self.sec(now);
        if let Ok(mut w) = self.window.lock() {
            w.slot(sec).2 += 1;
        }
    }

    /// Takes one retry from the budget if there is one left.
    #[cfg(test)]
    pub fn try_retry(&self, now: Instant) -> bool {
        let room = self.has_room(now);
        if room {
            self.spend(now);
        }
        room
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_are_bounded_by_ratio_plus_floor() {
        let b = RetryBudget::new(0.2, 1.0);
        let t0 = b.origin;
        for _ in 0..100 {
            b.record_request(t0);
        }
        // 1/s × 10 s + 20% of 100 = 30 retries in the window.
        let granted = (0..1000).filter(|_| b.try_retry(t0 + Duration::from_millis(500))).count();
        assert_eq!(granted, 30);
        // The window slides: ten seconds later the old requests and retries are gone.
        let later = t0 + Duration::from_secs(11);
        let granted = (0..1000).filter(|_| b.try_retry(later)).count();
        assert_eq!(granted, 10, "only the floor remains");
    }

    #[test]
    fn a_hard_outage_cannot_multiply_load() {
        // 50 requests/s for 30 s, every one failing and wanting 5 retries.
        let b = RetryBudget::new(0.2, 1.0);
        let t0 = b.origin;
        let (mut sent, mut retried) = (0u32, 0u32);
        for s in 0..30u64 {
            let now = t0 + Duration::from_secs(s);
            for _ in 0..50 {
                b.record_request(now);
                sent += 1;
                retried += (0..5).filter(|_| b.try_retry(now)).count() as u32;
            }
        }
        let amplification = f64::from(sent + retried) / f64::from(sent);
        assert!(amplification <= 1.2 + 10.0 / 50.0 + 0.01, "amplification {amplification}");
        assert!(retried > 0);
    }
}
