//! Chat completions read into and written from [`crate::protocol::turn`]:
//! requests both ways, answers both ways, stream chunks into deltas
//! ([`Reader`]) and deltas into chunks ([`Writer`]).
//!
//! Written requests send `max_tokens` (what every chat-compatible provider
//! takes; OpenAI's own still accepts it for non-reasoning models) and ask
//! for usage in streams (`stream_options.include_usage`); the client's
//! stream gets the usage chunk only if it asked for it.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};

use crate::protocol::events::{put_json_str, put_u64, sse_event};
use crate::protocol::turn::{
    Delta, Image, Message, Part, Reasoning, Reply, Request, Role, Stop, Tool, ToolCall, ToolChoice, Usage,
    custom_tool_schema,
};
use crate::protocol::{ErrorKind, Protocol};

/// Why a request cannot be translated: the field and the reason.
pub type Refusal = String;

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

fn parts_of(content: &Value, at: &str) -> Result<Vec<Part>, Refusal> {
    match content {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![Part::Text(s.clone())]),
        Value::Array(items) => {
            let mut parts = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(Part::Text(item["text"].as_str().unwrap_or_default().to_owned())),
                    Some("image_url") => {
                        let url = item["image_url"].get("url").and_then(Value::as_str).or(item["image_url"].as_str());
                        let Some(url) = url else { return Err(format!("{at}.content[{j}].image_url: no url")) };
                        parts.push(Part::Image(Image::from_url(url)));
                    }
                    // A refusal the model gave earlier reads as its text.
                    Some("refusal") => parts.push(Part::Text(item["refusal"].as_str().unwrap_or_default().to_owned())),
                    other => {
                        return Err(format!(
                            "{at}.content[{j}]: a {} part cannot be translated for this model's target",
                            other.unwrap_or("untyped")
                        ));
                    }
                }
            }
            Ok(parts)
        }
        _ => Err(format!("{at}.content: must be a string or an array")),
    }
}

/// Reads a chat-completions request.
pub fn read_request(v: &Value) -> Result<Request, Refusal> {
    let mut req = Request { stream: v["stream"].as_bool().unwrap_or(false), ..Request::default() };
    if v.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("n: more than one choice cannot be translated for this model's target".into());
    }
    if let Some(format) = v.get("response_format").and_then(|f| f["type"].as_str()).filter(|t| *t != "text") {
        return Err(format!("response_format: {format:?} cannot be translated for this model's target"));
    }
    let messages = v["messages"].as_array().ok_or_else(|| "messages: must be an array".to_owned())?;
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        match m["role"].as_str() {
            Some("system" | "developer") => crate::protocol::turn::instruct(&mut req, text_of(&m["content"])),
            Some("user") => push(&mut req.messages, Role::User, parts_of(&m["content"], &at)?),
            Some("assistant") => {
                let mut parts = Vec::new();
                let reasoning = m.get("reasoning_content").or_else(|| m.get("reasoning")).and_then(Value::as_str);
                if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
                    parts.push(Part::Reasoning { text: text.to_owned(), opaque: None });
                }
                parts.extend(parts_of(&m["content"], &at)?);
                for (j, call) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
                    let id = call["id"].as_str().unwrap_or_default().to_owned();
                    let call = match call["type"].as_str() {
                        Some("custom") => ToolCall {
                            id,
                            name: call["custom"]["name"].as_str().unwrap_or_default().to_owned(),
                            arguments: json!({"input": call["custom"]["input"].as_str().unwrap_or_default()})
                                .to_string(),
                            custom: true,
                        },
                        _ => {
                            let f = &call["function"];
                            let Some(name) = f["name"].as_str() else {
                                return Err(format!("{at}.tool_calls[{j}].function.name: missing"));
                            };
                            ToolCall {
                                id,
                                name: name.to_owned(),
                                arguments: f["arguments"].as_str().unwrap_or("{}").to_owned(),
                                custom: false,
                            }
                        }
                    };
                    parts.push(Part::ToolCall(call));
                }
                push(&mut req.messages, Role::Assistant, parts);
            }
            Some("tool") => {
                let call_id = m["tool_call_id"].as_str().unwrap_or_default().to_owned();
                let content = parts_of(&m["content"], &at)?;
                push(&mut req.messages, Role::User, vec![Part::ToolResult { call_id, content, is_error: false }]);
            }
            other => return Err(format!("{at}.role: {other:?} cannot be translated")),
        }
    }
    for (i, t) in v["tools"].as_array().into_iter().flatten().enumerate() {
        match t["type"].as_str() {
            Some("function") | None => {
                let f = &t["function"];
                let Some(name) = f["name"].as_str() else { return Err(format!("tools[{i}].function.name: missing")) };
                req.tools.push(Tool {
                    name: name.to_owned(),
                    description: f["description"].as_str().map(str::to_owned),
                    parameters: f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
                    custom: false,
                });
            }
            Some("custom") => req.tools.push(Tool {
                name: t["custom"]["name"].as_str().unwrap_or_default().to_owned(),
                description: t["custom"]["description"].as_str().map(str::to_owned),
                parameters: custom_tool_schema(),
                custom: true,
            }),
            Some(other) => req.drop_note(format!("tool {other}")),
        }
    }
    req.tool_choice = match &v["tool_choice"] {
        Value::String(s) if s == "auto" => Some(ToolChoice::Auto),
        Value::String(s) if s == "none" => Some(ToolChoice::None),
        Value::String(s) if s == "required" => Some(ToolChoice::Required),
        Value::Object(o) => {
            let name = o.get("function").or_else(|| o.get("custom")).and_then(|f| f["name"].as_str());
            match name {
                Some(name) if req.tools.iter().any(|t| t.name == name) => Some(ToolChoice::Named(name.to_owned())),
                _ => return Err("tool_choice: names a tool this model's target does not offer".into()),
            }
        }
        _ => None,
    };
    req.parallel_tool_calls = v["parallel_tool_calls"].as_bool();
    req.max_tokens = v["max_completion_tokens"].as_u64().or(v["max_tokens"].as_u64());
    req.temperature = v["temperature"].as_f64();
    req.top_p = v["top_p"].as_f64();
    req.stop = match &v["stop"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    if let Some(effort) = v["reasoning_effort"].as_str() {
        req.reasoning = Some(Reasoning { effort: Some(effort.to_owned()), ..Reasoning::default() });
    }
    req.user = v["user"].as_str().map(str::to_owned);
    Ok(req)
}

/// Appends parts as a message of `role`, merged into the last one if it
/// has the same role (the protocols differ on consecutive turns).
pub(crate) fn push(messages: &mut Vec<Message>, role: Role, parts: Vec<Part>) {
    match messages.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => messages.push(Message { role, parts }),
    }
}

/// A chat request as written: borrowed from the turn, serialised
/// without a JSON tree in between.
#[derive(serde::Serialize)]
struct RequestOut<'a> {
    model: &'a str,
    messages: Vec<MessageOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<ToolOut<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(serde::Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    /// `null` for an assistant turn of tool calls only.
    content: ContentOut<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<CallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum ContentOut<'a> {
    Null(()),
    Text(Cow<'a, str>),
    Parts(Vec<PartOut<'a>>),
}

#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartOut<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: UrlOut },
}

#[derive(serde::Serialize)]
struct UrlOut {
    url: String,
}

#[derive(serde::Serialize)]
struct CallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

#[derive(serde::Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(serde::Serialize)]
struct ToolOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunctionOut<'a>,
}

#[derive(serde::Serialize)]
struct ToolFunctionOut<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: &'a Value,
}

fn text_of_parts<'a>(parts: impl Iterator<Item = &'a Part>) -> Cow<'a, str> {
    let mut texts = parts.filter_map(|p| if let Part::Text(t) = p { Some(t.as_str()) } else { None });
    let Some(first) = texts.next() else { return Cow::Borrowed("") };
    match texts.next() {
        None => Cow::Borrowed(first),
        Some(second) => {
            let mut all = String::from(first);
            all.push_str(second);
            texts.for_each(|t| all.push_str(t));
            Cow::Owned(all)
        }
    }
}

fn message<'a>(role: &'static str, content: ContentOut<'a>) -> MessageOut<'a> {
    MessageOut { role, content, tool_calls: Vec::new(), tool_call_id: None }
}

/// A user turn's text and images: a string when it is text only.
fn user_content<'a>(parts: &[&'a Part]) -> ContentOut<'a> {
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        return ContentOut::Text(text_of_parts(parts.iter().copied()));
    }
    let items = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(PartOut::Text { text: t }),
            Part::Image(image) => Some(PartOut::ImageUrl { image_url: UrlOut { url: image.url() } }),
            _ => None,
        })
        .collect();
    ContentOut::Parts(items)
}

/// Writes a chat-completions request for `model` (JSON bytes); what chat
/// cannot carry is noted in `req.dropped`.
pub fn write_request(req: &mut Request, model: &str) -> Result<Vec<u8>, serde_json::Error> {
    let mut dropped = Vec::new();
    let out = {
        let req = &*req;
        let mut messages = Vec::with_capacity(req.messages.len() + req.system.len());
        for text in &req.system {
            messages.push(message("system", ContentOut::Text(Cow::Borrowed(text))));
        }
        for m in &req.messages {
            match m.role {
                Role::System => messages.push(message("system", ContentOut::Text(text_of_parts(m.parts.iter())))),
                Role::User => {
                    let mut plain: Vec<&Part> = Vec::new();
                    for p in &m.parts {
                        match p {
                            Part::ToolResult { call_id, content, is_error } => {
                                if content.iter().any(|c| !matches!(c, Part::Text(_))) {
                                    dropped.push("image in a tool result");
                                }
                                let mut text = text_of_parts(content.iter());
                                if *is_error && !text.starts_with("Error") {
                                    text = Cow::Owned(format!("Error: {text}"));
                                }
                                messages.push(MessageOut {
                                    tool_call_id: Some(call_id),
                                    ..message("tool", ContentOut::Text(text))
                                });
                            }
                            Part::Text(_) | Part::Image(_) => plain.push(p),
                            Part::Reasoning { .. } | Part::ToolCall(_) => {}
                        }
                    }
                    if !plain.is_empty() {
                        messages.push(message("user", user_content(&plain)));
                    }
                }
                Role::Assistant => {
                    let mut calls = Vec::new();
                    for p in &m.parts {
                        match p {
                            Part::ToolCall(c) => calls.push(CallOut {
                                id: &c.id,
                                kind: "function",
                                function: FunctionOut { name: &c.name, arguments: &c.arguments },
                            }),
                            Part::Reasoning { opaque: Some(o), .. } => dropped.push(opaque_name(o.from)),
                            Part::Reasoning { opaque: None, .. } => dropped.push("earlier reasoning text"),
                            Part::Image(_) => dropped.push("image in an assistant turn"),
                            Part::Text(_) | Part::ToolResult { .. } => {}
                        }
                    }
                    let text = text_of_parts(m.parts.iter());
                    let content = if text.is_empty() && !calls.is_empty() {
                        ContentOut::Null(())
                    } else {
                        ContentOut::Text(text)
                    };
                    messages.push(MessageOut { tool_calls: calls, ..message("assistant", content) });
                }
            }
        }
        let tools = (!req.tools.is_empty()).then(|| {
            req.tools
                .iter()
                .map(|t| ToolOut {
                    kind: "function",
                    function: ToolFunctionOut {
                        name: &t.name,
                        description: t.description.as_deref(),
                        parameters: &t.parameters,
                    },
                })
                .collect()
        });
        let tool_choice = req.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
        });
        let out = RequestOut {
            model,
            messages,
            parallel_tool_calls: tools.as_ref().and(req.parallel_tool_calls),
            tools,
            tool_choice,
            max_tokens: req.max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            stop: &req.stop,
            reasoning_effort: req.reasoning.as_ref().map(effort_of),
            user: req.user.as_deref(),
            stream: req.stream,
            stream_options: req.stream.then_some(StreamOptions { include_usage: true }),
        };
        serde_json::to_vec(&out)
    };
    for d in dropped {
        req.drop_note(d);
    }
    if req.top_k.is_some() {
        req.drop_note("top_k");
    }
    out
}

/// The effort a reasoning request stands for (a budget as the nearest).
pub(crate) fn effort_of(r: &Reasoning) -> String {
    match (&r.effort, r.budget) {
        (Some(e), _) => e.clone(),
        (None, Some(b)) if b <= 4096 => "low".into(),
        (None, Some(b)) if b <= 16_384 => "medium".into(),
        (None, _) => "high".into(),
    }
}

fn opaque_name(from: Protocol) -> &'static str {
    match from {
        Protocol::Anthropic => "thinking signature",
        Protocol::OpenAiResponses => "encrypted reasoning",
        Protocol::OpenAiChat => "reasoning state",
    }
}

/// The stop a `finish_reason` stands for.
fn stop_of(reason: &str) -> Stop {
    match reason {
        "length" => Stop::Length,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Filtered,
        _ => Stop::End,
    }
}

fn finish_reason(stop: &Stop) -> &'static str {
    match stop {
        Stop::End | Stop::Sequence(_) => "stop",
        Stop::Length => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Filtered => "content_filter",
    }
}

fn usage_of(u: &Value) -> Usage {
    Usage {
        input: u["prompt_tokens"].as_u64().unwrap_or(0),
        output: u["completion_tokens"].as_u64().unwrap_or(0),
        cached: u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .or(u["prompt_cache_hit_tokens"].as_u64())
            .unwrap_or(0),
        cache_written: 0,
        reasoning: u["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0),
    }
}

fn usage_value(u: &Usage) -> Value {
    json!({"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning}})
}

/// Reads a chat-completions answer.
pub fn read_answer(v: &Value) -> Option<Reply> {
    let choice = v["choices"].get(0)?;
    let m = &choice["message"];
    let mut parts = Vec::new();
    let reasoning = m.get("reasoning_content").or_else(|| m.get("reasoning")).and_then(Value::as_str);
    if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
        parts.push(Part::Reasoning { text: text.to_owned(), opaque: None });
    }
    if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
        parts.push(Part::Text(text.to_owned()));
    }
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        parts.push(Part::ToolCall(ToolCall {
            id: call["id"].as_str().unwrap_or_default().to_owned(),
            name: call["function"]["name"].as_str().unwrap_or_default().to_owned(),
            arguments: call["function"]["arguments"].as_str().unwrap_or("{}").to_owned(),
            custom: false,
        }));
    }
    let mut stop = stop_of(choice["finish_reason"].as_str().unwrap_or("stop"));
    if stop == Stop::End && parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
        stop = Stop::ToolUse;
    }
    Some(Reply {
        id: v["id"].as_str().unwrap_or_default().to_owned(),
        model: v["model"].as_str().unwrap_or_default().to_owned(),
        parts,
        stop,
        usage: usage_of(&v["usage"]),
    })
}

/// Writes a chat-completions answer (`reasoning`: the client asked for it).
pub fn write_answer(reply: &Reply, reasoning: bool) -> Value {
    let mut text = String::new();
    let mut thought = String::new();
    let mut calls = Vec::new();
    for p in &reply.parts {
        match p {
            Part::Text(t) => text.push_str(t),
            Part::Reasoning { text, .. } => thought.push_str(text),
            Part::ToolCall(c) => calls
                .push(json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})),
            Part::Image(_) | Part::ToolResult { .. } => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }});
    if reasoning && !thought.is_empty() {
        message["reasoning_content"] = json!(thought);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({"id": chat_id(&reply.id), "object": "chat.completion", "created": now(), "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(&reply.stop)}],
        "usage": usage_value(&reply.usage)})
}

fn chat_id(id: &str) -> String {
    if id.starts_with("chatcmpl") { id.to_owned() } else { format!("chatcmpl-{id}") }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Chat chunks into deltas.
#[derive(Debug, Default)]
pub struct Reader {
    started: bool,
    calls: Vec<u32>,
    stopped: bool,
}

impl Reader {
    /// Reads one event's data.
    pub fn read(&mut self, data: &str, out: &mut Vec<Delta>) {
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
                if !self.calls.contains(&index) {
                    self.calls.push(index);
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
            out.push(Delta::Usage(usage_of(u)));
        }
    }
}

/// A streamed chunk as chat-compatible providers send it, borrowed.
#[derive(serde::Deserialize)]
struct ChunkIn<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Vec<ChoiceIn<'a>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(borrow, default)]
    error: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
struct ChoiceIn<'a> {
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCallIn<'a>>>,
}

#[derive(serde::Deserialize)]
struct ToolCallIn<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<FunctionIn<'a>>,
}

#[derive(serde::Deserialize)]
struct FunctionIn<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct UsageIn {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<CachedIn>,
    #[serde(default)]
    completion_tokens_details: Option<ReasoningIn>,
}

#[derive(serde::Deserialize)]
struct CachedIn {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(serde::Deserialize)]
struct ReasoningIn {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
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
                if !self.calls.contains(&index) {
                    self.calls.push(index);
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
            out.push(Delta::Usage(Usage {
                input: u.prompt_tokens.unwrap_or(0),
                output: u.completion_tokens.unwrap_or(0),
                cached: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .or(u.prompt_cache_hit_tokens)
                    .unwrap_or(0),
                cache_written: 0,
                reasoning: u.completion_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0),
            }));
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
    usage: Option<Usage>,
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

    /// Writes one delta.
    pub fn write(&mut self, delta: Delta, out: &mut BytesMut) {
        if self.done {
            return;
        }
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
                put_json_str(out, &self.id);
                out.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
                put_u64(out, self.created.max(0) as u64);
                out.put_slice(b",\"model\":");
                put_json_str(out, &self.model);
                out.put_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
                put_json_str(out, &text);
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
            Delta::Usage(u) => self.usage = Some(u),
            Delta::Stop(stop) => self.stop = Some(stop),
            Delta::Done => self.finish(out),
            Delta::Error { status, message } => {
                self.done = true;
                out.put_slice(&super::error_event(crate::protocol::kind_of_status(status), &message));
            }
        }
    }

    /// The end: the finish chunk, usage if asked, `[DONE]` (once).
    pub fn finish(&mut self, out: &mut BytesMut) {
        if self.done {
            return;
        }
        self.start(out);
        self.done = true;
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

    /// A failure told in chat's words (nothing after it).
    pub fn fail(&mut self, kind: ErrorKind, message: &str, out: &mut BytesMut) {
        if !self.done {
            self.done = true;
            out.put_slice(&super::error_event(kind, message));
        }
    }
}
