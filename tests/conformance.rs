//! The conformance corpus: request bodies as Codex and Claude Code really
//! send them (`tests/fixtures/corpus/`, captured by the agents check with
//! `tidegate simulate --dump`; `codex-tool-turn.json` is the captured first
//! turn with a reasoning item, a function call, its output and a follow-up
//! appended in Codex's item format) translated for every target protocol,
//! and the target's answers — plain, with reasoning, with a tool call —
//! translated back and checked against the client's grammar.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use serde_json::Value;

use common::grammar;
use tidegate::protocol::Protocol;
use tidegate::translate::{self, Stream};
use tidegate_simulate::turns::{self, Turn};

const CORPUS: [(&str, Protocol); 3] = [
    ("codex-first-turn.json", Protocol::OpenAiResponses),
    ("codex-tool-turn.json", Protocol::OpenAiResponses),
    ("claude-code-tool-result-turn.json", Protocol::Anthropic),
];

fn corpus(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/corpus/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn targets(client: Protocol) -> Vec<Protocol> {
    [Protocol::OpenAiChat, Protocol::Anthropic].into_iter().filter(|t| *t != client).collect()
}

/// Every tool call id the body's history answers was called before.
fn call_ids_pair_up(target: Protocol, sent: &Value) {
    let mut called = Vec::new();
    for m in sent["messages"].as_array().unwrap() {
        match target {
            Protocol::OpenAiChat => {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    called.push(c["id"].as_str().unwrap().to_owned());
                }
                if m["role"] == "tool" {
                    let id = m["tool_call_id"].as_str().unwrap();
                    assert!(called.iter().any(|c| c == id), "tool result {id} answers no call");
                }
            }
            _ => {
                for b in m["content"].as_array().into_iter().flatten() {
                    match b["type"].as_str() {
                        Some("tool_use") => called.push(b["id"].as_str().unwrap().to_owned()),
                        Some("tool_result") => {
                            let id = b["tool_use_id"].as_str().unwrap();
                            assert!(called.iter().any(|c| c == id), "tool result {id} answers no call");
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
fn real_agent_requests_translate_for_every_target() {
    for (name, client) in CORPUS {
        let body = corpus(name);
        let original: Value = serde_json::from_slice(&body).unwrap();
        for target in targets(client) {
            let t = translate::request(client, target, &body, "target-model")
                .unwrap_or_else(|e| panic!("{name} → {target:?} refused: {e}"));
            let sent: Value = serde_json::from_slice(&t.body).unwrap();
            let what = format!("{name} → {target:?}");
            assert_eq!(sent["model"], "target-model", "{what}");
            assert_eq!(sent["stream"], true, "{what}");
            call_ids_pair_up(target, &sent);
            // Every function tool survives; what is left out is declared.
            let functions = original["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| matches!(t["type"].as_str(), None | Some("function" | "custom")))
                .count();
            assert_eq!(sent["tools"].as_array().unwrap().len(), functions, "{what}");
            let text = sent.to_string();
            match client {
                Protocol::OpenAiResponses => {
                    // Codex's developer instructions lead; its built-ins are declared.
                    let dropped = t.back.dropped.clone().unwrap_or_default();
                    assert!(
                        dropped.contains("tool web_search") && dropped.contains("tool namespace"),
                        "{what}: {dropped}"
                    );
                    assert!(text.contains("You are a coding agent running in the Codex CLI"), "{what}");
                    if name == "codex-tool-turn.json" {
                        assert!(dropped.contains("encrypted reasoning"), "{what}: {dropped}");
                        assert!(!text.contains("gAAAAAB"), "{what}: encrypted reasoning reached another vendor");
                        assert!(text.contains("call_Ab12") && text.contains("now patch it"), "{what}");
                    }
                }
                _ => {
                    let dropped = t.back.dropped.clone().unwrap_or_default();
                    assert!(
                        dropped.contains("cache_control") && dropped.contains("context_management"),
                        "{what}: {dropped}"
                    );
                    assert!(text.contains("toolu_sim_1"), "{what}: the tool call and its result stay paired");
                    // Claude Code's mid-conversation system message stays in place.
                    assert_eq!(sent["messages"][1]["role"], "system", "{what}");
                }
            }
        }
    }
}

#[test]
fn answers_to_real_agent_requests_come_back_grammatical() {
    for (name, client) in CORPUS {
        let body = corpus(name);
        for target in targets(client) {
            let t = translate::request(client, target, &body, "target-model").unwrap();
            for (reasoning, call) in [(false, None), (true, None), (false, Some(("exec_command", r#"{"cmd":"ls"}"#)))] {
                let turn = Turn { call: call.map(|(n, a)| (n.to_owned(), a.to_owned())), reasoning, usage_chunk: true };
                let what = format!("{name} → {target:?}, reasoning {reasoning}, call {call:?}");
                // Streamed: event by event.
                let mut stream = Stream::new(&t.back, 16 << 20).unwrap();
                let out: Vec<Bytes> =
                    turns::frames(target, "target-model", 6, &turn).iter().map(|e| stream.events(e)).collect();
                let text = String::from_utf8(out.concat()).unwrap();
                let said = grammar::check(client, &text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
                assert!(said.completed, "{what}");
                assert_eq!(said.text, "tok0 tok1 tok2 tok3 tok4 tok5 ", "{what}");
                assert_eq!(said.calls.len(), usize::from(call.is_some()), "{what}");
                // Whole.
                let whole = turns::answer(target, "target-model", 6, &turn);
                let back: Value =
                    serde_json::from_slice(&translate::answer(&t.back, whole.as_bytes()).unwrap()).unwrap();
                let kind = match client {
                    Protocol::Anthropic => back["type"].as_str(),
                    _ => back["object"].as_str(),
                };
                assert_eq!(kind, Some(if client == Protocol::Anthropic { "message" } else { "response" }), "{what}");
            }
        }
    }
}
