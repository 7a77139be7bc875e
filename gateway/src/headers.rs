//! Header names tidegate reads or writes itself, each listed once: its
//! own `x-tidegate-*` headers, and the hop-by-hop headers that describe
//! one connection and never cross the proxy in either direction.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The prefix of every header tidegate owns; a client's are never
/// forwarded upstream.
pub const PREFIX: &str = "x-tidegate-";

/// Every answer: the request's id (the journal's key).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-tidegate-request-id");
/// Every answer: the upstream that gave it (`none` for tidegate's own).
pub const UPSTREAM: HeaderName = HeaderName::from_static("x-tidegate-upstream");
/// Every answer: how many attempts it took.
pub const ATTEMPTS: HeaderName = HeaderName::from_static("x-tidegate-attempts");
/// From a client: a shorter deadline than the alias's (`30s`).
pub const DEADLINE: HeaderName = HeaderName::from_static("x-tidegate-deadline");
/// From a client: `interactive` or `batch`.
pub const PRIORITY: HeaderName = HeaderName::from_static("x-tidegate-priority");
/// The client's conversation id for session affinity (`x-tidegate-session`).
pub const SESSION: HeaderName = HeaderName::from_static("x-tidegate-session");
/// On a translated answer: the client's protocol and the target's
/// (`anthropic>openai-chat`).
pub const TRANSLATED: HeaderName = HeaderName::from_static("x-tidegate-translated");
/// On a translated answer: what the request lost on the way (declared,
/// never silent), e.g. `thinking signature x2, tool web_search`.
pub const DROPPED: HeaderName = HeaderName::from_static("x-tidegate-dropped");
/// On a `count_tokens` answer tidegate estimated (no target counts
/// tokens): how (`characters/4`).
pub const ESTIMATE: HeaderName = HeaderName::from_static("x-tidegate-estimate");
/// On requests to an upstream: this already passed through a tidegate
/// (the next one makes a single attempt; the first one retries).
pub const HOP: HeaderName = HeaderName::from_static("x-tidegate-hop");

/// Anthropic's API version: sent upstream when the client gave none, and
/// what marks an unrouted request as Anthropic's.
pub const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// Whether the client sent any `x-tidegate-*` header (a deadline, a
/// priority, the hop mark). Nearly no request does, and a lookup by a
/// name that is not a standard header hashes the name first (~170
/// instructions each, three per request); one pass over the few names a
/// request carries costs a fraction of one.
pub fn any_own(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| name.as_str().starts_with("x-tidegate-"))
}

/// Headers that describe one hop: never relayed, request or answer.
/// (`Connection` may name more; callers that forward request headers
/// drop those too.)
pub static HOP_BY_HOP: [HeaderName; 9] = [
    http::header::CONNECTION,
    http::header::TRANSFER_ENCODING,
    http::header::TE,
    http::header::TRAILER,
    http::header::UPGRADE,
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Whether `name` is one of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &str) -> bool {
    // A `match` on the names (a switch on the length, then one compare):
    // this runs for every header of every request and answer. The unit
    // test below holds it to [`HOP_BY_HOP`].
    matches!(
        name,
        "connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "keep-alive"
            | "proxy-connection"
    )
}

/// Removes the [`HOP_BY_HOP`] headers from an answer's headers.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Looked for in one pass over the (few) names first: an answer seldom
    // has any, and nine removals would hash nine names for every answer.
    if headers.keys().any(|name| is_hop_by_hop(name.as_str())) {
        for name in &HOP_BY_HOP {
            headers.remove(name);
        }
    }
}

const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The headers every answer carries: id, upstream, attempts. (Static
/// names and small counts need no allocation: this runs for every
/// request.)
pub fn label(headers: &mut HeaderMap, id: uuid::Uuid, upstream: Option<&str>, attempts: usize) {
    let mut text = uuid::Uuid::encode_buffer();
    if let Ok(v) = HeaderValue::from_str(id.hyphenated().encode_lower(&mut text)) {
        headers.insert(REQUEST_ID, v);
    }
    let upstream = upstream.and_then(|u| HeaderValue::try_from(u).ok());
    headers.insert(UPSTREAM, upstream.unwrap_or(HeaderValue::from_static("none")));
    let attempts = match DIGITS.get(attempts) {
        Some(digit) => HeaderValue::from_static(digit),
        None => HeaderValue::from(attempts),
    };
    headers.insert(ATTEMPTS, attempts);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_headers_are_seen_whatever_the_client_wrote_them_as() {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert("x-tidegate", HeaderValue::from_static("1"));
        assert!(!any_own(&h), "no x-tidegate-* header");
        for name in [DEADLINE, PRIORITY, HOP, HeaderName::from_bytes(b"X-Tidegate-Deadline").unwrap()] {
            let mut with = h.clone();
            with.insert(name.clone(), HeaderValue::from_static("30s"));
            assert!(any_own(&with), "{name}");
        }
    }

    #[test]
    fn the_hop_by_hop_check_names_exactly_the_listed_headers() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name.as_str()), "{name} is listed but not matched");
        }
        for name in ["content-type", "connections", "t", "tee", "keep-alive-x", "authorization", "host"] {
            assert!(!is_hop_by_hop(name), "{name} matched but is not listed");
        }
        let mut answer = HeaderMap::new();
        answer.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        answer.insert(http::header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        answer.insert(HeaderName::from_static("keep-alive"), HeaderValue::from_static("timeout=5"));
        strip_hop_by_hop(&mut answer);
        assert_eq!(answer.len(), 1, "{answer:?}");
        assert!(answer.contains_key(http::header::CONTENT_TYPE));
    }
}
