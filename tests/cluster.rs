//! Shared state on a Redis Cluster (`state: redis+cluster://…`): three
//! masters started on loopback from Debian's `redis-server`, replicas of
//! tidegate holding one cap per upstream whose keys live on different
//! nodes, a `Retry-After` heard through the cluster's pub/sub, and a
//! translated conversation whose turns (one key each, in different
//! slots) are read back by another replica.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate_simulate::Behavior;

const ADMIN: &str = "cluster-admin";

/// Two upstream names whose keys hash to different nodes (the hash tag
/// is the name): found, not assumed, so the test shows scripts on more
/// than one node.
fn names_on_two_nodes(cluster: &RedisCluster) -> (String, String) {
    let first = "up0".to_string();
    let node = cluster.node_of(&format!("tidegate:{{{first}}}:leases"));
    for i in 1..50 {
        let name = format!("up{i}");
        if cluster.node_of(&format!("tidegate:{{{name}}}:leases")) != node {
            return (first, name);
        }
    }
    panic!("no two names on two nodes among 50");
}

fn config(listen: &str, state: &str, sim: &tidegate_simulate::Simulator, (one, two): (&str, &str)) -> String {
    format!(
        "listen: {listen}\njournal: \"off\"\nadmin_key: {ADMIN}\nstate: {state}\nstate_lease_ttl: 2s\n\
         defaults:\n  retry: {{ base_delay: 20ms, max_delay: 100ms, max_attempts: 20 }}\n\
         upstreams:\n  - {{ name: {one}, protocol: openai, base_url: \"{url}\", max_concurrent: 3 }}\n\
         \x20 - {{ name: {two}, protocol: openai, base_url: \"{url}\", max_concurrent: 3 }}\n\
         models:\n  capped: {{ targets: [{{ upstream: {one} }}] }}\n  other: {{ targets: [{{ upstream: {two} }}] }}\n\
         \x20 limited: {{ targets: [{{ upstream: {one} }}] }}\n",
        url = sim.openai_url()
    )
}

/// The replica's `/admin/upstreams` (Null while it cannot answer).
async fn upstreams(base: &str) -> Value {
    match client().get(format!("{base}/admin/upstreams")).bearer_auth(ADMIN).send().await {
        Ok(resp) => resp.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Waits (bounded) until every upstream of the replica at `base` is shared.
async fn wait_shared(base: &str) {
    for _ in 0..200 {
        let v = upstreams(base).await;
        if v["upstreams"].as_array().is_some_and(|u| u.iter().all(|u| u["shared"] == true)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base} did not join the cluster: {}", upstreams(base).await);
}

/// A replica in this process and one as its own `tidegate serve`, both on
/// the cluster: 40 requests over both replicas to each of two upstreams
/// (capped at 3, their keys on different nodes): neither upstream ever
/// sees more than 3 at once, nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_on_a_cluster_hold_each_upstreams_cap() {
    let cluster = RedisCluster::start();
    let (one, two) = names_on_two_nodes(&cluster);
    let behavior = Behavior { reject_over: Some(3), latency_ms: 100, ..Default::default() };
    let sim = sim(&[("capped", behavior.clone()), ("other", behavior)]);
    let url = cluster.url();
    let a = gateway(&config("127.0.0.1:0", &url, &sim, (&one, &two))).await;
    let a_base = format!("http://{}", a.addr);
    let b = Process::spawn(|addr, _| config(addr, &url, &sim, (&one, &two)));
    let b_base = b.base();
    wait_shared(&a_base).await;
    wait_shared(&b_base).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let base = if i % 2 == 0 { a_base.clone() } else { b_base.clone() };
            let model = if i % 4 < 2 { "capped" } else { "other" };
            tokio::spawn(async move { ask_chat(&base, model, None).await.status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // Shared, each reaches its cap of 3; had the store failed (a script
    // across slots, say), each replica would keep to its share (1 of 3).
    for model in ["capped", "other"] {
        let most = sim.state.max_in_flight_of(model);
        assert_eq!(most, 3, "{model}'s upstream saw {most} at most at once");
    }
    for base in [&a_base, &b_base] {
        let v = upstreams(base).await;
        assert!(v["upstreams"].as_array().unwrap().iter().all(|u| u["shared"] == true), "{base} left the store: {v}");
    }
    assert_eq!(sim.state.rejected.load(Ordering::SeqCst), 0, "nothing over a cap reached the upstream");
}

/// One replica's `429 Retry-After: 5` makes the other hold off: the
/// hold's key and its message go through the cluster (a channel is a
/// script's argument there, not a key of another slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_reaches_the_other_replica_through_the_cluster() {
    let cluster = RedisCluster::start();
    let (one, two) = names_on_two_nodes(&cluster);
    let sim = sim(&[("limited", rate_limited_once("5"))]);
    let url = cluster.url();
    let a = gateway(&config("127.0.0.1:0", &url, &sim, (&one, &two))).await;
    let b = gateway(&config("127.0.0.1:0", &url, &sim, (&one, &two))).await;
    let (a_base, b_base) = (format!("http://{}", a.addr), format!("http://{}", b.addr));
    wait_shared(&a_base).await;
    wait_shared(&b_base).await;
    assert_eq!(ask_chat(&a_base, "limited", Some("1s")).await.status(), 429);
    let mut state = Value::Null;
    for _ in 0..100 {
        state = upstreams(&b_base).await;
        if state["upstreams"][0]["health"]["state"] == "cooling_down" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state["upstreams"][0]["health"]["state"], "cooling_down", "B heard of A's Retry-After: {state}");
    assert_eq!(ask_chat(&b_base, "limited", Some("1s")).await.status(), 429, "B holds off too");
    assert_eq!(sim.state.received().len(), 1, "only A's request reached the upstream");
}

/// A translated Responses conversation kept on the cluster: each turn is
/// one key (in its own slot), so the chain is read back a turn at a time;
/// the other replica continues it with the whole history.
#[tokio::test]
async fn translated_conversations_are_kept_on_a_cluster() {
    let cluster = RedisCluster::start();
    let (chat, replica) = chat_only_replica(&cluster.url(), ADMIN);
    let (one, two) = (gateway(&replica).await, gateway(&replica).await);
    for gw in [&one, &two] {
        wait_shared(&format!("http://{}", gw.addr)).await;
    }
    // Turns are written in the background: continue each (bounded) once
    // the other replica can read it back.
    let mut previous: Option<String> = None;
    let inputs = ["hello", "more", "and more", "the last"];
    for (i, input) in inputs.iter().enumerate() {
        let gw = if i % 2 == 0 { &one } else { &two };
        let mut answer = None;
        for _ in 0..100 {
            let resp = responses_turn(gw, input, previous.as_deref()).await;
            if resp.status() == 200 {
                answer = Some(resp.json::<Value>().await.unwrap());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let answer = answer.unwrap_or_else(|| panic!("turn {i} was never served"));
        previous = Some(answer["id"].as_str().unwrap().to_owned());
        let sent: Value = serde_json::from_slice(&chat.state.received().pop().unwrap().body).unwrap();
        let messages = sent["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 * i + 1, "turn {i} carries the whole history: {sent}");
        for (k, earlier) in inputs[..=i].iter().enumerate() {
            assert_eq!(messages[2 * k]["content"], *earlier, "{sent}");
        }
    }
}
