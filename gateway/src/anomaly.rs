//! Warning when one client's volume is far above its own baseline.
//!
//! Seed 002's runaway turn was 160× its platform's median and nobody saw
//! it. Per client key, requests are counted per window and compared with a
//! rolling baseline of earlier windows; above `anomaly_factor` × baseline
//! (and a minimum volume) the requests are flagged, a warning is logged once
//! per window and a metric counts it. It warns; it never blocks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalyConfig {
    /// Flag when a window's count exceeds this × the baseline.
    pub factor: f64,
    /// ...and at least this many requests are in the window.
    pub min_requests: u64,
    /// Window length.
    pub window: Duration,
}

impl Default for AnomalyConfig {
    fn default() -> Self {
        Self { factor: 20.0, min_requests: 100, window: Duration::from_secs(60) }
    }
}

/// What one request's arrival means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Volume {
    /// Within the client's usual volume (or no baseline yet).
    Normal,
    /// Far above it; `first` for the first flagged request of the window.
    Flood {
        /// First flagged request of this window (log and count it once).
        first: bool,
        /// Requests so far in this window.
        count: u64,
        /// The client's baseline per window.
        baseline: f64,
    },
}

#[derive(Debug)]
struct Track {
    start: Instant,
    count: u64,
    baseline: Option<f64>,
    flagged: bool,
}

/// Per-client volume tracking.
#[derive(Debug, Default)]
pub struct Anomaly {
    config: AnomalyConfig,
    clients: Mutex<HashMap<String, Track>>,
}

impl Anomaly {
    /// A tracker with these thresholds.
    pub fn new(config: AnomalyConfig) -> Self {
        Self { config, clients: Mutex::new(HashMap::new()) }
    }

    /// Counts one request of `client` arriving at `now`.
    pub fn observe(&self, client: &str, now: Instant) -> Volume {
        let Ok(mut clients) = self.clients.lock() else { return Volume::Normal };
        // One lookup for a client seen before (every request but its first).
        if let Some(t) = clients.get_mut(client) {
            return self.count(t, now);
        }
        let t =
            clients.entry(client.to_owned()).or_insert(Track { start: now, count: 0, baseline: None, flagged: false });
        self.count(t, now)
    }

    /// Counts one request of a client's track at `now`.
    fn count(&self, t: &mut Track, now: Instant) -> Volume {
        let window = self.config.window.max(Duration::from_millis(1));
        let elapsed = now.saturating_duration_since(t.start);
        if elapsed >= window {
            let windows = (elapsed.as_nanos() / window.as_nanos()).min(1000) as u32;
            // Close the finished window into the baseline, then decay it
            // for any empty windows after it.
            let closed = t.count as f64;
            let mut base = t.baseline.map_or(closed, |b| 0.8 * b + 0.2 * closed);
            for _ in 1..windows {
                base *= 0.8;
            }
            t.baseline = Some(base);
            t.count = 0;
            t.flagged = false;
            t.start += window * windows;
        }
        t.count += 1;
        let Some(baseline) = t.baseline else { return Volume::Normal };
        if t.count >= self.config.min_requests && t.count as f64 > self.config.factor * baseline.max(1.0) {
            let first = !t.flagged;
            t.flagged = true;
            return Volume::Flood { first, count: t.count, baseline };
        }
        Volume::Normal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AnomalyConfig {
        AnomalyConfig { factor: 20.0, min_requests: 50, window: Duration::from_secs(60) }
    }

    #[test]
    fn steady_traffic_is_normal_a_flood_is_flagged_once_per_window() {
        let a = Anomaly::new(cfg());
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        for w in 0..5u32 {
            for i in 0..5u32 {
                assert_eq!(a.observe("alice", t0 + minute * w + Duration::from_secs(u64::from(i))), Volume::Normal);
            }
        }
        // 160× the usual: flagged once the volume and the factor are passed.
        let flood_at = t0 + minute * 5;
        let verdicts: Vec<Volume> = (0..800).map(|_| a.observe("alice", flood_at)).collect();
        let firsts = verdicts.iter().filter(|v| matches!(v, Volume::Flood { first: true, .. })).count();
        let flagged = verdicts.iter().filter(|v| matches!(v, Volume::Flood { .. })).count();
        assert_eq!(firsts, 1);
        assert_eq!(flagged, 800 - 100, "flagged from the 101st request (20 × baseline 5)");
        // Another client is not affected.
        assert_eq!(a.observe("bob", flood_at), Volume::Normal);
    }

    #[test]
    fn no_baseline_no_flag() {
        let a = Anomaly::new(cfg());
        let t0 = Instant::now();
        assert!((0..1000).all(|_| a.observe("new", t0) == Volume::Normal));
    }
}
