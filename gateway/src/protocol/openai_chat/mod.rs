//! OpenAI chat completions (`POST /v1/chat/completions`): error shape,
//! model list, and the stream's grammar — `data: {chunk}` events, a chunk
//! with `finish_reason` ends the answer, `data: [DONE]` ends the stream.
//! Also the error shape of every OpenAI-family endpoint (embeddings, the
//! Responses API's HTTP errors).

pub mod stream;
pub mod turn;

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

use super::ErrorKind;
use super::events::{Hole, HoleKind, Kind, Seen, Text, TextSink, sse_event, unreadable};
use super::walk::{Walk, once};

/// `{"error":{"message","type","param","code"}}`, the shape the OpenAI
/// SDKs parse into their typed exceptions.
pub fn error_body(kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
    Bytes::from(json!({"error": error_object(kind, message, code)}).to_string())
}

/// The inner error object, shared with the Responses API's events.
pub fn error_object(kind: ErrorKind, message: &str, code: Option<&str>) -> serde_json::Value {
    let kind = match kind {
        ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::TooLarge => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Permission => "permission_error",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api | ErrorKind::Overloaded => "api_error",
        ErrorKind::Timeout => "timeout_error",
    };
    json!({"message": message, "type": kind, "param": null, "code": code})
}

/// A mid-stream failure as the OpenAI SDKs read it: a last
/// `data: {"error":...}` (they raise on an `error` key), no `[DONE]`.
pub fn error_event(kind: ErrorKind, message: &str) -> Bytes {
    sse_event(None, &error_body(kind, message, None))
}

/// `GET /v1/models` answer listing the configured aliases.
pub fn models_list<'a>(aliases: impl Iterator<Item = &'a str>) -> Bytes {
    let data: Vec<_> =
        aliases.map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tidegate"})).collect();
    Bytes::from(json!({"object": "list", "data": data}).to_string())
}

/// What one chat-completions event is.
pub fn inspect(name: Option<&str>, data: &str, seen: &mut Seen, text_cap: usize) -> Kind {
    if name == Some("error") {
        return Kind::Error;
    }
    // `[DONE]`, perhaps padded; a chunk starts with `{` (checked first:
    // this runs for every event).
    if data.trim_start().starts_with('[') && data.trim() == "[DONE]" {
        return Kind::Done;
    }
    // The walker reads a usual chunk; serde_json whatever it gives up on.
    let walked = read_chunk(data, Some(seen.holes.start()));
    let whole = walked.is_some();
    let Some(chunk) = walked.or_else(|| serde_json::from_str::<Chunk<'_>>(data).ok()) else {
        return if unreadable(data) { Kind::Unreadable } else { Kind::Content };
    };
    if chunk.error.is_some() || (chunk.choices.count == 0 && chunk.usage.is_none() && is_vendor_error(data)) {
        return Kind::Error;
    }
    if let Some(u) = chunk.usage {
        u.take(&mut seen.usage);
    }
    let choices = chunk.choices;
    if let Some(c) = &choices.text {
        TextSink { text: &mut seen.text, cap: text_cap }.push(c);
    }
    seen.tool_call |= choices.tool_call;
    seen.complete |= choices.finished;
    if whole {
        // Every content read is the text, in order.
        seen.holes.read_as(HoleKind::Text);
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

/// The request to continue a broken text answer: the original messages
/// plus the partial answer as the assistant's turn.
pub fn continuation_body(original: &[u8], partial: &str, model: &str) -> Option<Bytes> {
    super::append_assistant_turn(original, partial, model)
}

/// A chunk as [`Walk`] reads it: the same [`Chunk`] serde_json would
/// give, or `None` where it leaves the chunk to serde_json (see
/// [`super::walk`]).
fn read_chunk<'a>(data: &'a str, holes: Option<&mut Vec<Hole>>) -> Option<Chunk<'a>> {
    let (mut error, mut choices, mut usage) = (None, None, None);
    let mut w = Walk::recording(data, holes);
    w.object(|w, key| match key {
        b"error" => once(&mut error, w.present()),
        b"choices" => once(&mut choices, read_choices(w)),
        b"usage" => once(&mut usage, w.part::<ChunkUsage>()),
        _ => w.skip(),
    })?;
    w.end()?;
    Some(Chunk { error: error.flatten(), choices: choices.unwrap_or_default(), usage: usage.flatten() })
}

fn read_choices<'a>(w: &mut Walk<'a, '_>) -> Option<Choices<'a>> {
    let mut out = Choices::default();
    w.array(|w| {
        // A choice written as an array is serde's to read (by position).
        if !w.at_object() {
            return None;
        }
        let (mut delta, mut finish_reason) = (None, None);
        w.object(|w, key| match key {
            b"delta" => once(&mut delta, if w.null() { Some(None) } else { read_delta(w).map(Some) }),
            b"finish_reason" => once(&mut finish_reason, w.present()),
            _ => w.skip(),
        })?;
        out.add(Choice { delta: delta.flatten(), finish_reason: finish_reason.flatten() });
        Some(())
    })?;
    Some(out)
}

fn read_delta<'a>(w: &mut Walk<'a, '_>) -> Option<Delta<'a>> {
    if !w.at_object() {
        return None;
    }
    let (mut content, mut tool_calls) = (None, None);
    w.object(|w, key| match key {
        b"content" => once(&mut content, w.text()),
        b"tool_calls" => once(&mut tool_calls, w.present()),
        _ => w.skip(),
    })?;
    Some(Delta { content: content.flatten(), tool_calls: tool_calls.flatten() })
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Chunk<'a> {
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default)]
    choices: Choices<'a>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
}

/// What a chunk's `choices` say, folded as they are read: no list per
/// chunk (this runs for every event relayed). The text is the choices'
/// contents in order, borrowed when there is one.
#[derive(Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Choices<'a> {
    count: usize,
    text: Option<Cow<'a, str>>,
    tool_call: bool,
    finished: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fold<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Fold<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Choices<'a>, A::Error> {
                let mut out = Choices::default();
                while let Some(choice) = seq.next_element::<Choice<'de>>()? {
                    out.add(choice);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_seq(Fold(std::marker::PhantomData))
    }
}

impl<'a> Choices<'a> {
    /// One more choice, folded in.
    fn add(&mut self, choice: Choice<'a>) {
        self.count += 1;
        self.finished |= choice.finish_reason.is_some();
        let Some(delta) = choice.delta else { return };
        self.tool_call |= delta.tool_calls.is_some();
        if let Some(Text(content)) = delta.content {
            self.text = Some(match self.text.take() {
                None => content,
                Some(before) => Cow::Owned(before.into_owned() + &content),
            });
        }
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

/// A chunk's usage: the counts translation reads too.
type ChunkUsage = turn::UsageIn;

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks as providers send them, and odd ones.
    const CHUNKS: &[&str] = &[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"m","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"line\nwith \"quotes\" and \\ \/ \t"},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,"prompt_tokens_details":{"cached_tokens":0}}}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b","tool_calls":null},"finish_reason":null}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        r#"{"error":{"message":"busy","type":"rate_limit_error","code":null}}"#,
        r#"{"error":null,"choices":[{"delta":null}]}"#,
        r#" { "choices" : [ { "delta" : { "content" : "spaced é ü 漢字" } , "finish_reason" : null } ] } "#,
        r#"{"choices":[{"delta":{"content":"x"}}],"extra":[1.5e-3,-0,true,false,{"n":[[]]}]}"#,
    ];

    #[test]
    fn the_walker_reads_a_chunk_as_serde_json_does_or_leaves_it_to_serde_json() {
        // Every usual chunk is read by the walker, and where it answers a
        // mutated one, it answers what serde_json does.
        super::super::walk::agrees(CHUNKS, |text| match read_chunk(text, None) {
            Some(fast) => {
                assert_eq!(Some(fast), serde_json::from_str::<Chunk<'_>>(text).ok(), "{text}");
                true
            }
            None => false,
        });
    }

    #[test]
    fn a_duplicate_field_or_a_choice_as_an_array_is_serde_jsons_to_read() {
        for chunk in [
            r#"{"choices":[{"delta":{"content":"a"}}],"choices":[]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[[{"content":"a"},null]]}"#,
            r#"{"choices":[{"delta":{"content":"\u00e9"}}]}"#,
        ] {
            assert_eq!(read_chunk(chunk, None), None, "{chunk}");
            let mut seen = Seen::default();
            inspect(None, chunk, &mut seen, 100);
            let slow = serde_json::from_str::<Chunk<'_>>(chunk).ok();
            assert_eq!(seen.text, slow.and_then(|c| c.choices.text).unwrap_or_default(), "{chunk}");
        }
    }

    #[test]
    fn a_chunks_choices_are_read_in_order_without_a_list() {
        let mut seen = Seen::default();
        let two = r#"{"choices":[{"delta":{"content":"a\"b"}},{"delta":{"content":"c","tool_calls":[{}]},"finish_reason":"stop"}]}"#;
        assert_eq!(inspect(None, two, &mut seen, 100), Kind::Content);
        assert_eq!(seen.text, "a\"bc");
        assert!(seen.tool_call && seen.complete);
        // Capped across chunks as before.
        assert_eq!(inspect(None, r#"{"choices":[{"delta":{"content":"0123456789"}}]}"#, &mut seen, 6), Kind::Content);
        assert_eq!(seen.text, "a\"bc01");
        // No choices: an error object in a vendor's shape is an error,
        // a usage chunk is not.
        let mut seen = Seen::default();
        assert_eq!(
            inspect(None, r#"{"choices":[],"error_code":"TM.1","error_msg":"busy"}"#, &mut seen, 9),
            Kind::Error
        );
        assert_eq!(
            inspect(None, r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#, &mut seen, 9),
            Kind::Content
        );
        assert_eq!((seen.usage.input, seen.usage.output), (Some(3), Some(4)));
        assert!(!seen.complete && seen.text.is_empty());
    }
}
