//! Whether a relayed JSON answer arrived whole, and the usage at its end,
//! read from its content as the client will decode it.
//!
//! tidegate asks upstreams for `accept-encoding: identity`, but a proxy in
//! between may compress anyway. The client gets the bytes as they came
//! (its HTTP library decodes them); what tidegate reads of them — does the
//! answer end as JSON does, what `usage` says — must be read from the
//! decoded content, or a complete gzip answer looks cut (its last bytes
//! are the gzip trailer, not `}`). So gzip and deflate are decoded as they
//! pass (a copy of the last 2 KiB of content is all that is kept). An
//! encoding tidegate does not decode (br, zstd) is judged by its framing:
//! a `Content-Length` body that arrived whole (hyper refuses one that was
//! cut), else it cannot be told. The journal says which of these judged a
//! request (`completion_from`); the usual case, an identity answer read as
//! itself, leaves it empty.

use std::io::Write;

use http::{HeaderMap, header};

use super::sse;
use crate::record::Usage;

/// Bytes of decoded content kept from the end of an answer: enough for
/// `usage` and the closing brace.
const TAIL: usize = 2048;

/// How the end of a JSON answer was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// Its own bytes (no content encoding).
    Content,
    /// Its content decoded (the journal's label: `gzip-decoded` or
    /// `deflate-decoded`): the encoding's own end and the JSON's both
    /// reached.
    Decoded(&'static str),
    /// An encoding tidegate does not decode, whose `Content-Length` was
    /// delivered in full.
    ContentLength,
    /// An encoding tidegate does not decode, ended by the connection's
    /// close: whether it was cut cannot be told (taken as complete).
    Unverified,
}

impl Judged {
    /// The journal's `completion_from`: `None` for the usual case.
    pub fn label(self) -> Option<&'static str> {
        match self {
            Judged::Content => None,
            Judged::Decoded(label) => Some(label),
            Judged::ContentLength => Some("content-length"),
            Judged::Unverified => Some("unverified"),
        }
    }
}

/// What the end of an answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// It arrived whole.
    pub complete: bool,
    /// Tokens its `usage` reported.
    pub usage: Usage,
    /// How that was told.
    pub judged: Judged,
}

/// The last [`TAIL`] bytes written to it.
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn keep(&mut self, data: &[u8]) {
        if data.len() >= TAIL {
            self.0.clear();
            self.0.extend_from_slice(&data[data.len() - TAIL..]);
        } else {
            let excess = (self.0.len() + data.len()).saturating_sub(TAIL);
            self.0.drain(..excess);
            self.0.extend_from_slice(data);
        }
    }
}

impl Write for Tail {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.keep(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A decoder of the content, writing into the tail.
enum Decoder {
    Gzip(flate2::write::GzDecoder<Tail>),
    Deflate(flate2::write::ZlibDecoder<Tail>),
}

enum Reading {
    /// Identity: the bytes are the content.
    Plain(Tail),
    /// Decoded on the way (boxed: rare, and a decoder's state is large).
    Decoding(Box<Decoder>),
    /// The decoder refused the bytes: not what the header said.
    Undecodable,
    /// Not decoded: counting bytes against a `Content-Length`, if any.
    Opaque { expected: Option<u64>, seen: u64 },
}

/// Reads a JSON answer's end as it is relayed (see the module's doc).
pub struct JsonEnd {
    reading: Reading,
}

impl Default for JsonEnd {
    fn default() -> Self {
        Self { reading: Reading::Plain(Tail::default()) }
    }
}

impl std::fmt::Debug for JsonEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonEnd")
    }
}

/// The answer's content coding, lower-cased: `None` for identity.
fn coding(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_ENCODING)?.to_str().unwrap_or("unknown").trim();
    (!value.is_empty() && !value.eq_ignore_ascii_case("identity")).then(|| value.to_ascii_lowercase())
}

impl JsonEnd {
    /// For an answer with these headers.
    pub fn new(headers: &HeaderMap) -> Self {
        let Some(coding) = coding(headers) else { return Self::default() };
        let reading = match coding.as_str() {
            "gzip" | "x-gzip" => {
                Reading::Decoding(Box::new(Decoder::Gzip(flate2::write::GzDecoder::new(Tail::default()))))
            }
            "deflate" => {
                Reading::Decoding(Box::new(Decoder::Deflate(flate2::write::ZlibDecoder::new(Tail::default()))))
            }
            _ => Reading::Opaque {
                expected: headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse().ok()),
                seen: 0,
            },
        };
        Self { reading }
    }

    /// The next bytes of the answer, as relayed.
    pub fn feed(&mut self, data: &[u8]) {
        match &mut self.reading {
            Reading::Plain(tail) => tail.keep(data),
            Reading::Decoding(decoder) => {
                let written = match decoder.as_mut() {
                    Decoder::Gzip(d) => d.write_all(data),
                    Decoder::Deflate(d) => d.write_all(data),
                };
                if written.is_err() {
                    self.reading = Reading::Undecodable;
                }
            }
            Reading::Undecodable => {}
            Reading::Opaque { seen, .. } => *seen = seen.saturating_add(data.len() as u64),
        }
    }

    /// The answer ended (its body said so): was it whole, and its usage.
    pub fn finish(&mut self) -> End {
        let reading = std::mem::replace(&mut self.reading, Reading::Undecodable);
        match reading {
            Reading::Plain(tail) => {
                End { complete: json_complete(&tail.0), usage: sse::usage_in_json(&tail.0), judged: Judged::Content }
            }
            Reading::Decoding(decoder) => {
                let (finished, name) = match *decoder {
                    Decoder::Gzip(d) => (d.finish(), "gzip-decoded"),
                    Decoder::Deflate(d) => (d.finish(), "deflate-decoded"),
                };
                match finished {
                    // The encoding's own end was reached: the content is
                    // whole if it also ends as JSON does.
                    Ok(tail) => End {
                        complete: json_complete(&tail.0) && !tail.0.is_empty(),
                        usage: sse::usage_in_json(&tail.0),
                        judged: Judged::Decoded(name),
                    },
                    Err(_) => End { complete: false, usage: Usage::default(), judged: Judged::Decoded(name) },
                }
            }
            Reading::Undecodable => End { complete: false, usage: Usage::default(), judged: Judged::Unverified },
            Reading::Opaque { expected: Some(expected), seen } => {
                End { complete: seen == expected, usage: Usage::default(), judged: Judged::ContentLength }
            }
            Reading::Opaque { expected: None, .. } => {
                End { complete: true, usage: Usage::default(), judged: Judged::Unverified }
            }
        }
    }
}

/// Whether the last bytes of a JSON answer (every endpoint tidegate
/// serves answers JSON) close it: `}` or `]`.
fn json_complete(tail: &[u8]) -> bool {
    let trimmed = tail.trim_ascii_end();
    trimmed.is_empty() || matches!(trimmed.last(), Some(b'}' | b']'))
}

/// A whole body's decoded content, at most `limit` bytes of it, for
/// reading what it says (an error's message, a stored response's id):
/// `None` when it has no content coding tidegate decodes, or is not
/// what its header says.
pub fn decoded(headers: &HeaderMap, body: &[u8], limit: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut plain = Vec::new();
    let read = match coding(headers)?.as_str() {
        "gzip" | "x-gzip" => flate2::read::GzDecoder::new(body).take(limit as u64).read_to_end(&mut plain),
        "deflate" => flate2::read::ZlibDecoder::new(body).take(limit as u64).read_to_end(&mut plain),
        _ => return None,
    };
    read.ok().map(|_| plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap_or_default();
        e.finish().unwrap_or_default()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            if let Ok(v) = http::HeaderValue::from_str(value) {
                h.insert(*name, v);
            }
        }
        h
    }

    const ANSWER: &[u8] = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#;

    fn run(h: &HeaderMap, bytes: &[u8], pieces: usize) -> End {
        let mut end = JsonEnd::new(h);
        for chunk in bytes.chunks(bytes.len().div_ceil(pieces).max(1)) {
            end.feed(chunk);
        }
        end.finish()
    }

    #[test]
    fn a_whole_gzip_answer_is_complete_with_its_usage() {
        let h = headers(&[("content-encoding", "gzip")]);
        let end = run(&h, &gzip(ANSWER), 5);
        assert!(end.complete, "{end:?}");
        assert_eq!((end.usage.input, end.usage.output), (Some(7), Some(5)));
        assert_eq!(end.judged.label(), Some("gzip-decoded"));
    }

    #[test]
    fn a_cut_gzip_answer_is_incomplete() {
        let h = headers(&[("content-encoding", "gzip")]);
        let z = gzip(ANSWER);
        for cut in [1, 10, z.len() / 2, z.len() - 4, z.len() - 1] {
            assert!(!run(&h, &z[..cut], 3).complete, "cut at {cut} of {}", z.len());
        }
        // Whole gzip, but the JSON inside was cut before it was compressed.
        assert!(!run(&h, &gzip(&ANSWER[..40]), 2).complete);
    }

    #[test]
    fn plain_and_undecoded_answers() {
        let end = run(&HeaderMap::new(), ANSWER, 4);
        assert!(end.complete && end.judged == Judged::Content && end.usage.output == Some(5));
        assert!(!run(&HeaderMap::new(), &ANSWER[..30], 2).complete);
        let br = headers(&[("content-encoding", "br"), ("content-length", "10")]);
        let whole = run(&br, &[0u8; 10], 3);
        assert!(whole.complete && whole.judged.label() == Some("content-length"));
        assert!(!run(&br, &[0u8; 9], 3).complete);
        let unframed = run(&headers(&[("content-encoding", "zstd")]), &[0u8; 9], 3);
        assert!(unframed.complete && unframed.judged.label() == Some("unverified"));
        // Says gzip, is not.
        let liar = run(&headers(&[("content-encoding", "gzip")]), ANSWER, 1);
        assert!(!liar.complete);
    }

    #[test]
    fn whole_bodies_are_decoded_for_reading() {
        let h = headers(&[("content-encoding", "gzip")]);
        assert_eq!(decoded(&h, &gzip(ANSWER), 1 << 20).as_deref(), Some(ANSWER));
        assert_eq!(decoded(&h, &gzip(ANSWER), 10).map(|d| d.len()), Some(10));
        assert_eq!(decoded(&HeaderMap::new(), ANSWER, 1 << 20), None);
    }
}
