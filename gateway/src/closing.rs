//! The end of a shutdown's grace, which every long wait of a request
//! (the attempt loop's, a relayed stream's) ends on. Its own place, below
//! what uses it: the stream body needs only this of the gateway.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned};

/// The end of the shutdown grace: a token for what waits on it, and a flag
/// for what only asks whether it came — a relayed stream asks on every
/// poll that finds its upstream quiet, and a token's check takes a lock.
/// Clones share both (one for every generation of the config).
#[derive(Clone, Default)]
pub struct Closing {
    token: CancellationToken,
    over: Arc<AtomicBool>,
}

impl Closing {
    /// The grace is over: the flag first, so a task woken by the token
    /// reads it set.
    pub fn close(&self) {
        self.over.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Whether [`Closing::close`] was called (an atomic load).
    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }

    /// Resolves once closed.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// Resolves once closed, holding its own handle (for a body that
    /// outlives the request's task).
    pub fn cancelled_owned(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }
}
