//! The waiting-queue scheduler's cost (bench/scheduler.sh runs it).
//!
//! 10,000 requests from 100 client keys wait; they are then handed out
//! one by one. Measured for the weighted fair queue with priorities
//! (`limits::fair::Fair`, weights 1–4, every tenth key batch) and, in the
//! same run, for the round robin it replaced (copied below as it was, the
//! reference): nanoseconds per request queued, per request handed out, and
//! bytes of heap per waiting request (counted by the allocator). Medians
//! of REPS interleaved repetitions.
//!
//! Usage: cargo run --release --example scheduler [-- REPS]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use tidegate::limits::fair::{Fair, Priority, Who};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const WAITING: usize = 10_000;
const KEYS: usize = 100;

/// What a waiter is in the limiter: the sender its slot is handed through.
type Payload = oneshot::Sender<()>;

/// The round robin between client keys that tidegate used before client
/// lanes (src/limits/mod.rs at b334244), unchanged but for the payload.
#[derive(Default)]
struct RoundRobin {
    ring: VecDeque<String>,
    waiters: HashMap<String, VecDeque<(u64, Payload)>>,
    queued: usize,
    next_id: u64,
}

impl RoundRobin {
    fn push(&mut self, client: &str, tx: Payload) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let q = self.waiters.entry(client.to_owned()).or_default();
        if q.is_empty() {
            self.ring.push_back(client.to_owned());
        }
        q.push_back((id, tx));
        self.queued += 1;
        id
    }

    fn pop(&mut self) -> Option<Payload> {
        while let Some(client) = self.ring.pop_front() {
            let Some(q) = self.waiters.get_mut(&client) else { continue };
            let Some((_, w)) = q.pop_front() else {
                self.waiters.remove(&client);
                continue;
            };
            if q.is_empty() {
                self.waiters.remove(&client);
            } else {
                self.ring.push_back(client);
            }
            self.queued -= 1;
            return Some(w);
        }
        None
    }
}

struct Run {
    push_ns: f64,
    pop_ns: f64,
    bytes_per_waiter: f64,
}

fn payloads() -> (Vec<Payload>, Vec<oneshot::Receiver<()>>) {
    (0..WAITING).map(|_| oneshot::channel()).unzip()
}

/// What both queues do, for one measurement loop.
trait Queue {
    /// Queues the payload of key number `k`.
    fn push(&mut self, k: usize, tx: Payload);
    /// The next payload to hand out.
    fn pop(&mut self) -> Option<Payload>;
}

/// The old round robin, with its key names.
struct Reference<'a>(RoundRobin, &'a [String]);

impl Queue for Reference<'_> {
    fn push(&mut self, k: usize, tx: Payload) {
        self.0.push(&self.1[k], tx);
    }
    fn pop(&mut self) -> Option<Payload> {
        self.0.pop()
    }
}

/// The weighted fair queue, with its keys.
struct Weighted<'a>(Fair<Payload>, &'a [Who]);

impl Queue for Weighted<'_> {
    fn push(&mut self, k: usize, tx: Payload) {
        self.0.push(&self.1[k], tx);
    }
    fn pop(&mut self) -> Option<Payload> {
        self.0.pop()
    }
}

/// Queues WAITING payloads from KEYS keys, then hands them all out.
fn measure(mut q: impl Queue) -> Run {
    let (txs, _rxs) = payloads();
    let before = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    for (i, tx) in txs.into_iter().enumerate() {
        q.push(i % KEYS, tx);
    }
    let push_ns = t.elapsed().as_nanos() as f64 / WAITING as f64;
    // The payloads were allocated before: what is counted is the queue's own.
    let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64 / WAITING as f64;
    let t = Instant::now();
    let mut n = 0;
    while let Some(tx) = q.pop() {
        std::hint::black_box(&tx);
        n += 1;
    }
    assert_eq!(n, WAITING);
    Run { push_ns, pop_ns: t.elapsed().as_nanos() as f64 / WAITING as f64, bytes_per_waiter: bytes }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    let names: Vec<String> = (0..KEYS).map(|k| format!("client-key-{k:03}")).collect();
    let whos: Vec<Who> = names
        .iter()
        .enumerate()
        .map(|(k, n)| Who {
            name: Arc::from(n.as_str()),
            weight: 1 + (k % 4) as u32,
            priority: if k % 10 == 0 { Priority::Batch } else { Priority::Interactive },
        })
        .collect();
    let (mut rr, mut wf) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        // Interleaved, alternating which goes first.
        if rep % 2 == 0 {
            rr.push(measure(Reference(RoundRobin::default(), &names)));
            wf.push(measure(Weighted(Fair::new(0.1), &whos)));
        } else {
            wf.push(measure(Weighted(Fair::new(0.1), &whos)));
            rr.push(measure(Reference(RoundRobin::default(), &names)));
        }
    }
    let m = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    println!("{WAITING} waiting requests from {KEYS} keys, medians of {reps} interleaved repetitions");
    println!("{:<34} {:>12} {:>12} {:>8}", "", "round robin", "weighted", "ratio");
    for (label, f) in [
        ("queue a request (µs)", (|r: &Run| r.push_ns / 1000.0) as fn(&Run) -> f64),
        ("hand out a request (µs)", |r: &Run| r.pop_ns / 1000.0),
        ("heap per waiting request (bytes)", |r: &Run| r.bytes_per_waiter),
    ] {
        let (a, b) = (m(&rr, f), m(&wf, f));
        println!("{label:<34} {a:>12.3} {b:>12.3} {:>7.2}×", b / a);
    }
}
