//! Hostile clients and odd upstreams: floods without a key, bodies far
//! larger than socket buffers, trickled bodies, too many connections,
//! foreign web pages, huge or never-ending SSE events, a stream whose
//! connection resets after its terminal event. Each case gets an honest
//! answer, and the next request is served normally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

async fn admin(gw: &tidegate::server::Running, path: &str) -> String {
    client().get(url(gw, path)).bearer_auth("adm").send().await.unwrap().text().await.unwrap()
}

async fn first_row(gw: &tidegate::server::Running) -> Value {
    for _ in 0..100 {
        if let Some(r) = admin_json(gw, "/admin/requests").await["requests"].as_array().and_then(|a| a.first()) {
            return r.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Value::Null
}

#[tokio::test]
async fn a_flood_without_a_key_is_counted_not_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(&[]);
    let top = format!(
        "journal: {}\nadmin_key: adm\nclient_keys: [{{ name: real, key: real-key }}]",
        dir.path().join("j.db").display()
    );
    let gw = gateway(&yaml(&sim, &top, "", "")).await;
    for _ in 0..3 {
        let resp = client()
            .post(url(&gw, "/v1/chat/completions"))
            .bearer_auth("real-key")
            .body(r#"{"model":"gpt"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let started = Instant::now();
    let flood: Vec<_> = (0..20)
        .map(|_| {
            let url = url(&gw, "/v1/chat/completions");
            tokio::spawn(async move {
                let c = client();
                for _ in 0..100 {
                    let resp = c.post(&url).bearer_auth("wrong").body("{}").send().await.unwrap();
                    assert_eq!(resp.status(), 401);
                }
            })
        })
        .collect();
    for f in flood {
        f.await.unwrap();
    }
    let seconds = started.elapsed().as_secs() + 1;
    let metrics = admin(&gw, "/metrics").await;
    assert!(metrics.contains(r#"tidegate_rejected_total{reason="bad_key"} 2000"#), "{metrics}");
    let stats: Value = serde_json::from_str(&admin(&gw, "/admin/stats").await).unwrap();
    assert_eq!(stats["rejected_before_routing"], 2000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rows: Value = serde_json::from_str(&admin(&gw, "/admin/requests?limit=1000").await).unwrap();
    let rows = rows["requests"].as_array().unwrap();
    let real = rows.iter().filter(|r| r["client"] == "real").count();
    let rejected = rows.iter().filter(|r| r["outcome"] == "rejected").count();
    assert_eq!(real, 3, "the real requests are still there");
    assert!(rejected as u64 <= 5 * (seconds + 1), "{rejected} refusals journaled in {seconds} s");
}

/// A body far larger than any socket buffer, sent by an async client: it
/// reads the 413 (the body is read and dropped first), not a reset.
#[tokio::test]
async fn an_oversized_body_gets_a_readable_413() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "max_body: 1MiB", "", "")).await;
    let big = vec![b'x'; 20 * 1024 * 1024];
    for _ in 0..3 {
        let resp = client().post(url(&gw, "/v1/chat/completions")).body(big.clone()).send().await;
        let resp = resp.expect("the client saw a connection error instead of the 413");
        assert_eq!(resp.status(), 413);
        let v: Value = resp.json().await.unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("larger than"), "{v}");
    }
    assert_serves(&gw).await;
}

#[tokio::test]
async fn a_trickled_body_is_cut_at_body_timeout() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "body_timeout: 500ms", "", "")).await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100\r\n\r\n{")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    for _ in 0..30 {
        let _ = conn.write_all(b" ").await;
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(100), conn.read(&mut buf)).await {
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || answer.len() > 12 {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_serves(&gw).await;
}

/// At `max_connections`, idle connections (never used, or kept alive after
/// a request) give way, oldest first, so a new client is served within a
/// second; connections with a request in service are never cut, and when
/// all of them are busy a new one gets the 503.
#[tokio::test]
async fn at_max_connections_idle_ones_give_way_and_busy_ones_are_kept() {
    let slow = tidegate_simulate::Behavior { latency_ms: 1500, ..Default::default() };
    let sim = sim(&[("real-slow", slow)]);
    let models = "  slow:\n    targets: [{ upstream: sim-openai, model: real-slow }]";
    let gw = gateway(&yaml(&sim, "max_connections: 20", "", models)).await;
    // 10 sockets that never send anything, then 10 kept alive after a request.
    let mut idle: Vec<tokio::net::TcpStream> =
        futures_util::future::join_all((0..10).map(|_| tokio::net::TcpStream::connect(gw.addr)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..10 {
        let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
        assert!(read_answer(&mut conn).await.starts_with("HTTP/1.1 200"));
        idle.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for round in 0..5 {
        let started = Instant::now();
        let resp = client().get(url(&gw, "/healthz")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "round {round}: {}", resp.text().await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    }
    assert_serves(&gw).await;
    // The oldest idle ones were closed: the never-used sockets first.
    let mut closed = Vec::new();
    for (i, conn) in idle.iter_mut().enumerate() {
        let mut buf = [0u8; 64];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(20), conn.read(&mut buf)).await {
            closed.push(i);
        }
    }
    assert!(!closed.is_empty() && closed.iter().all(|&i| i < 10), "closed: {closed:?}");
    drop(idle);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Now every connection has a request in service: none is cut, and a
    // new connection is refused with the 503.
    let body = r#"{"model":"slow","messages":[{"role":"user","content":"hi"}]}"#;
    let busy: Vec<_> = (0..20)
        .map(|_| {
            let addr = gw.addr;
            tokio::spawn(async move {
                let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(req.as_bytes()).await.unwrap();
                read_answer(&mut conn).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resp = client().get(url(&gw, "/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.text().await.unwrap().contains("max_connections"));
    for answer in futures_util::future::join_all(busy).await {
        let answer = answer.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "a busy connection was cut: {answer}");
    }
    assert_serves(&gw).await;
}

#[tokio::test]
async fn keyless_mode_refuses_foreign_pages_and_hosts() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = r#"{"model":"gpt","messages":[]}"#;
    let cross_site = client()
        .post(url(&gw, "/v1/chat/completions"))
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(cross_site.status(), 403);
    let rebinding =
        client().post(url(&gw, "/v1/chat/completions")).header("host", "evil.example").body(body).send().await.unwrap();
    assert_eq!(rebinding.status(), 403);
    assert_eq!(sim.state.received().len(), 0, "nothing reached the upstream");
    assert_serves(&gw).await;
}

#[tokio::test]
async fn a_wrong_method_is_a_protocol_shaped_405_with_a_request_id() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let resp = client().get(url(&gw, "/v1/chat/completions")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert!(resp.headers().contains_key("x-tidegate-request-id"));
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("method not allowed"), "{v}");
    let resp = client().get(url(&gw, "/nowhere")).header("anthropic-version", "2023-06-01").send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert!(resp.headers().contains_key("x-tidegate-request-id"));
    assert_eq!(resp.json::<Value>().await.unwrap()["type"], "error");
}

/// A model name with a newline or a NUL cannot forge a log line: checked
/// on the line itself in `report.rs`; here, such a request is answered
/// normally (404) and the next one served.
#[tokio::test]
async fn control_characters_in_a_model_name_are_harmless() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let body = r#"{"model":"gpt\nINFO request id=forged\u0000","messages":[]}"#;
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(body).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_serves(&gw).await;
}

/// An 8 MiB event passes in linear time; one over `max_stream_event` ends
/// the stream with an error instead of being buffered without limit.
#[tokio::test]
async fn huge_and_endless_events() {
    let sim = sim(&[("real-gpt", Behavior { chunks: 3, pad_event_bytes: Some(8 << 20), ..Default::default() })]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let started = Instant::now();
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(r#"{"model":"gpt","stream":true}"#).send().await;
    let text = resp.unwrap().text().await.unwrap();
    assert!(text.len() > 8 << 20 && text.trim_end().ends_with("[DONE]"));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let small = gateway(&yaml(&sim, "max_stream_event: 1MiB", "", "")).await;
    let resp = client().post(url(&small, "/v1/chat/completions")).body(r#"{"model":"gpt","stream":true}"#).send().await;
    let resp = resp.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status == 502 || text.contains("max_stream_event"), "{status} {}", &text[..text.len().min(300)]);
    assert!(text.contains("max_stream_event"), "{}", &text[..text.len().min(300)]);
}

/// After the terminal event the stream is complete: a reset after
/// `[DONE]` is not a broken stream, and (with `stream_resume`) the answer
/// is not asked for again.
#[tokio::test]
async fn a_reset_after_the_terminal_event_is_not_a_failure() {
    let done_then_reset = Behavior { chunks: 3, script: vec![Fault::drop_after(6)], ..Default::default() };
    let sim = sim(&[("real-gpt", done_then_reset)]);
    let models = "  resumable:\n    targets: [{ upstream: sim-openai, model: real-gpt }]\n    stream_resume: true";
    let dir = tempfile::tempdir().unwrap();
    let top = format!("journal: {}\nadmin_key: adm", dir.path().join("j.db").display());
    let gw = gateway(&yaml(&sim, &top, "", models)).await;
    let text = client()
        .post(url(&gw, "/v1/chat/completions"))
        .body(r#"{"model":"resumable","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(sim.state.received().len(), 1, "the finished answer was not asked for again");
    assert_eq!(first_row(&gw).await["outcome"], "completed");
}

/// A fake upstream answering every request with the same raw bytes, then
/// closing the connection.
async fn raw_upstream(answer: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for _ in 0..50 {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut read = 0;
                while let Ok(n) = conn.read(&mut buf[read..]).await {
                    read += n;
                    if n == 0 || buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let _ = conn.write_all(answer).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    format!("http://{addr}/v1")
}

async fn through(base_url: &str, stream: bool) -> (u16, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "listen: 127.0.0.1:0\njournal: {}\nadmin_key: adm\ndefaults:\n  deadline: 2s\n  retry: {{ base_delay: 10ms, max_delay: 20ms, max_attempts: 2 }}\nupstreams:\n  - {{ name: odd, protocol: openai, base_url: \"{base_url}\" }}\nmodels:\n  m:\n    targets: [{{ upstream: odd }}]\n",
        dir.path().join("j.db").display()
    );
    let gw = gateway(&config).await;
    let body = format!(r#"{{"model":"m","stream":{stream},"messages":[]}}"#);
    let resp = client().post(url(&gw, "/v1/chat/completions")).body(body).send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_else(|e| format!("body cut: {e}"));
    (status, text, first_row(&gw).await)
}

#[tokio::test]
async fn odd_upstream_answers_are_told_truly() {
    // A captive portal's page under 200: a failed attempt, not the answer.
    let html =
        raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 20\r\n\r\n<html>Login</html>\r\n")
            .await;
    let (status, text, row) = through(&html, false).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("HTML page"), "{text}");
    assert_eq!(row["outcome"], "failed");
    // A close-delimited JSON answer cut short: incomplete, not completed.
    let cut = raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"choices\":[{\"message\":{\"content\":\"half").await;
    let (status, _, row) = through(&cut, false).await;
    assert_eq!(status, 200);
    assert_eq!(row["outcome"], "incomplete", "{row}");
    // 101 and 204: no answer; neither hangs nor passes for one.
    for answer in [
        &b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"[..],
        &b"HTTP/1.1 204 No Content\r\n\r\n"[..],
    ] {
        let odd = raw_upstream(answer).await;
        let started = Instant::now();
        let (status, text, row) = through(&odd, false).await;
        assert_eq!(status, 502, "{text}");
        assert_eq!(row["outcome"], "failed");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    // An error body over 1 MiB is passed on (cut at 1 MiB), never emptied.
    let mut big = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"error\":{\"message\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 3 << 20));
    let big: &'static [u8] = big.leak();
    let (status, text, _) = through(&raw_upstream(big).await, false).await;
    assert_eq!(status, 400);
    assert_eq!(text.len(), 1 << 20, "cut at 1 MiB");
    assert!(text.starts_with("{\"error\""));
}

#[tokio::test]
async fn a_gzip_error_body_is_read_as_text() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(br#"{"error":{"message":"Invalid model parameter","type":"invalid_request_error"}}"#).unwrap();
    let body = gz.finish().unwrap();
    let mut answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend(body);
    let (status, text, _) = through(&raw_upstream(answer.leak()).await, false).await;
    assert_eq!(status, 400);
    assert!(text.contains("Invalid model parameter"), "{text}");
}

/// A compressed JSON answer (a proxy that ignored `accept-encoding:
/// identity`) is judged by its decoded content: whole is `completed`, with
/// its usage, and the journal says how it was told; cut is `incomplete`.
#[tokio::test]
async fn a_compressed_answer_is_judged_by_what_it_decodes_to() {
    use std::io::Write;
    let json = br#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}"#;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json).unwrap();
    let body = gz.finish().unwrap();
    let answer = |framing: &str, body: &[u8]| -> &'static [u8] {
        let mut a = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n").into_bytes();
        a.extend_from_slice(body);
        a.leak()
    };
    let sized = format!("content-encoding: gzip\r\ncontent-length: {}\r\n", body.len());
    for (framing, bytes, outcome, from) in [
        (sized.as_str(), &body[..], "completed", "gzip-decoded"),
        ("content-encoding: gzip\r\nconnection: close\r\n", &body[..], "completed", "gzip-decoded"),
        ("content-encoding: gzip\r\nconnection: close\r\n", &body[..body.len() - 6], "incomplete", "gzip-decoded"),
    ] {
        let (status, _, row) = through(&raw_upstream(answer(framing, bytes)).await, false).await;
        assert_eq!(status, 200);
        assert_eq!(row["outcome"], outcome, "{framing}: {row}");
        assert_eq!(row["completion_from"], from, "{row}");
        if outcome == "completed" {
            assert_eq!((row["tokens_in"].as_u64(), row["tokens_out"].as_u64()), (Some(11), Some(3)), "{row}");
        }
    }
    // An encoding tidegate does not decode: its Content-Length, delivered whole.
    let opaque = [7u8; 40];
    let (_, _, row) =
        through(&raw_upstream(answer("content-encoding: br\r\ncontent-length: 40\r\n", &opaque)).await, false).await;
    assert_eq!(
        (row["outcome"].as_str(), row["completion_from"].as_str()),
        (Some("completed"), Some("content-length")),
        "{row}"
    );
    // The usual identity answer says nothing more.
    let plain = format!("content-length: {}\r\n", json.len());
    let (_, _, row) = through(&raw_upstream(answer(&plain, json)).await, false).await;
    assert_eq!(row["outcome"], "completed");
    assert!(row["completion_from"].is_null(), "{row}");
}

/// A token estimate no bucket can hold (`max_tokens` 4e9 while the request
/// runs, and 1e19 answered 400 by the provider) reserves at most a
/// minute's tokens and gives them back exactly: another key's request to
/// the same upstream is served, not answered 504 at once.
#[tokio::test]
async fn one_keys_huge_max_tokens_cannot_lock_other_keys_out() {
    let slow = tidegate_simulate::Behavior { latency_ms: 1500, ..Default::default() };
    let refused = tidegate_simulate::Behavior {
        status: Some(400),
        error_body: r#"{"error":{"message":"max_tokens is too large","type":"invalid_request_error"}}"#.into(),
        ..Default::default()
    };
    let sim = sim(&[("real-slow", slow), ("real-bad", refused)]);
    let top = "client_keys: [{ name: a, key: key-a }, { name: b, key: key-b }]";
    let models = "  slow:\n    targets: [{ upstream: sim-openai, model: real-slow }]\n  bad:\n    targets: [{ upstream: sim-openai, model: real-bad }]";
    let gw = gateway(&yaml(&sim, top, "    tpm: 60000", models)).await;
    let ask = |key: &'static str, body: String| {
        let url = url(&gw, "/v1/chat/completions");
        async move {
            let started = Instant::now();
            let resp = client()
                .post(url)
                .bearer_auth(key)
                .body(body.clone())
                .send()
                .await
                .unwrap_or_else(|e| panic!("{key} {body}: {e:?}"));
            (resp.status().as_u16(), started.elapsed())
        }
    };
    let normal = r#"{"model":"gpt","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#.to_string();
    // 1e19 (beyond i64) answered 400 by the provider: its refund must not
    // become a second charge.
    let bad = r#"{"model":"bad","max_tokens":10000000000000000000,"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(ask("key-a", bad.to_string()).await.0, 400);
    let (status, took) = ask("key-b", normal.clone()).await;
    assert_eq!(status, 200, "after a refused 1e19-token request, another key was refused");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // 4e9 while it runs: the other key waits for its own tokens only.
    let huge = r#"{"model":"slow","max_tokens":4000000000,"messages":[{"role":"user","content":"x"}]}"#;
    let running = tokio::spawn(ask("key-a", huge.to_string()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, took) = ask("key-b", normal.clone()).await;
    assert_eq!(status, 200, "while a 4e9-token request ran, another key was refused");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(running.await.unwrap().0, 200);
    // And the largest number JSON can carry as an integer.
    let max = format!(r#"{{"model":"bad","max_tokens":{},"messages":[]}}"#, u64::MAX);
    assert_eq!(ask("key-a", max).await.0, 400);
    assert_eq!(ask("key-b", normal).await.0, 200);
}

/// Reads one HTTP/1 answer's head and body (content-length framed) from
/// `conn`, within 10 s.
async fn read_answer(conn: &mut tokio::net::TcpStream) -> String {
    let mut answer = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8192];
    while Instant::now() < deadline {
        let Ok(Ok(n)) = tokio::time::timeout_at(deadline, conn.read(&mut buf)).await else { break };
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        if n == 0 {
            break;
        }
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|len| answer.len() >= head_end + 4 + len) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A wrong key (and a foreign page, an unknown path) with a body far
/// larger than socket buffers: the client can send all of it and then
/// reads the refusal (no reset), and the connection serves the next
/// request. With `Expect: 100-continue` the refusal comes before the body.
#[tokio::test]
async fn early_refusals_let_the_client_finish_sending_and_read_them() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "client_keys: [{ name: real, key: real-key }]", "", "")).await;
    let big = 24 * 1024 * 1024;
    for (path, key, status) in
        [("/v1/chat/completions", "wrong", "401"), ("/v1/messages", "wrong", "401"), ("/v1/nowhere", "real-key", "404")]
    {
        let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {big}\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b' '; 256 * 1024];
        for i in 0..big / chunk.len() {
            conn.write_all(&chunk).await.unwrap_or_else(|e| panic!("{path}: write {i} of the body failed: {e}"));
        }
        let answer = read_answer(&mut conn).await;
        assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {answer}");
        // The same connection serves the next request.
        let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#;
        let next = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer real-key\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(next.as_bytes()).await.unwrap();
        let answer = read_answer(&mut conn).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}, next request: {answer}");
    }
    // Expect: 100-continue: the 401 at once, no `100 Continue` inviting the body.
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer wrong\r\nexpect: 100-continue\r\ncontent-length: {big}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let answer = read_answer(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // reqwest with the large body and a wrong key reads the 401 too.
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth("wrong")
        .body(vec![b'x'; big])
        .send()
        .await
        .expect("the client saw a connection error instead of the 401");
    assert_eq!(resp.status(), 401);
}
