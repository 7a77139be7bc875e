//! The Responses API read into and written from
//! [`crate::protocol::turn`]: a client's request read, answers and stream
//! events written. (No upstream is reached over Responses by
//! translation: an OpenAI upstream serves chat completions too, and
//! translation takes that road.)
//!
//! Codex's custom (freeform) tools are offered as function tools of one
//! string argument, `input`; their calls come back as `custom_tool_call`
//! items. Reasoning items keep their `encrypted_content` as opaque state;
//! it goes back only to a Responses target. Tool calls are written whole
//! when the answer ends (arguments reassembled), after its text.

use crate::protocol::stream_turn::StreamWriter;
use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};

use crate::protocol::Protocol;
use crate::protocol::events::sse_event;
use crate::protocol::json::{put_str, put_u64};
use crate::protocol::turn::{
    Calls, Delta, Image, Opaque, Part, Reasoning, Refusal, Reply, Request, Role, Stop, Tokens, Tool, ToolCall,
    ToolChoice, custom_tool_schema, push, refusal,
};

fn content_parts(content: &Value, at: &str) -> Result<Vec<Part>, Refusal> {
    let items = match content {
        Value::String(s) => return Ok(vec![Part::Text(s.clone())]),
        Value::Array(items) => items,
        Value::Null => return Ok(Vec::new()),
        _ => return Err(refusal!("{at}.content: must be a string or an array")),
    };
    let mut parts = Vec::with_capacity(items.len());
    for (j, c) in items.iter().enumerate() {
        match c["type"].as_str() {
            Some("input_text" | "output_text" | "text") => {
                parts.push(Part::Text(c["text"].as_str().unwrap_or_default().to_owned()))
            }
            Some("refusal") => parts.push(Part::Text(c["refusal"].as_str().unwrap_or_default().to_owned())),
            Some("input_image") => match c["image_url"].as_str() {
                Some(url) => parts.push(Part::Image(Image::from_url(url))),
                None => return Err(refusal!("{at}.content[{j}]: an image by file_id cannot be translated")),
            },
            other => {
                return Err(refusal!(
                    "{at}.content[{j}]: a {} part cannot be translated for this model's target",
                    other.unwrap_or("untyped")
                ));
            }
        }
    }
    Ok(parts)
}

fn output_text(output: &Value) -> Vec<Part> {
    match output {
        Value::String(s) => vec![Part::Text(s.clone())],
        Value::Array(items) => items
            .iter()
            .filter_map(|c| match c["type"].as_str() {
                Some("input_image") => c["image_url"].as_str().map(|u| Part::Image(Image::from_url(u))),
                _ => c["text"].as_str().map(|t| Part::Text(t.to_owned())),
            })
            .collect(),
        other => vec![Part::Text(other.to_string())],
    }
}

/// Reads a Responses request (`previous_response_id` is the router's: a
/// translated request carries its whole history or is refused before).
pub fn read_request(v: &Value) -> Result<Request, Refusal> {
    let mut req = Request { stream: v["stream"].as_bool().unwrap_or(false), ..Request::default() };
    if let Some(text) = v["instructions"].as_str().filter(|t| !t.is_empty()) {
        req.system.push(text.to_owned());
    }
    if let Some(format) = v["text"]["format"]["type"].as_str().filter(|t| *t != "text") {
        return Err(refusal!("text.format: {format:?} cannot be translated for this model's target"));
    }
    match &v["input"] {
        Value::String(s) => push(&mut req.messages, Role::User, vec![Part::Text(s.clone())]),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                read_item(item, &at, &mut req)?;
            }
        }
        Value::Null => {}
        _ => return Err("input: must be a string or an array".into()),
    }
    let mut builtin = Vec::new();
    for t in v["tools"].as_array().into_iter().flatten() {
        match t["type"].as_str() {
            Some("function") => req.tools.push(Tool {
                name: t["name"].as_str().unwrap_or_default().to_owned(),
                description: t["description"].as_str().map(str::to_owned),
                parameters: t
                    .get("parameters")
                    .filter(|p| p.is_object())
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                custom: false,
            }),
            Some("custom") => req.tools.push(Tool {
                name: t["name"].as_str().unwrap_or_default().to_owned(),
                description: t["description"].as_str().map(str::to_owned),
                parameters: custom_tool_schema(),
                custom: true,
            }),
            other => {
                let kind = other.unwrap_or("untyped").to_owned();
                req.drop_note(format!("tool {kind}"));
                builtin.push(kind);
            }
        }
    }
    req.tool_choice = match &v["tool_choice"] {
        Value::String(s) if s == "auto" => Some(ToolChoice::Auto),
        Value::String(s) if s == "none" => Some(ToolChoice::None),
        Value::String(s) if s == "required" => Some(ToolChoice::Required),
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name").and_then(Value::as_str)) {
            (Some("function" | "custom"), Some(name)) if req.tools.iter().any(|t| t.name == name) => {
                Some(ToolChoice::Named(name.to_owned()))
            }
            (kind, name) => {
                return Err(refusal!(
                    "tool_choice: the tool {:?} cannot be offered by this model's target",
                    name.or(kind).unwrap_or_default()
                ));
            }
        },
        _ => None,
    };
    req.parallel_tool_calls = v["parallel_tool_calls"].as_bool();
    req.max_tokens = v["max_output_tokens"].as_u64();
    req.temperature = v["temperature"].as_f64();
    req.top_p = v["top_p"].as_f64();
    if let Some(effort) = v["reasoning"]["effort"].as_str() {
        req.reasoning = Some(Reasoning { effort: Some(effort.to_owned()), ..Reasoning::default() });
    } else if v["reasoning"].is_object() {
        req.reasoning = Some(Reasoning::default());
    }
    req.user = v["user"].as_str().or(v["safety_identifier"].as_str()).map(str::to_owned);
    Ok(req)
}

fn read_item(item: &Value, at: &str, req: &mut Request) -> Result<(), Refusal> {
    let kind = item["type"].as_str().unwrap_or(if item.get("role").is_some() { "message" } else { "" });
    match kind {
        "message" => match item["role"].as_str() {
            Some("system" | "developer") => {
                let text: String = content_parts(&item["content"], at)?
                    .into_iter()
                    .filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None })
                    .collect();
                crate::protocol::turn::instruct(req, text);
            }
            Some("user") => push(&mut req.messages, Role::User, content_parts(&item["content"], at)?),
            Some("assistant") => push(&mut req.messages, Role::Assistant, content_parts(&item["content"], at)?),
            other => return Err(refusal!("{at}.role: {other:?} cannot be translated")),
        },
        "function_call" => push(
            &mut req.messages,
            Role::Assistant,
            vec![Part::ToolCall(ToolCall {
                id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                name: item["name"].as_str().unwrap_or_default().to_owned(),
                arguments: item["arguments"].as_str().unwrap_or("{}").to_owned(),
                custom: false,
            })],
        ),
        "custom_tool_call" => push(
            &mut req.messages,
            Role::Assistant,
            vec![Part::ToolCall(ToolCall {
                id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                name: item["name"].as_str().unwrap_or_default().to_owned(),
                arguments: json!({"input": item["input"].as_str().unwrap_or_default()}).to_string(),
                custom: true,
            })],
        ),
        "function_call_output" | "custom_tool_call_output" => push(
            &mut req.messages,
            Role::User,
            vec![Part::ToolResult {
                call_id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                content: output_text(&item["output"]),
                is_error: false,
            }],
        ),
        "reasoning" => {
            let text: Vec<&str> = item["summary"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(item["content"].as_array().into_iter().flatten())
                .filter_map(|s| s["text"].as_str())
                .collect();
            let opaque = item
                .get("encrypted_content")
                .filter(|e| e.is_string())
                .map(|_| Opaque { from: Protocol::OpenAiResponses, value: item.clone() });
            push(&mut req.messages, Role::Assistant, vec![Part::Reasoning { text: text.join("\n"), opaque }]);
        }
        "item_reference" => return Err(refusal!("{at}: an item_reference needs the provider's stored state")),
        other => req.drop_note(format!("{other} item")),
    }
    Ok(())
}

fn usage_value(u: &Tokens) -> Value {
    json!({"input_tokens": u.input, "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.output, "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input + u.output})
}

fn response_id(id: &str) -> String {
    if id.starts_with("resp_") { id.to_owned() } else { format!("resp_{}", uuid::Uuid::now_v7().simple()) }
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// Custom tool input from the arguments of the function it was offered as.
fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v) => v["input"].as_str().map_or_else(|| arguments.to_owned(), str::to_owned),
        Err(_) => arguments.to_owned(),
    }
}

fn call_item(call: &ToolCall, custom: &[String], id: &str) -> Value {
    if call.custom || custom.contains(&call.name) {
        json!({"type": "custom_tool_call", "id": id, "status": "completed", "call_id": call.id,
            "name": call.name, "input": custom_input(&call.arguments)})
    } else {
        json!({"type": "function_call", "id": id, "status": "completed", "call_id": call.id,
            "name": call.name, "arguments": call.arguments})
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": text}]})
}

fn status_of(stop: &Stop) -> (&'static str, Value) {
    match stop {
        Stop::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        Stop::Filtered => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

fn response(
    id: &str,
    model: &str,
    status: &str,
    output: Vec<Value>,
    usage: Option<&Tokens>,
    incomplete: Value,
) -> Value {
    json!({"id": id, "object": "response", "created_at": jiff::Timestamp::now().as_second(), "status": status,
        "model": model, "output": output, "usage": usage.map(usage_value), "incomplete_details": incomplete,
        "error": null, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []})
}

/// Writes a Responses answer (`reasoning`: asked for; `custom`: the
/// custom tools, whose calls are custom tool calls).
pub fn write_answer(reply: &Reply, reasoning: bool, custom: &[String]) -> Value {
    let mut output = Vec::new();
    for p in &reply.parts {
        match p {
            Part::Reasoning { text, .. } if reasoning && !text.is_empty() => {
                output.push(reasoning_item(&item_id("rs"), text))
            }
            Part::Text(t) => output.push(message_item(&item_id("msg"), t, "completed")),
            Part::ToolCall(c) => output.push(call_item(c, custom, &item_id("fc"))),
            _ => {}
        }
    }
    let (status, incomplete) = status_of(&reply.stop);
    response(&response_id(&reply.id), &reply.model, status, output, Some(&reply.usage), incomplete)
}

/// What a [`Writer`] has open: an output item being streamed.
#[derive(Debug)]
enum Open {
    None,
    Message { id: String, text: String },
    Reasoning { id: String, text: String },
}

/// Deltas into Responses events, numbered in order.
#[derive(Debug)]
pub struct Writer {
    reasoning: bool,
    custom: Vec<String>,
    id: String,
    model: String,
    seq: u64,
    started: bool,
    open: Open,
    /// Items finished, for `response.completed`.
    output: Vec<Value>,
    calls: Calls,
    usage: Option<Tokens>,
    stop: Option<Stop>,
    done: bool,
    /// Where the conversation is kept once the answer is complete.
    keep: Option<crate::kept::Keep>,
}

impl Writer {
    /// A writer for a client that asked (or not) for reasoning, offering
    /// `custom` tools; `keep`: where the finished conversation goes.
    pub fn new(reasoning: bool, custom: Vec<String>, keep: Option<crate::kept::Keep>) -> Self {
        Self {
            keep,
            reasoning,
            custom,
            id: String::new(),
            model: String::new(),
            seq: 0,
            started: false,
            open: Open::None,
            output: Vec::new(),
            calls: Calls::default(),
            usage: None,
            stop: None,
            done: false,
        }
    }

    fn event(&mut self, name: &str, mut v: Value, out: &mut BytesMut) {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.put_slice(&sse_event(Some(name), v.to_string().as_bytes()));
    }

    fn start(&mut self, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = response_id(&self.id);
        let r = response(&self.id, &self.model, "in_progress", Vec::new(), None, Value::Null);
        self.event("response.created", json!({"response": r}), out);
        let r = response(&self.id, &self.model, "in_progress", Vec::new(), None, Value::Null);
        self.event("response.in_progress", json!({"response": r}), out);
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn open_message(&mut self, out: &mut BytesMut) {
        if matches!(self.open, Open::Message { .. }) {
            return;
        }
        self.close(out);
        let id = item_id("msg");
        let at = self.index();
        let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
        self.event("response.output_item.added", json!({"output_index": at, "item": item}), out);
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": at, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            out,
        );
        self.open = Open::Message { id, text: String::new() };
    }

    fn open_reasoning(&mut self, out: &mut BytesMut) {
        if matches!(self.open, Open::Reasoning { .. }) {
            return;
        }
        self.close(out);
        let id = item_id("rs");
        let at = self.index();
        self.event(
            "response.output_item.added",
            json!({"output_index": at, "item": {"type": "reasoning", "id": id, "summary": []}}),
            out,
        );
        self.event(
            "response.reasoning_summary_part.added",
            json!({"item_id": id, "output_index": at, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
            out,
        );
        self.open = Open::Reasoning { id, text: String::new() };
    }

    fn close(&mut self, out: &mut BytesMut) {
        let at = self.index();
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => {}
            Open::Message { id, text } => {
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": at, "content_index": 0, "text": text}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}}),
                    out,
                );
                let item = message_item(&id, &text, "completed");
                self.event("response.output_item.done", json!({"output_index": at, "item": item}), out);
                self.output.push(item);
            }
            Open::Reasoning { id, text } => {
                self.event(
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "text": text}),
                    out,
                );
                self.event(
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "part": {"type": "summary_text", "text": text}}),
                    out,
                );
                let item = reasoning_item(&id, &text);
                self.event("response.output_item.done", json!({"output_index": at, "item": item}), out);
                self.output.push(item);
            }
        }
    }
}

impl StreamWriter for Writer {
    const PROTOCOL: Protocol = Protocol::OpenAiResponses;
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
                    self.id = id;
                    self.model = model;
                }
                self.start(out);
            }
            Delta::Text(text) => {
                self.start(out);
                self.open_message(out);
                let at = self.index();
                let Open::Message { id, text: all } = &mut self.open else { return };
                all.push_str(&text);
                // The hot event, written without a JSON tree.
                out.put_slice(b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":");
                put_u64(out, self.seq);
                out.put_slice(b",\"item_id\":");
                put_str(out, id);
                out.put_slice(b",\"output_index\":");
                put_u64(out, at as u64);
                out.put_slice(b",\"content_index\":0,\"delta\":");
                put_str(out, &text);
                out.put_slice(b"}\n\n");
                self.seq += 1;
            }
            Delta::Reasoning(text) if self.reasoning => {
                self.start(out);
                self.open_reasoning(out);
                let at = self.index();
                let Open::Reasoning { id, text: all } = &mut self.open else { return };
                all.push_str(&text);
                let id = id.clone();
                self.event(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "delta": text}),
                    out,
                );
            }
            Delta::Reasoning(_) | Delta::Opaque(_) => {}
            Delta::Tokens(u) => self.usage = Some(u),
            Delta::Stop(stop) => self.stop = Some(stop),
            // The trait's `write` ends the stream and holds the calls.
            Delta::Done | Delta::Error { .. } | Delta::ToolCall { .. } | Delta::ToolArgs { .. } => {}
        }
    }

    /// The end: open item closed, tool calls written whole, then
    /// `response.completed` (or `response.incomplete` at a length stop)
    /// with every item and the usage.
    fn end(&mut self, out: &mut BytesMut) {
        self.start(out);
        self.close(out);
        for call in self.calls.take() {
            let at = self.index();
            let id = item_id("fc");
            let done = call_item(&call, &self.custom, &id);
            let custom = done["type"] == "custom_tool_call";
            let mut added = done.clone();
            added["status"] = json!("in_progress");
            if custom {
                added["input"] = json!("");
            } else {
                added["arguments"] = json!("");
            }
            self.event("response.output_item.added", json!({"output_index": at, "item": added}), out);
            if custom {
                let input = done["input"].clone();
                self.event(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": id, "output_index": at, "delta": input}),
                    out,
                );
                self.event(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": at, "input": input}),
                    out,
                );
            } else {
                let args = call.arguments.clone();
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": at, "delta": args}),
                    out,
                );
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": at, "arguments": args}),
                    out,
                );
            }
            self.event("response.output_item.done", json!({"output_index": at, "item": done}), out);
            self.output.push(done);
        }
        let (status, incomplete) = status_of(&self.stop.take().unwrap_or_default());
        let output = std::mem::take(&mut self.output);
        if let Some(keep) = &self.keep {
            keep.answered(&self.id, &output);
        }
        let r = response(&self.id, &self.model, status, output, self.usage.as_ref(), incomplete);
        let name = if status == "completed" { "response.completed" } else { "response.incomplete" };
        self.event(name, json!({"response": r}), out);
    }
}
