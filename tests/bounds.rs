//! One request must never crash, stall or bloat the gateway: JSON nested
//! past tidegate's depth limit is refused with a 400 naming it (the
//! gateway, a real process, stays up); client-chosen type names cost
//! linear work and a bounded header; kept conversations stay within their
//! bound in RSS; a broken event in a translated stream is a broken stream;
//! a tool call's arguments are bounded; a provider's message never carries
//! a configured secret out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tidegate_simulate::{Behavior, SimConfig, Simulator};

/// A chat-completions-only provider (so Anthropic, Responses and Gemini
/// clients reach it translated).
fn chat_only(models: &[(&str, Behavior)]) -> Simulator {
    let config = SimConfig {
        models: models.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<HashMap<_, _>>(),
        record: true,
        chat_only: true,
        ..Default::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap()
}

/// An Anthropic request whose one message holds `levels` `tool_result`
/// blocks, each the content of the one before.
fn nested_tool_results(levels: usize) -> String {
    let mut block = json!({"type": "text", "text": "hi"}).to_string();
    for i in 0..levels {
        block = format!(r#"{{"type":"tool_result","tool_use_id":"t{i}","content":[{block}]}}"#);
    }
    format!(r#"{{"model":"m","max_tokens":16,"messages":[{{"role":"user","content":[{block}]}}]}}"#)
}

async fn started(gw: &Process) {
    for _ in 0..300 {
        if let Ok(r) = client().get(format!("{}/healthz", gw.base())).send().await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("tidegate did not start");
}

/// The crash that took every request in flight down with it: 2,048 levels
/// of `tool_result` read recursively overflowed a runtime thread's stack
/// and aborted the process. Now: a 400 in the client's shape naming the
/// limit, on messages and on count_tokens (no upstream involved), and the
/// same process serves the next request.
#[tokio::test]
async fn json_nested_past_the_limit_is_refused_and_the_process_stays_up() {
    let sim = chat_only(&[]);
    let mut gw = Process::spawn(|addr, _| {
        format!(
            "listen: {addr}\njournal: \"off\"\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  m:\n    targets: [{{ upstream: chat, model: glm }}]\n",
            sim.openai_url()
        )
    });
    started(&gw).await;
    let deep = nested_tool_results(2048);
    assert!(deep.len() > 100 * 1024, "{}", deep.len());
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let resp = client().post(format!("{}{path}", gw.base())).body(deep.clone()).send().await;
        let resp = resp.unwrap_or_else(|e| panic!("{path}: the gateway did not answer ({e})"));
        assert_eq!(resp.status(), 400, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["type"], "error", "{path}: Anthropic's error shape: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("nested deeper than 128 levels"), "{path}: {message}");
        assert!(gw.child.try_wait().unwrap().is_none(), "{path}: the gateway process died");
    }
    // Within the limit, the same shape is translated as before.
    let shallow = nested_tool_results(20);
    let resp = client().post(format!("{}/v1/messages", gw.base())).body(shallow).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    // And so is an ordinary request, on the same process.
    let body = r#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = client().post(format!("{}/v1/messages", gw.base())).body(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(gw.child.try_wait().unwrap().is_none());
}

/// Every client protocol's reader meets the same limit: a chat, Responses
/// and Gemini body nested past it is a 400 naming it.
#[tokio::test]
async fn every_client_protocol_refuses_json_nested_past_the_limit() {
    let sim = chat_only(&[]);
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - {{ name: anth, protocol: anthropic, base_url: \"{}\", api_key: k }}\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  on-anthropic:\n    targets: [{{ upstream: anth, model: claude }}]\n  on-chat:\n    targets: [{{ upstream: chat, model: glm }}]\n",
        sim.anthropic_url(),
        sim.openai_url()
    );
    let gw = gateway(&yaml).await;
    let deep = |levels: usize| "[".repeat(levels) + &"]".repeat(levels);
    let cases = [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"on-anthropic","messages":[{{"role":"user","content":"hi"}}],"tools":{}}}"#,
                deep(300)
            ),
        ),
        ("/v1/responses", format!(r#"{{"model":"on-chat","input":{}}}"#, deep(300))),
        ("/v1beta/models/on-chat:generateContent", format!(r#"{{"contents":{}}}"#, deep(300))),
    ];
    for (path, body) in cases {
        let resp = post(&gw, path, &body).await;
        assert_eq!(resp.status(), 400, "{path}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("nested deeper than 128 levels"), "{path}: {text}");
    }
    assert_eq!(sim.state.received().len(), 0, "nothing deeper than the limit went upstream");
}

/// A Responses request with `n` items of distinct unknown types (each is
/// dropped and declared): the time tidegate takes to answer it.
async fn time_unknown_items(gw: &tidegate::server::Running, n: usize) -> (Duration, String) {
    let items: Vec<Value> = (0..n).map(|i| json!({"type": format!("made_up_type_{i:06}")})).collect();
    let mut input = items;
    input.push(json!({"role": "user", "content": "hi"}));
    let body = json!({"model": "on-chat", "store": false, "input": input}).to_string();
    let started = tokio::time::Instant::now();
    let resp = post(gw, "/v1/responses", &body).await;
    let took = started.elapsed();
    assert_eq!(resp.status(), 200);
    let dropped = resp.headers().get("x-tidegate-dropped").unwrap().to_str().unwrap().to_owned();
    (took, dropped)
}

/// Declared drops were searched note by note, so n distinct client-chosen
/// type names cost n² comparisons (80k of them: 10 s, and another
/// client's small request waited behind it), and the header declaring
/// them grew to 1.1 MiB. Now the work grows linearly (measured as a ratio
/// of medians, 4x the items: linear is 4x, quadratic 16x) and the header
/// stays small, summarising what it cannot list.
#[tokio::test]
async fn client_chosen_type_names_cost_linear_work_and_a_bounded_header() {
    let sim = chat_only(&[]);
    let yaml = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  on-chat:\n    targets: [{{ upstream: chat, model: glm }}]\n",
        sim.openai_url()
    );
    let gw = gateway(&yaml).await;
    time_unknown_items(&gw, 100).await;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (mut small, mut large) = (Vec::new(), Vec::new());
    let mut header = String::new();
    for _ in 0..3 {
        small.push(time_unknown_items(&gw, 5_000).await.0);
        let (took, dropped) = time_unknown_items(&gw, 20_000).await;
        large.push(took);
        header = dropped;
    }
    let (small, large) = (median(small), median(large));
    let ratio = large.as_secs_f64() / small.as_secs_f64();
    assert!(ratio < 8.0, "4x the items took {ratio:.1}x the time ({small:?} -> {large:?}): not linear");
    assert!(header.len() <= 4096, "the dropped header is {} bytes", header.len());
    assert!(header.starts_with("made_up_type_000000 item, "), "{header}");
    assert!(header.ends_with(", and 19968 more of other kinds"), "{header}");
}

/// A chat stream with one event that is not JSON between two text deltas.
fn garbage_between_deltas() -> Behavior {
    let chunk = |text: &str| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "glm", "choices": [{"index": 0, "delta": {"content": text}}]})
        )
    };
    let done = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"glm\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let body = format!("{}data: <html>bad gateway</html>\n\n{}{done}", chunk("Hello"), chunk(" world"));
    let fault = tidegate_simulate::Fault {
        content_type: "text/event-stream".into(),
        ..tidegate_simulate::Fault::new(200, &body)
    };
    Behavior { script: vec![fault.clone(), fault], ..Default::default() }
}

/// The journal's rows, newest first, once `n` are there.
async fn rows(gw: &tidegate::server::Running, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let v = admin_json(gw, "/admin/requests").await;
        if let Some(rows) = v["requests"].as_array().filter(|r| r.len() >= n) {
            return rows.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the journal did not get {n} rows");
}

/// An event a translated stream cannot read was dropped silently: the
/// client got "Hello world" with a hole and the journal said `completed`.
/// Now it is a break: the text before it, the client's own error event,
/// nothing after; journaled `incomplete` with that text kept.
#[tokio::test]
async fn an_unreadable_event_breaks_a_translated_stream() {
    let sim = chat_only(&[("garbage", garbage_between_deltas())]);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_key: adm\njournal: {}\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  m:\n    targets: [{{ upstream: chat, model: garbage }}]\n",
        dir.path().join("j.db").display(),
        sim.openai_url()
    );
    let gw = gateway(&yaml).await;
    let anthropic = r#"{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let text = post(&gw, "/v1/messages", anthropic).await.text().await.unwrap();
    assert!(text.contains(r#""text":"Hello""#), "{text}");
    assert!(!text.contains("world"), "nothing after the broken event: {text}");
    assert!(text.contains("event: error"), "Anthropic's error event: {text}");
    assert!(text.contains("not JSON"), "{text}");
    assert!(!text.contains("message_stop"), "not told as finished: {text}");
    let responses = r#"{"model":"m","stream":true,"store":false,"input":"hi"}"#;
    let text = post(&gw, "/v1/responses", responses).await.text().await.unwrap();
    assert!(text.contains(r#""delta":"Hello""#), "{text}");
    assert!(!text.contains("world"), "{text}");
    assert!(text.contains("response.failed"), "the Responses error event: {text}");
    assert!(!text.contains("response.completed"), "{text}");
    for row in rows(&gw, 2).await {
        assert_eq!(row["outcome"], "incomplete", "{row}");
        assert_eq!(row["partial"], "Hello", "{row}");
    }
    // A client of the target's own protocol gets the bytes as they came.
    let chat = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let sim2 = chat_only(&[("garbage", garbage_between_deltas())]);
    let yaml2 = yaml.replace(&sim.openai_url(), &sim2.openai_url()).replace("j.db", "j2.db");
    let gw2 = gateway(&yaml2).await;
    let text = post(&gw2, "/v1/chat/completions", chat).await.text().await.unwrap();
    assert!(text.contains("<html>bad gateway</html>") && text.contains("world"), "{text}");
}

/// Before any content reached the client, an unreadable event is a broken
/// attempt like any other: retried, and the client sees only the retry.
#[tokio::test]
async fn an_unreadable_first_event_of_a_translated_stream_is_retried() {
    let garbage = tidegate_simulate::Fault {
        content_type: "text/event-stream".into(),
        ..tidegate_simulate::Fault::new(200, "data: upstream hiccup\n\n")
    };
    let sim = chat_only(&[("flaky", Behavior { script: vec![garbage], ..Default::default() })]);
    let yaml = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  retry: {{ base_delay: 10ms, max_delay: 50ms }}\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  m:\n    targets: [{{ upstream: chat, model: flaky }}]\n",
        sim.openai_url()
    );
    let gw = gateway(&yaml).await;
    let anthropic = r#"{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let text = post(&gw, "/v1/messages", anthropic).await.text().await.unwrap();
    assert!(text.contains("message_stop") && !text.contains("hiccup"), "{text}");
    assert_eq!(sim.state.received().len(), 2, "one broken attempt, one retry");
}

/// A chat provider on loopback whose one answer is a stream calling one
/// tool with `pieces` argument deltas of 256 KiB each (made as they are
/// sent); it counts the pieces it got out before the reader went away.
async fn huge_tool_call(pieces: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let sent = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                let chunk = |delta: Value, finish: Value| {
                    let v = json!({"id": "c1", "object": "chat.completion.chunk", "model": "glm",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                    bytes::Bytes::from(format!("data: {v}\n\n"))
                };
                let open = chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "write", "arguments": "{\"text\":\""}}]}),
                    Value::Null,
                );
                let piece = chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "a".repeat(256 * 1024)}}]}),
                    Value::Null,
                );
                let end =
                    chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"}"}}]}), json!("tool_calls"));
                let events = std::iter::once(open)
                    .chain((0..pieces).map(move |_| {
                        counter.fetch_add(1, Ordering::Relaxed);
                        piece.clone()
                    }))
                    .chain([end, bytes::Bytes::from_static(b"data: [DONE]\n\n")]);
                let body = axum::body::Body::from_stream(futures_util::stream::iter(
                    events.map(Ok::<_, std::convert::Infallible>),
                ));
                ([("content-type", "text/event-stream")], body)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), sent)
}

/// Peak resident memory of a process, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

/// A tool call's arguments were gathered without limit for a client that
/// receives a call whole (Anthropic, Responses, Gemini), then sent as one
/// event past the per-event limit: 160 MiB of them cost 962 MiB of RSS.
/// Now they are bounded like every other event (`max_stream_event`): the
/// stream breaks there with the client's error event, the upstream is
/// let go, and the process's peak memory stays near its start.
#[tokio::test]
async fn a_tool_calls_arguments_are_bounded_like_any_event() {
    let (base, sent) = huge_tool_call(256).await; // 64 MiB of arguments
    let gw = Process::spawn(|addr, _| {
        format!(
            "listen: {addr}\njournal: \"off\"\nmax_stream_event: 4MiB\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{base}\", api_key: k }}\nmodels:\n  m:\n    targets: [{{ upstream: chat, model: glm }}]\n"
        )
    });
    started(&gw).await;
    let before = peak_rss_mib(gw.child.id());
    let anthropic = r#"{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = client().post(format!("{}/v1/messages", gw.base())).body(anthropic).send().await.unwrap();
    let text = resp.text().await.unwrap();
    assert!(text.len() < 64 * 1024, "no giant event reached the client: {} bytes", text.len());
    assert!(text.contains("event: error") && text.contains("max_stream_event"), "{text}");
    let peak = peak_rss_mib(gw.child.id());
    assert!(peak - before < 48.0, "peak RSS grew {before:.0} -> {peak:.0} MiB");
    let pieces = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(pieces < 128, "the upstream was let go, not read to its end: {pieces} of 256 pieces sent");
}

/// Everything an admin or an operator can read of a process: the admin
/// views (upstreams, clients, every journal row with its attempts), the
/// journal's files and its log.
async fn everything_stored(gw: &Process, rows: usize) -> String {
    let get = |path: String| async move {
        client().get(format!("{}{path}", gw.base())).bearer_auth("adm").send().await.unwrap().text().await.unwrap()
    };
    let mut listed = Value::Null;
    for _ in 0..200 {
        listed = serde_json::from_str(&get("/admin/requests?limit=100".into()).await).unwrap();
        if listed["requests"].as_array().is_some_and(|r| r.len() >= rows) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut all = listed.to_string();
    for row in listed["requests"].as_array().unwrap() {
        all += &get(format!("/admin/requests/{}", row["id"].as_str().unwrap())).await;
    }
    all += &get("/admin/upstreams".into()).await;
    all += &get("/admin/clients".into()).await;
    all += &get("/metrics".into()).await;
    // The files it wrote (its config, which holds the keys, is not one),
    // once the journal has its rows on disk.
    for _ in 0..200 {
        let journal: Vec<u8> = std::fs::read_dir(gw.dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().contains("journal.db"))
            .flat_map(|p| std::fs::read(p).unwrap_or_default())
            .collect();
        if journal.windows(10).any(|w| w == b"[redacted]") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for entry in std::fs::read_dir(gw.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "tidegate.yaml") {
            all += &format!("\n== {}\n", path.display());
            all += &String::from_utf8_lossy(&std::fs::read(&path).unwrap());
        }
    }
    all
}

/// A provider that echoes the key it was sent (in its message and in a
/// header) put tidegate's upstream key in the answer to every client, in
/// the bench's reason, the admin API and the journal. Now every
/// configured secret is replaced with a marker wherever provider text
/// enters: HTTP errors (passed on verbatim or translated), errors carried
/// in a 200, error events mid-stream.
#[tokio::test]
async fn a_providers_message_never_carries_a_configured_secret_out() {
    const CLIENT: &str = "ck-alice-0123456789";
    let echo = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {UPSTREAM_KEY} (client {CLIENT})","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
    );
    let unauthorized = tidegate_simulate::Fault::new(401, &echo).header("x-echo", &format!("Bearer {UPSTREAM_KEY}"));
    let mid_stream = tidegate_simulate::Fault::error_mid_stream(2, &echo.replace("invalid_api_key", "server_error"));
    let frame = format!(
        r#"{{"error":{{"message":"quota exhausted for {UPSTREAM_KEY}","type":"insufficient_quota","code":"insufficient_quota"}}}}"#
    );
    let script = |fault: &tidegate_simulate::Fault| Behavior { script: vec![fault.clone(); 4], ..Default::default() };
    let sim = sim(&[
        ("unauthorized", script(&unauthorized)),
        ("mid-stream", script(&mid_stream)),
        ("frame", script(&tidegate_simulate::Fault::error_frame(&frame))),
    ]);
    let gw = Process::spawn_logging("info", |addr, dir| {
        let upstream = |name: &str, protocol: &str| {
            format!(
                "  - {{ name: {name}, protocol: {protocol}, base_url: \"{}\", api_key: {UPSTREAM_KEY} }}\n",
                sim.openai_url()
            )
        };
        let ups: String = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| upstream(&format!("{n}-openai"), "openai") + &upstream(&format!("{n}-chat"), "openai-chat"))
            .collect();
        format!(
            "listen: {addr}\nadmin_key: adm\njournal: {}\nclient_keys: [{{ name: alice, key: {CLIENT} }}]\ndefaults:\n  retry: {{ base_delay: 10ms, max_delay: 20ms }}\nupstreams:\n{ups}models:\n  plain-401:\n    targets: [{{ upstream: a-openai, model: unauthorized }}]\n  translated-401:\n    targets: [{{ upstream: a-chat, model: unauthorized }}]\n  plain-stream:\n    targets: [{{ upstream: b-openai, model: mid-stream }}]\n  translated-stream:\n    targets: [{{ upstream: b-chat, model: mid-stream }}]\n  plain-frame:\n    targets: [{{ upstream: c-openai, model: frame }}]\n  translated-frame:\n    targets: [{{ upstream: c-chat, model: frame }}]\n",
            dir.join("journal.db").display()
        )
    });
    started(&gw).await;
    let send = |path: &'static str, body: String| {
        let url = format!("{}{path}", gw.base());
        async move {
            let resp = client().post(url).bearer_auth(CLIENT).body(body).send().await.unwrap();
            let headers = format!("{:?}", resp.headers());
            headers + &resp.text().await.unwrap()
        }
    };
    let chat = |model: &str, stream: bool| {
        json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).to_string()
    };
    let messages = |model: &str, stream: bool| {
        json!({"model": model, "stream": stream, "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
    };
    let answers = [
        send("/v1/chat/completions", chat("plain-401", false)).await,
        send("/v1/messages", messages("translated-401", false)).await,
        send("/v1/chat/completions", chat("plain-stream", true)).await,
        send("/v1/messages", messages("translated-stream", true)).await,
        send("/v1/chat/completions", chat("plain-frame", true)).await,
        send("/v1/messages", messages("translated-frame", true)).await,
    ];
    for (i, answer) in answers.iter().enumerate() {
        assert!(!answer.contains(UPSTREAM_KEY) && !answer.contains(CLIENT), "answer {i} carries a secret: {answer}");
        assert!(answer.contains("[redacted]"), "answer {i} says where the secret was: {answer}");
    }
    let stored = everything_stored(&gw, answers.len()).await;
    let journal = stored.split("\n== ").filter(|f| f.contains("journal.db")).collect::<String>();
    assert!(journal.contains("[redacted]"), "the journal keeps the provider's message, scrubbed");
    let around = |secret: &str| stored.find(secret).map(|at| stored[at.saturating_sub(300)..at + 50].to_owned());
    assert_eq!(around(UPSTREAM_KEY), None, "a stored or shown text carries the upstream key");
    assert!(!stored.contains(CLIENT), "a stored or shown text carries the client key");
}

/// Resident memory of a process now, in MiB (`VmRSS`).
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

/// Kept conversations were bounded by the JSON text they came in, but
/// held as parsed trees (10–70 times that) and once per turn: a long chain
/// took RSS past 600 MiB against the documented 64 MiB, and requests of
/// millions of items kept hundreds. Now a turn is held as its text, shared
/// by every later turn, and a conversation past MAX_ITEMS is not kept: a
/// 400-turn chain and four 500,000-item requests leave RSS near its start.
#[tokio::test]
async fn kept_conversations_stay_within_their_bound_in_rss() {
    let sim = chat_only(&[]);
    let gw = Process::spawn(|addr, _| {
        format!(
            "listen: {addr}\njournal: \"off\"\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\nmodels:\n  m:\n    targets: [{{ upstream: chat, model: glm }}]\n",
            sim.openai_url()
        )
    });
    started(&gw).await;
    let c = client();
    let responses = format!("{}/v1/responses", gw.base());
    // Warm up (the runtime's threads, the connection pools, the allocator).
    for _ in 0..3 {
        c.post(&responses).body(r#"{"model":"m","store":false,"input":"hi"}"#).send().await.unwrap();
    }
    let start = rss_mib(gw.child.id());
    let mut previous: Option<String> = None;
    let nine: Vec<Value> = (0..9).map(|i| json!({"role": "user", "content": format!("n{i}")})).collect();
    for turn in 0..400 {
        let mut body = json!({"model": "m", "input": nine});
        if let Some(p) = &previous {
            body["previous_response_id"] = p.clone().into();
        }
        let resp = c.post(&responses).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200, "turn {turn}");
        previous = resp.json::<Value>().await.unwrap()["id"].as_str().map(str::to_owned);
    }
    let chain = rss_mib(gw.child.id());
    let ones = format!(r#"{{"model":"m","input":[{}{{"role":"user","content":"hi"}}]}}"#, "1,".repeat(500_000));
    for _ in 0..4 {
        let resp = c.post(&responses).body(ones.clone()).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let dropped = resp.headers().get("x-tidegate-dropped").unwrap().to_str().unwrap().to_owned();
        assert!(dropped.contains("is not kept"), "declared: {dropped}");
    }
    let end = rss_mib(gw.child.id());
    eprintln!("RSS: start {start:.1} MiB, after the chain {chain:.1}, after the large requests {end:.1}");
    assert!(chain - start < 48.0, "a 400-turn chain grew RSS {start:.0} -> {chain:.0} MiB");
    assert!(end - start < 64.0, "RSS grew {start:.0} -> {end:.0} MiB (bound: 64 MiB kept)");
}
