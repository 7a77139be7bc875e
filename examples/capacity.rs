//! Capacity absorption within a deadline (bench/capacity.sh runs it).
//!
//! Providers refusing 70% of attempts at random (`503 overloaded`), 30
//! concurrent requests, a 25 s deadline, tidegate's default settings
//! otherwise; once with one such target, once with three. Prints, per
//! repetition and as medians: the share of requests answered, upstream
//! attempts per answered request, the upstream's peak rate (most attempts
//! in any one second) and what the retry budget allowed over the run.
//!
//! Usage: cargo run --release --example capacity [-- REPS]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tidegate::config::Config;
use tidegate_simulate::{SimConfig, Simulator};
use tokio::time::Instant;

const REQUESTS: usize = 30;
const REFUSED: f64 = 0.7;

struct Figures {
    answered: usize,
    attempts: usize,
    peak_per_sec: usize,
    wall: Duration,
}

fn flaky(seed: u64) -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::refusing(REFUSED, seed)).unwrap()
}

async fn run(targets: usize, seed: u64) -> Figures {
    let sims: Vec<Simulator> = (0..targets).map(|i| flaky(seed * 10 + i as u64)).collect();
    let upstreams: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  - {{ name: u{i}, protocol: openai, base_url: \"{}\" }}\n", s.openai_url()))
        .collect();
    let list: Vec<String> = (0..targets).map(|i| format!("{{ upstream: u{i} }}")).collect();
    let yaml = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  deadline: 25s\nupstreams:\n{upstreams}models:\n  m:\n    targets: [{}]\n",
        list.join(", ")
    );
    let gw = tidegate::server::start(Config::parse(&yaml, &|_| None).unwrap()).await.unwrap();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(40)).build().unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (client, url) = (client.clone(), format!("http://{}/v1/chat/completions", gw.addr));
            tokio::spawn(async move {
                let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"request {i}"}}]}}"#);
                client.post(url).body(body).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
            })
        })
        .collect();
    let mut answered = 0;
    for t in tasks {
        if t.await.unwrap() == 200 {
            answered += 1;
        }
    }
    let wall = started.elapsed();
    let mut attempts = 0;
    let mut peak_per_sec = 0;
    for sim in &sims {
        let times: Vec<Instant> = sim.state.received().iter().map(|r| r.at).collect();
        attempts += times.len();
        for (i, t) in times.iter().enumerate() {
            let within = times[i..].iter().take_while(|u| **u < *t + Duration::from_secs(1)).count();
            peak_per_sec = peak_per_sec.max(within);
        }
    }
    Figures { answered, attempts, peak_per_sec, wall }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    println!(
        "{REQUESTS} concurrent requests, {:.0}% of attempts refused at random (503), 25 s deadline, default settings",
        REFUSED * 100.0
    );
    println!("retry budget (defaults): 20% of an upstream's requests of the last 10 s + 5/s, 10 s of burst\n");
    for targets in [1, 3] {
        let mut rows = Vec::new();
        for rep in 0..reps {
            let f = run(targets, rep as u64 + 1).await;
            let per = f.attempts as f64 / f.answered.max(1) as f64;
            // Upstream attempts the budget allows over the run, all targets:
            // first attempts + 20% of them, + 5/s and a 10 s burst each.
            let allowed = REQUESTS as f64 * 1.2 + targets as f64 * 5.0 * (f.wall.as_secs_f64() + 10.0);
            println!(
                "  {targets} target(s), run {}: answered {}/{REQUESTS}, {per:.2} attempts per answer, peak {} attempts/s on one upstream, {} attempts in all (the budget allows at most {:.0}), {:.1} s",
                rep + 1,
                f.answered,
                f.peak_per_sec,
                f.attempts,
                allowed,
                f.wall.as_secs_f64()
            );
            rows.push(f);
        }
        let ok = median(rows.iter().map(|f| f.answered as f64 / REQUESTS as f64).collect());
        let per = median(rows.iter().map(|f| f.attempts as f64 / f.answered.max(1) as f64).collect());
        let peak = median(rows.iter().map(|f| f.peak_per_sec as f64).collect());
        println!(
            "{targets} target(s), median of {reps}: {:.1}% answered, {per:.2} upstream attempts per answer, peak {peak:.0} attempts/s\n",
            ok * 100.0
        );
    }
}
