//! OpenTelemetry traces, opt-in (`otel:` in the config): one span per
//! request and one child span per upstream attempt, exported over
//! OTLP/HTTP (protobuf) by the SDK's batch processor on its own thread.
//!
//! Spans are built when the request's report finishes, from what the
//! report already holds, plus what only tracing needs: ids and the
//! start/end time of each attempt ([`TraceCtx`]). The ids are chosen when
//! the request arrives — continuing the client's W3C `traceparent` when it
//! sends one — so each attempt's `traceparent` can be sent upstream before
//! its span exists. With `otel` off nothing here runs: the request path
//! holds a `None`.
//!
//! Attributes follow the OpenTelemetry GenAI semantic conventions
//! (`gen_ai.operation.name`, `gen_ai.provider.name` and the older
//! `gen_ai.system`, `gen_ai.request.model`, `gen_ai.response.model`,
//! `gen_ai.usage.input_tokens`/`output_tokens`) and HTTP ones, plus
//! tidegate's own under `tidegate.*` (outcome, class, verdict, wait,
//! upstream, attempts, queue wait, client key name — never a key).

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

pub use crate::config::OtelConfig;
use http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanProcessor};

/// The exporter: a batch span processor in front of OTLP/HTTP.
#[derive(Debug)]
pub struct Exporter {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    /// The settings it was built with (a reload keeps it when unchanged).
    pub config: OtelConfig,
}

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("otel: {0}")]
pub struct OtelError(String);

/// One attempt's span: its id, and when it ran.
#[derive(Debug, Clone)]
struct AttemptSpan {
    id: SpanId,
    start: SystemTime,
    end: Option<SystemTime>,
    model: String,
}

/// A request's trace: ids chosen at arrival, attempt times as they happen.
#[derive(Debug)]
pub struct TraceCtx {
    trace_id: TraceId,
    /// The client's span, when it sent a `traceparent`.
    parent: Option<SpanId>,
    /// The request's own span.
    span: SpanId,
    /// `chat`, `embeddings`, …
    operation: &'static str,
    /// `openai` or `anthropic`.
    provider: &'static str,
    /// Exported only when sampled (the client's flag, or a new trace).
    sampled: bool,
    attempts: Mutex<Vec<AttemptSpan>>,
}

fn nonzero_u128() -> u128 {
    loop {
        let v = fastrand::u128(..);
        if v != 0 {
            return v;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let v = fastrand::u64(..);
        if v != 0 {
            return v;
        }
    }
}

/// `00-<trace>-<span>-<flags>`, per W3C Trace Context; `None` if malformed.
fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, bool)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let span = u64::from_str_radix(span, 16).ok().filter(|s| *s != 0)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((TraceId::from(trace), SpanId::from(span), flags & 1 == 1))
}

impl TraceCtx {
    /// A request's trace: continues the client's `traceparent` if valid,
    /// else starts a new one.
    pub fn start(headers: &HeaderMap, operation: &'static str, provider: &'static str) -> Self {
        let parent = headers.get("traceparent").and_then(|v| v.to_str().ok()).and_then(parse_traceparent);
        let (trace_id, parent, sampled) = match parent {
            Some((trace, span, sampled)) => (trace, Some(span), sampled),
            None => (TraceId::from(nonzero_u128()), None, true),
        };
        Self {
            trace_id,
            parent,
            span: SpanId::from(nonzero_u64()),
            operation,
            provider,
            sampled,
            attempts: Mutex::new(Vec::new()),
        }
    }

    /// An attempt begins (sending `model` upstream): the `traceparent` it
    /// carries upstream names its span.
    pub fn begin_attempt(&self, model: &str) -> Option<HeaderValue> {
        let id = SpanId::from(nonzero_u64());
        if let Ok(mut attempts) = self.attempts.lock() {
            attempts.push(AttemptSpan { id, start: SystemTime::now(), end: None, model: model.to_owned() });
        }
        let flags = if self.sampled { "01" } else { "00" };
        HeaderValue::try_from(format!("00-{}-{id}-{flags}", self.trace_id)).ok()
    }

    /// The attempt begun last has its answer (or its failure).
    pub fn end_attempt(&self) {
        if let Ok(mut attempts) = self.attempts.lock()
            && let Some(last) = attempts.last_mut()
        {
            last.end.get_or_insert_with(SystemTime::now);
        }
    }
}

/// One span's own fields.
struct Part {
    id: SpanId,
    parent: Option<SpanId>,
    kind: SpanKind,
    name: String,
    times: (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
}

/// What the request span says, from the request's report.
pub struct RequestSpan<'a> {
    /// Its trace.
    pub ctx: &'a TraceCtx,
    /// How long ago it started.
    pub elapsed: Duration,
    /// Request id.
    pub id: &'a str,
    /// Alias asked.
    pub model: Option<&'a str>,
    /// Client key name.
    pub client: Option<&'a str>,
    /// SSE asked.
    pub stream: bool,
    /// Status sent.
    pub status: u16,
    /// `completed`, `failed`, …
    pub outcome: &'a str,
    /// Whether the outcome is a success.
    pub ok: bool,
    /// Class of the final failure.
    pub class: Option<&'a str>,
    /// Error told to the client.
    pub error: Option<&'a str>,
    /// Upstream that answered.
    pub upstream: Option<&'a str>,
    /// Queue wait.
    pub queue_wait: Duration,
    /// Time to first byte.
    pub ttfb: Option<Duration>,
    /// Tokens in and out.
    pub tokens: (Option<u64>, Option<u64>),
    /// The attempts: upstream name, status, class, verdict, wait.
    pub attempts: Vec<AttemptAttrs<'a>>,
}

/// One attempt as the journal has it.
pub struct AttemptAttrs<'a> {
    /// Upstream name.
    pub upstream: &'a str,
    /// Its status.
    pub status: Option<u16>,
    /// Class of a failure.
    pub class: Option<&'a str>,
    /// What the relay did next.
    pub verdict: &'a str,
    /// Wait before the next attempt.
    pub wait: Option<Duration>,
}

impl Exporter {
    /// Starts the batch processor and its OTLP/HTTP exporter.
    pub fn start(config: &OtelConfig) -> Result<Self, OtelError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(config.endpoint.clone())
            .with_headers(config.headers.iter().map(|(k, v)| (k.clone(), v.expose().to_owned())).collect())
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| OtelError(e.to_string()))?;
        let batch = BatchConfigBuilder::default().with_scheduled_delay(config.export_every).build();
        let mut processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
        let resource = Resource::builder().with_service_name(config.service_name.clone()).build();
        processor.set_resource(&resource);
        let scope = InstrumentationScope::builder("tidegate").with_version(env!("CARGO_PKG_VERSION")).build();
        Ok(Self { processor, scope, config: config.clone() })
    }

    fn span(&self, ctx: &TraceCtx, p: Part) -> SpanData {
        let flags = if ctx.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        SpanData {
            span_context: SpanContext::new(ctx.trace_id, p.id, flags, false, TraceState::default()),
            parent_span_id: p.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: p.parent.is_some() && p.parent == ctx.parent,
            span_kind: p.kind,
            name: Cow::Owned(p.name),
            start_time: p.times.0,
            end_time: p.times.1,
            attributes: p.attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: p.status,
            instrumentation_scope: self.scope.clone(),
        }
    }

    /// Hands the request's span and its attempts' spans to the exporter.
    pub fn export(&self, r: &RequestSpan<'_>) {
        let ctx = r.ctx;
        if !ctx.sampled {
            return;
        }
        let end = SystemTime::now();
        let start = end.checked_sub(r.elapsed).unwrap_or(end);
        let model = r.model.unwrap_or("-");
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", ctx.operation),
            KeyValue::new("gen_ai.provider.name", ctx.provider),
            KeyValue::new("gen_ai.system", ctx.provider),
            KeyValue::new("gen_ai.request.model", model.to_owned()),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("http.response.status_code", i64::from(r.status)),
            KeyValue::new("tidegate.request_id", r.id.to_owned()),
            KeyValue::new("tidegate.outcome", r.outcome.to_owned()),
            KeyValue::new("tidegate.stream", r.stream),
            KeyValue::new("tidegate.attempts", r.attempts.len() as i64),
            KeyValue::new("tidegate.queue_wait_ms", r.queue_wait.as_secs_f64() * 1000.0),
        ];
        // The request is over: its attempt times are taken, not copied.
        let attempts = ctx.attempts.lock().map(|mut a| std::mem::take(&mut *a)).unwrap_or_default();
        if let Some(answered) = r.upstream {
            attrs.push(KeyValue::new("tidegate.upstream", answered.to_owned()));
        }
        if let Some(sent) = attempts.last().filter(|_| r.ok) {
            attrs.push(KeyValue::new("gen_ai.response.model", sent.model.clone()));
        }
        let optional = [
            r.client.map(|c| KeyValue::new("tidegate.client", c.to_owned())),
            r.class.map(|c| KeyValue::new("tidegate.class", c.to_owned())),
            r.class.map(|c| KeyValue::new("error.type", c.to_owned())),
            r.ttfb.map(|t| KeyValue::new("tidegate.ttfb_ms", t.as_secs_f64() * 1000.0)),
            r.tokens.0.map(|n| KeyValue::new("gen_ai.usage.input_tokens", n as i64)),
            r.tokens.1.map(|n| KeyValue::new("gen_ai.usage.output_tokens", n as i64)),
        ];
        attrs.extend(optional.into_iter().flatten());
        let status = if r.ok { Status::Unset } else { Status::error(r.error.unwrap_or(r.outcome).to_owned()) };
        let name = format!("{} {model}", ctx.operation);
        let part = Part {
            id: ctx.span,
            parent: ctx.parent,
            kind: SpanKind::Server,
            name,
            times: (start, end),
            attributes: attrs,
            status,
        };
        let span = self.span(ctx, part);
        self.processor.on_end(span);
        for (n, (a, t)) in r.attempts.iter().zip(&attempts).enumerate() {
            let mut attrs = vec![
                KeyValue::new("gen_ai.operation.name", ctx.operation),
                KeyValue::new("gen_ai.provider.name", ctx.provider),
                KeyValue::new("gen_ai.system", ctx.provider),
                KeyValue::new("gen_ai.request.model", t.model.clone()),
                KeyValue::new("tidegate.upstream", a.upstream.to_owned()),
                KeyValue::new("tidegate.attempt", n as i64 + 1),
                KeyValue::new("tidegate.verdict", a.verdict.to_owned()),
            ];
            let optional = [
                a.status.map(|s| KeyValue::new("http.response.status_code", i64::from(s))),
                a.class.map(|c| KeyValue::new("tidegate.class", c.to_owned())),
                a.class.map(|c| KeyValue::new("error.type", c.to_owned())),
                a.wait.map(|w| KeyValue::new("tidegate.wait_ms", w.as_secs_f64() * 1000.0)),
            ];
            attrs.extend(optional.into_iter().flatten());
            let status = match a.class {
                Some(class) => Status::error(class.to_owned()),
                None => Status::Unset,
            };
            let times = (t.start, t.end.unwrap_or(end));
            let name = format!("attempt {}", a.upstream);
            let part = Part {
                id: t.id,
                parent: Some(ctx.span),
                kind: SpanKind::Client,
                name,
                times,
                attributes: attrs,
                status,
            };
            let span = self.span(ctx, part);
            self.processor.on_end(span);
        }
    }

    /// Exports what is buffered and stops (at shutdown).
    pub fn shutdown(&self) {
        let _ = self.processor.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_continued_or_started_fresh() {
        let mut headers = HeaderMap::new();
        headers
            .insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        let ctx = TraceCtx::start(&headers, "chat", "openai");
        assert_eq!(ctx.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.parent.map(|p| p.to_string()).as_deref(), Some("00f067aa0ba902b7"));
        let sent = ctx.begin_attempt("m").unwrap();
        let sent = sent.to_str().unwrap();
        assert!(sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && sent.ends_with("-01"), "{sent}");
        assert!(!sent.contains("00f067aa0ba902b7"), "the upstream's parent is the attempt, not the client");
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            headers.insert("traceparent", HeaderValue::from_static(bad));
            let fresh = TraceCtx::start(&headers, "chat", "openai");
            assert!(fresh.parent.is_none() && fresh.sampled, "{bad}");
        }
        headers
            .insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        assert!(!TraceCtx::start(&headers, "chat", "openai").sampled, "the client's sampling decision holds");
    }
}
