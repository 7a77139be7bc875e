//! The client connections open at once, and which one gives way when
//! there are too many.
//!
//! `max_connections` bounds the file descriptors clients can hold. At the
//! bound a new connection must still be served: a client holding thousands
//! of idle keep-alive sockets (or sockets that never sent a request) would
//! otherwise lock every other client out until its sockets time out. So
//! each connection says whether a request is in service on it ([`Conn`]),
//! and at the bound the connection idle the longest is asked to close
//! (hyper's graceful shutdown: an idle connection closes at once, one in
//! the middle of a request finishes it first). Only when every connection
//! has a request in service is a new one refused.
//!
//! Cost per request: one counter up when the request arrives and down
//! when its answer's last byte has been handed to hyper ([`Tracked`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// One client connection's state, shared by its task and its requests.
#[derive(Debug)]
pub struct Conn {
    /// Requests in service on it (0 or 1 for HTTP/1, whose requests take turns).
    busy: AtomicU32,
    /// When it last became idle, as a tick of [`CLOCK`].
    idle_since: AtomicU64,
    /// Set when the connection is asked to give way.
    shed: Shed,
}

/// "Give way", said once to one connection's task. Not a
/// `CancellationToken`: the connection's task checks it every time it is
/// polled (every event of a stream), and a token's check takes two locks
/// (its own and its `Notify`'s); this one is an atomic load and, while
/// not asked, the waker's registration (an atomic swap).
#[derive(Debug, Default)]
struct Shed {
    asked: AtomicBool,
    waker: AtomicWaker,
}

impl Shed {
    fn ask(&self) {
        self.asked.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }
}

/// Resolves when its connection is asked to give way.
#[derive(Debug)]
pub struct GiveWay {
    conn: Arc<Conn>,
}

impl Future for GiveWay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shed = &self.conn.shed;
        if shed.asked() {
            return Poll::Ready(());
        }
        shed.waker.register(cx.waker());
        // Asked between the check and the registration: seen now.
        if shed.asked() { Poll::Ready(()) } else { Poll::Pending }
    }
}

/// Ticks when a connection opens or falls idle: a counter, since only
/// the order matters (see [`Conn::idle_since`]).
static CLOCK: AtomicU64 = AtomicU64::new(0);

fn tick() -> u64 {
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// The open connections, for choosing one to close.
#[derive(Debug, Default)]
pub struct Registry {
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

impl Registry {
    /// Registers a new connection (idle until its first request).
    pub fn open(self: &Arc<Self>) -> Registered {
        let conn =
            Arc::new(Conn { busy: AtomicU32::new(0), idle_since: AtomicU64::new(tick()), shed: Shed::default() });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut open) = self.open.lock() {
            open.insert(id, conn.clone());
        }
        Registered { registry: self.clone(), id, conn }
    }

    /// Asks the connection idle the longest to close; `false` when every
    /// open connection has a request in service (or is closing already).
    pub fn shed_oldest_idle(&self) -> bool {
        let Ok(open) = self.open.lock() else { return false };
        let oldest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.shed.asked())
            .min_by_key(|c| c.idle_since.load(Ordering::Relaxed));
        match oldest {
            Some(conn) => {
                conn.shed.ask();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the [`Registry`], left when dropped.
#[derive(Debug)]
pub struct Registered {
    registry: Arc<Registry>,
    id: u64,
    conn: Arc<Conn>,
}

impl Registered {
    /// The state its requests update.
    pub fn conn(&self) -> Arc<Conn> {
        self.conn.clone()
    }

    /// Resolves when the connection is asked to give way.
    pub fn shed(&self) -> GiveWay {
        GiveWay { conn: self.conn.clone() }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut open) = self.registry.open.lock() {
            open.remove(&self.id);
        }
    }
}

/// Marks its connection busy while alive: from a request's arrival until
/// its answer's body is done (or dropped).
#[derive(Debug)]
struct InService {
    conn: Arc<Conn>,
}

impl Drop for InService {
    fn drop(&mut self) {
        self.conn.idle_since.store(tick(), Ordering::Relaxed);
        self.conn.busy.fetch_sub(1, Ordering::Release);
    }
}

/// A connection's service: the gateway's, with each request marked as in
/// service on its connection.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    /// `inner`, serving the connection `registered`.
    pub fn new(inner: S, registered: &Registered) -> Self {
        Self { inner, conn: registered.conn() }
    }
}

impl<S, R, B> hyper::service::Service<R> for Tracked<S>
where
    S: hyper::service::Service<R, Response = http::Response<B>>,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, req: R) -> Self::Future {
        self.conn.busy.fetch_add(1, Ordering::AcqRel);
        let guard = InService { conn: self.conn.clone() };
        TrackedFuture { inner: self.inner.call(req), guard: Some(guard) }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer on its way: the connection stays busy.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InService>,
    }
}

impl<F, B, E> std::future::Future for TrackedFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let guard = this.guard.take();
        Poll::Ready(response.map(|r| r.map(|inner| TrackedBody { inner, guard })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body: the connection is idle again when it ends.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        guard: Option<InService>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_gives_way_never_a_busy_one() {
        let registry = Arc::new(Registry::default());
        let a = registry.open();
        let b = registry.open();
        let c = registry.open();
        // a is busy; b fell idle after c did.
        a.conn.busy.fetch_add(1, Ordering::AcqRel);
        let in_b = InService { conn: b.conn() };
        b.conn.busy.fetch_add(1, Ordering::AcqRel);
        drop(in_b);
        assert!(registry.shed_oldest_idle());
        assert!(c.conn.shed.asked() && !b.conn.shed.asked() && !a.conn.shed.asked());
        assert!(registry.shed_oldest_idle());
        assert!(b.conn.shed.asked());
        assert!(!registry.shed_oldest_idle(), "the busy one stays");
        assert!(!a.conn.shed.asked());
        drop((b, c));
        assert_eq!(registry.open.lock().unwrap().len(), 1);
    }
}
