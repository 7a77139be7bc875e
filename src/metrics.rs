//! `GET /metrics` in Prometheus text format.
//!
//! Counters and histograms are updated once per request, when its report is
//! finished (never per chunk); per-upstream gauges (in-flight, effective
//! limit, queue, journal drops) are read at scrape time, so they cost the
//! request path nothing. Labels are configured names only — upstream names,
//! model aliases, client key names — never a key or a string a client
//! made up.

use std::collections::HashSet;

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::record::Outcome;

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    /// Model label values allowed (the configured aliases; replaced on a
    /// config reload).
    aliases: arc_swap::ArcSwap<HashSet<String>>,
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
        Ok(Self {
            clients,
            requests: counter(
                "requests_total",
                "requests by outcome, error class, upstream and model",
                &["outcome", "class", "upstream", "model"],
            )?,
            attempts: counter("attempts_total", "upstream attempts by verdict", &["upstream", "verdict"])?,
            tokens: counter("tokens_total", "tokens reported by upstreams", &["direction", "model"])?,
            anomalies: counter("anomalies_total", "floods flagged, per client key name", &["client"])?,
            rejected: counter(
                "rejected_total",
                "requests refused before routing (bad key, foreign origin, unknown path, wrong method)",
                &["reason"],
            )?,
            queue_wait: histogram("queue_wait_seconds", "time waiting for upstream slots and rate buckets")?,
            ttfb: histogram("ttfb_seconds", "time to the first byte sent to the client")?,
            duration: histogram("request_duration_seconds", "total request time")?,
            gauges,
            aliases: arc_swap::ArcSwap::from_pointee(aliases.collect()),
            registry,
        })
    }

    /// The aliases of a reloaded config become the allowed model labels.
    pub fn set_aliases(&self, aliases: impl Iterator<Item = String>) {
        self.aliases.store(std::sync::Arc::new(aliases.collect()));
    }

    /// Records one finished request.
    pub fn observe(&self, s: &Sample<'_>) {
        let aliases = self.aliases.load();
        let model = s.model.filter(|m| aliases.contains(*m)).unwrap_or("-");
        self.requests.with_label_values(&[s.outcome.as_str(), s.class, s.upstream, model]).inc();
        self.queue_wait.with_label_values(&[model]).observe(s.queue_wait);
        if let Some(t) = s.ttfb {
            self.ttfb.with_label_values(&[model]).observe(t);
        }
        self.duration.with_label_values(&[model]).observe(s.total);
        if let Some(n) = s.tokens.0 {
            self.tokens.with_label_values(&["in", model]).inc_by(n);
        }
        if let Some(n) = s.tokens.1 {
            self.tokens.with_label_values(&["out", model]).inc_by(n);
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
