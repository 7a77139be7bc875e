//! Config reload without a restart: under load nothing fails, a new key
//! works at once, learned limits carry over, a removed upstream's requests
//! finish, an invalid config changes nothing, and `SIGHUP` does the same
//! to a running process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use tidegate::config::Config;
use tidegate_simulate::{Behavior, SimConfig, Simulator};

fn simulator() -> Simulator {
    let config = SimConfig {
        default: Behavior { latency_ms: 5, ..Default::default() },
        models: [
            // More than 2 at once: "concurrency limit" (tidegate learns 2).
            ("capped".to_string(), Behavior { reject_over: Some(2), latency_ms: 50, ..Default::default() }),
            ("slow".to_string(), Behavior { latency_ms: 800, ..Default::default() }),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap()
}

/// The config file: keys, then `extra_upstream` and `extra_models`.
fn config_text(sim: &Simulator, keys: &str, extra_upstream: &str, extra_models: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\nadmin_key: adm\n\
         defaults:\n  retry: {{ base_delay: 10ms, max_delay: 50ms }}\n\
         client_keys:\n{keys}\n\
         upstreams:\n  - {{ name: main, protocol: openai, base_url: \"{url}\" }}\n  - {{ name: learner, protocol: openai, base_url: \"{url}\" }}\n{extra_upstream}\n\
         models:\n  gpt: {{ targets: [{{ upstream: main }}] }}\n  capped: {{ targets: [{{ upstream: learner }}] }}\n{extra_models}\n",
        url = sim.openai_url()
    )
}

async fn start(path: &std::path::Path) -> tidegate::server::Running {
    let config = Config::load(path).unwrap();
    tidegate::server::start_from(config, Some(path.to_path_buf())).await.unwrap()
}

async fn post(gw: &tidegate::server::Running, key: &str, model: &str) -> u16 {
    client()
        .post(url(gw, "/v1/chat/completions"))
        .bearer_auth(key)
        .body(format!(r#"{{"model":"{model}"}}"#))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_reload_under_load_fails_nothing_and_applies_at_once() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidegate.yaml");
    let old_key = "  - { name: alice, key: k-alice }";
    let gone = format!("  - {{ name: gone, protocol: openai, base_url: \"{}\" }}", sim.openai_url());
    let journal = format!("journal: {}", dir.path().join("j.db").display());
    let with_journal = |text: String| text.replace("journal: \"off\"", &journal);
    std::fs::write(&path, with_journal(config_text(&sim, old_key, &gone, "  slow: { targets: [{ upstream: gone }] }")))
        .unwrap();
    let gw = start(&path).await;

    // Teach the upstream its limit: a burst past "more than 2" lowers it.
    let burst: Vec<_> = (0..8).map(|_| post(&gw, "k-alice", "capped")).collect();
    for status in futures_util::future::join_all(burst).await {
        assert_eq!(status, 200);
    }
    let learned = admin_json(&gw, "/admin/upstreams").await["upstreams"][1]["effective_limit"].as_u64().unwrap();
    assert!(learned <= 3, "limit learned: {learned}");

    // A request in flight to the upstream the new config removes.
    let in_flight = tokio::spawn({
        let (base, key) = (url(&gw, "/v1/chat/completions"), "k-alice");
        async move { client().post(base).bearer_auth(key).body(r#"{"model":"slow"}"#).send().await.unwrap().status() }
    });
    // Load: 4 clients in a loop, until the reload is done and a bit after.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, endpoint) = (stop.clone(), url(&gw, "/v1/chat/completions"));
            tokio::spawn(async move {
                let http = client();
                let mut statuses = Vec::new();
                for _ in 0..2000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let resp = http.post(&endpoint).bearer_auth("k-alice").body(r#"{"model":"gpt"}"#).send().await;
                    statuses.push(resp.map_or(0, |r| r.status().as_u16()));
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let new_keys = "  - { name: alice, key: k-alice }\n  - { name: bob, key: k-bob }";
    let added = format!("  - {{ name: extra, protocol: openai, base_url: \"{}\" }}", sim.openai_url());
    std::fs::write(
        &path,
        with_journal(config_text(&sim, new_keys, &added, "  more: { targets: [{ upstream: extra }] }")),
    )
    .unwrap();
    let changes = gw.reload().await.unwrap();
    assert_eq!(changes.kept, ["main", "learner"]);
    assert_eq!(changes.added, ["extra"]);
    assert_eq!(changes.removed, ["gone"]);
    assert!(changes.needs_restart.is_empty(), "{changes:?}");
    // At once: the new key and the new model.
    assert_eq!(post(&gw, "k-bob", "more").await, 200);
    assert_eq!(post(&gw, "k-bob", "gpt").await, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut served = 0;
    for t in load {
        let statuses = t.await.unwrap();
        assert!(statuses.iter().all(|s| *s == 200), "a request failed across the reload: {statuses:?}");
        served += statuses.len();
    }
    eprintln!("{served} requests across the reload, all 200");
    assert!(served > 50, "the load was too light to mean anything: {served}");
    assert_eq!(in_flight.await.unwrap(), 200, "the removed upstream's request finished");
    // Learned state carried over with the unchanged upstream.
    let after = admin_json(&gw, "/admin/upstreams").await;
    assert_eq!(after["upstreams"][1]["name"], "learner");
    assert_eq!(after["upstreams"][1]["effective_limit"].as_u64().unwrap(), learned, "learned limit kept");
    assert_eq!(post(&gw, "k-alice", "slow").await, 404, "the removed route is gone for new requests");
    // The journal names each request's upstream as its own generation had
    // it: `gone` and `extra` had the same index in their configs.
    let mut by_model = std::collections::HashMap::new();
    for _ in 0..100 {
        let rows = admin_json(&gw, "/admin/requests?limit=2000").await;
        for r in rows["requests"].as_array().unwrap() {
            by_model
                .insert(r["model"].as_str().unwrap_or("").to_owned(), r["targets"].as_str().unwrap_or("").to_owned());
        }
        if by_model.contains_key("slow") && by_model.contains_key("more") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(by_model.get("slow").map(String::as_str), Some("gone"), "{by_model:?}");
    assert_eq!(by_model.get("more").map(String::as_str), Some("extra"), "{by_model:?}");
}

/// Waits (up to 6 s) until a spawned tidegate at `base` answers.
async fn until_healthy(base: &str) {
    for _ in 0..300 {
        if client().get(format!("{base}/healthz")).send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_invalid_config_changes_nothing() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidegate.yaml");
    let text = config_text(&sim, "  - { name: alice, key: k-alice }", "", "");
    std::fs::write(&path, &text).unwrap();
    let gw = start(&path).await;
    let broken =
        config_text(&sim, "  - { name: alice, key: k-alice }\n  - { name: bob, key: k-bob, weight: 0 }", "", "")
            .replace("base_url:", "max_concurent: 3, base_url:");
    std::fs::write(&path, broken).unwrap();
    let err = gw.reload().await.unwrap_err().to_string();
    assert!(err.contains("max_concurent"), "{err}");
    // The same through the admin endpoint: 400 with the problems.
    let resp = client().post(url(&gw, "/admin/reload")).bearer_auth("adm").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["reloaded"], false);
    assert!(v["problems"].to_string().contains("max_concurent"), "{v}");
    let denied = client().post(url(&gw, "/admin/reload")).send().await.unwrap();
    assert_eq!(denied.status(), 401, "reload needs the admin key");
    assert_eq!(post(&gw, "k-alice", "gpt").await, 200, "the running config still serves");
    assert_eq!(post(&gw, "k-bob", "gpt").await, 401, "nothing of the invalid config applied");
    // Fixed: the admin endpoint applies it.
    std::fs::write(
        &path,
        config_text(&sim, "  - { name: alice, key: k-alice }\n  - { name: bob, key: k-bob }", "", ""),
    )
    .unwrap();
    let resp = client().post(url(&gw, "/admin/reload")).bearer_auth("adm").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(post(&gw, "k-bob", "gpt").await, 200);
}

#[tokio::test]
async fn sighup_reloads_a_running_process() {
    let sim = simulator();
    let proc = Process::spawn(|addr, _| {
        config_text(&sim, "  - { name: alice, key: k-alice }", "", "").replace("127.0.0.1:0", addr)
    });
    let base = proc.base();
    let send = |key: &'static str| {
        let base = base.clone();
        async move {
            client()
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(key)
                .body(r#"{"model":"gpt"}"#)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    for _ in 0..300 {
        if send("k-alice").await == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(send("k-bob").await, 401);
    // The image's HEALTHCHECK command, against this process and a dead port.
    let health = |url: String| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
            .args(["healthcheck", "--url", &url])
            .output()
            .unwrap()
    };
    assert!(health(format!("{base}/healthz")).status.success());
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let out = health(format!("http://{dead}/healthz"));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
    let path = proc.dir.path().join("tidegate.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "  - { name: alice, key: k-alice }",
            "  - { name: alice, key: k-alice }\n  - { name: bob, key: k-bob }",
        ),
    )
    .unwrap();
    let pid = i32::try_from(proc.child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let mut status = 0;
    for _ in 0..200 {
        status = send("k-bob").await;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200, "the new key works after SIGHUP");
    assert_eq!(send("k-alice").await, 200);
    // `tidegate reload` does the same through the admin endpoint.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("  - { name: bob, key: k-bob }", "  - { name: carol, key: k-carol }")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["reload", "--config"])
        .arg(&path)
        .args(["--url", &base])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("reloaded"));
    assert_eq!(send("k-carol").await, 200);
    assert_eq!(send("k-bob").await, 401, "a removed key is refused at once");
}

/// A `--listen` given on the command line holds across reloads: the file's
/// address is not reported as a change needing a restart.
#[tokio::test]
async fn a_command_line_listen_survives_a_reload() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidegate.yaml");
    std::fs::write(&path, config_text(&sim, "  - { name: alice, key: k-alice }", "", "")).unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["serve", "--listen", &addr.to_string(), "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://{addr}");
    until_healthy(&base).await;
    let resp = client().post(format!("{base}/admin/reload")).bearer_auth("adm").send().await.unwrap();
    let v: serde_json::Value = resp.json().await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(v["reloaded"], true, "{v}");
    assert_eq!(v["changes"]["needs_restart"], serde_json::json!([]), "{v}");
}

/// The descriptor table is grown once at start for `max_connections`
/// (client and upstream connections): grown on demand, each doubling in a
/// process with several threads waits for an RCU grace period inside
/// `accept`, and a first burst of streams stalled 10–30 ms three times.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_descriptor_table_is_grown_at_start_not_during_the_first_burst() {
    let sim = simulator();
    let proc = Process::spawn(|addr, _| {
        let text = config_text(&sim, "  - { name: alice, key: k-alice }", "", "").replace("127.0.0.1:0", addr);
        format!("max_connections: 3000\n{text}")
    });
    until_healthy(&proc.base()).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", proc.child.id())).unwrap_or_default();
    drop(proc);
    let fd_size: u64 =
        status.lines().find_map(|l| l.strip_prefix("FDSize:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    // What it asks for: 2 × 3,000 + 1,024, within the hard limit it may raise to.
    let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) }, 0);
    let want = 7024u64.min(hard.rlim_max);
    assert!(fd_size >= want, "descriptor table {fd_size} slots, wanted at least {want}");
}
