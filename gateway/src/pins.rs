//! Which upstream stores a response: the Responses API keeps state at the
//! provider (`store`, the default there), and a request that continues it
//! (`previous_response_id`) can only be served by the account that holds
//! it. Another account answers "not found" — or worse, nothing sensible.
//!
//! The relay remembers the upstream of every stored response it relays
//! (the id from `response.created` or the JSON answer) and routes a request
//! naming one to that upstream only: retried there, never failed over.
//! Requests with `store: false` (Codex's default) are not pinned and fail
//! over freely. Pins live in memory, bounded (`MAX_LOCAL`, expired ones
//! dropped first) and, with shared state, in Redis for every replica, each
//! for `response_pin_ttl`.
//!
//! The same map keeps conversations where their prompt cache is (session
//! affinity, kind `session`): a session key → the upstream (pool account)
//! that last answered it, for `affinity_ttl`, renewed on every answer.
//!
//! Every pin belongs to the client that made it ([`Owner`]): its id is
//! kept under that owner (here and in Redis), so an id sent by another
//! client key finds nothing — many clients behind one upstream key cannot
//! reach each other's state at the provider through it. Without client
//! keys the ids are kept as they are (as before owners were kept).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::ids::UpstreamId;
use crate::kept::Owner;
use crate::shared::SharedState;

/// `id` as kept for `owner`: the owner's name, length first, before it
/// (no two owners' ids can meet, whatever their names hold).
fn scoped<'a>(owner: &Owner, id: &'a str) -> std::borrow::Cow<'a, str> {
    match owner {
        None => std::borrow::Cow::Borrowed(id),
        Some(o) => std::borrow::Cow::Owned(format!("{}:{o}:{id}", o.len())),
    }
}

/// Most pins kept in this process.
pub const MAX_LOCAL: usize = 100_000;

/// Stored response id → upstream index.
#[derive(Debug)]
pub struct Pins {
    local: Mutex<HashMap<String, (UpstreamId, Instant)>>,
    ttl: Duration,
    shared: Option<Arc<SharedState>>,
    names: Arc<[String]>,
    tasks: TaskTracker,
    /// What the ids are (`pin`, `session`): their namespace in Redis.
    kind: &'static str,
}

impl Pins {
    /// Pins kept for `ttl`; `names` are the upstreams by index (Redis
    /// stores names, which mean the same on every replica).
    pub fn new(ttl: Duration, shared: Option<Arc<SharedState>>, names: Arc<[String]>, tasks: TaskTracker) -> Self {
        Self::of_kind("pin", ttl, shared, names, tasks)
    }

    /// Like [`Pins::new`], for ids of another `kind` (their Redis namespace).
    pub fn of_kind(
        kind: &'static str,
        ttl: Duration,
        shared: Option<Arc<SharedState>>,
        names: Arc<[String]>,
        tasks: TaskTracker,
    ) -> Self {
        Self { local: Mutex::new(HashMap::new()), ttl, shared, names, tasks, kind }
    }

    /// Takes over the pins of `previous` (a config reload), each to the
    /// same upstream by name; pins to upstreams no longer configured are
    /// dropped (Redis still has them, by name).
    pub fn carry(&self, previous: &Pins) {
        let Ok(old) = previous.local.lock() else { return };
        let Ok(mut local) = self.local.lock() else { return };
        let moved: Vec<Option<UpstreamId>> =
            previous.names.iter().map(|n| self.names.iter().position(|x| x == n).map(UpstreamId::at)).collect();
        for (id, (index, until)) in old.iter() {
            if let Some(Some(now)) = moved.get(index.index()) {
                local.insert(id.clone(), (*now, *until));
            }
        }
    }

    /// Remembers that `upstream` stores `owner`'s response `id`.
    pub fn remember(&self, owner: &Owner, id: &str, upstream: UpstreamId) {
        let id = scoped(owner, id).into_owned();
        let now = Instant::now();
        if let (Some(shared), Some(name)) = (&self.shared, self.names.get(upstream.index())) {
            let (shared, name, key, ttl, kind) = (shared.clone(), name.clone(), id.clone(), self.ttl, self.kind);
            self.tasks.spawn(async move { shared.pin(kind, &key, &name, ttl).await });
        }
        let Ok(mut local) = self.local.lock() else { return };
        if local.len() >= MAX_LOCAL {
            local.retain(|_, (_, until)| *until > now);
            if local.len() >= MAX_LOCAL {
                // Still full of live pins: drop a tenth, in no particular
                // order (Redis, when configured, still has them).
                let drop: Vec<String> = local.keys().take(MAX_LOCAL / 10).cloned().collect();
                drop.iter().for_each(|k| {
                    local.remove(k);
                });
            }
        }
        local.insert(id, (upstream, now + self.ttl));
    }

    /// The upstream that stores `owner`'s response `id`, if known here or
    /// (with shared state) to any replica.
    pub async fn find(&self, owner: &Owner, id: &str) -> Option<UpstreamId> {
        let id = &*scoped(owner, id);
        let now = Instant::now();
        let local = self.local.lock().ok().and_then(|l| l.get(id).filter(|(_, until)| *until > now).map(|(u, _)| *u));
        if local.is_some() {
            return local;
        }
        let name = self.shared.as_ref()?.pinned(self.kind, id).await?;
        self.names.iter().position(|n| *n == name).map(UpstreamId::at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pins_expire_and_stay_bounded() {
        let pins =
            Pins::new(Duration::from_secs(60), None, Arc::from(vec!["a".into(), "b".into()]), TaskTracker::new());
        pins.remember(&None, "resp_1", UpstreamId::at(1));
        assert_eq!(pins.find(&None, "resp_1").await, Some(UpstreamId::at(1)));
        assert_eq!(pins.find(&None, "resp_2").await, None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(pins.find(&None, "resp_1").await, None, "expired");
        for i in 0..MAX_LOCAL + 5 {
            pins.remember(&None, &format!("r{i}"), UpstreamId::at(0));
        }
        let len = pins.local.lock().unwrap().len();
        assert!(len <= MAX_LOCAL, "{len}");
        assert_eq!(
            pins.find(&None, &format!("r{}", MAX_LOCAL + 4)).await,
            Some(UpstreamId::at(0)),
            "the newest is kept"
        );
    }

    #[tokio::test]
    async fn a_pin_is_its_owners_only() {
        let pins = Pins::new(Duration::from_secs(60), None, Arc::from(vec!["a".into()]), TaskTracker::new());
        let (alice, bob): (Owner, Owner) = (Some("key:alice".into()), Some("key:bob".into()));
        pins.remember(&alice, "resp_1", UpstreamId::at(0));
        assert_eq!(pins.find(&alice, "resp_1").await, Some(UpstreamId::at(0)));
        assert_eq!(pins.find(&bob, "resp_1").await, None);
        assert_eq!(pins.find(&None, "resp_1").await, None);
        // Names that would meet if joined plainly do not.
        pins.remember(&Some("a:b".into()), "c", UpstreamId::at(0));
        assert_eq!(pins.find(&Some("a".into()), "b:c").await, None);
    }
}
