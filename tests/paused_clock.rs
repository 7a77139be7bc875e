//! Timing through the real relay under tokio's paused clock: backoff
//! waits, the deadline and the circuit breaker's cooldown are measured in
//! virtual time, exactly, without sleeping. The upstream is a closed
//! loopback port (connection refused: a transient failure at once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::time::Instant;

use tidegate::config::Config;
use tidegate::gateway::Gateway;
use tidegate::protocol::{self, Endpoint};
use tidegate::record::{AttemptLog, Verdict};
use tidegate::relay::progress::Progress;
use tidegate::relay::{self, Answer, Job};

/// A port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn gateway(retry: &str, breaker: &str) -> Arc<Gateway> {
    let yaml = format!(
        "journal: off\ndefaults:\n  deadline: 60s\n  retry: {{ {retry}, budget_min_per_second: 1000 }}\n\
         upstreams:\n  - {{ name: down, protocol: openai, base_url: \"http://127.0.0.1:{}/v1\", {breaker} }}\n\
         models:\n  m:\n    targets: [{{ upstream: down }}]\n",
        closed_port()
    );
    let config = Config::parse(&yaml, &|_| None).unwrap();
    Arc::new(Gateway::new(config).unwrap())
}

fn job(gw: &Arc<Gateway>, deadline: Duration) -> Job {
    let body = Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
    job_for(gw, Endpoint::ChatCompletions, body, deadline)
}

fn job_for(gw: &Arc<Gateway>, endpoint: Endpoint, body: Bytes, deadline: Duration) -> Job {
    Job {
        gw: gw.clone(),
        endpoint,
        route: tidegate::ids::RouteId::at(0),
        head: protocol::peek(&body).unwrap(),
        body,
        client_headers: HeaderMap::new(),
        deadline: Instant::now() + deadline,
        chained: false,
        progress: Arc::new(Progress::default()),
        who: tidegate::limits::Who::plain("-"),
        lane: None,
        trace: None,
        pin: None,
        session: None,
        owner: None,
    }
}

fn message(answer: &Answer) -> String {
    match answer {
        Answer::Gateway(e) => e.to_string(),
        Answer::Stream(..) | Answer::Verbatim { .. } => panic!("expected tidegate's own answer"),
    }
}

fn waits(attempts: &[AttemptLog]) -> Duration {
    attempts.iter().filter_map(|a| a.wait).sum()
}

#[tokio::test(start_paused = true)]
async fn backoff_waits_are_the_time_that_passes() {
    let gw = gateway("max_attempts: 4, base_delay: 1s, max_delay: 4s", "breaker_failures: 100");
    let started = Instant::now();
    let (_, relayed) = relay::relay(job(&gw, Duration::from_secs(60))).await;
    let elapsed = started.elapsed();
    assert_eq!(relayed.attempts.len(), 4, "{:?}", relayed.attempts);
    let verdicts: Vec<Verdict> = relayed.attempts.iter().map(|a| a.verdict).collect();
    assert_eq!(verdicts, [Verdict::RetrySame, Verdict::RetrySame, Verdict::RetrySame, Verdict::GiveUp]);
    // Exponential backoff with full jitter: 1 s, then [1, 2] s, then [1, 4] s.
    let w: Vec<Duration> = relayed.attempts.iter().filter_map(|a| a.wait).collect();
    assert_eq!(w[0], Duration::from_secs(1));
    assert!(w[1] >= Duration::from_secs(1) && w[1] <= Duration::from_secs(2), "{w:?}");
    assert!(w[2] >= Duration::from_secs(1) && w[2] <= Duration::from_secs(4), "{w:?}");
    // The relay waited exactly what it logged, on tokio's clock.
    let diff = elapsed.abs_diff(waits(&relayed.attempts));
    assert!(diff < Duration::from_millis(5), "elapsed {elapsed:?}, waits {:?}", waits(&relayed.attempts));
    assert!(message(&relayed.answer).contains("4 attempts used"), "{}", message(&relayed.answer));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_the_waiting() {
    let gw = gateway("max_attempts: 50, base_delay: 1s, max_delay: 4s", "breaker_failures: 100");
    let started = Instant::now();
    let (_, relayed) = relay::relay(job(&gw, Duration::from_millis(2500))).await;
    let elapsed = started.elapsed();
    assert!(elapsed <= Duration::from_millis(2500), "answered after the deadline: {elapsed:?}");
    assert!(relayed.attempts.len() >= 2, "{:?}", relayed.attempts);
    assert!(message(&relayed.answer).contains("deadline"), "{}", message(&relayed.answer));
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_fast_until_its_cooldown_ends() {
    let gw = gateway("max_attempts: 1", "breaker_failures: 2, breaker_cooldown: 10s");
    for _ in 0..2 {
        let (_, relayed) = relay::relay(job(&gw, Duration::from_secs(60))).await;
        assert_eq!(relayed.attempts.len(), 1);
    }
    // Open: no attempt, an answer at once naming the probe time.
    let started = Instant::now();
    let (_, relayed) = relay::relay(job(&gw, Duration::from_secs(60))).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(relayed.attempts.is_empty(), "{:?}", relayed.attempts);
    let text = message(&relayed.answer);
    assert!(text.contains("circuit breaker is open") && text.contains("10s"), "{text}");
    // Still open a second before the cooldown ends...
    tokio::time::advance(Duration::from_secs(9)).await;
    let (_, relayed) = relay::relay(job(&gw, Duration::from_secs(60))).await;
    assert!(relayed.attempts.is_empty());
    assert!(message(&relayed.answer).contains("1.0s"), "{}", message(&relayed.answer));
    // ...and a probe goes out once it has.
    tokio::time::advance(Duration::from_secs(1)).await;
    let (_, relayed) = relay::relay(job(&gw, Duration::from_secs(60))).await;
    assert_eq!(relayed.attempts.len(), 1, "the half-open probe");
}

/// An upstream in this runtime that answers `status` after `delay` (the
/// paused clock's) and then never sends the body's end.
async fn slow_body_upstream(status: u16, delay: Duration) -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            tokio::time::sleep(delay).await;
            use futures_util::StreamExt as _;
            let first = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Bytes::from_static(b"{"))]);
            let body = first.chain(futures_util::stream::pending());
            axum::response::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(axum::body::Body::from_stream(body))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// The deadline stays an `Instant` to the end: headers that come 20 s
/// into a 25 s deadline leave their body 5 s, not another 25 (the budget
/// was once turned into a `Duration` before sending and reused after the
/// headers, for an error's body and a checked JSON answer alike).
#[tokio::test(start_paused = true)]
async fn a_body_read_after_the_headers_ends_at_the_deadline() {
    for (status, endpoint, body, protocol) in [
        (500, Endpoint::ChatCompletions, r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, "openai"),
        (
            200,
            Endpoint::Messages,
            r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
            "openai-chat",
        ),
    ] {
        let base = slow_body_upstream(status, Duration::from_secs(20)).await;
        let yaml = format!(
            "journal: off\ndefaults:\n  deadline: 60s\n  retry: {{ max_attempts: 1 }}\n\
             upstreams:\n  - {{ name: slow, protocol: {protocol}, base_url: \"{base}\", header_timeout: 50s }}\n\
             models:\n  m:\n    targets: [{{ upstream: slow }}]\n"
        );
        let gw = Arc::new(Gateway::new(Config::parse(&yaml, &|_| None).unwrap()).unwrap());
        let started = Instant::now();
        let (_, relayed) =
            relay::relay(job_for(&gw, endpoint, Bytes::from_static(body.as_bytes()), Duration::from_secs(25))).await;
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(20), "{status}: the headers came at 20 s: {elapsed:?}");
        assert!(elapsed <= Duration::from_millis(25_100), "{status}: answered {elapsed:?} after a 25 s deadline");
        assert_eq!(relayed.attempts.len(), 1, "{status}: {:?}", relayed.attempts);
    }
}
