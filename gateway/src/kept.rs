//! What tidegate keeps of the Responses answers it made by translation:
//! a target reached over chat completions or Anthropic messages stores
//! nothing a later `previous_response_id` could name, so tidegate keeps,
//! per response id it gave, the conversation that led to it (the input
//! items, the previous ones included) and the items it answered. A
//! request continuing one is sent its whole history; an id no longer kept
//! is refused with a clear 400. Bounded by count and bytes, oldest out
//! first; in this process only (a replica that did not answer the
//! response does not have it, and says so).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

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

/// Where a translated Responses answer's conversation is kept: the store
/// and the items that led to it.
#[derive(Debug, Clone)]
pub struct Keep {
    /// The store.
    pub store: Arc<Kept>,
    /// The request's input items, the previous response's history first.
    pub input: Vec<Value>,
}

impl Keep {
    /// Keeps the conversation through response `id` that answered with
    /// `output`.
    pub fn answered(&self, id: &str, output: &[Value]) {
        let mut items = self.input.clone();
        items.extend(output.iter().cloned());
        self.store.keep(id.to_owned(), items);
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
