//! Usage and stop reasons across translation, as a property: for every
//! target protocol translation reaches (chat, Anthropic, Gemini) and every
//! other client protocol, an upstream answer with its token counts in any
//! position that target's protocol allows (input first and output last,
//! cumulative counts on every event, the counts repeated, optional counts
//! left out) gives the client the upstream's figures — every figure the
//! client's protocol can say — and the journal (the scanner of the
//! upstream's own bytes) every figure, stream and not. Stop reasons too:
//! end, length and content filter, in each protocol's words.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Back, Stream, answer};
use crate::protocol::Protocol;
use crate::record::Usage;
use crate::stream::sse::{Scanner, usage_in_json};

/// The counts an upstream reports, in [`Usage`]'s meaning.
#[derive(Debug, Clone, Copy)]
struct Counts {
    input: u64,
    output: u64,
    cached: u64,
    written: u64,
    reasoning: u64,
}

/// Where a protocol's stream puts its counts.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// Once, where the protocol usually says it (chat: a last chunk of its
    /// own; Anthropic: input in `message_start`, output in
    /// `message_delta`; Gemini: the last chunk).
    Once,
    /// On every event, cumulative (the output growing).
    Every,
    /// With the finish (chat: on the finish chunk; Anthropic:
    /// `message_delta` repeats the input counts; Gemini: thoughts said on
    /// the first chunk only).
    WithFinish,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StopKind {
    End,
    Length,
    Filtered,
}

fn counts(target: Protocol) -> impl Strategy<Value = Counts> {
    (1..5000u64, 1..3000u64, 0..4000u64, 0..800u64, 0..1000u64).prop_map(move |(a, b, c, w, r)| {
        let cached = c.min(a);
        // What each protocol can report at all.
        let written = if target == Protocol::Anthropic { w } else { 0 };
        let reasoning = if target == Protocol::Anthropic { 0 } else { r.min(b) };
        Counts { input: a + written, output: b, cached, written, reasoning }
    })
}

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![Just(Place::Once), Just(Place::Every), Just(Place::WithFinish)]
}

fn stop() -> impl Strategy<Value = StopKind> {
    prop_oneof![Just(StopKind::End), Just(StopKind::Length), Just(StopKind::Filtered)]
}

fn sse(name: Option<&str>, v: &Value) -> String {
    match name {
        Some(n) => format!("event: {n}\ndata: {v}\n\n"),
        None => format!("data: {v}\n\n"),
    }
}

fn chat_usage(c: &Counts, output: u64) -> Value {
    json!({"prompt_tokens": c.input, "completion_tokens": output, "total_tokens": c.input + output,
        "prompt_tokens_details": {"cached_tokens": c.cached},
        "completion_tokens_details": {"reasoning_tokens": c.reasoning}})
}

fn gemini_usage(c: &Counts, output: u64, thoughts: bool) -> Value {
    let mut u = json!({"promptTokenCount": c.input, "candidatesTokenCount": output.saturating_sub(c.reasoning),
        "totalTokenCount": c.input + output});
    if c.cached > 0 {
        u["cachedContentTokenCount"] = c.cached.into();
    }
    if thoughts && c.reasoning > 0 {
        u["thoughtsTokenCount"] = c.reasoning.into();
    }
    u
}

fn anthropic_input(c: &Counts) -> Value {
    json!({"input_tokens": c.input - c.cached - c.written, "cache_read_input_tokens": c.cached,
        "cache_creation_input_tokens": c.written})
}

/// An upstream stream of `target` saying "Hello" with counts `c` placed
/// at `place`, stopping for `stop`.
fn upstream_stream(target: Protocol, c: &Counts, place: Place, stop: StopKind) -> String {
    let half = c.output / 2;
    match target {
        Protocol::OpenAiChat => {
            let reason = match stop {
                StopKind::End => "stop",
                StopKind::Length => "length",
                StopKind::Filtered => "content_filter",
            };
            let chunk = |delta: Value, finish: Value, usage: Option<Value>| {
                let mut v = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                if let Some(u) = usage {
                    v["usage"] = u;
                }
                sse(None, &v)
            };
            let every = matches!(place, Place::Every);
            let mut s = chunk(
                json!({"role": "assistant", "content": "Hel"}),
                Value::Null,
                every.then(|| chat_usage(c, half)).or(Some(Value::Null)),
            );
            let on_finish = matches!(place, Place::Every | Place::WithFinish);
            s += &chunk(json!({"content": "lo"}), json!(reason), on_finish.then(|| chat_usage(c, c.output)));
            if !on_finish {
                s += &sse(
                    None,
                    &json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                    "choices": [], "usage": chat_usage(c, c.output)}),
                );
            }
            s + "data: [DONE]\n\n"
        }
        Protocol::Anthropic => {
            let reason = match stop {
                StopKind::End => "end_turn",
                StopKind::Length => "max_tokens",
                StopKind::Filtered => "refusal",
            };
            let mut start_usage = anthropic_input(c);
            start_usage["output_tokens"] = json!(if matches!(place, Place::Every) { half } else { 1 });
            let mut s = sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                    "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
            );
            s += &sse(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            for piece in ["Hel", "lo"] {
                s += &sse(
                    Some("content_block_delta"),
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
                );
            }
            s += &sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0}));
            let mut delta_usage =
                if matches!(place, Place::WithFinish | Place::Every) { anthropic_input(c) } else { json!({}) };
            delta_usage["output_tokens"] = c.output.into();
            s += &sse(
                Some("message_delta"),
                &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                    "usage": delta_usage}),
            );
            s + &sse(Some("message_stop"), &json!({"type": "message_stop"}))
        }
        Protocol::Gemini => {
            let reason = match stop {
                StopKind::End => "STOP",
                StopKind::Length => "MAX_TOKENS",
                StopKind::Filtered => "SAFETY",
            };
            let chunk = |text: &str, finish: Option<&str>, usage: Option<Value>| {
                let mut cand = json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
                if let Some(f) = finish {
                    cand["finishReason"] = json!(f);
                }
                let mut v = json!({"candidates": [cand], "modelVersion": "m", "responseId": "r1"});
                if let Some(u) = usage {
                    v["usageMetadata"] = u;
                }
                sse(None, &v)
            };
            let first = match place {
                Place::Once => None,
                Place::Every => Some(gemini_usage(c, half.max(c.reasoning), true)),
                // Thoughts said first, not repeated at the end.
                Place::WithFinish => Some(gemini_usage(c, c.output, true)),
            };
            let last = gemini_usage(c, c.output, !matches!(place, Place::WithFinish));
            chunk("Hel", None, first) + &chunk("lo", Some(reason), Some(last))
        }
        Protocol::OpenAiResponses => unreachable!("not a target"),
    }
}

/// The same answer whole (JSON).
fn upstream_answer(target: Protocol, c: &Counts, stop: StopKind) -> String {
    match target {
        Protocol::OpenAiChat => {
            let reason = ["stop", "length", "content_filter"][stop as usize];
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": reason}],
                "usage": chat_usage(c, c.output)})
        }
        Protocol::Anthropic => {
            let reason = ["end_turn", "max_tokens", "refusal"][stop as usize];
            let mut usage = anthropic_input(c);
            usage["output_tokens"] = c.output.into();
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "text", "text": "Hello"}], "stop_reason": reason, "stop_sequence": null,
                "usage": usage})
        }
        Protocol::Gemini => {
            let reason = ["STOP", "MAX_TOKENS", "SAFETY"][stop as usize];
            json!({"candidates": [{"content": {"parts": [{"text": "Hello"}], "role": "model"}, "finishReason": reason,
                "index": 0}], "usageMetadata": gemini_usage(c, c.output, true), "modelVersion": "m", "responseId": "r1"})
        }
        Protocol::OpenAiResponses => unreachable!("not a target"),
    }
    .to_string()
}

/// What a client reads of its answer: the counts its protocol can say
/// (`None`: it cannot), and the stop in [`StopKind`]'s terms.
#[derive(Debug, PartialEq)]
struct Read {
    input: u64,
    output: u64,
    cached: u64,
    written: Option<u64>,
    reasoning: Option<u64>,
    stop: StopKind,
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The client's figures from its usage object (`usage` or
/// `usageMetadata`).
fn read_usage(client: Protocol, u: &Value, stop: StopKind) -> Read {
    match client {
        Protocol::OpenAiChat => Read {
            input: n(&u["prompt_tokens"]),
            output: n(&u["completion_tokens"]),
            cached: n(&u["prompt_tokens_details"]["cached_tokens"]),
            written: None,
            reasoning: Some(n(&u["completion_tokens_details"]["reasoning_tokens"])),
            stop,
        },
        Protocol::OpenAiResponses => Read {
            input: n(&u["input_tokens"]),
            output: n(&u["output_tokens"]),
            cached: n(&u["input_tokens_details"]["cached_tokens"]),
            written: None,
            reasoning: Some(n(&u["output_tokens_details"]["reasoning_tokens"])),
            stop,
        },
        Protocol::Anthropic => Read {
            input: n(&u["input_tokens"]) + n(&u["cache_read_input_tokens"]) + n(&u["cache_creation_input_tokens"]),
            output: n(&u["output_tokens"]),
            cached: n(&u["cache_read_input_tokens"]),
            written: Some(n(&u["cache_creation_input_tokens"])),
            reasoning: None,
            stop,
        },
        Protocol::Gemini => Read {
            input: n(&u["promptTokenCount"]),
            output: n(&u["candidatesTokenCount"]) + n(&u["thoughtsTokenCount"]),
            cached: n(&u["cachedContentTokenCount"]),
            written: None,
            reasoning: Some(n(&u["thoughtsTokenCount"])),
            stop,
        },
    }
}

fn stop_in(client: Protocol, word: &str) -> StopKind {
    match (client, word) {
        (Protocol::OpenAiChat, "length")
        | (Protocol::Anthropic, "max_tokens")
        | (Protocol::Gemini, "MAX_TOKENS")
        | (Protocol::OpenAiResponses, "max_output_tokens") => StopKind::Length,
        (Protocol::OpenAiChat, "content_filter")
        | (Protocol::Anthropic, "refusal")
        | (Protocol::Gemini, "SAFETY")
        | (Protocol::OpenAiResponses, "content_filter") => StopKind::Filtered,
        _ => StopKind::End,
    }
}

/// The client's figures from its whole answer.
fn read_answer(client: Protocol, v: &Value) -> Read {
    match client {
        Protocol::OpenAiChat => {
            read_usage(client, &v["usage"], stop_in(client, v["choices"][0]["finish_reason"].as_str().unwrap_or("")))
        }
        Protocol::OpenAiResponses => {
            read_usage(client, &v["usage"], stop_in(client, v["incomplete_details"]["reason"].as_str().unwrap_or("")))
        }
        Protocol::Anthropic => {
            read_usage(client, &v["usage"], stop_in(client, v["stop_reason"].as_str().unwrap_or("")))
        }
        Protocol::Gemini => read_usage(
            client,
            &v["usageMetadata"],
            stop_in(client, v["candidates"][0]["finishReason"].as_str().unwrap_or("")),
        ),
    }
}

/// The client's figures from its stream: the last usage it was told, and
/// its stop.
fn read_stream(client: Protocol, bytes: &str) -> Read {
    let bytes = bytes.replace("\r\n", "\n");
    let events: Vec<Value> = bytes
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    match client {
        Protocol::OpenAiChat => {
            let usage = events.iter().rev().find(|e| e["usage"].is_object()).map(|e| e["usage"].clone());
            let reason = events.iter().find_map(|e| e["choices"][0]["finish_reason"].as_str()).unwrap_or("");
            read_usage(client, &usage.unwrap_or(Value::Null), stop_in(client, reason))
        }
        Protocol::OpenAiResponses => {
            let last = events
                .iter()
                .rev()
                .find(|e| matches!(e["type"].as_str(), Some("response.completed" | "response.incomplete")))
                .map(|e| e["response"].clone())
                .unwrap_or(Value::Null);
            read_answer(client, &last)
        }
        Protocol::Anthropic => {
            // message_start's counts, then message_delta's over them.
            let mut usage = events
                .iter()
                .find(|e| e["type"] == "message_start")
                .map(|e| e["message"]["usage"].clone())
                .unwrap_or(json!({}));
            let delta = events.iter().find(|e| e["type"] == "message_delta").cloned().unwrap_or(Value::Null);
            if let (Some(u), Some(d)) = (usage.as_object_mut(), delta["usage"].as_object()) {
                for (k, v) in d {
                    u.insert(k.clone(), v.clone());
                }
            }
            read_usage(client, &usage, stop_in(client, delta["delta"]["stop_reason"].as_str().unwrap_or("")))
        }
        Protocol::Gemini => {
            let usage =
                events.iter().rev().find(|e| e["usageMetadata"].is_object()).map(|e| e["usageMetadata"].clone());
            let reason = events.iter().rev().find_map(|e| e["candidates"][0]["finishReason"].as_str()).unwrap_or("");
            read_usage(client, &usage.unwrap_or(Value::Null), stop_in(client, reason))
        }
    }
}

/// What the client should read: the upstream's figures, those its
/// protocol can say.
fn expected(client: Protocol, c: &Counts, stop: StopKind) -> Read {
    let says_reasoning = client != Protocol::Anthropic;
    Read {
        input: c.input,
        output: c.output,
        cached: c.cached,
        written: (client == Protocol::Anthropic).then_some(c.written),
        reasoning: says_reasoning.then_some(c.reasoning),
        stop,
    }
}

/// The journal's figures: the upstream's bytes as the relay scans them.
fn journaled(target: Protocol, stream: &str) -> Usage {
    let mut scanner = Scanner::new(target, 1 << 16);
    scanner.feed(stream.as_bytes());
    while scanner.next_event().is_some() {}
    scanner.seen.usage
}

fn same_counts(u: &Usage, c: &Counts) -> bool {
    u.input == Some(c.input)
        && u.output == Some(c.output)
        && u.cached.unwrap_or(0) == c.cached
        && u.cache_written.unwrap_or(0) == c.written
        && u.reasoning.unwrap_or(0) == c.reasoning
}

fn back(client: Protocol, target: Protocol) -> Back {
    Back { client, target, reasoning: true, custom: Vec::new(), include_usage: true, dropped: None, keep: None }
}

const TARGETS: [Protocol; 3] = [Protocol::OpenAiChat, Protocol::Anthropic, Protocol::Gemini];
const CLIENTS: [Protocol; 4] = [Protocol::OpenAiChat, Protocol::OpenAiResponses, Protocol::Anthropic, Protocol::Gemini];

fn target() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(TARGETS[0]), Just(TARGETS[1]), Just(TARGETS[2])]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_pair_gives_the_client_and_the_journal_the_upstreams_usage(
        (target, c) in target().prop_flat_map(|t| (Just(t), counts(t))),
        place in place(),
        stop in stop(),
        split in 1..40usize,
    ) {
        let upstream = upstream_stream(target, &c, place, stop);
        let journal = journaled(target, &upstream);
        prop_assert!(same_counts(&journal, &c), "journal {journal:?} for {c:?} from {target:?} ({place:?})");
        for client in CLIENTS.into_iter().filter(|p| *p != target) {
            let back = back(client, target);
            // Streamed, the events handed over as they arrive: whole
            // events, in batches of `split` bytes or more.
            let mut stream = Stream::new(&back, 1 << 20).expect("a translated pair");
            let mut out = String::new();
            let mut pending = String::new();
            for event in upstream.split_inclusive("\n\n") {
                pending.push_str(event);
                if pending.len() >= split {
                    out.push_str(&String::from_utf8_lossy(&stream.events(pending.as_bytes())));
                    pending.clear();
                }
            }
            out.push_str(&String::from_utf8_lossy(&stream.events(pending.as_bytes())));
            out.push_str(&String::from_utf8_lossy(&stream.finish()));
            let got = read_stream(client, &out);
            prop_assert_eq!(&got, &expected(client, &c, stop), "stream {:?} → {:?} ({:?}):\n{}", target, client, place, out);

            // Whole.
            let body = upstream_answer(target, &c, stop);
            let translated = answer(&back, body.as_bytes()).expect("an answer");
            let v: Value = serde_json::from_slice(&translated).expect("JSON");
            prop_assert_eq!(read_answer(client, &v), expected(client, &c, stop), "answer {:?} → {:?}: {}", target, client, v);
            let journal = usage_in_json(body.as_bytes());
            prop_assert!(same_counts(&journal, &c), "journal {journal:?} of the answer {body}");
        }
    }
}
