//! The gateway's state, built once from a validated config and shared by
//! every connection: upstream clients with their limits and health, the
//! report sink (journal, metrics, dashboard buckets), flood warnings.
//!
//! It lives below the server, the relay and the stream body, which all
//! read it; none of them builds or owns it.

use std::sync::Arc;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::anomaly::Anomaly;
use crate::config::Config;
use crate::journal::Journal;
use crate::lanes::Lanes;
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
    /// Each client key's lane: its limits, weight and priority.
    pub lanes: Lanes,
    /// Where every request's report goes — the journal, the metrics, the
    /// dashboard's recent buckets — which the admin endpoints read too.
    /// Built once: a per-request copy would clone and drop the journal's
    /// channel sender and three `Arc`s per request, measurable at
    /// saturation.
    pub sink: Arc<Sink>,
    /// Background work the request path starts (announcements to other
    /// replicas): owned here, so shutdown can wait for it.
    pub tasks: TaskTracker,
    /// Which upstream stores each Responses API response.
    pub pins: Pins,
    /// A shutdown began: `/healthz` and new requests answer 503.
    pub draining: AtomicBool,
    /// The shutdown grace is over: streams still running end with their
    /// protocol's error event, requests still waiting are answered 503.
    pub closing: CancellationToken,
    /// The task applying other replicas' announcements (stopped by
    /// [`Gateway::finish`]).
    follower: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Gateway {
    /// Builds upstream clients for a config.
    pub fn new(config: Config) -> Result<Self, BuildError> {
        let shared = match &config.state {
            Some(url) => {
                let mut names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
                names.extend(Lanes::shared_names(&config));
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
            active: Default::default(),
            flood: Default::default(),
        });
        let lanes = Lanes::new(&config, shared.as_ref());
        let tasks = TaskTracker::new();
        let pins = Pins::new(config.response_pin_ttl, shared.clone(), names.clone(), tasks.clone());
        Ok(Self {
            config,
            upstreams,
            aliases,
            anomaly,
            lanes,
            sink,
            tasks,
            pins,
            draining: AtomicBool::new(false),
            closing: CancellationToken::new(),
            follower: std::sync::Mutex::new(None),
        })
    }

    /// Applies the cooldowns and open breakers other replicas announce to
    /// this gateway's upstreams.
    pub fn follow_shared_health(self: &Arc<Self>) {
        let Some(mut events) = self.upstreams.iter().find_map(|u| u.shared.as_ref()).and_then(|s| s.take_events())
        else {
            return;
        };
        let weak = Arc::downgrade(self);
        let follower = tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(gw) = weak.upgrade() else { return };
                if let Some(u) = gw.upstreams.iter().find(|u| u.config.name == event.upstream) {
                    tracing::info!(upstream = %event.upstream, kind = event.kind.as_str(), left_ms = event.left.as_millis() as u64, "another replica announced");
                    u.health.absorb(event.kind, event.left, tokio::time::Instant::now());
                }
            }
        });
        if let Ok(mut slot) = self.follower.lock() {
            *slot = Some(follower);
        }
    }

    /// The end of a shutdown: waits (up to `limit` in all) for the
    /// background work requests started — announcements, shared-store
    /// updates, delayed slot releases, lease give-backs — and for every
    /// journal row handed over to be written.
    pub async fn finish(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        if let Some(follower) = self.follower.lock().ok().and_then(|mut f| f.take()) {
            follower.abort();
        }
        let mut trackers = vec![&self.tasks];
        for limiter in self.lanes.limiters() {
            trackers.push(limiter.tasks());
        }
        for u in &self.upstreams {
            trackers.push(u.limiter.tasks());
            if let Some(shared) = &u.shared {
                trackers.push(shared.background());
            }
        }
        for t in trackers {
            t.close();
            let _ = tokio::time::timeout_at(until, t.wait()).await;
        }
        if let Some(journal) = self.sink.journal.clone() {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let _ = tokio::task::spawn_blocking(move || journal.flush(left)).await;
        }
    }
}
