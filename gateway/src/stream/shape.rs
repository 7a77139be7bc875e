//! The next event read from the last one's shape.
//!
//! A model's stream is hundreds of events that differ only in a few
//! values: `{"id":"chatcmpl-1","object":"chat.completion.chunk",…,
//! "delta":{"content":"‹token›"},…}` again and again, with the token (and
//! perhaps an id, an index or a sequence number) changed. Reading each
//! one with the walker costs ~2,000 instructions; comparing it with the
//! last one costs a few hundred.
//!
//! When the walker reads an event whole ([`Holes::whole`]), it notes
//! where its values were that do not change what the event says: strings
//! and numbers it skipped, and the strings that are its text. Such an
//! event is kept here (its bytes, its holes, and the stream's state it was
//! read in). The next event is read from it when it is the same bytes but
//! for its holes, each hole holding a value of the same kind that serde_json
//! would read (a string without a `\u` escape, a number): the walker would
//! then read it the same way, but for its text. Only an event that left
//! the stream's state (usage, tool calls, the end, errors) as it found it
//! is kept, and only while that state is unchanged: so reading it again
//! leaves the state alone too, and its kind is the same. Anything else
//! (another shape, a hole holding something else, a changed state) is
//! read whole again. A test compares the two on mutated events.

use std::borrow::Cow;

use crate::protocol::events::{Hole, HoleKind, Holes, Kind, Seen, TextSink};
use crate::protocol::walk::{number_end, string_end};
use crate::record::Usage;

/// Larger events are not kept (read whole each time: the read dominates
/// anyway, and a stream's memory should not grow by its largest event).
const MOST_KEPT: usize = 2 * 1024;

/// The part of a stream's [`Seen`] an event's kind and effect may depend
/// on or change, besides its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    usage: Usage,
    tool_call: bool,
    complete: bool,
    error: bool,
    response_id: bool,
}

impl State {
    /// The state `seen` is in.
    pub fn of(seen: &Seen) -> Self {
        State {
            usage: seen.usage,
            tool_call: seen.tool_call,
            complete: seen.complete,
            error: seen.error.is_some(),
            response_id: seen.response_id.is_some(),
        }
    }
}

/// The last event of a stream read whole that can be read again by
/// comparison (see the module's doc).
#[derive(Debug, Default)]
pub struct Shape {
    /// The event's bytes, its SSE lines included.
    event: Vec<u8>,
    /// Its holes, as offsets in `event`, in order.
    holes: Vec<Hole>,
    /// The state it was read in, and left as it found it.
    state: State,
    /// `event` and `holes` describe a kept event.
    kept: bool,
}

impl Shape {
    /// Reads `raw` as the kept event was read, if it is the same bytes but
    /// for its holes and the stream's state is the same: its text goes into
    /// `seen` and its kind is returned. `None`: it is to be read whole.
    pub fn read(&self, raw: &[u8], seen: &mut Seen, text_cap: usize) -> Option<Kind> {
        if !self.kept || State::of(seen) != self.state {
            return None;
        }
        let mut text: Option<Cow<'_, str>> = None;
        let (mut from, mut at) = (0, 0);
        for hole in &self.holes {
            let same = self.event.get(from..hole.start as usize)?;
            if raw.get(at..at + same.len())? != same {
                return None;
            }
            at += same.len();
            let end = match hole.kind {
                HoleKind::Number => number_end(raw, at)?,
                kind => {
                    let (end, escaped) = string_end(raw, at)?;
                    let bytes = raw.get(at..end)?;
                    if kind != HoleKind::Text {
                        // Still text to serde_json: ASCII nearly always.
                        if !bytes.is_ascii() && std::str::from_utf8(bytes).is_err() {
                            return None;
                        }
                    } else {
                        let part = match escaped {
                            false => Cow::Borrowed(std::str::from_utf8(bytes).ok()?),
                            // Decoded as the walker decodes it.
                            true => {
                                Cow::Owned(serde_json::from_slice::<String>(raw.get(at.checked_sub(1)?..=end)?).ok()?)
                            }
                        };
                        text = Some(match text {
                            None => part,
                            Some(before) => Cow::Owned(before.into_owned() + &part),
                        });
                    }
                    end
                }
            };
            at = end;
            from = hole.end as usize;
        }
        if raw.get(at..)? != self.event.get(from..)? {
            return None;
        }
        if let Some(text) = text {
            TextSink { text: &mut seen.text, cap: text_cap }.push(&text);
        }
        Some(Kind::Content)
    }

    /// Keeps `raw`, a content event just read whole, for the events after
    /// it, in place of the one kept: when the walker read it whole
    /// (`holes`, offsets in its data, which starts at `data_at` in `raw`)
    /// and it left the stream's state as it found it (`before`, `after`).
    /// Otherwise the one kept stays: what it says holds in the state it was
    /// read in, whatever came between.
    ///
    /// The holes are taken from `holes` (the stream holds one list of them
    /// while its events keep their shape, not two: memory per open stream).
    pub fn keep(&mut self, raw: &[u8], data_at: usize, holes: &mut Holes, before: State, after: State) {
        // Whole: the protocol said what every string read as text was for.
        if !holes.whole || before != after || raw.len() > MOST_KEPT {
            return;
        }
        // Below 2 KiB: the offsets fit.
        let Ok(at) = u32::try_from(data_at) else { return };
        self.event.clear();
        self.event.extend_from_slice(raw);
        self.holes = std::mem::take(&mut holes.spans);
        for h in &mut self.holes {
            h.start += at;
            h.end += at;
        }
        holes.whole = false;
        self.state = before;
        self.kept = true;
    }
}
