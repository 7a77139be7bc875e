//! Listening socket and accept loop, shared by the gateway and the
//! simulator.
//!
//! A backlog of 4096 so a burst of connects is queued rather than dropped,
//! and `TCP_NODELAY` on every accepted socket so a keep-alive client does
//! not stall on Nagle's algorithm for each small response.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connections::{GiveWay, Registered, Registry, Tracked};

const BACKLOG: i32 = 4096;

/// Binds a TCP listener with a large backlog.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Accepts connections forever, serving each with HTTP/1.1 on its own task.
pub async fn serve(listener: TcpListener, app: Router) {
    serve_until(listener, TowerToHyperService::new(app), std::future::pending(), usize::MAX).await;
}

/// Boxed error of a service or body.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The answer to a connection over `max_connections`: written at once,
/// then the connection is closed (no request is read).
static TOO_MANY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = r#"{"error":{"message":"tidegate: too many open connections (max_connections); retry shortly","type":"api_error"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Accepts connections until `stop` resolves. (A shutdown waits for the
/// requests in flight, not for connections: idle keep-alive connections
/// simply end with the process.) At `max_connections` open at once, the
/// connection idle the longest is closed to make room for a new one (see
/// [`connections`]); only when every one has a request in service does a
/// new connection get an immediate `503` and close, so neither a flood of
/// idle sockets nor one of busy ones can use up the file descriptors the
/// gateway needs for its upstreams.
pub async fn serve_until<S, B>(
    listener: TcpListener,
    service: S,
    stop: impl Future<Output = ()>,
    max_connections: usize,
) where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let open = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
    let registry = Arc::new(Registry::default());
    // Serves one accepted connection on its own task, which holds its slot
    // and its place in the registry.
    // Configured once: each connection's timer is then a shared handle,
    // not an allocation of its own.
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1.timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    let serve_one = {
        let registry = registry.clone();
        move |stream: TcpStream, slot: OwnedSemaphorePermit| {
            let registered = registry.open();
            let service = Tracked::new(service.clone(), &registered);
            // Upgrades kept: Codex's Responses WebSocket (`server::websocket`).
            let connection = http1.serve_connection(TokioIo::new(stream), service).with_upgrades();
            let shed = registered.shed();
            tokio::spawn(Served { connection, shed, shedding: false, _held: (registered, slot) });
        }
    };
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => return,
        };
        let (stream, _peer) = match accepted {
            Ok(conn) => conn,
            Err(err) => {
                // Out of file descriptors and the like: back off briefly
                // instead of spinning, and keep serving.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match open.clone().try_acquire_owned() {
            Ok(slot) => serve_one(stream, slot),
            Err(_) if registry.shed_oldest_idle() => {
                // An idle connection closes at once; this one takes its
                // slot (a semaphore hands freed slots to waiters in turn).
                let (open, serve_one) = (open.clone(), serve_one.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(SHED_WAIT, open.acquire_owned()).await {
                        Ok(Ok(slot)) => serve_one(stream, slot),
                        _ => too_many(stream).await,
                    }
                });
            }
            Err(_) => {
                tokio::spawn(too_many(stream));
            }
        }
    }
}

/// How long a new connection waits for the idle one it displaced to close.
const SHED_WAIT: Duration = Duration::from_secs(1);

/// The refusal of a connection beyond the bound when none can give way.
async fn too_many(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        // Read the request head first: an answer before the
        // request is one an HTTP client cannot read.
        let mut head = [0u8; 8192];
        let mut read = 0;
        while read < head.len() {
            match stream.read(&mut head[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
            if head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let _ = stream.write_all(&TOO_MANY).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

pin_project_lite::pin_project! {
    /// A client connection's task: serves it until it ends, and shuts it
    /// down gracefully when asked to give way (an idle one closes at once,
    /// one with a request in service finishes that request first). Holds
    /// its place in the registry and its connection slot.
    struct Served<C> {
        #[pin]
        connection: C,
        #[pin]
        shed: GiveWay,
        shedding: bool,
        _held: (Registered, OwnedSemaphorePermit),
    }
}

impl<S, B> Future for Served<hyper::server::conn::http1::UpgradeableConnection<TokioIo<TcpStream>, Tracked<S>>>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if !*this.shedding && this.shed.poll(cx).is_ready() {
            *this.shedding = true;
            this.connection.as_mut().graceful_shutdown();
        }
        match this.connection.poll(cx) {
            Poll::Ready(Err(err)) => {
                tracing::debug!(error = %err, "client connection ended with an error");
                Poll::Ready(())
            }
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        }
    }
}
