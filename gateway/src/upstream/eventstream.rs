//! Bedrock's streamed answers: AWS event-stream framing in, Anthropic SSE
//! out, event for event.
//!
//! `invoke-with-response-stream` sends binary messages (prelude, headers,
//! payload, CRCs; decoded and checked by `aws-smithy-eventstream`). A
//! `chunk` event's payload is `{"bytes": "<base64 of one Anthropic event>"}`;
//! each becomes `event: <type>\ndata: <json>\n\n`, so the stream handshake,
//! the scanner, usage, partial text and resume see exactly what an
//! Anthropic upstream would have sent. An exception message
//! (`throttlingException`, `modelStreamErrorException`, …) becomes an
//! Anthropic `error` event of the equivalent type, so it is classified and
//! retried before content, and ends the client's stream honestly after.

use std::pin::Pin;
use std::task::{Context, Poll};

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder, write_message_to};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};

use super::{PooledBody, ReadError};

/// Content type of an event-stream answer.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// Decodes event-stream messages from bytes as they arrive and writes the
/// SSE events they stand for.
#[derive(Default)]
pub struct Translator {
    buf: BytesMut,
    decoder: MessageFrameDecoder,
    /// Bytes of a message whose prelude the decoder already took.
    started: bool,
}

impl Translator {
    /// Adds bytes read from the upstream.
    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Writes the SSE events of every complete message fed so far.
    pub fn drain(&mut self, out: &mut BytesMut) -> Result<(), FrameError> {
        loop {
            let before = self.buf.len();
            match self.decoder.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Complete(message)) => {
                    self.started = false;
                    sse_of(&message, out)?;
                }
                Ok(DecodedFrame::Incomplete) => {
                    // The decoder keeps a prelude it has read: bytes taken
                    // from the buffer belong to a message still arriving.
                    self.started |= self.buf.len() < before || !self.buf.is_empty();
                    return Ok(());
                }
                Err(err) => return Err(FrameError::Broken(err.to_string())),
            }
        }
    }

    /// Whether part of a message is still waiting for its rest.
    pub fn unfinished(&self) -> bool {
        self.started || !self.buf.is_empty()
    }
}

/// A Bedrock stream body, re-emitted as Anthropic SSE.
pub struct EventStreamSse {
    inner: PooledBody,
    translator: Translator,
    ended: bool,
}

impl EventStreamSse {
    /// Wraps the body of an `invoke-with-response-stream` answer.
    pub fn new(inner: PooledBody) -> Self {
        Self { inner, translator: Translator::default(), ended: false }
    }

    /// Its reader is done with it (the terminal event came): the frames
    /// still to come are read apart and dropped, so the connection can be
    /// reused (see [`PooledBody::settle`]).
    pub fn settle(self) {
        self.inner.settle();
    }
}

impl Body for EventStreamSse {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        let this = &mut *self;
        loop {
            let mut out = BytesMut::new();
            if let Err(problem) = this.translator.drain(&mut out) {
                this.ended = true;
                return Poll::Ready(Some(Err(ReadError::Framing(problem))));
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
            if this.ended {
                if this.translator.unfinished() {
                    this.translator = Translator::default();
                    return Poll::Ready(Some(Err(ReadError::Framing(FrameError::Unfinished))));
                }
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.translator.feed(&data);
                    }
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err.into()))),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && !self.translator.unfinished()
    }
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str())
}

/// The SSE event(s) one message stands for (none for messages that carry
/// no event, e.g. an initial response).
fn sse_of(message: &Message, out: &mut BytesMut) -> Result<(), FrameError> {
    match header(message, ":message-type").unwrap_or("event") {
        "event" if header(message, ":event-type") == Some("chunk") => {
            #[derive(serde::Deserialize)]
            struct Chunk {
                bytes: String,
            }
            let chunk: Chunk =
                serde_json::from_slice(message.payload()).map_err(|e| FrameError::NoBytes(e.to_string()))?;
            let event = STANDARD.decode(chunk.bytes.as_bytes()).map_err(|e| FrameError::NotBase64(e.to_string()))?;
            write_event(&event, out)
        }
        "event" => Ok(()),
        "exception" => {
            let kind = header(message, ":exception-type").unwrap_or("exception");
            write_error(kind, &message_of(message.payload()), out);
            Ok(())
        }
        // Event-stream protocol errors: `:error-code`, `:error-message`.
        "error" => {
            let kind = header(message, ":error-code").unwrap_or("error");
            write_error(kind, header(message, ":error-message").unwrap_or_default(), out);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What makes an event-stream answer unreadable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    /// A frame that does not decode (length, checksum, headers).
    #[error("a broken event-stream message: {0}")]
    Broken(String),
    /// A `chunk` event whose payload has no `bytes`.
    #[error("a chunk without its bytes: {0}")]
    NoBytes(String),
    /// A `chunk` whose `bytes` are not base64.
    #[error("a chunk not in base64: {0}")]
    NotBase64(String),
    /// A chunk's bytes that are not an Anthropic event.
    #[error("a chunk that is not an event: {0}")]
    NotAnEvent(String),
    /// The body ended inside a message.
    #[error("the stream ended inside an event-stream message")]
    Unfinished,
}

/// Writes one Anthropic event as SSE: its `type` is the event name.
fn write_event(json: &[u8], out: &mut BytesMut) -> Result<(), FrameError> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: std::borrow::Cow<'a, str>,
    }
    let typed: Typed<'_> = serde_json::from_slice(json).map_err(|e| FrameError::NotAnEvent(e.to_string()))?;
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(typed.kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    if json.contains(&b'\n') {
        // SSE data may not hold a newline: write the JSON compact.
        let value: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| FrameError::NotAnEvent(e.to_string()))?;
        out.extend_from_slice(value.to_string().as_bytes());
    } else {
        out.extend_from_slice(json);
    }
    out.extend_from_slice(b"\n\n");
    Ok(())
}

/// The `message` of an exception payload (`{"message": "..."}`), or the
/// payload itself.
fn message_of(payload: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(payload).ok();
    match parsed.as_ref().and_then(|v| v.get("message").or_else(|| v.get("Message"))).and_then(|m| m.as_str()) {
        Some(message) => message.to_owned(),
        None => String::from_utf8_lossy(payload).into_owned(),
    }
}

fn write_error(kind: &str, message: &str, out: &mut BytesMut) {
    let error = super::bedrock::anthropic_error(kind, message);
    out.extend_from_slice(b"event: error\ndata: ");
    out.extend_from_slice(&error);
    out.extend_from_slice(b"\n\n");
}

/// One `chunk` event carrying `event` (an Anthropic event's JSON), framed
/// as Bedrock sends it (the simulator's side of this module).
pub fn encode_chunk(event: &[u8]) -> Bytes {
    let payload = serde_json::json!({ "bytes": STANDARD.encode(event) }).to_string();
    encode(
        vec![
            Header::new(":event-type", HeaderValue::String("chunk".into())),
            Header::new(":content-type", HeaderValue::String("application/json".into())),
            Header::new(":message-type", HeaderValue::String("event".into())),
        ],
        payload.into_bytes(),
    )
}

/// An exception message (`throttlingException`, …) with `message`.
pub fn encode_exception(kind: &str, message: &str) -> Bytes {
    let payload = serde_json::json!({ "message": message }).to_string();
    encode(
        vec![
            Header::new(":exception-type", HeaderValue::String(kind.to_owned().into())),
            Header::new(":content-type", HeaderValue::String("application/json".into())),
            Header::new(":message-type", HeaderValue::String("exception".into())),
        ],
        payload.into_bytes(),
    )
}

fn encode(headers: Vec<Header>, payload: Vec<u8>) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + 128);
    // Writing to a Vec fails only for messages over 16 MiB.
    if write_message_to(&Message::new_from_parts(headers, payload), &mut out).is_err() {
        out.clear();
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(parts: &[&[u8]]) -> Result<String, FrameError> {
        let mut t = Translator::default();
        let mut out = BytesMut::new();
        for part in parts {
            t.feed(part);
            t.drain(&mut out)?;
        }
        assert!(!t.unfinished(), "every message complete");
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn chunks_become_anthropic_events_whatever_the_split() {
        let start = br#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":3}}}"#;
        let delta = br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#;
        let wire = [encode_chunk(start), encode_chunk(delta)].concat();
        let expected = format!(
            "event: message_start\ndata: {}\n\nevent: content_block_delta\ndata: {}\n\n",
            String::from_utf8_lossy(start),
            String::from_utf8_lossy(delta)
        );
        // Whole, and cut at every byte boundary (frames span TCP reads).
        assert_eq!(translate(&[&wire]).unwrap(), expected);
        for cut in 1..wire.len() {
            assert_eq!(translate(&[&wire[..cut], &wire[cut..]]).unwrap(), expected, "cut at {cut}");
        }
    }

    #[test]
    fn exceptions_become_error_events_of_the_equivalent_type() {
        let wire = encode_exception("throttlingException", "Too many tokens, please wait before trying again.");
        let sse = translate(&[&wire]).unwrap();
        let data = sse.strip_prefix("event: error\ndata: ").unwrap().trim_end();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["message"], "throttlingException: Too many tokens, please wait before trying again.");
        let wire = encode_exception("modelStreamErrorException", "boom");
        assert!(translate(&[&wire]).unwrap().contains(r#""type":"api_error""#));
    }

    #[test]
    fn a_corrupted_frame_is_an_error_not_garbage() {
        let mut wire = encode_chunk(br#"{"type":"ping"}"#).to_vec();
        let last = wire.len() - 1;
        wire[last] ^= 0xff; // the message CRC no longer matches
        let broken = translate(&[&wire]).unwrap_err();
        assert!(matches!(broken, FrameError::Broken(_)) && broken.to_string().contains("event-stream"), "{broken}");
        let chunk = encode(vec![Header::new(":event-type", HeaderValue::String("chunk".into()))], b"{}".to_vec());
        let empty = translate(&[&chunk]).unwrap_err();
        assert!(matches!(empty, FrameError::NoBytes(_)) && empty.to_string().contains("bytes"), "{empty}");
    }
}
