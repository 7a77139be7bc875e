//! Anthropic messages read into and written from
//! [`crate::protocol::turn`]: requests both ways, answers both ways
//! (stream events both ways are `stream.rs`: [`Reader`], [`Writer`]).
//!
//! Thinking blocks keep their signature as [`Opaque`] state, sent back
//! only to an Anthropic target. A thinking block tidegate writes from
//! another provider's reasoning carries [`TRANSLATED_SIGNATURE`] (the
//! client needs one to send the block back); such a block is never sent
//! to Anthropic, whose check it would fail. Tool calls are written whole
//! at the answer's end (their arguments reassembled): a chat provider may
//! interleave the deltas of parallel calls, which Anthropic's one open
//! block at a time cannot say.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

pub use super::stream::{Reader, Writer};
use crate::protocol::Protocol;
use crate::protocol::bounds;
use crate::protocol::json::{Arr, Obj};
use crate::protocol::turn::{
    Image, Opaque, Part, Reasoning, Refusal, Reply, Request, Role, Stop, Tokens, Tool, ToolCall, ToolChoice, push,
    refusal,
};
use crate::record::Usage;

/// The signature of a thinking block translated from another provider's
/// reasoning.
pub const TRANSLATED_SIGNATURE: &str = "tidegate:translated";

/// `max_tokens` sent when the client gave none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 8192;

/// A messages request as read: borrowed strings, raw JSON where only
/// its bytes are needed. Typed, so a long conversation is read without a
/// JSON tree (a field of the wrong type is a malformed request, refused).
#[derive(Deserialize)]
struct RequestIn<'a> {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    system: Option<ContentIn<'a>>,
    #[serde(borrow, default)]
    messages: Option<Vec<MessageIn<'a>>>,
    #[serde(borrow, default)]
    tools: Option<Vec<ToolIn<'a>>>,
    #[serde(borrow, default)]
    tool_choice: Option<ToolChoiceIn<'a>>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(borrow, default)]
    stop_sequences: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow, default)]
    thinking: Option<ThinkingIn<'a>>,
    #[serde(borrow, default)]
    output_config: Option<OutputConfigIn<'a>>,
    #[serde(borrow, default)]
    metadata: Option<MetadataIn<'a>>,
    #[serde(borrow, default)]
    context_management: Option<&'a RawValue>,
    #[serde(borrow, default)]
    container: Option<&'a RawValue>,
    #[serde(borrow, default)]
    mcp_servers: Option<&'a RawValue>,
    #[serde(borrow, default)]
    service_tier: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MessageIn<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow)]
    content: ContentIn<'a>,
}

/// A `content` as sent: a string, blocks (each kept as its bytes: a
/// thinking block goes back verbatim), or null. Read in the request's one
/// pass, not kept raw and read again.
enum ContentIn<'a> {
    Null,
    Text(Cow<'a, str>),
    Blocks(Vec<&'a RawValue>),
}

impl<'de: 'a, 'a> Deserialize<'de> for ContentIn<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Content<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Content<'a> {
            type Value = ContentIn<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ContentIn::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ContentIn::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(ContentIn::Text(Cow::Owned(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(ContentIn::Null)
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(ContentIn::Null)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(ContentIn::Blocks(items))
            }
        }
        d.deserialize_any(Content(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct ToolIn<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_control: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolChoiceIn<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
struct ThinkingIn<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    budget_tokens: Option<u64>,
    #[serde(borrow, default)]
    display: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OutputConfigIn<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MetadataIn<'a> {
    #[serde(borrow, default)]
    user_id: Option<Cow<'a, str>>,
}

/// One content block, any type: the fields each type uses.
#[derive(Deserialize)]
struct BlockIn<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    source: Option<SourceIn<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<ContentIn<'a>>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(borrow, default)]
    cache_control: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SourceIn<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    media_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    url: Option<Cow<'a, str>>,
}

fn owned(s: Option<Cow<'_, str>>) -> String {
    s.map(Cow::into_owned).unwrap_or_default()
}

/// A `content` (a string, blocks, or null) as parts.
/// Where a content sits in the request, for refusals (formatted only
/// when one is made).
#[derive(Debug, Clone, Copy)]
enum At {
    System,
    Message(usize),
    Block(usize, usize),
}

impl At {
    /// The content of block `j` of this one.
    fn block(self, j: usize) -> At {
        match self {
            At::System => At::System,
            At::Message(i) | At::Block(i, _) => At::Block(i, j),
        }
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::System => f.write_str("system"),
            At::Message(i) => write!(f, "messages[{i}]"),
            At::Block(i, j) => write!(f, "messages[{i}].content[{j}]"),
        }
    }
}

/// A `content` as parts; `depth`: how deep in the body its array is
/// (its blocks were kept as raw bytes, which serde_json does not count,
/// so a `tool_result`'s own content counts here).
fn blocks(content: ContentIn<'_>, at: At, depth: usize, req: &mut Request) -> Result<Vec<Part>, Refusal> {
    let items = match content {
        ContentIn::Text(text) => return Ok(vec![Part::Text(text.into_owned())]),
        ContentIn::Null => return Ok(Vec::new()),
        ContentIn::Blocks(items) => items,
    };
    // Each block is an object in the array, its content an array in it.
    if depth + 2 > bounds::MAX_DEPTH {
        return Err(bounds::too_deep(at));
    }
    let mut parts = Vec::with_capacity(items.len());
    for (j, item) in items.into_iter().enumerate() {
        let b: BlockIn<'_> =
            serde_json::from_str(item.get()).map_err(|e| bounds::json_error(&format!("{at}.content[{j}]"), &e))?;
        if b.cache_control.is_some() {
            req.drop_note("cache_control");
        }
        // Opaque state is kept as the block the client sent, verbatim.
        let opaque =
            || serde_json::from_str::<Value>(item.get()).ok().map(|value| Opaque { from: Protocol::Anthropic, value });
        match b.kind.as_deref() {
            Some("text") => parts.push(Part::Text(owned(b.text))),
            Some("image") => {
                let s = b.source.unwrap_or(SourceIn { kind: None, media_type: None, data: None, url: None });
                let image = match s.kind.as_deref() {
                    Some("base64") => Image::Data {
                        media_type: s.media_type.map_or_else(|| "image/png".to_owned(), Cow::into_owned),
                        data: owned(s.data),
                    },
                    Some("url") => Image::Url(owned(s.url)),
                    other => {
                        return Err(refusal!(
                            "{at}.content[{j}].source: an image source {other:?} cannot be translated"
                        ));
                    }
                };
                parts.push(Part::Image(image));
            }
            Some("thinking") => {
                let signature = b.signature.as_deref().unwrap_or_default();
                let foreign = signature == TRANSLATED_SIGNATURE || signature.is_empty();
                parts.push(Part::Reasoning { text: owned(b.thinking), opaque: if foreign { None } else { opaque() } });
            }
            Some("redacted_thinking") => parts.push(Part::Reasoning { text: String::new(), opaque: opaque() }),
            Some("tool_use") => parts.push(Part::ToolCall(ToolCall {
                id: owned(b.id),
                name: owned(b.name),
                arguments: b.input.map_or_else(|| "{}".to_owned(), |i| i.get().to_owned()),
                custom: false,
            })),
            Some("tool_result") => {
                let content = match b.content {
                    Some(c) => blocks(c, at.block(j), depth + 2, req)?,
                    None => Vec::new(),
                };
                parts.push(Part::ToolResult {
                    call_id: owned(b.tool_use_id),
                    content,
                    is_error: b.is_error.unwrap_or(false),
                });
            }
            Some(
                kind @ ("server_tool_use"
                | "web_search_tool_result"
                | "web_fetch_tool_result"
                | "code_execution_tool_result"
                | "mcp_tool_use"
                | "mcp_tool_result"),
            ) => {
                req.drop_note(format!("{kind} block"));
            }
            other => {
                return Err(refusal!(
                    "{at}.content[{j}]: a {} block cannot be translated for this model's target",
                    other.unwrap_or("untyped")
                ));
            }
        }
    }
    Ok(parts)
}

/// Reads a messages request (the body's bytes).
pub fn read_request(body: &[u8]) -> Result<Request, Refusal> {
    // UTF-8 checked once for the whole body (a fast pass), not string by
    // string as the parser reads them.
    let body = std::str::from_utf8(body).map_err(|e| format!("request body: {e}"))?;
    let v: RequestIn<'_> = serde_json::from_str(body).map_err(|e| bounds::json_error("request body", &e))?;
    let mut req = Request { stream: v.stream.unwrap_or(false), ..Request::default() };
    if let Some(system) = v.system {
        // The body's object, then the system's array.
        for part in blocks(system, At::System, 2, &mut req)? {
            if let Part::Text(text) = part {
                req.system.push(text);
            }
        }
    }
    let messages = v.messages.ok_or_else(|| "messages: must be an array".to_owned())?;
    for (i, m) in messages.into_iter().enumerate() {
        let at = At::Message(i);
        let role = match m.role.as_ref() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" => Role::System,
            other => return Err(refusal!("{at}.role: {other:?} is not user, assistant or system")),
        };
        // The body, messages, the message, its content.
        let parts = blocks(m.content, at, 4, &mut req)?;
        push(&mut req.messages, role, parts);
    }
    let builtin = read_tools(v.tools.into_iter().flatten(), &mut req)?;
    if let Some(choice) = v.tool_choice {
        req.tool_choice = match choice.kind.as_deref() {
            Some("auto") => Some(ToolChoice::Auto),
            Some("any") => Some(ToolChoice::Required),
            Some("none") => Some(ToolChoice::None),
            Some("tool") => {
                let name = choice.name.as_deref().unwrap_or_default();
                if builtin.iter().any(|b| b == name) || !req.tools.iter().any(|t| t.name == name) {
                    return Err(refusal!("tool_choice: the tool {name:?} cannot be offered by this model's target"));
                }
                Some(ToolChoice::Named(name.to_owned()))
            }
            _ => None,
        };
        if choice.disable_parallel_tool_use == Some(true) {
            req.parallel_tool_calls = Some(false);
        }
    }
    req.max_tokens = v.max_tokens;
    req.temperature = v.temperature;
    req.top_p = v.top_p;
    req.top_k = v.top_k;
    req.stop = v.stop_sequences.into_iter().flatten().map(Cow::into_owned).collect();
    if let Some(thinking) = v.thinking {
        read_thinking(&thinking, &mut req);
    }
    if let Some(effort) = v.output_config.and_then(|o| o.effort)
        && let Some(r) = req.reasoning.as_mut()
        && r.budget.is_none()
    {
        r.effort = Some(effort.into_owned());
    }
    let unsaid = [
        ("context_management", v.context_management),
        ("container", v.container),
        ("mcp_servers", v.mcp_servers),
        ("service_tier", v.service_tier),
    ];
    for (field, value) in unsaid {
        if value.is_some() {
            req.drop_note(field);
        }
    }
    req.user = v.metadata.and_then(|m| m.user_id).map(Cow::into_owned);
    Ok(req)
}

/// The tools offered: client tools read, built-in and server tools
/// dropped (declared); the names of those, which `tool_choice` may not
/// name.
fn read_tools<'a>(tools: impl Iterator<Item = ToolIn<'a>>, req: &mut Request) -> Result<Vec<String>, Refusal> {
    let mut builtin = Vec::new();
    for (i, t) in tools.enumerate() {
        if t.cache_control.is_some() {
            req.drop_note("cache_control");
        }
        match (t.kind.as_deref(), t.input_schema) {
            (None | Some("custom"), Some(schema)) => req.tools.push(Tool {
                name: t.name.ok_or_else(|| format!("tools[{i}].name: missing"))?.into_owned(),
                description: t.description.map(Cow::into_owned),
                parameters: serde_json::from_str(schema.get())
                    .map_err(|e| bounds::json_error(&format!("tools[{i}].input_schema"), &e))?,
                custom: false,
            }),
            (kind, _) => {
                let name = t.name.as_deref().unwrap_or_default();
                builtin.push(name.to_owned());
                req.drop_note(format!("tool {}", kind.unwrap_or(name)));
            }
        }
    }
    Ok(builtin)
}

/// The reasoning `thinking` asks for (a budget, or adaptive), and whether
/// its text is wanted.
fn read_thinking(thinking: &ThinkingIn<'_>, req: &mut Request) {
    match thinking.kind.as_deref() {
        Some("enabled") => req.reasoning = Some(Reasoning { budget: thinking.budget_tokens, ..Reasoning::default() }),
        Some("adaptive") => req.reasoning = Some(Reasoning { effort: Some("medium".into()), ..Reasoning::default() }),
        _ => {}
    }
    // Reasoning asked for, its text not wanted: none is shown.
    if thinking.display.as_deref() == Some("omitted")
        && let Some(r) = req.reasoning.as_mut()
    {
        r.hidden = true;
    }
}

fn part_blocks(parts: &[Part], dropped: &mut Vec<&'static str>) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        match p {
            Part::Text(t) if t.is_empty() => {}
            Part::Text(t) => out.push(json!({"type": "text", "text": t})),
            Part::Image(Image::Data { media_type, data }) => {
                out.push(json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}))
            }
            Part::Image(Image::Url(url)) => out.push(json!({"type": "image", "source": {"type": "url", "url": url}})),
            Part::Reasoning { opaque: Some(o), .. } if o.from == Protocol::Anthropic => out.push(o.value.clone()),
            Part::Reasoning { opaque: Some(_), .. } => dropped.push("encrypted reasoning"),
            Part::Reasoning { opaque: None, .. } => dropped.push("earlier reasoning text"),
            Part::ToolCall(c) => {
                let input = match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({"input": c.arguments}),
                };
                out.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
            }
            Part::ToolResult { call_id, content, is_error } => {
                let content = part_blocks(content, dropped);
                let mut b = json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
                if *is_error {
                    b["is_error"] = json!(true);
                }
                out.push(b);
            }
        }
    }
    out
}

/// Writes a messages request for `model`; what Anthropic cannot carry is
/// noted in `req.dropped`.
pub fn write_request(req: &mut Request, model: &str) -> Value {
    let mut dropped = Vec::new();
    let mut messages: Vec<Value> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let mut content = part_blocks(&m.parts, &mut dropped);
        // Tool results first in their message, as Anthropic requires.
        content.sort_by_key(|b| b["type"] != "tool_result");
        if content.is_empty() {
            continue;
        }
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
        };
        messages.push(json!({"role": role, "content": content}));
    }
    for d in dropped {
        req.drop_note(d);
    }
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("max_tokens".into(), json!(max_tokens));
    if !req.system.is_empty() {
        let system: Vec<Value> = req.system.iter().map(|s| json!({"type": "text", "text": s})).collect();
        out.insert("system".into(), Value::Array(system));
    }
    out.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut v = json!({"name": t.name, "input_schema": t.parameters});
                if let Some(d) = &t.description {
                    v["description"] = json!(d);
                }
                v
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    let mut choice = match &req.tool_choice {
        Some(ToolChoice::Auto) => Some(json!({"type": "auto"})),
        Some(ToolChoice::None) => Some(json!({"type": "none"})),
        Some(ToolChoice::Required) => Some(json!({"type": "any"})),
        Some(ToolChoice::Named(name)) => Some(json!({"type": "tool", "name": name})),
        None => None,
    };
    if req.parallel_tool_calls == Some(false) && !req.tools.is_empty() {
        choice.get_or_insert_with(|| json!({"type": "auto"}))["disable_parallel_tool_use"] = json!(true);
    }
    if let Some(choice) = choice {
        out.insert("tool_choice".into(), choice);
    }
    if let Some(t) = req.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(k) = req.top_k {
        out.insert("top_k".into(), json!(k));
    }
    if !req.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(req.stop));
    }
    if let Some(r) = &req.reasoning {
        let budget = r.budget.unwrap_or(match r.effort.as_deref() {
            Some("minimal" | "low") => 2048,
            Some("high" | "xhigh") => 16_384,
            _ => 8192,
        });
        // The budget must stay under max_tokens and at 1024 or more.
        let budget = budget.min(max_tokens.saturating_sub(1));
        if budget >= 1024 {
            out.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": budget}));
        } else {
            req.drop_note("reasoning (max_tokens too small for a thinking budget)");
        }
    }
    if let Some(user) = &req.user {
        out.insert("metadata".into(), json!({"user_id": user}));
    }
    if req.stream {
        out.insert("stream".into(), json!(true));
    }
    Value::Object(out)
}

pub(super) fn stop_of(reason: &str, sequence: Option<&str>) -> Stop {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => Stop::Length,
        "tool_use" => Stop::ToolUse,
        "stop_sequence" => Stop::Sequence(sequence.map(str::to_owned)),
        "refusal" => Stop::Filtered,
        _ => Stop::End,
    }
}

pub(super) fn stop_reason(stop: &Stop) -> (&'static str, Value) {
    match stop {
        Stop::End => ("end_turn", Value::Null),
        Stop::Length => ("max_tokens", Value::Null),
        Stop::ToolUse => ("tool_use", Value::Null),
        Stop::Sequence(s) => ("stop_sequence", s.as_ref().map_or(Value::Null, |s| json!(s))),
        Stop::Filtered => ("refusal", Value::Null),
    }
}

/// Takes a messages `usage` into `into` (see [`Usage::take_anthropic`]).
pub(super) fn take_usage(into: &mut Usage, u: &Value) {
    let n = |key: &str| u[key].as_u64();
    into.take_anthropic(
        n("input_tokens"),
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
        n("output_tokens"),
    );
}

pub(super) fn usage_of(u: &Value) -> Tokens {
    let mut usage = Usage::default();
    take_usage(&mut usage, u);
    usage.into()
}

pub(super) fn usage_value(u: &Tokens) -> Value {
    json!({"input_tokens": u.input.saturating_sub(u.cached + u.cache_written), "output_tokens": u.output,
        "cache_read_input_tokens": u.cached, "cache_creation_input_tokens": u.cache_written})
}

/// Reads a messages answer.
pub fn read_answer(v: &Value) -> Option<Reply> {
    let content = v["content"].as_array()?;
    let mut parts = Vec::with_capacity(content.len());
    for b in content {
        match b["type"].as_str() {
            Some("text") => parts.push(Part::Text(b["text"].as_str().unwrap_or_default().to_owned())),
            Some("thinking") => parts.push(Part::Reasoning {
                text: b["thinking"].as_str().unwrap_or_default().to_owned(),
                opaque: Some(Opaque { from: Protocol::Anthropic, value: b.clone() }),
            }),
            Some("redacted_thinking") => parts.push(Part::Reasoning {
                text: String::new(),
                opaque: Some(Opaque { from: Protocol::Anthropic, value: b.clone() }),
            }),
            Some("tool_use") => parts.push(Part::ToolCall(ToolCall {
                id: b["id"].as_str().unwrap_or_default().to_owned(),
                name: b["name"].as_str().unwrap_or_default().to_owned(),
                arguments: b.get("input").map_or_else(|| "{}".to_owned(), Value::to_string),
                custom: false,
            })),
            _ => {}
        }
    }
    Some(Reply {
        id: v["id"].as_str().unwrap_or_default().to_owned(),
        model: v["model"].as_str().unwrap_or_default().to_owned(),
        parts,
        stop: stop_of(v["stop_reason"].as_str().unwrap_or("end_turn"), v["stop_sequence"].as_str()),
        usage: usage_of(&v["usage"]),
    })
}

/// The `msg_` id Anthropic clients expect.
pub(super) fn message_id(id: &str) -> String {
    if id.starts_with("msg_") { id.to_owned() } else { format!("msg_{}", id.trim_start_matches("chatcmpl-")) }
}

/// Writes a messages answer (`reasoning`: the client asked for thinking),
/// as JSON bytes written by hand (see `protocol::json`).
pub fn write_answer(reply: &Reply, reasoning: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + reply.parts.iter().map(Part::text_len).sum::<usize>());
    let mut top = Obj::new(&mut out);
    top.str("id", &message_id(&reply.id)).str("type", "message").str("role", "assistant").str("model", &reply.model);
    let mut content = Arr::new(top.key("content"));
    for p in &reply.parts {
        match p {
            Part::Text(t) => {
                let mut b = Obj::new(content.item());
                b.str("type", "text").str("text", t);
                b.end();
            }
            Part::Reasoning { text, opaque } if reasoning && !text.is_empty() => {
                let mut b = Obj::new(content.item());
                b.str("type", "thinking").str("thinking", text);
                match opaque {
                    Some(o) if o.from == Protocol::Anthropic => b.tree("signature", &o.value["signature"]),
                    _ => b.str("signature", TRANSLATED_SIGNATURE),
                };
                b.end();
            }
            Part::ToolCall(c) => {
                let mut b = Obj::new(content.item());
                b.str("type", "tool_use").str("id", &c.id).str("name", &c.name);
                match serde_json::from_str::<&RawValue>(&c.arguments) {
                    Ok(input) if input.get().starts_with('{') => b.raw("input", input.get()),
                    _ => b.raw("input", "{}"),
                };
                b.end();
            }
            _ => {}
        }
    }
    content.end();
    let (reason, sequence) = stop_reason(&reply.stop);
    top.str("stop_reason", reason).tree("stop_sequence", &sequence);
    let u = &reply.usage;
    let mut usage = Obj::new(top.key("usage"));
    usage
        .u64("input_tokens", u.input.saturating_sub(u.cached + u.cache_written))
        .u64("output_tokens", u.output)
        .u64("cache_read_input_tokens", u.cached)
        .u64("cache_creation_input_tokens", u.cache_written);
    usage.end();
    top.end();
    out
}
