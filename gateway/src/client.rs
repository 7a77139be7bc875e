//! Which client sent a request, and what its own retry loop does with
//! tidegate's final answer.
//!
//! When tidegate gives up, the client decides what happens next, and each
//! client reads different signals: the official SDKs obey
//! `x-should-retry` and a `Retry-After` of up to 60 s; Codex ignores
//! `x-should-retry`, sleeps whatever `Retry-After` says (hours, if told)
//! and stops only on a `usage_limit_reached` error or a `400`; Claude Code
//! waits a `Retry-After` of up to 60 s and stops at once above it; Gemini
//! CLI waits a `RetryInfo` of up to 300 s; opencode and Qwen Code retry
//! every `429` and `5xx` whatever the headers say and stop on any other
//! `4xx`. The same honest answer must therefore be spelled differently
//! for each, or a "stop" becomes a second round of blind retries and a
//! "come back in 5 s" a give-up. The table, measured against each client,
//! is in the README ("When tidegate gives up").

use std::time::Duration;

use http::header::USER_AGENT;
use http::{HeaderMap, HeaderValue};

use crate::classify::Class;

/// The least a come-back asks a client to wait: tidegate already retried
/// up to the deadline, and a client that came back at once would only
/// continue that (its retry is a new request with a new deadline).
pub const COME_BACK_AFTER: Duration = Duration::from_secs(1);

/// A client whose retry contract tidegate's final answers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Client {
    /// An official SDK (OpenAI, Anthropic, Google) or anything not
    /// recognised: the SDK contract (`x-should-retry`, `Retry-After`,
    /// `retry-after-ms`).
    #[default]
    Sdk,
    /// OpenAI Codex CLI (`originator: codex_*`).
    Codex,
    /// Claude Code (`user-agent: claude-cli/…`).
    ClaudeCode,
    /// Gemini CLI (`user-agent: GeminiCLI/…`).
    GeminiCli,
    /// opencode (`user-agent: opencode/…`).
    Opencode,
    /// Qwen Code (`user-agent: QwenCode/…`).
    QwenCode,
}

impl Client {
    /// The client, from what it sends: its `user-agent` and Codex's
    /// `originator` header.
    pub fn recognise(headers: &HeaderMap) -> Self {
        // One pass over the (few) names, the first of each kept as `get`
        // would: a lookup of `originator`, not a standard name, hashes it
        // first, and this runs for every request.
        let (mut agent, mut originator) = (None, None);
        for (name, value) in headers {
            if name == USER_AGENT {
                agent = agent.or(Some(value));
            } else if name.as_str() == "originator" {
                originator = originator.or(Some(value));
            }
        }
        fn text(v: Option<&HeaderValue>) -> &str {
            v.and_then(|v| v.to_str().ok()).unwrap_or_default()
        }
        let (agent, originator) = (text(agent), text(originator));
        if originator.starts_with("codex") || agent.starts_with("codex_") || agent.starts_with("codex-") {
            Client::Codex
        } else if originator == "opencode" || agent.starts_with("opencode/") {
            Client::Opencode
        } else if agent.starts_with("claude-cli/") || agent.starts_with("claude-code/") {
            Client::ClaudeCode
        } else if agent.contains("GeminiCLI/") {
            Client::GeminiCli
        } else if agent.starts_with("QwenCode/") {
            Client::QwenCode
        } else {
            Client::Sdk
        }
    }

    /// The longest wait this client sits out as told and then sends the
    /// request again: beyond it, a "come back" is ignored (the SDKs,
    /// Claude Code), slept for hours (Codex, Qwen Code) or a stop (Gemini
    /// CLI's `RetryInfo` over 300 s).
    pub fn waits_up_to(self) -> Duration {
        match self {
            Client::GeminiCli => Duration::from_secs(300),
            _ => Duration::from_secs(60),
        }
    }

    /// What tidegate's final answer tells this client: come back after
    /// `wait` when the failure can clear (capacity, transient) within
    /// what the client waits on its own, else stop.
    pub fn advice(self, class: Class, wait: Option<Duration>) -> Advice {
        match wait {
            Some(wait) if matches!(class, Class::Capacity | Class::Transient) && wait <= self.waits_up_to() => {
                Advice::ComeBack(wait.max(COME_BACK_AFTER))
            }
            wait => Advice::Stop(wait),
        }
    }
}

/// opencode decides whether to retry an error by the words of its
/// message (any `429`, `500`, `502`, `503`, `504` or `524` in it, "rate
/// limit", "overloaded", "server error", "timeout", …), whatever its
/// status: a stop is only a stop to it in other words. The same account,
/// without them — a status number is split by a thin space ("4 29").
pub fn without_retry_words(message: &str) -> String {
    const WORDS: [(&str, &str); 12] = [
        ("rate-limited", "limited"),
        ("rate limited", "limited"),
        ("rate-limit", "limit"),
        ("rate limit", "limit"),
        ("rate_limit", "limit"),
        ("too many requests", "too much asked"),
        ("overloaded", "over capacity"),
        ("server_error", "provider failure"),
        ("server error", "provider failure"),
        ("internal error", "provider failure"),
        ("unavailable", "not available"),
        ("timeout", "time limit"),
    ];
    let mut out = message.to_owned();
    for (from, to) in WORDS {
        out = replace_ignoring_case(&out, from, to);
    }
    out = replace_ignoring_case(&out, "timed out", "ran out of time");
    for code in ["429", "500", "502", "503", "504", "524"] {
        out = out.replace(code, &format!("{}\u{2009}{}", &code[..1], &code[1..]));
    }
    out
}

/// `text` with every ASCII-case-insensitive `from` replaced by `to`.
fn replace_ignoring_case(text: &str, from: &str, to: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(from) {
        out.push_str(&text[at..at + found]);
        out.push_str(to);
        at += found + from.len();
    }
    out.push_str(&text[at..]);
    out
}

/// What a final answer tells the client to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Send the request again after this wait (capacity is expected to
    /// free by then).
    ComeBack(Duration),
    /// Do not retry: the failure will not clear soon (a reset hours away,
    /// an account that cannot serve). The wait, when one is known, is
    /// when it may.
    Stop(Option<Duration>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn clients_are_recognised_by_what_they_send() {
        let cases: &[(&[(&str, &str)], Client)] = &[
            (
                &[("user-agent", "codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm"), ("originator", "codex_exec")],
                Client::Codex,
            ),
            (&[("originator", "codex_cli_rs")], Client::Codex),
            (&[("user-agent", "claude-cli/2.1.332 (external, cli)")], Client::ClaudeCode),
            (&[("user-agent", "GeminiCLI/0.61.0/gemini-2.5-pro (linux; x64)")], Client::GeminiCli),
            (
                &[
                    ("user-agent", "opencode/1.18.33 (linux; x64) ai-sdk/provider-utils/4.0.40"),
                    ("originator", "opencode"),
                ],
                Client::Opencode,
            ),
            (&[("user-agent", "QwenCode/0.24.4 (linux; x64)")], Client::QwenCode),
            (&[("user-agent", "OpenAI/Python 2.8.1")], Client::Sdk),
            (&[("user-agent", "Anthropic/JS 0.70.0")], Client::Sdk),
            (&[], Client::Sdk),
        ];
        for (pairs, want) in cases {
            assert_eq!(Client::recognise(&headers(pairs)), *want, "{pairs:?}");
        }
    }

    #[test]
    fn a_stop_to_opencode_holds_none_of_the_words_it_retries_on() {
        let said = "upstream x is still rate-limited (capacity error); Last answer: 429 You've hit your session \
                    limit (rate_limit_error), Overloaded, 503 Service Unavailable, timed out after 1500ms";
        let plain = without_retry_words(said);
        for word in
            ["429", "500", "503", "rate-limit", "rate_limit", "rate limit", "overloaded", "unavailable", "timed out"]
        {
            assert!(!plain.to_lowercase().contains(word), "{word} in {plain}");
        }
        assert!(plain.contains("session limit") && plain.contains("4\u{2009}29"), "{plain}");
    }

    #[test]
    fn a_wait_the_client_sits_out_is_a_come_back_and_anything_else_a_stop() {
        let s = Duration::from_secs;
        assert_eq!(Client::Sdk.advice(Class::Capacity, Some(s(5))), Advice::ComeBack(s(5)));
        let soon = Client::Sdk.advice(Class::Capacity, Some(Duration::from_millis(63)));
        assert_eq!(soon, Advice::ComeBack(COME_BACK_AFTER), "never at once");
        assert_eq!(Client::Sdk.advice(Class::Transient, Some(s(60))), Advice::ComeBack(s(60)));
        assert_eq!(Client::Sdk.advice(Class::Capacity, Some(s(61))), Advice::Stop(Some(s(61))));
        assert_eq!(Client::Codex.advice(Class::Capacity, Some(s(18_000))), Advice::Stop(Some(s(18_000))));
        assert_eq!(Client::GeminiCli.advice(Class::Capacity, Some(s(200))), Advice::ComeBack(s(200)));
        assert_eq!(Client::GeminiCli.advice(Class::Capacity, Some(s(301))), Advice::Stop(Some(s(301))));
        assert_eq!(Client::ClaudeCode.advice(Class::Entitlement, Some(s(5))), Advice::Stop(Some(s(5))));
        assert_eq!(Client::QwenCode.advice(Class::Capacity, None), Advice::Stop(None));
    }
}
