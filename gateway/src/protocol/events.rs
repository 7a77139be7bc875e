//! The vocabulary every protocol's stream grammar answers in.
//!
//! The stream body and the handshake never look at event names or JSON
//! fields: they hand each complete SSE event (its `event:` name and joined
//! `data:`) to the protocol, which says what it is ([`Kind`]) and notes
//! what it carried ([`Seen`]: text, usage, tool calls, the end).

use std::borrow::Cow;

use bytes::Bytes;

use crate::record::Usage;

/// What one event is, as far as relaying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `: comment` lines only, or a protocol ping: keep-alive.
    KeepAlive,
    /// Opens the answer but carries nothing of it (Anthropic
    /// `message_start`, Responses `response.created`): held back by the
    /// handshake, dropped from a continuation.
    Start,
    /// Opens a block of the answer (Anthropic `content_block_start`): the
    /// answer has begun, but a continuation does not repeat it.
    BlockStart,
    /// Anything that carries or continues the answer.
    Content,
    /// Data that is not a JSON object (nor the protocol's own sentinel,
    /// `[DONE]`): passed on as it came when the client speaks the
    /// target's protocol (it reads it as it will), but a translated stream
    /// cannot say it, so there it is a break (see [`unreadable`]).
    Unreadable,
    /// An error (OpenAI `{"error":...}`, Anthropic `event: error`,
    /// Responses `response.failed` / `error`).
    Error,
    /// The protocol's terminal event (`[DONE]`, `message_stop`,
    /// `response.completed`): after it the stream is complete.
    Done,
}

/// Whether an event's `data` is no JSON object at all: what a protocol's
/// `inspect` says of data its typed read gave up on (the rare path, so
/// the second look costs nothing on the usual one). Empty data is a
/// keep-alive some providers send, not a broken event.
pub fn unreadable(data: &str) -> bool {
    let trimmed = data.trim();
    let object = trimmed.starts_with('{') && serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_ok();
    !(trimmed.is_empty() || object)
}

/// Where the first whole event in `buf` ends (just past its blank line,
/// LF or CRLF), if one is there. `memchr`: this runs over every byte of
/// every event relayed.
pub fn event_end(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = memchr::memchr(b'\n', &buf[at..]) {
        let i = at + i;
        match (buf.get(i + 1), buf.get(i + 2)) {
            (Some(b'\n'), _) => return Some(i + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
            _ => {}
        }
        at = i + 1;
    }
    None
}

/// One event's `event:` name and its `data:` lines joined by newlines
/// (`None` when it has none: comments only). Nearly every event has one
/// `data:` line: borrowed, no list; a second makes it owned. Lines as
/// `str::lines` splits them, found with `memchr` (a SIMD search; `lines`
/// goes a byte at a time). The one SSE reader: the scanner's and the
/// translator's.
#[inline]
pub fn fields(text: &str) -> (Option<&str>, Option<Cow<'_, str>>) {
    let mut name: Option<&str> = None;
    let mut data: Option<Cow<'_, str>> = None;
    let mut rest: &str = text;
    while !rest.is_empty() {
        let line = match memchr::memchr(b'\n', rest.as_bytes()) {
            Some(i) => {
                let line = &rest[..i];
                rest = &rest[i + 1..];
                line
            }
            None => std::mem::take(&mut rest),
        };
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim());
        } else if let Some(v) = line.strip_prefix("data:") {
            let v = v.strip_prefix(' ').unwrap_or(v);
            data = Some(match data.take() {
                None => Cow::Borrowed(v),
                Some(mut joined) => {
                    let owned = joined.to_mut();
                    owned.push('\n');
                    owned.push_str(v);
                    joined
                }
            });
        }
    }
    (name, data)
}

/// Calls `f(name, data)` for each whole event in `bytes` that has data
/// (comments and keep-alives skipped), in order; a last event without
/// its blank line counts too.
pub fn each_event(bytes: &[u8], mut f: impl FnMut(Option<&str>, &str)) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let end = event_end(rest).unwrap_or(rest.len());
        let (event, after) = rest.split_at(end);
        rest = after;
        let text = String::from_utf8_lossy(event);
        if let (name, Some(data)) = fields(&text) {
            f(name, &data);
        }
    }
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
    /// The answer finished properly (terminal event or finish reason).
    pub complete: bool,
    /// Data of the first error event, if any.
    pub error: Option<Bytes>,
    /// Content events seen.
    pub events: u64,
    /// The id the upstream gave the answer (Responses: for state pinning).
    pub response_id: Option<String>,
    /// Where the last event walked had values that do not change what it
    /// says: what lets the scanner read the next event of the same shape
    /// by comparing bytes (`stream::shape`).
    pub holes: Holes,
}

/// A value of an event whose bytes do not change what the event says,
/// as the walker found it: a string or number it skipped, or a string it
/// read as text. The next event of the same shape is the same bytes but
/// for these (see `stream::shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    /// Where the value starts: a string's first byte after its quote, a
    /// number's first byte. (32 bits: a stream keeps these, and only the
    /// holes of small events are used; see `stream::shape`.)
    pub start: u32,
    /// Just past it: a string's closing quote, a number's last digit.
    pub end: u32,
    /// What it is.
    pub kind: HoleKind,
}

/// What a [`Hole`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoleKind {
    /// A string skipped: only its validity matters.
    Skipped,
    /// A number skipped: only its validity matters.
    Number,
    /// A string read with `Walk::text`, its use not yet said by the
    /// protocol (see [`Holes::read_as`]).
    Read,
    /// A string read as the streamed text (in order, the event's text).
    Text,
}

/// The holes of the last event a protocol walked (kept with the stream's
/// [`Seen`], so that recording them allocates once).
#[derive(Debug, Default)]
pub struct Holes {
    /// In order of position in the event's data.
    pub spans: Vec<Hole>,
    /// The walker read the whole event and the protocol said what every
    /// string read as text was for: only then do the holes describe it.
    pub whole: bool,
}

impl Holes {
    /// Empty, for a new event's walk to record into.
    pub fn start(&mut self) -> &mut Vec<Hole> {
        self.spans.clear();
        self.whole = false;
        &mut self.spans
    }

    /// Says what the strings read with `Walk::text` were for
    /// ([`HoleKind::Text`] when they were the text streamed, in order;
    /// [`HoleKind::Skipped`] when the event's kind made them unused), and
    /// that the event was walked whole.
    pub fn read_as(&mut self, kind: HoleKind) {
        for h in &mut self.spans {
            if h.kind == HoleKind::Read {
                h.kind = kind;
            }
        }
        self.whole = true;
    }
}

/// One SSE event as bytes: `event: name` when named, then `data: …` and
/// the blank line that ends it (`data` holds no newline: JSON on one line).
pub fn sse_event(name: Option<&str>, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + name.map_or(0, str::len) + 16);
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A JSON string field, borrowed from the event when it holds no escape.
///
/// Why not `Option<Cow<'a, str>>` with `#[serde(borrow)]`: serde borrows a
/// `Cow<str>` only when it is the field's own type; inside an `Option` it
/// is always an owned `String`, an allocation per streamed event for every
/// token's text. Use `Option<Text<'a>>` (with `#[serde(borrow)]`).
#[derive(serde::Deserialize, Debug, Clone, PartialEq)]
#[serde(transparent)]
pub struct Text<'a>(#[serde(borrow)] pub std::borrow::Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Appends streamed text up to a cap (the journal keeps partial answers,
/// not whole books).
pub struct TextSink<'a> {
    /// Where the text goes.
    pub text: &'a mut String,
    /// Most bytes kept.
    pub cap: usize,
}

impl TextSink<'_> {
    /// Appends as much of `s` as fits, cut at a character boundary.
    pub fn push(&mut self, s: &str) {
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::Text;

    #[derive(serde::Deserialize)]
    struct Field<'a> {
        #[serde(borrow, default)]
        text: Option<Text<'a>>,
        #[serde(borrow, default)]
        plain: Option<Cow<'a, str>>,
    }

    #[test]
    fn text_in_an_option_is_borrowed_unless_escaped() {
        let f: Field<'_> = serde_json::from_str(r#"{"text":"tok","plain":"tok"}"#).unwrap();
        assert!(matches!(f.text.as_ref().map(|t| &t.0), Some(Cow::Borrowed("tok"))));
        // What `Text` is for: the same field as an `Option<Cow<str>>` is a new String.
        assert!(matches!(f.plain, Some(Cow::Owned(_))));
        let f: Field<'_> = serde_json::from_str(r#"{"text":"a\"b"}"#).unwrap();
        assert_eq!(f.text.as_deref(), Some("a\"b"));
        assert!(matches!(f.text.map(|t| t.0), Some(Cow::Owned(_))));
        let f: Field<'_> = serde_json::from_str("{}").unwrap();
        assert!(f.text.is_none());
    }
}
