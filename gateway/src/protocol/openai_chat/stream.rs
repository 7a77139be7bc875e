//! Chat-completions streams, translated: a target's chunks read into
//! [`Delta`]s ([`Reader`], the usual chunk read in place with borrowed
//! strings) and deltas written as a client's chunks ([`Writer`]).

use crate::protocol::stream_turn::{StreamReader, StreamWriter};

use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};

use super::turn::{ChunkIn, chat_id, finish_reason, now, stop_of, take_usage, usage_value};
use crate::protocol::Protocol;
use crate::protocol::events::sse_event;
use crate::protocol::json::{put_str, put_u64};
use crate::protocol::turn::{Delta, Stop, Tokens};
use crate::record::Usage;

/// Chat chunks into deltas.
#[derive(Debug, Default)]
pub struct Reader {
    started: bool,
    /// The provider's indices of the calls opened (a set: a provider
    /// may open many).
    calls: std::collections::HashSet<u32>,
    stopped: bool,
    /// The counts so far (most providers say them once, at the end; some
    /// on every chunk).
    usage: Usage,
}

impl StreamReader for Reader {
    /// Reads one event's data.
    fn read(&mut self, _name: Option<&str>, data: &str, out: &mut Vec<Delta>) {
        if data.trim() == "[DONE]" {
            out.push(Delta::Done);
            return;
        }
        // The usual chunk, read in place (borrowed strings); anything
        // else (an error object, a field of another type) the slow way.
        if let Ok(chunk) = serde_json::from_str::<ChunkIn<'_>>(data)
            && chunk.error.is_none()
        {
            self.read_chunk(chunk, out);
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else { return };
        if let Some(err) = v.get("error") {
            let message = err["message"].as_str().map_or_else(|| err.to_string(), str::to_owned);
            out.push(Delta::Error { status: crate::protocol::error_status(data.as_bytes()), message });
            return;
        }
        if !self.started {
            self.started = true;
            out.push(Delta::Start {
                id: v["id"].as_str().unwrap_or_default().to_owned(),
                model: v["model"].as_str().unwrap_or_default().to_owned(),
            });
        }
        if let Some(choice) = v["choices"].get(0) {
            let d = &choice["delta"];
            let reasoning = d.get("reasoning_content").or_else(|| d.get("reasoning")).and_then(Value::as_str);
            if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
                out.push(Delta::Reasoning(text.to_owned()));
            }
            if let Some(text) = d["content"].as_str().filter(|t| !t.is_empty()) {
                out.push(Delta::Text(text.to_owned()));
            }
            for (k, call) in d["tool_calls"].as_array().into_iter().flatten().enumerate() {
                let index = call["index"].as_u64().map_or(k as u32, |i| i as u32);
                if self.calls.insert(index) {
                    out.push(Delta::ToolCall {
                        index,
                        id: call["id"].as_str().unwrap_or_default().to_owned(),
                        name: call["function"]["name"].as_str().unwrap_or_default().to_owned(),
                    });
                }
                if let Some(args) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
                    out.push(Delta::ToolArgs { index, args: args.to_owned() });
                }
            }
            if let Some(reason) = choice["finish_reason"].as_str()
                && !self.stopped
            {
                self.stopped = true;
                let stop = stop_of(reason);
                let stop = if stop == Stop::End && !self.calls.is_empty() { Stop::ToolUse } else { stop };
                out.push(Delta::Stop(stop));
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            take_usage(&mut self.usage, u);
            out.push(Delta::Tokens(self.usage.into()));
        }
    }
}

impl Reader {
    fn read_chunk(&mut self, chunk: ChunkIn<'_>, out: &mut Vec<Delta>) {
        if !self.started {
            self.started = true;
            out.push(Delta::Start {
                id: chunk.id.as_deref().unwrap_or_default().to_owned(),
                model: chunk.model.as_deref().unwrap_or_default().to_owned(),
            });
        }
        if let Some(choice) = chunk.choices.into_iter().next() {
            let d = choice.delta.unwrap_or_default();
            if let Some(text) = d.reasoning_content.or(d.reasoning).filter(|t| !t.is_empty()) {
                out.push(Delta::Reasoning(text.into_owned()));
            }
            if let Some(text) = d.content.filter(|t| !t.is_empty()) {
                out.push(Delta::Text(text.into_owned()));
            }
            for (k, call) in d.tool_calls.into_iter().flatten().enumerate() {
                let index = call.index.unwrap_or(k as u32);
                let (name, args) = call.function.map_or((None, None), |f| (f.name, f.arguments));
                if self.calls.insert(index) {
                    out.push(Delta::ToolCall {
                        index,
                        id: call.id.as_deref().unwrap_or_default().to_owned(),
                        name: name.as_deref().unwrap_or_default().to_owned(),
                    });
                }
                if let Some(args) = args.filter(|a| !a.is_empty()) {
                    out.push(Delta::ToolArgs { index, args: args.into_owned() });
                }
            }
            if let Some(reason) = choice.finish_reason
                && !self.stopped
            {
                self.stopped = true;
                let stop = stop_of(&reason);
                let stop = if stop == Stop::End && !self.calls.is_empty() { Stop::ToolUse } else { stop };
                out.push(Delta::Stop(stop));
            }
        }
        if let Some(u) = chunk.usage {
            u.take(&mut self.usage);
            out.push(Delta::Tokens(self.usage.into()));
        }
    }
}

/// Deltas into chat chunks.
#[derive(Debug)]
pub struct Writer {
    id: String,
    model: String,
    created: i64,
    /// The client asked for a usage chunk.
    include_usage: bool,
    /// The client asked for reasoning.
    reasoning: bool,
    started: bool,
    /// Provider call index → the client's (in order of appearance).
    calls: Vec<u32>,
    usage: Option<Tokens>,
    stop: Option<Stop>,
    done: bool,
}

impl Writer {
    /// A writer for a client that asked (or not) for usage and reasoning.
    pub fn new(include_usage: bool, reasoning: bool) -> Self {
        Self {
            id: String::new(),
            model: String::new(),
            created: now(),
            include_usage,
            reasoning,
            started: false,
            calls: Vec::new(),
            usage: None,
            stop: None,
            done: false,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, out: &mut BytesMut) {
        let chunk = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        out.put_slice(&sse_event(None, chunk.to_string().as_bytes()));
    }

    fn start(&mut self, out: &mut BytesMut) {
        if !self.started {
            self.started = true;
            if self.id.is_empty() {
                self.id = format!("chatcmpl-{}", uuid::Uuid::now_v7().simple());
            }
            self.chunk(json!({"role": "assistant", "content": ""}), None, out);
        }
    }
}

impl StreamWriter for Writer {
    const PROTOCOL: Protocol = Protocol::OpenAiChat;

    fn ended(&mut self) -> &mut bool {
        &mut self.done
    }

    fn content(&mut self, delta: Delta, out: &mut BytesMut) {
        match delta {
            Delta::Start { id, model } => {
                if !self.started {
                    self.id = chat_id(&id);
                    self.model = model;
                }
                self.start(out);
            }
            Delta::Text(text) => {
                self.start(out);
                // The hot chunk, written without a JSON tree.
                out.put_slice(b"data: {\"id\":");
                put_str(out, &self.id);
                out.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
                put_u64(out, self.created.max(0) as u64);
                out.put_slice(b",\"model\":");
                put_str(out, &self.model);
                out.put_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
                put_str(out, &text);
                out.put_slice(b"},\"finish_reason\":null}]}\n\n");
            }
            Delta::Reasoning(text) if self.reasoning => {
                self.start(out);
                self.chunk(json!({"reasoning_content": text}), None, out);
            }
            Delta::Reasoning(_) | Delta::Opaque(_) => {}
            Delta::ToolCall { index, id, name } => {
                self.start(out);
                let at = self.calls.len();
                self.calls.push(index);
                self.chunk(
                    json!({"tool_calls": [{"index": at, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}]}),
                    None,
                    out,
                );
            }
            Delta::ToolArgs { index, args } => {
                let Some(at) = self.calls.iter().position(|i| *i == index) else { return };
                self.chunk(json!({"tool_calls": [{"index": at, "function": {"arguments": args}}]}), None, out);
            }
            Delta::Tokens(u) => self.usage = Some(u),
            Delta::Stop(stop) => self.stop = Some(stop),
            // The trait's `write` ends the stream.
            Delta::Done | Delta::Error { .. } => {}
        }
    }

    /// The end: the finish chunk, usage if asked, `[DONE]` (once).
    fn end(&mut self, out: &mut BytesMut) {
        self.start(out);
        let stop = self.stop.take().unwrap_or_default();
        self.chunk(json!({}), Some(finish_reason(&stop)), out);
        if self.include_usage
            && let Some(u) = &self.usage
        {
            let chunk = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage_value(u)});
            out.put_slice(&sse_event(None, chunk.to_string().as_bytes()));
        }
        out.put_slice(b"data: [DONE]\n\n");
    }
}
