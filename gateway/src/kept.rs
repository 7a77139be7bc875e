//! What tidegate keeps of the Responses answers it made by translation:
//! a target reached over chat completions or Anthropic messages stores
//! nothing a later `previous_response_id` could name, so tidegate keeps,
//! per response id it gave, the conversation that led to it (the input
//! items, the previous ones included) and the items it answered. A
//! request continuing one is sent its whole history; an id no longer kept
//! is refused with a clear 400.
//!
//! In this process the whole conversation is kept per response, bounded
//! by count and bytes, oldest out first. With shared state (`state:`),
//! every replica's answers are also kept in Redis, for
//! `response_pin_ttl`: each response as its own turn (the items new in it
//! and the response it continued), so a long conversation costs Redis its
//! size once, not once per turn; a replica asked to continue a response it
//! did not answer reads the chain back before routing (see
//! `shared::SharedState::kept`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio_util::task::TaskTracker;

use crate::shared::SharedState;

/// Most responses kept.
pub const MAX_RESPONSES: usize = 4096;

/// Most bytes (of their JSON) kept in all.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;

/// Response id → the conversation's items, through that response.
#[derive(Debug, Default)]
pub struct Kept {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    items: HashMap<String, (Arc<[Value]>, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Kept {
    /// Keeps `items` (the whole conversation through response `id`).
    pub fn keep(&self, id: String, items: Vec<Value>) {
        let size: usize = items.iter().map(|v| v.to_string().len()).sum();
        if size > MAX_BYTES {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        while !inner.order.is_empty() && (inner.order.len() >= MAX_RESPONSES || inner.bytes + size > MAX_BYTES) {
            if let Some(old) = inner.order.pop_front()
                && let Some((_, n)) = inner.items.remove(&old)
            {
                inner.bytes -= n;
            }
        }
        inner.bytes += size;
        inner.order.push_back(id.clone());
        if let Some((_, n)) = inner.items.insert(id, (Arc::from(items), size)) {
            inner.bytes -= n;
        }
    }

    /// The conversation through response `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Arc<[Value]>> {
        self.inner.lock().ok()?.items.get(id).map(|(items, _)| items.clone())
    }
}

/// Where conversations are kept: this process's [`Kept`] (carried across
/// reloads) and, with shared state, Redis.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// This process's conversations.
    pub local: Arc<Kept>,
    /// The shared store, when configured.
    pub shared: Option<Arc<SharedState>>,
    /// How long Redis keeps a turn after it was last read or written.
    pub ttl: Duration,
    /// Where the writes to Redis run (shutdown waits for them).
    pub tasks: TaskTracker,
}

impl Store {
    /// The conversation through response `id`, if this process has it.
    pub fn get(&self, id: &str) -> Option<Arc<[Value]>> {
        self.local.get(id)
    }

    /// Makes sure this process has the conversation through `id`, reading
    /// it from Redis when another replica answered it. Whether it has it
    /// now.
    pub async fn fetch(&self, id: &str) -> bool {
        if self.local.get(id).is_some() {
            return true;
        }
        let Some(shared) = &self.shared else { return false };
        let Some(items) = shared.kept(id, self.ttl).await else { return false };
        self.local.keep(id.to_owned(), items);
        self.local.get(id).is_some()
    }
}

/// Where a translated Responses answer's conversation is kept: the store
/// and the items that led to it.
#[derive(Debug, Clone)]
pub struct Keep {
    /// The store.
    pub store: Store,
    /// The request's input items, the previous response's history first.
    pub input: Vec<Value>,
    /// The response this request continued, and how many of `input` are
    /// its history (Redis keeps only what is new in each turn).
    pub previous: Option<(String, usize)>,
}

impl Keep {
    /// Keeps the conversation through response `id` that answered with
    /// `output`.
    pub fn answered(&self, id: &str, output: &[Value]) {
        let (previous, fresh) = match &self.previous {
            Some((p, n)) => (Some(p.clone()), *n),
            None => (None, 0),
        };
        if let Some(shared) = &self.store.shared {
            let new: Vec<&Value> = self.input.get(fresh..).unwrap_or_default().iter().chain(output).collect();
            if let Ok(turn) = serde_json::to_string(&new) {
                let (shared, id, ttl) = (shared.clone(), id.to_owned(), self.store.ttl);
                self.store.tasks.spawn(async move { shared.keep_turn(&id, previous.as_deref(), &turn, ttl).await });
            }
        }
        let mut items = self.input.clone();
        items.extend(output.iter().cloned());
        self.store.local.keep(id.to_owned(), items);
    }
}

/// A Responses request's `input` as items (a string is one user message).
pub fn input_items(input: &Value) -> Vec<Value> {
    match input {
        Value::String(text) => vec![serde_json::json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_the_bounds_hold() {
        let kept = Kept::default();
        for i in 0..MAX_RESPONSES + 10 {
            kept.keep(format!("resp_{i}"), vec![serde_json::json!({"n": i})]);
        }
        assert!(kept.get("resp_0").is_none() && kept.get("resp_9").is_none());
        assert_eq!(kept.get(&format!("resp_{}", MAX_RESPONSES + 9)).unwrap()[0]["n"], MAX_RESPONSES + 9);
        let inner = kept.inner.lock().unwrap();
        assert_eq!(inner.items.len(), MAX_RESPONSES);
        assert_eq!(inner.bytes, inner.items.values().map(|(_, n)| n).sum::<usize>());
    }
}
