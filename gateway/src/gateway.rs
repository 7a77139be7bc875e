//! The gateway's state, built from a validated config and shared by every
//! connection: upstream clients with their limits and health, client lanes,
//! the report sink (journal, metrics, dashboard buckets), flood warnings.
//!
//! A config reload builds a new [`Gateway`] from the old one ([`Live`]):
//! whatever did not change is carried over as the same object — an
//! upstream whose settings are equal keeps its limiter (learned limit,
//! queue, waiting requests), health (cooldown, breaker) and connection
//! pool; a key whose lane is equal keeps it; the journal, the metrics, the
//! in-flight count and the shared store stay — and new requests get the
//! new gateway while requests in flight finish with the one they started
//! with. A removed upstream lives on until its last request ends.
//!
//! It lives below the server, the relay and the stream body, which all
//! read it; none of them builds or owns it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::task::TaskTracker;

use crate::anomaly::Anomaly;
pub use crate::closing::Closing;
use crate::config::{Config, ConfigError, UpstreamConfig};
use crate::ids::{Table, UpstreamId};
use crate::journal::Journal;
use crate::lanes::Lanes;
use crate::metrics::Metrics;
use crate::otel::Exporter;
use crate::pins::Pins;
use crate::recent::Recent;
use crate::report::Sink;
use crate::retry::RetryBudget;
use crate::shared::{SharedEvent, SharedState};
use crate::upstream::{BuildError, Upstream};

/// Everything a request needs, shared by all connections.
pub struct Gateway {
    /// The validated config.
    pub config: Config,
    /// One client per upstream, same order as `config.upstreams`.
    pub upstreams: Table<UpstreamId, Arc<Upstream>>,
    /// Model aliases by route index, shared by every request's record.
    pub aliases: Vec<Arc<str>>,
    /// Per-client flood warnings.
    pub anomaly: Arc<Anomaly>,
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
    /// Which target (pool account) holds each conversation's prompt
    /// cache: session affinity.
    pub sessions: Pins,
    /// The conversations of the Responses answers tidegate made by
    /// translation (kept across reloads).
    pub kept: crate::kept::Store,
    /// A shutdown began: `/healthz` and new requests answer 503.
    pub draining: AtomicBool,
    /// The shutdown grace is over: streams still running end with their
    /// protocol's error event, requests still waiting are answered 503
    /// (one token for every generation of the config).
    pub closing: Closing,
    /// Held while a request chooses between targets and counts itself on
    /// the one it chose ([`crate::relay::targets::Targets::pick`]): two
    /// requests arriving at once on two runtime threads would otherwise
    /// both read the same loads and pile onto the same account.
    pub picking: std::sync::Mutex<()>,
    /// The shared store, when configured.
    shared: Option<Arc<SharedState>>,
}

/// Whether two parts use the same shared store (or both none).
fn same_store(a: Option<&Arc<SharedState>>, b: Option<&Arc<SharedState>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Names the shared store keeps keys for: the upstreams and the limited
/// client lanes.
fn shared_names(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    names.extend(Lanes::shared_names(config));
    names
}

impl Gateway {
    /// Builds upstream clients for a config.
    pub fn new(config: Config) -> Result<Self, BuildError> {
        Self::build(config, None)
    }

    /// Builds a gateway for `config`, carrying over from `previous` every
    /// part whose settings did not change.
    fn build(config: Config, previous: Option<&Gateway>) -> Result<Self, BuildError> {
        let same_shared = previous.filter(|p| {
            p.config.state == config.state && shared_names(&p.config) == shared_names(&config) && p.shared.is_some()
        });
        let shared = match (&config.state, same_shared) {
            (Some(_), Some(p)) => p.shared.clone(),
            (Some(url), None) => {
                Some(SharedState::start(url.expose(), config.state_lease_ttl, &shared_names(&config))?)
            }
            (None, _) => None,
        };
        let budget_same = previous.is_some_and(|p| {
            p.config.budget_ratio == config.budget_ratio
                && p.config.budget_min_per_second == config.budget_min_per_second
        });
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| {
                let kept = previous.filter(|_| budget_same).and_then(|p| p.reusable(u, shared.as_ref()));
                match kept {
                    Some(kept) => Ok(kept),
                    None => {
                        let budget = RetryBudget::new(config.budget_ratio, config.budget_min_per_second);
                        Upstream::new(u.clone(), budget, shared.clone()).map(Arc::new)
                    }
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names: Arc<[String]> = upstreams.iter().map(|u| u.config.name.clone()).collect();
        let anomaly = match previous.filter(|p| p.config.anomaly == config.anomaly) {
            Some(p) => p.anomaly.clone(),
            None => Arc::new(Anomaly::new(config.anomaly.clone())),
        };
        let aliases = config.models.keys().map(|a| Arc::from(a.as_str())).collect();
        let sink = sink(&config, previous, names.clone())?;
        let same_lanes = previous.filter(|p| same_store(p.shared.as_ref(), shared.as_ref()));
        let lanes = Lanes::new(&config, shared.as_ref(), same_lanes.map(|p| &p.lanes));
        let tasks = previous.map(|p| p.tasks.clone()).unwrap_or_default();
        let pins = Pins::new(config.response_pin_ttl, shared.clone(), names.clone(), tasks.clone());
        let sessions = Pins::of_kind("session", config.affinity_ttl, shared.clone(), names.clone(), tasks.clone());
        if let Some(p) = previous {
            pins.carry(&p.pins);
            sessions.carry(&p.sessions);
        }
        let kept = crate::kept::Store {
            local: previous.map(|p| p.kept.local.clone()).unwrap_or_default(),
            shared: shared.clone(),
            ttl: config.response_pin_ttl,
            tasks: tasks.clone(),
            max_text: config.max_body,
        };
        Ok(Self {
            upstreams: upstreams.into(),
            aliases,
            anomaly,
            lanes,
            sink,
            tasks,
            pins,
            sessions,
            kept,
            draining: AtomicBool::new(false),
            closing: previous.map(|p| p.closing.clone()).unwrap_or_default(),
            picking: std::sync::Mutex::new(()),
            shared,
            config,
        })
    }

    /// This gateway's upstream for `config`, if it can serve the new
    /// config unchanged (same settings, same shared store).
    fn reusable(&self, config: &UpstreamConfig, shared: Option<&Arc<SharedState>>) -> Option<Arc<Upstream>> {
        let old = self.upstreams.iter().find(|u| u.config.name == config.name)?;
        (old.config == *config && same_store(old.shared.as_ref(), shared)).then(|| old.clone())
    }

    /// The end of a shutdown: waits (up to `limit` in all) for the
    /// background work requests started — announcements, shared-store
    /// updates, delayed slot releases, lease give-backs — and for every
    /// journal row handed over to be written.
    pub async fn finish(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
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
        if let Some(tracer) = self.sink.tracer.clone() {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let _ = tokio::time::timeout(left, tokio::task::spawn_blocking(move || tracer.shutdown())).await;
        }
    }
}

/// The gateway in force, replaced whole by a reload: each request takes the
/// current one when it arrives and keeps it to its end.
pub struct Live {
    current: ArcSwap<Gateway>,
    /// The file a reload reads.
    source: Option<PathBuf>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// `--listen` given on the command line: it wins over the file's on
    /// every reload too.
    listen_override: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// The task applying other replicas' announcements (to the gateway in
    /// force when each arrives).
    follower: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Reloaded {
    /// Upstreams kept as they were (limits, health, queue carried over).
    pub kept: Vec<String>,
    /// Upstreams new in this config.
    pub added: Vec<String>,
    /// Upstreams whose settings changed (rebuilt; their requests in flight
    /// finish on the old one).
    pub changed: Vec<String>,
    /// Upstreams no longer configured (they drain).
    pub removed: Vec<String>,
    /// Settings that changed but only take effect after a restart.
    pub needs_restart: Vec<String>,
}

/// Why a reload was refused; the running config stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new config is invalid (field-path errors, as `check` prints).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// An upstream client could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Started without a config file: nothing to re-read.
    #[error("this tidegate was not started from a config file: nothing to reload")]
    NoSource,
    /// A shutdown is under way.
    #[error("shutting down: not reloading")]
    Draining,
}

impl Live {
    /// The first gateway; `source` is the file reloads re-read.
    pub fn new(gateway: Gateway, source: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(gateway),
            source,
            reloading: tokio::sync::Mutex::new(()),
            listen_override: std::sync::Mutex::new(None),
            follower: std::sync::Mutex::new(None),
        })
    }

    /// Keeps `listen` (a command-line override) across reloads.
    pub fn override_listen(&self, listen: std::net::SocketAddr) {
        if let Ok(mut l) = self.listen_override.lock() {
            *l = Some(listen);
        }
    }

    /// The gateway in force.
    pub fn load(&self) -> Arc<Gateway> {
        self.current.load_full()
    }

    /// Re-reads the config file and applies it (see [`Live::apply`]).
    pub async fn reload(self: &Arc<Self>) -> Result<Reloaded, ReloadError> {
        let path = self.source.as_deref().ok_or(ReloadError::NoSource)?;
        // A small file, read once per reload: no need to leave the runtime.
        let mut config = Config::load(path)?;
        if let Some(listen) = self.listen_override.lock().ok().and_then(|l| *l) {
            config.listen = listen;
        }
        self.apply(config).await
    }

    /// Makes `config` the one new requests get, carrying over what did not
    /// change. Nothing changes when it fails.
    pub async fn apply(self: &Arc<Self>, config: Config) -> Result<Reloaded, ReloadError> {
        let _one = self.reloading.lock().await;
        let old = self.load();
        if old.draining.load(Ordering::Acquire) {
            return Err(ReloadError::Draining);
        }
        let mut needs_restart = Vec::new();
        if old.config.listen != config.listen {
            needs_restart.push(format!("listen ({} stays until a restart)", old.config.listen));
        }
        if old.config.workers != config.workers {
            needs_restart.push("workers".to_string());
        }
        if old.config.max_connections != config.max_connections {
            needs_restart.push("max_connections".to_string());
        }
        let new = Gateway::build(config, Some(&old))?;
        let mut report = Reloaded { needs_restart, ..Reloaded::default() };
        for u in &new.upstreams {
            let name = u.config.name.clone();
            match old.upstreams.iter().find(|o| o.config.name == name) {
                Some(o) if Arc::ptr_eq(o, u) => report.kept.push(name),
                Some(_) => report.changed.push(name),
                None => report.added.push(name),
            }
        }
        for o in &old.upstreams {
            if !new.upstreams.iter().any(|u| u.config.name == o.config.name) {
                report.removed.push(o.config.name.clone());
            }
        }
        let new_store = new.shared.is_some() && !same_store(old.shared.as_ref(), new.shared.as_ref());
        self.current.store(Arc::new(new));
        if new_store {
            self.stop_following();
            self.follow_shared_health();
        }
        tracing::info!(
            kept = report.kept.len(),
            added = ?report.added,
            changed = ?report.changed,
            removed = ?report.removed,
            needs_restart = ?report.needs_restart,
            "config reloaded"
        );
        Ok(report)
    }

    /// Applies the cooldowns and open breakers other replicas announce to
    /// the upstreams of the gateway in force.
    pub fn follow_shared_health(self: &Arc<Self>) {
        let gw = self.load();
        let Some(mut events) = gw.upstreams.iter().find_map(|u| u.shared.as_ref()).and_then(|s| s.take_events()) else {
            return;
        };
        let weak = Arc::downgrade(self);
        let follower = tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(live) = weak.upgrade() else { return };
                let gw = live.load();
                match event {
                    SharedEvent::Health(event) => {
                        if let Some(u) = gw.upstreams.iter().find(|u| u.config.name == event.upstream) {
                            tracing::info!(upstream = %event.upstream, kind = event.kind.as_str(), left_ms = event.left.as_millis() as u64, "another replica announced");
                            u.health.absorb(event.kind, event.left, tokio::time::Instant::now());
                        }
                    }
                    SharedEvent::Store(change) => {
                        if let Some(journal) = &gw.sink.journal {
                            let kind = if change.engaged { "store_breaker_open" } else { "store_breaker_closed" };
                            journal.event(kind, &change.detail);
                        }
                    }
                }
            }
        });
        if let Ok(mut slot) = self.follower.lock() {
            *slot = Some(follower);
        }
    }

    /// Stops following other replicas (at the end of a shutdown).
    pub fn stop_following(&self) {
        if let Some(follower) = self.follower.lock().ok().and_then(|mut f| f.take()) {
            follower.abort();
        }
    }
}

/// Where this generation's finished requests go: the journal, metrics,
/// the dashboard's buckets and the trace exporter, each carried over from
/// `previous` when its settings did not change.
fn sink(config: &Config, previous: Option<&Gateway>, names: Arc<[String]>) -> Result<Arc<Sink>, BuildError> {
    let same_journal = previous
        .filter(|p| p.config.journal == config.journal && p.config.retention == config.retention)
        .and_then(|p| p.sink.journal.clone());
    let journal = match same_journal {
        Some(journal) => Some(journal),
        None => config.journal.as_deref().map(|path| Journal::start(path, config.retention.clone())),
    };
    let metrics = match previous {
        Some(p) => {
            p.sink.metrics.set_aliases(config.models.keys().cloned());
            p.sink.metrics.clone()
        }
        None => Arc::new(Metrics::new(config.models.keys().cloned()).map_err(|e| BuildError::Metrics(e.to_string()))?),
    };
    let recent = match previous.filter(|p| p.sink.names == names) {
        Some(p) => p.sink.recent.clone(),
        None => Arc::new(Recent::new(names.clone())),
    };
    let tracer = match (&config.otel, previous.and_then(|p| p.sink.tracer.clone())) {
        (Some(otel), Some(kept)) if kept.config == *otel => Some(kept),
        (Some(otel), _) => Some(Arc::new(Exporter::start(otel).map_err(|e| BuildError::Otel(e.to_string()))?)),
        (None, _) => None,
    };
    let generation = journal.as_ref().map_or(0, |j| j.register(names.clone()));
    Ok(Arc::new(Sink {
        generation,
        tracer,
        journal,
        metrics,
        names: names.clone(),
        keep_partial: config.keep_partial,
        recent,
        active: previous.map(|p| p.sink.active.clone()).unwrap_or_default(),
        flood: previous.map(|p| p.sink.flood.clone()).unwrap_or_default(),
    }))
}
