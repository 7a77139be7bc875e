//! Requests refused before routing (a wrong key, a foreign origin, an
//! unknown path) are counted, not stored one by one: a flood of them —
//! 265,852 `401`s in 4 s, measured — must not push real requests out of
//! the journal's bounded space, nor fill the disk with log lines.
//!
//! Every such refusal is counted (`tidegate_rejected_total{reason}`,
//! `/admin/stats`); per second, the first few are journaled and logged
//! like any request, the rest only counted, and one warning line per
//! second says how many were not.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

/// Refusals per second journaled and logged individually.
pub const SAMPLED_PER_SECOND: u32 = 5;

/// Counts refusals before routing and samples which are recorded.
#[derive(Debug)]
pub struct Flood {
    origin: Instant,
    total: AtomicU64,
    second: Mutex<Second>,
}

#[derive(Debug, Default)]
struct Second {
    at: u64,
    recorded: u32,
    skipped: u64,
}

impl Default for Flood {
    fn default() -> Self {
        Self { origin: Instant::now(), total: AtomicU64::new(0), second: Mutex::new(Second::default()) }
    }
}

impl Flood {
    /// Counts one refusal; whether to journal and log it individually.
    pub fn admit(&self, now: Instant) -> bool {
        self.total.fetch_add(1, Ordering::Relaxed);
        let sec = now.saturating_duration_since(self.origin).as_secs();
        let Ok(mut s) = self.second.lock() else { return false };
        if s.at != sec {
            if s.skipped > 0 {
                tracing::warn!(
                    skipped = s.skipped,
                    "requests refused before routing (bad key, foreign origin) in one second: counted, not journaled"
                );
            }
            *s = Second { at: sec, ..Second::default() };
        }
        if s.recorded < SAMPLED_PER_SECOND {
            s.recorded += 1;
            true
        } else {
            s.skipped += 1;
            false
        }
    }

    /// Refusals before routing since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_few_per_second_are_recorded_all_are_counted() {
        let f = Flood::default();
        let now = Instant::now();
        let admitted = (0..1000).filter(|_| f.admit(now)).count();
        assert_eq!(admitted, SAMPLED_PER_SECOND as usize);
        let later = now + Duration::from_secs(1);
        assert!(f.admit(later), "a new second records again");
        assert_eq!(f.total(), 1001);
    }
}
