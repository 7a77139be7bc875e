//! Anthropic messages streams, translated: a target's events read into
//! [`Delta`]s ([`Reader`]) and deltas written as a client's events
//! ([`Writer`]). Tool calls are written whole at the answer's end (their
//! arguments reassembled): a chat provider may interleave the deltas of
//! parallel calls, which Anthropic's one open block at a time cannot say.

use crate::protocol::stream_turn::{StreamReader, StreamWriter};

use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};

use super::turn::{TRANSLATED_SIGNATURE, message_id, stop_of, stop_reason, take_usage, usage_value};
use crate::protocol::Protocol;
use crate::protocol::events::sse_event;
use crate::protocol::json::{put_str, put_u64};
use crate::protocol::turn::{Calls, Delta, Opaque, Stop, Tokens, ToolCall};
use crate::record::Usage;

/// Messages events into deltas.
#[derive(Debug, Default)]
pub struct Reader {
    /// Block index → tool call (its deltas are argument pieces).
    tools: std::collections::HashSet<u32>,
    /// The counts so far: input in `message_start`, output (and, lately,
    /// input again) in `message_delta`.
    usage: Usage,
}

impl StreamReader for Reader {
    /// Reads one event.
    fn read(&mut self, name: Option<&str>, data: &str, out: &mut Vec<Delta>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else { return };
        let kind = v["type"].as_str().or(name).unwrap_or_default();
        match kind {
            "message_start" => {
                let m = &v["message"];
                out.push(Delta::Start {
                    id: m["id"].as_str().unwrap_or_default().to_owned(),
                    model: m["model"].as_str().unwrap_or_default().to_owned(),
                });
                take_usage(&mut self.usage, &m["usage"]);
                out.push(Delta::Tokens(self.usage.into()));
            }
            "content_block_start" => {
                let index = v["index"].as_u64().unwrap_or(0) as u32;
                let b = &v["content_block"];
                match b["type"].as_str() {
                    Some("tool_use") => {
                        self.tools.insert(index);
                        out.push(Delta::ToolCall {
                            index,
                            id: b["id"].as_str().unwrap_or_default().to_owned(),
                            name: b["name"].as_str().unwrap_or_default().to_owned(),
                        });
                    }
                    Some("text") => {
                        if let Some(t) = b["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(Delta::Text(t.to_owned()));
                        }
                    }
                    Some("redacted_thinking") => {
                        out.push(Delta::Opaque(Opaque { from: Protocol::Anthropic, value: b.clone() }))
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = v["index"].as_u64().unwrap_or(0) as u32;
                let d = &v["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => out.push(Delta::Text(d["text"].as_str().unwrap_or_default().to_owned())),
                    Some("thinking_delta") => {
                        out.push(Delta::Reasoning(d["thinking"].as_str().unwrap_or_default().to_owned()))
                    }
                    Some("signature_delta") => out.push(Delta::Opaque(Opaque {
                        from: Protocol::Anthropic,
                        value: json!({"signature": d["signature"]}),
                    })),
                    Some("input_json_delta") if self.tools.contains(&index) => out.push(Delta::ToolArgs {
                        index,
                        args: d["partial_json"].as_str().unwrap_or_default().to_owned(),
                    }),
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = v["delta"]["stop_reason"].as_str() {
                    out.push(Delta::Stop(stop_of(reason, v["delta"]["stop_sequence"].as_str())));
                }
                if v["usage"].is_object() {
                    take_usage(&mut self.usage, &v["usage"]);
                    out.push(Delta::Tokens(self.usage.into()));
                }
            }
            "message_stop" => out.push(Delta::Done),
            "error" => out.push(Delta::Error {
                status: crate::protocol::error_status(data.as_bytes()),
                message: v["error"]["message"].as_str().unwrap_or("upstream error").to_owned(),
            }),
            _ => {}
        }
    }
}

/// The block a [`Writer`] has open.
#[derive(Debug, PartialEq)]
enum Open {
    None,
    Text,
    Thinking,
}

/// Deltas into messages events.
#[derive(Debug)]
pub struct Writer {
    /// The client asked for thinking.
    reasoning: bool,
    id: String,
    model: String,
    started: bool,
    open: Open,
    next: u32,
    /// Tool calls, reassembled.
    calls: Calls,
    usage: Tokens,
    stop: Option<Stop>,
    done: bool,
}

impl Writer {
    /// A writer for a client that asked (or not) for thinking.
    pub fn new(reasoning: bool) -> Self {
        Self {
            reasoning,
            id: String::new(),
            model: String::new(),
            started: false,
            open: Open::None,
            next: 0,
            calls: Calls::default(),
            usage: Tokens::default(),
            stop: None,
            done: false,
        }
    }

    fn event(name: &str, v: &Value, out: &mut BytesMut) {
        out.put_slice(&sse_event(Some(name), v.to_string().as_bytes()));
    }

    fn start(&mut self, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        if self.id.is_empty() {
            self.id = format!("msg_{}", uuid::Uuid::now_v7().simple());
        }
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.usage.input.saturating_sub(self.usage.cached + self.usage.cache_written),
                "output_tokens": 0, "cache_read_input_tokens": self.usage.cached,
                "cache_creation_input_tokens": self.usage.cache_written}});
        Self::event("message_start", &json!({"type": "message_start", "message": message}), out);
    }

    fn open(&mut self, want: Open, out: &mut BytesMut) {
        self.start(out);
        if self.open == want {
            return;
        }
        self.close(out);
        let block = match want {
            Open::Text => json!({"type": "text", "text": ""}),
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Open::None => return,
        };
        Self::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.next, "content_block": block}),
            out,
        );
        self.open = want;
    }

    /// A `content_block_delta` of the open block.
    fn block_delta(&self, delta: Value, out: &mut BytesMut) {
        Self::event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next, "delta": delta}),
            out,
        );
    }

    /// The open block's `content_block_stop`.
    fn block_stop(&self, out: &mut BytesMut) {
        Self::event("content_block_stop", &json!({"type": "content_block_stop", "index": self.next}), out);
    }

    fn close(&mut self, out: &mut BytesMut) {
        if self.open == Open::None {
            return;
        }
        if self.open == Open::Thinking {
            let d = json!({"type": "signature_delta", "signature": TRANSLATED_SIGNATURE});
            self.block_delta(d, out);
        }
        self.block_stop(out);
        self.next += 1;
        self.open = Open::None;
    }
}

impl StreamWriter for Writer {
    const PROTOCOL: Protocol = Protocol::Anthropic;
    const HOLDS_CALLS: bool = true;

    fn ended(&mut self) -> &mut bool {
        &mut self.done
    }

    fn calls(&mut self) -> Option<&mut Calls> {
        Some(&mut self.calls)
    }

    fn content(&mut self, delta: Delta, out: &mut BytesMut) {
        match delta {
            Delta::Start { id, model } => {
                if !self.started {
                    self.id = message_id(&id);
                    self.model = model;
                }
            }
            Delta::Text(text) => {
                self.open(Open::Text, out);
                // The hot event, written without a JSON tree.
                out.put_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
                put_u64(out, u64::from(self.next));
                out.put_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
                put_str(out, &text);
                out.put_slice(b"}}\n\n");
            }
            Delta::Reasoning(text) if self.reasoning => {
                self.open(Open::Thinking, out);
                self.block_delta(json!({"type": "thinking_delta", "thinking": text}), out);
            }
            Delta::Reasoning(_) | Delta::Opaque(_) => {}
            Delta::Tokens(u) => self.usage = u,
            Delta::Stop(stop) => self.stop = Some(stop),
            // The trait's `write` ends the stream and holds the calls.
            Delta::Done | Delta::Error { .. } | Delta::ToolCall { .. } | Delta::ToolArgs { .. } => {}
        }
    }

    /// The end: open block closed, tool calls written whole,
    /// `message_delta` with the stop reason and usage, `message_stop`.
    fn end(&mut self, out: &mut BytesMut) {
        self.start(out);
        self.close(out);
        for ToolCall { id, name, arguments: args, .. } in self.calls.take() {
            let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            Self::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.next, "content_block": block}),
                out,
            );
            let d = json!({"type": "input_json_delta", "partial_json": args});
            self.block_delta(d, out);
            self.block_stop(out);
            self.next += 1;
            self.stop.get_or_insert(Stop::ToolUse);
        }
        let (reason, sequence) = stop_reason(&self.stop.take().unwrap_or_default());
        let usage = usage_value(&self.usage);
        Self::event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}),
            out,
        );
        Self::event("message_stop", &json!({"type": "message_stop"}), out);
    }
}
