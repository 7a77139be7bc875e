//! Allocations per request, counted so they cannot creep back: every heap
//! allocation of this test process is counted, the same requests are sent
//! straight to the simulator and through tidegate (journal on, its
//! defaults otherwise), and the difference per request is tidegate's own.
//! The budget is the measured figure with a small margin; a change that
//! adds allocations to the request path fails here and says how many.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting allocations (reallocations included).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Requests measured per path (after as many to warm up).
const N: u64 = 300;

/// Allocations per request of `N` sequential POSTs of `body` to `url`,
/// each read to its end.
async fn allocations_per_request(client: &reqwest::Client, url: &str, body: &str) -> f64 {
    let mut before = 0;
    for round in 0..2 {
        if round == 1 {
            before = ALLOCATIONS.load(Ordering::Relaxed);
        }
        for _ in 0..N {
            let r =
                client.post(url).header("content-type", "application/json").body(body.to_owned()).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / N as f64
}

/// tidegate's own allocations per plain chat request (model `gpt`, sent
/// upstream as `real-gpt`): through it, minus straight to the simulator.
async fn own_allocations() -> f64 {
    let sim = common::sim(&[]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let gw = common::gateway(&common::yaml(&sim, &format!("journal: {}", journal.display()), "", "")).await;
    let client = common::client();
    let body = |model: &str| format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hello"}}]}}"#);
    let direct =
        allocations_per_request(&client, &format!("{}/chat/completions", sim.openai_url()), &body("real-gpt")).await;
    let through = allocations_per_request(&client, &common::url(&gw, "/v1/chat/completions"), &body("gpt")).await;
    let own = through - direct;
    eprintln!("allocations per request: direct {direct:.1}, through tidegate {through:.1}, own {own:.1}");
    own
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_plain_request_costs_tidegate_few_allocations() {
    let own = own_allocations().await;
    assert!(own > 0.0, "through tidegate cost no more allocations than direct: the count does not measure it");
    assert!(own <= BUDGET_PLAIN, "tidegate's own allocations per plain request: {own:.1}, budget {BUDGET_PLAIN}");
}

/// Measured on 2026-12-03 (40 per plain request, journal on; 44 the day
/// before) plus a margin for the simulator's and client's own variation.
const BUDGET_PLAIN: f64 = 45.0;
