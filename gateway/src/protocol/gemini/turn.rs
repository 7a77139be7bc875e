//! Gemini's `generateContent` requests, answers and stream chunks, read
//! into and written from [`crate::protocol::turn`].
//!
//! What Gemini alone has: a part's `thoughtSignature` (kept verbatim as
//! an [`Opaque`] from Gemini, returned only to Gemini, on the part it came
//! with); function calls without ids (given ids by position, so a call and
//! the response that follows it pair up in protocols that need ids);
//! function responses name the function, not the call (the name is looked
//! up from the call when writing for Gemini); schemas in Gemini's OpenAPI
//! subset (`"type": "OBJECT"`) read as JSON Schema.

use crate::protocol::stream_turn::{StreamReader, StreamWriter};
use bytes::{BufMut, BytesMut};
use serde_json::{Map, Value, json};

use super::super::Protocol;
use super::super::turn::{
    Calls, Delta, Image, Opaque, Part, Reasoning, Refusal, Reply, Request, Role, Stop, Tokens, Tool, ToolCall,
    ToolChoice, refusal,
};
use super::UsageIn;
use crate::record::Usage;

/// The key a Gemini part's opaque state is kept under.
const SIGNATURE: &str = "thoughtSignature";

/// A part's text of a `functionResponse` with one `output` (or `content`)
/// string: that string; else the response as JSON text.
fn response_text(response: &Value) -> String {
    for key in ["output", "content", "result"] {
        if let (Some(s), Some(1)) = (response.get(key).and_then(Value::as_str), response.as_object().map(Map::len)) {
            return s.to_owned();
        }
    }
    response.to_string()
}

/// Gemini's OpenAPI-subset schema as JSON Schema: type names lower-cased
/// (`OBJECT` → `object`), everything else as it is.
fn json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                let v = match (k.as_str(), v) {
                    ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                    _ => json_schema(v),
                };
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(json_schema).collect()),
        other => other.clone(),
    }
}

/// The parts of one Gemini `content`; `calls` gives ids to function calls
/// and responses that have none.
fn read_parts(parts: &[Value], at: &str, ids: &mut Ids, req: &mut Request) -> Result<Vec<Part>, Refusal> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let signature = p.get(SIGNATURE).filter(|s| s.is_string());
        let opaque = || signature.map(|s| Opaque { from: Protocol::Gemini, value: s.clone() });
        if let Some(text) = p.get("text").and_then(Value::as_str) {
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                out.push(Part::Reasoning { text: text.to_owned(), opaque: opaque() });
                continue;
            }
            if signature.is_some() {
                out.push(Part::Reasoning { text: String::new(), opaque: opaque() });
            }
            out.push(Part::Text(text.to_owned()));
        } else if let Some(data) = p.get("inlineData") {
            let media_type = data["mimeType"].as_str().unwrap_or("application/octet-stream");
            if !media_type.starts_with("image/") {
                return Err(refusal!(
                    "{at}.parts[{j}]: inline {media_type} data cannot be translated for this model's target"
                ));
            }
            out.push(Part::Image(Image::Data {
                media_type: media_type.to_owned(),
                data: data["data"].as_str().unwrap_or_default().to_owned(),
            }));
        } else if let Some(file) = p.get("fileData") {
            let uri = file["fileUri"].as_str().unwrap_or_default();
            if !file["mimeType"].as_str().unwrap_or("image/").starts_with("image/") {
                return Err(refusal!("{at}.parts[{j}]: a file part cannot be translated for this model's target"));
            }
            out.push(Part::Image(Image::Url(uri.to_owned())));
        } else if let Some(call) = p.get("functionCall") {
            if signature.is_some() {
                out.push(Part::Reasoning { text: String::new(), opaque: opaque() });
            }
            let name = call["name"].as_str().unwrap_or_default().to_owned();
            let id = match call.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => id.to_owned(),
                _ => ids.call(),
            };
            ids.called.push((id.clone(), name.clone()));
            let args = call.get("args").filter(|a| a.is_object()).map_or_else(|| "{}".to_owned(), Value::to_string);
            out.push(Part::ToolCall(ToolCall { id, name, arguments: args, custom: false }));
        } else if let Some(response) = p.get("functionResponse") {
            let name = response["name"].as_str().unwrap_or_default();
            let call_id = match response.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => id.to_owned(),
                _ => ids.answer(name),
            };
            let body = &response["response"];
            let is_error = body.get("error").is_some() && body.get("output").is_none();
            let text = match body.get("error") {
                Some(e) if is_error => e.as_str().map_or_else(|| e.to_string(), str::to_owned),
                _ => response_text(body),
            };
            out.push(Part::ToolResult { call_id, content: vec![Part::Text(text)], is_error });
        } else if p.get("executableCode").is_some() || p.get("codeExecutionResult").is_some() {
            req.drop_note("code execution part");
        } else {
            let kind = p.as_object().and_then(|o| o.keys().find(|k| *k != SIGNATURE)).map_or("empty", String::as_str);
            return Err(refusal!("{at}.parts[{j}]: a {kind} part cannot be translated for this model's target"));
        }
    }
    Ok(out)
}

/// Ids for function calls that came without one: `call_{n}` by position,
/// and each response answering the first open call of its name.
#[derive(Default)]
struct Ids {
    next: u32,
    called: Vec<(String, String)>,
}

impl Ids {
    fn call(&mut self) -> String {
        self.next += 1;
        format!("call_gemini_{}", self.next)
    }

    fn answer(&mut self, name: &str) -> String {
        match self.called.iter().position(|(_, n)| n == name) {
            Some(i) => self.called.remove(i).0,
            None => self.call(),
        }
    }
}

/// Reads a `generateContent` request (`stream`: the method asked for one).
pub fn read_request(body: &[u8], stream: bool) -> Result<Request, Refusal> {
    let v: Value = serde_json::from_slice(body).map_err(|e| crate::protocol::bounds::json_error("request body", &e))?;
    let mut req = Request { stream, ..Request::default() };
    let mut ids = Ids::default();
    if let Some(system) = v.get("systemInstruction").or_else(|| v.get("system_instruction")) {
        let parts = system["parts"].as_array().map(Vec::as_slice).unwrap_or_default();
        for part in read_parts(parts, "systemInstruction", &mut ids, &mut req)? {
            if let Part::Text(text) = part {
                req.system.push(text);
            }
        }
    }
    for (i, content) in v["contents"].as_array().map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let role = match content["role"].as_str() {
            Some("model") => Role::Assistant,
            _ => Role::User,
        };
        let parts = content["parts"].as_array().map(Vec::as_slice).unwrap_or_default();
        let parts = read_parts(parts, &format!("contents[{i}]"), &mut ids, &mut req)?;
        if !parts.is_empty() {
            req.messages.push(super::super::turn::Message { role, parts });
        }
    }
    for (i, tool) in v["tools"].as_array().map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let Some(tool) = tool.as_object() else { continue };
        for (key, value) in tool {
            match key.as_str() {
                "functionDeclarations" | "function_declarations" => {
                    for f in value.as_array().map(Vec::as_slice).unwrap_or_default() {
                        let parameters = match (f.get("parametersJsonSchema"), f.get("parameters")) {
                            (Some(schema), _) => schema.clone(),
                            (None, Some(schema)) => json_schema(schema),
                            (None, None) => json!({"type": "object", "properties": {}}),
                        };
                        req.tools.push(Tool {
                            name: f["name"].as_str().unwrap_or_default().to_owned(),
                            description: f["description"].as_str().map(str::to_owned),
                            parameters,
                            custom: false,
                        });
                    }
                }
                other => {
                    let _ = i;
                    req.drop_note(format!("tool {other}"));
                }
            }
        }
    }
    let calling = &v["toolConfig"]["functionCallingConfig"];
    req.tool_choice = match calling["mode"].as_str() {
        Some("NONE") => Some(ToolChoice::None),
        Some("ANY") => match calling["allowedFunctionNames"].as_array().map(Vec::as_slice) {
            Some([one]) => one.as_str().map(|n| ToolChoice::Named(n.to_owned())),
            _ => Some(ToolChoice::Required),
        },
        Some("AUTO") | Some("VALIDATED") => Some(ToolChoice::Auto),
        _ => None,
    };
    let config = &v["generationConfig"];
    req.max_tokens = config["maxOutputTokens"].as_u64();
    req.temperature = config["temperature"].as_f64();
    req.top_p = config["topP"].as_f64();
    req.top_k = config["topK"].as_u64();
    req.stop = config["stopSequences"]
        .as_array()
        .map(|s| s.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if config["candidateCount"].as_u64().is_some_and(|n| n > 1) {
        return Err("generationConfig.candidateCount: more than one candidate cannot be translated".into());
    }
    let thinking = &config["thinkingConfig"];
    if thinking.is_object() {
        let budget = thinking["thinkingBudget"].as_i64();
        let effort = thinking["thinkingLevel"].as_str().map(str::to_ascii_lowercase);
        if budget != Some(0) && (budget.is_some() || effort.is_some()) {
            req.reasoning = Some(Reasoning {
                effort,
                budget: budget.and_then(|b| u64::try_from(b).ok()).filter(|b| *b > 0),
                hidden: thinking["includeThoughts"].as_bool() != Some(true),
            });
        }
    }
    for key in
        ["responseMimeType", "responseSchema", "responseJsonSchema", "seed", "presencePenalty", "frequencyPenalty"]
    {
        if config.get(key).is_some() {
            req.drop_note(format!("generationConfig.{key}"));
        }
    }
    if v.get("safetySettings").is_some() {
        req.drop_note("safetySettings");
    }
    if v.get("cachedContent").is_some() {
        return Err("cachedContent: a Gemini cache cannot be used by this model's target".into());
    }
    Ok(req)
}

/// A part with the signature that came with it (if any) put back.
fn signed(mut part: Value, signature: &mut Option<Value>) -> Value {
    if let (Some(sig), Some(obj)) = (signature.take(), part.as_object_mut()) {
        obj.insert(SIGNATURE.into(), sig);
    }
    part
}

/// Writes a `generateContent` body (the model is in the path, not here);
/// what Gemini cannot carry is noted in `req.dropped`.
pub fn write_request(req: &mut Request) -> Value {
    let mut names: Vec<(String, String)> = Vec::new();
    let mut contents = Vec::with_capacity(req.messages.len());
    let mut dropped: Vec<&'static str> = Vec::new();
    let mut system: Vec<Value> = req.system.iter().map(|t| json!({ "text": t })).collect();
    for m in &req.messages {
        let mut parts = Vec::with_capacity(m.parts.len());
        let mut signature: Option<Value> = None;
        for part in &m.parts {
            match part {
                Part::Text(t) if m.role == Role::System => system.push(json!({ "text": t })),
                Part::Text(t) => parts.push(signed(json!({ "text": t }), &mut signature)),
                Part::Image(Image::Data { media_type, data }) => {
                    parts.push(json!({"inlineData": {"mimeType": media_type, "data": data}}));
                }
                Part::Image(Image::Url(url)) => {
                    let media_type = if url.ends_with(".png") { "image/png" } else { "image/jpeg" };
                    parts.push(json!({"fileData": {"mimeType": media_type, "fileUri": url}}));
                }
                Part::Reasoning { opaque: Some(o), text } if o.from == Protocol::Gemini => {
                    if text.is_empty() {
                        signature = Some(o.value.clone());
                    } else {
                        parts.push(json!({"text": text, "thought": true, SIGNATURE: o.value}));
                    }
                }
                Part::Reasoning { opaque: Some(_), .. } => dropped.push("encrypted reasoning"),
                Part::Reasoning { opaque: None, text } if !text.is_empty() => dropped.push("earlier reasoning text"),
                Part::Reasoning { .. } => {}
                Part::ToolCall(call) => {
                    names.push((call.id.clone(), call.name.clone()));
                    let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                    let args = if args.is_object() { args } else { json!({ "input": args }) };
                    let call = json!({"functionCall": {"id": call.id, "name": call.name, "args": args}});
                    parts.push(signed(call, &mut signature));
                }
                Part::ToolResult { call_id, content, is_error } => {
                    let name = names.iter().find(|(id, _)| id == call_id).map_or(call_id.as_str(), |(_, n)| n);
                    let text: String = content
                        .iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(t.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    if content.iter().any(|p| matches!(p, Part::Image(_))) {
                        dropped.push("image in a tool result");
                    }
                    let key = if *is_error { "error" } else { "output" };
                    parts.push(json!({"functionResponse": {"id": call_id, "name": name, "response": { key: text }}}));
                }
            }
        }
        if parts.is_empty() {
            continue;
        }
        let role = if m.role == Role::Assistant { "model" } else { "user" };
        contents.push(json!({ "role": role, "parts": parts }));
    }
    for d in dropped {
        req.drop_note(d);
    }
    let mut out = Map::new();
    out.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        out.insert("systemInstruction".into(), json!({ "parts": system }));
    }
    if let Some(tools) = tools(req) {
        out.insert("tools".into(), tools);
    }
    let mode = match &req.tool_choice {
        Some(ToolChoice::Auto) => Some(json!({"mode": "AUTO"})),
        Some(ToolChoice::None) => Some(json!({"mode": "NONE"})),
        Some(ToolChoice::Required) => Some(json!({"mode": "ANY"})),
        Some(ToolChoice::Named(name)) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
        None => None,
    };
    if let Some(mode) = mode {
        out.insert("toolConfig".into(), json!({ "functionCallingConfig": mode }));
    }
    let config = generation_config(req);
    if req.parallel_tool_calls.is_some() {
        req.drop_note("parallel_tool_calls");
    }
    if req.user.is_some() {
        req.drop_note("user");
    }
    if !config.is_empty() {
        out.insert("generationConfig".into(), Value::Object(config));
    }
    Value::Object(out)
}

/// `generationConfig`: the sampling, the limits and the thinking asked.
fn generation_config(req: &Request) -> Map<String, Value> {
    let mut config = Map::new();
    if let Some(n) = req.max_tokens {
        config.insert("maxOutputTokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        config.insert("temperature".into(), t.into());
    }
    if let Some(p) = req.top_p {
        config.insert("topP".into(), p.into());
    }
    if let Some(k) = req.top_k {
        config.insert("topK".into(), k.into());
    }
    if !req.stop.is_empty() {
        config.insert("stopSequences".into(), json!(req.stop));
    }
    if let Some(r) = &req.reasoning {
        let mut thinking = Map::new();
        match (r.budget, &r.effort) {
            (Some(b), _) => thinking.insert("thinkingBudget".into(), b.into()),
            (None, Some(e)) => thinking.insert("thinkingBudget".into(), budget_of(e).into()),
            (None, None) => thinking.insert("thinkingBudget".into(), Value::from(-1)),
        };
        thinking.insert("includeThoughts".into(), Value::Bool(!r.hidden));
        config.insert("thinkingConfig".into(), Value::Object(thinking));
    }
    config
}

/// The tools offered, as function declarations.
fn tools(req: &Request) -> Option<Value> {
    if req.tools.is_empty() {
        return None;
    }
    let declarations: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            let mut f = json!({"name": t.name, "parametersJsonSchema": t.parameters});
            if let Some(d) = &t.description {
                f["description"] = Value::from(d.as_str());
            }
            f
        })
        .collect();
    Some(json!([{ "functionDeclarations": declarations }]))
}

/// A thinking budget for an effort word.
fn budget_of(effort: &str) -> i64 {
    match effort {
        "minimal" | "none" => 0,
        "low" => 2048,
        "medium" => 8192,
        "high" | "xhigh" => 24_576,
        _ => -1,
    }
}

/// The stop a `finishReason` stands for.
fn stop_of(reason: &str, tools: bool) -> Stop {
    match reason {
        "MAX_TOKENS" => Stop::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" | "LANGUAGE" => {
            Stop::Filtered
        }
        _ if tools => Stop::ToolUse,
        _ => Stop::End,
    }
}

/// The `finishReason` of a stop.
fn finish_reason(stop: &Stop) -> &'static str {
    match stop {
        Stop::Length => "MAX_TOKENS",
        Stop::Filtered => "SAFETY",
        Stop::End | Stop::ToolUse | Stop::Sequence(_) => "STOP",
    }
}

/// Takes a `usageMetadata` into `into` (see [`Usage::take_gemini`]).
fn take_usage(into: &mut Usage, v: &Value) {
    // Read from the tree in place (a `Value` deserializes by reference).
    if let Ok(u) = <UsageIn as serde::Deserialize>::deserialize(v) {
        into.take_gemini(u.prompt, u.candidates, u.thoughts, u.cached);
    }
}

fn usage_of(v: &Value) -> Tokens {
    let mut usage = Usage::default();
    take_usage(&mut usage, v);
    usage.into()
}

fn usage_value(u: &Tokens) -> Value {
    let candidates = u.output.saturating_sub(u.reasoning);
    let mut v = json!({"promptTokenCount": u.input, "candidatesTokenCount": candidates,
        "totalTokenCount": u.input + u.output});
    if u.cached > 0 {
        v["cachedContentTokenCount"] = u.cached.into();
    }
    if u.reasoning > 0 {
        v["thoughtsTokenCount"] = u.reasoning.into();
    }
    v
}

/// The parts of a candidate's content as the turn's parts (reasoning,
/// text, tool calls, each signature as an opaque before its part).
fn answer_parts(parts: &[Value], ids: &mut Ids) -> Vec<Part> {
    let mut req = Request::default();
    let mut out = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        match read_parts(std::slice::from_ref(p), "answer", ids, &mut req) {
            Ok(mut read) => out.append(&mut read),
            Err(_) => tracing::debug!(part = j, "an answer part with nothing translatable was left out"),
        }
    }
    out
}

/// Reads a whole `generateContent` answer.
pub fn read_answer(body: &[u8]) -> Option<Reply> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let candidates = v.get("candidates").and_then(Value::as_array);
    if candidates.is_none() && v.get("promptFeedback").is_none() {
        return None;
    }
    let candidate = candidates.and_then(|c| c.first());
    let mut ids = Ids::default();
    let parts =
        candidate.and_then(|c| c["content"]["parts"].as_array()).map(|p| answer_parts(p, &mut ids)).unwrap_or_default();
    let tools = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let stop = match candidate.and_then(|c| c["finishReason"].as_str()) {
        Some(reason) => stop_of(reason, tools),
        None if candidate.is_none() => Stop::Filtered,
        None => stop_of("STOP", tools),
    };
    Some(Reply {
        id: v["responseId"].as_str().unwrap_or_default().to_owned(),
        model: v["modelVersion"].as_str().unwrap_or_default().to_owned(),
        parts,
        stop,
        usage: usage_of(&v["usageMetadata"]),
    })
}

/// The parts of an answer as Gemini writes them (`reasoning`: the client
/// asked to see thoughts).
fn write_parts(parts: &[Part], reasoning: bool) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Part::Text(t) => out.push(json!({ "text": t })),
            Part::Reasoning { text, .. } if reasoning && !text.is_empty() => {
                out.push(json!({"text": text, "thought": true}));
            }
            Part::ToolCall(call) => out.push(call_part(call)),
            Part::Reasoning { .. } | Part::Image(_) | Part::ToolResult { .. } => {}
        }
    }
    out
}

fn call_part(call: &ToolCall) -> Value {
    let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({"functionCall": {"id": call.id, "name": call.name, "args": args}})
}

/// A whole answer in Gemini's shape.
pub fn write_answer(reply: &Reply, reasoning: bool) -> Value {
    json!({
        "candidates": [{
            "content": {"role": "model", "parts": write_parts(&reply.parts, reasoning)},
            "finishReason": finish_reason(&reply.stop),
            "index": 0,
        }],
        "usageMetadata": usage_value(&reply.usage),
        "modelVersion": reply.model,
        "responseId": reply.id,
    })
}

/// Gemini stream chunks into deltas: each chunk's parts in order (a
/// function call comes whole, in one chunk), its usage, and its finish
/// reason as the stop. Gemini has no terminal event: the stream's end
/// after a finish reason is the end ([`crate::translate::Stream::finish`]).
#[derive(Default)]
pub struct Reader {
    started: bool,
    calls: u32,
    ids: Ids,
    /// The counts so far (every chunk may carry them).
    usage: Usage,
}

impl StreamReader for Reader {
    /// Reads one chunk's `data`.
    fn read(&mut self, _name: Option<&str>, data: &str, out: &mut Vec<Delta>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else { return };
        if let Some(error) = v.get("error") {
            out.push(Delta::Error {
                status: super::status_of(error).unwrap_or(500),
                message: error["message"].as_str().unwrap_or("the provider failed mid-stream").to_owned(),
            });
            return;
        }
        if !self.started {
            self.started = true;
            out.push(Delta::Start {
                id: v["responseId"].as_str().unwrap_or_default().to_owned(),
                model: v["modelVersion"].as_str().unwrap_or_default().to_owned(),
            });
        }
        let candidate = v["candidates"].get(0);
        let parts = candidate.and_then(|c| c["content"]["parts"].as_array()).map(Vec::as_slice).unwrap_or_default();
        let mut tools = false;
        for part in answer_parts(parts, &mut self.ids) {
            match part {
                Part::Text(t) => out.push(Delta::Text(t)),
                Part::Reasoning { text, opaque } => {
                    if !text.is_empty() {
                        out.push(Delta::Reasoning(text));
                    }
                    if let Some(o) = opaque {
                        out.push(Delta::Opaque(o));
                    }
                }
                Part::ToolCall(call) => {
                    tools = true;
                    let index = self.calls;
                    self.calls += 1;
                    out.push(Delta::ToolCall { index, id: call.id, name: call.name });
                    out.push(Delta::ToolArgs { index, args: call.arguments });
                }
                Part::Image(_) | Part::ToolResult { .. } => {}
            }
        }
        if let Some(u) = v.get("usageMetadata") {
            take_usage(&mut self.usage, u);
            out.push(Delta::Tokens(self.usage.into()));
        }
        if let Some(reason) = candidate.and_then(|c| c["finishReason"].as_str()) {
            out.push(Delta::Stop(stop_of(reason, tools || self.calls > 0)));
        } else if candidate.is_none() && v.get("promptFeedback").is_some() {
            out.push(Delta::Stop(Stop::Filtered));
        }
    }
}

/// Deltas into Gemini stream chunks: text and thoughts as they come,
/// tool calls whole (reassembled), and a last chunk with the finish
/// reason and usage.
pub struct Writer {
    reasoning: bool,
    id: String,
    model: String,
    calls: Calls,
    usage: Tokens,
    stop: Option<Stop>,
    done: bool,
}

impl Writer {
    /// A writer for a client that asked (or not) to see thoughts.
    pub fn new(reasoning: bool) -> Self {
        Self {
            reasoning,
            id: String::new(),
            model: String::new(),
            calls: Calls::default(),
            usage: Tokens::default(),
            stop: None,
            done: false,
        }
    }

    fn chunk(&self, parts: Vec<Value>, finish: Option<&str>, out: &mut BytesMut) {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(reason) = finish {
            candidate["finishReason"] = Value::from(reason);
        }
        let mut v = json!({"candidates": [candidate], "modelVersion": self.model, "responseId": self.id});
        if finish.is_some() {
            v["usageMetadata"] = usage_value(&self.usage);
        }
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(b"data: ");
        crate::protocol::json::put_value(&mut bytes, &v);
        bytes.extend_from_slice(b"\r\n\r\n");
        out.put_slice(&bytes);
    }
}

impl StreamWriter for Writer {
    const PROTOCOL: Protocol = Protocol::Gemini;
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
                self.id = id;
                self.model = model;
            }
            Delta::Text(text) => self.chunk(vec![json!({ "text": text })], None, out),
            Delta::Reasoning(text) if self.reasoning => {
                self.chunk(vec![json!({"text": text, "thought": true})], None, out);
            }
            Delta::Reasoning(_) | Delta::Opaque(_) => {}
            Delta::Tokens(u) => self.usage = u,
            Delta::Stop(stop) => self.stop = Some(stop),
            // The trait's `write` ends the stream and holds the calls.
            Delta::Done | Delta::Error { .. } | Delta::ToolCall { .. } | Delta::ToolArgs { .. } => {}
        }
    }

    /// The last chunk: the tool calls, the finish reason, the usage.
    fn end(&mut self, out: &mut BytesMut) {
        let parts: Vec<Value> = self.calls.take().iter().map(call_part).collect();
        let stop = self.stop.take().unwrap_or_default();
        self.chunk(parts, Some(finish_reason(&stop)), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_and_writes_back() {
        let body = br#"{"systemInstruction":{"parts":[{"text":"be brief"}]},
            "contents":[{"role":"user","parts":[{"text":"list files"}]},
              {"role":"model","parts":[{"functionCall":{"name":"ls","args":{"dir":"."}},"thoughtSignature":"c2ln"}]},
              {"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"output":"a.txt"}}}]}],
            "tools":[{"functionDeclarations":[{"name":"ls","parameters":{"type":"OBJECT","properties":{"dir":{"type":"STRING"}}}}]}],
            "generationConfig":{"maxOutputTokens":64,"thinkingConfig":{"thinkingBudget":128,"includeThoughts":true}}}"#;
        let mut req = read_request(body, true).unwrap();
        assert!(req.stream);
        assert_eq!(req.system, ["be brief"]);
        assert_eq!(req.tools[0].parameters["properties"]["dir"]["type"], "string");
        let Part::ToolCall(call) = &req.messages[1].parts[1] else { panic!("{:?}", req.messages[1]) };
        let Part::ToolResult { call_id, content, .. } = &req.messages[2].parts[0] else { panic!() };
        assert_eq!(call_id, &call.id, "the response pairs with its call");
        assert_eq!(content, &[Part::Text("a.txt".into())]);
        assert_eq!(req.reasoning.as_ref().and_then(|r| r.budget), Some(128));
        // Back to Gemini: the signature on the call it came with, byte for byte.
        let out = write_request(&mut req);
        assert_eq!(out["contents"][1]["parts"][0]["thoughtSignature"], "c2ln");
        assert_eq!(out["contents"][2]["parts"][0]["functionResponse"]["name"], "ls");
        assert_eq!(out["generationConfig"]["maxOutputTokens"], 64);
    }

    #[test]
    fn a_stream_reads_into_deltas_and_writes_back() {
        let mut reader = Reader::default();
        let mut deltas = Vec::new();
        reader.read(
            None,
            r#"{"candidates":[{"content":{"parts":[{"text":"hi"}]}}],"responseId":"r1","modelVersion":"g"}"#,
            &mut deltas,
        );
        reader.read(
            None,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"a":1}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":4}}"#,
            &mut deltas,
        );
        assert_eq!(deltas[0], Delta::Start { id: "r1".into(), model: "g".into() });
        assert_eq!(deltas[1], Delta::Text("hi".into()));
        assert!(matches!(&deltas[2], Delta::ToolCall { name, .. } if name == "f"));
        assert_eq!(deltas.last(), Some(&Delta::Stop(Stop::ToolUse)));
        let mut writer = Writer::new(false);
        let mut out = BytesMut::new();
        for d in deltas {
            writer.write(d, &mut out);
        }
        writer.finish(&mut out);
        let text = String::from_utf8(out.to_vec()).unwrap();
        let chunks: Vec<Value> =
            text.split("\r\n\r\n").filter(|c| !c.is_empty()).map(|c| serde_json::from_str(&c[6..]).unwrap()).collect();
        assert_eq!(chunks[0]["candidates"][0]["content"]["parts"][0]["text"], "hi");
        assert_eq!(chunks[1]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"]["a"], 1);
        assert_eq!(chunks[1]["candidates"][0]["finishReason"], "STOP");
        assert_eq!(chunks[1]["usageMetadata"]["totalTokenCount"], 7);
    }
}
