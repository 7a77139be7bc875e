//! Keeping configured secrets out of what tidegate passes on or stores.
//!
//! A provider's message can carry a key: some echo the key they were sent
//! in a 401 ("Incorrect API key provided: sk-…"), a proxy may echo a
//! header. tidegate's upstream keys are shared by every client, so such a
//! message must not reach any of them, nor the journal, the admin API,
//! the bench reasons or the logs. Provider text enters tidegate at a few
//! places — an error answer's body and headers
//! ([`crate::upstream::Upstream::error_body`]), a failure carried in a 2xx
//! answer, an error or unreadable event mid-stream — and each passes it
//! through [`scrub`] once, before anything reads it; everything built from
//! it after (classification summaries, verbatim answers, translated error
//! events, journal rows) is built from the scrubbed text.
//!
//! The secrets are known to the process as a whole: every
//! [`crate::config::Secret`] registers its value when it is made (upstream
//! and pool account keys, cloud credentials, client and admin keys,
//! exporter headers), and a cloud's minted access tokens as they are
//! fetched. A secret is never forgotten (a key rotated out by a reload is
//! still one); values shorter than [`MIN_LEN`] are not scrubbed (they
//! would mangle ordinary words, and no key worth the name is that short).
//! Successful answers are passed on byte for byte, unscanned.

use std::borrow::Cow;
use std::sync::RwLock;

use bytes::Bytes;

/// Shortest value scrubbed.
pub const MIN_LEN: usize = 8;

/// What stands in a scrubbed secret's place.
pub const MARKER: &str = "[redacted]";

/// Most values remembered (minted tokens come hourly; the oldest minted
/// ones go first past this).
const MAX_KNOWN: usize = 4096;

static KNOWN: RwLock<Vec<Box<[u8]>>> = RwLock::new(Vec::new());

/// Makes `value` a secret that [`scrub`] replaces from now on.
pub fn register(value: &str) {
    if value.len() < MIN_LEN {
        return;
    }
    let bytes = value.as_bytes();
    if KNOWN.read().is_ok_and(|known| known.iter().any(|k| **k == *bytes)) {
        return;
    }
    let Ok(mut known) = KNOWN.write() else { return };
    if known.iter().any(|k| **k == *bytes) {
        return;
    }
    if known.len() >= MAX_KNOWN {
        known.remove(0);
    }
    // Longest first, so a secret that contains another is replaced whole.
    let at = known.partition_point(|k| k.len() >= bytes.len());
    known.insert(at, bytes.into());
}

/// `text` with every known secret replaced by [`MARKER`]; borrowed (no
/// copy) when it holds none, as nearly always.
pub fn scrub(text: &[u8]) -> Cow<'_, [u8]> {
    let Ok(known) = KNOWN.read() else { return Cow::Borrowed(text) };
    let mut out: Option<Vec<u8>> = None;
    for secret in known.iter() {
        let current: &[u8] = out.as_deref().unwrap_or(text);
        let Some(first) = memchr::memmem::find(current, secret) else { continue };
        let mut replaced = Vec::with_capacity(current.len());
        let mut rest = current;
        let mut at = first;
        loop {
            replaced.extend_from_slice(&rest[..at]);
            replaced.extend_from_slice(MARKER.as_bytes());
            rest = &rest[at + secret.len()..];
            match memchr::memmem::find(rest, secret) {
                Some(next) => at = next,
                None => break,
            }
        }
        replaced.extend_from_slice(rest);
        out = Some(replaced);
    }
    match out {
        Some(v) => Cow::Owned(v),
        None => Cow::Borrowed(text),
    }
}

/// [`scrub`] of a body held as [`Bytes`] (the same bytes when clean).
pub fn scrub_bytes(body: Bytes) -> Bytes {
    match scrub(&body) {
        Cow::Borrowed(_) => body,
        Cow::Owned(v) => Bytes::from(v),
    }
}

/// [`scrub`] of text.
pub fn scrub_str(text: &str) -> Cow<'_, str> {
    match scrub(text.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        // A secret is whole UTF-8 and so is the marker: what is left of
        // valid text is valid.
        Cow::Owned(v) => Cow::Owned(String::from_utf8_lossy(&v).into_owned()),
    }
}

/// An answer's headers with every value holding a secret replaced (a
/// proxy that echoes the request's headers).
pub fn scrub_headers(headers: &mut http::HeaderMap) {
    for value in headers.values_mut() {
        if let Cow::Owned(clean) = scrub(value.as_bytes())
            && let Ok(clean) = http::HeaderValue::from_bytes(&clean)
        {
            *value = clean;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_secrets_are_replaced_and_clean_text_is_not_copied() {
        register("sk-unit-test-secret-0001");
        register("sk-unit-test-secret-0001-longer");
        register("short");
        let text = b"bad key sk-unit-test-secret-0001, and sk-unit-test-secret-0001-longer; short";
        let clean = scrub(text);
        assert_eq!(&*clean, b"bad key [redacted], and [redacted]; short".as_slice());
        assert!(matches!(scrub(b"nothing here"), Cow::Borrowed(_)));
        assert_eq!(scrub_str("x sk-unit-test-secret-0001x"), "x [redacted]x");
        let mut headers = http::HeaderMap::new();
        headers.insert("x-echo", "Bearer sk-unit-test-secret-0001".parse().unwrap());
        scrub_headers(&mut headers);
        assert_eq!(headers["x-echo"], "Bearer [redacted]");
    }
}
