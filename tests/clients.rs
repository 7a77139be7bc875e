//! tidegate's final answers in each client's retry contract (README: "When
//! tidegate gives up"): the same give-up told as a stop or a come-back in
//! the signals Codex, Claude Code, Gemini CLI, opencode, Qwen Code and the
//! SDKs each obey; per-client deadlines; Codex's WebSocket upgrade.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tidegate_simulate::{Behavior, Fault};
use tokio::time::Instant;

/// Anthropic's session limit, resetting five hours from now (a fixed
/// "3:20am" would be minutes away for an hour of every day).
fn session() -> String {
    let reset = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(5);
    let at = reset.strftime("%-I:%M%P"); // a Timestamp formats in UTC
    format!(
        r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"You've hit your session limit · resets {at}"}}}}"#
    )
}
const C3009: &str = r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#;

const CODEX: &[(&str, &str)] =
    &[("user-agent", "codex_exec/0.171.0 (Debian 12.0.0; x86_64)"), ("originator", "codex_exec")];
const CLAUDE: &[(&str, &str)] = &[("user-agent", "claude-cli/2.1.332 (external, cli)")];
const GEMINI: &[(&str, &str)] = &[("user-agent", "GeminiCLI/0.61.0/gemini-2.5-pro (linux; x64)")];
const OPENCODE: &[(&str, &str)] = &[("user-agent", "opencode/1.18.33 (linux; x64) ai-sdk/provider-utils/4.0.40")];
const QWEN: &[(&str, &str)] = &[("user-agent", "QwenCode/0.24.4 (linux; x64)")];
const SDK: &[(&str, &str)] = &[("user-agent", "OpenAI/Python 2.8.1")];

/// A model refused for a day: a session limit, `Retry-After: 18000`.
fn limited() -> Behavior {
    Behavior {
        busy_for_ms: Some(86_400_000),
        busy_with: Some(Fault::new(429, &session()).header("retry-after", "18000")),
        ..Default::default()
    }
}

/// A model at capacity for a day, no `Retry-After` (tidegate's deadline
/// runs out first).
fn busy() -> Behavior {
    Behavior { busy_for_ms: Some(86_400_000), busy_with: Some(Fault::new(429, C3009)), ..Default::default() }
}

/// One upstream per protocol; `lim-*` models limited, `busy-*` busy (each
/// its own upstream: a limit benches its account).
fn config(sim: &tidegate_simulate::Simulator, top: &str) -> String {
    let mut upstreams = String::new();
    let mut models = String::new();
    for (fault, protocol, base) in [
        ("lim", "openai", sim.openai_url()),
        ("lim", "anthropic", sim.anthropic_url()),
        ("lim", "gemini", sim.gemini_url()),
        ("busy", "openai", sim.openai_url()),
        ("busy", "anthropic", sim.anthropic_url()),
    ] {
        upstreams.push_str(&format!(
            "  - {{ name: {fault}-{protocol}, protocol: {protocol}, base_url: \"{base}\", api_key: {UPSTREAM_KEY} }}\n"
        ));
        models.push_str(&format!(
            "  {fault}-{protocol}:\n    targets: [{{ upstream: {fault}-{protocol}, model: {fault}-real }}]\n"
        ));
    }
    let fast =
        if top.contains("defaults:") { "" } else { "defaults:\n  retry: { base_delay: 10ms, max_delay: 50ms }\n" };
    format!("listen: 127.0.0.1:0\njournal: \"off\"\n{fast}{top}\nupstreams:\n{upstreams}models:\n{models}")
}

async fn ask(gw: &tidegate::server::Running, path: &str, who: &[(&str, &str)], body: &str) -> reqwest::Response {
    let mut req = client().post(url(gw, path)).body(body.to_string());
    for (k, v) in who {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_limit_hours_away_is_a_stop_in_each_clients_own_signal() {
    let sim = sim(&[("lim-real", limited())]);
    let gw = gateway(&config(&sim, "")).await;
    let responses = r#"{"model":"lim-openai","input":"hi"}"#;
    let chat = r#"{"model":"lim-openai","messages":[{"role":"user","content":"hi"}]}"#;

    // Codex: a 429 of type usage_limit_reached with resets_at (it names
    // the limit and the reset, and stops); no Retry-After (it would sleep it).
    let resp = ask(&gw, "/v1/responses", CODEX, responses).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), None);
    assert_eq!(header(&resp, "x-should-retry"), Some("false"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "usage_limit_reached", "{v}");
    let resets_at = v["error"]["resets_at"].as_i64().unwrap();
    let now = jiff::Timestamp::now().as_second();
    assert!(resets_at > now + 3600 && resets_at < now + 86_400 + 60, "{resets_at} vs now {now}");
    assert!(v["error"]["message"].as_str().unwrap().contains("session limit"), "{v}");

    // The SDKs: the truthful 429, x-should-retry: false and the real wait.
    let resp = ask(&gw, "/v1/chat/completions", SDK, chat).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "x-should-retry"), Some("false"));
    assert!(header(&resp, "retry-after").unwrap().parse::<u64>().unwrap() >= 3600);

    // opencode and Qwen Code retry every 429 whatever the headers: a 403,
    // no Retry-After; opencode's in words it does not retry on.
    for who in [OPENCODE, QWEN] {
        let resp = ask(&gw, "/v1/chat/completions", who, chat).await;
        assert_eq!(resp.status(), 403, "{who:?}");
        assert_eq!(header(&resp, "retry-after"), None);
        let v: Value = resp.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap().to_lowercase();
        assert!(message.contains("session limit") && message.contains("reset"), "{message}");
        if who == OPENCODE {
            assert!(!message.contains("429") && !message.contains("rate-limit"), "{message}");
        }
    }

    // Claude Code stops on a Retry-After over 60 s.
    let messages = r#"{"model":"lim-anthropic","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = ask(&gw, "/v1/messages", CLAUDE, messages).await;
    assert_eq!(resp.status(), 429);
    assert!(header(&resp, "retry-after").unwrap().parse::<u64>().unwrap() > 60);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");

    // Gemini CLI stops on a RetryInfo over 300 s.
    let gemini = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let resp = ask(&gw, "/v1beta/models/lim-gemini:generateContent", GEMINI, gemini).await;
    assert_eq!(resp.status(), 429);
    let v: Value = resp.json().await.unwrap();
    let delay = v["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|d| d["retryDelay"].as_str())
        .unwrap_or_else(|| panic!("no RetryInfo: {v}"));
    assert!(delay.trim_end_matches('s').parse::<u64>().unwrap() > 300, "{delay}");
    // Each upstream was asked once: every later answer came from the bench.
    assert_eq!(sim.state.received().len(), 3, "one request per upstream");
}

#[tokio::test]
async fn capacity_that_outlasts_the_deadline_is_a_come_back_within_what_the_client_waits() {
    let sim = sim(&[("busy-real", busy())]);
    let gw = gateway(&config(&sim, "")).await;
    let chat = r#"{"model":"busy-openai","messages":[{"role":"user","content":"hi"}]}"#;
    for who in [SDK, CODEX, OPENCODE, QWEN] {
        let resp = client()
            .post(url(&gw, "/v1/chat/completions"))
            .header("user-agent", who[0].1)
            .header("x-tidegate-deadline", "300ms")
            .body(chat)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 429, "{who:?}");
        assert_eq!(header(&resp, "x-should-retry"), Some("true"), "{who:?}");
        let secs: u64 = header(&resp, "retry-after").unwrap().parse().unwrap();
        let ms: u64 = header(&resp, "retry-after-ms").unwrap().parse().unwrap();
        assert!((1..=60).contains(&secs) && ms <= secs * 1000, "{who:?}: {secs} s, {ms} ms");
    }
}

#[tokio::test]
async fn a_stop_after_a_committed_stream_is_an_event_codex_does_not_retry() {
    // A limit hours away answered after the keep-alive committed 200: for
    // Codex, `invalid_prompt` (it prints the message and stops); a
    // come-back is `rate_limit_exceeded` saying when.
    let sim = sim_with_late_limit();
    let top = "defaults:\n  retry: { base_delay: 300ms, max_delay: 300ms }\n  stream_keepalive_after: 100ms";
    let gw = gateway(&config(&sim, top)).await;
    let body = r#"{"model":"lim-openai","input":"hi","stream":true}"#;
    let resp = ask(&gw, "/v1/responses", CODEX, body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"invalid_prompt\"") && text.contains("session limit"), "{text}");
    assert!(!text.contains("server_is_overloaded"), "{text}");
}

/// `lim-real`: two concurrency refusals, then the session limit for good.
fn sim_with_late_limit() -> tidegate_simulate::Simulator {
    let refusal = Fault::new(429, &session()).header("retry-after", "18000");
    let mut script = vec![Fault::new(429, C3009), Fault::new(429, C3009)];
    script.extend((0..20).map(|_| refusal.clone()));
    sim(&[("lim-real", Behavior { script, ..Default::default() })])
}

/// With `websocket: false` (served by default: tests/websocket.rs).
#[tokio::test]
async fn a_websocket_upgrade_is_answered_426_so_codex_falls_back_quietly() {
    let sim = sim(&[]);
    let gw = gateway(&config(&sim, "websocket: false")).await;
    let resp = client()
        .get(url(&gw, "/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 426);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("HTTP"), "{v}");
    // A plain GET is still the 405 it was; POST serves.
    let resp = client().get(url(&gw, "/v1/responses")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_serves_model(&gw).await;
}

async fn assert_serves_model(gw: &tidegate::server::Running) {
    let resp = ask(gw, "/v1/responses", CODEX, r#"{"model":"busy-openai","input":"hi"}"#).await;
    // busy-real is not configured in this simulator: answered normally.
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn each_key_has_its_own_deadline_and_a_request_may_only_shorten_it() {
    let sim = sim(&[("busy-real", busy())]);
    let top = "client_defaults: { deadline: 400ms }\nclient_keys:\n  - { name: agent, key: k-agent, deadline: 1500ms }\n  - { name: chat, key: k-chat }";
    let gw = gateway(&config(&sim, top)).await;
    let chat = r#"{"model":"busy-openai","messages":[{"role":"user","content":"hi"}]}"#;
    let took = |key: &'static str, asked: Option<&'static str>| {
        let gw = &gw;
        async move {
            let mut req = client().post(url(gw, "/v1/chat/completions")).bearer_auth(key).body(chat);
            if let Some(d) = asked {
                req = req.header("x-tidegate-deadline", d);
            }
            let started = Instant::now();
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 429);
            started.elapsed()
        }
    };
    let agent = took("k-agent", None).await;
    let chat_app = took("k-chat", None).await;
    let shortened = took("k-agent", Some("200ms")).await;
    let not_longer = took("k-chat", Some("10s")).await;
    // Ended by its deadline: within it, and not long before (the retry
    // budget may leave no room for a last attempt near the end).
    assert!(agent >= Duration::from_millis(800) && agent <= Duration::from_millis(1700), "agent {agent:?}");
    assert!(chat_app <= Duration::from_millis(550) && agent > chat_app * 2, "chat {chat_app:?}, agent {agent:?}");
    assert!(shortened <= Duration::from_millis(350), "shortened {shortened:?}");
    assert!(not_longer <= Duration::from_millis(550), "a request may not lengthen: {not_longer:?}");
}
