//! Request ids: UUIDv7 whose high 64 bits alone are unique and increasing.
//!
//! The id a client sees in `x-tidegate-request-id` is an ordinary UUIDv7
//! (RFC 9562): a 48-bit unix-millisecond timestamp, then random bits. Ours
//! fill the 12 bits after the version with a per-millisecond sequence
//! (RFC 9562 §6.2, method 1) instead of randomness, so the id's first
//! eight bytes — timestamp, version, sequence — never repeat within the
//! process and only grow. The journal uses them as its SQLite rowid: an
//! integer key appended at the end of its B-tree, the cheapest insert
//! SQLite has (see `journal`). The last eight bytes stay random, so ids
//! are still unique across replicas.
//!
//! More than 4096 ids in one millisecond borrow the next millisecond, and
//! a clock that steps back does not make ids go back: the id's timestamp
//! then runs slightly ahead of the wall clock until it catches up.

use std::sync::atomic::{AtomicU64, Ordering};

/// The last high half handed out (or the floor the journal set).
static LAST: Sequence = Sequence(AtomicU64::new(0));

/// High halves handed out so far (one per process; tests make their own).
struct Sequence(AtomicU64);

/// The version nibble (7) in the high half's bits 12..16.
const VERSION: u64 = 0x7000;

/// A fresh request id.
pub fn next() -> uuid::Uuid {
    let now = jiff::Timestamp::now().as_millisecond().max(0) as u64;
    let hi = LAST.next_high(now);
    // The low half: RFC variant bits and 62 random bits, from a v4 UUID
    // (the uuid crate's fast generator).
    let (_, lo) = uuid::Uuid::new_v4().as_u64_pair();
    uuid::Uuid::from_u64_pair(hi, lo)
}

impl Sequence {
    fn next_high(&self, now_ms: u64) -> u64 {
        let fresh = (now_ms << 16) | VERSION;
        let mut last = self.0.load(Ordering::Relaxed);
        loop {
            let candidate = if fresh > last { fresh } else { after(last) };
            match self.0.compare_exchange_weak(last, candidate, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return candidate,
                Err(seen) => last = seen,
            }
        }
    }

    fn raise_floor(&self, high: u64) {
        self.0.fetch_max(high, Ordering::Relaxed);
    }
}

/// The high half right after `last`: the next sequence number, or the
/// next millisecond's first when the 12-bit sequence is used up.
fn after(last: u64) -> u64 {
    if last & 0xfff == 0xfff { ((last >> 16) + 1) << 16 | VERSION } else { last + 1 }
}

/// Ids from now on sort after `high` (the journal's newest row at start),
/// so a clock set back across a restart cannot reuse a stored id.
pub fn raise_floor(high: u64) {
    LAST.raise_floor(high);
}

/// The unix millisecond an id was made at (its timestamp field).
pub fn millis(id: &uuid::Uuid) -> i64 {
    (id.as_u64_pair().0 >> 16) as i64
}

/// The smallest high half of an id made at unix millisecond `ms`: time
/// bounds on journal rows are key ranges.
pub fn high_at(ms: i64) -> i64 {
    ((ms.max(0) as u64) << 16) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_halves_are_unique_and_increasing_even_in_a_burst() {
        let ids: Vec<uuid::Uuid> = (0..20_000).map(|_| next()).collect();
        assert!(ids.windows(2).all(|w| w[0].as_u64_pair().0 < w[1].as_u64_pair().0));
        assert!(ids.iter().all(|id| id.get_version_num() == 7 && id.get_variant() == uuid::Variant::RFC4122));
        let now = jiff::Timestamp::now().as_millisecond();
        let first = millis(&ids[0]);
        assert!((now - 1000..=now + 1000).contains(&first), "timestamp {first} vs now {now}");
    }

    #[test]
    fn a_full_millisecond_borrows_the_next_and_a_clock_going_back_does_not_go_back() {
        let at = |ms: u64, seq: u64| (ms << 16) | VERSION | seq;
        assert_eq!(after(at(5, 0xffe)), at(5, 0xfff));
        assert_eq!(after(at(5, 0xfff)), at(6, 0));
        let seq = Sequence(AtomicU64::new(0));
        let base = 1_800_000_000_000;
        assert_eq!(seq.next_high(base - 20_000), at(base - 20_000, 0));
        seq.raise_floor(at(base, 7));
        let h = seq.next_high(base - 10_000);
        assert!(h > at(base, 7), "after the floor even with an earlier clock");
        assert_eq!(h >> 16, base);
        assert_eq!(high_at(base as i64) as u64 >> 16, base);
    }
}
