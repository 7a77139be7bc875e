//! Session affinity: keep a conversation on the target (pool account) that
//! holds its prompt cache.
//!
//! Providers cache prompt prefixes per account or deployment; a
//! conversation that moves pays full price and latency for its whole
//! history on the next turn. Each request's session key comes from, in
//! order: `x-tidegate-session`; what the client already sends (Claude
//! Code's `x-claude-code-session-id`, Codex's `session_id` header, the
//! OpenAI `prompt_cache_key` field); else a fingerprint of the client with
//! the conversation's opening (system prompt and first messages, which
//! later turns repeat). The binding session → upstream is written when an
//! answer succeeds, preferred on the next turn, moved when its target
//! fails or is benched, and kept in [`crate::pins::Pins`] (shared with
//! `state:`) for `affinity_ttl`.
//!
//! When the bound account is merely busy, the request waits for it if the
//! account's expected wait (the next slot, from its queue's drain rate) is
//! no longer than what moving costs: reading the whole prompt uncached on
//! another account, at [`PREFILL_TOKENS_PER_SECOND`]. Otherwise it moves.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::headers;
use crate::ids::UpstreamId;

/// How fast a provider reads a prompt it has not cached, in tokens per
/// second: the cost of moving a conversation is its prompt at this rate
/// (large models read roughly 1,000–5,000 uncached tokens per second; a
/// cached prefix is read several times faster and at a tenth of the price).
pub const PREFILL_TOKENS_PER_SECOND: f64 = 2500.0;

/// A request's session and where it was last answered.
#[derive(Debug, Clone)]
pub struct Session {
    /// The key the binding is kept under (a hash: no client text in it).
    pub key: String,
    /// The upstream that answered this session last, if still bound.
    pub bound: Option<UpstreamId>,
    /// What moving costs: the prompt read uncached elsewhere.
    pub moving_cost: Duration,
}

/// The part of a request body that a conversation repeats every turn.
#[derive(Deserialize)]
struct Opening<'a> {
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "systemInstruction")]
    system_instruction: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    contents: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    prompt_cache_key: Option<String>,
}

/// The session key of a request, or `None` when nothing identifies a
/// conversation. (One client's sessions are its own: the binding is kept
/// under the client's owner, see [`crate::pins`].)
pub fn session_key(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    const CLAUDE_CODE: HeaderName = HeaderName::from_static("x-claude-code-session-id");
    const CODEX: HeaderName = HeaderName::from_static("session_id");
    let header = |name: HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty());
    let told = header(headers::SESSION)
        .map(|v| ("tidegate", v.to_owned()))
        .or_else(|| header(CLAUDE_CODE).map(|v| ("claude-code", v.to_owned())))
        .or_else(|| header(CODEX).map(|v| ("codex", v.to_owned())));
    let mut hasher = DefaultHasher::new();
    match told {
        Some((kind, value)) => (kind, value).hash(&mut hasher),
        None => {
            let opening: Opening<'_> = serde_json::from_slice(body).ok()?;
            if let Some(key) = opening.prompt_cache_key.filter(|k| !k.is_empty()) {
                ("prompt_cache_key", key).hash(&mut hasher);
            } else {
                let items: Vec<&RawValue> = match (opening.messages, opening.contents, opening.input) {
                    (Some(messages), _, _) => messages,
                    (_, Some(contents), _) => contents,
                    (_, _, Some(input)) if input.get().starts_with('[') => serde_json::from_str(input.get()).ok()?,
                    (_, _, Some(input)) => vec![input],
                    _ => Vec::new(),
                };
                let first = opening_items(&items);
                if first.is_empty() {
                    return None;
                }
                let system = opening.system.or(opening.instructions).or(opening.system_instruction);
                ("opening", system.map(RawValue::get), first.iter().map(|m| m.get()).collect::<Vec<_>>())
                    .hash(&mut hasher);
            }
        }
    }
    Some(format!("{:016x}", hasher.finish()))
}

/// The conversation's first user message, with the system or developer
/// message before it if there is one: what every later turn repeats.
fn opening_items<'a>(items: &[&'a RawValue]) -> Vec<&'a RawValue> {
    #[derive(Deserialize)]
    struct Role<'r> {
        #[serde(borrow, default)]
        role: Option<&'r str>,
    }
    let instructs = |item: &RawValue| {
        serde_json::from_str::<Role<'_>>(item.get()).is_ok_and(|r| matches!(r.role, Some("system" | "developer")))
    };
    match items {
        [first, second, ..] if instructs(first) => vec![*first, *second],
        [first, ..] => vec![*first],
        [] => Vec::new(),
    }
}

/// What moving a request of `body_len` bytes to an account without its
/// prompt cached costs in time (about four bytes a token).
pub fn moving_cost(body_len: usize) -> Duration {
    Duration::from_secs_f64(body_len as f64 / 4.0 / PREFILL_TOKENS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(headers: &[(&str, &str)], body: &str) -> Option<String> {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.insert(http::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
        }
        session_key(&map, body.as_bytes())
    }

    #[test]
    fn a_conversation_keeps_its_key_from_turn_to_turn() {
        let turn1 = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"fix the bug"}]}"#;
        let turn2 = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"fix the bug"},{"role":"assistant","content":"done"},{"role":"user","content":"and test it"}]}"#;
        let other = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"write docs"}]}"#;
        let one = key(&[], turn1);
        assert!(one.is_some());
        assert_eq!(key(&[], turn2), one, "later turns repeat the opening");
        let chat1 = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}]}"#;
        let chat2 = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
        assert_eq!(key(&[], chat1), key(&[], chat2), "later turns repeat the opening");
        assert_ne!(key(&[], turn1), key(&[], other));
        // What the client says wins, whatever the body.
        let claude = key(&[("x-claude-code-session-id", "abc")], turn1);
        assert_eq!(claude, key(&[("x-claude-code-session-id", "abc")], other));
        assert_ne!(claude, key(&[("x-tidegate-session", "abc")], turn1));
        let cached = r#"{"model":"m","prompt_cache_key":"conv-1","input":"hi"}"#;
        assert_eq!(key(&[], cached), key(&[], &cached.replace("hi", "more")));
        assert_eq!(key(&[], r#"{"model":"m"}"#), None, "nothing to know a conversation by");
        assert_eq!(key(&[], "not json"), None);
    }

    #[test]
    fn moving_costs_the_prompt_read_uncached() {
        assert_eq!(moving_cost(400_000), Duration::from_secs(40));
        assert_eq!(moving_cost(0), Duration::ZERO);
    }
}
