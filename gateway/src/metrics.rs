//! `GET /metrics` in Prometheus text format.
//!
//! Counters and histograms are updated once per request, when its report is
//! finished (never per chunk); per-upstream gauges (in-flight, effective
//! limit, queue, journal drops) are read at scrape time, so they cost the
//! request path nothing. Labels are configured names only — upstream names,
//! model aliases, client key names — never a key or a string a client
//! made up.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::record::Outcome;

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    /// Model label values allowed (the configured aliases; replaced on a
    /// config reload), each with its series already looked up: a request
    /// finds them with one map lookup instead of one per metric.
    aliases: arc_swap::ArcSwap<HashMap<String, PerModel>>,
    /// The series of requests whose model is not a configured alias.
    other: PerModel,
    requests: IntCounterVec,
    attempts: IntCounterVec,
    tokens: IntCounterVec,
    anomalies: IntCounterVec,
    rejected: IntCounterVec,
    queue_wait: HistogramVec,
    ttfb: HistogramVec,
    duration: HistogramVec,
    gauges: IntGaugeVec,
    clients: IntGaugeVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// One model label's series.
#[derive(Clone)]
struct PerModel {
    queue_wait: Histogram,
    ttfb: Histogram,
    duration: Histogram,
    tokens_in: IntCounter,
    tokens_out: IntCounter,
}

impl PerModel {
    fn of(
        queue_wait: &HistogramVec,
        ttfb: &HistogramVec,
        duration: &HistogramVec,
        tokens: &IntCounterVec,
        model: &str,
    ) -> Self {
        Self {
            queue_wait: queue_wait.with_label_values(&[model]),
            ttfb: ttfb.with_label_values(&[model]),
            duration: duration.with_label_values(&[model]),
            tokens_in: tokens.with_label_values(&["in", model]),
            tokens_out: tokens.with_label_values(&["out", model]),
        }
    }
}

/// What one finished request contributes.
pub struct Sample<'a> {
    /// How it ended.
    pub outcome: Outcome,
    /// Class of its final failure (`-` if none).
    pub class: &'a str,
    /// Upstream that answered (`-` if none).
    pub upstream: &'a str,
    /// Alias asked for.
    pub model: Option<&'a str>,
    /// Seconds waiting for slots.
    pub queue_wait: f64,
    /// Seconds to the first byte.
    pub ttfb: Option<f64>,
    /// Seconds in all.
    pub total: f64,
    /// Tokens in and out.
    pub tokens: (Option<u64>, Option<u64>),
}

const BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

impl Metrics {
    /// Registers every metric; `aliases` are the configured model aliases.
    pub fn new(aliases: impl Iterator<Item = String>) -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("tidegate".into()), None)?;
        let counter = |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram = |name: &str, help: &str| -> Result<HistogramVec, prometheus::Error> {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), &["model"])?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let gauges = IntGaugeVec::new(
            Opts::new("upstream_state", "per-upstream in_flight, effective_limit, queued; read at scrape time"),
            &["upstream", "what"],
        )?;
        registry.register(Box::new(gauges.clone()))?;
        let clients = IntGaugeVec::new(
            Opts::new("client_state", "per client key name: in_flight, queued, penalised; read at scrape time"),
            &["client", "what"],
        )?;
        registry.register(Box::new(clients.clone()))?;
        let queue_wait = histogram("queue_wait_seconds", "time waiting for upstream slots and rate buckets")?;
        let ttfb = histogram("ttfb_seconds", "time to the first byte sent to the client")?;
        let duration = histogram("request_duration_seconds", "total request time")?;
        let tokens = counter("tokens_total", "tokens reported by upstreams", &["direction", "model"])?;
        let other = PerModel::of(&queue_wait, &ttfb, &duration, &tokens, "-");
        let metrics = Self {
            clients,
            requests: counter(
                "requests_total",
                "requests by outcome, error class, upstream and model",
                &["outcome", "class", "upstream", "model"],
            )?,
            attempts: counter("attempts_total", "upstream attempts by verdict", &["upstream", "verdict"])?,
            tokens,
            anomalies: counter("anomalies_total", "floods flagged, per client key name", &["client"])?,
            rejected: counter(
                "rejected_total",
                "requests refused before routing (bad key, foreign origin, unknown path, wrong method)",
                &["reason"],
            )?,
            queue_wait,
            ttfb,
            duration,
            gauges,
            aliases: arc_swap::ArcSwap::from_pointee(HashMap::new()),
            other,
            registry,
        };
        metrics.set_aliases(aliases);
        Ok(metrics)
    }

    fn per_model(&self, model: &str) -> PerModel {
        PerModel::of(&self.queue_wait, &self.ttfb, &self.duration, &self.tokens, model)
    }

    /// The aliases of a reloaded config become the allowed model labels.
    pub fn set_aliases(&self, aliases: impl Iterator<Item = String>) {
        let map = aliases
            .map(|alias| {
                let series = self.per_model(&alias);
                (alias, series)
            })
            .collect();
        self.aliases.store(Arc::new(map));
    }

    /// Records one finished request.
    pub fn observe(&self, s: &Sample<'_>) {
        let aliases = self.aliases.load();
        let (model, series) = match s.model.and_then(|m| aliases.get_key_value(m)) {
            Some((alias, series)) => (alias.as_str(), series),
            None => ("-", &self.other),
        };
        self.requests.with_label_values(&[s.outcome.as_str(), s.class, s.upstream, model]).inc();
        series.queue_wait.observe(s.queue_wait);
        if let Some(t) = s.ttfb {
            series.ttfb.observe(t);
        }
        series.duration.observe(s.total);
        if let Some(n) = s.tokens.0 {
            series.tokens_in.inc_by(n);
        }
        if let Some(n) = s.tokens.1 {
            series.tokens_out.inc_by(n);
        }
    }

    /// Counts one attempt's verdict.
    pub fn attempt(&self, upstream: &str, verdict: &str) {
        self.attempts.with_label_values(&[upstream, verdict]).inc();
    }

    /// Counts a flood flagged for a client key name.
    pub fn anomaly(&self, client: &str) {
        self.anomalies.with_label_values(&[client]).inc();
    }

    /// Counts a refusal before routing.
    pub fn rejected(&self, reason: &str) {
        self.rejected.with_label_values(&[reason]).inc();
    }

    /// Sets a scrape-time gauge.
    pub fn gauge(&self, upstream: &str, what: &str, value: i64) {
        self.gauges.with_label_values(&[upstream, what]).set(value);
    }

    /// Sets a scrape-time gauge of a client key (by its configured name).
    pub fn client_gauge(&self, client: &str, what: &str, value: i64) {
        self.clients.with_label_values(&[client, what]).set(value);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
