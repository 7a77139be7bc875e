//! Translation: a client's request to a target that speaks another
//! protocol, and its answer back — once in, once out, through
//! [`crate::protocol::turn`].
//!
//! ```text
//! client body ─read─► turn::Request ─write─► target body
//! target answer ─read─► turn::Reply / Delta ─write─► client answer
//! ```
//!
//! Used only when a target does not speak the client's protocol; the
//! same protocol on both sides never comes here (its bytes pass as they
//! are). A request that cannot be said in the target's protocol is
//! refused with the field named ([`request`] → `Err`); what is left out is
//! declared ([`Back::dropped`]). Targets are reached over chat
//! completions or Anthropic messages (every OpenAI-compatible upstream
//! serves chat completions) or Gemini; clients may speak any of the four
//! protocols (chat, Responses, Anthropic, Gemini).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::protocol::events;
use crate::protocol::stream_turn::{StreamReader, StreamWriter};
use crate::protocol::turn::{Delta, Refusal};
use crate::protocol::{ErrorKind, Protocol, anthropic, gemini, kind_of_status, openai_chat, openai_responses};

pub use crate::protocol::Way;

/// What the answer's way back needs to know of the request.
#[derive(Debug)]
pub struct Back {
    /// The client's protocol (the answer's).
    pub client: Protocol,
    /// The target's protocol (the upstream answer's).
    pub target: Protocol,
    /// The client asked for reasoning (else none is shown).
    pub reasoning: bool,
    /// Custom (freeform) tools, whose calls go back as custom calls.
    pub custom: Vec<String>,
    /// A chat client asked for a usage chunk.
    pub include_usage: bool,
    /// What the request lost on the way, in one line (declared).
    pub dropped: Option<String>,
    /// Where a Responses answer's conversation is kept (`store` not
    /// false), for a later `previous_response_id`.
    pub keep: Option<crate::kept::Keep>,
}

/// A target's 2xx answer that is not an answer of its protocol (so it
/// cannot be said in the client's): the attempt fails, as for any odd
/// answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotAnAnswer(String);

/// A request translated for one target.
#[derive(Debug, Clone)]
pub struct Translated {
    /// The body to send.
    pub body: Bytes,
    /// What the answer needs.
    pub back: Arc<Back>,
}

/// Translates a client's `body` (in `client`'s protocol) for a target
/// speaking `target`, naming `model`; `Err` names what cannot be said.
pub fn request(client: Protocol, target: Protocol, body: &[u8], model: &str) -> Result<Translated, Refusal> {
    request_keeping(client, target, body, model, false, None)
}

/// [`request`], keeping a Responses answer's conversation in `kept` for
/// its owner (unless the request says `store: false`) and sending a
/// request that continues one (`previous_response_id`) its whole history.
/// `Err` also when the response it continues is not kept (any more, or
/// not for this owner). `stream`: the client asked for a stream outside
/// the body (Gemini's method).
pub fn request_keeping(
    client: Protocol,
    target: Protocol,
    body: &[u8],
    model: &str,
    stream: bool,
    kept: Option<(&crate::kept::Store, &crate::kept::Owner)>,
) -> Result<Translated, Refusal> {
    let mut keep = None;
    let mut include_usage = false;
    let mut req = match client {
        Protocol::OpenAiChat => {
            let v = serde_json::from_slice::<Value>(body)
                .map_err(|e| crate::protocol::bounds::json_error("request body", &e))?;
            include_usage = v["stream_options"]["include_usage"].as_bool() == Some(true);
            openai_chat::turn::read_request(&v)?
        }
        Protocol::OpenAiResponses => {
            let (req, kept) = responses_request(body, kept)?;
            keep = kept;
            req
        }
        // Anthropic bodies (Claude Code's are 50 KB) are read typed,
        // without a JSON tree.
        Protocol::Anthropic => anthropic::turn::read_request(body)?,
        Protocol::Gemini => gemini::turn::read_request(body, stream)?,
    };
    let body = match target {
        Protocol::OpenAiChat => openai_chat::turn::write_request(&mut req, model),
        Protocol::Anthropic => Ok(json_bytes(&anthropic::turn::write_request(&mut req, model), req.text_len())),
        // The model and the stream are in the path.
        Protocol::Gemini => Ok(json_bytes(&gemini::turn::write_request(&mut req), req.text_len())),
        Protocol::OpenAiResponses => return Err("the Responses API is not reached by translation".into()),
    };
    let body = body.map_err(|e| format!("translated body: {e}"))?;
    let back = Back {
        client,
        target,
        reasoning: req.reasoning.as_ref().is_some_and(|r| !r.hidden),
        custom: req.custom_tools(),
        include_usage,
        dropped: req.dropped_line(),
        keep,
    };
    Ok(Translated { body: Bytes::from(body), back: Arc::new(back) })
}

/// A Responses request read (one JSON tree), a `previous_response_id`
/// resolved from what tidegate kept for its owner, and where its answer's
/// conversation is to be kept (unless `store: false`, or it has grown
/// past what is kept: declared).
fn responses_request(
    body: &[u8],
    kept: Option<(&crate::kept::Store, &crate::kept::Owner)>,
) -> Result<(crate::protocol::turn::Request, Option<crate::kept::Keep>), Refusal> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| crate::protocol::bounds::json_error("request body", &e))?;
    let fresh = crate::kept::input_items(&v["input"]);
    let mut continued = None;
    if let Some(previous) = v.get("previous_response_id").and_then(Value::as_str) {
        let turn = kept.and_then(|(store, owner)| store.get(previous, owner));
        let Some(history) = turn.as_ref().and_then(|t| t.history()) else {
            // Routing refuses such an id first; this is a conversation
            // let go in between.
            return Err(crate::protocol::turn::refusal!(
                "previous_response_id: {previous:?} is not a response tidegate keeps for this client key (any \
                 more); send the whole conversation (store: false) instead"
            ));
        };
        let mut input = history;
        input.extend(fresh.iter().cloned());
        continued = turn.map(|t| (previous.to_owned(), t));
        if let Some(obj) = v.as_object_mut() {
            obj.remove("previous_response_id");
            obj.insert("input".into(), Value::Array(input));
        }
    }
    let mut req = openai_responses::turn::read_request(&v)?;
    let keep = match kept {
        Some((store, owner)) if v["store"] != false => {
            let items = continued.as_ref().map_or(0, |(_, t)| t.count()) + fresh.len();
            if items > crate::kept::MAX_ITEMS {
                req.drop_note(format!(
                    "stored state (a conversation over {} items is not kept)",
                    crate::kept::MAX_ITEMS
                ));
                None
            } else {
                Some(crate::kept::Keep {
                    store: store.clone(),
                    owner: owner.clone(),
                    previous: continued,
                    input: fresh,
                })
            }
        }
        _ => None,
    };
    Ok((req, keep))
}

/// An estimate of a messages (or Gemini) request's input tokens, for
/// `count_tokens` on an alias with no target of that protocol: a quarter of the characters of
/// its system prompt, messages (text, tool calls and results) and tool
/// definitions, plus a few per message. An estimate, and answered as one.
pub fn estimate_tokens(protocol: Protocol, body: &[u8]) -> Result<u64, Refusal> {
    use crate::protocol::turn::Part;
    let req = match protocol {
        // `countTokens` takes contents, or a whole `generateContentRequest`.
        Protocol::Gemini => {
            let v: Value =
                serde_json::from_slice(body).map_err(|e| crate::protocol::bounds::json_error("request body", &e))?;
            match v.get("generateContentRequest") {
                Some(inner) => gemini::turn::read_request(inner.to_string().as_bytes(), false)?,
                None => gemini::turn::read_request(body, false)?,
            }
        }
        _ => anthropic::turn::read_request(body)?,
    };
    fn chars(p: &Part) -> usize {
        match p {
            Part::Text(t) => t.chars().count(),
            Part::Reasoning { text, .. } => text.chars().count(),
            Part::ToolCall(c) => c.name.len() + c.arguments.chars().count(),
            Part::ToolResult { content, .. } => content.iter().map(chars).sum(),
            // An image counts as Anthropic's typical ~1 600 tokens.
            Part::Image(_) => 6400,
        }
    }
    let mut n: usize = req.system.iter().map(|s| s.chars().count()).sum();
    n += req.messages.iter().flat_map(|m| &m.parts).map(chars).sum::<usize>();
    n += req
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.as_deref().map_or(0, str::len) + t.parameters.to_string().len())
        .sum::<usize>();
    Ok((n as u64).div_ceil(4) + 4 * req.messages.len() as u64)
}

/// Declares a translated answer in its headers: the protocols
/// ([`headers::TRANSLATED`]) and what the request lost
/// ([`headers::DROPPED`]).
pub fn declare(back: &Back, headers: &mut http::HeaderMap) {
    let via = format!("{}>{}", back.client.name(), back.target.name());
    if let Ok(v) = http::HeaderValue::try_from(via) {
        headers.insert(crate::headers::TRANSLATED, v);
    }
    if let Some(v) = back.dropped.as_deref().and_then(|d| http::HeaderValue::try_from(d).ok()) {
        headers.insert(crate::headers::DROPPED, v);
    }
}

/// A target's whole 2xx answer in the client's protocol; `Err` when the
/// answer is not one the target's protocol can give.
pub fn answer(back: &Back, body: &[u8]) -> Result<Bytes, NotAnAnswer> {
    let reply = match back.target {
        Protocol::OpenAiChat => openai_chat::turn::read_answer(body),
        Protocol::Anthropic => {
            let v: Value =
                serde_json::from_slice(body).map_err(|e| NotAnAnswer(format!("the answer is not JSON: {e}")))?;
            anthropic::turn::read_answer(&v)
        }
        Protocol::Gemini => gemini::turn::read_answer(body),
        Protocol::OpenAiResponses => None,
    };
    let reply = reply.ok_or_else(|| NotAnAnswer(format!("the answer is not a {} answer", back.target.name())))?;
    let out = match back.client {
        Protocol::OpenAiChat => openai_chat::turn::write_answer(&reply, back.reasoning),
        Protocol::OpenAiResponses => {
            let out = openai_responses::turn::write_answer(&reply, back.reasoning, &back.custom);
            if let (Some(keep), Some(id), Some(output)) = (&back.keep, out["id"].as_str(), out["output"].as_array()) {
                keep.answered(id, output);
            }
            out
        }
        // Written by hand (see `protocol::json`).
        Protocol::Anthropic => return Ok(Bytes::from(anthropic::turn::write_answer(&reply, back.reasoning))),
        Protocol::Gemini => gemini::turn::write_answer(&reply, back.reasoning),
    };
    Ok(Bytes::from(json_bytes(&out, body.len())))
}

/// A JSON tree as bytes, its strings escaped eight bytes at a time (see
/// `protocol::json`); `size`: about how long it will be.
fn json_bytes(v: &Value, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 256);
    crate::protocol::json::put_value(&mut out, v);
    out
}

/// A target's error answer (`status`, `body`) in the client's shape: the
/// same class (by status), the provider's message and code.
pub fn error(back: &Back, status: u16, body: &[u8]) -> Bytes {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let err = v.get("error").unwrap_or(&v);
    let message = match err.get("message").and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => crate::classify::summary::summarize(body),
    };
    let code =
        err.get("code").and_then(|c| c.as_str().map(str::to_owned).or_else(|| c.as_u64().map(|n| n.to_string())));
    let kind = match status {
        200..=299 => kind_of_status(crate::protocol::error_status(body)),
        _ => kind_of_status(status),
    };
    back.client.error_body(kind, &message, code.as_deref())
}

/// What a held tool call costs besides its strings (its place in the
/// list and the index to it), counted in the bound on held calls.
const CALL_OVERHEAD: usize = 96;

/// A target's SSE events into the client's, event by event: every
/// translated stream opens, numbers and closes its blocks in the client's
/// grammar, whatever the target sent, and ends with the client's terminal
/// event or its error event. One reader and one writer, paired once per
/// stream ([`Pair`]); the body asks through this type only.
pub struct Stream {
    pair: Box<dyn Translating>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("translate::Stream")
    }
}

/// What a stream's translator does, whichever pair of protocols: one
/// dynamic call a chunk of events, everything inside it monomorphic.
trait Translating: Send {
    fn events(&mut self, bytes: &[u8]) -> Bytes;
    fn finish(&mut self) -> Bytes;
    fn fail(&mut self, kind: ErrorKind, message: &str) -> Bytes;
    fn take_broken(&mut self) -> Option<String>;
}

/// A target protocol's reader and a client protocol's writer.
struct Pair<R, W> {
    reader: R,
    writer: W,
    deltas: Vec<Delta>,
    /// Bytes of tool calls the writer holds (when it holds them), and
    /// their bound.
    calls: (usize, usize),
    /// Why the stream cannot go on, once it cannot.
    broken: Option<String>,
}

impl<R: StreamReader + Send, W: StreamWriter + Send> Translating for Pair<R, W> {
    fn events(&mut self, bytes: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        events::each_event(bytes, |name, data| {
            if self.broken.is_some() {
                return;
            }
            self.reader.read(name, data, &mut self.deltas);
            if W::HOLDS_CALLS {
                let (held, max) = &mut self.calls;
                for delta in &self.deltas {
                    *held += match delta {
                        // A call held costs its strings and their place.
                        Delta::ToolCall { id, name, .. } => id.len() + name.len() + CALL_OVERHEAD,
                        Delta::ToolArgs { args, .. } => args.len(),
                        _ => 0,
                    };
                }
                if *held > *max {
                    self.broken = Some(format!(
                        "the upstream's tool calls came to over {max} bytes (max_stream_event), which the \
                         client's protocol receives whole"
                    ));
                    self.deltas.clear();
                    return;
                }
            }
            for delta in self.deltas.drain(..) {
                self.writer.write(delta, &mut out);
            }
        });
        out.freeze()
    }

    fn finish(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        self.writer.finish(&mut out);
        out.freeze()
    }

    fn fail(&mut self, kind: ErrorKind, message: &str) -> Bytes {
        let mut out = BytesMut::new();
        self.writer.fail(kind, message, &mut out);
        out.freeze()
    }

    fn take_broken(&mut self) -> Option<String> {
        self.broken.take()
    }
}

/// `reader` paired with the writer of `back`'s client protocol.
fn with_writer<R: StreamReader + Send + 'static>(reader: R, back: &Back, max_event: usize) -> Box<dyn Translating> {
    fn pair<R: StreamReader + Send + 'static, W: StreamWriter + Send + 'static>(
        reader: R,
        writer: W,
        max_event: usize,
    ) -> Box<dyn Translating> {
        Box::new(Pair { reader, writer, deltas: Vec::new(), calls: (0, max_event), broken: None })
    }
    match back.client {
        Protocol::OpenAiChat => {
            pair(reader, openai_chat::turn::Writer::new(back.include_usage, back.reasoning), max_event)
        }
        Protocol::OpenAiResponses => pair(
            reader,
            openai_responses::turn::Writer::new(back.reasoning, back.custom.clone(), back.keep.clone()),
            max_event,
        ),
        Protocol::Anthropic => pair(reader, anthropic::turn::Writer::new(back.reasoning), max_event),
        Protocol::Gemini => pair(reader, gemini::turn::Writer::new(back.reasoning), max_event),
    }
}

impl Stream {
    /// A translator for the way `back` describes (`None` for a target
    /// protocol that is not reached by translation); `max_event`: the
    /// largest event allowed, which bounds the tool calls a writer holds
    /// to write as one event.
    pub fn new(back: &Back, max_event: usize) -> Option<Stream> {
        let pair = match back.target {
            Protocol::OpenAiChat => with_writer(openai_chat::turn::Reader::default(), back, max_event),
            Protocol::Anthropic => with_writer(anthropic::turn::Reader::default(), back, max_event),
            Protocol::Gemini => with_writer(gemini::turn::Reader::default(), back, max_event),
            Protocol::OpenAiResponses => return None,
        };
        Some(Stream { pair })
    }

    /// Translates whole events (`bytes` ends at an event's end).
    pub fn events(&mut self, bytes: &[u8]) -> Bytes {
        self.pair.events(bytes)
    }

    /// Why the stream cannot go on, if it cannot (taken once): the body
    /// then ends it as broken.
    pub fn take_broken(&mut self) -> Option<String> {
        self.pair.take_broken()
    }

    /// The client's terminal events, if not yet sent: for a target that
    /// finished its answer but ended without its own terminal event.
    pub fn finish(&mut self) -> Bytes {
        self.pair.finish()
    }

    /// A failure as the client's error event (nothing is written after).
    pub fn fail(&mut self, kind: ErrorKind, message: &str) -> Bytes {
        self.pair.fail(kind, message)
    }
}

#[cfg(test)]
mod usage_tests;
