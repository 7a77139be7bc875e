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

/// Token counts reported by the upstream (stream events or JSON body),
/// in one meaning whatever the protocol: `input` is every input token
/// (those read from or written to the prompt cache included, which
/// Anthropic counts apart), `output` every output token (reasoning
/// included, which Gemini counts apart). A count the upstream did not
/// report is `None`.
///
/// A stream reports its usage in pieces (input first and output last,
/// or cumulative counts on every event): each protocol's `take_*` takes
/// one report in, a count it has replacing the one held, so that the last
/// word on each count wins and counts said once are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub input: Option<u64>,
    /// Output tokens, reasoning included.
    pub output: Option<u64>,
    /// Input tokens read from the provider's prompt cache.
    pub cached: Option<u64>,
    /// Input tokens written to the prompt cache (Anthropic).
    pub cache_written: Option<u64>,
    /// Output tokens spent reasoning.
    pub reasoning: Option<u64>,
}

impl Usage {
    /// An OpenAI report (chat `prompt_tokens`, `completion_tokens` and
    /// their details; Responses `input_tokens`, `output_tokens`): already
    /// in this meaning.
    pub fn take_openai(
        &mut self,
        input: Option<u64>,
        output: Option<u64>,
        cached: Option<u64>,
        reasoning: Option<u64>,
    ) {
        self.input = input.or(self.input);
        self.output = output.or(self.output);
        self.cached = cached.or(self.cached);
        self.reasoning = reasoning.or(self.reasoning);
    }

    /// An Anthropic report: its `input_tokens` leaves out the tokens read
    /// from (`read`) and written to (`written`) the cache, so `input` is
    /// the three together; a report without one of them keeps the one
    /// said before.
    pub fn take_anthropic(&mut self, fresh: Option<u64>, read: Option<u64>, written: Option<u64>, output: Option<u64>) {
        let before = self.input.map(|i| i.saturating_sub(self.cached.unwrap_or(0) + self.cache_written.unwrap_or(0)));
        if fresh.is_some() || read.is_some() || written.is_some() {
            self.cached = read.or(self.cached);
            self.cache_written = written.or(self.cache_written);
            let fresh = fresh.or(before).unwrap_or(0);
            self.input = Some(fresh + self.cached.unwrap_or(0) + self.cache_written.unwrap_or(0));
        }
        self.output = output.or(self.output);
    }

    /// A Gemini `usageMetadata`: its `candidatesTokenCount` leaves out the
    /// thoughts, so `output` is both; `promptTokenCount` includes the
    /// cached content.
    pub fn take_gemini(
        &mut self,
        prompt: Option<u64>,
        candidates: Option<u64>,
        thoughts: Option<u64>,
        cached: Option<u64>,
    ) {
        let before = self.output.map(|o| o.saturating_sub(self.reasoning.unwrap_or(0)));
        if candidates.is_some() || thoughts.is_some() {
            self.reasoning = thoughts.or(self.reasoning);
            self.output = Some(candidates.or(before).unwrap_or(0) + self.reasoning.unwrap_or(0));
        }
        self.input = prompt.or(self.input);
        self.cached = cached.or(self.cached);
    }

    /// Input and output together: what a request used of a tokens-a-minute
    /// limit.
    pub fn total(&self) -> u64 {
        self.input.unwrap_or(0) + self.output.unwrap_or(0)
    }
}
