//! A subscription account's windows (a coding plan's 5-hour and weekly
//! use) as its answers last reported them, with a short history: what a
//! pool schedules by (`pick: reset-first`, `reserve:`), and what the admin
//! API, the metrics and the dashboard show.
//!
//! A window past its reset is read as empty again: the provider said when
//! it resets; until an answer says otherwise, that is the best guess.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::advertised::Window;

/// Samples kept a window: one a minute at most, so about the last hour
/// and a half of a busy account.
const HISTORY: usize = 90;

/// The short and the long window of one account.
#[derive(Debug, Default)]
pub struct Windows {
    /// An answer reported a window: until then, nothing to lock.
    seen: AtomicBool,
    state: Mutex<[Option<Seen>; 2]>,
}

#[derive(Debug, Clone)]
struct Seen {
    window: Window,
    at: Instant,
    /// (seconds since the Unix epoch, share used), oldest first.
    history: VecDeque<(i64, f64)>,
}

/// A window as shown and scheduled by.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowView {
    /// Share used now, 0 to 1 (0 again once past its reset).
    pub used: f64,
    /// Time until it resets, if the provider said.
    pub resets_in: Option<Duration>,
    /// Its length.
    pub span: Option<Duration>,
    /// Nothing more is served before its reset.
    pub exhausted: bool,
    /// (Unix seconds, share used) samples, oldest first.
    pub history: Vec<(i64, f64)>,
}

impl Seen {
    fn view(&self, now: Instant) -> WindowView {
        let elapsed = now.saturating_duration_since(self.at);
        let resets_in = self.window.resets_in.map(|r| r.saturating_sub(elapsed));
        let past = self.window.resets_in.is_some_and(|r| elapsed >= r);
        WindowView {
            used: if past { 0.0 } else { self.window.used },
            resets_in,
            span: self.window.span,
            exhausted: !past && self.window.exhausted(),
            history: self.history.iter().copied().collect(),
        }
    }
}

impl Windows {
    /// An answer's windows (short, long); a window it did not report
    /// keeps its last figures.
    pub fn observe(&self, windows: &[Option<Window>; 2], now: Instant) {
        if windows.iter().all(Option::is_none) {
            return;
        }
        let Ok(mut state) = self.state.lock() else { return };
        let wall = jiff::Timestamp::now().as_second();
        for (slot, window) in state.iter_mut().zip(windows) {
            let Some(window) = *window else { continue };
            let mut history = slot.take().map(|s| s.history).unwrap_or_default();
            let fresh = history.back().is_none_or(|&(t, used)| wall - t >= 60 || (used - window.used).abs() >= 0.01);
            if fresh {
                if history.len() == HISTORY {
                    history.pop_front();
                }
                history.push_back((wall, window.used));
            }
            *slot = Some(Seen { window, at: now, history });
        }
        self.seen.store(true, Ordering::Release);
    }

    /// The windows (short, long) as they stand now.
    pub fn view(&self, now: Instant) -> [Option<WindowView>; 2] {
        if !self.seen.load(Ordering::Acquire) {
            return [None, None];
        }
        let Ok(state) = self.state.lock() else { return [None, None] };
        [state[0].as_ref().map(|s| s.view(now)), state[1].as_ref().map(|s| s.view(now))]
    }

    /// Share used of the longest window reported (the weekly one when
    /// both are): what a pool's `reserve:` is measured against.
    pub fn longest_used(&self, now: Instant) -> Option<f64> {
        let [short, long] = self.view(now);
        long.or(short).map(|w| w.used)
    }

    /// When the capacity that would expire first resets: the soonest
    /// reset of a window with room left (`pick: reset-first`).
    pub fn next_reset(&self, now: Instant) -> Option<Duration> {
        self.view(now).into_iter().flatten().filter(|w| !w.exhausted).filter_map(|w| w.resets_in).min()
    }

    /// The window used up, if one is, and the time until it resets.
    pub fn exhausted(&self, now: Instant) -> Option<Duration> {
        self.view(now).into_iter().flatten().filter(|w| w.exhausted).filter_map(|w| w.resets_in).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(used: f64, resets_in_s: u64) -> Option<Window> {
        Some(Window { used, resets_in: Some(Duration::from_secs(resets_in_s)), span: None, rejected: false })
    }

    #[tokio::test(start_paused = true)]
    async fn windows_are_kept_with_a_history_and_empty_again_past_their_reset() {
        let w = Windows::default();
        let t0 = Instant::now();
        assert_eq!(w.view(t0), [None, None]);
        w.observe(&[window(0.8, 600), window(0.2, 4 * 3600)], t0);
        assert_eq!(w.longest_used(t0), Some(0.2));
        assert_eq!(w.next_reset(t0), Some(Duration::from_secs(600)));
        assert_eq!(w.exhausted(t0), None);
        // The short one used up: it is not where capacity expires first.
        w.observe(&[window(1.0, 300), None], t0);
        assert_eq!(w.next_reset(t0), Some(Duration::from_secs(4 * 3600)));
        assert_eq!(w.exhausted(t0), Some(Duration::from_secs(300)));
        let [short, long] = w.view(t0);
        assert_eq!(short.unwrap().history.len(), 2, "a new figure is a new sample");
        assert_eq!(long.unwrap().used, 0.2, "a window not reported keeps its figures");
        // Past its reset it reads empty.
        tokio::time::advance(Duration::from_secs(301)).await;
        let later = Instant::now();
        assert_eq!(w.exhausted(later), None);
        assert_eq!(w.view(later)[0].as_ref().unwrap().used, 0.0);
        // The history is bounded.
        for i in 0..(HISTORY as u32 + 10) {
            w.observe(&[window(f64::from(i % 50) / 50.0, 600), None], later);
        }
        assert!(w.view(later)[0].as_ref().unwrap().history.len() <= HISTORY);
    }
}
