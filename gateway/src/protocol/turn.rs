//! One turn of a conversation, in no protocol's words: what translation
//! reads a client's request into and writes a target's request from, and
//! the same for answers ([`Reply`]) and stream events ([`Delta`]).
//!
//! Each protocol module reads and writes these (`turn.rs` in its folder);
//! a pair of protocols is never translated directly. Only what every
//! protocol can say has a field here; what one protocol alone can say is
//! either carried as [`Opaque`] (returned only to the protocol that
//! issued it), refused when the client relies on it, or dropped and
//! declared ([`Request::dropped`]).

use serde_json::Value;

pub use super::refusal::Refusal;
pub(crate) use super::refusal::refusal;
use super::{Protocol, bounds};

/// Appends parts as a message of `role`, merged into the last one if it
/// has the same role (the protocols differ on consecutive turns).
pub fn push(messages: &mut Vec<Message>, role: Role, parts: Vec<Part>) {
    match messages.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => messages.push(Message { role, parts }),
    }
}

/// Adds instructions: to [`Request::system`] before the conversation
/// starts, else as a system message in place.
pub fn instruct(req: &mut Request, text: String) {
    if req.messages.is_empty() {
        req.system.push(text);
    } else {
        req.messages.push(Message { role: Role::System, parts: vec![Part::Text(text)] });
    }
}

/// A client's request, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// System / developer instructions, in order.
    pub system: Vec<String>,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// Function tools offered.
    pub tools: Vec<Tool>,
    /// How the model may use them.
    pub tool_choice: Option<ToolChoice>,
    /// Whether several tool calls may come in one answer.
    pub parallel_tool_calls: Option<bool>,
    /// The most output tokens.
    pub max_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling (Anthropic; dropped elsewhere).
    pub top_k: Option<u64>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// Reasoning the client asked for (`None`: none asked, so none shown).
    pub reasoning: Option<Reasoning>,
    /// An end-user id for the provider's abuse checks.
    pub user: Option<String>,
    /// What reading or writing left out, each once with a count, for the
    /// response header and the journal: at most
    /// [`bounds::MAX_DROPPED_KINDS`] kinds, each name cut to
    /// [`bounds::MAX_DROPPED_NAME`] (a client picks the type names).
    pub dropped: Vec<(String, u32)>,
    /// How many further things were left out, of kinds past those.
    pub dropped_more: u64,
}

impl Request {
    /// Declares something left out (counted per kind). Constant work a
    /// note: the kinds searched are at most [`bounds::MAX_DROPPED_KINDS`].
    pub fn drop_note(&mut self, what: impl AsRef<str>) {
        let what = bounds::short_name(what.as_ref());
        match self.dropped.iter().position(|(w, _)| *w == what) {
            Some(i) => self.dropped[i].1 = self.dropped[i].1.saturating_add(1),
            None if self.dropped.len() < bounds::MAX_DROPPED_KINDS => self.dropped.push((what.to_owned(), 1)),
            None => self.dropped_more = self.dropped_more.saturating_add(1),
        }
    }

    /// The drops in one line: `thinking signature x2, tool web_search`,
    /// then `and 79968 more` past the kinds declared one by one (so the
    /// line stays under ~3 KiB, whatever the client sent).
    pub fn dropped_line(&self) -> Option<String> {
        if self.dropped.is_empty() {
            return None;
        }
        let each = self.dropped.iter().map(|(w, n)| if *n > 1 { format!("{w} x{n}") } else { w.clone() });
        let mut line = each.collect::<Vec<_>>().join(", ");
        if self.dropped_more > 0 {
            line.push_str(&format!(", and {} more of other kinds", self.dropped_more));
        }
        Some(line)
    }

    /// Bytes of text the request carries (system, messages, tool calls and
    /// results): what a writer reserves before it starts.
    pub fn text_len(&self) -> usize {
        let system: usize = self.system.iter().map(String::len).sum();
        system + self.messages.iter().flat_map(|m| &m.parts).map(Part::text_len).sum::<usize>()
    }

    /// Names of the custom (freeform) tools, whose calls go back to the
    /// client as custom tool calls.
    pub fn custom_tools(&self) -> Vec<String> {
        self.tools.iter().filter(|t| t.custom).map(|t| t.name.clone()).collect()
    }
}

/// Reasoning asked for: an effort (`low`…`high`) or a token budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reasoning {
    /// OpenAI's `reasoning_effort` / `reasoning.effort`.
    pub effort: Option<String>,
    /// Anthropic's `thinking.budget_tokens`.
    pub budget: Option<u64>,
    /// Reasoning wanted, its text not (`thinking.display: omitted`).
    pub hidden: bool,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The user (and tool results, which answer the assistant).
    User,
    /// The model.
    Assistant,
    /// Instructions given mid-conversation (Claude Code sends `system`
    /// messages between turns; chat and Responses clients may too).
    /// Instructions before the first message are [`Request::system`].
    System,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What it holds, in order.
    pub parts: Vec<Part>,
}

/// A piece of a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image.
    Image(Image),
    /// The model's reasoning, with the provider's opaque proof of it.
    Reasoning {
        /// Readable reasoning (may be empty: redacted or encrypted only).
        text: String,
        /// What the issuing protocol needs back verbatim.
        opaque: Option<Opaque>,
    },
    /// The model calling a tool.
    ToolCall(ToolCall),
    /// A tool's result, answering a call.
    ToolResult {
        /// The call it answers.
        call_id: String,
        /// Text and images.
        content: Vec<Part>,
        /// The tool failed.
        is_error: bool,
    },
}

impl Part {
    /// Bytes of text it carries (what a writer reserves for it).
    pub fn text_len(&self) -> usize {
        match self {
            Part::Text(t) => t.len(),
            Part::Image(Image::Data { data, .. }) => data.len(),
            Part::Image(Image::Url(url)) => url.len(),
            Part::Reasoning { text, .. } => text.len(),
            Part::ToolCall(c) => c.arguments.len() + c.name.len() + c.id.len(),
            Part::ToolResult { content, .. } => content.iter().map(Part::text_len).sum(),
        }
    }
}

/// An image, inline or by URL.
#[derive(Debug, Clone, PartialEq)]
pub enum Image {
    /// Base64 data.
    Data {
        /// `image/png`, …
        media_type: String,
        /// Base64, as sent.
        data: String,
    },
    /// A URL (`https:` or `data:`).
    Url(String),
}

impl Image {
    /// The image as a URL (a `data:` URL for inline data).
    pub fn url(&self) -> String {
        match self {
            Image::Data { media_type, data } => format!("data:{media_type};base64,{data}"),
            Image::Url(url) => url.clone(),
        }
    }

    /// Reads a URL, taking a `data:…;base64,` URL apart.
    pub fn from_url(url: &str) -> Image {
        if let Some(rest) = url.strip_prefix("data:")
            && let Some((media_type, data)) = rest.split_once(";base64,")
        {
            return Image::Data { media_type: media_type.to_owned(), data: data.to_owned() };
        }
        Image::Url(url.to_owned())
    }
}

/// State only the protocol that issued it can read: an Anthropic thinking
/// signature or redacted thinking, a Responses reasoning item's
/// `encrypted_content`. Never altered; written back only to `from`.
#[derive(Debug, Clone, PartialEq)]
pub struct Opaque {
    /// The protocol that issued it.
    pub from: Protocol,
    /// Its value, verbatim.
    pub value: Value,
}

/// A tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Its id (answered by a tool result with the same id).
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments as JSON text (a custom tool's: its input as a JSON
    /// string of one field, `input`).
    pub arguments: String,
    /// A call of a custom (freeform) tool.
    pub custom: bool,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON schema of its arguments.
    pub parameters: Value,
    /// A custom (freeform) tool: offered elsewhere as a function of one
    /// string argument, `input`.
    pub custom: bool,
}

/// The schema a custom tool is offered with where only function tools
/// exist.
pub fn custom_tool_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})
}

/// How the model may use the tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// As it sees fit.
    Auto,
    /// Not at all.
    None,
    /// At least one.
    Required,
    /// This one.
    Named(String),
}

/// A whole (non-streamed) answer, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// The provider's id for it.
    pub id: String,
    /// The model that answered.
    pub model: String,
    /// Reasoning, text and tool calls, in order.
    pub parts: Vec<Part>,
    /// Why it stopped.
    pub stop: Stop,
    /// Tokens.
    pub usage: Tokens,
}

/// Why an answer stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Stop {
    /// It was done.
    #[default]
    End,
    /// `max_tokens` reached.
    Length,
    /// It called tools.
    ToolUse,
    /// A stop sequence (which, if known).
    Sequence(Option<String>),
    /// Content filtered or refused.
    Filtered,
}

/// Token counts of an answer, as translation carries them (every count a
/// protocol can say; [`crate::record::Usage`] is what the journal and
/// the metrics keep of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input tokens, cached ones included.
    pub input: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cached: u64,
    /// Input tokens written to the prompt cache (Anthropic).
    pub cache_written: u64,
    /// Output tokens spent reasoning.
    pub reasoning: u64,
}

impl From<crate::record::Usage> for Tokens {
    /// A reader's counts so far (a count not reported is 0 here).
    fn from(u: crate::record::Usage) -> Self {
        Tokens {
            input: u.input.unwrap_or(0),
            output: u.output.unwrap_or(0),
            cached: u.cached.unwrap_or(0),
            cache_written: u.cache_written.unwrap_or(0),
            reasoning: u.reasoning.unwrap_or(0),
        }
    }
}

/// Streamed tool calls reassembled: the writers of protocols that say a
/// call in one piece (Anthropic's one open block at a time, Responses
/// items) collect the deltas here, in whatever order a chat provider
/// interleaves them, and write each call whole at the answer's end.
#[derive(Debug, Default)]
pub struct Calls {
    calls: Vec<ToolCall>,
    /// The provider's index of each call → where it is in `calls` (the
    /// first opened under it).
    at: std::collections::HashMap<u32, usize>,
}

impl Calls {
    /// A call opens (`index`: the provider's).
    pub fn open(&mut self, index: u32, id: String, name: String) {
        self.at.entry(index).or_insert(self.calls.len());
        self.calls.push(ToolCall { id, name, arguments: String::new(), custom: false });
    }

    /// More of call `index`'s arguments.
    pub fn args(&mut self, index: u32, piece: &str) {
        if let Some(call) = self.at.get(&index).and_then(|&at| self.calls.get_mut(at)) {
            call.arguments.push_str(piece);
        }
    }

    /// The calls, in order of opening, arguments whole (`{}` when none
    /// came).
    pub fn take(&mut self) -> Vec<ToolCall> {
        self.at.clear();
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|mut call| {
                if call.arguments.trim().is_empty() {
                    call.arguments = "{}".into();
                }
                call
            })
            .collect()
    }
}

/// One step of a streamed answer, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// The answer opens.
    Start {
        /// The provider's id.
        id: String,
        /// The model answering.
        model: String,
    },
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// The opaque proof of the reasoning just streamed.
    Opaque(Opaque),
    /// A tool call opens (`index`: the provider's, to match its
    /// argument deltas).
    ToolCall {
        /// The provider's index of the call.
        index: u32,
        /// Its id.
        id: String,
        /// The tool.
        name: String,
    },
    /// More of a tool call's arguments (JSON text).
    ToolArgs {
        /// The provider's index of the call.
        index: u32,
        /// The piece.
        args: String,
    },
    /// Token counts so far, whole: the reader gathers the pieces a
    /// protocol reports them in (see [`crate::record::Usage`]), so the
    /// last of these is the answer's.
    Tokens(Tokens),
    /// Why it stopped.
    Stop(Stop),
    /// The stream's proper end.
    Done,
    /// The provider failed mid-stream.
    Error {
        /// The status its error stands for (see [`super::error_status`]).
        status: u16,
        /// What it said.
        message: String,
    },
}
