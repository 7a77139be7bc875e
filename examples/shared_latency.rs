//! Acquire/release latency of a shared concurrency lease through Redis,
//! next to a plain PING on the same loopback Redis (the floor), measured in
//! the same run. Used by `bench/shared.py`.
//!
//! Usage: cargo run --release --example shared_latency -- redis://127.0.0.1:6379/0 [rounds]

use std::time::Duration;

use tokio::time::Instant;

use tidegate::shared::{SharedSlot, SharedState};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379/0".into());
    let rounds: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(5000);
    let state = SharedState::start(&url, Duration::from_secs(15), &["bench".to_owned()])?;
    for _ in 0..100 {
        if state.is_up() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(state.is_up(), "Redis at the given URL did not answer");
    let mut plain = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
    let (mut ping, mut acquire, mut release) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + rounds / 10 {
        let t0 = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut plain).await?;
        let t1 = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let SharedSlot::Leased(lease, _, _) = state.acquire("bench", (1000, 0, 0.0), deadline).await else {
            anyhow::bail!("no lease");
        };
        let t2 = Instant::now();
        lease.give_back().await;
        let t3 = Instant::now();
        if i >= rounds / 10 {
            // the first tenth warms up connections and script caches
            ping.push((t1 - t0).as_secs_f64() * 1e6);
            acquire.push((t2 - t1).as_secs_f64() * 1e6);
            release.push((t3 - t2).as_secs_f64() * 1e6);
        }
    }
    println!("{rounds} rounds, microseconds      p50      p99");
    for (name, v) in [("PING (floor)", &mut ping), ("acquire lease", &mut acquire), ("release lease", &mut release)] {
        println!("{name:<28} {:>8.1} {:>8.1}", percentile(v, 0.5), percentile(v, 0.99));
    }
    Ok(())
}
