//! Server-sent events, read without being rewritten.
//!
//! [`Scanner`] accumulates upstream bytes, finds complete events, and asks
//! the protocol what each one is ([`Protocol::inspect`]), collecting the
//! streamed text and token usage on the way. The bytes themselves are
//! forwarded exactly as received. Scanning is linear: bytes already
//! searched for an event's end are not searched again when more arrive.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use super::shape::{Shape, State};
use crate::protocol::Protocol;
use crate::protocol::events::{self, Kind, Seen};
use crate::record::Usage;

/// Incremental SSE reader for one stream.
#[derive(Debug)]
pub struct Scanner {
    protocol: Protocol,
    /// A chunk received whole and not yet handed out: events are sliced
    /// out of it, neither copied nor allocated (a model's events arrive
    /// one read each). Empty whenever `pending` is not.
    whole: Bytes,
    /// Bytes received and not yet handed out, once an event spans reads.
    pending: BytesMut,
    /// Offset in the held bytes up to which complete events were scanned.
    scanned: usize,
    /// Offset in `pending` up to which the unfinished event was searched
    /// for its end (so a large event is not searched again per read).
    searched: usize,
    text_cap: usize,
    /// Largest unfinished event held before the stream is given up.
    max_event: usize,
    /// What the events said.
    pub seen: Seen,
    /// The last event read whole, for the next one of the same shape.
    shape: Shape,
}

impl Scanner {
    /// A scanner keeping up to `text_cap` bytes of streamed text.
    pub fn new(protocol: Protocol, text_cap: usize) -> Self {
        Self::with_limit(protocol, text_cap, usize::MAX)
    }

    /// A scanner that holds at most `max_event` bytes of one unfinished
    /// event (see [`Scanner::oversized`]).
    pub fn with_limit(protocol: Protocol, text_cap: usize, max_event: usize) -> Self {
        Self {
            protocol,
            whole: Bytes::new(),
            pending: BytesMut::new(),
            scanned: 0,
            searched: 0,
            text_cap,
            max_event,
            seen: Seen::default(),
            shape: Shape::default(),
        }
    }

    /// The unfinished event is larger than allowed: an upstream that never
    /// ends an event would otherwise be buffered without limit.
    pub fn oversized(&self) -> bool {
        self.held() - self.scanned > self.max_event
    }

    /// The largest event allowed, for messages.
    pub fn max_event(&self) -> usize {
        self.max_event
    }

    /// Appends received bytes (copied).
    pub fn feed(&mut self, chunk: &[u8]) {
        self.spill();
        self.pending.extend_from_slice(chunk);
    }

    /// Appends a received chunk: kept as it is when nothing else is held
    /// (the events in it are then slices of it), else copied after what is.
    pub fn feed_bytes(&mut self, chunk: Bytes) {
        if self.whole.is_empty() && self.pending.is_empty() {
            self.whole = chunk;
        } else {
            self.feed(&chunk);
        }
    }

    /// Moves a held whole chunk into `pending`, for bytes to follow it.
    fn spill(&mut self) {
        if !self.whole.is_empty() {
            let whole = std::mem::take(&mut self.whole);
            self.pending.extend_from_slice(&whole);
        }
    }

    /// Bytes held (scanned or not) and not yet taken.
    pub fn held(&self) -> usize {
        self.whole.len() + self.pending.len()
    }

    /// Scans the next complete event in `pending`; returns its kind and the
    /// offset just past it, or `None` when no complete event is left.
    pub fn next_event(&mut self) -> Option<(Kind, usize)> {
        let start = self.scanned;
        let held: &[u8] = if self.whole.is_empty() { &self.pending } else { &self.whole };
        // Nothing arrived since the last search (asked again after each
        // event and on every poll that finds the upstream quiet).
        if self.searched >= held.len() {
            return None;
        }
        // Resume the search a few bytes back: a separator may straddle reads.
        let from = self.searched.saturating_sub(2).max(start);
        let Some(len) = events::event_end(&held[from..]) else {
            self.searched = held.len();
            return None;
        };
        let end = from + len;
        self.scanned = end;
        self.searched = end;
        let kind = inspect(&mut self.seen, Some(&mut self.shape), self.protocol, self.text_cap, &held[start..end]);
        Some((kind, end))
    }

    /// Drops everything not yet taken (after an error event: nothing more
    /// of this stream is relayed).
    pub fn discard(&mut self) {
        self.whole = Bytes::new();
        self.pending.clear();
        self.scanned = 0;
        self.searched = 0;
    }

    /// Takes the first `upto` held bytes (complete, scanned events).
    pub fn take(&mut self, upto: usize) -> Bytes {
        let out = match self.whole.is_empty() {
            false => self.whole.split_to(upto.min(self.whole.len())),
            true => self.pending.split_to(upto.min(self.pending.len())).freeze(),
        };
        self.scanned = self.scanned.saturating_sub(out.len());
        self.searched = self.searched.saturating_sub(out.len());
        out
    }
}

/// Splits one event into its `event:` name and joined `data:` lines and
/// lets the protocol say what it is; counts content and keeps the first
/// error's data. An event of the last one's `shape` is read from it.
fn inspect(seen: &mut Seen, shape: Option<&mut Shape>, protocol: Protocol, text_cap: usize, raw: &[u8]) -> Kind {
    let Some(shape) = shape else { return read_whole(seen, protocol, text_cap, raw).0 };
    if let Some(kind) = shape.read(raw, seen, text_cap) {
        count(seen, kind, b"");
        return kind;
    }
    let before = State::of(seen);
    let (kind, data_at) = read_whole(seen, protocol, text_cap, raw);
    if let Some(at) = data_at.filter(|_| kind == Kind::Content) {
        let after = State::of(seen);
        shape.keep(raw, at, &mut seen.holes, before, after);
    }
    kind
}

/// Notes an event's kind in `seen` (`data`: an error event's).
fn count(seen: &mut Seen, kind: Kind, data: &[u8]) {
    match kind {
        // Passed on as content where it is passed on at all.
        Kind::Content | Kind::Unreadable => {
            seen.content = true;
            seen.events += 1;
        }
        Kind::Error if seen.error.is_none() => seen.error = Some(Bytes::copy_from_slice(data)),
        Kind::Done => seen.complete = true,
        Kind::Error | Kind::KeepAlive | Kind::Start | Kind::BlockStart => {}
    }
}

/// [`inspect`] without a shape: the event's lines split and its data read
/// by the protocol. Also says where its data starts in `raw` when it is
/// one line of it (the holes the walker noted are offsets in it).
fn read_whole(seen: &mut Seen, protocol: Protocol, text_cap: usize, raw: &[u8]) -> (Kind, Option<usize>) {
    // Valid UTF-8 (nearly always) is checked by the fast path and
    // borrowed; only invalid bytes take the lossy copy.
    let text = match std::str::from_utf8(raw) {
        Ok(valid) => Cow::Borrowed(valid),
        Err(_) => String::from_utf8_lossy(raw),
    };
    let (name, data) = events::fields(&text);
    let data = match data {
        None if name.is_none() => return (Kind::KeepAlive, None),
        None => Cow::Borrowed(""),
        Some(data) => data,
    };
    seen.holes.whole = false;
    let kind = protocol.inspect(name, &data, seen, text_cap);
    count(seen, kind, data.as_bytes());
    // Offsets in `raw` only when the data is a slice of it, unchanged.
    let data_at = match (&text, &data) {
        (Cow::Borrowed(_), Cow::Borrowed(d)) => (d.as_ptr() as usize).checked_sub(raw.as_ptr() as usize),
        _ => None,
    };
    (kind, data_at)
}

/// Token usage from the end of a JSON answer (`usage`, or Gemini's
/// `usageMetadata`, is at or near the end for every protocol), without
/// parsing the whole body; in [`Usage`]'s one meaning whatever the
/// protocol (told by the names of its counts).
pub fn usage_in_json(tail: &[u8]) -> Usage {
    use memchr::memmem::{Finder, FinderRev};
    use std::sync::LazyLock;
    // The counts' names, as every protocol spells them.
    const KEYS: [&str; 13] = [
        "\"prompt_tokens\"",
        "\"input_tokens\"",
        "\"completion_tokens\"",
        "\"output_tokens\"",
        "\"cached_tokens\"",
        "\"prompt_cache_hit_tokens\"",
        "\"reasoning_tokens\"",
        "\"cache_read_input_tokens\"",
        "\"cache_creation_input_tokens\"",
        "\"promptTokenCount\"",
        "\"candidatesTokenCount\"",
        "\"thoughtsTokenCount\"",
        "\"cachedContentTokenCount\"",
    ];
    // Searchers built once: this runs for every JSON answer. On bytes: the
    // keys and digits are ASCII (no UTF-8 pass over the tail). The counts
    // are looked for after the last `"usage"` (a few dozen bytes, where
    // every protocol puts them), and in the whole tail only without one.
    static USAGE: LazyLock<[FinderRev<'static>; 2]> =
        LazyLock::new(|| ["\"usage\"", "\"usageMetadata\""].map(FinderRev::new));
    static FIND: LazyLock<[Finder<'static>; 13]> = LazyLock::new(|| KEYS.map(Finder::new));
    static FIND_REV: LazyLock<[FinderRev<'static>; 13]> = LazyLock::new(|| KEYS.map(FinderRev::new));
    let number = |rest: &[u8]| -> Option<u64> {
        let rest = rest.trim_ascii_start().strip_prefix(b":")?.trim_ascii_start();
        let end = rest.iter().position(|c| !c.is_ascii_digit()).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
    };
    let read = |count: &dyn Fn(usize) -> Option<u64>| {
        let [
            prompt,
            input,
            completion,
            output,
            cached,
            hit,
            reasoning,
            read,
            written,
            g_prompt,
            g_out,
            g_thoughts,
            g_cached,
        ] = std::array::from_fn::<_, 13, _>(count);
        let mut usage = Usage::default();
        if g_prompt.is_some() || g_out.is_some() || g_thoughts.is_some() {
            usage.take_gemini(g_prompt, g_out, g_thoughts, g_cached);
        } else if read.is_some() || written.is_some() {
            usage.take_anthropic(input, read, written, output);
        } else {
            usage.take_openai(prompt.or(input), completion.or(output), cached.or(hit), reasoning);
        }
        usage
    };
    if let Some(at) = USAGE.iter().filter_map(|f| f.rfind(tail)).max() {
        let usage = &tail[at..];
        let found = read(&|i| {
            let f = &FIND[i];
            number(&usage[f.find(usage)? + f.needle().len()..])
        });
        if found != Usage::default() {
            return found;
        }
    }
    read(&|i| {
        let f = &FIND_REV[i];
        number(&tail[f.rfind(tail)? + f.needle().len()..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat stream of three words and an Anthropic stream of two, as a
    /// provider sends them (fixtures, not the simulator: the gateway's
    /// tests do not depend on the fake provider).
    const CHAT: &[u8] = include_bytes!("fixtures/chat.sse");
    const ANTHROPIC: &[u8] = include_bytes!("fixtures/anthropic.sse");

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
        let bytes = CHAT;
        for chunk in [1, 7, 64, 10_000] {
            let (s, kinds) = scan_all(Protocol::OpenAiChat, bytes, chunk);
            assert_eq!(kinds.first(), Some(&Kind::Content));
            assert_eq!(kinds.last(), Some(&Kind::Done));
            assert_eq!(s.seen.text, "tok0 tok1 tok2 ");
            assert!(s.seen.complete);
            assert!(s.seen.error.is_none());
        }
    }

    #[test]
    fn anthropic_stream_kinds_text_and_usage() {
        let bytes = ANTHROPIC;
        let (s, kinds) = scan_all(Protocol::Anthropic, bytes, 13);
        assert_eq!(kinds[0], Kind::Start);
        assert_eq!(kinds[2], Kind::KeepAlive);
        assert_eq!(*kinds.last().unwrap(), Kind::Done);
        assert_eq!(s.seen.text, "tok0 tok1 ");
        assert_eq!(s.seen.usage, Usage { input: Some(10), output: Some(2), ..Usage::default() });
    }

    #[test]
    fn vendor_error_objects_are_errors_usage_chunks_are_not() {
        let vendor = br#"data: {"error_code":"TM.00001041","error_msg":"3 sessions max"}

"#;
        let (s, kinds) = scan_all(Protocol::OpenAiChat, vendor, 7);
        assert_eq!(kinds, vec![Kind::Error]);
        assert!(s.seen.error.is_some());
        let coded = b"data: {\"code\":1302,\"msg\":\"busy\"}\n\n";
        assert_eq!(scan_all(Protocol::OpenAiChat, coded, 64).1, vec![Kind::Error]);
        let usage = b"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
        assert_eq!(scan_all(Protocol::OpenAiChat, usage, 64).1, vec![Kind::Content]);
    }

    #[test]
    fn errors_comments_and_crlf() {
        let mut s = Scanner::new(Protocol::OpenAiChat, 100);
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
    fn a_chunk_fed_whole_hands_out_slices_of_itself() {
        let mut s = Scanner::new(Protocol::OpenAiChat, 100);
        let chunk = Bytes::from_static(b"data: {\"choices\":[]}\n\ndata: {\"cho");
        s.feed_bytes(chunk.clone());
        let (_, end) = s.next_event().unwrap();
        assert!(s.next_event().is_none());
        let out = s.take(end);
        assert_eq!(&out[..], b"data: {\"choices\":[]}\n\n");
        assert_eq!(out.as_ptr(), chunk.as_ptr(), "the event was copied");
        // The unfinished rest is joined with the next chunk.
        s.feed_bytes(Bytes::from_static(b"ices\":[]}\n\n"));
        let (_, end) = s.next_event().unwrap();
        assert_eq!(&s.take(end)[..], b"data: {\"choices\":[]}\n\n");
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn whole_chunks_and_copies_scan_alike() {
        for chunk in [1, 2, 3, 7, 16, 64, 1 << 20] {
            let (mut copied, mut whole) =
                (Scanner::new(Protocol::OpenAiChat, 1 << 20), Scanner::new(Protocol::OpenAiChat, 1 << 20));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for piece in CHAT.chunks(chunk) {
                copied.feed(piece);
                whole.feed_bytes(Bytes::copy_from_slice(piece));
                while let Some((kind, end)) = copied.next_event() {
                    a.push((kind, copied.take(end)));
                }
                while let Some((kind, end)) = whole.next_event() {
                    b.push((kind, whole.take(end)));
                }
            }
            assert_eq!(a, b, "chunks of {chunk}");
            assert_eq!(copied.seen.events, whole.seen.events);
            assert!(!a.is_empty());
        }
    }

    #[test]
    fn take_hands_out_scanned_bytes_only() {
        let mut s = Scanner::new(Protocol::OpenAiChat, 100);
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
        let io = |input, output| Usage { input: Some(input), output: Some(output), ..Usage::default() };
        let oa = br#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(usage_in_json(oa), io(12, 34));
        let an = br#"{"content":[],"usage":{"input_tokens": 7, "output_tokens": 9}}"#;
        assert_eq!(usage_in_json(an), io(7, 9));
        assert_eq!(usage_in_json(b"{}"), Usage::default());
        // Responses API: fields after the usage object.
        let responses = br#"{"output":[],"usage":{"input_tokens":3,"output_tokens":4},"user":null,"metadata":{}}"#;
        assert_eq!(usage_in_json(responses), io(3, 4));
        // Counts not under a "usage" key, or a later "usage" without them:
        // the whole tail is searched.
        let bare = br#"{"prompt_tokens":5,"completion_tokens":6,"text":"the \"usage\" word"}"#;
        assert_eq!(usage_in_json(bare), io(5, 6));
        // Every count, each protocol in its own names and meaning.
        let all = |input, output, cached, written, reasoning| Usage {
            input: Some(input),
            output: Some(output),
            cached,
            cache_written: written,
            reasoning,
        };
        let oa = br#"{"usage":{"prompt_tokens":20,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":16},"completion_tokens_details":{"reasoning_tokens":4}}}"#;
        assert_eq!(usage_in_json(oa), all(20, 9, Some(16), None, Some(4)));
        let an = br#"{"usage":{"input_tokens":3,"cache_creation_input_tokens":5,"cache_read_input_tokens":12,"output_tokens":9}}"#;
        assert_eq!(usage_in_json(an), all(20, 9, Some(12), Some(5), None));
        let gemini = br#"{"candidates":[],"usageMetadata":{"promptTokenCount":20,"candidatesTokenCount":5,"totalTokenCount":29,"cachedContentTokenCount":16,"thoughtsTokenCount":4}}"#;
        assert_eq!(usage_in_json(gemini), all(20, 9, Some(16), None, Some(4)));
        let deepseek = br#"{"usage":{"prompt_tokens":20,"completion_tokens":9,"prompt_cache_hit_tokens":16}}"#;
        assert_eq!(usage_in_json(deepseek), all(20, 9, Some(16), None, None));
    }

    #[test]
    fn text_cap_respects_char_boundaries() {
        let mut s = Scanner::new(Protocol::OpenAiChat, 4);
        s.feed("data: {\"choices\":[{\"delta\":{\"content\":\"héllo\"}}]}\n\n".as_bytes());
        s.next_event();
        assert_eq!(s.seen.text, "hél");
    }

    #[test]
    fn an_event_larger_than_allowed_is_noticed_and_a_big_one_scans_in_linear_time() {
        let mut s = Scanner::with_limit(Protocol::OpenAiChat, 16, 1024);
        s.feed(b"data: {\"choices\":[]}\n\n");
        assert!(s.next_event().is_some());
        s.feed(&[b'x'; 1000]);
        assert!(s.next_event().is_none() && !s.oversized());
        s.feed(&[b'x'; 100]);
        assert!(s.oversized());
        // 8 MiB event arriving 16 KiB at a time: every read searches only
        // the new bytes (the old scanner took seconds here).
        let mut s = Scanner::new(Protocol::OpenAiChat, 16);
        let started = tokio::time::Instant::now();
        s.feed(b"data: {\"x\":\"");
        for _ in 0..512 {
            s.feed(&[b'a'; 16 * 1024]);
            assert!(s.next_event().is_none());
        }
        s.feed(b"\"}\n\n");
        assert!(s.next_event().is_some());
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    /// What a stream has seen, but for the walker's notes.
    fn said(seen: &Seen) -> String {
        let Seen { text, usage, content, tool_call, complete, error, events, response_id, holes: _ } = seen;
        format!("{text:?} {usage:?} {content} {tool_call} {complete} {error:?} {events} {response_id:?}")
    }

    /// `events` read in order by a scanner's path (the last shape kept)
    /// and read whole each: the same kinds and the same seen. Returns
    /// whether the last event was read from the shape.
    fn both_ways(protocol: Protocol, events: &[&[u8]]) -> bool {
        const CAP: usize = 64;
        let (mut fast, mut whole, mut shape) = (Seen::default(), Seen::default(), Shape::default());
        let mut shaped = false;
        for (i, event) in events.iter().enumerate() {
            let by_shape = shape.read(event, &mut fast, CAP);
            shaped = by_shape.is_some();
            let kind = match by_shape {
                Some(kind) => {
                    count(&mut fast, kind, b"");
                    kind
                }
                None => inspect(&mut fast, Some(&mut shape), protocol, CAP, event),
            };
            let expected = inspect(&mut whole, None, protocol, CAP, event);
            let shown = || events.iter().map(|e| String::from_utf8_lossy(e).into_owned()).collect::<Vec<_>>();
            assert_eq!(kind, expected, "event {i} of {:?}", shown());
            assert_eq!(said(&fast), said(&whole), "event {i} of {:?}", shown());
        }
        shaped
    }

    /// The shape's reading is the whole reading's: a kept event (after a
    /// prelude that sets the state it is read in) followed by each variant
    /// of it with one byte dropped or replaced by JSON's punctuation, and by
    /// other texts (escapes, a `\u` escape, non-ASCII, invalid UTF-8, a
    /// quote, empty), for the chat, Anthropic and Responses events a model
    /// streams most.
    #[test]
    fn an_event_read_from_the_last_ones_shape_is_read_as_if_whole() {
        let cases: &[(Protocol, &str, &str)] = &[
            (
                Protocol::OpenAiChat,
                "",
                "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o\",\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"xY3\"}\n\n",
            ),
            (
                Protocol::OpenAiChat,
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n",
                "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\":\"}}]},\"finish_reason\":null}]}\n\n",
            ),
            (
                Protocol::OpenAiChat,
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}},{\"index\":1,\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
            ),
            (
                Protocol::Anthropic,
                "",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi there\"}}\n\n",
            ),
            (
                Protocol::Anthropic,
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"x\\\": 1\"}}\n\n",
            ),
            (
                Protocol::OpenAiResponses,
                "",
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":7,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\",\"logprobs\":[],\"obfuscation\":\"ab\"}\n\n",
            ),
            (
                Protocol::OpenAiResponses,
                "data: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"function_call\",\"id\":\"fc\"}}\n\n",
                "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":9,\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{\\\"q\\\"\"}\n\n",
            ),
        ];
        let (mut shaped, mut cases_run) = (0, 0);
        for &(protocol, prelude, kept) in cases {
            let prelude: &[&[u8]] = if prelude.is_empty() { &[] } else { &[prelude.as_bytes()] };
            let run = |next: &[u8]| both_ways(protocol, &[prelude, &[kept.as_bytes(), next]].concat());
            // The kept event again is read from its shape.
            assert!(run(kept.as_bytes()), "{kept}");
            let (answered, all) = crate::protocol::walk::mutated(&[kept], |variant| run(variant.as_bytes()));
            shaped += answered;
            cases_run += all;
            // Other values in the holes.
            let value = ["Hello", "Hi there", "Hi", "{\\\"a\\\":", "{\\\"x\\\": 1", "{\\\"q\\\"", "a"]
                .into_iter()
                .find(|v| kept.contains(&format!("\"{v}\"")))
                .unwrap_or("a");
            for other in ["", "x", "line\\nbreak", "\\\"", "\\u00e9", "é — ü", "a\\\\b", "\u{1}", "\\x"] {
                let next = kept.replacen(&format!("\"{value}\""), &format!("\"{other}\""), 1);
                run(next.as_bytes());
            }
            let mut invalid = kept.replacen(&format!("\"{value}\""), "\"\u{ff}\"", 1).into_bytes();
            if let Some(at) = invalid.windows(2).position(|w| w == "\u{ff}".as_bytes()) {
                invalid[at + 1] = b'x';
                invalid[at] = 0xff;
            }
            run(&invalid);
            // A state changed since the kept event (usage, then the end).
            let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\n";
            both_ways(protocol, &[prelude, &[kept.as_bytes(), usage, kept.as_bytes()]].concat());
        }
        // Most variants with a byte changed inside a value are still of
        // the shape; the rest are read whole.
        assert!(shaped * 10 > cases_run && shaped < cases_run, "{shaped} of {cases_run} read from the shape");
        eprintln!("{shaped} of {cases_run} variants read from the shape");
    }
}
