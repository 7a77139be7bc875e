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
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::upstream::BuildError;

/// The route table.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/", get(handlers::root))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/responses", post(handlers::responses))
        .route("/v1/embeddings", post(handlers::embeddings))
        .route("/v1/messages", post(handlers::messages))
        .route("/v1/messages/count_tokens", post(handlers::count_tokens))
        .route("/v1/models", get(handlers::models))
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(admin::metrics))
        .route("/admin/upstreams", get(admin::upstreams))
        .route("/admin/clients", get(admin::clients))
        .route("/admin/requests", get(admin::requests))
        .route("/admin/requests/{id}", get(admin::request))
        .route("/admin/stats", get(admin::stats))
        .route("/ui", get(ui::page))
        .route("/ui/{file}", get(ui::asset))
        .fallback(handlers::fallback)
        .method_not_allowed_fallback(handlers::wrong_method)
        .with_state(gateway)
}

/// A running gateway; dropping it stops accepting connections.
pub struct Running {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    stop: CancellationToken,
    gateway: Arc<Gateway>,
}

impl Running {
    /// Waits until the accept loop ends (it only ends when stopped).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Shuts down without losing work: `/healthz` answers 503 and new
    /// requests get an immediate 503 (so a load balancer drains this
    /// replica), in-flight requests finish — for up to `grace`, or until
    /// `now` resolves (a second signal) — and streams still running then
    /// end with their protocol's error event, requests still waiting get
    /// a 503. Then the accept loop stops, and the background tasks and the
    /// journal are flushed and joined (idle connections end with the
    /// process).
    pub async fn shutdown(mut self, grace: Duration, now: impl Future<Output = ()>) {
        let gw = self.gateway.clone();
        gw.draining.store(true, std::sync::atomic::Ordering::Release);
        let mut now = std::pin::pin!(now);
        let drained = tokio::select! {
            () = gw.sink.idle() => true,
            () = tokio::time::sleep(grace) => false,
            () = &mut now => false,
        };
        if !drained {
            tracing::warn!(in_flight = gw.sink.active(), "shutdown grace over: ending what is still running");
            gw.closing.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(2), gw.sink.idle()).await;
        }
        self.stop.cancel();
        let _ = (&mut self.task).await;
        gw.finish(Duration::from_secs(5)).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
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

/// Binds `config.listen` and serves until dropped.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let addr = config.listen;
    let gateway = Arc::new(Gateway::new(config)?);
    gateway.follow_shared_health();
    let listener = listen::bind(addr).map_err(|error| StartError::Bind { addr, error })?;
    let addr = listener.local_addr().map_err(|error| StartError::Bind { addr, error })?;
    let stop = CancellationToken::new();
    let app = router(gateway.clone());
    let max_connections = gateway.config.max_connections;
    let task = tokio::spawn(listen::serve_until(listener, app, stop.clone().cancelled_owned(), max_connections));
    Ok(Running { addr, task, stop, gateway })
}
