//! The gateway's state, built once from a validated config and shared by
//! every connection: upstream clients with their limits and health, the
//! report sink (journal, metrics, dashboard buckets), flood warnings.
//!
//! It lives below the server, the relay and the stream body, which all
//! read it; none of them builds or owns it.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::anomaly::Anomaly;
use crate::config::Config;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::pins::Pins;
use crate::recent::Recent;
use crate::report::Sink;
use crate::retry::RetryBudget;
use crate::shared::SharedState;
use crate::upstream::{BuildError, Upstream};

/// Everything a request needs, shared by all connections.
pub struct Gateway {
    /// The validated config.
    pub config: Config,
    /// One client per upstream, same order as `config.upstreams`.
    pub upstreams: Vec<Upstream>,
    /// Model aliases by route index, shared by every request's record.
    pub aliases: Vec<Arc<str>>,
    /// Per-client flood warnings.
    pub anomaly: Anomaly,
    /// Where every request's report goes — the journal, the metrics, the
    /// dashboard's recent buckets — which the admin endpoints read too.
    /// Built once: a per-request copy would clone and drop the journal's
    /// channel sender and three `Arc`s per request, measurable at
    /// saturation.
    pub sink: Arc<Sink>,
    /// Background work the request path starts (announcements to other
    /// replicas) and the follower of theirs: owned here, so shutdown can
    /// wait for them and none outlives the gateway.
    pub tasks: TaskTracker,
    /// Which upstream stores each Responses API response.
    pub pins: Pins,
}

impl Gateway {
    /// Builds upstream clients for a config.
    pub fn new(config: Config) -> Result<Self, BuildError> {
        let shared = match &config.state {
            Some(url) => {
                let names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
                Some(SharedState::start(url.expose(), config.state_lease_ttl, &names)?)
            }
            None => None,
        };
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| {
                let budget = RetryBudget::new(config.budget_ratio, config.budget_min_per_second);
                Upstream::new(u.clone(), budget, shared.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names: Arc<[String]> = upstreams.iter().map(|u| u.config.name.clone()).collect();
        let journal =
            config.journal.as_deref().map(|path| Journal::start(path, config.retention.clone(), names.clone()));
        let metrics = Metrics::new(config.models.keys().cloned()).map_err(|e| BuildError::Metrics(e.to_string()))?;
        let anomaly = Anomaly::new(config.anomaly.clone());
        let recent = Arc::new(Recent::new(names.clone()));
        let aliases = config.models.keys().map(|a| Arc::from(a.as_str())).collect();
        let sink = Arc::new(Sink {
            journal,
            metrics: Arc::new(metrics),
            names: names.clone(),
            keep_partial: config.keep_partial,
            recent,
        });
        let tasks = TaskTracker::new();
        let pins = Pins::new(config.response_pin_ttl, shared.clone(), names.clone(), tasks.clone());
        Ok(Self { config, upstreams, aliases, anomaly, sink, tasks, pins })
    }

    /// Applies the cooldowns and open breakers other replicas announce to
    /// this gateway's upstreams.
    pub fn follow_shared_health(self: &Arc<Self>) {
        let Some(mut events) = self.upstreams.iter().find_map(|u| u.shared.as_ref()).and_then(|s| s.take_events())
        else {
            return;
        };
        let weak = Arc::downgrade(self);
        self.tasks.spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(gw) = weak.upgrade() else { return };
                if let Some(u) = gw.upstreams.iter().find(|u| u.config.name == event.upstream) {
                    tracing::info!(upstream = %event.upstream, kind = event.kind.as_str(), left_ms = event.left.as_millis() as u64, "another replica announced");
                    u.health.absorb(event.kind, event.left, tokio::time::Instant::now());
                }
            }
        });
    }
}
