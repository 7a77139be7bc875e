//! Where the attempt loop stands, readable while it runs: a committed
//! keep-alive stream says it in its comments ("attempt 3 on glm-b").

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::ids::UpstreamId;

/// Where the attempt loop stands, readable while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Attempts started so far.
    pub attempt: AtomicU32,
    /// Upstream of the current attempt.
    pub upstream: AtomicUsize,
}

impl Progress {
    /// Records a new attempt.
    pub fn attempt(&self, upstream: UpstreamId) {
        self.upstream.store(upstream.index(), Ordering::Relaxed);
        self.attempt.fetch_add(1, Ordering::Relaxed);
    }

    /// Attempts started so far.
    pub fn attempts(&self) -> u32 {
        self.attempt.load(Ordering::Relaxed)
    }

    /// Upstream of the current attempt (`None` before the first).
    pub fn upstream(&self) -> Option<UpstreamId> {
        (self.attempts() > 0).then(|| UpstreamId::at(self.upstream.load(Ordering::Relaxed)))
    }
}
