//! Operator rules: vendor knowledge as data, applied by [`super::classify`].
//!
//! A `retry:` rule makes an answer retryable that the built-in reading
//! would not retry (a vendor's `400 TM.00001041` meaning "busy"), with its
//! own delay and attempt limit; a `fatal:` rule makes an answer final
//! whatever else it looks like. No vendor name lives in the code.

use std::time::Duration;

/// An operator rule: vendor knowledge as data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// Statuses it applies to; empty means any.
    pub on_status: Vec<u16>,
    /// Body substrings, any of which matches; empty list means any body;
    /// an empty substring never matches.
    pub on_body_contains: Vec<String>,
    /// Wait between attempts (retry rules); `None` uses hints or backoff.
    pub delay: Option<Duration>,
    /// Attempts allowed when this rule matches (retry rules); 1 disables it.
    pub max_attempts: Option<u32>,
    /// What a matching answer means (`class:`); `None`: capacity for a
    /// retry rule, the request's own fault for a fatal one.
    pub class: Option<super::Class>,
}

impl Rule {
    /// Status and body both match. Status 200 here is an error that came
    /// inside a `200` stream without a status of its own (an error frame):
    /// a rule with body substrings matches it by those alone, so the rule
    /// written for a vendor's `400 TM.00001041` also catches the same
    /// refusal sent as `200` + error frame.
    pub fn matches(&self, status: u16, body: &str) -> bool {
        let status_ok = self.on_status.is_empty()
            || self.on_status.contains(&status)
            || (status == 200 && !self.on_body_contains.is_empty());
        let body_ok = self.on_body_contains.is_empty()
            || self.on_body_contains.iter().any(|s| !s.is_empty() && body.contains(s.as_str()));
        status_ok && body_ok
    }
}

/// One upstream's rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    /// Answers to retry although the built-in class would not.
    pub retry: Vec<Rule>,
    /// Answers never to retry, whatever else they look like.
    pub fatal: Vec<Rule>,
}

/// Which rule matched an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// A `fatal:` rule (else a `retry:` rule).
    pub fatal: bool,
    /// Index in its list, for messages.
    pub index: usize,
    /// The retry rule's delay.
    pub delay: Option<Duration>,
    /// The retry rule's attempt limit.
    pub max_attempts: Option<u32>,
    /// The class the rule declares, if any.
    pub class: Option<super::Class>,
}

impl Rules {
    /// The first matching fatal rule, else the first matching retry rule
    /// that is not disabled (`max_attempts: 1`).
    pub fn find(&self, status: u16, body: &str) -> Option<RuleMatch> {
        if let Some(index) = self.fatal.iter().position(|r| r.matches(status, body)) {
            let class = self.fatal[index].class;
            return Some(RuleMatch { fatal: true, index, delay: None, max_attempts: None, class });
        }
        self.retry
            .iter()
            .enumerate()
            .find(|(_, r)| r.max_attempts != Some(1) && r.max_attempts != Some(0) && r.matches(status, body))
            .map(|(index, r)| RuleMatch {
                fatal: false,
                index,
                delay: r.delay,
                max_attempts: r.max_attempts,
                class: r.class,
            })
    }
}
