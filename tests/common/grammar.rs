//! Each client protocol's stream grammar, checked: what a translated
//! stream must be whatever the target sent. A checker returns what the
//! stream said (text, reasoning, tool calls, how it ended) or the first
//! rule it broke.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use tidegate::protocol::Protocol;

/// What a well-formed stream said.
#[derive(Debug, Default, PartialEq)]
pub struct Said {
    /// Answer text, joined.
    pub text: String,
    /// Reasoning text, joined.
    pub reasoning: String,
    /// Tool calls: (name, arguments as JSON text, custom).
    pub calls: Vec<(String, String, bool)>,
    /// Ended with the protocol's terminal event (else its error event).
    pub completed: bool,
    /// The error message, when it ended with one.
    pub error: Option<String>,
    /// Output tokens reported, if any.
    pub output_tokens: Option<u64>,
    /// Input tokens reported (cached ones included, whatever the
    /// protocol's own count leaves out), if any.
    pub input_tokens: Option<u64>,
}

/// An Anthropic `usage`'s input: its `input_tokens` leaves the cache's out.
pub fn anthropic_input(u: &Value) -> Option<u64> {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    u["input_tokens"].as_u64().map(|i| i + n("cache_read_input_tokens") + n("cache_creation_input_tokens"))
}

/// Splits SSE text into (event name, data) pairs.
pub fn events(text: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    for block in text.replace("\r\n", "\n").split("\n\n") {
        let mut name = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !data.is_empty() {
            out.push((name, data.join("\n")));
        }
    }
    out
}

/// Checks `text` as a stream of `protocol`.
pub fn check(protocol: Protocol, text: &str) -> Result<Said, String> {
    match protocol {
        Protocol::Anthropic => anthropic(text),
        Protocol::OpenAiChat => chat(text),
        Protocol::OpenAiResponses => responses(text),
        Protocol::Gemini => gemini(text),
    }
}

/// Gemini: `data:` chunks of `GenerateContentResponse`s, no terminal
/// event; the answer ends with a candidate's `finishReason` (nothing after
/// it), or with an `{"error":…}` chunk.
fn gemini(text: &str) -> Result<Said, String> {
    let mut said = Said::default();
    for (k, (name, data)) in events(text).iter().enumerate() {
        if said.completed || said.error.is_some() {
            return Err(format!("chunk {k} after the end"));
        }
        if name.is_some() {
            return Err(format!("chunk {k}: Gemini events have no name"));
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk {k} is not JSON: {e}"))?;
        if let Some(e) = v.get("error") {
            said.error = Some(e["message"].as_str().unwrap_or_default().to_owned());
            continue;
        }
        let candidate = v["candidates"].get(0).ok_or(format!("chunk {k}: no candidate"))?;
        for p in candidate["content"]["parts"].as_array().into_iter().flatten() {
            match (p["text"].as_str(), p["thought"].as_bool(), p.get("functionCall")) {
                (Some(t), Some(true), _) => said.reasoning.push_str(t),
                (Some(t), _, _) => said.text.push_str(t),
                (None, _, Some(c)) => {
                    if !c["args"].is_object() {
                        return Err(format!("chunk {k}: functionCall args not an object"));
                    }
                    said.calls.push((c["name"].as_str().unwrap_or_default().to_owned(), c["args"].to_string(), false));
                }
                _ => return Err(format!("chunk {k}: a part with neither text nor a call: {p}")),
            }
        }
        if candidate.get("finishReason").is_some() {
            said.completed = true;
            said.output_tokens = v["usageMetadata"]["candidatesTokenCount"].as_u64();
            said.input_tokens = v["usageMetadata"]["promptTokenCount"].as_u64();
        }
    }
    Ok(said)
}

fn anthropic(text: &str) -> Result<Said, String> {
    let mut said = Said::default();
    let mut open: Option<(u64, String)> = None;
    let mut next = 0u64;
    let mut started = false;
    let mut delta_seen = false;
    let all = events(text);
    for (k, (name, data)) in all.iter().enumerate() {
        let v: Value = serde_json::from_str(data).map_err(|e| format!("event {k} is not JSON: {e}: {data}"))?;
        let kind = v["type"].as_str().unwrap_or_default();
        if name.as_deref() != Some(kind) {
            return Err(format!("event {k}: name {name:?} but type {kind:?}"));
        }
        if said.completed || said.error.is_some() {
            return Err(format!("event {k} ({kind}) after the end"));
        }
        if !started && kind != "message_start" && kind != "error" {
            return Err(format!("event {k}: {kind} before message_start"));
        }
        match kind {
            "message_start" if started => return Err("a second message_start".into()),
            "message_start" => {
                started = true;
                said.input_tokens = anthropic_input(&v["message"]["usage"]);
            }
            "ping" => {}
            "content_block_start" => {
                if open.is_some() {
                    return Err(format!("event {k}: a block opened while block {open:?} is open"));
                }
                let index = v["index"].as_u64().ok_or("block without index")?;
                if index != next {
                    return Err(format!("event {k}: block index {index}, expected {next}"));
                }
                let block = &v["content_block"];
                let t = block["type"].as_str().unwrap_or_default().to_owned();
                if t == "tool_use" {
                    said.calls.push((block["name"].as_str().unwrap_or_default().to_owned(), String::new(), false));
                }
                open = Some((index, t));
            }
            "content_block_delta" => {
                let Some((index, t)) = &open else { return Err(format!("event {k}: a delta outside a block")) };
                if v["index"].as_u64() != Some(*index) {
                    return Err(format!("event {k}: delta for block {} while {index} is open", v["index"]));
                }
                let d = &v["delta"];
                match (t.as_str(), d["type"].as_str().unwrap_or_default()) {
                    ("text", "text_delta") => said.text.push_str(d["text"].as_str().unwrap_or_default()),
                    ("thinking", "thinking_delta") => {
                        said.reasoning.push_str(d["thinking"].as_str().unwrap_or_default())
                    }
                    ("thinking", "signature_delta") => {}
                    ("tool_use", "input_json_delta") => {
                        said.calls.last_mut().unwrap().1.push_str(d["partial_json"].as_str().unwrap_or_default())
                    }
                    (block, delta) => return Err(format!("event {k}: a {delta} in a {block} block")),
                }
            }
            "content_block_stop" => {
                let Some((index, t)) = open.take() else { return Err(format!("event {k}: stop without a block")) };
                if v["index"].as_u64() != Some(index) {
                    return Err(format!("event {k}: stop for {} while {index} is open", v["index"]));
                }
                if t == "tool_use" {
                    let args = &said.calls.last().unwrap().1;
                    serde_json::from_str::<Value>(args).map_err(|e| format!("tool arguments {args:?}: {e}"))?;
                }
                next += 1;
            }
            "message_delta" => {
                if open.is_some() || delta_seen {
                    return Err(format!("event {k}: message_delta with a block open or twice"));
                }
                delta_seen = true;
                said.output_tokens = v["usage"]["output_tokens"].as_u64();
                // Said again with the output (a client reads the later);
                // else as message_start said it.
                if let Some(input) = anthropic_input(&v["usage"]) {
                    said.input_tokens = Some(input);
                }
                if !said.calls.is_empty() && v["delta"]["stop_reason"] != "tool_use" {
                    return Err(format!("tool calls, but stop_reason {}", v["delta"]["stop_reason"]));
                }
            }
            "message_stop" => {
                if !delta_seen {
                    return Err("message_stop without message_delta".into());
                }
                said.completed = true;
            }
            "error" => said.error = Some(v["error"]["message"].as_str().unwrap_or_default().to_owned()),
            other => return Err(format!("event {k}: unknown type {other}")),
        }
    }
    if !said.completed && said.error.is_none() {
        return Err("ended without message_stop or error".into());
    }
    Ok(said)
}

fn chat(text: &str) -> Result<Said, String> {
    let mut said = Said::default();
    let mut finished = false;
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut id: Option<String> = None;
    for (k, (_, data)) in events(text).iter().enumerate() {
        if said.completed || said.error.is_some() {
            return Err(format!("event {k} after the end"));
        }
        if data == "[DONE]" {
            if !finished {
                return Err("[DONE] without a finish_reason".into());
            }
            said.completed = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk {k} is not JSON: {e}"))?;
        if let Some(e) = v.get("error") {
            said.error = Some(e["message"].as_str().unwrap_or_default().to_owned());
            continue;
        }
        if v["object"] != "chat.completion.chunk" {
            return Err(format!("chunk {k}: object {}", v["object"]));
        }
        let this = v["id"].as_str().unwrap_or_default().to_owned();
        if id.get_or_insert_with(|| this.clone()) != &this {
            return Err(format!("chunk {k}: id changed"));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            said.output_tokens = u["completion_tokens"].as_u64();
            said.input_tokens = u["prompt_tokens"].as_u64();
        }
        let Some(choice) = v["choices"].get(0) else { continue };
        if finished {
            return Err(format!("chunk {k}: content after the finish_reason"));
        }
        let d = &choice["delta"];
        said.text.push_str(d["content"].as_str().unwrap_or_default());
        said.reasoning.push_str(d["reasoning_content"].as_str().unwrap_or_default());
        for c in d["tool_calls"].as_array().into_iter().flatten() {
            let index = c["index"].as_u64().ok_or("tool call without index")? as usize;
            if index == calls.len() {
                let name = c["function"]["name"].as_str().ok_or("a new tool call without a name")?;
                if c["id"].as_str().is_none() {
                    return Err("a new tool call without an id".into());
                }
                calls.push((name.to_owned(), String::new()));
            } else if index > calls.len() {
                return Err(format!("tool call index {index} skips {}", calls.len()));
            }
            calls[index].1.push_str(c["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finished = true;
            if !calls.is_empty() && reason != "tool_calls" {
                return Err(format!("tool calls, but finish_reason {reason}"));
            }
        }
    }
    if !said.completed && said.error.is_none() {
        return Err("ended without [DONE] or an error".into());
    }
    for (name, args) in calls {
        serde_json::from_str::<Value>(&args).map_err(|e| format!("tool arguments {args:?}: {e}"))?;
        said.calls.push((name, args, false));
    }
    Ok(said)
}

fn responses(text: &str) -> Result<Said, String> {
    let mut said = Said::default();
    let mut seq: Option<u64> = None;
    let mut open: Vec<(u64, String)> = Vec::new();
    let mut done_items: Vec<Value> = Vec::new();
    let mut started = false;
    for (k, (name, data)) in events(text).iter().enumerate() {
        let v: Value = serde_json::from_str(data).map_err(|e| format!("event {k} is not JSON: {e}"))?;
        let kind = v["type"].as_str().unwrap_or_default();
        if name.as_deref() != Some(kind) {
            return Err(format!("event {k}: name {name:?} but type {kind:?}"));
        }
        if said.completed || (said.error.is_some() && kind != "error") {
            return Err(format!("event {k} ({kind}) after the end"));
        }
        if let Some(n) = v["sequence_number"].as_u64() {
            if seq.is_some_and(|s| n <= s) {
                return Err(format!("event {k}: sequence_number {n} after {seq:?}"));
            }
            seq = Some(n);
        }
        if !started && kind != "response.created" && kind != "response.failed" && kind != "error" {
            return Err(format!("event {k}: {kind} before response.created"));
        }
        match kind {
            "response.created" => started = true,
            "response.in_progress"
            | "response.content_part.added"
            | "response.content_part.done"
            | "response.reasoning_summary_part.added"
            | "response.reasoning_summary_part.done"
            | "response.output_text.done"
            | "response.reasoning_summary_text.done"
            | "response.function_call_arguments.done"
            | "response.custom_tool_call_input.done" => {}
            "response.output_item.added" => {
                let at = v["output_index"].as_u64().ok_or("item without output_index")?;
                if at != (done_items.len() + open.len()) as u64 {
                    return Err(format!("event {k}: output_index {at} out of order"));
                }
                open.push((at, v["item"]["id"].as_str().unwrap_or_default().to_owned()));
            }
            "response.output_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.function_call_arguments.delta"
            | "response.custom_tool_call_input.delta" => {
                let id = v["item_id"].as_str().unwrap_or_default();
                if !open.iter().any(|(_, i)| i == id) {
                    return Err(format!("event {k}: {kind} for item {id:?} that is not open"));
                }
                let delta = v["delta"].as_str().unwrap_or_default();
                match kind {
                    "response.output_text.delta" => said.text.push_str(delta),
                    "response.reasoning_summary_text.delta" => said.reasoning.push_str(delta),
                    _ => {}
                }
            }
            "response.output_item.done" => {
                let id = v["item"]["id"].as_str().unwrap_or_default();
                let Some(at) = open.iter().position(|(_, i)| i == id) else {
                    return Err(format!("event {k}: item {id:?} done but not open"));
                };
                open.remove(at);
                let item = v["item"].clone();
                match item["type"].as_str() {
                    Some("function_call") => {
                        let args = item["arguments"].as_str().unwrap_or_default();
                        serde_json::from_str::<Value>(args).map_err(|e| format!("arguments {args:?}: {e}"))?;
                        said.calls.push((item["name"].as_str().unwrap_or_default().to_owned(), args.to_owned(), false));
                    }
                    Some("custom_tool_call") => said.calls.push((
                        item["name"].as_str().unwrap_or_default().to_owned(),
                        item["input"].as_str().unwrap_or_default().to_owned(),
                        true,
                    )),
                    _ => {}
                }
                done_items.push(item);
            }
            "response.completed" | "response.incomplete" => {
                if !open.is_empty() {
                    return Err(format!("{kind} with items open: {open:?}"));
                }
                let output = v["response"]["output"].as_array().cloned().unwrap_or_default();
                if output != done_items {
                    return Err(format!("{kind}: its output differs from the items done"));
                }
                said.output_tokens = v["response"]["usage"]["output_tokens"].as_u64();
                said.input_tokens = v["response"]["usage"]["input_tokens"].as_u64();
                said.completed = true;
            }
            "response.failed" => {
                said.error = Some(v["response"]["error"]["message"].as_str().unwrap_or_default().to_owned())
            }
            "error" => {
                said.error.get_or_insert_with(|| v["message"].as_str().unwrap_or_default().to_owned());
            }
            other => return Err(format!("event {k}: unknown type {other}")),
        }
    }
    if !said.completed && said.error.is_none() {
        return Err("ended without response.completed or a failure".into());
    }
    Ok(said)
}
