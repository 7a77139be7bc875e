//! The per-request record's vocabulary: how a request ended, what each
//! attempt did, the tokens it used.
//!
//! These types sit below everything that produces or reads them — the
//! relay and the stream body fill them in, the report, the journal, the
//! metrics and the dashboard read them — so none of those has to import
//! another's module to talk about an attempt. Labels are enums with an
//! `as_str`, never free strings, so a new verdict is a compile error in
//! every `match` that must decide about it.

use std::time::Duration;

use crate::classify::Class;
use crate::ids::UpstreamId;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered in full (including an upstream's verbatim error answer to
    /// a request that could not succeed as sent).
    Completed,
    /// A stream cut after content was sent.
    Incomplete,
    /// tidegate gave up (capacity/transient exhausted, deadline).
    Failed,
    /// The client went away first.
    Cancelled,
    /// Refused before any upstream was asked (auth, bad input).
    Rejected,
}

impl Outcome {
    /// Lower-case name for logs and the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Incomplete => "incomplete",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
        }
    }
}

/// What the relay did after one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The answer went to the client.
    Ok,
    /// Waited, then tried the same target again.
    RetrySame,
    /// Moved on to the alias's next target at once.
    NextTarget,
    /// A concurrency refusal: back into the upstream's queue.
    Requeue,
    /// Retrying stopped; this attempt's failure is the answer.
    GiveUp,
    /// An operator `fatal:` rule matched: never retried.
    Fatal,
    /// A stream broke after content; a continuation was asked for.
    Resume,
}

impl Verdict {
    /// Lower-case name for metrics, the journal and the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::RetrySame => "retry_same",
            Verdict::NextTarget => "next_target",
            Verdict::Requeue => "requeue",
            Verdict::GiveUp => "give_up",
            Verdict::Fatal => "fatal",
            Verdict::Resume => "resume",
        }
    }

    /// The verdict a stored label stands for (journal rows read back).
    pub fn parse(label: &str) -> Option<Verdict> {
        [
            Verdict::Ok,
            Verdict::RetrySame,
            Verdict::NextTarget,
            Verdict::Requeue,
            Verdict::GiveUp,
            Verdict::Fatal,
            Verdict::Resume,
        ]
        .into_iter()
        .find(|v| v.as_str() == label)
    }
}

/// Who asked for a wait before the next attempt — so a message never
/// attributes tidegate's own backoff to the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSource {
    /// The provider, in this response header (`retry-after`, …).
    Provider(&'static str),
    /// An operator `retry:` rule's `delay`.
    Rule,
    /// tidegate's own exponential backoff.
    Backoff,
    /// tidegate's retry budget: blind retries to this upstream are paced
    /// so an outage is not multiplied.
    Budget,
}

impl WaitSource {
    /// A short label: the header name, `rule` or `backoff`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitSource::Provider(header) => header,
            WaitSource::Rule => "rule",
            WaitSource::Backoff => "backoff",
            WaitSource::Budget => "budget",
        }
    }
}

/// What one attempt did, for the log line, the journal and messages.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptLog {
    /// Upstream index.
    pub upstream: UpstreamId,
    /// Upstream status, if an answer arrived.
    pub status: Option<u16>,
    /// Class of a failed attempt (`None` for success).
    pub class: Option<Class>,
    /// What the provider said.
    pub summary: String,
    /// What the relay did next.
    pub verdict: Verdict,
    /// Wait before the next attempt.
    pub wait: Option<Duration>,
    /// The name of the protocol it was sent in, when translated
    /// (`None`: the client's own; a name, so this vocabulary stays
    /// below the protocols).
    pub protocol: Option<&'static str>,
}

impl AttemptLog {
    /// A successful attempt on `upstream`.
    pub fn ok(upstream: UpstreamId) -> Self {
        Self {
            upstream,
            status: Some(200),
            class: None,
            summary: String::new(),
            verdict: Verdict::Ok,
            wait: None,
            protocol: None,
        }
    }

    /// What a request with status 200 and this as its only attempt does
    /// not store, because its journal row implies it (the protocol of a
    /// translated one included: the row keeps it).
    pub fn is_plain_success(&self) -> bool {
        self.status == Some(200)
            && self.class.is_none()
            && self.summary.is_empty()
            && self.verdict == Verdict::Ok
            && self.wait.is_none()
    }
}

/// Token counts reported by the upstream (stream events or JSON body).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt / input tokens.
    pub input: Option<u64>,
    /// Completion / output tokens.
    pub output: Option<u64>,
}
