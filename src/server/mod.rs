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

/// Binds `config.listen` and serves until dropped.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let addr = config.listen;
    let gateway = Arc::new(Gateway::new(config)?);
    gateway.follow_shared_health();
    let listener = listen::bind(addr).map_err(|error| StartError::Bind { addr, error })?;
    let addr = listener.local_addr().map_err(|error| StartError::Bind { addr, error })?;
    let task = tokio::spawn(listen::serve(listener, router(gateway)));
    Ok(Running { addr, task })
}
