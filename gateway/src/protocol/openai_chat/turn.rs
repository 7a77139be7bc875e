//! Chat completions read into and written from [`crate::protocol::turn`]:
//! requests both ways, answers both ways, and the chunks' typed shape
//! (stream chunks both ways are `stream.rs`: [`Reader`], [`Writer`]).
//!
//! Written requests send `max_tokens` (what every chat-compatible provider
//! takes; OpenAI's own still accepts it for non-reasoning models) and ask
//! for usage in streams (`stream_options.include_usage`); the client's
//! stream gets the usage chunk only if it asked for it.

use std::borrow::Cow;

use serde_json::{Value, json};

pub use super::stream::{Reader, Writer};
use crate::protocol::Protocol;
use crate::protocol::json::{Arr, Obj};
use crate::protocol::turn::{
    Image, Part, Reasoning, Refusal, Reply, Request, Role, Stop, Tokens, Tool, ToolCall, ToolChoice,
    custom_tool_schema, push, refusal,
};
use crate::record::Usage;

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
                        let Some(url) = url else { return Err(refusal!("{at}.content[{j}].image_url: no url")) };
                        parts.push(Part::Image(Image::from_url(url)));
                    }
                    // A refusal the model gave earlier reads as its text.
                    Some("refusal") => parts.push(Part::Text(item["refusal"].as_str().unwrap_or_default().to_owned())),
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
        _ => Err(refusal!("{at}.content: must be a string or an array")),
    }
}

/// Reads a chat-completions request.
pub fn read_request(v: &Value) -> Result<Request, Refusal> {
    let mut req = Request { stream: v["stream"].as_bool().unwrap_or(false), ..Request::default() };
    if v.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("n: more than one choice cannot be translated for this model's target".into());
    }
    if let Some(format) = v.get("response_format").and_then(|f| f["type"].as_str()).filter(|t| *t != "text") {
        return Err(refusal!("response_format: {format:?} cannot be translated for this model's target"));
    }
    let messages = v["messages"].as_array().ok_or_else(|| "messages: must be an array".to_owned())?;
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        match m["role"].as_str() {
            Some("system" | "developer") => crate::protocol::turn::instruct(&mut req, text_of(&m["content"])),
            Some("user") => push(&mut req.messages, Role::User, parts_of(&m["content"], &at)?),
            Some("assistant") => push(&mut req.messages, Role::Assistant, assistant_parts(m, &at)?),
            Some("tool") => {
                let call_id = m["tool_call_id"].as_str().unwrap_or_default().to_owned();
                let content = parts_of(&m["content"], &at)?;
                push(&mut req.messages, Role::User, vec![Part::ToolResult { call_id, content, is_error: false }]);
            }
            other => return Err(refusal!("{at}.role: {other:?} cannot be translated")),
        }
    }
    read_tools(v, &mut req)?;
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

/// An assistant message's parts: its reasoning, content and tool calls.
fn assistant_parts(m: &Value, at: &str) -> Result<Vec<Part>, Refusal> {
    let mut parts = Vec::new();
    let reasoning = m.get("reasoning_content").or_else(|| m.get("reasoning")).and_then(Value::as_str);
    if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
        parts.push(Part::Reasoning { text: text.to_owned(), opaque: None });
    }
    parts.extend(parts_of(&m["content"], at)?);
    for (j, call) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let id = call["id"].as_str().unwrap_or_default().to_owned();
        let call = match call["type"].as_str() {
            Some("custom") => ToolCall {
                id,
                name: call["custom"]["name"].as_str().unwrap_or_default().to_owned(),
                arguments: json!({"input": call["custom"]["input"].as_str().unwrap_or_default()}).to_string(),
                custom: true,
            },
            _ => {
                let f = &call["function"];
                let Some(name) = f["name"].as_str() else {
                    return Err(refusal!("{at}.tool_calls[{j}].function.name: missing"));
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
    Ok(parts)
}

/// The tools offered: functions and custom tools read, others dropped
/// (declared).
fn read_tools(v: &Value, req: &mut Request) -> Result<(), Refusal> {
    for (i, t) in v["tools"].as_array().into_iter().flatten().enumerate() {
        match t["type"].as_str() {
            Some("function") | None => {
                let f = &t["function"];
                let Some(name) = f["name"].as_str() else { return Err(refusal!("tools[{i}].function.name: missing")) };
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
    Ok(())
}

/// The text of `parts`, joined (borrowed when there is one).
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

/// A message with string content.
fn put_message(messages: &mut Arr<'_>, role: &str, text: &str, tool_call_id: Option<&str>) {
    let mut m = Obj::new(messages.item());
    m.str("role", role).str("content", text);
    if let Some(id) = tool_call_id {
        m.str("tool_call_id", id);
    }
    m.end();
}

/// A user turn's text and images: a string when it is text only.
fn put_user(messages: &mut Arr<'_>, parts: &[&Part]) {
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        return put_message(messages, "user", &text_of_parts(parts.iter().copied()), None);
    }
    let mut m = Obj::new(messages.item());
    m.str("role", "user");
    let mut items = Arr::new(m.key("content"));
    for p in parts {
        let mut item = Obj::new(items.item());
        match p {
            Part::Text(t) => {
                item.str("type", "text").str("text", t);
            }
            Part::Image(image) => {
                item.str("type", "image_url");
                let mut url = Obj::new(item.key("image_url"));
                url.str("url", &image.url());
                url.end();
            }
            _ => {}
        }
        item.end();
    }
    items.end();
    m.end();
}

/// A user turn: each tool result as a `tool` message, the rest (text,
/// images) as one user message.
fn put_user_turn(messages: &mut Arr<'_>, parts: &[Part], dropped: &mut Vec<&'static str>) {
    let mut plain: Vec<&Part> = Vec::new();
    for p in parts {
        match p {
            Part::ToolResult { call_id, content, is_error } => {
                if content.iter().any(|c| !matches!(c, Part::Text(_))) {
                    dropped.push("image in a tool result");
                }
                let mut text = text_of_parts(content.iter());
                if *is_error && !text.starts_with("Error") {
                    text = Cow::Owned(format!("Error: {text}"));
                }
                put_message(messages, "tool", &text, Some(call_id));
            }
            Part::Text(_) | Part::Image(_) => plain.push(p),
            Part::Reasoning { .. } | Part::ToolCall(_) => {}
        }
    }
    if !plain.is_empty() {
        put_user(messages, &plain);
    }
}

/// An assistant turn: its text (`null` for tool calls only) and its tool
/// calls; reasoning and images, which chat cannot carry back, noted.
fn put_assistant_turn(messages: &mut Arr<'_>, parts: &[Part], dropped: &mut Vec<&'static str>) {
    let mut calls: Vec<&ToolCall> = Vec::new();
    for p in parts {
        match p {
            Part::ToolCall(c) => calls.push(c),
            Part::Reasoning { opaque: Some(o), .. } => dropped.push(opaque_name(o.from)),
            Part::Reasoning { opaque: None, .. } => dropped.push("earlier reasoning text"),
            Part::Image(_) => dropped.push("image in an assistant turn"),
            Part::Text(_) | Part::ToolResult { .. } => {}
        }
    }
    let text = text_of_parts(parts.iter());
    let mut msg = Obj::new(messages.item());
    msg.str("role", "assistant");
    if text.is_empty() && !calls.is_empty() {
        // `null` for an assistant turn of tool calls only.
        msg.raw("content", "null");
    } else {
        msg.str("content", &text);
    }
    if !calls.is_empty() {
        let mut list = Arr::new(msg.key("tool_calls"));
        for c in calls {
            let mut call = Obj::new(list.item());
            call.str("id", &c.id).str("type", "function");
            let mut function = Obj::new(call.key("function"));
            function.str("name", &c.name).str("arguments", &c.arguments);
            function.end();
            call.end();
        }
        list.end();
    }
    msg.end();
}

/// The tools offered, as functions, and whether several calls may come
/// at once.
fn put_tools(top: &mut Obj<'_>, req: &Request) {
    if req.tools.is_empty() {
        return;
    }
    let mut tools = Arr::new(top.key("tools"));
    for t in &req.tools {
        let mut tool = Obj::new(tools.item());
        tool.str("type", "function");
        let mut function = Obj::new(tool.key("function"));
        function.str("name", &t.name);
        if let Some(d) = &t.description {
            function.str("description", d);
        }
        function.tree("parameters", &t.parameters);
        function.end();
        tool.end();
    }
    tools.end();
    if let Some(parallel) = req.parallel_tool_calls {
        top.raw("parallel_tool_calls", if parallel { "true" } else { "false" });
    }
}

/// Writes a chat-completions request for `model` (JSON bytes, written by
/// hand: see `protocol::json`); what chat cannot carry is noted in
/// `req.dropped`.
pub fn write_request(req: &mut Request, model: &str) -> Result<Vec<u8>, serde_json::Error> {
    let mut dropped = Vec::new();
    // The conversation's text plus room for the JSON around it.
    let mut out = Vec::with_capacity(req.text_len() + 256 * (req.messages.len() + 1));
    {
        let req = &*req;
        let mut top = Obj::new(&mut out);
        top.str("model", model);
        let mut messages = Arr::new(top.key("messages"));
        for text in &req.system {
            put_message(&mut messages, "system", text, None);
        }
        for m in &req.messages {
            match m.role {
                Role::System => put_message(&mut messages, "system", &text_of_parts(m.parts.iter()), None),
                Role::User => put_user_turn(&mut messages, &m.parts, &mut dropped),
                Role::Assistant => put_assistant_turn(&mut messages, &m.parts, &mut dropped),
            }
        }
        messages.end();
        put_tools(&mut top, req);
        match &req.tool_choice {
            None => {}
            Some(ToolChoice::Auto) => {
                top.str("tool_choice", "auto");
            }
            Some(ToolChoice::None) => {
                top.str("tool_choice", "none");
            }
            Some(ToolChoice::Required) => {
                top.str("tool_choice", "required");
            }
            Some(ToolChoice::Named(name)) => {
                top.value("tool_choice", &json!({"type": "function", "function": {"name": name}}));
            }
        }
        if let Some(n) = req.max_tokens {
            top.u64("max_tokens", n);
        }
        if let Some(t) = req.temperature {
            top.value("temperature", &t);
        }
        if let Some(p) = req.top_p {
            top.value("top_p", &p);
        }
        if !req.stop.is_empty() {
            top.value("stop", &req.stop);
        }
        if let Some(r) = &req.reasoning {
            top.str("reasoning_effort", &effort_of(r));
        }
        if let Some(user) = &req.user {
            top.str("user", user);
        }
        if req.stream {
            top.raw("stream", "true").raw("stream_options", r#"{"include_usage":true}"#);
        }
        top.end();
    }
    for d in dropped {
        req.drop_note(d);
    }
    if req.top_k.is_some() {
        req.drop_note("top_k");
    }
    Ok(out)
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

pub(super) fn opaque_name(from: Protocol) -> &'static str {
    match from {
        Protocol::Anthropic => "thinking signature",
        Protocol::OpenAiResponses => "encrypted reasoning",
        Protocol::OpenAiChat => "reasoning state",
        Protocol::Gemini => "thought signature",
    }
}

/// The stop a `finish_reason` stands for.
pub(super) fn stop_of(reason: &str) -> Stop {
    match reason {
        "length" => Stop::Length,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Filtered,
        _ => Stop::End,
    }
}

pub(super) fn finish_reason(stop: &Stop) -> &'static str {
    match stop {
        Stop::End | Stop::Sequence(_) => "stop",
        Stop::Length => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Filtered => "content_filter",
    }
}

/// Takes a chat `usage` (a tree) into `into`.
pub(super) fn take_usage(into: &mut Usage, u: &Value) {
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().or(u["prompt_cache_hit_tokens"].as_u64());
    let reasoning = u["completion_tokens_details"]["reasoning_tokens"].as_u64();
    into.take_openai(u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64(), cached, reasoning);
}

pub(super) fn usage_of(u: &Value) -> Tokens {
    let mut usage = Usage::default();
    take_usage(&mut usage, u);
    usage.into()
}

pub(super) fn usage_value(u: &Tokens) -> Value {
    json!({"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning}})
}

/// Reads a chat-completions answer (its bytes). The usual answer is read
/// typed and borrowed (no JSON tree); one with a field of another type
/// the slow way. `None` when it is not one.
pub fn read_answer(body: &[u8]) -> Option<Reply> {
    match serde_json::from_slice::<ChunkIn<'_>>(body) {
        Ok(v) => read_typed_answer(v),
        Err(_) => read_answer_tree(&serde_json::from_slice(body).ok()?),
    }
}

fn read_typed_answer(v: ChunkIn<'_>) -> Option<Reply> {
    let choice = v.choices.into_iter().next()?;
    let m = choice.message.unwrap_or_default();
    let mut parts = Vec::new();
    if let Some(text) = m.reasoning_content.or(m.reasoning).filter(|t| !t.is_empty()) {
        parts.push(Part::Reasoning { text: text.into_owned(), opaque: None });
    }
    if let Some(text) = m.content.filter(|t| !t.is_empty()) {
        parts.push(Part::Text(text.into_owned()));
    }
    for call in m.tool_calls.into_iter().flatten() {
        let (name, arguments) = call.function.map_or((None, None), |f| (f.name, f.arguments));
        parts.push(Part::ToolCall(ToolCall {
            id: call.id.map(Cow::into_owned).unwrap_or_default(),
            name: name.map(Cow::into_owned).unwrap_or_default(),
            arguments: arguments.map_or_else(|| "{}".to_owned(), Cow::into_owned),
            custom: false,
        }));
    }
    let mut stop = stop_of(choice.finish_reason.as_deref().unwrap_or("stop"));
    if stop == Stop::End && parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
        stop = Stop::ToolUse;
    }
    Some(Reply {
        id: v.id.map(Cow::into_owned).unwrap_or_default(),
        model: v.model.map(Cow::into_owned).unwrap_or_default(),
        parts,
        stop,
        usage: v.usage.map(UsageIn::usage).unwrap_or_default(),
    })
}

fn read_answer_tree(v: &Value) -> Option<Reply> {
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

pub(super) fn chat_id(id: &str) -> String {
    if id.starts_with("chatcmpl") { id.to_owned() } else { format!("chatcmpl-{id}") }
}

pub(super) fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// A streamed chunk as chat-compatible providers send it, borrowed.
#[derive(serde::Deserialize)]
pub(super) struct ChunkIn<'a> {
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) choices: Vec<ChoiceIn<'a>>,
    #[serde(default)]
    pub(super) usage: Option<UsageIn>,
    #[serde(borrow, default)]
    pub(super) error: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
pub(super) struct ChoiceIn<'a> {
    #[serde(borrow, default)]
    pub(super) delta: Option<DeltaIn<'a>>,
    /// A whole answer's (the same fields as a delta).
    #[serde(borrow, default)]
    pub(super) message: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
pub(super) struct DeltaIn<'a> {
    #[serde(borrow, default)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) tool_calls: Option<Vec<ToolCallIn<'a>>>,
}

#[derive(serde::Deserialize)]
pub(super) struct ToolCallIn<'a> {
    #[serde(default)]
    pub(super) index: Option<u32>,
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) function: Option<FunctionIn<'a>>,
}

#[derive(serde::Deserialize)]
pub(super) struct FunctionIn<'a> {
    #[serde(borrow, default)]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) arguments: Option<Cow<'a, str>>,
}

/// A chat `usage`, read typed (the pass-through scanner reads the same).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) struct UsageIn {
    #[serde(default)]
    pub(super) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(super) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(super) prompt_cache_hit_tokens: Option<u64>,
    #[serde(default)]
    pub(super) prompt_tokens_details: Option<CachedIn>,
    #[serde(default)]
    pub(super) completion_tokens_details: Option<ReasoningIn>,
}

/// `prompt_tokens_details` (the Responses API's `input_tokens_details`).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) struct CachedIn {
    #[serde(default)]
    pub(crate) cached_tokens: Option<u64>,
}

/// `completion_tokens_details` (`output_tokens_details`).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) struct ReasoningIn {
    #[serde(default)]
    pub(crate) reasoning_tokens: Option<u64>,
}

impl UsageIn {
    /// Takes these counts into `into` (see [`Usage`]).
    pub(crate) fn take(self, into: &mut Usage) {
        let cached = self.prompt_tokens_details.and_then(|d| d.cached_tokens).or(self.prompt_cache_hit_tokens);
        let reasoning = self.completion_tokens_details.and_then(|d| d.reasoning_tokens);
        into.take_openai(self.prompt_tokens, self.completion_tokens, cached, reasoning);
    }

    pub(super) fn usage(self) -> Tokens {
        let mut usage = Usage::default();
        self.take(&mut usage);
        usage.into()
    }
}
