//! Any client to any target: chat completions, the Responses API and
//! Anthropic messages reach a target of another protocol translated, and
//! come back well-formed in their own grammar — tools, reasoning, errors,
//! failures mid-stream and failover across protocols included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::grammar::{self, Said};
use common::*;
use serde_json::{Value, json};
use tidegate::protocol::Protocol;
use tidegate_simulate::{Behavior, Fault, SimConfig, Simulator};

/// A provider that serves chat completions only (404 elsewhere), and one
/// that serves Anthropic messages.
struct Providers {
    chat: Simulator,
    anthropic: Simulator,
}

fn providers(reasoning: bool, models: &[(&str, Behavior)]) -> Providers {
    let config = |chat_only| SimConfig {
        models: models.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<HashMap<_, _>>(),
        record: true,
        chat_only,
        reasoning,
        ..Default::default()
    };
    let start = |c| Simulator::start("127.0.0.1:0".parse().unwrap(), c).unwrap();
    Providers { chat: start(config(true)), anthropic: start(config(false)) }
}

/// Aliases: `on-chat` (the chat-only provider, model glm-5.1), `on-anthropic`
/// (model claude-real), and `fails-over` (Anthropic's `busy` first, then chat).
fn config(p: &Providers, top: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\n{top}\ndefaults:\n  retry: {{ base_delay: 10ms, max_delay: 50ms }}\nupstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\n  - {{ name: anth, protocol: anthropic, base_url: \"{}\", api_key: k }}\nmodels:\n  on-chat:\n    targets: [{{ upstream: chat, model: glm-5.1 }}]\n  on-anthropic:\n    targets: [{{ upstream: anth, model: claude-real }}]\n  fails-over:\n    targets: [{{ upstream: anth, model: busy }}, {{ upstream: chat, model: glm-5.1 }}]\n  mid-stream:\n    targets: [{{ upstream: chat, model: breaks }}]\n  frame-first:\n    targets: [{{ upstream: chat, model: busy-frame }}]\n",
        p.chat.openai_url(),
        p.anthropic.anthropic_url()
    )
}

fn path(client: Protocol) -> &'static str {
    client.endpoint().path()
}

/// A request in `client`'s protocol offering one function tool,
/// `read_file(path)`, optionally asking for reasoning.
fn request(client: Protocol, model: &str, stream: bool, reasoning: bool) -> Value {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
    let mut v = match client {
        Protocol::OpenAiChat => {
            json!({"model": model, "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "read it"}],
            "tools": [{"type": "function", "function": {"name": "read_file", "description": "reads", "parameters": schema}}]})
        }
        Protocol::OpenAiResponses => json!({"model": model, "stream": stream, "store": false,
            "instructions": "be brief", "input": [{"role": "user", "content": [{"type": "input_text", "text": "read it"}]}],
            "tools": [{"type": "function", "name": "read_file", "description": "reads", "parameters": schema}]}),
        Protocol::Anthropic => json!({"model": model, "stream": stream, "max_tokens": 2048, "system": "be brief",
            "messages": [{"role": "user", "content": "read it"}],
            "tools": [{"name": "read_file", "description": "reads", "input_schema": schema}]}),
        Protocol::Gemini => panic!("Gemini clients name the model in the path: tests/gemini.rs"),
    };
    if reasoning {
        match client {
            Protocol::OpenAiChat => v["reasoning_effort"] = json!("low"),
            Protocol::OpenAiResponses => v["reasoning"] = json!({"effort": "low", "summary": "auto"}),
            Protocol::Anthropic => v["thinking"] = json!({"type": "enabled", "budget_tokens": 1024}),
            Protocol::Gemini => panic!("tests/gemini.rs"),
        }
    }
    v
}

/// What a whole (non-streamed) answer in `client`'s protocol said.
fn said(client: Protocol, v: &Value) -> Said {
    let mut said = Said { completed: true, ..Default::default() };
    match client {
        Protocol::OpenAiChat => {
            let m = &v["choices"][0]["message"];
            said.text = m["content"].as_str().unwrap_or_default().to_owned();
            said.reasoning = m["reasoning_content"].as_str().unwrap_or_default().to_owned();
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                said.calls.push((
                    c["function"]["name"].as_str().unwrap().to_owned(),
                    c["function"]["arguments"].as_str().unwrap().to_owned(),
                    false,
                ));
            }
            said.output_tokens = v["usage"]["completion_tokens"].as_u64();
            said.input_tokens = v["usage"]["prompt_tokens"].as_u64();
        }
        Protocol::OpenAiResponses => {
            for item in v["output"].as_array().unwrap() {
                match item["type"].as_str().unwrap() {
                    "message" => said.text.push_str(item["content"][0]["text"].as_str().unwrap()),
                    "reasoning" => said.reasoning.push_str(item["summary"][0]["text"].as_str().unwrap()),
                    "function_call" => said.calls.push((
                        item["name"].as_str().unwrap().to_owned(),
                        item["arguments"].as_str().unwrap().to_owned(),
                        false,
                    )),
                    "custom_tool_call" => said.calls.push((
                        item["name"].as_str().unwrap().to_owned(),
                        item["input"].as_str().unwrap().to_owned(),
                        true,
                    )),
                    other => panic!("unexpected item {other}"),
                }
            }
            said.output_tokens = v["usage"]["output_tokens"].as_u64();
            said.input_tokens = v["usage"]["input_tokens"].as_u64();
        }
        Protocol::Anthropic => {
            for b in v["content"].as_array().unwrap() {
                match b["type"].as_str().unwrap() {
                    "text" => said.text.push_str(b["text"].as_str().unwrap()),
                    "thinking" => said.reasoning.push_str(b["thinking"].as_str().unwrap()),
                    "tool_use" => {
                        said.calls.push((b["name"].as_str().unwrap().to_owned(), b["input"].to_string(), false))
                    }
                    other => panic!("unexpected block {other}"),
                }
            }
            said.output_tokens = v["usage"]["output_tokens"].as_u64();
            said.input_tokens = grammar::anthropic_input(&v["usage"]);
        }
        Protocol::Gemini => panic!("tests/gemini.rs"),
    }
    said
}

/// Sends `body` and reads the answer as `client` would: JSON, or a stream
/// checked against its grammar.
async fn exchange(
    gw: &tidegate::server::Running,
    client: Protocol,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Said) {
    let resp = common::client().post(url(gw, path(client))).json(body).send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let said = if body["stream"] == true {
        grammar::check(client, &text).unwrap_or_else(|e| panic!("{client:?} stream broke its grammar: {e}\n{text}"))
    } else {
        said(client, &serde_json::from_str(&text).unwrap())
    };
    (status, headers, said)
}

const PAIRS: [(Protocol, &str, Protocol); 4] = [
    (Protocol::OpenAiChat, "on-anthropic", Protocol::Anthropic),
    (Protocol::OpenAiResponses, "on-chat", Protocol::OpenAiChat),
    (Protocol::OpenAiResponses, "on-anthropic", Protocol::Anthropic),
    (Protocol::Anthropic, "on-chat", Protocol::OpenAiChat),
];

#[tokio::test]
async fn every_client_reaches_a_target_of_another_protocol_with_its_tools() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    for (client, alias, target) in PAIRS {
        for stream in [false, true] {
            let (_, headers, said) = exchange(&gw, client, &request(client, alias, stream, false)).await;
            let what = format!("{client:?} → {target:?}, stream {stream}");
            assert_eq!(headers["x-tidegate-translated"], format!("{}>{}", client.name(), target.name()), "{what}");
            assert_eq!(said.text, "tok0 tok1 tok2 tok3 tok4 ", "{what}");
            assert_eq!(said.reasoning, "", "{what}: reasoning nobody asked for");
            assert_eq!(said.calls.len(), 1, "{what}: {said:?}");
            let (name, args, _) = &said.calls[0];
            assert_eq!(name, "read_file", "{what}");
            assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({"path": "tok0"}), "{what}");
            assert_eq!(said.output_tokens, Some(5), "{what}: usage");
            // The simulator's 10 input tokens (Anthropic: 6 and 4 read from
            // the cache): a chat stream's usage chunk once said 0 here.
            assert_eq!(said.input_tokens, Some(10), "{what}: input tokens");
            // The target got a request in its own protocol, tools included.
            let sim = if target == Protocol::Anthropic { &p.anthropic } else { &p.chat };
            let got = sim.state.received().pop().unwrap();
            assert_eq!(got.path, target.endpoint().path(), "{what}");
            let sent: Value = serde_json::from_slice(&got.body).unwrap();
            match target {
                Protocol::Anthropic => {
                    assert_eq!(sent["model"], "claude-real");
                    assert_eq!(sent["system"][0]["text"], "be brief", "{what}");
                    assert_eq!(sent["tools"][0]["input_schema"]["required"], json!(["path"]), "{what}");
                    assert_eq!(
                        sent["messages"],
                        json!([{"role": "user", "content": [{"type": "text", "text": "read it"}]}])
                    );
                }
                _ => {
                    assert_eq!(sent["model"], "glm-5.1");
                    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "be brief"}), "{what}");
                    assert_eq!(sent["tools"][0]["function"]["name"], "read_file", "{what}");
                    assert_eq!(sent["stream"] == true, stream, "{what}");
                }
            }
            assert!(!got.headers.contains_key("x-tidegate-translated"));
        }
    }
    assert_serves_translated(&gw).await;
}

/// A plain chat request on the chat alias: same protocol, no translation.
async fn assert_serves_translated(gw: &tidegate::server::Running) {
    let resp =
        post(gw, "/v1/chat/completions", r#"{"model":"on-chat","messages":[{"role":"user","content":"hi"}]}"#).await;
    assert_eq!(resp.status(), 200);
    assert!(!resp.headers().contains_key("x-tidegate-translated"), "same protocol passes through");
}

#[tokio::test]
async fn a_tool_result_goes_back_under_its_call_id() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    // The second turn of Claude Code's loop, to a chat-only provider.
    let body = json!({"model": "on-chat", "max_tokens": 100, "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {"path": "a.rs"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "fn main() {}"},
            {"type": "text", "text": "and?"}]}],
        "tools": [{"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]});
    let (_, _, said) = exchange(&gw, Protocol::Anthropic, &body).await;
    assert!(said.calls.is_empty(), "the sim calls no tool after a result: {said:?}");
    let sent: Value = serde_json::from_slice(&p.chat.state.received().pop().unwrap().body).unwrap();
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "toolu_9", "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_9", "content": "fn main() {}"},
            {"role": "user", "content": "and?"}
        ])
    );
}

#[tokio::test]
async fn reasoning_becomes_the_clients_reasoning_form_only_when_asked() {
    let p = providers(true, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    for (client, alias, target) in PAIRS {
        for stream in [false, true] {
            for asked in [false, true] {
                let (_, _, said) = exchange(&gw, client, &request(client, alias, stream, asked)).await;
                let what = format!("{client:?} → {target:?}, stream {stream}, asked {asked}");
                assert_eq!(said.reasoning, if asked { "thinking hard " } else { "" }, "{what}");
                assert!(!said.text.contains("thinking"), "{what}: reasoning leaked into the text");
            }
        }
    }
}

#[tokio::test]
async fn codex_custom_tools_become_functions_and_come_back_as_custom_calls() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    for stream in [false, true] {
        let body = json!({"model": "on-chat", "stream": stream, "store": false, "input": "patch it",
            "tools": [{"type": "custom", "name": "apply_patch", "description": "patches",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                {"type": "web_search"}]});
        let (_, headers, said) = exchange(&gw, Protocol::OpenAiResponses, &body).await;
        assert_eq!(said.calls, [("apply_patch".to_owned(), "tok0".to_owned(), true)], "stream {stream}");
        assert_eq!(headers["x-tidegate-dropped"], "tool web_search");
        let sent: Value = serde_json::from_slice(&p.chat.state.received().pop().unwrap().body).unwrap();
        assert_eq!(sent["tools"].as_array().unwrap().len(), 1, "the built-in tool is not offered");
        assert_eq!(sent["tools"][0]["function"]["name"], "apply_patch");
        assert_eq!(sent["tools"][0]["function"]["parameters"]["properties"]["input"]["type"], "string");
    }
}

#[tokio::test]
async fn what_cannot_be_translated_is_refused_naming_the_field_and_never_sent() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    let pdf = json!({"model": "on-chat", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "summarize"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]});
    let forced = json!({"model": "on-chat", "max_tokens": 10, "messages": [{"role": "user", "content": "look it up"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "tool", "name": "web_search"}});
    let cases = [
        (Protocol::Anthropic, pdf, "messages[0].content[1]: a document block cannot be translated"),
        (Protocol::Anthropic, forced, "tool_choice: the tool \"web_search\" cannot be offered"),
    ];
    for (client, body, want) in cases {
        let resp = common::client().post(url(&gw, path(client))).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 400);
        let v: Value = resp.json().await.unwrap();
        let message = match client {
            Protocol::Anthropic => {
                assert_eq!(v["error"]["type"], "invalid_request_error");
                v["error"]["message"].as_str().unwrap().to_owned()
            }
            _ => v["error"]["message"].as_str().unwrap().to_owned(),
        };
        assert!(message.contains(want) && message.contains("upstream chat"), "{message}");
    }
    assert!(p.chat.state.received().is_empty(), "nothing untranslatable reaches the provider");
    // A built-in tool merely offered is dropped and declared; signed
    // thinking is Anthropic's own state and is dropped for a chat target.
    let offered = json!({"model": "on-chat", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "c2lnbmVk"},
            {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let resp = common::client().post(url(&gw, "/v1/messages")).json(&offered).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-dropped"], "tool web_search_20250305, thinking signature");
    let sent: Value = serde_json::from_slice(&p.chat.state.received().pop().unwrap().body).unwrap();
    assert!(sent.get("tools").is_none(), "{sent}");
    assert!(!sent.to_string().contains("c2lnbmVk"), "a signature reached another vendor: {sent}");
}

#[tokio::test]
async fn an_upstream_error_keeps_its_class_and_message_in_the_clients_shape() {
    let context = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
    let refused = Behavior { status: Some(400), error_body: context.into(), ..Default::default() };
    let p = providers(false, &[("glm-5.1", refused)]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    let resp = common::client()
        .post(url(&gw, "/v1/messages"))
        .json(&request(Protocol::Anthropic, "on-chat", true, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["message"], "This model's maximum context length is 8192 tokens");
    assert_eq!(p.chat.state.received().len(), 1, "a request error is not retried");
}

#[tokio::test]
async fn failover_crosses_protocols_and_the_journal_says_so() {
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let busy = Behavior { status: Some(529), error_body: overloaded.into(), ..Default::default() };
    let p = providers(false, &[("busy", busy)]);
    let dir = tempfile::tempdir().unwrap();
    let top = format!("journal: {}\nadmin_key: adm", dir.path().join("j.db").display());
    let gw = gateway(&config(&p, &top)).await;
    let resp = common::client()
        .post(url(&gw, "/v1/messages"))
        .json(&request(Protocol::Anthropic, "fails-over", true, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned();
    let said = grammar::check(Protocol::Anthropic, &resp.text().await.unwrap()).unwrap();
    assert!(said.completed && said.calls.len() == 1, "{said:?}");
    let mut row = Value::Null;
    for _ in 0..200 {
        row = admin_json(&gw, &format!("/admin/requests/{id}")).await;
        if row["attempts"].as_array().is_some_and(|a| a.len() >= 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(row["protocol"], "anthropic", "{row}");
    let attempts = row["attempts"].as_array().unwrap();
    let last = attempts.last().unwrap();
    assert_eq!((last["upstream"].as_str(), last["protocol"].as_str()), (Some("chat"), Some("openai-chat")), "{row}");
    assert!(attempts.iter().any(|a| a["upstream"] == "anth" && a["status"] == 529 && a["protocol"].is_null()), "{row}");
    // A translated request answered at once: its one attempt is implied
    // by the row, which keeps the protocol it was sent in.
    let resp = common::client()
        .post(url(&gw, "/v1/messages"))
        .json(&request(Protocol::Anthropic, "on-chat", false, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned();
    // Read whole and translated, the answer goes out with its length (not
    // chunked), and its end is still recorded: hyper stops polling a sized
    // body at its last byte.
    let length = resp.headers().get("content-length").map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
    assert!(!resp.headers().contains_key("transfer-encoding"), "{:?}", resp.headers());
    let text = resp.text().await.unwrap();
    assert_eq!(length, Some(text.len()), "{text}");
    for _ in 0..200 {
        row = admin_json(&gw, &format!("/admin/requests/{id}")).await;
        if row["attempts"].as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(row["via"], "openai-chat", "{row}");
    assert_eq!(row["outcome"], "completed", "{row}");
    assert!(row["tokens_out"].as_u64().is_some_and(|n| n > 0), "usage read from the answer: {row}");
    assert_eq!(
        row["attempts"],
        json!([{"upstream": "chat", "status": 200, "class": null, "summary": "",
        "verdict": "ok", "wait_ms": null, "protocol": "openai-chat"}]),
        "{row}"
    );
    // A chat client streaming from the Anthropic target: the journal keeps
    // the upstream's counts (10 in, 4 of them read from the cache, 5 out),
    // and so does the client's usage chunk, the cache's share included.
    let resp = common::client()
        .post(url(&gw, "/v1/chat/completions"))
        .json(&request(Protocol::OpenAiChat, "on-anthropic", true, false))
        .send()
        .await
        .unwrap();
    let id = resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .map(|v| v["usage"].clone())
        .unwrap_or_else(|| panic!("no usage chunk: {text}"));
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(10), Some(5)), "{usage}");
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 4, "{usage}");
    for _ in 0..200 {
        row = admin_json(&gw, &format!("/admin/requests/{id}")).await;
        if row["outcome"] == "completed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let counts = ["tokens_in", "tokens_out", "tokens_cached", "tokens_cache_written"].map(|k| row[k].as_u64());
    assert_eq!(counts, [Some(10), Some(5), Some(4), None], "{row}");
}

#[tokio::test]
async fn a_translated_stream_that_breaks_ends_with_the_clients_error_event() {
    let mid = r#"{"error":{"message":"upstream crashed","type":"server_error"}}"#;
    let breaks = Behavior { script: vec![Fault::error_mid_stream(3, mid), Fault::drop_after(3)], ..Default::default() };
    let frame = r#"{"error":{"code":"TM.00001041","message":"concurrency limit: 3 sessions"}}"#;
    let frame_first = Behavior { script: vec![Fault::error_frame(frame)], ..Default::default() };
    let p = providers(false, &[("breaks", breaks), ("busy-frame", frame_first)]);
    let quirk = "journal: \"off\"";
    let gw = gateway(&config(&p, quirk)).await;
    for (client, want) in
        [(Protocol::Anthropic, "upstream crashed"), (Protocol::OpenAiResponses, "broke after 3 events")]
    {
        let mut body = request(client, "mid-stream", true, false);
        body["tools"] = json!([]);
        let resp = common::client().post(url(&gw, path(client))).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let said = grammar::check(client, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(!said.completed, "{text}");
        assert!(said.error.as_deref().unwrap_or_default().contains(want), "{said:?}\n{text}");
        assert!(said.text.starts_with("tok0"), "what was delivered stays: {said:?}");
    }
    // "200 + an error frame" of the target's protocol is retried before
    // anything reaches the client, which sees one clean answer.
    let (_, _, said) =
        exchange(&gw, Protocol::Anthropic, &request(Protocol::Anthropic, "frame-first", true, false)).await;
    assert!(said.completed && said.error.is_none(), "{said:?}");
    let tries =
        p.chat.state.received().iter().filter(|r| String::from_utf8_lossy(&r.body).contains("busy-frame")).count();
    assert_eq!(tries, 2);
}

#[tokio::test]
async fn count_tokens_without_an_anthropic_target_is_an_estimate_said_to_be_one() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    let body = json!({"model": "on-chat", "system": "x".repeat(400),
        "messages": [{"role": "user", "content": "y".repeat(400)}]});
    let resp = common::client().post(url(&gw, "/v1/messages/count_tokens")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-estimate"], "characters/4");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["input_tokens"], 204, "800 characters / 4 + 4 for the message");
    assert!(p.chat.state.received().is_empty());
    // An Anthropic target counts them itself.
    let body = json!({"model": "on-anthropic", "messages": [{"role": "user", "content": "hi"}]});
    let resp = common::client().post(url(&gw, "/v1/messages/count_tokens")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(!resp.headers().contains_key("x-tidegate-estimate"));
    assert_eq!(p.anthropic.state.received().len(), 1);
}

#[tokio::test]
async fn previous_response_id_on_a_translated_target_is_resolved_from_what_tidegate_kept() {
    let p = providers(false, &[]);
    let gw = gateway(&config(&p, "journal: \"off\"")).await;
    for stream in [false, true] {
        // A first turn, stored (the default): tidegate keeps what it said.
        let first = request(Protocol::OpenAiResponses, "on-chat", stream, false);
        let mut first = first;
        first.as_object_mut().unwrap().remove("store");
        let resp = common::client().post(url(&gw, "/v1/responses")).json(&first).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let id = if stream {
            let done =
                grammar::events(&text).into_iter().find(|(n, _)| n.as_deref() == Some("response.completed")).unwrap();
            serde_json::from_str::<Value>(&done.1).unwrap()["response"]["id"].as_str().unwrap().to_owned()
        } else {
            serde_json::from_str::<Value>(&text).unwrap()["id"].as_str().unwrap().to_owned()
        };
        // The next turn names it and sends only what is new.
        let next = json!({"model": "on-chat", "stream": stream, "previous_response_id": id,
            "input": [{"type": "function_call_output", "call_id": "call_sim_1", "output": "fn main() {}"}]});
        let resp = common::client().post(url(&gw, "/v1/responses")).json(&next).send().await.unwrap();
        assert_eq!(resp.status(), 200, "stream {stream}");
        let sent: Value = serde_json::from_slice(&p.chat.state.received().pop().unwrap().body).unwrap();
        let roles: Vec<&str> =
            sent["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "tool"], "stream {stream}: the whole history: {sent}");
        assert_eq!(sent["messages"][0]["content"], "read it");
        assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], "call_sim_1", "{sent}");
        assert_eq!(sent["messages"][1]["content"], "tok0 tok1 tok2 tok3 tok4 ");
        assert!(sent.get("previous_response_id").is_none());
    }
    // An id tidegate does not keep is refused as OpenAI refuses an id it
    // does not have, and nothing is sent.
    let before = p.chat.state.received().len();
    let unknown = json!({"model": "on-chat", "previous_response_id": "resp_nobody", "input": "go on"});
    let resp = common::client().post(url(&gw, "/v1/responses")).json(&unknown).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "previous_response_not_found", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("'resp_nobody' not found"), "{v}");
    assert_eq!(p.chat.state.received().len(), before);
}
