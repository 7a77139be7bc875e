//! Backpressure: bursts become orderly queues, limits are learned, clients
//! are served fairly, rate buckets spread bursts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use tidegate_simulate::Behavior;
use tokio::io::AsyncWriteExt;

/// 429 "3009" whenever more than 3 requests are in flight, 100 ms per answer.
fn capped() -> Behavior {
    Behavior { reject_over: Some(3), latency_ms: 100, ..Default::default() }
}

async fn burst(gw: &tidegate::server::Running, n: usize, key: Option<&str>) -> Vec<(u16, Instant)> {
    burst_to(url(gw, "/v1/chat/completions"), n, key).await
}

async fn burst_to(endpoint: String, n: usize, key: Option<&str>) -> Vec<(u16, Instant)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (url, key) = (endpoint.clone(), key.map(str::to_owned));
            tokio::spawn(async move {
                let mut req = client().post(url).body(r#"{"model":"gpt","max_tokens":16}"#);
                if let Some(key) = key {
                    req = req.bearer_auth(key);
                }
                let resp = req.send().await.unwrap();
                let status = resp.status().as_u16();
                resp.bytes().await.unwrap();
                (status, Instant::now())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn declared_limit_queues_a_burst_and_the_upstream_never_sees_more() {
    let sim = sim(&[("real-gpt", capped())]);
    let gw = gateway(&yaml(&sim, "", "    max_concurrent: 3", "")).await;
    let results = burst(&gw, 20, None).await;
    assert!(results.iter().all(|(s, _)| *s == 200), "{results:?}");
    assert!(sim.state.max_in_flight.load(SeqCst) <= 3, "upstream saw {}", sim.state.max_in_flight.load(SeqCst));
    assert_eq!(sim.state.rejected.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn undeclared_limit_is_learned() {
    let sim = sim(&[("real-gpt", capped())]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let started = Instant::now();
    let results = burst(&gw, 20, None).await;
    let rejected = sim.state.rejected.load(SeqCst);
    eprintln!("adaptive: 20 requests, {rejected} answers of 429 absorbed, {:?}", started.elapsed());
    assert!(results.iter().all(|(s, _)| *s == 200), "{results:?}");
    assert!(rejected > 0, "the cap was never hit?");
    // Once learned, a second burst barely touches the cap.
    let before = sim.state.rejected.load(SeqCst);
    let results = burst(&gw, 20, None).await;
    assert!(results.iter().all(|(s, _)| *s == 200));
    let again = sim.state.rejected.load(SeqCst) - before;
    eprintln!("adaptive, second burst: {again} answers of 429");
    assert!(again < rejected, "the limit was not learned ({again} ≥ {rejected})");
}

#[tokio::test(start_paused = true)]
async fn full_queue_is_shed_at_once_with_retry_after() {
    let sim = sim(&[("real-gpt", Behavior { latency_ms: 400, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "    max_concurrent: 1\n    max_queue: 2", "")).await;
    let waiting = tokio::spawn({
        let gw_url = url(&gw, "/v1/chat/completions");
        async move {
            let tasks: Vec<_> = (0..3)
                .map(|_| {
                    let u = gw_url.clone();
                    tokio::spawn(
                        async move { client().post(u).body(r#"{"model":"gpt"}"#).send().await.unwrap().status() },
                    )
                })
                .collect();
            let mut s = Vec::new();
            for t in tasks {
                s.push(t.await.unwrap().as_u16());
            }
            s
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(200), "a full queue must answer at once");
    assert_eq!(resp.status(), 429);
    assert!(resp.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    assert!(v["error"]["message"].as_str().unwrap().contains("queue is full"));
    assert_eq!(waiting.await.unwrap(), vec![200, 200, 200]);
}

#[tokio::test(start_paused = true)]
async fn deadline_in_the_queue_answers_504_and_takes_no_slot() {
    let sim = sim(&[("real-gpt", Behavior { latency_ms: 1000, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "    max_concurrent: 1", "")).await;
    let holder = tokio::spawn({
        let u = url(&gw, "/v1/chat/completions");
        async move { client().post(u).body(r#"{"model":"gpt"}"#).send().await.unwrap().status() }
    });
    eventually("first request upstream", || sim.state.received().len() == 1).await;
    let started = Instant::now();
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "300ms"), r#"{"model":"gpt"}"#).await;
    let took = started.elapsed();
    assert_eq!(resp.status(), 504);
    assert!(took >= Duration::from_millis(280) && took < Duration::from_millis(800), "{took:?}");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("no slot was taken"), "{v}");
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(sim.state.received().len(), 1, "the timed-out request reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn client_gone_while_queued_never_reaches_the_upstream() {
    let sim = sim(&[("real-gpt", Behavior { latency_ms: 600, ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "    max_concurrent: 1", "")).await;
    let holder = tokio::spawn({
        let u = url(&gw, "/v1/chat/completions");
        async move { client().post(u).body(r#"{"model":"gpt"}"#).send().await.unwrap().status() }
    });
    eventually("first request upstream", || sim.state.received().len() == 1).await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = r#"{"model":"gpt"}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(conn);
    assert_eq!(holder.await.unwrap(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sim.state.received().len(), 1, "a request whose client left was sent upstream");
    // The queue is clean: the next request goes straight through.
    assert_serves(&gw).await;
    assert_eq!(sim.state.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn one_clients_flood_does_not_starve_another() {
    let sim = sim(&[("real-gpt", Behavior { latency_ms: 40, ..Default::default() })]);
    let top = "client_keys:\n  - { name: flood, key: key-a }\n  - { name: single, key: key-b }";
    let gw = gateway(&yaml(&sim, top, "    max_concurrent: 2\n    max_queue: 1000", "")).await;
    let flood = tokio::spawn(burst_to(url(&gw, "/v1/chat/completions"), 100, Some("key-a")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = burst(&gw, 5, Some("key-b")).await;
    let b_done = b.iter().map(|(_, t)| *t).max().unwrap();
    assert!(b.iter().all(|(s, _)| *s == 200));
    let a = flood.await.unwrap();
    assert!(a.iter().all(|(s, _)| *s == 200));
    let a_done_before_b = a.iter().filter(|(_, t)| *t <= b_done).count();
    eprintln!("fairness: when B's 5 were done, {a_done_before_b} of A's 100 were");
    assert!(a_done_before_b < 40, "B waited behind A's flood: {a_done_before_b} of A's done first");
}

#[tokio::test(start_paused = true)]
async fn rpm_bucket_spreads_a_burst_and_none_fails() {
    let sim = sim(&[]);
    // 600/min: a minute's worth may burst, then one every 100 ms.
    let gw = gateway(&yaml(&sim, "", "    rpm: 600", "")).await;
    let started = Instant::now();
    let results = burst(&gw, 615, None).await;
    let took = started.elapsed();
    assert!(results.iter().all(|(s, _)| *s == 200), "a rate-limited burst must queue, not fail");
    assert!(took >= Duration::from_millis(1400), "15 over the limit should take ~1.5 s, took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn slot_is_released_after_an_error_and_after_a_client_leaves_mid_stream() {
    use futures_util::StreamExt;
    use tidegate_simulate::Fault;
    let sim = sim(&[
        (
            "real-gpt",
            Behavior { script: vec![Fault::new(400, r#"{"error":{"message":"bad"}}"#)], ..Default::default() },
        ),
        ("claude", Behavior { chunks: 500, chunk_delay_ms: 50, ..Default::default() }),
    ]);
    let gw = gateway(&yaml(&sim, "", "    max_concurrent: 1", "")).await;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_serves(&gw).await;

    let resp =
        client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude","stream":true}"#).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    let started = Instant::now();
    let resp = post_with(&gw, "/v1/chat/completions", ("x-tidegate-deadline", "2s"), r#"{"model":"gpt"}"#).await;
    assert_eq!(resp.status(), 200, "the abandoned stream kept its slot");
    assert!(started.elapsed() < Duration::from_secs(1));
}
