//! Shutdown without losing work, with a real tidegate process and real
//! signals: in-flight requests finish, `/healthz` and new requests say
//! 503 meanwhile, every journal row is written; at the grace limit (or a
//! second signal) streams still running end with their protocol's error
//! event instead of a cut.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use tidegate_simulate::{Behavior, Simulator};
use tokio::time::Instant;

fn sim_for_shutdown() -> Simulator {
    sim(&[
        ("slow", Behavior { latency_ms: 1500, ..Default::default() }),
        ("stream", Behavior { chunks: 10, chunk_delay_ms: 150, ..Default::default() }),
        ("long", Behavior { chunks: 20, chunk_delay_ms: 500, ..Default::default() }),
    ])
}

async fn start(sim: &Simulator, grace: &str) -> Process {
    let openai = sim.openai_url();
    let gw = Process::spawn(|addr, dir| {
        format!(
            "listen: {addr}\njournal: {}\nshutdown_grace: {grace}\nupstreams:\n  - {{ name: sim, protocol: openai, base_url: \"{openai}\" }}\nmodels:\n  \"*\":\n    targets: [{{ upstream: sim }}]\n",
            dir.join("journal.db").display()
        )
    });
    for _ in 0..200 {
        if let Ok(r) = client().get(format!("{}/healthz", gw.base())).send().await
            && r.status() == 200
        {
            return gw;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("tidegate did not start");
}

fn journal(gw: &Process) -> std::path::PathBuf {
    gw.dir.path().join("journal.db")
}

fn signal(gw: &Process, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &gw.child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Waits (bounded) for the process to exit; its exit status.
async fn exited(gw: &mut Process, within: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + within;
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < until, "tidegate still running after {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn_requests(base: &str, n: usize) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    (0..n)
        .map(|i| {
            let (model, stream) = if i % 2 == 0 { ("slow", false) } else { ("stream", true) };
            let url = format!("{base}/v1/chat/completions");
            tokio::spawn(async move {
                let body = format!(
                    r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"{i}"}}]}}"#
                );
                match reqwest::Client::new().post(url).body(body).timeout(Duration::from_secs(30)).send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        (status, resp.text().await.unwrap_or_else(|e| format!("body cut: {e}")))
                    }
                    Err(e) => (0, format!("request failed: {e}")),
                }
            })
        })
        .collect()
}

fn journal_rows(path: &std::path::Path) -> Vec<tidegate::journal::Row> {
    let query = tidegate::journal::Query { limit: 1000, ..Default::default() };
    tidegate::journal::list(path, &query).unwrap()
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_and_keeps_every_row() {
    let sim = sim_for_shutdown();
    let mut gw = start(&sim, "30s").await;
    let requests = spawn_requests(&gw.base(), 40);
    eventually("40 requests at the upstream", || sim.state.in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 40)
        .await;
    signal(&gw, "TERM");
    // Draining: the load balancer's probe and new requests hear 503.
    let mut health = 0;
    for _ in 0..50 {
        health = client().get(format!("{}/healthz", gw.base())).send().await.map_or(0, |r| r.status().as_u16());
        if health == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(health, 503, "/healthz while draining");
    let late = client()
        .post(format!("{}/v1/chat/completions", gw.base()))
        .body(r#"{"model":"slow","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 503);
    assert_eq!(late.headers()["retry-after"], "1");
    assert!(late.text().await.unwrap().contains("shutting down"));
    // Every request in flight finishes, whole.
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("tok4") && !body.contains("\"error\""), "{body}");
        if body.starts_with("data:") {
            assert!(body.trim_end().ends_with("data: [DONE]"), "stream cut: {body}");
        }
    }
    let status = exited(&mut gw, Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    let rows = journal_rows(&journal(&gw));
    let completed = rows.iter().filter(|r| r.outcome == "completed").count();
    assert_eq!(completed, 40, "every answered request is journaled: {} rows", rows.len());
    assert_eq!(rows.iter().filter(|r| r.outcome == "rejected" && r.status == 503).count(), 1);
}

#[tokio::test]
async fn at_the_grace_limit_streams_end_with_an_error_event() {
    let sim = sim_for_shutdown();
    let mut gw = start(&sim, "1s").await;
    let url = format!("{}/v1/chat/completions", gw.base());
    let streams: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = r#"{"model":"long","stream":true,"messages":[]}"#;
                let resp = reqwest::Client::new().post(url).body(body).send().await.unwrap();
                resp.text().await.unwrap_or_else(|e| format!("body cut: {e}"))
            })
        })
        .collect();
    eventually("4 streams at the upstream", || sim.state.in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 4)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    signal(&gw, "TERM");
    for s in streams {
        let text = s.await.unwrap();
        assert!(text.contains("tok0"), "{text}");
        let tail = &text[text.rfind("data:").unwrap()..];
        assert!(tail.contains("\"error\"") && tail.contains("shutting down"), "no error event at the end: {text}");
        assert!(!text.contains("[DONE]"), "{text}");
    }
    let status = exited(&mut gw, Duration::from_secs(6)).await;
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let rows = journal_rows(&journal(&gw));
    assert_eq!(rows.iter().filter(|r| r.outcome == "incomplete").count(), 4, "{}", rows.len());
}

#[tokio::test]
async fn a_second_signal_ends_at_once() {
    let sim = sim_for_shutdown();
    let mut gw = start(&sim, "60s").await;
    let url = format!("{}/v1/chat/completions", gw.base());
    let stream = tokio::spawn(async move {
        let body = r#"{"model":"long","stream":true,"messages":[]}"#;
        let resp = reqwest::Client::new().post(url).body(body).send().await.unwrap();
        resp.text().await.unwrap_or_else(|e| format!("body cut: {e}"))
    });
    eventually("the stream at the upstream", || sim.state.in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 1)
        .await;
    let started = Instant::now();
    signal(&gw, "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&gw, "INT");
    let text = stream.await.unwrap();
    assert!(text.contains("shutting down"), "{text}");
    exited(&mut gw, Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}
