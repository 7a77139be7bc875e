//! Account pools: several credentials behind one upstream, each with its
//! own learned cap and health; an account without a plan benched at its
//! first answer and probed at growing intervals; a provider's wait of
//! hours probed instead of refused for hours.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use tidegate_simulate::{AccountBehavior, Behavior, Fault, SimConfig, Simulator};

const NO_PLAN: &str = r#"{"error_code":"TM.00001005","error_msg":"no active plan for this account"}"#;

/// A simulator whose accounts `key-a` and `key-b` take 2 requests at once
/// each (not configured in tidegate: learned), and `key-c` has no plan.
fn pool_sim() -> Simulator {
    pool_sim_answering_in(300)
}

/// [`pool_sim`] with answers taking `latency_ms`.
fn pool_sim_answering_in(latency_ms: u64) -> Simulator {
    let mut accounts = HashMap::new();
    for key in ["key-a", "key-b"] {
        accounts.insert(key.to_string(), AccountBehavior { max_in_flight: Some(2), ..Default::default() });
    }
    accounts
        .insert("key-c".to_string(), AccountBehavior { refuse: Some(Fault::new(400, NO_PLAN)), ..Default::default() });
    let config = SimConfig {
        default: Behavior { latency_ms, ..Default::default() },
        record: true,
        accounts,
        ..Default::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap()
}

fn pool_config(listen: &str, sim: &Simulator, top: &str) -> String {
    format!(
        "listen: {listen}\njournal: \"off\"\nadmin_key: adm\n{top}\n\
         defaults:\n  retry: {{ base_delay: 20ms, max_delay: 100ms }}\n\
         upstreams:\n  - name: glm\n    protocol: openai\n    base_url: \"{}\"\n\
         \x20   retry: [{{ on_body_contains: [TM.00001005], class: entitlement }}]\n\
         \x20   accounts:\n      - {{ name: a, api_key: key-a }}\n      - {{ name: b, api_key: key-b }}\n      - {{ name: c, api_key: key-c }}\n\
         models:\n  coder: {{ targets: [{{ upstream: glm }}] }}\n",
        sim.openai_url()
    )
}

/// One request to alias `coder`.
async fn ask_coder(base: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/chat/completions"))
        .body(r#"{"model":"coder","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap()
}

async fn burst(base: &str, n: usize) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let base = base.to_string();
            tokio::spawn(async move { ask_coder(&base).await.status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

#[tokio::test(start_paused = true)]
async fn a_pool_learns_each_accounts_cap_and_benches_the_one_without_a_plan() {
    let sim = pool_sim();
    let gw = gateway(&pool_config("127.0.0.1:0", &sim, "")).await;
    let base = format!("http://{}", gw.addr);
    let statuses = burst(&base, 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (a, b, c) = (sim.state.account("key-a"), sim.state.account("key-b"), sim.state.account("key-c"));
    assert_eq!(c.requests, 1, "the account without a plan is met by one request, not a crowd");
    assert_eq!(a.requests + b.requests - a.over_cap - b.over_cap, 12, "{a:?} {b:?}");
    // Learned: a second burst provokes no refusal on either account.
    let statuses = burst(&base, 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (a2, b2) = (sim.state.account("key-a"), sim.state.account("key-b"));
    assert_eq!((a2.over_cap, b2.over_cap), (a.over_cap, b.over_cap), "refused again after learning its cap");
    assert!(a2.requests > a.requests && b2.requests > b.requests, "both accounts serve: {a2:?} {b2:?}");
    assert_eq!(sim.state.account("key-c").requests, 1, "benched: not asked again before its probe");
    // The admin API names accounts, never their keys.
    let admin = client().get(format!("{base}/admin/upstreams")).bearer_auth("adm").send().await.unwrap();
    let text = admin.text().await.unwrap();
    assert!(!text.contains("key-c") && !text.contains("key-a"), "{text}");
    let admin: serde_json::Value = serde_json::from_str(&text).unwrap();
    let benched = admin["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == "glm/c").unwrap();
    assert_eq!(benched["health"]["state"], "benched", "{benched}");
    assert_eq!(benched["pool"], "glm");
    // The metrics too: per account by name.
    let metrics =
        client().get(format!("{base}/metrics")).bearer_auth("adm").send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("upstream=\"glm/a\"") && metrics.contains("upstream=\"glm/b\""), "{metrics}");
    assert!(!metrics.contains("key-a") && !metrics.contains("key-c"));
    // A minute on, one request probes it (and it is benched again, twice as long).
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(burst(&base, 4).await.iter().all(|s| *s == 200));
    assert_eq!(sim.state.account("key-c").requests, 2, "one probe after the first interval");
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(burst(&base, 4).await.iter().all(|s| *s == 200));
    assert_eq!(sim.state.account("key-c").requests, 2, "the interval doubled after a failed probe");
}

#[tokio::test(start_paused = true)]
async fn every_account_benched_answers_at_once_with_each_reason() {
    let mut accounts = HashMap::new();
    for key in ["key-a", "key-b"] {
        accounts
            .insert(key.to_string(), AccountBehavior { refuse: Some(Fault::new(400, NO_PLAN)), ..Default::default() });
    }
    let sim =
        Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig { record: true, accounts, ..Default::default() })
            .unwrap();
    let config = pool_config("127.0.0.1:0", &sim, "").replace("      - { name: c, api_key: key-c }\n", "");
    let gw = gateway(&config).await;
    let base = format!("http://{}", gw.addr);
    // The first request meets both accounts (one each) and gets the answer.
    let first = ask_coder(&base).await;
    assert_eq!(first.status().as_u16(), 400);
    assert!(first.text().await.unwrap().contains("TM.00001005"));
    let started = tokio::time::Instant::now();
    let resp = ask_coder(&base).await;
    assert!(started.elapsed() < Duration::from_secs(1), "benched accounts answer at once");
    assert_eq!(resp.status().as_u16(), 502);
    let retry_after: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry_after), "until the first probe: {retry_after}");
    let text = resp.text().await.unwrap();
    assert!(text.contains("glm/a") && text.contains("glm/b") && text.contains("TM.00001005"), "{text}");
    assert!(text.contains("benched"), "{text}");
    assert_eq!(sim.state.account("key-a").requests + sim.state.account("key-b").requests, 2);
}

#[tokio::test(start_paused = true)]
async fn a_wait_of_hours_is_probed_instead_of_refusing_for_hours() {
    let limit = r#"{"type":"error","error":{"type":"rate_limit_error","message":"session limit reached"}}"#;
    let sim = sim(&[(
        "claude",
        Behavior { script: vec![Fault::new(429, limit).header("retry-after", "7200")], ..Default::default() },
    )]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let ask = || async {
        client()
            .post(url(&gw, "/v1/messages"))
            .body(r#"{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    // The answer that asked for two hours: told at once.
    assert_eq!(ask().await, 429);
    // Within the first interval: answered at once without reaching it.
    assert_eq!(ask().await, 429);
    assert_eq!(sim.state.received().len(), 1);
    // After it, one probe finds the provider serving again.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(ask().await, 200);
    assert_eq!(ask().await, 200);
    assert_eq!(sim.state.received().len(), 3);
}

/// Upstreams `u1` and `u2` on their own simulators, alias `coder`
/// balanced over both.
fn balanced(one: &Simulator, two: &Simulator, affinity: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  retry: {{ base_delay: 20ms, max_delay: 100ms }}\n\
         upstreams:\n  - {{ name: u1, protocol: openai, base_url: \"{}\" }}\n  - {{ name: u2, protocol: openai, base_url: \"{}\" }}\n\
         models:\n  coder: {{ strategy: balance, targets: [{{ upstream: u1 }}, {{ upstream: u2 }}]{affinity} }}\n",
        one.openai_url(),
        two.openai_url()
    )
}

/// One turn of `session`: the upstream that answered it.
async fn turn(base: &str, session: &str) -> String {
    let resp = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("x-tidegate-session", session)
        .body(r#"{"model":"coder","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()["x-tidegate-upstream"].to_str().unwrap().to_string()
}

#[tokio::test(start_paused = true)]
async fn sessions_stay_on_their_own_targets_and_move_once_when_theirs_fails() {
    let slow = Behavior { latency_ms: 200, ..Default::default() };
    let (one, two) = (sim(&[("coder", slow.clone())]), sim(&[("coder", slow)]));
    let gw = gateway(&balanced(&one, &two, "")).await;
    let base = format!("http://{}", gw.addr);
    // The first turns arrive together: balance spreads them.
    let (a, b) = tokio::join!(turn(&base, "session-a"), turn(&base, "session-b"));
    assert_ne!(a, b, "the first turns went to the same target");
    // Later turns, one at a time (balance alone would send each to u1).
    for _ in 0..5 {
        assert_eq!(turn(&base, "session-a").await, a);
        assert_eq!(turn(&base, "session-b").await, b);
    }
    // a's target starts answering 529: a moves once, and stays moved.
    let (a_sim, b_sim) = if a == "u1" { (&one, &two) } else { (&two, &one) };
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    a_sim.state.set_outage(Some(Fault::new(529, overloaded)));
    let seen = a_sim.state.received().len();
    assert_eq!(turn(&base, "session-a").await, b, "moved to the target that serves");
    assert_eq!(a_sim.state.received().len(), seen + 1, "one refusal, then elsewhere");
    a_sim.state.set_outage(None);
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..4 {
        assert_eq!(turn(&base, "session-a").await, b, "stays where its cache now is");
        assert_eq!(turn(&base, "session-b").await, b);
    }
    assert_eq!(a_sim.state.received().len(), seen + 1);
    assert_eq!(b_sim.state.received().len(), 6 + 5 + 4, "b: 10 turns, a: 5 since it moved");
    // With affinity off, the same sequential turns all go to the least loaded: u1.
    let gw = gateway(&balanced(&one, &two, ", affinity: off")).await;
    let base = format!("http://{}", gw.addr);
    for session in ["session-a", "session-b", "session-a", "session-b"] {
        assert_eq!(turn(&base, session).await, "u1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_each_accounts_learned_cap_and_bench() {
    let redis = Redis::start();
    let sim = pool_sim();
    let top = format!("state: {}\nstate_lease_ttl: 2s", redis.url());
    let a = gateway(&pool_config("127.0.0.1:0", &sim, &top)).await;
    let a_base = format!("http://{}", a.addr);
    let b = Process::spawn(|addr, _| pool_config(addr, &sim, &top));
    let b_base = b.base();
    // Both replicas up and sharing.
    for base in [&a_base, &b_base] {
        let mut shared = false;
        for _ in 0..100 {
            let resp = client().get(format!("{base}/admin/upstreams")).bearer_auth("adm").send().await;
            if let Ok(resp) = resp
                && let Ok(v) = resp.json::<serde_json::Value>().await
                && v["upstreams"][0]["shared"] == true
            {
                shared = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(shared, "{base} is not sharing state");
    }
    let (one, two) = tokio::join!(burst(&a_base, 6), burst(&b_base, 6));
    assert!(one.iter().chain(&two).all(|s| *s == 200), "{one:?} {two:?}");
    let c = sim.state.account("key-c");
    assert!(c.requests <= 2, "the account without a plan: once per replica at most, got {}", c.requests);
    // Slow start is shared too: the window grows into each account's cap
    // over the next bursts, meeting it about once in all (twice at most:
    // a probe on each replica before either's refusal is back), not a
    // crowd per replica.
    for _ in 0..2 {
        let (one, two) = tokio::join!(burst(&a_base, 6), burst(&b_base, 6));
        assert!(one.iter().chain(&two).all(|s| *s == 200), "{one:?} {two:?}");
    }
    let (a1, b1) = (sim.state.account("key-a"), sim.state.account("key-b"));
    assert!(a1.over_cap <= 2 && b1.over_cap <= 2, "more than two refusals to learn a cap: {a1:?} {b1:?}");
    // Learned across replicas: two more bursts on both provoke no refusal.
    for _ in 0..2 {
        let (one, two) = tokio::join!(burst(&a_base, 6), burst(&b_base, 6));
        assert!(one.iter().chain(&two).all(|s| *s == 200), "{one:?} {two:?}");
    }
    let (a3, b3) = (sim.state.account("key-a"), sim.state.account("key-b"));
    assert_eq!((a3.over_cap, b3.over_cap), (a1.over_cap, b1.over_cap), "refused after learning: {a3:?} {b3:?}");
    assert!(a3.max_in_flight <= 2 && b3.max_in_flight <= 2);
    assert_eq!(sim.state.account("key-c").requests, c.requests, "benched on both replicas");
}

#[tokio::test]
async fn the_simulator_caches_prompts_per_account() {
    let config = SimConfig {
        prompt_cache: Some(tidegate_simulate::PromptCache { ttl_ms: 60_000, uncached_ms_per_1k_tokens: 0 }),
        ..Default::default()
    };
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap();
    let ask = |key: &'static str, body: String| {
        let url = format!("{}/chat/completions", sim.openai_url());
        async move {
            let v: serde_json::Value =
                client().post(url).bearer_auth(key).body(body).send().await.unwrap().json().await.unwrap();
            (
                v["usage"]["prompt_tokens"].as_u64().unwrap(),
                v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
            )
        }
    };
    let system = format!(r#"{{"role":"system","content":"{}"}}"#, "x".repeat(4000));
    let turn1 = format!(r#"{{"model":"m","messages":[{system},{{"role":"user","content":"a"}}]}}"#);
    let turn2 = format!(
        r#"{{"model":"m","messages":[{system},{{"role":"user","content":"a"}},{{"role":"assistant","content":"b"}},{{"role":"user","content":"c"}}]}}"#
    );
    let (total1, cached1) = ask("k1", turn1.clone()).await;
    assert_eq!(cached1, 0, "nothing cached at first");
    let (total2, cached2) = ask("k1", turn2.clone()).await;
    assert!(total2 > total1 && cached2 == total1, "turn 2 reads turn 1 cached: {total1} {total2} {cached2}");
    let (_, other) = ask("k2", turn2).await;
    assert_eq!(other, 0, "another account has nothing cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_binding_is_shared_between_replicas() {
    let redis = Redis::start();
    let slow = Behavior { latency_ms: 200, ..Default::default() };
    let (one, two) = (sim(&[("coder", slow.clone())]), sim(&[("coder", slow)]));
    let config = |listen: &str| {
        balanced(&one, &two, "").replace("listen: 127.0.0.1:0", &format!("listen: {listen}\nstate: {}", redis.url()))
    };
    let a = gateway(&config("127.0.0.1:0")).await;
    let a_base = format!("http://{}", a.addr);
    let b = Process::spawn(|addr, _| config(addr));
    let b_base = b.base();
    for _ in 0..100 {
        if client().get(format!("{b_base}/healthz")).send().await.is_ok_and(|r| r.status() == 200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two sessions at once on replica A: one of them is bound to u2.
    let (first, second) = tokio::join!(turn(&a_base, "shared-a"), turn(&a_base, "shared-b"));
    let on_u2 = if first == "u2" { "shared-a" } else { "shared-b" };
    assert!(first == "u2" || second == "u2", "{first} {second}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Replica B, asked one at a time, would send a new conversation to u1;
    // this one it sends where replica A left it.
    assert_eq!(turn(&b_base, "a-new-one").await, "u1");
    for _ in 0..3 {
        assert_eq!(turn(&b_base, on_u2).await, "u2", "replica B did not see the binding");
    }
}

/// The burst of a new user: 12 requests 0.1 s apart to a pool of three
/// accounts of unknown size (two take 2 at once, one has no plan). The
/// first answer proves an account; its window then grows by one an answer
/// (doubling a round trip), so each capped account refuses at most the one
/// request that finds its cap, instead of the crowd released at once.
#[tokio::test(start_paused = true)]
async fn a_pool_of_unknown_size_grows_into_its_accounts_without_a_herd() {
    // Answers take 2 s: the whole burst has arrived before the first.
    let sim = pool_sim_answering_in(2000);
    let gw = gateway(&pool_config("127.0.0.1:0", &sim, "")).await;
    let base = format!("http://{}", gw.addr);
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..12u64)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100 * i)).await;
                ask_coder(&base).await.status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let makespan = started.elapsed();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (a, b, c) = (sim.state.account("key-a"), sim.state.account("key-b"), sim.state.account("key-c"));
    assert_eq!(c.requests, 1, "the account without a plan is asked once");
    assert!(a.over_cap <= 1 && b.over_cap <= 1, "at most one refusal per capped account: {a:?} {b:?}");
    assert!(a.max_in_flight <= 2 && b.max_in_flight <= 2, "{a:?} {b:?}");
    // Ideal for accounts of unknown size: one round proving each account
    // with one request (2 s; the planless one refuses at once), then 10
    // requests over 4 sessions of 2 s (three rounds). Knowing the caps
    // beforehand it would be three rounds (6 s).
    let ideal = Duration::from_millis(8000);
    assert!(makespan <= ideal.mul_f64(1.05), "makespan {makespan:?} against the ideal {ideal:?}");
}

/// Two subscription accounts reporting their 5-hour and weekly windows
/// (Anthropic's unified headers): `a` at 80% of a window that resets in
/// 10 minutes, `b` at 20% of one that resets in 4 hours.
fn windowed_sim(a_long_used: f64, b_cap: Option<usize>) -> Simulator {
    use tidegate_simulate::advertise::{Window, WindowShape, Windows};
    let windows = |short_used: f64, short_reset: u64, long_used: f64| Windows {
        shape: WindowShape::Anthropic,
        short: Window { used: short_used, resets_in_s: short_reset, per_request: 0.05 },
        long: Window { used: long_used, resets_in_s: 3 * 24 * 3600, per_request: 0.0 },
    };
    let mut accounts = HashMap::new();
    accounts.insert(
        "key-a".to_string(),
        AccountBehavior { windows: Some(windows(0.8, 600, a_long_used)), ..Default::default() },
    );
    accounts.insert(
        "key-b".to_string(),
        AccountBehavior { windows: Some(windows(0.2, 4 * 3600, 0.2)), max_in_flight: b_cap, ..Default::default() },
    );
    let config = SimConfig {
        default: Behavior { latency_ms: 1000, ..Default::default() },
        record: true,
        accounts,
        ..Default::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap()
}

fn windowed_config(sim: &Simulator) -> String {
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\nadmin_key: adm\n\
         defaults:\n  retry: {{ base_delay: 20ms, max_delay: 100ms }}\n\
         upstreams:\n  - name: plan\n    protocol: anthropic\n    base_url: \"{}\"\n    pick: reset-first\n    reserve: 90%\n\
         \x20   accounts:\n      - {{ name: a, api_key: key-a }}\n      - {{ name: b, api_key: key-b }}\n\
         models:\n  claude: {{ targets: [{{ upstream: plan }}] }}\n",
        sim.anthropic_url()
    )
}

/// One request, a new conversation each (no affinity binds it).
async fn ask_claude(base: &str, priority: &str) -> u16 {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    client()
        .post(format!("{base}/v1/messages"))
        .header("x-tidegate-priority", priority)
        .header("anthropic-version", "2023-06-01")
        .body(format!(r#"{{"model":"claude","max_tokens":10,"messages":[{{"role":"user","content":"task {n}"}}]}}"#))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `pick: reset-first`: the account whose window resets in 10 minutes
/// gets the requests until that window is used up (the answer that says
/// so benches it until its reset), then the other; no request meets a
/// refusal for a used-up window. The windows are shown with a history.
#[tokio::test(start_paused = true)]
async fn reset_first_uses_the_window_that_expires_first_until_it_is_full() {
    let sim = windowed_sim(0.3, None);
    let gw = gateway(&windowed_config(&sim)).await;
    let base = format!("http://{}", gw.addr);
    // One request at each account first, so both windows are known.
    let (one, two) = tokio::join!(ask_claude(&base, "interactive"), ask_claude(&base, "interactive"));
    assert_eq!((one, two), (200, 200));
    let (a0, b0) = (sim.state.account("key-a").window_served, sim.state.account("key-b").window_served);
    assert_eq!((a0, b0), (1, 1), "one each while unproven");
    for _ in 0..8 {
        assert_eq!(ask_claude(&base, "interactive").await, 200);
    }
    let (a, b) = (sim.state.account("key-a"), sim.state.account("key-b"));
    // a: 80% + 5% a request: three more fill it (85, 90, 95, 100 after the 4th).
    assert_eq!(a.window_served, 4, "{a:?} {b:?}");
    assert_eq!(b.window_served, 6, "{a:?} {b:?}");
    assert_eq!(a.window_refused + b.window_refused, 0, "a request met a used-up window: {a:?} {b:?}");
    let admin: serde_json::Value =
        client().get(format!("{base}/admin/upstreams")).bearer_auth("adm").send().await.unwrap().json().await.unwrap();
    let a_row = admin["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == "plan/a").unwrap();
    assert_eq!(a_row["windows"]["short"]["exhausted"], true, "{a_row}");
    assert_eq!(a_row["health"]["state"], "benched", "{a_row}");
    assert!(a_row["windows"]["short"]["history"].as_array().unwrap().len() >= 2, "{a_row}");
    let metrics =
        client().get(format!("{base}/metrics")).bearer_auth("adm").send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("window_short_used_pct"), "{metrics}");
}

/// `reserve: 90%`: an account past 90% of its weekly window serves
/// interactive requests only; a batch request waits for the other account
/// (busy: one session at a time) while an interactive one is served from
/// the reserve at once.
#[tokio::test(start_paused = true)]
async fn an_account_in_reserve_serves_interactive_requests_while_batch_ones_wait() {
    let sim = windowed_sim(0.92, Some(1));
    let gw = gateway(&windowed_config(&sim)).await;
    let base = format!("http://{}", gw.addr);
    let (one, two) = tokio::join!(ask_claude(&base, "interactive"), ask_claude(&base, "interactive"));
    assert_eq!((one, two), (200, 200));
    let started = tokio::time::Instant::now();
    let batch = |delay_ms: u64| {
        let base = base.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let status = ask_claude(&base, "batch").await;
            (status, tokio::time::Instant::now())
        })
    };
    let (first, second) = (batch(0), batch(10));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let interactive_at = tokio::time::Instant::now();
    assert_eq!(ask_claude(&base, "interactive").await, 200);
    let interactive_took = interactive_at.elapsed();
    let ((s1, _), (s2, t2)) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((s1, s2), (200, 200));
    assert!(interactive_took < Duration::from_millis(1500), "the interactive request waited: {interactive_took:?}");
    assert!(t2.duration_since(started) >= Duration::from_millis(2000), "the second batch request did not wait");
    let (a, b) = (sim.state.account("key-a"), sim.state.account("key-b"));
    assert_eq!(a.window_served, 2, "a batch request used the reserve: {a:?} {b:?}");
    // b's one session is learned as any cap is (at most one refusal).
    assert_eq!(b.requests - b.over_cap, 3, "{a:?} {b:?}");
    assert!(b.over_cap <= 1, "{b:?}");
}
