//! Reading a few fields of a streamed event without serde's generic
//! machinery. Every event relayed is read (for its text, usage, tool
//! calls and errors: what keeps partial output and sees a `200` + error
//! frame), and serde_json's derived readers spent ~3,000 instructions on a
//! 150-byte chat chunk — a quarter of tidegate's cost per relayed event.
//! [`Walk`] reads the same grammar in a few hundred.
//!
//! It is a fast path, not a second parser: whatever it is not sure to read
//! exactly as serde_json would (an escaped key, a `\u` escape, a choice
//! written as an array, a duplicate field, nesting deeper than
//! [`MAX_DEPTH`]) makes it give up (`None`), and the caller reads the
//! event with serde_json instead. Where it does answer, it validates what
//! it skips as serde_json does (strings, numbers, literals, nesting,
//! nothing after the value), so a malformed event is still malformed.
//! The protocols' tests compare the two readers on mutated events.

use std::borrow::Cow;

use serde::de::{DeserializeOwned, IgnoredAny};

use super::events::{Hole, HoleKind, Text};
use super::json::escapes;

/// Deeper than this, serde_json decides (its own limit is 128).
pub const MAX_DEPTH: usize = 64;

/// The bytes that end a plain run in a string: `"`, `\` and controls.
static STOPS: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// A cursor over one JSON text.
pub struct Walk<'a, 'h> {
    text: &'a str,
    at: usize,
    /// Where the holes go, when recording.
    holes: Option<&'h mut Vec<Hole>>,
}

impl<'a, 'h> Walk<'a, 'h> {
    /// A cursor at the start of `text`.
    pub fn new(text: &'a str) -> Self {
        Walk { text, at: 0, holes: None }
    }

    /// A cursor that records the values it skips and the strings it reads
    /// as text ([`Hole`]s) into `holes`.
    pub fn recording(text: &'a str, holes: Option<&'h mut Vec<Hole>>) -> Self {
        Walk { text, at: 0, holes }
    }

    #[inline(always)]
    fn hole(&mut self, start: usize, end: usize, kind: HoleKind) {
        if let Some(holes) = self.holes.as_deref_mut() {
            // Past 4 GiB the offsets wrap: such an event is never kept.
            holes.push(Hole { start: start as u32, end: end as u32, kind });
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not JSON whitespace, not consumed.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        let b = self.bytes();
        loop {
            let c = *b.get(self.at)?;
            // Events are written compact: one compare settles nearly all.
            if c > b' ' || !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(c);
            }
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.at += usize::from(hit);
        hit
    }

    /// Each member of an object, in order: `member` gets its key's bytes
    /// (one without escapes: an escaped key gives up) and must read or
    /// skip the value.
    pub fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        if !self.eat(b'{') {
            return None;
        }
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return None;
            }
            let key = self.key_here()?;
            if !self.eat(b':') {
                return None;
            }
            member(self, key)?;
            if self.eat(b',') {
                continue;
            }
            return self.eat(b'}').then_some(());
        }
    }

    /// Each element of an array, in order: `element` must read or skip it.
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            element(self)?;
            if self.eat(b',') {
                continue;
            }
            return self.eat(b']').then_some(());
        }
    }

    /// Whether the next value is an object (not consumed).
    pub fn at_object(&mut self) -> bool {
        self.peek() == Some(b'{')
    }

    /// Consumes a `null`, if that is the next value.
    pub fn null(&mut self) -> bool {
        let hit = self.peek() == Some(b'n') && self.bytes()[self.at..].starts_with(b"null");
        self.at += if hit { 4 } else { 0 };
        hit
    }

    /// A string value, borrowed when it holds no escape. One with a `\u`
    /// escape, or anything else serde_json would not read as a string,
    /// gives up.
    pub fn string(&mut self) -> Option<Cow<'a, str>> {
        if self.peek() != Some(b'"') {
            return None;
        }
        self.string_here()
    }

    /// [`Walk::string`] when the caller has seen the opening `"`.
    fn string_here(&mut self) -> Option<Cow<'a, str>> {
        let start = self.at;
        let (end, escaped) = self.scan_string()?;
        if !escaped {
            return self.text.get(start + 1..end).map(Cow::Borrowed);
        }
        serde_json::from_str::<String>(self.text.get(start..=end)?).ok().map(Cow::Owned)
    }

    /// A key without escapes, as bytes (what it is compared with is
    /// ASCII), the caller having seen its opening `"`.
    #[inline(always)]
    fn key_here(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        match self.scan_string()? {
            (end, false) => self.bytes().get(start + 1..end),
            (_, true) => None,
        }
    }

    /// Moves past the string that starts here (at its `"`): the index of
    /// its closing quote, and whether it holds an escape.
    #[inline(always)]
    fn scan_string(&mut self) -> Option<(usize, bool)> {
        let (end, escaped) = string_end(self.bytes(), self.at + 1)?;
        self.at = end + 1;
        Some((end, escaped))
    }

    /// [`Walk::scan_string`] of a skipped string, recorded as a hole.
    #[inline(always)]
    fn skip_string(&mut self) -> Option<()> {
        let start = self.at + 1;
        let (end, _) = self.scan_string()?;
        self.hole(start, end, HoleKind::Skipped);
        Some(())
    }

    /// [`Walk::number`] of a skipped number, recorded as a hole.
    #[inline(always)]
    fn skip_number(&mut self) -> Option<()> {
        let start = self.at;
        self.number()?;
        self.hole(start, self.at, HoleKind::Number);
        Some(())
    }

    /// Skips any value, checked as serde_json checks it. A string or a
    /// number (most of what is skipped: ids, names, indexes) is skipped
    /// here; only nesting goes through the recursive [`Walk::skip_at`].
    #[inline]
    pub fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.skip_string(),
            b'-' | b'0'..=b'9' => self.skip_number(),
            _ => self.skip_at(0),
        }
    }

    fn skip_at(&mut self, depth: usize) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => self.object(|w, _| w.skip_at(depth + 1)),
            b'[' => self.array(|w| w.skip_at(depth + 1)),
            b'"' => self.skip_string(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.skip_number(),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let hit = self.bytes()[self.at..].starts_with(word);
        self.at += if hit { word.len() } else { 0 };
        hit.then_some(())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        self.at = number_end(self.bytes(), self.at)?;
        Some(())
    }

    /// Skips a value and gives its text, for serde_json to read (a rare,
    /// small part such as a usage object).
    pub fn raw(&mut self) -> Option<&'a str> {
        self.peek()?;
        let start = self.at;
        // What serde_json reads is not a hole: its bytes matter.
        let holes = self.holes.take();
        let skipped = self.skip();
        self.holes = holes;
        skipped?;
        self.text.get(start..self.at)
    }

    /// A field whose value matters only by being there: `null` is
    /// `Some(None)`, any other value is skipped and `Some(Some(_))`, as
    /// serde reads an `Option<IgnoredAny>`.
    pub fn present(&mut self) -> Option<Option<IgnoredAny>> {
        if self.null() {
            return Some(None);
        }
        self.skip().map(|()| Some(IgnoredAny))
    }

    /// A text field: `null` or a string, as serde reads an
    /// `Option<Text>`.
    pub fn text(&mut self) -> Option<Option<Text<'a>>> {
        if self.null() {
            return Some(None);
        }
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.at + 1;
        let text = self.string_here()?;
        self.hole(start, self.at - 1, HoleKind::Read);
        Some(Some(Text(text)))
    }

    /// A rare, small part (a usage object) read by serde_json: `null`, or
    /// a value serde_json reads as `T` (one it refuses gives up, and the
    /// whole event is serde_json's, which refuses it too).
    pub fn part<T: DeserializeOwned>(&mut self) -> Option<Option<T>> {
        if self.null() {
            return Some(None);
        }
        self.raw().and_then(|raw| serde_json::from_str::<T>(raw).ok()).map(Some)
    }

    /// An object's `type` string, its other members skipped: `null` is
    /// `Some(None)`, an object without a `type` gives up (serde's derived
    /// reader refuses it), as serde reads an `Option<{type}>`.
    pub fn typed(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.null() {
            return Some(None);
        }
        if !self.at_object() {
            return None;
        }
        let mut kind = None;
        self.object(|w, key| match key {
            b"type" => once(&mut kind, w.string()),
            _ => w.skip(),
        })?;
        kind.map(Some)
    }

    /// Succeeds when nothing but whitespace is left.
    pub fn end(&mut self) -> Option<()> {
        (self.peek().is_none()).then_some(())
    }
}

/// The end of the string whose content starts at `i` (just past its
/// opening quote): the index of its closing quote and whether it holds an
/// escape; `None` where serde_json would refuse it or the walker leaves it
/// to serde_json (a `\u` escape).
#[inline(always)]
pub fn string_end(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        i = next_stop(b, i)?;
        match *b.get(i)? {
            b'"' => return Some((i, escaped)),
            b'\\' => {
                // A `\u` escape (surrogates) is serde_json's to judge.
                match *b.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    _ => return None,
                }
                escaped = true;
                i += 2;
            }
            _ => return None,
        }
    }
}

/// The end of the number that starts at `i`, read as serde_json reads
/// one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
pub fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |i: &mut usize| {
        let from = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > from
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => {
            digits(&mut i);
        }
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return None;
        }
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        if !digits(&mut i) {
            return None;
        }
    }
    Some(i)
}

/// The index of the first `"`, `\\` or control byte at or after `i`:
/// eight bytes at a time while eight are left (a string's end is nearly
/// always followed by more of the text), then a byte at a time.
fn next_stop(b: &[u8], mut i: usize) -> Option<usize> {
    while let Some(word) = b.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        let stops = escapes(u64::from_le_bytes(word));
        if stops != 0 {
            return Some(i + (stops.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    Some(i + b.get(i..)?.iter().position(|&c| STOPS[usize::from(c)])?)
}

/// Sets a field read once: a second time gives up (serde's derived
/// readers refuse a duplicate field, and serde_json's answer is the one
/// that counts).
pub fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value?);
            Some(())
        }
    }
}

/// The walker's test against serde_json for one protocol: `check` (which
/// asserts that the walker's answer is serde_json's, and says whether it
/// answered) must answer every one of `texts`, and over their mutated
/// variants ([`mutated`], more than 10,000) at least a quarter.
#[cfg(test)]
pub(crate) fn agrees(texts: &[&str], mut check: impl FnMut(&str) -> bool) {
    for text in texts {
        assert!(check(text), "the walker reads {text}");
    }
    let (answered, cases) = mutated(texts, check);
    assert!(cases > 10_000 && answered > cases / 4, "{answered} of {cases} answered");
}

/// Each text, and its variants with one byte dropped or replaced by
/// JSON's punctuation (a quote, a backslash, brackets, a digit, a control
/// byte...), given to `check`, which asserts that the walker agrees with
/// serde_json wherever it answers and says whether it answered. Returns
/// how many it answered, of how many.
#[cfg(test)]
pub(crate) fn mutated(texts: &[&str], mut check: impl FnMut(&str) -> bool) -> (usize, usize) {
    let (mut answered, mut cases) = (0, 0);
    let swaps: &[u8] = b"\"\\{}[],:0-.en \x01";
    for text in texts {
        let bytes = text.as_bytes();
        for at in 0..bytes.len() {
            let mut variants = vec![[&bytes[..at], &bytes[at + 1..]].concat()];
            variants.extend(swaps.iter().map(|&b| [&bytes[..at], &[b][..], &bytes[at + 1..]].concat()));
            for v in variants {
                let Ok(text) = std::str::from_utf8(&v) else { continue };
                cases += 1;
                answered += usize::from(check(text));
            }
        }
    }
    (answered, cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skips one whole text with the walker; `None` when it gave up.
    fn walks(text: &str) -> Option<()> {
        let mut w = Walk::new(text);
        w.skip()?;
        w.end()
    }

    #[test]
    fn it_accepts_only_what_serde_json_accepts() {
        let texts = [
            r#"{"a":[1,-2.5e+3,0,true,false,null,"x\n\"y"],"b":{}}"#,
            " [ ] ",
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":1,}"#,
            r#"[1,]"#,
            r#"{"a" 1}"#,
            r#"{"a":"b"} x"#,
            r#"{"a":"b\q"}"#,
            "{\"a\":\"b\u{1}\"}",
            r#"{"a":"unterminated}"#,
            r#"{"é":"ü","k":"v"}"#,
        ];
        for text in texts {
            let serde = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
            if let Some(()) = walks(text) {
                assert!(serde, "walked what serde_json refuses: {text}");
            } else {
                assert!(!serde, "gave up on what serde_json reads: {text}");
            }
        }
    }

    #[test]
    fn strings_are_borrowed_without_escapes_and_decoded_with_them() {
        let mut w = Walk::new(r#""plain text""#);
        assert!(matches!(w.string(), Some(Cow::Borrowed("plain text"))));
        let mut w = Walk::new(r#""a long line, longer than eight bytes, with \"quotes\"\n""#);
        assert_eq!(w.string().as_deref(), Some("a long line, longer than eight bytes, with \"quotes\"\n"));
        // `\u` is serde_json's to read: the walker gives up.
        assert_eq!(Walk::new(r#""\u00e9""#).string(), None);
        assert_eq!(Walk::new(r#"{"\u0061":1}"#).object(|w, _| w.skip()), None);
    }

    #[test]
    fn the_word_scan_finds_the_first_stop_a_byte_scan_finds() {
        // Every stop and some bytes near them in value (0x1f/0x20, 0x21/0x23,
        // 0x5b/0x5d, high bytes whose subtraction borrows), at every offset
        // of texts up to 40 bytes, after every prefix of plain bytes.
        let bytes = [b'"', b'\\', 0, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa0, 0xdf, 0xff, b'a'];
        for len in 0..40 {
            for at in 0..=len {
                for &b in &bytes {
                    for &second in &[b'a', b'"', 0x01] {
                        let mut text = vec![b'x'; len];
                        if at < len {
                            text[at] = b;
                        }
                        if at + 3 < len {
                            text[at + 3] = second;
                        }
                        for from in 0..=len.min(9) {
                            let naive = text[from..].iter().position(|&c| STOPS[usize::from(c)]).map(|i| i + from);
                            assert_eq!(next_stop(&text, from), naive, "{text:?} from {from}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn nesting_beyond_its_depth_is_left_to_serde_json() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(walks(&deep), None);
        let shallow = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        assert_eq!(walks(&shallow), Some(()));
    }

    #[test]
    fn a_field_read_twice_gives_up() {
        let mut slot = None;
        assert_eq!(once(&mut slot, Some(1)), Some(()));
        assert_eq!(once(&mut slot, Some(2)), None);
        assert_eq!(slot, Some(1));
    }
}
