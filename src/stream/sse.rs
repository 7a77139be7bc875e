//! Server-sent events, read without being rewritten.
//!
//! [`Scanner`] accumulates upstream bytes, finds complete events, and says
//! what each one is (content, error, end, keep-alive) for the protocol at
//! hand, collecting the streamed text and token usage on the way. The bytes
//! themselves are forwarded exactly as received.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::protocol::Protocol;

/// What one event is, as far as relaying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `: comment` lines only, or an Anthropic `ping`: keep-alive.
    KeepAlive,
    /// Anthropic `message_start`: opens the answer, carries no content.
    Start,
    /// Anthropic `content_block_start`: opens a block of the answer.
    BlockStart,
    /// Anything that carries or continues the answer.
    Content,
    /// An error object (OpenAI `{"error":...}`, Anthropic `event: error`).
    Error,
    /// The protocol's end marker (`[DONE]`, `message_stop`).
    Done,
}

/// Token counts reported in the stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt / input tokens.
    pub input: Option<u64>,
    /// Completion / output tokens.
    pub output: Option<u64>,
}

/// What the stream has said so far.
#[derive(Debug, Default)]
pub struct Seen {
    /// Text streamed so far (capped).
    pub text: String,
    /// Token usage seen so far.
    pub usage: Usage,
    /// A content event has been seen.
    pub content: bool,
    /// A tool call is being streamed (no resume possible).
    pub tool_call: bool,
    /// The answer finished properly (end marker or finish reason).
    pub complete: bool,
    /// Data of the first error event, if any.
    pub error: Option<Bytes>,
    /// Content events seen.
    pub events: u64,
}

/// Incremental SSE reader for one stream.
#[derive(Debug)]
pub struct Scanner {
    protocol: Protocol,
    /// Bytes received and not yet handed out.
    pending: BytesMut,
    /// Offset in `pending` up to which complete events were scanned.
    scanned: usize,
    text_cap: usize,
    /// What the events said.
    pub seen: Seen,
}

impl Scanner {
    /// A scanner keeping up to `text_cap` bytes of streamed text.
    pub fn new(protocol: Protocol, text_cap: usize) -> Self {
        Self { protocol, pending: BytesMut::new(), scanned: 0, text_cap, seen: Seen::default() }
    }

    /// Appends received bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// Bytes held (scanned or not) and not yet taken.
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Scans the next complete event in `pending`; returns its kind and the
    /// offset just past it, or `None` when no complete event is left.
    pub fn next_event(&mut self) -> Option<(Kind, usize)> {
        let start = self.scanned;
        let len = event_end(&self.pending[start..])?;
        let end = start + len;
        self.scanned = end;
        let kind = inspect(&mut self.seen, self.protocol, self.text_cap, &self.pending[start..end]);
        Some((kind, end))
    }

    /// Drops everything not yet taken (after an error event: nothing more
    /// of this stream is relayed).
    pub fn discard(&mut self) {
        self.pending.clear();
        self.scanned = 0;
    }

    /// Takes the first `upto` bytes of `pending` (complete, scanned events).
    pub fn take(&mut self, upto: usize) -> Bytes {
        let out = self.pending.split_to(upto.min(self.pending.len())).freeze();
        self.scanned = self.scanned.saturating_sub(out.len());
        out
    }
}

fn inspect(seen: &mut Seen, protocol: Protocol, text_cap: usize, raw: &[u8]) -> Kind {
    let text = String::from_utf8_lossy(raw);
    let mut name: Option<&str> = None;
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if data.is_empty() && name.is_none() {
        return Kind::KeepAlive;
    }
    let data: Cow<'_, str> = if data.len() == 1 { Cow::Borrowed(data[0]) } else { Cow::Owned(data.join("\n")) };
    let mut text_sink = TextSink { text: &mut seen.text, cap: text_cap };
    let kind = match protocol {
        Protocol::OpenAi => {
            openai(&mut text_sink, &mut seen.usage, &mut seen.tool_call, &mut seen.complete, name, &data)
        }
        Protocol::Anthropic => anthropic(&mut text_sink, &mut seen.usage, &mut seen.tool_call, name, &data),
    };
    match kind {
        Kind::Content => {
            seen.content = true;
            seen.events += 1;
        }
        Kind::Error if seen.error.is_none() => seen.error = Some(Bytes::copy_from_slice(data.as_bytes())),
        Kind::Done => seen.complete = true,
        Kind::Error | Kind::KeepAlive | Kind::Start | Kind::BlockStart => {}
    }
    kind
}

struct TextSink<'a> {
    text: &'a mut String,
    cap: usize,
}

impl TextSink<'_> {
    fn push(&mut self, s: &str) {
        let room = self.cap.saturating_sub(self.text.len());
        if room == 0 {
            return;
        }
        let mut cut = s.len().min(room);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&s[..cut]);
    }
}

fn openai(
    text: &mut TextSink<'_>,
    usage: &mut Usage,
    tool_call: &mut bool,
    complete: &mut bool,
    name: Option<&str>,
    data: &str,
) -> Kind {
    if name == Some("error") {
        return Kind::Error;
    }
    if data.trim() == "[DONE]" {
        return Kind::Done;
    }
    let Ok(chunk) = serde_json::from_str::<OaChunk<'_>>(data) else {
        return Kind::Content;
    };
    if chunk.error.is_some() || (chunk.choices.is_empty() && chunk.usage.is_none() && is_vendor_error(data)) {
        return Kind::Error;
    }
    if let Some(u) = chunk.usage {
        usage.input = u.prompt_tokens.or(usage.input);
        usage.output = u.completion_tokens.or(usage.output);
    }
    for choice in &chunk.choices {
        if let Some(delta) = &choice.delta {
            if let Some(c) = &delta.content {
                text.push(c);
            }
            if delta.tool_calls.is_some() {
                *tool_call = true;
            }
        }
        if choice.finish_reason.is_some() {
            *complete = true;
        }
    }
    Kind::Content
}

/// A chunk with no `choices` that is an error object in a vendor's own
/// shape (`{"error_code":"TM.00001041","error_msg":...}`,
/// `{"code":..,"message":..}`): a key starting with "error", or a code
/// with a message. Only chunks without `choices` get here.
fn is_vendor_error(data: &str) -> bool {
    let Ok(map) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(data) else { return false };
    let has = |k: &str| map.keys().any(|key| key.eq_ignore_ascii_case(k));
    map.keys().any(|k| k.to_ascii_lowercase().starts_with("error"))
        || ((has("code") || has("status")) && (has("message") || has("msg")))
}

fn anthropic(text: &mut TextSink<'_>, usage: &mut Usage, tool_call: &mut bool, name: Option<&str>, data: &str) -> Kind {
    let event = serde_json::from_str::<AnEvent<'_>>(data).ok();
    let kind = name.map(str::to_owned).or_else(|| event.as_ref().map(|e| e.kind.to_string()));
    let Some(kind) = kind else { return Kind::Content };
    match kind.as_str() {
        "ping" => return Kind::KeepAlive,
        "error" => return Kind::Error,
        "message_stop" => return Kind::Done,
        _ => {}
    }
    let Some(event) = event else { return Kind::Content };
    if let Some(u) = event.message.as_ref().and_then(|m| m.usage.as_ref()).or(event.usage.as_ref()) {
        usage.input = u.input_tokens.or(usage.input);
        usage.output = u.output_tokens.or(usage.output);
    }
    if let Some(delta) = &event.delta {
        if let Some(t) = &delta.text {
            text.push(t);
        }
        if delta.partial_json.is_some() {
            *tool_call = true;
        }
    }
    if event.content_block.as_ref().is_some_and(|b| b.kind == "tool_use") {
        *tool_call = true;
    }
    match kind.as_str() {
        "message_start" => Kind::Start,
        "content_block_start" => Kind::BlockStart,
        _ => Kind::Content,
    }
}

/// Token usage from the end of a JSON answer (`usage` is its last field
/// for both protocols), without parsing the whole body.
pub fn usage_in_json(tail: &[u8]) -> Usage {
    let text = String::from_utf8_lossy(tail);
    let number = |key: &str| {
        let at = text.rfind(key)? + key.len();
        let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    Usage {
        input: number("\"prompt_tokens\"").or_else(|| number("\"input_tokens\"")),
        output: number("\"completion_tokens\"").or_else(|| number("\"output_tokens\"")),
    }
}

/// Length of the first complete event in `buf` (separator included).
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            match (buf.get(i + 1), buf.get(i + 2)) {
                (Some(b'\n'), _) => return Some(i + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

#[derive(Deserialize)]
struct OaChunk<'a> {
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Vec<OaChoice<'a>>,
    #[serde(default)]
    usage: Option<OaUsage>,
}

#[derive(Deserialize)]
struct OaChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<OaDelta<'a>>,
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct OaDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct OaUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct AnEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    delta: Option<AnDelta<'a>>,
    #[serde(default)]
    usage: Option<AnUsage>,
    #[serde(default)]
    message: Option<AnMessage>,
    #[serde(borrow, default)]
    content_block: Option<AnBlock<'a>>,
}

#[derive(Deserialize)]
struct AnDelta<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    partial_json: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct AnBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct AnMessage {
    #[serde(default)]
    usage: Option<AnUsage>,
}

#[derive(Deserialize)]
struct AnUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::sse_frames;

    fn scan_all(protocol: Protocol, bytes: &[u8], chunk: usize) -> (Scanner, Vec<Kind>) {
        let mut s = Scanner::new(protocol, 1 << 20);
        let mut kinds = Vec::new();
        for piece in bytes.chunks(chunk) {
            s.feed(piece);
            while let Some((kind, _)) = s.next_event() {
                kinds.push(kind);
            }
        }
        (s, kinds)
    }

    #[test]
    fn openai_stream_any_chunking() {
        let bytes: Vec<u8> = sse_frames(Protocol::OpenAi, "m", 3).concat();
        for chunk in [1, 7, 64, 10_000] {
            let (s, kinds) = scan_all(Protocol::OpenAi, &bytes, chunk);
            assert_eq!(kinds.first(), Some(&Kind::Content));
            assert_eq!(kinds.last(), Some(&Kind::Done));
            assert_eq!(s.seen.text, "tok0 tok1 tok2 ");
            assert!(s.seen.complete);
            assert!(s.seen.error.is_none());
        }
    }

    #[test]
    fn anthropic_stream_kinds_text_and_usage() {
        let bytes: Vec<u8> = sse_frames(Protocol::Anthropic, "m", 2).concat();
        let (s, kinds) = scan_all(Protocol::Anthropic, &bytes, 13);
        assert_eq!(kinds[0], Kind::Start);
        assert_eq!(kinds[2], Kind::KeepAlive);
        assert_eq!(*kinds.last().unwrap(), Kind::Done);
        assert_eq!(s.seen.text, "tok0 tok1 ");
        assert_eq!(s.seen.usage, Usage { input: Some(10), output: Some(2) });
    }

    #[test]
    fn vendor_error_objects_are_errors_usage_chunks_are_not() {
        let vendor = br#"data: {"error_code":"TM.00001041","error_msg":"3 sessions max"}

"#;
        let (s, kinds) = scan_all(Protocol::OpenAi, vendor, 7);
        assert_eq!(kinds, vec![Kind::Error]);
        assert!(s.seen.error.is_some());
        let coded = b"data: {\"code\":1302,\"msg\":\"busy\"}\n\n";
        assert_eq!(scan_all(Protocol::OpenAi, coded, 64).1, vec![Kind::Error]);
        let usage = b"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
        assert_eq!(scan_all(Protocol::OpenAi, usage, 64).1, vec![Kind::Content]);
    }

    #[test]
    fn errors_comments_and_crlf() {
        let mut s = Scanner::new(Protocol::OpenAi, 100);
        s.feed(b": keep-alive\r\n\r\ndata: {\"error\":{\"message\":\"busy\"}}\n\ndata: [DONE]\n\n");
        assert_eq!(s.next_event().map(|e| e.0), Some(Kind::KeepAlive));
        assert_eq!(s.next_event().map(|e| e.0), Some(Kind::Error));
        assert_eq!(s.seen.error.as_deref(), Some(&br#"{"error":{"message":"busy"}}"#[..]));
        assert_eq!(s.next_event().map(|e| e.0), Some(Kind::Done));
        assert_eq!(s.next_event(), None);

        let mut a = Scanner::new(Protocol::Anthropic, 100);
        a.feed(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
        assert_eq!(a.next_event().map(|e| e.0), Some(Kind::Error));
    }

    #[test]
    fn take_hands_out_scanned_bytes_only() {
        let mut s = Scanner::new(Protocol::OpenAi, 100);
        s.feed(b"data: {\"choices\":[]}\n\ndata: {\"cho");
        let (_, end) = s.next_event().unwrap();
        assert!(s.next_event().is_none());
        assert_eq!(&s.take(end)[..], b"data: {\"choices\":[]}\n\n");
        s.feed(b"ices\":[]}\n\n");
        let (_, end) = s.next_event().unwrap();
        assert_eq!(&s.take(end)[..], b"data: {\"choices\":[]}\n\n");
    }

    #[test]
    fn usage_from_json_answers() {
        let oa = br#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(usage_in_json(oa), Usage { input: Some(12), output: Some(34) });
        let an = br#"{"content":[],"usage":{"input_tokens": 7, "output_tokens": 9}}"#;
        assert_eq!(usage_in_json(an), Usage { input: Some(7), output: Some(9) });
        assert_eq!(usage_in_json(b"{}"), Usage::default());
    }

    #[test]
    fn text_cap_respects_char_boundaries() {
        let mut s = Scanner::new(Protocol::OpenAi, 4);
        s.feed("data: {\"choices\":[{\"delta\":{\"content\":\"héllo\"}}]}\n\n".as_bytes());
        s.next_event();
        assert_eq!(s.seen.text, "hél");
    }
}
