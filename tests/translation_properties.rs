//! Property tests of stream translation: for generated upstream answers
//! (reasoning, text of any characters, parallel tool calls with their
//! arguments cut anywhere, keep-alives, with or without the terminal
//! event, cut short or failing mid-way) fed in any grouping of whole
//! events, the client's stream is always grammatical in its protocol, and
//! no text, reasoning or argument is lost or repeated. Bounded (proptest's
//! case count), so they run in every `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::json;

use common::grammar;
use tidegate::protocol::{ErrorKind, Protocol};
use tidegate::translate::{self, Stream};

/// An upstream answer, in no protocol.
#[derive(Debug, Clone)]
struct Plan {
    reasoning: Vec<String>,
    text: Vec<String>,
    /// (name, argument pieces).
    calls: Vec<(String, Vec<String>)>,
    pings: Vec<usize>,
    /// How it ends: 0 terminal event, 1 stop but no terminal event,
    /// 2 cut before the stop, 3 an error event after the content.
    end: u8,
}

fn plan() -> impl Strategy<Value = Plan> {
    let piece = "\\PC{0,12}";
    let args = prop::collection::vec(any::<u8>(), 0..4).prop_map(|cuts| {
        // A JSON object cut at arbitrary points.
        let whole = json!({"path": "src/\"main\".rs", "lines": [1, 2], "note": "é ü"}).to_string();
        let mut at: Vec<usize> = cuts.iter().map(|c| (*c as usize * whole.len()) / 256).collect();
        at.sort_unstable();
        let chars: Vec<usize> = whole.char_indices().map(|(i, _)| i).collect();
        let mut pieces = Vec::new();
        let mut last = 0;
        for a in at {
            let a = chars.iter().copied().find(|i| *i >= a).unwrap_or(whole.len());
            if a > last {
                pieces.push(whole[last..a].to_owned());
                last = a;
            }
        }
        pieces.push(whole[last..].to_owned());
        pieces
    });
    (
        prop::collection::vec(piece, 0..3),
        prop::collection::vec(piece, 0..5),
        prop::collection::vec(("[a-z_]{1,8}", args), 0..3),
        prop::collection::vec(0usize..10, 0..3),
        0u8..4,
    )
        .prop_map(|(reasoning, text, calls, pings, end)| Plan { reasoning, text, calls, pings, end })
}

fn sse(name: Option<&str>, v: serde_json::Value) -> String {
    match name {
        Some(n) => format!("event: {n}\ndata: {v}\n\n"),
        None => format!("data: {v}\n\n"),
    }
}

/// The plan as a chat-completions stream (tool call deltas interleaved
/// when there are several, as providers may send them).
fn chat_events(p: &Plan) -> Vec<String> {
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        sse(
            None,
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut out = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    out.extend(p.reasoning.iter().map(|r| chunk(json!({"reasoning_content": r}), None)));
    out.extend(p.text.iter().map(|t| chunk(json!({"content": t}), None)));
    for (i, (name, _)) in p.calls.iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
    }
    let longest = p.calls.iter().map(|c| c.1.len()).max().unwrap_or(0);
    for k in 0..longest {
        for (i, (_, pieces)) in p.calls.iter().enumerate() {
            if let Some(piece) = pieces.get(k) {
                out.push(chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), None));
            }
        }
    }
    for (n, at) in p.pings.iter().enumerate() {
        out.insert((*at).min(out.len()), format!(": keep-alive {n}\n\n"));
    }
    match p.end {
        0 | 1 => {
            let finish = if p.calls.is_empty() { "stop" } else { "tool_calls" };
            out.push(chunk(json!({}), Some(finish)));
            out.push(sse(
                None,
                json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
            ));
            if p.end == 0 {
                out.push("data: [DONE]\n\n".into());
            }
        }
        3 => out.push(sse(None, json!({"error": {"message": "boom", "type": "server_error"}}))),
        _ => {}
    }
    out
}

/// The plan as an Anthropic messages stream.
fn anthropic_events(p: &Plan) -> Vec<String> {
    let mut out = vec![sse(
        Some("message_start"),
        json!({"type": "message_start", "message": {"id": "msg_1",
        "model": "m", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
    )];
    let mut index = 0;
    let mut block = |out: &mut Vec<String>, start: serde_json::Value, deltas: Vec<serde_json::Value>| {
        out.push(sse(
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for d in deltas {
            out.push(sse(
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": index, "delta": d}),
            ));
        }
        out.push(sse(Some("content_block_stop"), json!({"type": "content_block_stop", "index": index})));
        index += 1;
    };
    if !p.reasoning.is_empty() {
        let mut d: Vec<_> = p.reasoning.iter().map(|r| json!({"type": "thinking_delta", "thinking": r})).collect();
        d.push(json!({"type": "signature_delta", "signature": "sig"}));
        block(&mut out, json!({"type": "thinking", "thinking": ""}), d);
    }
    if !p.text.is_empty() {
        let d = p.text.iter().map(|t| json!({"type": "text_delta", "text": t})).collect();
        block(&mut out, json!({"type": "text", "text": ""}), d);
    }
    for (i, (name, pieces)) in p.calls.iter().enumerate() {
        let d = pieces.iter().map(|a| json!({"type": "input_json_delta", "partial_json": a})).collect();
        block(&mut out, json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": {}}), d);
    }
    for at in &p.pings {
        out.insert((*at).clamp(1, out.len()), sse(Some("ping"), json!({"type": "ping"})));
    }
    match p.end {
        0 | 1 => {
            let stop = if p.calls.is_empty() { "end_turn" } else { "tool_use" };
            out.push(sse(
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": stop},
                "usage": {"output_tokens": 7}}),
            ));
            if p.end == 0 {
                out.push(sse(Some("message_stop"), json!({"type": "message_stop"})));
            }
        }
        3 => out.push(sse(Some("error"), json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}))),
        _ => {}
    }
    out
}

/// The plan as a Gemini stream: thoughts, text, each call whole in its
/// chunk, a last chunk with the finish reason (Gemini has no terminal
/// event: plans 0 and 1 end alike).
fn gemini_events(p: &Plan) -> Vec<String> {
    let chunk = |parts: serde_json::Value, finish: Option<&str>| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(f) = finish {
            candidate["finishReason"] = json!(f);
        }
        let mut v = json!({"candidates": [candidate], "responseId": "r1", "modelVersion": "m"});
        if finish.is_some() {
            v["usageMetadata"] = json!({"promptTokenCount": 3, "candidatesTokenCount": 7});
        }
        format!("data: {v}\r\n\r\n")
    };
    let mut out: Vec<String> = p.reasoning.iter().map(|r| chunk(json!([{"text": r, "thought": true}]), None)).collect();
    out.extend(p.text.iter().map(|t| chunk(json!([{"text": t}]), None)));
    for (name, pieces) in &p.calls {
        let args: serde_json::Value = serde_json::from_str(&pieces.concat()).unwrap();
        out.push(chunk(json!([{"functionCall": {"name": name, "args": args}}]), None));
    }
    for (n, at) in p.pings.iter().enumerate() {
        out.insert((*at).min(out.len()), format!(": keep-alive {n}\n\n"));
    }
    match p.end {
        0 | 1 => out.push(chunk(json!([]), Some("STOP"))),
        3 => out.push(sse(None, json!({"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}))),
        _ => {}
    }
    out
}

fn client_request(client: Protocol, reasoning: bool) -> Vec<u8> {
    let mut v = match client {
        Protocol::OpenAiChat => json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        Protocol::OpenAiResponses => json!({"model": "m", "stream": true, "input": "hi"}),
        Protocol::Anthropic => {
            json!({"model": "m", "stream": true, "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]})
        }
        Protocol::Gemini => json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    };
    if reasoning {
        match client {
            Protocol::OpenAiChat => v["reasoning_effort"] = json!("low"),
            Protocol::OpenAiResponses => v["reasoning"] = json!({"effort": "low"}),
            Protocol::Anthropic => v["thinking"] = json!({"type": "enabled", "budget_tokens": 2048}),
            Protocol::Gemini => {
                v["generationConfig"] = json!({"thinkingConfig": {"thinkingBudget": 2048, "includeThoughts": true}})
            }
        }
    }
    serde_json::to_vec(&v).unwrap()
}

fn pairs() -> impl Strategy<Value = (Protocol, Protocol)> {
    prop_oneof![
        Just((Protocol::OpenAiChat, Protocol::Anthropic)),
        Just((Protocol::OpenAiResponses, Protocol::OpenAiChat)),
        Just((Protocol::OpenAiResponses, Protocol::Anthropic)),
        Just((Protocol::Anthropic, Protocol::OpenAiChat)),
        Just((Protocol::Gemini, Protocol::Anthropic)),
        Just((Protocol::Gemini, Protocol::OpenAiChat)),
        Just((Protocol::Anthropic, Protocol::Gemini)),
        Just((Protocol::OpenAiChat, Protocol::Gemini)),
        Just((Protocol::OpenAiResponses, Protocol::Gemini)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_translated_stream_is_always_grammatical_and_loses_nothing(
        (client, target) in pairs(),
        plan in plan(),
        reasoning in any::<bool>(),
        groups in prop::collection::vec(1usize..4, 1..40),
    ) {
        let back = translate::request_keeping(client, target, &client_request(client, reasoning), "m", true, None).unwrap().back;
        let mut stream = Stream::new(&back, 16 << 20).unwrap();
        let events = match target {
            Protocol::Anthropic => anthropic_events(&plan),
            Protocol::Gemini => gemini_events(&plan),
            _ => chat_events(&plan),
        };
        let mut out: Vec<Bytes> = Vec::new();
        // Whole events in groups of any size, as the relay hands them over.
        let mut rest = events.as_slice();
        let mut sizes = groups.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).min(rest.len());
            out.push(stream.events(rest[..n].concat().as_bytes()));
            rest = &rest[n..];
        }
        // What the relay does at the upstream's end: a finished answer
        // gets the client's terminal events, a cut one its error event.
        match plan.end {
            // Gemini has no terminal event: its end is the relay's finish.
            0 if target == Protocol::Gemini => out.push(stream.finish()),
            0 | 3 => {}
            1 => out.push(stream.finish()),
            _ => out.push(stream.fail(ErrorKind::Api, "tidegate: the stream broke")),
        }
        let text = String::from_utf8(out.concat()).unwrap();
        let said = grammar::check(client, &text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(said.completed, plan.end < 2, "{}", text);
        prop_assert_eq!(&said.text, &plan.text.concat());
        let want_reasoning = if reasoning { plan.reasoning.concat() } else { String::new() };
        prop_assert_eq!(&said.reasoning, &want_reasoning);
        if plan.end < 2 {
            let want: Vec<(String, String)> = plan.calls.iter().map(|(n, p)| (n.clone(), p.concat())).collect();
            let got: Vec<(String, String)> = said.calls.iter().map(|(n, a, _)| (n.clone(), a.clone())).collect();
            // Arguments are the same JSON (Anthropic's tool input may be
            // re-serialised by nobody: compared as text).
            prop_assert_eq!(got, want);
        }
    }
}
