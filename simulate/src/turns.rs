//! Answers that look like a coding agent's provider: a tool call when
//! the request offers tools and its last turn is not a tool's result,
//! reasoning before the text when the simulator is set to reason, and the
//! usage chunk a chat client asks for (`stream_options.include_usage`).
//! Chat completions and Anthropic messages only: what translation reaches.

use bytes::Bytes;
use serde_json::{Value, json};
use tidegate::protocol::Protocol;

/// What the request asks of the answer.
pub struct Turn {
    /// The tool to call and the arguments (JSON text) to call it with.
    pub call: Option<(String, String)>,
    /// Answer with reasoning first.
    pub reasoning: bool,
    /// A chat client asked for a usage chunk.
    pub usage_chunk: bool,
}

/// What `body` (in `protocol`) asks for, if it is anything but plain text.
pub fn turn_of(protocol: Protocol, body: &[u8], reasoning: bool) -> Option<Turn> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let first_tool = v["tools"].get(0);
    // Answered: a tool's result came after the model's last turn.
    let messages = v["messages"].as_array().map_or(&[][..], Vec::as_slice);
    let since = messages.iter().rposition(|m| m["role"] == "assistant").map_or(0, |i| i + 1);
    let answered = messages[since..].iter().any(|m| match protocol {
        Protocol::OpenAiChat => m["role"] == "tool",
        _ => m["content"].as_array().is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result")),
    });
    let call = first_tool.filter(|_| !answered).map(|t| {
        let (name, schema) = match protocol {
            Protocol::OpenAiChat => (&t["function"]["name"], &t["function"]["parameters"]),
            _ => (&t["name"], &t["input_schema"]),
        };
        let mut args = serde_json::Map::new();
        for key in schema["properties"].as_object().into_iter().flatten().map(|(k, _)| k) {
            args.insert(key.clone(), json!("tok0"));
        }
        (name.as_str().unwrap_or("tool").to_owned(), Value::Object(args).to_string())
    });
    let usage_chunk = v["stream_options"]["include_usage"].as_bool() == Some(true);
    (call.is_some() || reasoning || usage_chunk).then_some(Turn { call, reasoning, usage_chunk })
}

/// `s` in two pieces (at a character boundary): arguments streamed as
/// deltas.
fn halves(s: &str) -> (&str, &str) {
    let mid = s.char_indices().map(|(i, _)| i).nth(s.chars().count() / 2).unwrap_or(s.len());
    s.split_at(mid)
}

const THOUGHT: [&str; 2] = ["thinking ", "hard "];

/// The whole answer.
pub fn answer(protocol: Protocol, model: &str, chunks: usize, turn: &Turn) -> String {
    let text: String = (0..chunks).map(|i| format!("tok{i} ")).collect();
    let thought = THOUGHT.concat();
    match protocol {
        Protocol::OpenAiChat => {
            let mut message = json!({"role": "assistant", "content": text});
            if turn.reasoning {
                message["reasoning_content"] = json!(thought);
            }
            let mut finish = "stop";
            if let Some((name, args)) = &turn.call {
                message["tool_calls"] =
                    json!([{"id": "call_sim_1", "type": "function", "function": {"name": name, "arguments": args}}]);
                finish = "tool_calls";
            }
            json!({"id": "chatcmpl-sim", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks,
                    "prompt_tokens_details": {"cached_tokens": 4}}})
            .to_string()
        }
        _ => {
            let mut content = Vec::new();
            if turn.reasoning {
                content.push(json!({"type": "thinking", "thinking": thought, "signature": "sim-signature"}));
            }
            content.push(json!({"type": "text", "text": text}));
            let mut stop = "end_turn";
            if let Some((name, args)) = &turn.call {
                let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
                content.push(json!({"type": "tool_use", "id": "toolu_sim_1", "name": name, "input": input}));
                stop = "tool_use";
            }
            json!({"id": "msg_sim", "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": chunks}})
            .to_string()
        }
    }
}

/// The answer's SSE events, one `Bytes` each.
pub fn frames(protocol: Protocol, model: &str, chunks: usize, turn: &Turn) -> Vec<Bytes> {
    let mut out = Vec::new();
    match protocol {
        Protocol::OpenAiChat => {
            let chunk = |delta: Value, finish: Option<&str>| {
                let v = json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                Bytes::from(format!("data: {v}\n\n"))
            };
            out.push(chunk(json!({"role": "assistant", "content": ""}), None));
            if turn.reasoning {
                for t in THOUGHT {
                    out.push(chunk(json!({"reasoning_content": t}), None));
                }
            }
            for i in 0..chunks {
                out.push(chunk(json!({"content": format!("tok{i} ")}), None));
            }
            let mut finish = "stop";
            if let Some((name, args)) = &turn.call {
                out.push(chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_sim_1", "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    None,
                ));
                let (a, b) = halves(args);
                for piece in [a, b] {
                    out.push(chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), None));
                }
                finish = "tool_calls";
            }
            out.push(chunk(json!({}), Some(finish)));
            if turn.usage_chunk {
                let v = json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": chunks,
                        "total_tokens": 10 + chunks, "prompt_tokens_details": {"cached_tokens": 4}}});
                out.push(Bytes::from(format!("data: {v}\n\n")));
            }
            out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        _ => {
            let event = |name: &str, v: Value| Bytes::from(format!("event: {name}\ndata: {v}\n\n"));
            out.push(event(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_sim", "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 1}}}),
            ));
            let mut index = 0;
            let mut block = |out: &mut Vec<Bytes>, start: Value, deltas: Vec<Value>| {
                out.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": start}),
                ));
                for d in deltas {
                    out.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index, "delta": d}),
                    ));
                }
                out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
                index += 1;
            };
            if turn.reasoning {
                let mut deltas: Vec<Value> =
                    THOUGHT.iter().map(|t| json!({"type": "thinking_delta", "thinking": t})).collect();
                deltas.push(json!({"type": "signature_delta", "signature": "sim-signature"}));
                block(&mut out, json!({"type": "thinking", "thinking": "", "signature": ""}), deltas);
            }
            let words = (0..chunks).map(|i| json!({"type": "text_delta", "text": format!("tok{i} ")})).collect();
            block(&mut out, json!({"type": "text", "text": ""}), words);
            let mut stop = "end_turn";
            if let Some((name, args)) = &turn.call {
                let (a, b) = halves(args);
                let pieces = [a, b].iter().map(|p| json!({"type": "input_json_delta", "partial_json": p})).collect();
                block(&mut out, json!({"type": "tool_use", "id": "toolu_sim_1", "name": name, "input": {}}), pieces);
                stop = "tool_use";
            }
            out.push(event(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": {"output_tokens": chunks}}),
            ));
            out.push(event("message_stop", json!({"type": "message_stop"})));
        }
    }
    out
}
