//! Where concurrency slots live.
//!
//! A slot is a lease: taken under a limit, given back at the end. In one
//! process a counter is enough ([`MemorySlots`]); with shared state each
//! slot is also a lease in the store (`crate::shared`), with an expiry so
//! a replica that dies never leaks a slot. The queue in front of the slots
//! (order, fairness, waiting) stays in each process.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A taken slot.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    /// Unique per store.
    pub id: u64,
}

/// Slots of this process only.
#[derive(Debug, Default)]
pub struct MemorySlots {
    taken: AtomicU32,
    next: AtomicU64,
}

impl MemorySlots {
    /// Takes a slot if fewer than `limit` are taken.
    pub fn try_take(&self, limit: u32) -> Option<Lease> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Lease { id: self.next.fetch_add(1, Ordering::Relaxed) })
    }

    /// Gives a slot back.
    pub fn give_back(&self, _lease: Lease) {
        let _ = self.taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }

    /// Slots taken right now.
    pub fn taken(&self) -> u32 {
        self.taken.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_more_than_the_limit() {
        let s = MemorySlots::default();
        let leases: Vec<Lease> = (0..5).filter_map(|_| s.try_take(3)).collect();
        assert_eq!(leases.len(), 3);
        assert_eq!(s.taken(), 3);
        for l in leases {
            s.give_back(l);
        }
        assert_eq!(s.taken(), 0);
        assert!(s.try_take(0).is_none());
    }
}
