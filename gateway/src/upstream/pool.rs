//! Reused HTTP/1.1 connections to one upstream: hyper's connection-level
//! client under a small last-in-first-out pool.
//!
//! Why not hyper-util's pooled `Client`: it is general (any number of
//! hosts, HTTP/2, a checkout future racing a connect, a task spawned to
//! put a connection back once its answer is read), and on a one-core
//! proxy hop that generality cost ~1.8 µs per request — about 13% of a
//! bare hyper proxy's throughput (`bench/core.sh`, `bare_proxy`). One
//! upstream is one host, so the pool is a `Vec` behind a lock held for a
//! push or a pop, and a connection goes back the moment its answer's last
//! byte is read ([`PooledBody`]), by the reader itself.
//!
//! The rules that keep reuse safe: a connection goes back only after its
//! whole answer was read (an answer dropped half-read closes it; one whose
//! reader is done before its end, a stream after its terminal event, is
//! read to its end apart: [`PooledBody::settle`]); one idle
//! for [`IDLE_FOR`] is not used again (a load balancer may have forgotten
//! it without a word); one the upstream closed is skipped; a request that
//! could not be written on a reused connection (closed just then) is sent
//! on another one, since the upstream never saw it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tower::Service;

/// Idle time after which a pooled connection is closed instead of used.
pub const IDLE_FOR: Duration = Duration::from_secs(60);

/// Idle connections kept at most (more are closed when they come back).
const MAX_IDLE: usize = 8192;

/// Reused connections tried before a fresh one for the same request.
const STALE_TRIES: usize = 4;

type Conn = SendRequest<Full<Bytes>>;

/// Connections to one upstream.
pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// The `Host` header of every request: one upstream is one host.
    host: Option<HeaderValue>,
    handshake: Builder,
    /// Idle connections, oldest first; `None` when connections are not
    /// reused (`connection_close`).
    idle: Option<Mutex<Vec<(Conn, Instant)>>>,
    /// A task closes connections idle for [`IDLE_FOR`] (see [`sweep`]).
    sweeping: AtomicBool,
}

impl Pool {
    /// A pool for the host of `base` connecting with `connector`, reading
    /// answers into buffers of `read_buf` bytes; `reuse: false` makes every
    /// request its own connection.
    pub fn new(base: &Uri, connector: HttpsConnector<HttpConnector>, read_buf: usize, reuse: bool) -> Arc<Self> {
        let mut handshake = Builder::new();
        handshake.read_buf_exact_size(Some(read_buf));
        let host = base.authority().and_then(|a| HeaderValue::try_from(a.as_str()).ok());
        Arc::new(Self {
            connector,
            host,
            handshake,
            idle: reuse.then(|| Mutex::new(Vec::new())),
            sweeping: AtomicBool::new(false),
        })
    }

    /// Sends `req` (an absolute URI) and returns the answer's head; its
    /// body gives the connection back when read to the end.
    #[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
    pub fn send(
        self: &Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<PooledBody>, TransportError>> + Send + '_ {
        // Not an `async fn`: that would keep the request twice in the
        // future (see `relay::relay`).
        async move {
            let target = req.uri().clone();
            if !req.headers().contains_key(header::HOST)
                && let Some(host) = &self.host
            {
                req.headers_mut().insert(header::HOST, host.clone());
            }
            // On the wire, the request line carries the path only.
            if let Ok(path) = Uri::from_parts({
                let mut origin = http::uri::Parts::default();
                origin.path_and_query = target.path_and_query().cloned();
                origin
            }) {
                *req.uri_mut() = path;
            }
            let mut stale = 0;
            loop {
                let (mut conn, reused) = match self.checkout() {
                    Some(conn) if stale < STALE_TRIES => (conn, true),
                    // Boxed: connecting (DNS, TCP, TLS, handshake) is rare on
                    // a pooled upstream, and inline its future would be part of
                    // every request's.
                    _ => (Box::pin(self.connect(&target)).await?, false),
                };
                if conn.ready().await.is_err() {
                    stale += 1;
                    continue;
                }
                match conn.try_send_request(req).await {
                    Ok(resp) => {
                        let back = self.idle.is_some().then(|| (conn, Arc::downgrade(self)));
                        return Ok(resp.map(|body| PooledBody::new(body, back)));
                    }
                    Err(mut failed) => match failed.take_message() {
                        // Not written: the upstream never saw it.
                        Some(unsent) if reused => {
                            req = unsent;
                            stale += 1;
                        }
                        _ => return Err(TransportError::Send(super::describe(failed.error()))),
                    },
                }
            }
        }
    }

    /// The most recently used idle connection still open and fresh.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.as_ref()?.lock().ok()?;
        let now = Instant::now();
        while let Some((conn, since)) = idle.pop() {
            if now.saturating_duration_since(since) >= IDLE_FOR {
                // Every older one has been idle longer still.
                idle.clear();
                return None;
            }
            if !conn.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(self: &Arc<Self>, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        if let Some(Ok(mut idle)) = self.idle.as_ref().map(Mutex::lock)
            && idle.len() < MAX_IDLE
        {
            idle.push((conn, Instant::now()));
        }
        if !self.sweeping.swap(true, Ordering::AcqRel) {
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }

    /// Closes the connections idle for [`IDLE_FOR`] by `now`; returns when
    /// the oldest one left went idle.
    fn evict_idle(&self, now: Instant) -> Option<Instant> {
        let mut idle = self.idle.as_ref()?.lock().ok()?;
        let expired = idle.iter().take_while(|(_, since)| now.saturating_duration_since(*since) >= IDLE_FOR).count();
        idle.drain(..expired);
        idle.first().map(|(_, since)| *since)
    }

    /// A new connection (TCP, TLS for `https`), its driver spawned.
    async fn connect(&self, target: &Uri) -> Result<Conn, TransportError> {
        let mut connector = self.connector.clone();
        let io = connector.call(target.clone()).await.map_err(|e| TransportError::Connect(super::describe(&*e)))?;
        let (conn, driver) =
            self.handshake.handshake(io).await.map_err(|e| TransportError::Handshake(super::describe(&e)))?;
        tokio::spawn(crate::logging::Drive { connection: driver, holding: (), what: "upstream" });
        Ok(conn)
    }
}

/// Why a request never got an answer's head from the upstream (each
/// with the cause chain, as text: it names no credential).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// DNS, TCP or TLS failed.
    #[error("{0}")]
    Connect(String),
    /// The HTTP/1 handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The connection failed while sending or before the head arrived.
    #[error("{0}")]
    Send(String),
}

/// Closes idle connections when they have been idle for [`IDLE_FOR`] (a
/// burst's connections do not stay open, and their memory held, until the
/// next request). Runs while the pool has idle connections; a connection
/// given back starts it again.
async fn sweep(pool: Weak<Pool>) {
    let mut wake = Instant::now() + IDLE_FOR;
    loop {
        tokio::time::sleep_until(wake).await;
        let Some(pool) = pool.upgrade() else { return };
        if let Some(oldest) = pool.evict_idle(Instant::now()) {
            wake = oldest + IDLE_FOR;
            continue;
        }
        pool.sweeping.store(false, Ordering::Release);
        // A connection given back just now saw the flag still set.
        match pool.evict_idle(Instant::now()) {
            Some(oldest) if !pool.sweeping.swap(true, Ordering::AcqRel) => wake = oldest + IDLE_FOR,
            _ => return,
        }
    }
}

/// An answer's body that returns its connection to the pool once read to
/// the end (and closes it if dropped before).
pub struct PooledBody {
    inner: Incoming,
    back: Option<(Conn, Weak<Pool>)>,
}

impl PooledBody {
    fn new(inner: Incoming, back: Option<(Conn, Weak<Pool>)>) -> Self {
        let mut body = Self { inner, back };
        if body.inner.is_end_stream() {
            body.release();
        }
        body
    }

    fn release(&mut self) {
        if let Some((conn, pool)) = self.back.take()
            && let Some(pool) = pool.upgrade()
        {
            pool.give_back(conn);
        }
    }

    /// Its reader has all it wants (a stream's terminal event came):
    /// the rest (the chunked body's end, normally in the same packet or
    /// the next) is read in the background, at most [`SETTLE_BYTES`] of it
    /// within [`SETTLE_FOR`], so the connection goes back to the pool. A
    /// body dropped there instead closes its connection, and every stream
    /// opened a new one (a TLS handshake each, over HTTPS).
    pub fn settle(self) {
        if self.back.is_none() {
            return;
        }
        tokio::spawn(Settle { body: self, until: None, read: 0 });
    }
}

/// Longest a body is read after its reader is done with it (see
/// [`PooledBody::settle`]).
const SETTLE_FOR: Duration = Duration::from_secs(2);

/// Most bytes read after its reader is done with it; an upstream with
/// more to say after the end of its answer loses the connection instead.
const SETTLE_BYTES: usize = 64 * 1024;

/// The rest of a body read to its end (which gives the connection back)
/// or dropped at a bound (which closes it).
struct Settle {
    body: PooledBody,
    /// Armed on the first wait only: the end is usually there at once.
    until: Option<Pin<Box<tokio::time::Sleep>>>,
    read: usize,
}

impl Future for Settle {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    this.read += frame.data_ref().map_or(0, Bytes::len);
                    if this.read > SETTLE_BYTES {
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(None | Some(Err(_))) => return Poll::Ready(()),
                Poll::Pending => {
                    let until = this.until.get_or_insert_with(|| Box::pin(tokio::time::sleep(SETTLE_FOR)));
                    return until.as_mut().poll(cx);
                }
            }
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.release(),
            // A broken answer: its connection is not reused.
            Poll::Ready(Some(Err(_))) => this.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
