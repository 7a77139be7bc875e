//! The client-facing HTTP server: listener, routes, thin handlers.
//!
//! Handlers only admit the request (key, origin, body), have it routed
//! ([`crate::route`]) and hand it to its [`crate::exchange::Exchange`];
//! everything they answer by themselves goes through
//! [`crate::error::GatewayError`].

pub mod admin;
pub mod connections;
mod handlers;
pub mod listen;
mod ui;
mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, Request, State};
use axum::routing::{get, post};
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::gateway::{Gateway, Live, ReloadError, Reloaded};
use crate::protocol::Endpoint;
use crate::upstream::BuildError;

/// What handlers are given: the live gateway. A handler asking for
/// `State<Arc<Gateway>>` gets the one in force when its request arrived,
/// and keeps it to the end, across a config reload.
#[derive(Clone)]
pub struct AppState(pub Arc<Live>);

impl FromRef<AppState> for Arc<Gateway> {
    fn from_ref(state: &AppState) -> Self {
        state.0.load()
    }
}

/// The route table.
pub fn router(live: Arc<Live>) -> Router {
    // The model endpoints, from their one list: [`Front`] sends their
    // POSTs to the handler directly; here they are for other methods (a
    // 405) and for anyone serving the router alone.
    let mut router = Router::new();
    for endpoint in Endpoint::FIXED {
        let mut route = post(move |State(gw): State<Arc<Gateway>>, req: Request| handlers::proxy(gw, endpoint, req));
        if endpoint == Endpoint::Responses {
            // Codex's WebSocket transport (see [`websocket`]).
            route = route.get(websocket::upgrade);
        }
        router = router.route(endpoint.path(), route);
    }
    router
        .route("/", get(handlers::root))
        .route("/v1/models", get(handlers::models))
        .route("/v1beta/models", get(handlers::models))
        .route("/v1beta/models/{*name}", get(handlers::gemini_model).post(handlers::gemini_model))
        .route("/v1/models/{*name}", post(handlers::gemini_model))
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(admin::metrics))
        .route("/admin/upstreams", get(admin::upstreams))
        .route("/admin/clients", get(admin::clients))
        .route("/admin/requests", get(admin::requests))
        .route("/admin/requests/{id}", get(admin::request))
        .route("/admin/stats", get(admin::stats))
        .route("/admin/reload", post(admin::reload))
        .route("/ui", get(ui::page))
        .route("/ui/{file}", get(ui::asset))
        .fallback(handlers::fallback)
        .method_not_allowed_fallback(handlers::wrong_method)
        .with_state(AppState(live))
}

/// What every connection is served by: a `POST` to a model endpoint goes
/// straight to its handler; everything else through the route table.
///
/// Why not the route table for all: the model endpoints are the hot path,
/// and axum's routing (path lookup, URL parameters stored per request, a
/// boxed service clone and future per request) cost ~5% of a one-core
/// proxy hop (`bench/core.sh`). The table still lists them, for the
/// `405` of a wrong method and as the one place to read the API.
#[derive(Clone)]
struct Front {
    live: Arc<Live>,
    router: Router,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Front {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        if req.method() == http::Method::POST {
            let path = req.uri().path();
            let endpoint = Endpoint::FIXED
                .into_iter()
                .find(|e| e.path() == path)
                .or_else(|| crate::protocol::gemini::split_path(path).map(|(e, _)| e));
            if let Some(endpoint) = endpoint {
                let gw = self.live.load();
                return Box::pin(async move { Ok(handlers::proxy(gw, endpoint, req).await) });
            }
        }
        // The body is boxed for the router only: a model endpoint reads
        // hyper's own.
        let router = self.router.clone();
        Box::pin(tower::ServiceExt::oneshot(router, req.map(axum::body::Body::new)))
    }
}

/// A running gateway; dropping it stops accepting connections.
pub struct Running {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    stop: CancellationToken,
    live: Arc<Live>,
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
        let gw = self.live.load();
        gw.draining.store(true, std::sync::atomic::Ordering::Release);
        let mut now = std::pin::pin!(now);
        let drained = tokio::select! {
            () = gw.sink.idle() => true,
            () = tokio::time::sleep(grace) => false,
            () = &mut now => false,
        };
        if !drained {
            tracing::warn!(in_flight = gw.sink.active(), "shutdown grace over: ending what is still running");
            gw.closing.close();
            let _ = tokio::time::timeout(Duration::from_secs(2), gw.sink.idle()).await;
        }
        self.stop.cancel();
        let _ = (&mut self.task).await;
        self.live.stop_following();
        gw.finish(Duration::from_secs(5)).await;
    }

    /// Re-reads the config file it was started from and applies it to new
    /// requests (`SIGHUP`, `POST /admin/reload`); an invalid config changes
    /// nothing.
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        self.live.reload().await
    }

    /// The live gateway (for a task that reloads it).
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    /// Applies `config` to new requests, as a reload would.
    pub async fn apply(&self, config: Config) -> Result<Reloaded, ReloadError> {
        self.live.apply(config).await
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
    start_from(config, None).await
}

/// Like [`start`], for a config read from `source`, which a reload
/// re-reads.
pub async fn start_from(config: Config, source: Option<std::path::PathBuf>) -> Result<Running, StartError> {
    let addr = config.listen;
    let live = Live::new(Gateway::new(config)?, source);
    live.follow_shared_health();
    let gateway = live.load();
    let listener = listen::bind(addr).map_err(|error| StartError::Bind { addr, error })?;
    let addr = listener.local_addr().map_err(|error| StartError::Bind { addr, error })?;
    let stop = CancellationToken::new();
    let front = Front { live: live.clone(), router: router(live.clone()) };
    let max_connections = gateway.config.max_connections;
    let task = tokio::spawn(listen::serve_until(listener, front, stop.clone().cancelled_owned(), max_connections));
    Ok(Running { addr, task, stop, live })
}
