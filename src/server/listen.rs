//! Listening socket and accept loop, shared by the gateway and the
//! simulator.
//!
//! A backlog of 4096 so a burst of connects is queued rather than dropped,
//! and `TCP_NODELAY` on every accepted socket so a keep-alive client does
//! not stall on Nagle's algorithm for each small response.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

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
    loop {
        let (stream, _peer) = match listener.accept().await {
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
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(err) = conn.await {
                tracing::debug!(error = %err, "connection ended with an error");
            }
        });
    }
}
