//! What tidegate keeps of the Responses answers it made by translation:
//! a target reached over chat completions or Anthropic messages stores
//! nothing a later `previous_response_id` could name, so tidegate keeps,
//! per response id it gave, the conversation that led to it (the input
//! items, the previous ones included) and the items it answered. A
//! request continuing one is sent its whole history; an id not kept (any
//! more, or never for this client) is answered as OpenAI answers an id it
//! does not have.
//!
//! A conversation belongs to the client that made it ([`Owner`]): a
//! response id sent by another client key finds nothing, whatever it
//! knows of the id.
//!
//! In this process each response is one [`Turn`]: the items new in it, as
//! the JSON text they came in (a parsed tree costs 10–70 times its text),
//! and the turn it continued, shared with every later turn of the
//! conversation, so a conversation costs its size once, not once per
//! turn. What is counted against [`MAX_BYTES`] is what is held: each
//! turn's text and its place, added when it is made and taken off when
//! its last holder lets it go. A conversation is kept only while it has
//! at most [`MAX_ITEMS`] items and its text is no larger than one request
//! may be (`max_body`): its history is sent again with every turn.
//!
//! With shared state (`state:`), every replica's answers are also kept in
//! Redis, for `response_pin_ttl`, turn by turn the same way, each with its
//! owner; a replica asked to continue a response it did not answer reads
//! the chain back before routing (see `shared::SharedState::kept`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio_util::task::TaskTracker;

use crate::shared::SharedState;

/// Most responses kept.
pub const MAX_RESPONSES: usize = 4096;

/// Most bytes held in all (turns' text and their bookkeeping).
pub const MAX_BYTES: usize = 64 * 1024 * 1024;

/// Most items in one kept conversation.
pub const MAX_ITEMS: usize = 20_000;

/// What a turn costs besides its text: the turn, its id in the map and
/// in the order, the owner's handle.
const TURN_OVERHEAD: usize = 256;

/// Who a kept thing belongs to: the client key's name or its group (see
/// `client_keys[].group`), or `None` in a deployment without client keys,
/// where every client may continue every conversation.
pub type Owner = Option<Arc<str>>;

/// One response of a kept conversation.
#[derive(Debug)]
pub struct Turn {
    /// The items new in it (input and output) as one JSON array's text.
    items: Box<str>,
    /// Items in the conversation through it.
    count: usize,
    /// Text bytes of the conversation through it.
    text: usize,
    /// The turn it continued.
    previous: Option<Arc<Turn>>,
    /// Whose it is.
    owner: Owner,
    /// What it adds to `held`.
    size: usize,
    held: Arc<AtomicUsize>,
}

impl Turn {
    /// Items in the conversation through this turn.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The conversation through this turn, oldest item first (`None`
    /// when a turn's text no longer reads, which cannot happen to text
    /// tidegate wrote).
    pub fn history(&self) -> Option<Vec<Value>> {
        let mut texts = Vec::new();
        let mut at = Some(self);
        while let Some(turn) = at {
            texts.push(&*turn.items);
            at = turn.previous.as_deref();
        }
        let mut items = Vec::with_capacity(self.count);
        for text in texts.iter().rev() {
            items.extend(serde_json::from_str::<Vec<Value>>(text).ok()?);
        }
        Some(items)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.held.fetch_sub(self.size, Ordering::Relaxed);
        // A long chain let go at once is freed in a loop, not by one
        // drop calling the next (thousands of turns would overflow the
        // stack).
        let mut next = self.previous.take();
        while let Some(turn) = next {
            next = match Arc::try_unwrap(turn) {
                Ok(mut turn) => turn.previous.take(),
                Err(_) => None,
            };
        }
    }
}

/// The items and text bytes of a conversation that adds `count` items of
/// `text` bytes after `previous`, if it is within what is kept.
fn within(previous: Option<&Turn>, count: usize, text: usize, max_text: usize) -> Option<(usize, usize)> {
    let (before, text_before) = previous.map_or((0, 0), |p| (p.count, p.text));
    let (count, text) = (before + count, text_before + text);
    (count <= MAX_ITEMS && text <= max_text.min(MAX_BYTES)).then_some((count, text))
}

/// Response id → the turn it ended, bounded by count and bytes, oldest
/// out first.
#[derive(Debug, Default)]
pub struct Kept {
    inner: Mutex<Inner>,
    held: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Inner {
    turns: HashMap<String, Arc<Turn>>,
    order: VecDeque<String>,
}

impl Kept {
    /// Keeps response `id` of `owner`: `items` (a JSON array's text, of
    /// `count` items) new after `previous`. Returns the turn, or `None`
    /// when the conversation is over [`MAX_ITEMS`] or `max_text` bytes
    /// (it is then not kept).
    pub fn keep(
        &self,
        id: String,
        owner: Owner,
        previous: Option<Arc<Turn>>,
        items: String,
        count: usize,
        max_text: usize,
    ) -> Option<Arc<Turn>> {
        let (count, text) = within(previous.as_deref(), count, items.len(), max_text)?;
        let size = items.len() + id.len() * 2 + TURN_OVERHEAD;
        self.held.fetch_add(size, Ordering::Relaxed);
        let turn = Arc::new(Turn {
            items: items.into_boxed_str(),
            count,
            text,
            previous,
            owner,
            size,
            held: self.held.clone(),
        });
        let mut inner = self.inner.lock().ok()?;
        if inner.turns.insert(id.clone(), turn.clone()).is_some() {
            inner.order.retain(|o| *o != id);
        }
        inner.order.push_back(id);
        // Oldest out first, until the bounds hold; the newest stays (its
        // own conversation is within them). A turn a later one continues
        // frees nothing until that one goes too.
        while inner.order.len() > 1
            && (inner.order.len() > MAX_RESPONSES || self.held.load(Ordering::Relaxed) > MAX_BYTES)
        {
            let Some(old) = inner.order.pop_front() else { break };
            inner.turns.remove(&old);
        }
        drop(inner);
        Some(turn)
    }

    /// Response `id`'s turn, if it is kept and `owner`'s.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Arc<Turn>> {
        let inner = self.inner.lock().ok()?;
        inner.turns.get(id).filter(|t| t.owner == *owner).cloned()
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
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
    /// Most text one conversation may hold: what one request may carry
    /// (`max_body`), as its history is sent with every turn.
    pub max_text: usize,
}

impl Store {
    /// Response `id`'s turn, if this process has it for `owner`.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Arc<Turn>> {
        self.local.get(id, owner)
    }

    /// Makes sure this process has `owner`'s conversation through `id`,
    /// reading it from Redis when another replica answered it. Whether it
    /// has it now.
    pub async fn fetch(&self, id: &str, owner: &Owner) -> bool {
        if self.local.get(id, owner).is_some() {
            return true;
        }
        let Some(shared) = &self.shared else { return false };
        let Some(items) = shared.kept(id, self.ttl, owner.as_deref().unwrap_or_default()).await else {
            return false;
        };
        let Ok(text) = serde_json::to_string(&items) else { return false };
        self.local.keep(id.to_owned(), owner.clone(), None, text, items.len(), self.max_text).is_some()
    }
}

/// Where a translated Responses answer's conversation is kept: the
/// store, whose it is, the turn it continues and the items new in it.
#[derive(Debug, Clone)]
pub struct Keep {
    /// The store.
    pub store: Store,
    /// Whose the conversation is.
    pub owner: Owner,
    /// The response this request continued, and its turn.
    pub previous: Option<(String, Arc<Turn>)>,
    /// The request's own input items (not its history).
    pub input: Vec<Value>,
}

impl Keep {
    /// Keeps the conversation through response `id` that answered with
    /// `output`.
    pub fn answered(&self, id: &str, output: &[Value]) {
        let new: Vec<&Value> = self.input.iter().chain(output).collect();
        let Ok(turn) = serde_json::to_string(&new) else { return };
        let previous = self.previous.as_ref().map(|(_, t)| t.clone());
        if within(previous.as_deref(), new.len(), turn.len(), self.store.max_text).is_none() {
            // Grown past what is kept: a continuation finds nothing.
            return;
        }
        if let Some(shared) = &self.store.shared {
            let previous = self.previous.as_ref().map(|(p, _)| p.clone());
            let (shared, id, ttl, items) = (shared.clone(), id.to_owned(), self.store.ttl, turn.clone());
            let owner = self.owner.as_deref().unwrap_or_default().to_owned();
            self.store
                .tasks
                .spawn(async move { shared.keep_turn(&id, previous.as_deref(), &items, &owner, ttl).await });
        }
        self.store.local.keep(id.to_owned(), self.owner.clone(), previous, turn, new.len(), self.store.max_text);
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

    fn keep(kept: &Kept, id: &str, previous: Option<Arc<Turn>>, items: &str, n: usize) -> Option<Arc<Turn>> {
        kept.keep(id.into(), Some("key:alice".into()), previous, items.into(), n, usize::MAX)
    }

    #[test]
    fn the_oldest_go_first_and_the_bounds_hold() {
        let kept = Kept::default();
        for i in 0..MAX_RESPONSES + 10 {
            keep(&kept, &format!("resp_{i}"), None, &format!("[{{\"n\":{i}}}]"), 1);
        }
        let alice = Some(Arc::from("key:alice"));
        assert!(kept.get("resp_0", &alice).is_none() && kept.get("resp_9", &alice).is_none());
        let newest = kept.get(&format!("resp_{}", MAX_RESPONSES + 9), &alice).unwrap();
        assert_eq!(newest.history().unwrap()[0]["n"], MAX_RESPONSES + 9);
        assert_eq!(kept.inner.lock().unwrap().turns.len(), MAX_RESPONSES);
        let per_turn = kept.held() / MAX_RESPONSES;
        assert!(per_turn < TURN_OVERHEAD + 64, "{per_turn}");
    }

    #[test]
    fn a_chain_shares_its_turns_and_counts_them_once() {
        let kept = Kept::default();
        let mut last = None;
        let text = format!("[{}]", vec!["{\"k\":1}"; 100].join(","));
        for i in 0..150 {
            last = keep(&kept, &format!("r{i}"), last, &text, 100);
            assert!(last.is_some(), "turn {i}");
        }
        let held = kept.held();
        // 150 turns of ~800 bytes each, held once: not 150 × 150 / 2.
        assert!(held < 150 * (text.len() + TURN_OVERHEAD + 16), "{held}");
        assert_eq!(last.as_ref().unwrap().history().unwrap().len(), 15_000);
        // Past the items bound, a conversation is not kept.
        for i in 150..200 {
            last = keep(&kept, &format!("r{i}"), last.clone(), &text, 100).or(last);
        }
        assert_eq!(last.as_ref().unwrap().count(), MAX_ITEMS);
        assert!(keep(&kept, "r200", last, &text, 100).is_none());
        assert!(kept.get("r200", &Some("key:alice".into())).is_none());
    }

    #[test]
    fn a_conversation_is_its_owners_only() {
        let kept = Kept::default();
        keep(&kept, "r1", None, "[1]", 1);
        assert!(kept.get("r1", &Some("key:alice".into())).is_some());
        assert!(kept.get("r1", &Some("key:bob".into())).is_none());
        assert!(kept.get("r1", &None).is_none());
    }

    #[test]
    fn a_long_chain_let_go_at_once_is_freed_without_recursion() {
        let held = Arc::new(AtomicUsize::new(0));
        let mut last: Option<Arc<Turn>> = None;
        for _ in 0..200_000 {
            held.fetch_add(1, Ordering::Relaxed);
            last = Some(Arc::new(Turn {
                items: "[]".into(),
                count: 0,
                text: 0,
                previous: last,
                owner: None,
                size: 1,
                held: held.clone(),
            }));
        }
        drop(last);
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }
}
