//! The last few minutes per upstream, in 10-second buckets: requests by
//! outcome and failed attempts by class, for the dashboard's charts.
//!
//! Fixed size (a ring of [`WINDOW`] buckets × upstreams), updated once per
//! finished request under a short lock, read by `/admin/stats`: the page
//! reads these aggregates, never the journal's rows, so it costs the same
//! at 10 or 10,000 requests a second.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::json;

use crate::classify::Class;
use crate::record::Outcome;

/// Seconds per bucket.
pub const BUCKET_SECS: u64 = 10;
/// Buckets kept (5 minutes).
pub const WINDOW: usize = 30;

/// One bucket's counts for one upstream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Requests answered in full.
    pub completed: u32,
    /// Streams cut after content.
    pub incomplete: u32,
    /// Requests tidegate gave up on.
    pub failed: u32,
    /// Clients that went away.
    pub cancelled: u32,
    /// Refused before any upstream (only under "unrouted").
    pub rejected: u32,
    /// Failed attempts by class (retried or not).
    pub capacity: u32,
    /// See `capacity`.
    pub transient: u32,
    /// See `capacity`.
    pub request: u32,
    /// See `capacity`.
    pub auth: u32,
    /// See `capacity`.
    pub entitlement: u32,
}

impl Counts {
    fn outcome(&mut self, outcome: Outcome) {
        let n = match outcome {
            Outcome::Completed => &mut self.completed,
            Outcome::Incomplete => &mut self.incomplete,
            Outcome::Failed => &mut self.failed,
            Outcome::Cancelled => &mut self.cancelled,
            Outcome::Rejected => &mut self.rejected,
        };
        *n += 1;
    }

    fn class(&mut self, class: Class) {
        let n = match class {
            Class::Capacity => &mut self.capacity,
            Class::Transient => &mut self.transient,
            Class::Request => &mut self.request,
            Class::Auth => &mut self.auth,
            Class::Entitlement => &mut self.entitlement,
        };
        *n += 1;
    }
}

struct Slot {
    bucket: u64,
    /// One per upstream, then one for requests no upstream saw.
    counts: Vec<Counts>,
}

/// The ring of recent buckets.
pub struct Recent {
    names: Arc<[String]>,
    slots: Mutex<Vec<Slot>>,
}

impl std::fmt::Debug for Recent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recent")
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Recent {
    /// An empty window for these upstreams.
    pub fn new(names: Arc<[String]>) -> Self {
        let slots = (0..WINDOW).map(|_| Slot { bucket: 0, counts: vec![Counts::default(); names.len() + 1] }).collect();
        Self { names, slots: Mutex::new(slots) }
    }

    /// Counts one finished request: its outcome under the upstream that
    /// answered last (`None`: no upstream was asked), and each failed
    /// attempt's class under its upstream.
    pub fn observe(
        &self,
        upstream: Option<crate::ids::UpstreamId>,
        outcome: Outcome,
        failed_attempts: impl Iterator<Item = (crate::ids::UpstreamId, Class)>,
    ) {
        let failed = failed_attempts.map(|(u, class)| (u.index(), class));
        self.observe_at(now_secs(), upstream.map(crate::ids::UpstreamId::index), outcome, failed);
    }

    fn observe_at(
        &self,
        secs: u64,
        upstream: Option<usize>,
        outcome: Outcome,
        failed_attempts: impl Iterator<Item = (usize, Class)>,
    ) {
        let bucket = secs / BUCKET_SECS;
        let Ok(mut slots) = self.slots.lock() else { return };
        let slot = &mut slots[(bucket % WINDOW as u64) as usize];
        if slot.bucket != bucket {
            slot.bucket = bucket;
            slot.counts.iter_mut().for_each(|c| *c = Counts::default());
        }
        let unrouted = self.names.len();
        let index = |i: usize| if i < unrouted { i } else { unrouted };
        slot.counts[index(upstream.unwrap_or(unrouted))].outcome(outcome);
        for (i, class) in failed_attempts {
            slot.counts[index(i)].class(class);
        }
    }

    /// The window as JSON: per upstream (and `unrouted`), the buckets
    /// oldest first, each with its start time.
    pub fn snapshot(&self) -> serde_json::Value {
        self.snapshot_at(now_secs())
    }

    fn snapshot_at(&self, secs: u64) -> serde_json::Value {
        let current = secs / BUCKET_SECS;
        let first = current.saturating_sub(WINDOW as u64 - 1);
        let Ok(slots) = self.slots.lock() else { return json!({}) };
        let series = |i: usize| -> Vec<serde_json::Value> {
            (first..=current)
                .map(|b| {
                    let slot = &slots[(b % WINDOW as u64) as usize];
                    let counts = if slot.bucket == b { slot.counts[i] } else { Counts::default() };
                    let mut v = json!(counts);
                    v["t_ms"] = json!(b * BUCKET_SECS * 1000);
                    v
                })
                .collect()
        };
        let upstreams: Vec<_> =
            self.names.iter().enumerate().map(|(i, name)| json!({ "name": name, "buckets": series(i) })).collect();
        json!({
            "bucket_seconds": BUCKET_SECS,
            "upstreams": upstreams,
            "unrouted": { "name": "unrouted", "buckets": series(self.names.len()) },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_outcomes_and_attempt_classes_and_age_out() {
        let recent = Recent::new(vec!["a".to_owned(), "b".to_owned()].into());
        let t = 1_000_000;
        recent.observe_at(t, Some(0), Outcome::Completed, [(1, Class::Capacity), (1, Class::Capacity)].into_iter());
        recent.observe_at(t + 1, Some(1), Outcome::Failed, [(1, Class::Transient)].into_iter());
        recent.observe_at(t + 2, None, Outcome::Rejected, std::iter::empty());
        let snap = recent.snapshot_at(t + 5);
        let last = |i: usize| snap["upstreams"][i]["buckets"][WINDOW - 1].clone();
        assert_eq!(last(0)["completed"], 1);
        assert_eq!(
            (last(1)["capacity"].clone(), last(1)["transient"].clone(), last(1)["failed"].clone()),
            (json!(2), json!(1), json!(1))
        );
        assert_eq!(snap["unrouted"]["buckets"][WINDOW - 1]["rejected"], 1);
        assert_eq!(snap["upstreams"][0]["buckets"].as_array().map(Vec::len), Some(WINDOW));
        // Five minutes later the bucket has left the window; a new one
        // reusing its slot starts from zero.
        let later = t + BUCKET_SECS * WINDOW as u64;
        assert_eq!(recent.snapshot_at(later)["upstreams"][0]["buckets"][WINDOW - 1]["completed"], 0);
        recent.observe_at(later, Some(0), Outcome::Cancelled, std::iter::empty());
        let snap = recent.snapshot_at(later);
        assert_eq!(
            (
                snap["upstreams"][0]["buckets"][WINDOW - 1]["completed"].clone(),
                snap["upstreams"][0]["buckets"][WINDOW - 1]["cancelled"].clone()
            ),
            (json!(0), json!(1))
        );
    }
}
