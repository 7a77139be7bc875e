//! The bounds on what one request (or one provider answer) can make
//! tidegate do or hold while it reads and translates it. Each exists
//! because an unbounded version was a way for one client to crash, stall
//! or bloat the gateway for every other:
//!
//! - nesting: JSON read recursively (a typed reader re-reading a block it
//!   kept as raw bytes starts serde_json's depth count afresh) overflowed
//!   a runtime thread's stack at ~2,000 levels and aborted the process;
//! - declared drops: one note per kind the client names, searched
//!   linearly, was quadratic in client-chosen type names, and its header
//!   grew past what HTTP clients accept;
//! - tool-call arguments: gathered whole to write a call in one event,
//!   they grew without limit (and past the per-event limit).
//!
//! What is kept of conversations is bounded in [`crate::kept`].

use std::fmt;

use super::refusal::Refusal;

/// Deepest nesting of objects and arrays in the JSON tidegate reads:
/// serde_json's own limit for the trees it builds, applied as well where
/// tidegate's readers recurse themselves.
pub const MAX_DEPTH: usize = 128;

/// Most kinds of dropped things declared one by one; further kinds are
/// counted together.
pub const MAX_DROPPED_KINDS: usize = 32;

/// Longest name of a dropped thing declared (a client picks type names).
pub const MAX_DROPPED_NAME: usize = 64;

/// Refusal of JSON nested deeper than [`MAX_DEPTH`] at `at`.
pub fn too_deep(at: impl fmt::Display) -> Refusal {
    Refusal::from(format!("{at}: nested deeper than {MAX_DEPTH} levels (tidegate's limit for the JSON it reads)"))
}

/// A serde_json error reading `what`, naming tidegate's depth limit when
/// that is what it hit.
pub fn json_error(what: &str, e: &serde_json::Error) -> Refusal {
    let text = e.to_string();
    if text.starts_with("recursion limit exceeded") {
        return too_deep(what);
    }
    Refusal::from(format!("{what}: {text}"))
}

/// `name` cut to [`MAX_DROPPED_NAME`] bytes (at a character boundary).
pub fn short_name(name: &str) -> &str {
    if name.len() <= MAX_DROPPED_NAME {
        return name;
    }
    let mut end = MAX_DROPPED_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_limit_is_named_and_names_are_cut_at_a_boundary() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let e = serde_json::from_str::<serde_json::Value>(&deep).unwrap_err();
        assert_eq!(json_error("request body", &e), too_deep("request body"));
        let e = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        assert!(json_error("request body", &e).to_string().starts_with("request body: EOF"), "{}", json_error("x", &e));
        let name = "é".repeat(MAX_DROPPED_NAME);
        assert!(short_name(&name).len() <= MAX_DROPPED_NAME && short_name(&name).len() >= MAX_DROPPED_NAME - 1);
        assert_eq!(short_name("tool x"), "tool x");
    }
}
