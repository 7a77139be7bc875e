//! What one request did, written out once, when it is really over.
//!
//! A [`Report`] is a plain value: the request's owner
//! ([`crate::exchange::Exchange`]) fills it in as things happen and, at
//! the end it alone sees, writes it out once with [`Report::write`] — the
//! request's log line, its metrics, the dashboard's buckets, its spans
//! and its journal row. Where a request is counted in flight, and what a
//! request dropped unfinished means, is the owner's business.

use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use crate::classify::Class;
use crate::ids::UpstreamId;
use crate::journal::{Detail, Journal, Record, micros};
use crate::logging::Clean;
use crate::metrics::{Metrics, Sample};
use crate::record::{AttemptLog, Outcome, Usage};

/// The record of one request. Its fields are written by the request's
/// owner only ([`crate::exchange::Exchange`]; routing says what it learned
/// in a `route::Asked` the owner takes in) and read here.
#[derive(Debug)]
pub struct Report {
    /// Request id (`x-tidegate-request-id`).
    pub(crate) id: uuid::Uuid,
    /// When the request arrived.
    pub(crate) started: Instant,
    /// Client key name.
    pub(crate) client: Option<String>,
    /// Model alias asked for (shared with the config for a known alias,
    /// so recording it allocates nothing).
    pub(crate) model: Option<Arc<str>>,
    /// Client asked for SSE.
    pub(crate) stream: bool,
    /// Upstream that gave the final answer.
    pub(crate) upstream: Option<UpstreamId>,
    /// Every attempt.
    pub(crate) attempts: Vec<AttemptLog>,
    /// Status sent to the client.
    pub(crate) status: u16,
    /// Error class of the final failure, if any.
    pub(crate) class: Option<Class>,
    /// Error message (what the client was told, or why a stream broke).
    pub(crate) error: Option<String>,
    /// Time to the first byte sent to the client.
    pub(crate) ttfb: Option<Duration>,
    /// Time spent waiting for upstream slots and rate buckets.
    pub(crate) queue_wait: Duration,
    /// Tokens reported by the upstream.
    pub(crate) usage: Usage,
    /// Text already delivered when a stream broke.
    pub(crate) partial: Option<String>,
    /// How a JSON answer's completion was told when not from its own
    /// bytes (see [`crate::stream::json_end::Judged::label`]).
    pub(crate) completion_from: Option<&'static str>,
    /// The client's volume was flagged as far above its baseline.
    pub(crate) anomaly: bool,
    /// The client's protocol (`None` before the endpoint is known).
    pub(crate) protocol: Option<crate::protocol::Protocol>,
    /// What translation left out of the request, declared.
    pub(crate) dropped: Option<String>,
    /// Counted in the metrics only: neither journaled nor logged (a
    /// refusal before routing beyond the per-second sample, see
    /// [`crate::flood`]).
    pub(crate) counted_only: bool,
    /// Its trace, when `otel` is configured.
    pub(crate) trace: Option<Arc<crate::otel::TraceCtx>>,
    /// The client program, when recognised: whose retry contract
    /// tidegate's final answer speaks.
    pub(crate) agent: crate::client::Client,
}

/// Where a finished report goes: the journal and the metrics.
#[derive(Debug)]
pub struct Sink {
    /// The journal, unless it is off.
    pub journal: Option<Journal>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Upstream names by index.
    pub names: Arc<[String]>,
    /// The journal's number for these names (see `Journal::register`).
    pub generation: u16,
    /// Keep partial stream text.
    pub keep_partial: bool,
    /// The dashboard's recent buckets.
    pub recent: Arc<crate::recent::Recent>,
    /// Requests whose report is not finished yet (streams included): what
    /// a graceful shutdown waits for.
    pub active: Arc<std::sync::atomic::AtomicUsize>,
    /// Refusals before routing: counted, sampled into the journal.
    pub flood: Arc<crate::flood::Flood>,
    /// OpenTelemetry export, when `otel` is configured.
    pub tracer: Option<Arc<crate::otel::Exporter>>,
}

impl Sink {
    /// The name of upstream `id` in this generation of the config.
    pub fn name(&self, id: Option<UpstreamId>) -> Option<&str> {
        id.and_then(|id| self.names.get(id.index())).map(String::as_str)
    }

    /// Requests not finished yet.
    pub fn active(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts a refusal before routing (metrics by `reason`, the flood
    /// counter); whether this one is journaled and logged individually.
    pub fn refused(&self, reason: &str) -> bool {
        self.metrics.rejected(reason);
        self.flood.admit(tokio::time::Instant::now())
    }

    /// Resolves once no request is in flight (polled every 20 ms; callers
    /// bound the wait).
    pub async fn idle(&self) {
        while self.active() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

impl Report {
    /// A fresh record for a request that just arrived.
    pub fn new(id: uuid::Uuid, started: Instant) -> Self {
        Self {
            id,
            started,
            client: None,
            model: None,
            stream: false,
            upstream: None,
            attempts: Vec::new(),
            status: 0,
            class: None,
            error: None,
            ttfb: None,
            queue_wait: Duration::ZERO,
            usage: Usage::default(),
            partial: None,
            completion_from: None,
            anomaly: false,
            protocol: None,
            dropped: None,
            counted_only: false,
            trace: None,
            agent: crate::client::Client::Sdk,
        }
    }

    fn count(&self, outcome: Outcome, sink: &Sink, total: Duration) {
        for a in &self.attempts {
            sink.metrics.attempt(sink.names.get(a.upstream.index()).map_or("-", String::as_str), a.verdict.as_str());
        }
        let failed = self.attempts.iter().filter_map(|a| a.class.map(|c| (a.upstream, c)));
        sink.recent.observe(self.attempts.last().map(|a| a.upstream), outcome, failed);
        sink.metrics.observe(&Sample {
            outcome,
            class: self.class.map_or("-", Class::as_str),
            upstream: sink.name(self.upstream).unwrap_or("-"),
            model: self.model.as_deref(),
            queue_wait: self.queue_wait.as_secs_f64(),
            ttfb: self.ttfb.map(|d| d.as_secs_f64()),
            total: total.as_secs_f64(),
            tokens: (self.usage.input, self.usage.output),
        });
    }

    /// The journal's record; moves what the report owns (it is finished).
    fn record(&mut self, outcome: Outcome, sink: &Sink, total: Duration) -> Record {
        let (n_attempts, first) = (self.attempts.len(), self.attempts.first().map(|a| a.upstream));
        let status = self.status;
        let mut attempts = std::mem::take(&mut self.attempts);
        // A single plain success is implied by the request row itself.
        let mut via = None;
        if status == 200 && matches!(attempts.as_slice(), [only] if only.is_plain_success()) {
            via = attempts[0].protocol.and_then(crate::protocol::Protocol::parse);
            attempts.clear();
        }
        let partial = if sink.keep_partial { self.partial.take() } else { None };
        let error = self.error.take();
        let completion_from = self.completion_from;
        let dropped = self.dropped.take();
        let detail = (error.is_some()
            || partial.is_some()
            || !attempts.is_empty()
            || completion_from.is_some()
            || dropped.is_some())
        .then(|| Box::new(Detail { error, partial, attempts, completion_from, dropped }));
        Record {
            id: self.id,
            client: self.client.take(),
            model: self.model.take(),
            queue_us: micros(self.queue_wait),
            total_us: micros(total),
            ttfb_us: self.ttfb.and_then(|d| std::num::NonZeroI64::new(micros(d).max(1))),
            tokens: crate::journal::TokenCounts::of(&self.usage),
            status,
            n_attempts: u16::try_from(n_attempts).unwrap_or(u16::MAX),
            upstream: first.and_then(|i| u16::try_from(i.index()).ok()),
            outcome,
            class: self.class,
            stream: self.stream,
            anomaly: self.anomaly,
            protocol: self.protocol,
            via,
            generation: sink.generation,
            detail,
        }
    }

    /// Writes the request out with `outcome`: metrics and the dashboard's
    /// buckets always; unless it is counted only, its spans, its log line
    /// and (last: the row takes the strings the report owns) its journal
    /// row.
    pub fn write(mut self, outcome: Outcome, sink: &Sink) {
        // One clock read for the metrics, the log line and the row.
        let total = self.started.elapsed();
        self.count(outcome, sink, total);
        if self.counted_only {
            return;
        }
        if let Some(trace) = self.trace.take() {
            self.export(outcome, sink, &trace);
        }
        self.log_line(outcome, sink.journal.is_some(), sink.name(self.upstream).unwrap_or("-"));
        if let Some(journal) = &sink.journal {
            let record = self.record(outcome, sink, total);
            journal.record(record);
        }
    }

    /// Its spans, to the OpenTelemetry exporter.
    fn export(&self, outcome: Outcome, sink: &Sink, trace: &crate::otel::TraceCtx) {
        let Some(tracer) = &sink.tracer else { return };
        let name = |i: UpstreamId| sink.name(Some(i)).unwrap_or("-");
        let id = self.id.to_string();
        tracer.export(&crate::otel::RequestSpan {
            ctx: trace,
            elapsed: self.started.elapsed(),
            id: &id,
            model: self.model.as_deref(),
            client: self.client.as_deref(),
            stream: self.stream,
            status: self.status,
            outcome: outcome.as_str(),
            ok: matches!(outcome, Outcome::Completed),
            class: self.class.map(Class::as_str),
            error: self.error.as_deref(),
            upstream: sink.name(self.upstream),
            queue_wait: self.queue_wait,
            ttfb: self.ttfb,
            tokens: (self.usage.input, self.usage.output),
            attempts: self
                .attempts
                .iter()
                .map(|a| crate::otel::AttemptAttrs {
                    upstream: name(a.upstream),
                    status: a.status,
                    class: a.class.map(Class::as_str),
                    verdict: a.verdict.as_str(),
                    wait: a.wait,
                })
                .collect(),
        });
    }

    /// The request's log line: at `info` when it is the only record (the
    /// journal is off), at `debug` when the journal records the request —
    /// a second record per request costs a proxy about a sixth of its
    /// throughput (bench/), and says nothing the journal does not.
    fn log_line(&self, outcome: Outcome, journaled: bool, upstream: &str) {
        if journaled {
            if tracing::enabled!(tracing::Level::DEBUG) {
                tracing::debug!("{}", self.line(outcome, upstream));
            }
        } else if tracing::enabled!(tracing::Level::INFO) {
            tracing::info!("{}", self.line(outcome, upstream));
        }
    }

    /// The request's log line; every value a client chose is escaped
    /// ([`Clean`]), so it stays one line of text.
    fn line(&self, outcome: Outcome, upstream: &str) -> String {
        // One line, formatted in one pass: the structured record is the
        // journal's; a field-by-field log event costs a proxy measurable
        // throughput (bench/).
        use std::fmt::Write;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut line = String::with_capacity(256);
        let _ = write!(
            line,
            "request id={} client={} model={} stream={} upstream={} attempts={} status={} outcome={} class={} ms={:.2} ttfb_ms={:.2} queue_ms={:.2} tokens_in={} tokens_out={}",
            self.id,
            Clean(self.client.as_deref().unwrap_or("-")),
            Clean(self.model.as_deref().unwrap_or("-")),
            self.stream,
            Clean(upstream),
            self.attempts.len(),
            self.status,
            outcome.as_str(),
            self.class.map_or("-", Class::as_str),
            ms(self.started.elapsed()),
            self.ttfb.map_or(-1.0, ms),
            ms(self.queue_wait),
            self.usage.input.unwrap_or(0),
            self.usage.output.unwrap_or(0),
        );
        if let Some(error) = &self.error {
            let _ = write!(line, " error={error:?}");
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_model_name_stays_on_its_line() {
        let mut report = Report::new(uuid::Uuid::nil(), Instant::now());
        report.model = Some(Arc::from("gpt\n2026-01-01 INFO request id=forged\u{0}"));
        report.error = Some("bad\r\nthing".into());
        let line = report.line(Outcome::Rejected, "-");
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\0'), "{line}");
        assert!(line.contains("model=gpt\\u{a}2026"), "{line}");
    }
}
