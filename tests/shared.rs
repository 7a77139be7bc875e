//! Replicas sharing limits and health through a real Redis: one cap held
//! across processes, leases of a killed replica freed within their TTL,
//! local limits while Redis is down and shared ones when it returns, and
//! one replica's `Retry-After` honoured by the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use serde_json::Value;
use tidegate_simulate::Behavior;

const ADMIN: &str = "shared-admin";

fn config(listen: &str, redis: &str, sim: &tidegate_simulate::Simulator, extra: &str) -> String {
    format!(
        "listen: {listen}\njournal: \"off\"\nadmin_key: {ADMIN}\nstate: {redis}\nstate_lease_ttl: 2s\n\
         defaults:\n  retry: {{ base_delay: 20ms, max_delay: 100ms, max_attempts: 20 }}\n\
         upstreams:\n  - {{ name: sim, protocol: openai, base_url: \"{}\", max_concurrent: 3{extra} }}\n\
         models:\n  capped: {{ targets: [{{ upstream: sim }}] }}\n  slow: {{ targets: [{{ upstream: sim }}] }}\n  limited: {{ targets: [{{ upstream: sim }}] }}\n",
        sim.openai_url()
    )
}

async fn process_replica(redis: &str, sim: &tidegate_simulate::Simulator) -> Process {
    let p = Process::spawn(|addr, _| config(addr, redis, sim, ""));
    wait_shared(&p.base(), true).await;
    p
}

/// Replica A in this process and B as its own, both joined to `redis`,
/// with their base URLs.
async fn two_replicas(
    redis: &Redis,
    sim: &tidegate_simulate::Simulator,
) -> (tidegate::server::Running, String, Process, String) {
    let a = gateway(&config("127.0.0.1:0", &redis.url(), sim, "")).await;
    let a_base = format!("http://{}", a.addr);
    wait_shared(&a_base, true).await;
    let b = process_replica(&redis.url(), sim).await;
    let b_base = format!("http://{}", b.addr);
    (a, a_base, b, b_base)
}

/// The replica's `/admin/upstreams` (Null while it cannot answer).
async fn upstreams(base: &str) -> Value {
    match client().get(format!("{base}/admin/upstreams")).bearer_auth(ADMIN).send().await {
        Ok(resp) => resp.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Waits (bounded) until the replica at `base` reports shared state `up`.
async fn wait_shared(base: &str, up: bool) {
    for _ in 0..100 {
        if upstreams(base).await["upstreams"][0]["shared"] == up {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base} did not report shared={up}");
}

/// A request on each replica notices the store is gone; each then
/// reports it.
async fn notice_store_down(bases: &[&str]) {
    for base in bases {
        assert_eq!(ask_chat(base, "capped", Some("10s")).await.status(), 200);
    }
    for base in bases {
        wait_shared(base, false).await;
    }
}

/// Waits (bounded) until the replica at `base` counts `n` replicas
/// sharing the store (a heartbeat a second).
async fn wait_replicas(base: &str, n: u32) {
    for _ in 0..200 {
        if upstreams(base).await["upstreams"][0]["shared_replicas"] == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstreams(base).await["upstreams"][0]["shared_replicas"], n, "{base}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_hold_one_cap_of_three() {
    let redis = Redis::start();
    let sim = sim(&[("capped", Behavior { reject_over: Some(3), latency_ms: 150, ..Default::default() })]);
    let (_a, a_base, _b, b_base) = two_replicas(&redis, &sim).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let base = if i % 2 == 0 { a_base.clone() } else { b_base.clone() };
            tokio::spawn(async move { ask_chat(&base, "capped", None).await.status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        sim.state.max_in_flight_of("capped") <= 3,
        "the upstream saw {} at once",
        sim.state.max_in_flight_of("capped")
    );
    assert_eq!(sim.state.rejected.load(Ordering::SeqCst), 0, "nothing over the cap reached the upstream");
    // 40 requests of 150 ms, 3 at a time: at least 14 rounds.
    assert!(started.elapsed() >= Duration::from_millis(13 * 150), "{:?}", started.elapsed());
}

/// The upstream never saw more than its cap of 3, nor refused anything
/// since `before` refusals.
fn within_cap(sim: &tidegate_simulate::Simulator, before: usize) {
    assert_eq!(sim.state.rejected.load(Ordering::SeqCst), before, "the upstream refused requests over its cap");
    let most = sim.state.max_in_flight_of("capped");
    assert!(most <= 3, "the upstream saw {most} at once");
}

/// While Redis is down, each of two replicas holds its share of the cap
/// (3 / 2 → 1 each), not all of it: together they never send the upstream
/// more than its 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_keep_within_the_cap_while_redis_is_down() {
    let mut redis = Redis::start();
    let sim = sim(&[("capped", Behavior { reject_over: Some(3), latency_ms: 300, ..Default::default() })]);
    let (_a, a_base, _b, b_base) = two_replicas(&redis, &sim).await;
    // Each has seen both alive (a heartbeat a second).
    for base in [&a_base, &b_base] {
        wait_replicas(base, 2).await;
    }
    redis.stop();
    notice_store_down(&[&a_base, &b_base]).await;
    let burst = |n: usize| -> Vec<tokio::task::JoinHandle<u16>> {
        (0..n)
            .map(|i| {
                let base = if i % 2 == 0 { a_base.clone() } else { b_base.clone() };
                tokio::spawn(async move { ask_chat(&base, "capped", None).await.status().as_u16() })
            })
            .collect()
    };
    let before = sim.state.rejected.load(Ordering::SeqCst);
    for t in burst(16) {
        assert_eq!(t.await.unwrap(), 200);
    }
    within_cap(&sim, before);
    // Redis returns empty while both replicas have requests in flight:
    // every request still succeeds, and the leases taken during the outage
    // are adopted by the new Redis before either replica counts it as up,
    // so neither takes the whole cap on top of the other's (it was cap + 1
    // before they were).
    let running = burst(8);
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.restart();
    let after = burst(8);
    for t in running.into_iter().chain(after) {
        assert_eq!(t.await.unwrap(), 200);
    }
    let most = sim.state.max_in_flight_of("capped");
    assert!(most <= 3, "the upstream saw {most} at once after Redis returned");
    assert_eq!(sim.state.rejected.load(Ordering::SeqCst), before, "refused over its cap after Redis returned");
}

/// Replicas A and B joined to `redis`, in front of an upstream capped at 3
/// whose answers take 1.5 s, with A's three requests holding every slot
/// (B has seen them by its renewals: a second in); the replicas and the
/// requests.
async fn a_holding_every_slot(
    redis: &Redis,
) -> (
    tidegate_simulate::Simulator,
    (tidegate::server::Running, String, Process, String),
    Vec<tokio::task::JoinHandle<u16>>,
) {
    let sim = sim(&[("capped", Behavior { reject_over: Some(3), latency_ms: 1500, ..Default::default() })]);
    let replicas = two_replicas(redis, &sim).await;
    for base in [&replicas.1, &replicas.3] {
        wait_replicas(base, 2).await;
    }
    let on_a: Vec<_> = (0..3)
        .map(|_| {
            let base = replicas.1.clone();
            tokio::spawn(async move { ask_chat(&base, "capped", None).await.status().as_u16() })
        })
        .collect();
    // B reads the leases held with its renewals (every third of the 2 s
    // TTL): it has seen A's three by now.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    (sim, replicas, on_a)
}

/// When the store goes away while one replica holds every slot, the other
/// sends nothing on top of those requests: it keeps below the cap minus
/// the leases it last saw the others hold, until they may have ended
/// (their TTL). Before, it took its share (1 of 3) at once: 4 at the
/// upstream, one refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_store_goes_the_slots_another_replica_holds_are_not_exceeded() {
    let mut redis = Redis::start();
    let (sim, (_a, _a_base, _b, b_base), on_a) = a_holding_every_slot(&redis).await;
    redis.stop();
    let on_b: Vec<_> = (0..2)
        .map(|_| {
            let base = b_base.clone();
            tokio::spawn(async move { ask_chat(&base, "capped", Some("20s")).await.status().as_u16() })
        })
        .collect();
    for t in on_a.into_iter().chain(on_b) {
        assert_eq!(t.await.unwrap(), 200);
    }
    within_cap(&sim, 0);
}

/// The same when the store only stops answering (SIGSTOP): from B's first
/// unanswered call — before the breaker trips — B counts A's three leases
/// as held, and sends nothing on top of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_store_stops_answering_the_slots_another_replica_holds_are_not_exceeded() {
    let redis = Redis::start();
    let (sim, (_a, _a_base, _b, b_base), on_a) = a_holding_every_slot(&redis).await;
    redis.pause();
    // One at a time, so that B's calls trip its breaker late: each
    // request is at most one call to the store.
    let on_b = tokio::spawn({
        let base = b_base.clone();
        async move {
            let mut statuses = Vec::new();
            for _ in 0..2 {
                statuses.push(ask_chat(&base, "capped", Some("20s")).await.status().as_u16());
            }
            statuses
        }
    });
    for t in on_a {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(on_b.await.unwrap(), [200, 200]);
    redis.resume();
    within_cap(&sim, 0);
}

/// A store that stops answering without closing its socket (SIGSTOP: slow,
/// not gone) trips the store's breaker within a second: no request waits
/// on it much more than the 50 ms budget, limits go on as shares, and the
/// breaker closes once the store answers fast again; both ends are rows
/// of the journal's `events` table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_store_trips_its_breaker_within_a_second_and_both_ends_are_journaled() {
    let redis = Redis::start();
    let sim = sim(&[("capped", Behavior { reject_over: Some(3), latency_ms: 50, ..Default::default() })]);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let yaml = config("127.0.0.1:0", &redis.url(), &sim, "")
        .replace("journal: \"off\"", &format!("journal: \"{}\"", journal.display()));
    let a = gateway(&yaml).await;
    let base = format!("http://{}", a.addr);
    wait_shared(&base, true).await;
    redis.pause();
    let paused = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                while paused.elapsed() < Duration::from_millis(1500) {
                    let t0 = Instant::now();
                    assert_eq!(ask_chat(&base, "capped", Some("10s")).await.status(), 200);
                    slowest = slowest.max(t0.elapsed());
                }
                slowest
            })
        })
        .collect();
    let mut tripped = None;
    while paused.elapsed() < Duration::from_secs(3) {
        if upstreams(&base).await["upstreams"][0]["shared"] == false {
            tripped = Some(paused.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tripped = tripped.expect("the breaker never tripped on a store that stopped answering");
    assert!(tripped <= Duration::from_secs(1), "tripped {tripped:?} after the store stopped answering");
    for c in clients {
        let slowest = c.await.unwrap();
        // 50 ms upstream + at most one 50 ms wait on the store (+ noise).
        assert!(slowest < Duration::from_millis(400), "a request took {slowest:?} with the store stopped");
    }
    within_cap(&sim, 0);
    redis.resume();
    wait_shared(&base, true).await;
    let mut events: Vec<(String, String)> = Vec::new();
    for _ in 0..100 {
        let db = rusqlite::Connection::open(&journal).unwrap();
        events = db
            .prepare("SELECT kind, detail FROM events ORDER BY ts_ms")
            .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .unwrap_or_default();
        if events.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, "store_breaker_open");
    assert!(events[0].1.contains("slow"), "{events:?}");
    assert_eq!(events[1].0, "store_breaker_closed");
    assert!(!events.iter().any(|(_, d)| d.contains("redis://")), "{events:?}");
}

/// Two replicas in this process sharing `redis`, each allowing 20
/// requests a minute (and 50 at once) of the simulator's `capped`, both
/// joined and counting each other; with their base URLs.
async fn two_rated_replicas(
    redis: &Redis,
    sim: &tidegate_simulate::Simulator,
) -> (tidegate::server::Running, String, tidegate::server::Running, String) {
    let rated =
        |addr: &str| config(addr, &redis.url(), sim, ", rpm: 20").replace("max_concurrent: 3", "max_concurrent: 50");
    let a = gateway(&rated("127.0.0.1:0")).await;
    let b = gateway(&rated("127.0.0.1:0")).await;
    let (a_base, b_base) = (format!("http://{}", a.addr), format!("http://{}", b.addr));
    for base in [&a_base, &b_base] {
        wait_shared(base, true).await;
        wait_replicas(base, 2).await;
    }
    (a, a_base, b, b_base)
}

/// While Redis is down, each of two replicas keeps to its share of an
/// rpm bucket too (20 a minute: 10 each at once, not 20 each): together
/// they do not send the provider twice its rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_keep_to_their_share_of_a_rate_while_redis_is_down() {
    let mut redis = Redis::start();
    let sim = sim(&[("capped", Behavior { latency_ms: 10, ..Default::default() })]);
    let (_a, a_base, _b, b_base) = two_rated_replicas(&redis, &sim).await;
    redis.stop();
    notice_store_down(&[&a_base, &b_base]).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let base = if i % 2 == 0 { a_base.clone() } else { b_base.clone() };
            tokio::spawn(async move { ask_chat(&base, "capped", Some("2s")).await.status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(statuses.iter().all(|s| matches!(s, 200 | 429 | 504)), "{statuses:?}");
    // 20 a minute shared by two: 10 each at once (less the one each that
    // noticed the outage), and none more within the 2 s deadline (the
    // bucket refills one every 6 s for each).
    assert!(served <= 20, "{served} served: each replica took the whole bucket: {statuses:?}");
    assert!(served >= 16, "{served} served: less than its share while Redis is down: {statuses:?}");
    assert_eq!(sim.state.received().len(), served + 2);
}

/// What a replica spends of a rate while its breaker is tripped (the store
/// only paused: it keeps its buckets) is paid into the store's bucket when
/// it rejoins, so that the other replica does not spend it again: 20 a
/// minute, about 10 spent by A on its share with Redis stopped, leave B
/// about 10, not a full bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_spent_while_the_store_was_away_is_paid_into_it_on_rejoining() {
    let redis = Redis::start();
    let sim = sim(&[("capped", Behavior { latency_ms: 10, ..Default::default() })]);
    let (_a, a_base, _b, b_base) = two_rated_replicas(&redis, &sim).await;
    redis.pause();
    for _ in 0..40 {
        let _ = ask_chat(&a_base, "capped", Some("1s")).await;
        if upstreams(&a_base).await["upstreams"][0]["shared"] == false {
            break;
        }
    }
    for _ in 0..12 {
        let _ = ask_chat(&a_base, "capped", Some("1s")).await;
    }
    let spent = sim.state.received().len();
    assert!(spent >= 8, "A kept to less than its share: {spent}");
    redis.resume();
    wait_shared(&a_base, true).await;
    wait_shared(&b_base, true).await;
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let base = b_base.clone();
            tokio::spawn(async move { ask_chat(&base, "capped", Some("2s")).await.status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap(), 200 | 429 | 504));
    }
    let sent = sim.state.received().len();
    // 20 a minute, plus what refills meanwhile (one every 3 s).
    assert!(sent <= 24, "the upstream got {sent} requests within a minute of 20 (A spent {spent} with the store away)");
}

/// When the store goes away, each replica's share of an rpm bucket starts
/// from what the shared bucket had left, not from a full bucket: 16 of 20
/// a minute spent with Redis up leave both replicas together about 4 for
/// the rest of the minute (before, each started its share full: 10 more
/// each).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_spent_with_the_store_up_stays_spent_when_it_goes() {
    let mut redis = Redis::start();
    let sim = sim(&[("capped", Behavior { latency_ms: 10, ..Default::default() })]);
    let (_a, a_base, _b, b_base) = two_rated_replicas(&redis, &sim).await;
    for i in 0..16 {
        let base = if i % 2 == 0 { &a_base } else { &b_base };
        assert_eq!(ask_chat(base, "capped", Some("2s")).await.status(), 200);
    }
    redis.stop();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let base = if i % 2 == 0 { a_base.clone() } else { b_base.clone() };
            tokio::spawn(async move { ask_chat(&base, "capped", Some("2s")).await.status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap(), 200 | 429 | 504));
    }
    let sent = sim.state.received().len();
    // 20 a minute, plus what refills in the seconds this takes (one every
    // 3 s) and one each noticing the outage.
    assert!(sent <= 23, "the upstream got {sent} requests within a minute of 20");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replicas_slots_free_within_the_lease_ttl() {
    let redis = Redis::start();
    let sim = sim(&[("slow", Behavior { latency_ms: 30_000, ..Default::default() })]);
    let b = process_replica(&redis.url(), &sim).await;
    let b_base = format!("http://{}", b.addr);
    let _held: Vec<_> = (0..3)
        .map(|_| {
            let base = b_base.clone();
            tokio::spawn(async move { ask_chat(&base, "slow", None).await })
        })
        .collect();
    eventually("B holds all three slots", || sim.state.in_flight.load(Ordering::SeqCst) == 3).await;
    let mut conn = redis.conn().await;
    let leases: u32 = redis::cmd("ZCARD").arg("tidegate:{sim}:leases").query_async(&mut conn).await.unwrap();
    assert_eq!(leases, 3);

    let a = gateway(&config("127.0.0.1:0", &redis.url(), &sim, "")).await;
    let a_base = format!("http://{}", a.addr);
    wait_shared(&a_base, true).await;
    let mut b = b;
    b.child.kill().unwrap(); // SIGKILL: no chance to give anything back
    b.child.wait().unwrap();
    let killed = Instant::now();
    let resp = ask_chat(&a_base, "capped", Some("10s")).await;
    let waited = killed.elapsed();
    assert_eq!(resp.status(), 200);
    assert!(waited >= Duration::from_millis(500), "A got a slot while B's leases were live ({waited:?})");
    assert!(waited <= Duration::from_millis(2000 + 1500), "slots came back later than the 2 s TTL: {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_means_local_limits_and_back_means_shared() {
    let mut redis = Redis::start();
    let sim = sim(&[("slow", Behavior { latency_ms: 800, ..Default::default() })]);
    let a = gateway(&config("127.0.0.1:0", &redis.url(), &sim, "")).await;
    let base = format!("http://{}", a.addr);
    wait_shared(&base, true).await;
    redis.stop();
    for _ in 0..5 {
        assert_eq!(ask_chat(&base, "capped", Some("5s")).await.status(), 200, "serving goes on without Redis");
    }
    wait_shared(&base, false).await;
    // Local limits still hold: 3 at a time.
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move { ask_chat(&base, "slow", None).await.status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert!(sim.state.max_in_flight_of("slow") <= 3);

    redis.restart();
    wait_shared(&base, true).await;
    let slow = tokio::spawn({
        let base = base.clone();
        async move { ask_chat(&base, "slow", None).await.status().as_u16() }
    });
    let mut conn = redis.conn().await;
    let mut leases = 0u32;
    for _ in 0..50 {
        leases = redis::cmd("ZCARD").arg("tidegate:{sim}:leases").query_async(&mut conn).await.unwrap();
        if leases == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(leases, 1, "after Redis returned, the slot is a shared lease again");
    assert_eq!(slow.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replicas_retry_after_makes_the_other_hold_off() {
    let redis = Redis::start();
    let limited = rate_limited_once("5");
    let sim = sim(&[("limited", limited)]);
    let a = gateway(&config("127.0.0.1:0", &redis.url(), &sim, "")).await;
    let b = gateway(&config("127.0.0.1:0", &redis.url(), &sim, "")).await;
    let (a_base, b_base) = (format!("http://{}", a.addr), format!("http://{}", b.addr));
    wait_shared(&a_base, true).await;
    wait_shared(&b_base, true).await;

    let first = ask_chat(&a_base, "limited", Some("1s")).await;
    assert_eq!(first.status(), 429, "A: the wait asked for is beyond its deadline");
    let mut state = Value::Null;
    for _ in 0..100 {
        state = upstreams(&b_base).await;
        if state["upstreams"][0]["health"]["state"] == "cooling_down" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state["upstreams"][0]["health"]["state"], "cooling_down", "B heard of A's Retry-After: {state}");
    assert!(state["upstreams"][0]["health"]["for_ms"].as_u64().unwrap() > 3000, "{state}");
    let second = ask_chat(&b_base, "limited", Some("1s")).await;
    assert_eq!(second.status(), 429, "B holds off too");
    let retry_after: u64 = second.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((3..=5).contains(&retry_after), "B passes on the remaining wait: {retry_after}");
    assert_eq!(sim.state.received().len(), 1, "only A's request reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_on_one_replica_does_not_starve_the_other() {
    let redis = Redis::start();
    let sim = sim(&[("capped", Behavior { latency_ms: 100, ..Default::default() })]);
    let one = |addr: &str| config(addr, &redis.url(), &sim, "").replace("max_concurrent: 3", "max_concurrent: 1");
    let a = gateway(&one("127.0.0.1:0")).await;
    let b = gateway(&one("127.0.0.1:0")).await;
    let (a_base, b_base) = (format!("http://{}", a.addr), format!("http://{}", b.addr));
    wait_shared(&a_base, true).await;
    wait_shared(&b_base, true).await;
    let flood_started = Instant::now();
    let flood: Vec<_> = (0..25)
        .map(|_| {
            let base = a_base.clone();
            tokio::spawn(async move { ask_chat(&base, "capped", Some("30s")).await.status().as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    assert_eq!(ask_chat(&b_base, "capped", Some("30s")).await.status(), 200);
    let b_waited = asked.elapsed();
    for t in flood {
        assert_eq!(t.await.unwrap(), 200);
    }
    let flood_took = flood_started.elapsed();
    // One slot, 100 ms each: the flood needs 2.5 s; B, arriving behind at
    // most one of A's waiters, gets a turn within a few slots.
    assert!(flood_took >= Duration::from_millis(2400), "{flood_took:?}");
    assert!(b_waited <= Duration::from_millis(800), "B waited {b_waited:?} behind A's flood of {flood_took:?}");
    assert!(sim.state.max_in_flight_of("capped") <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_buckets_and_the_learned_limit_are_shared() {
    let redis = Redis::start();
    let sim = sim(&[("capped", Behavior { reject_over: Some(2), latency_ms: 150, ..Default::default() })]);
    // rpm 4: a minute's worth (4) may burst, then one per 15 s.
    let rated =
        |addr: &str| config(addr, &redis.url(), &sim, ", rpm: 4").replace("max_concurrent: 3", "max_concurrent: 8");
    let a = gateway(&rated("127.0.0.1:0")).await;
    let b = gateway(&rated("127.0.0.1:0")).await;
    let (a_base, b_base) = (format!("http://{}", a.addr), format!("http://{}", b.addr));
    wait_shared(&a_base, true).await;
    wait_shared(&b_base, true).await;
    for _ in 0..4 {
        assert_eq!(ask_chat(&a_base, "slow", Some("5s")).await.status(), 200);
    }
    let started = Instant::now();
    let fifth = ask_chat(&b_base, "slow", Some("2s")).await;
    assert_eq!(fifth.status(), 504, "B's bucket is A's: the fifth request of the minute cannot start within 2 s");
    assert!(started.elapsed() < Duration::from_millis(1500), "answered at once, not after waiting in vain");

    // The learned concurrency limit: A meets the cap of 2 (429 3009) and
    // lowers the shared limit; B, without ever seeing a 429, uses it.
    let c =
        gateway(&config("127.0.0.1:0", &redis.url(), &sim, "").replace("max_concurrent: 3", "max_concurrent: 8")).await;
    let d =
        gateway(&config("127.0.0.1:0", &redis.url(), &sim, "").replace("max_concurrent: 3", "max_concurrent: 8")).await;
    let (c_base, d_base) = (format!("http://{}", c.addr), format!("http://{}", d.addr));
    wait_shared(&c_base, true).await;
    wait_shared(&d_base, true).await;
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let base = c_base.clone();
            tokio::spawn(async move { ask_chat(&base, "capped", Some("20s")).await.status().as_u16() })
        })
        .collect();
    for t in burst {
        assert_eq!(t.await.unwrap(), 200);
    }
    let mut conn = redis.conn().await;
    let limit: String = redis::cmd("GET").arg("tidegate:{sim}:limit").query_async(&mut conn).await.unwrap();
    let limit: f64 = limit.parse().unwrap();
    assert!(limit < 8.0, "the shared limit was lowered from 8: {limit}");
    assert_eq!(ask_chat(&d_base, "capped", Some("5s")).await.status(), 200);
    let state = upstreams(&d_base).await;
    let seen = state["upstreams"][0]["effective_limit"].as_u64().unwrap();
    assert!(seen < 8, "D uses the limit C learned: {state}");
}

/// A store that restarts empty has forgotten the limit learned: the first
/// acquire after it puts back the one this replica learned, so the next
/// burst is not sent at the declared 8 to learn the cap of 2 again from
/// the provider's refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_learned_survives_the_store_restarting_empty() {
    let mut redis = Redis::start();
    let sim = sim(&[("capped", Behavior { reject_over: Some(2), latency_ms: 150, ..Default::default() })]);
    let c =
        gateway(&config("127.0.0.1:0", &redis.url(), &sim, "").replace("max_concurrent: 3", "max_concurrent: 8")).await;
    let base = format!("http://{}", c.addr);
    wait_shared(&base, true).await;
    let burst = |n: usize| {
        let base = base.clone();
        async move {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let base = base.clone();
                    tokio::spawn(async move { ask_chat(&base, "capped", Some("20s")).await.status().as_u16() })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap(), 200);
            }
        }
    };
    burst(8).await;
    let learning = sim.state.rejected.load(Ordering::SeqCst);
    assert!(learning > 0, "the cap of 2 was learned from refusals");
    redis.stop();
    redis.restart();
    // The replica notices (a call fails) and rejoins the empty store.
    for _ in 0..20 {
        assert_eq!(ask_chat(&base, "capped", Some("5s")).await.status(), 200);
        if upstreams(&base).await["upstreams"][0]["shared"] == false {
            break;
        }
    }
    wait_shared(&base, true).await;
    burst(12).await;
    let after = sim.state.rejected.load(Ordering::SeqCst) - learning;
    // Learned again it costs 6; put back, at most the probe of additive
    // increase past it (the level refused is remembered in the store,
    // which forgot it) and one more under a loaded machine.
    assert!(after <= 2, "{after} refusals after the store restarted: the cap was learned again");
    let mut conn = redis.conn().await;
    let limit: String = redis::cmd("GET").arg("tidegate:{sim}:limit").query_async(&mut conn).await.unwrap();
    assert!(limit.parse::<f64>().unwrap() < 3.0, "the learned limit is back in the store: {limit}");
}

/// Refusals come back together: seven leases held, five of them refused
/// at once, lower the shared limit to the two the provider accepted. Each
/// refusal lowers and gives its lease back in one step; lowered apart, all
/// five saw seven leases and the limit stopped at six.
#[tokio::test]
async fn a_wave_of_refusals_lowers_the_shared_limit_once_each() {
    use tidegate::shared::{SharedSlot, SharedState};
    let redis = Redis::start();
    let state = SharedState::start(&redis.url(), Duration::from_secs(30), &["u".to_string()]).unwrap();
    for _ in 0..100 {
        if state.is_up() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(state.is_up(), "joined the store");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut leases = Vec::new();
    for _ in 0..7 {
        match state.acquire("u", (100, 0, 0.0), deadline).await {
            SharedSlot::Leased(lease, limit, _) => {
                assert_eq!(limit, 100);
                leases.push(lease);
            }
            _ => panic!("a lease under a limit of 100"),
        }
    }
    let refused: Vec<_> = leases.drain(2..).collect();
    let lowered =
        futures_util::future::join_all(refused.into_iter().map(|l| state.lower(l, 100, Duration::from_secs(60)))).await;
    let mut conn = redis.conn().await;
    let limit: String = redis::cmd("GET").arg("tidegate:{u}:limit").query_async(&mut conn).await.unwrap();
    let held: u32 = redis::cmd("ZCARD").arg("tidegate:{u}:leases").query_async(&mut conn).await.unwrap();
    assert_eq!(
        (limit.as_str(), held),
        ("2", 2),
        "lowered to the accepted ones, the refused leases given back: {lowered:?}"
    );
    // The next acquire waits: two held under a limit of two.
    let wait = state.acquire("u", (100, 0, 0.0), Instant::now() + Duration::from_millis(300)).await;
    assert!(matches!(wait, SharedSlot::Deadline), "a third lease under the learned limit of 2");
}

/// A response stored at upstream `a` through replica one is continued at
/// `a` through replica two, although replica two lists `b` first and has
/// never seen the response: the pin is in Redis.
#[tokio::test]
async fn stored_response_pins_are_shared_between_replicas() {
    let redis = Redis::start();
    let (a, b) = (sim(&[]), sim(&[]));
    let replica = |order: &str| {
        format!(
            "listen: 127.0.0.1:0\njournal: \"off\"\nadmin_key: {ADMIN}\nstate: {}\n\
             upstreams:\n  - {{ name: a, protocol: openai, base_url: \"{}\" }}\n  - {{ name: b, protocol: openai, base_url: \"{}\" }}\n\
             models:\n  m: {{ targets: [{order}] }}\n",
            redis.url(),
            a.openai_url(),
            b.openai_url()
        )
    };
    let one = gateway(&replica("{ upstream: a }, { upstream: b }")).await;
    let two = gateway(&replica("{ upstream: b }, { upstream: a }")).await;
    for gw in [&one, &two] {
        wait_shared(&format!("http://{}", gw.addr), true).await;
    }
    let resp = client().post(url(&one, "/v1/responses")).body(r#"{"model":"m","input":"hi"}"#).send().await.unwrap();
    let id = resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    assert_eq!(a.state.received().len(), 1);
    let next = format!(r#"{{"model":"m","input":"more","previous_response_id":"{id}"}}"#);
    // The pin is written to Redis in the background: wait until it is there.
    let mut conn = redis.conn().await;
    for _ in 0..100 {
        let pinned: Option<String> =
            redis::cmd("GET").arg(format!("tidegate:pin:{id}")).query_async(&mut conn).await.unwrap();
        if pinned.is_some() {
            assert_eq!(pinned.as_deref(), Some("a"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resp = client().post(url(&two, "/v1/responses")).body(next).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(a.state.received().len(), 2, "continued where it is stored");
    assert_eq!(b.state.received().len(), 0, "never asked the account without it");
}

/// A conversation translated for a chat-only provider (which stores
/// nothing) is kept in Redis too, one turn per response: a replica that
/// never answered it continues it with the whole history, the first one
/// then continues the second's turn (a chain read back across replicas),
/// and a chain with a turn gone is refused, not sent half.
#[tokio::test]
async fn translated_conversations_are_kept_for_every_replica() {
    let redis = Redis::start();
    let (chat, replica) = chat_only_replica(&redis.url(), ADMIN);
    let (one, two) = (gateway(&replica).await, gateway(&replica).await);
    for gw in [&one, &two] {
        wait_shared(&format!("http://{}", gw.addr), true).await;
    }
    let mut conn = redis.conn().await;
    let sent_roles = || {
        let sent: Value = serde_json::from_slice(&chat.state.received().pop().unwrap().body).unwrap();
        let roles: Vec<String> =
            sent["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap().to_owned()).collect();
        (roles, sent)
    };
    // Redis is written in the background: wait (bounded) for a turn.
    async fn stored(conn: &mut redis::aio::MultiplexedConnection, id: &str) -> (String, String) {
        for _ in 0..200 {
            let (previous, items): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(format!("tidegate:kept:{id}"))
                .arg("previous")
                .arg("items")
                .query_async(conn)
                .await
                .unwrap();
            if let (Some(p), Some(i)) = (previous, items) {
                return (p, i);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("turn {id} never reached Redis");
    }

    let first = responses_turn(&one, "hello", None).await;
    assert_eq!(first.status(), 200);
    let id1 = first.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let (previous, items) = stored(&mut conn, &id1).await;
    assert_eq!(previous, "", "a first turn continues nothing");
    assert!(items.contains("hello"), "{items}");

    let second = responses_turn(&two, "more", Some(&id1)).await;
    assert_eq!(second.status(), 200, "replica two reads replica one's turn back");
    let id2 = second.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let (roles, sent) = sent_roles();
    assert_eq!(roles, ["user", "assistant", "user"], "the whole history: {sent}");
    assert_eq!(sent["messages"][0]["content"], "hello");
    assert_eq!(sent["messages"][2]["content"], "more");
    let (previous, items) = stored(&mut conn, &id2).await;
    assert_eq!(previous, id1, "the second turn links to the first");
    assert!(!items.contains("hello"), "each turn is stored once, not its whole history: {items}");

    let third = responses_turn(&one, "and more", Some(&id2)).await;
    assert_eq!(third.status(), 200, "replica one reads the chain of both turns back");
    let (roles, sent) = sent_roles();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"], "{sent}");
    assert_eq!(sent["messages"][4]["content"], "and more");

    // The first turn gone from Redis: a replica without it locally has no
    // whole conversation, and says so instead of sending half.
    let _: i64 = redis::cmd("DEL").arg(format!("tidegate:kept:{id1}")).query_async(&mut conn).await.unwrap();
    let three = gateway(&replica).await;
    wait_shared(&format!("http://{}", three.addr), true).await;
    let before = chat.state.received().len();
    let refused = responses_turn(&three, "again", Some(&id2)).await;
    assert_eq!(refused.status(), 404);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "previous_response_not_found", "{v}");
    assert_eq!(chat.state.received().len(), before, "nothing sent");
}
