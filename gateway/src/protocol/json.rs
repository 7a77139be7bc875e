//! JSON written by hand where translation is hot: a translated request
//! carries the whole conversation (Claude Code's are 50 KB, Codex's
//! more), and serde_json escapes a string one byte at a time — on this
//! project's machines half the cost of translating a 10 KB request. Text
//! is scanned eight bytes at a time here and copied in runs; the output is
//! byte for byte what serde_json writes (property test below).

use bytes::BufMut;
use serde_json::Value;

const LOW: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes needs an escape: a control byte, `"` or
/// `\`.
fn needs_escape(x: u64) -> bool {
    escapes(x) != 0
}

/// The high bit of every byte of `x` (eight bytes read little-endian)
/// that is a control byte, `"` or `\`. The lowest one set is exact (the
/// borrow of a subtraction only spreads above a byte that matched), so
/// `trailing_zeros() / 8` is the first such byte's index.
pub fn escapes(x: u64) -> u64 {
    let control = x.wrapping_sub(LOW * 0x20) & !x;
    let quote = (x ^ (LOW * b'"' as u64)).wrapping_sub(LOW) & !(x ^ (LOW * b'"' as u64));
    let backslash = (x ^ (LOW * b'\\' as u64)).wrapping_sub(LOW) & !(x ^ (LOW * b'\\' as u64));
    (control | quote | backslash) & HIGH
}

/// The escape serde_json writes for `b`, if it needs one.
fn escape_of(b: u8) -> Option<&'static [u8]> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    static CONTROL: [[u8; 6]; 32] = {
        let mut t = [[0u8; 6]; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = [b'\\', b'u', b'0', b'0', HEX[i >> 4], HEX[i & 0xf]];
            i += 1;
        }
        t
    };
    Some(match b {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        b'\n' => b"\\n",
        b'\r' => b"\\r",
        b'\t' => b"\\t",
        0x08 => b"\\b",
        0x0c => b"\\f",
        0..=0x1f => &CONTROL[b as usize],
        _ => return None,
    })
}

/// Appends `s` as a JSON string literal (quoted, escaped).
pub fn put_str(out: &mut impl BufMut, s: &str) {
    out.put_u8(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            if !needs_escape(u64::from_le_bytes(word)) {
                i += 8;
                continue;
            }
        }
        // A chunk with an escape (or the tail): byte by byte to its end.
        let end = (i + 8).min(bytes.len());
        while i < end {
            if let Some(escape) = escape_of(bytes[i]) {
                out.put_slice(&bytes[start..i]);
                out.put_slice(escape);
                start = i + 1;
            }
            i += 1;
        }
    }
    out.put_slice(&bytes[start..]);
    out.put_u8(b'"');
}

/// Appends a number in decimal.
pub fn put_u64(out: &mut impl BufMut, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

/// The comma before every member or item but the first.
fn comma(out: &mut Vec<u8>, empty: &mut bool) {
    if !*empty {
        out.push(b',');
    }
    *empty = false;
}

/// An object being written: `{`, then members, then [`Obj::end`].
pub struct Obj<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Obj<'a> {
    /// Opens an object.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    /// Writes `"key":` and returns the buffer for its value.
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        comma(self.out, &mut self.empty);
        put_str(self.out, key);
        self.out.push(b':');
        self.out
    }

    /// A string member.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        put_str(self.key(key), value);
        self
    }

    /// A member already written as JSON (`null`, `true`, a number).
    pub fn raw(&mut self, key: &str, json: &str) -> &mut Self {
        self.key(key).extend_from_slice(json.as_bytes());
        self
    }

    /// A number member.
    pub fn u64(&mut self, key: &str, n: u64) -> &mut Self {
        put_u64(self.key(key), n);
        self
    }

    /// Any serialisable member (small values: numbers, schemas).
    pub fn value(&mut self, key: &str, value: &impl serde::Serialize) -> &mut Self {
        // Writing into memory cannot fail; a value that cannot be
        // written (a non-string map key) is written as null.
        let at = self.key(key).len();
        if serde_json::to_writer(&mut *self.out, value).is_err() {
            self.out.truncate(at);
            self.out.extend_from_slice(b"null");
        }
        self
    }

    /// A JSON tree member, its strings written as [`put_str`] does.
    pub fn tree(&mut self, key: &str, value: &Value) -> &mut Self {
        put_value(self.key(key), value);
        self
    }

    /// Closes the object.
    pub fn end(self) {
        self.out.push(b'}');
    }
}

/// Appends a JSON tree.
pub fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                put_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut obj = Obj::new(out);
            for (k, v) in map {
                obj.tree(k, v);
            }
            obj.end();
        }
        // Numbers, booleans and null: serde_json's own form, written in
        // place (writing into memory cannot fail).
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// An array being written: `[`, then items, then [`Arr::end`].
pub struct Arr<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Arr<'a> {
    /// Opens an array.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'[');
        Self { out, empty: true }
    }

    /// Returns the buffer for the next item.
    pub fn item(&mut self) -> &mut Vec<u8> {
        comma(self.out, &mut self.empty);
        self.out
    }

    /// Closes the array.
    pub fn end(self) {
        self.out.push(b']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ours(s: &str) -> String {
        let mut out = Vec::new();
        put_str(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_byte_that_needs_an_escape_is_escaped_like_serde_json() {
        for b in 0u8..=0x7f {
            let c = char::from(b);
            for s in [c.to_string(), format!("abcdefg{c}"), format!("{c}abcdefghijklmnop"), format!("0123456{c}89")] {
                assert_eq!(ours(&s), serde_json::to_string(&s).unwrap(), "{s:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn any_text_is_written_as_serde_json_writes_it(s in "\\PC*|[\\x00-\\x7f]*|(\"|\\\\|\n|é|😀|a){0,40}") {
            prop_assert_eq!(ours(&s), serde_json::to_string(&s).unwrap());
        }

        #[test]
        fn any_tree_is_written_as_serde_json_writes_it(keys in proptest::collection::vec("\\PC{0,6}", 0..6), n in any::<i64>(), f in -1e9f64..1e9) {
            let mut map = serde_json::Map::new();
            for (i, k) in keys.iter().enumerate() {
                map.insert(k.clone(), serde_json::json!([i, k, {"n": n, "f": f, "b": true, "z": null}]));
            }
            let v = Value::Object(map);
            let mut out = Vec::new();
            put_value(&mut out, &v);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&v).unwrap());
        }
    }
}
