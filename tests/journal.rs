//! The journal records every request truthfully, keeps partial output, and
//! never holds a key; the admin API and `tidegate log` read it back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault};
use tokio::io::AsyncWriteExt;

const CLIENT_KEY: &str = "ck-journal-secret-42";

async fn admin_get(gw: &tidegate::server::Running, path: &str) -> Value {
    let resp = client().get(url(gw, path)).bearer_auth("adm").send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

async fn rows(gw: &tidegate::server::Running, want: usize) -> Vec<Value> {
    for _ in 0..200 {
        let v = admin_get(gw, "/admin/requests?limit=100").await;
        let list = v["requests"].as_array().unwrap().clone();
        if list.len() >= want {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("journal never reached {want} rows");
}

/// A gateway journaling to `journal.db` in the returned directory, with
/// admin key `adm`, in front of a plain simulator.
async fn journaled() -> (tempfile::TempDir, tidegate_simulate::Simulator, tidegate::server::Running) {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(&[]);
    let top = format!("journal: {}\nadmin_key: adm", dir.path().join("journal.db").display());
    let gw = gateway(&yaml(&sim, &top, "", "")).await;
    (dir, sim, gw)
}

fn find<'a>(rows: &'a [Value], model: &str) -> &'a Value {
    rows.iter().find(|r| r["model"] == model).unwrap_or_else(|| panic!("no row for {model}: {rows:?}"))
}

#[tokio::test]
async fn every_outcome_is_recorded_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let sim = sim(&[
        (
            "retried",
            Behavior {
                script: vec![Fault::new(
                    429,
                    r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#,
                )],
                ..Default::default()
            },
        ),
        ("dropped", Behavior { chunks: 8, script: vec![Fault::drop_after(4)], ..Default::default() }),
        ("slow", Behavior { latency_ms: 5000, ..Default::default() }),
        (
            "busy",
            Behavior {
                status: Some(503),
                error_body: r#"{"error":{"message":"overloaded"}}"#.into(),
                ..Default::default()
            },
        ),
        ("hold", Behavior { latency_ms: 800, ..Default::default() }),
    ]);
    let models = "  retried: { targets: [{ upstream: sim-openai }] }\n  dropped: { targets: [{ upstream: sim-openai }] }\n  slow: { targets: [{ upstream: sim-openai }] }\n  busy: { targets: [{ upstream: sim-openai }], deadline: 1s }\n  hold: { targets: [{ upstream: q }] }\n  queued: { targets: [{ upstream: q, model: hold }] }";
    let top = format!("journal: {}\nadmin_key: adm\nclient_keys: [{{ name: alice, key: {CLIENT_KEY} }}]", db.display());
    let text = yaml(&sim, &top, "", models).replace(
        "models:\n",
        &format!(
            "  - {{ name: q, protocol: openai, base_url: \"{}\", max_concurrent: 1, max_queue: 0 }}\nmodels:\n",
            sim.openai_url()
        ),
    );
    let gw = gateway(&text).await;
    let post = |model: &str, stream: bool| {
        client()
            .post(url(&gw, "/v1/chat/completions"))
            .bearer_auth(CLIENT_KEY)
            .body(format!(r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#))
            .send()
    };
    // completed after a retry
    assert_eq!(post("retried", false).await.unwrap().status(), 200);
    // incomplete: stream cut after content
    let streamed = post("dropped", true).await.unwrap().text().await.unwrap();
    assert!(streamed.contains("broke after"));
    // failed: exhausted within its 1 s deadline
    assert_eq!(post("busy", false).await.unwrap().status(), 503);
    // rejected: bad key
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth("wrong")
        .body(r#"{"model":"retried"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // rejected: queue full (max_queue 0 while "hold" holds the only slot)
    let holder = tokio::spawn(post("hold", false));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(post("queued", false).await.unwrap().status(), 429);
    assert_eq!(holder.await.unwrap().unwrap().status(), 200);
    // cancelled: the client leaves while the upstream works
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = r#"{"model":"slow"}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {CLIENT_KEY}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(conn);

    let list = rows(&gw, 7).await;
    assert_eq!(find(&list, "retried")["outcome"], "completed");
    assert_eq!(find(&list, "retried")["n_attempts"], 2);
    assert_eq!(find(&list, "retried")["client"], "alice");
    let dropped = find(&list, "dropped");
    assert_eq!(dropped["outcome"], "incomplete");
    assert_eq!(dropped["partial"], "tok0 tok1 tok2 ");
    assert_eq!(find(&list, "busy")["outcome"], "failed");
    assert_eq!(find(&list, "busy")["class"], "capacity");
    assert_eq!(find(&list, "queued")["outcome"], "rejected");
    assert_eq!(find(&list, "slow")["outcome"], "cancelled");
    let auth = list.iter().find(|r| r["status"] == 401).unwrap();
    assert_eq!(auth["outcome"], "rejected");

    // Detail: attempts with their verdicts.
    let id = find(&list, "retried")["id"].as_str().unwrap().to_string();
    let detail = admin_get(&gw, &format!("/admin/requests/{id}")).await;
    let verdicts: Vec<&str> =
        detail["attempts"].as_array().unwrap().iter().map(|a| a["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, ["retry_same", "ok"]);
    assert_eq!(detail["attempts"][0]["status"], 429);
    let incomplete = admin_get(&gw, "/admin/requests?outcome=incomplete").await;
    assert_eq!(incomplete["requests"].as_array().unwrap().len(), 1);

    // Restart: a new gateway on the same file sees the same history.
    drop(gw);
    let gw2 = gateway(&text).await;
    let again = rows(&gw2, 7).await;
    assert_eq!(find(&again, "dropped")["partial"], "tok0 tok1 tok2 ");

    // No key, client's or upstream's, anywhere in the raw file.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut raw = std::fs::read(&db).unwrap();
    if let Ok(wal) = std::fs::read(dir.path().join("journal.db-wal")) {
        raw.extend(wal);
    }
    let raw = String::from_utf8_lossy(&raw);
    assert!(!raw.contains(CLIENT_KEY) && !raw.contains(UPSTREAM_KEY), "a key reached the journal file");
    assert!(raw.contains("alice"));

    // The CLI reads the same file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["log", "--journal"])
        .arg(&db)
        .args(["--outcome", "incomplete", "--since", "1h"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        table.contains("incomplete") && table.contains("dropped") && table.contains("partial: 15 chars"),
        "{table}"
    );
    assert!(!table.contains("completed"), "{table}");
}

#[tokio::test]
async fn a_journal_that_cannot_be_written_never_fails_a_request() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "journal: /dev/null/not-a-dir/journal.db\nadmin_key: adm", "", "")).await;
    for _ in 0..5 {
        assert_serves(&gw).await;
    }
    let resp =
        client().post(url(&gw, "/v1/messages")).body(r#"{"model":"claude","stream":true}"#).send().await.unwrap();
    let mut s = resp.bytes_stream();
    while s.next().await.is_some() {}
    let mut dropped = 0;
    for _ in 0..100 {
        let v = admin_get(&gw, "/admin/upstreams").await;
        dropped = v["journal_dropped_rows"].as_u64().unwrap();
        if dropped >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dropped, 6, "dropped rows are counted");
}

#[tokio::test]
async fn a_flood_from_one_key_is_flagged_steady_traffic_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let top = format!(
        "journal: {}\nadmin_key: adm\nanomaly_window: 1s\nanomaly_factor: 5\nanomaly_min_requests: 20\nclient_keys:\n  - {{ name: flood, key: k-flood }}\n  - {{ name: steady, key: k-steady }}",
        dir.path().join("j.db").display()
    );
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, &top, "", "")).await;
    let send = |key: &'static str| {
        client().post(url(&gw, "/v1/chat/completions")).bearer_auth(key).body(r#"{"model":"gpt"}"#).send()
    };
    // Three windows of steady use by both keys.
    for _ in 0..3 {
        for _ in 0..3 {
            assert_eq!(send("k-flood").await.unwrap().status(), 200);
            assert_eq!(send("k-steady").await.unwrap().status(), 200);
        }
        tokio::time::sleep(Duration::from_millis(1050)).await;
    }
    // Then one key sends 100 at once; the other keeps its pace.
    for _ in 0..100 {
        assert_eq!(send("k-flood").await.unwrap().status(), 200, "a flood warning must never block");
    }
    for _ in 0..3 {
        assert_eq!(send("k-steady").await.unwrap().status(), 200);
    }
    let list = rows(&gw, 100).await;
    let flagged = |name: &str| list.iter().filter(|r| r["client"] == name && r["anomaly"] == true).count();
    assert!(flagged("flood") >= 20, "flood not flagged: {}", flagged("flood"));
    assert_eq!(flagged("steady"), 0);
    let metrics = client().get(url(&gw, "/metrics")).bearer_auth("adm").send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"tidegate_anomalies_total{client="flood"} 1"#), "{metrics}");
    assert!(!metrics.contains(r#"tidegate_anomalies_total{client="steady""#));
    assert!(metrics.contains(r#"tidegate_client_state{client="steady",what="in_flight"} 0"#), "per-key gauges by name");
}

#[tokio::test]
async fn a_burst_is_journaled_row_for_row_under_the_ids_clients_were_given() {
    // Ids made in the same millisecond must stay distinct row keys: a
    // collision would silently replace a row.
    let (_dir, _sim, gw) = journaled().await;
    let sends = (0..300).map(|_| {
        let req = client()
            .post(url(&gw, "/v1/chat/completions"))
            .body(r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#);
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned()
        }
    });
    let mut given: Vec<String> = futures_util::stream::iter(sends).buffer_unordered(60).collect().await;
    given.sort();
    given.dedup();
    assert_eq!(given.len(), 300, "every answer has its own id");
    let mut stored = Vec::new();
    for _ in 0..200 {
        let v = admin_get(&gw, "/admin/requests?limit=1000").await;
        stored = v["requests"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        if stored.len() >= 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let newest_first = stored.clone();
    stored.sort();
    assert_eq!(stored.len(), given.len(), "one row per request");
    assert!(stored == given, "rows stored under the ids clients were given");
    let mut by_time = newest_first;
    by_time.reverse();
    assert_eq!(by_time, stored, "newest first is id order");
}

/// The per-request log line is the record only when the journal is off:
/// with the journal on it moves to `debug` (a second record per request
/// costs throughput and says nothing the journal does not).
#[tokio::test]
async fn the_request_log_line_is_info_only_without_a_journal() {
    let sim = sim(&[]);
    for (journal, expect_line) in [(true, false), (false, true)] {
        let dir = tempfile::tempdir().unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let journal_line =
            if journal { format!("journal: {}", dir.path().join("j.db").display()) } else { "journal: \"off\"".into() };
        let config = yaml(&sim, &journal_line, "", "").replace("listen: 127.0.0.1:0", &format!("listen: {addr}"));
        let path = dir.path().join("tidegate.yaml");
        std::fs::write(&path, config).unwrap();
        let log = dir.path().join("stderr.log");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let base = format!("http://{addr}");
        let mut status = 0;
        for _ in 0..200 {
            let sent = client().post(format!("{base}/v1/chat/completions")).body(r#"{"model":"gpt"}"#).send().await;
            if let Ok(resp) = sent {
                status = resp.status().as_u16();
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(status, 200);
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("tidegate listening"), "{text}");
        assert_eq!(text.contains("request id="), expect_line, "journal {journal}: {text}");
    }
}

#[tokio::test]
async fn a_quiet_gateway_commits_rarely_yet_a_read_sees_every_answered_request() {
    // The writer gathers rows for up to a second before a commit (the
    // commit's fixed cost dominated at low rates); the admin API hurries it,
    // so what was answered is there at the first read, with no polling.
    let (dir, _sim, gw) = journaled().await;
    let db = dir.path().join("journal.db");
    let body = r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let resp = client().post(url(&gw, "/v1/chat/completions")).body(body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        ids.push(resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned());
        let _ = resp.bytes().await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // Not committed yet: three rows 60 ms apart are still gathering
    // (another process reads the file as `tidegate log` would).
    let query = tidegate::journal::Query { outcome: None, model: None, since_ms: None, limit: 10 };
    let before = tidegate::journal::list(&db, &query).unwrap_or_default();
    assert!(before.len() < 3, "a quiet gateway's rows gather before a commit: {} already stored", before.len());
    let v = admin_get(&gw, "/admin/requests?limit=10").await;
    let mut stored: Vec<String> =
        v["requests"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
    stored.sort();
    ids.sort();
    assert_eq!(stored, ids, "the first read shows every request answered before it");
    let one = admin_get(&gw, &format!("/admin/requests/{}", ids[2])).await;
    assert_eq!(one["id"], ids[2]);
}

/// A client's model name and a provider's error text reach the journal as
/// sent; `tidegate log` shows them escaped: no escape sequence, bell, NUL,
/// carriage return or forged line reaches the operator's terminal.
#[tokio::test]
async fn tidegate_log_escapes_what_clients_and_providers_wrote() {
    let hostile_error = "bad\u{1b}]0;owned\u{7} request\u{8}\u{8}\u{0} forged";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    // A provider at capacity until the deadline, its message JSON-escaped
    // (tidegate decodes it to summarise it in its own answer).
    let body = serde_json::json!({ "error": { "message": hostile_error, "type": "server_error" } });
    let busy = Behavior { status: Some(503), error_body: body.to_string(), ..Default::default() };
    let sim = sim(&[("real-bad", busy)]);
    let top = format!("journal: {}\nadmin_key: adm", db.display());
    let models = "  bad:\n    targets: [{ upstream: sim-openai, model: real-bad }]\n    deadline: 300ms";
    let gw = gateway(&yaml(&sim, &top, "", models)).await;
    let model = "gpt\u{1b}[2J\u{1b}[31m\u{0}\u{7}\r\n2026-01-01 00:00:00 completed    200 forged\u{202e}";
    let request = serde_json::json!({ "model": model, "messages": [] });
    assert_eq!(post(&gw, "/v1/chat/completions", &request.to_string()).await.status(), 404);
    let request = serde_json::json!({ "model": "bad", "messages": [] });
    let resp = post(&gw, "/v1/chat/completions", &request.to_string()).await;
    assert!(resp.status().is_server_error(), "{}", resp.status());
    let stored = rows(&gw, 2).await;
    assert!(stored.iter().any(|r| r["model"] == model), "the journal keeps the name as sent: {stored:?}");
    drop(gw);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["log", "--journal"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    let unsafe_char = table.chars().find(|&c| (c.is_control() && c != '\n') || c == '\u{202e}');
    assert_eq!(unsafe_char, None, "{table:?}");
    assert_eq!(table.lines().count(), 3, "a header and two rows, no forged line: {table}");
    assert!(table.contains("\\u{1b}[2J") && table.contains("\\u{7}"), "{table}");
    let provider = stored.iter().find(|r| r["model"] == "bad").unwrap();
    assert!(provider["error"].as_str().unwrap().contains('\u{1b}'), "the provider's text is kept as sent: {provider}");
}
