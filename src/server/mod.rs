//! The client-facing HTTP server: listener, routes, thin handlers.
//!
//! Handlers only authenticate, read the body, find the route and hand over
//! to [`crate::relay`]; everything they answer by themselves goes through
//! [`crate::error::GatewayError`].

pub mod admin;
mod auth;
mod handlers;
pub mod listen;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio::task::JoinHandle;

use crate::anomaly::Anomaly;
use crate::config::Config;
use crate::journal::Journal;
use crate::metrics::Metrics;
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
        let sink =
            Arc::new(Sink { journal, metrics: Arc::new(metrics), names, keep_partial: config.keep_partial, recent });
        Ok(Self { config, upstreams, aliases, anomaly, sink })
    }
}

/// The route table.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/messages", post(handlers::messages))
        .route("/v1/models", get(handlers::models))
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(admin::metrics))
        .route("/admin/upstreams", get(admin::upstreams))
        .route("/admin/requests", get(admin::requests))
        .route("/admin/requests/{id}", get(admin::request))
        .route("/admin/stats", get(admin::stats))
        .route("/ui", get(ui::page))
        .route("/ui/{file}", get(ui::asset))
        .fallback(handlers::fallback)
        .with_state(gateway)
}

/// A running gateway; dropping it stops accepting connections.
pub struct Running {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Running {
    /// Waits until the accept loop ends (it only ends on error).
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// An upstream client could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {error}{}", if error.kind() == std::io::ErrorKind::AddrInUse { " (another process has that port: stop it, or choose another address with --listen)" } else { "" })]
    Bind {
        /// Address tried.
        addr: SocketAddr,
        /// OS error (not a `source`: the message already says it).
        error: std::io::Error,
    },
}

/// Applies the cooldowns and open breakers other replicas announce to
/// this gateway's upstreams.
fn apply_shared_health(gw: &Arc<Gateway>) {
    let Some(mut events) = gw.upstreams.iter().find_map(|u| u.shared.as_ref()).and_then(|s| s.take_events()) else {
        return;
    };
    let weak = Arc::downgrade(gw);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let Some(gw) = weak.upgrade() else { return };
            if let Some(u) = gw.upstreams.iter().find(|u| u.config.name == event.upstream) {
                tracing::info!(upstream = %event.upstream, kind = %event.kind, left_ms = event.left.as_millis() as u64, "another replica announced");
                u.health.absorb(&event.kind, event.left, tokio::time::Instant::now());
            }
        }
    });
}

/// Binds `config.listen` and serves until dropped.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let addr = config.listen;
    let gateway = Arc::new(Gateway::new(config)?);
    apply_shared_health(&gateway);
    let listener = listen::bind(addr).map_err(|error| StartError::Bind { addr, error })?;
    let addr = listener.local_addr().map_err(|error| StartError::Bind { addr, error })?;
    let task = tokio::spawn(listen::serve(listener, router(gateway)));
    Ok(Running { addr, task })
}
