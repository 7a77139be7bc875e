//! Who waits next: the order in which queued requests get a free slot.
//!
//! Two rules, applied in this order each time a slot is handed out:
//!
//! 1. **Priority.** Interactive requests go before batch ones. While both
//!    wait, a share of the slots (`batch_share`, default 1 in 10) still goes
//!    to batch: every hand-out adds `batch_share` to a credit, and when the
//!    credit reaches 1 the slot goes to batch and the credit drops by 1. So
//!    batch is slowed, never starved. When only one class waits it gets
//!    every slot and the credit stays where it was.
//! 2. **Weight, within a class.** Each client key waiting in the class has
//!    a virtual time; the slot goes to the smallest (ties: who started
//!    waiting first), whose time then advances by `1/weight`. A key that
//!    starts waiting joins at the class's current virtual time (never
//!    earlier than its own), so time spent idle is not saved up as credit.
//!    Under saturation keys are therefore served in proportion to their
//!    weights (stride scheduling); with equal weights this is round robin.
//!
//! Within one key and class, requests are served in arrival order. Cost per
//! hand-out is O(log k) for k waiting keys; a waiting request costs its
//! payload, an id and a `VecDeque` slot. A key that ever waited keeps a
//! small record (its virtual time) for the queue's life: the keys are the
//! configured client keys, a bounded set.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// How urgent a request is, when slots are scarce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// A person is waiting: served first.
    #[default]
    Interactive,
    /// Nobody watches: served after interactive work, with a reserved share.
    Batch,
}

impl Priority {
    /// The name in config, headers and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// Parses `interactive` or `batch`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "interactive" => Some(Priority::Interactive),
            "batch" => Some(Priority::Batch),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Priority::Interactive => 0,
            Priority::Batch => 1,
        }
    }
}

/// Who is asking, as far as the queue is concerned: cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct Who {
    /// Client key name (`-` without client keys).
    pub name: Arc<str>,
    /// Share of contended slots relative to other keys (≥ 1).
    pub weight: u32,
    /// This request's priority.
    pub priority: Priority,
}

impl Who {
    /// A client with weight 1 and interactive priority.
    pub fn plain(name: &str) -> Self {
        Who { name: Arc::from(name), weight: 1, priority: Priority::Interactive }
    }
}

/// Virtual time one hand-out costs a key of weight 1.
const STRIDE: u64 = 1 << 20;

struct Flow<T> {
    items: VecDeque<(u64, T)>,
    /// Virtual time of this key's next hand-out.
    pass: u64,
    /// When it last started waiting (tie-break).
    since: u64,
    weight: u32,
}

struct Class<T> {
    /// Flows by index (a key keeps its index while the queue lives, so a
    /// hand-out never hashes a name).
    flows: Vec<Flow<T>>,
    index: HashMap<Arc<str>, usize>,
    /// Waiting keys by (pass, since, flow index).
    order: BTreeSet<(u64, u64, usize)>,
    vtime: u64,
    len: usize,
}

impl<T> Default for Class<T> {
    fn default() -> Self {
        Self { flows: Vec::new(), index: HashMap::new(), order: BTreeSet::new(), vtime: 0, len: 0 }
    }
}

impl<T> Class<T> {
    fn push(&mut self, who: &Who, id: u64, item: T) {
        let vtime = self.vtime;
        let at = match self.index.get(&who.name) {
            Some(at) => *at,
            None => {
                self.flows.push(Flow { items: VecDeque::new(), pass: vtime, since: 0, weight: 1 });
                self.index.insert(who.name.clone(), self.flows.len() - 1);
                self.flows.len() - 1
            }
        };
        let Some(flow) = self.flows.get_mut(at) else { return };
        flow.weight = who.weight.max(1);
        if flow.items.is_empty() {
            flow.pass = flow.pass.max(vtime);
            flow.since = id;
            self.order.insert((flow.pass, flow.since, at));
        }
        flow.items.push_back((id, item));
        self.len += 1;
    }

    fn pop(&mut self) -> Option<T> {
        let (pass, since, at) = self.order.pop_first()?;
        let flow = self.flows.get_mut(at)?;
        let (_, item) = flow.items.pop_front()?;
        self.len -= 1;
        self.vtime = pass;
        flow.pass = pass + STRIDE / u64::from(flow.weight);
        if !flow.items.is_empty() {
            self.order.insert((flow.pass, since, at));
        }
        Some(item)
    }

    fn remove(&mut self, name: &str, id: u64) -> Option<T> {
        let at = *self.index.get(name)?;
        let flow = self.flows.get_mut(at)?;
        let pos = flow.items.iter().position(|(i, _)| *i == id)?;
        let (_, item) = flow.items.remove(pos)?;
        self.len -= 1;
        if flow.items.is_empty() {
            self.order.remove(&(flow.pass, flow.since, at));
        }
        Some(item)
    }

    fn waiting_of(&self, name: &str) -> usize {
        self.index.get(name).and_then(|at| self.flows.get(*at)).map_or(0, |f| f.items.len())
    }
}

/// The queue in front of a set of slots: priority first, then weighted
/// fair between client keys (see the module docs for the exact rule).
pub struct Fair<T> {
    classes: [Class<T>; 2],
    /// Batch's share of contended hand-outs, in thousandths.
    batch_share: u32,
    /// Accumulated batch share, in thousandths (integers: ten additions
    /// of 0.1 must make exactly 1).
    credit: u32,
    next_id: u64,
}

impl<T> Fair<T> {
    /// An empty queue giving batch `batch_share` (0..=1) of the slots
    /// while interactive requests wait too.
    pub fn new(batch_share: f64) -> Self {
        Self {
            classes: [Class::default(), Class::default()],
            batch_share: (batch_share.clamp(0.0, 1.0) * 1000.0).round() as u32,
            credit: 0,
            next_id: 0,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.classes[0].len + self.classes[1].len
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests of client `name` waiting.
    pub fn waiting_of(&self, name: &str) -> usize {
        self.classes.iter().map(|c| c.waiting_of(name)).sum()
    }

    /// Queues `item` for `who`; returns its id (to remove it if it leaves).
    pub fn push(&mut self, who: &Who, item: T) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.classes[who.priority.index()].push(who, id, item);
        id
    }

    /// The next item by the rules above.
    pub fn pop(&mut self) -> Option<T> {
        let (interactive, batch) = (self.classes[0].len > 0, self.classes[1].len > 0);
        let class = match (interactive, batch) {
            (true, true) => {
                self.credit += self.batch_share;
                if self.credit >= 1000 {
                    self.credit -= 1000;
                    1
                } else {
                    0
                }
            }
            (true, false) => 0,
            (false, true) => 1,
            (false, false) => return None,
        };
        self.classes[class].pop()
    }

    /// Removes a waiter that gave up (deadline, client gone).
    pub fn remove(&mut self, who: &Who, id: u64) -> Option<T> {
        self.classes[who.priority.index()].remove(&who.name, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(name: &str, weight: u32, priority: Priority) -> Who {
        Who { name: Arc::from(name), weight, priority }
    }

    #[test]
    fn equal_weights_take_turns() {
        let mut q = Fair::new(0.1);
        for (i, c) in ["a", "a", "a", "b", "a", "b"].iter().enumerate() {
            q.push(&Who::plain(c), format!("{c}{i}"));
        }
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["a0", "b3", "a1", "b5", "a2", "a4"]);
    }

    #[test]
    fn weights_share_slots_in_proportion() {
        let mut q = Fair::new(0.1);
        let (a, b) = (who("a", 3, Priority::Interactive), who("b", 1, Priority::Interactive));
        for _ in 0..400 {
            q.push(&a, 'a');
            q.push(&b, 'b');
        }
        let first: Vec<char> = (0..200).filter_map(|_| q.pop()).collect();
        let from_a = first.iter().filter(|c| **c == 'a').count();
        assert_eq!(from_a, 150, "3:1 exactly while both wait");
    }

    #[test]
    fn a_key_that_was_idle_joins_at_the_current_time() {
        let mut q = Fair::new(0.1);
        let (a, b) = (Who::plain("a"), Who::plain("b"));
        for _ in 0..50 {
            q.push(&a, 'a');
        }
        for _ in 0..40 {
            assert_eq!(q.pop(), Some('a'));
        }
        // b arrives late: it does not get 40 turns in a row to catch up.
        for _ in 0..10 {
            q.push(&b, 'b');
        }
        let next: String = (0..6).filter_map(|_| q.pop()).collect();
        assert_eq!(next, "bababa");
    }

    #[test]
    fn interactive_goes_first_and_batch_keeps_its_share() {
        let mut q = Fair::new(0.1);
        let (i, b) = (who("ide", 1, Priority::Interactive), who("ci", 1, Priority::Batch));
        for _ in 0..100 {
            q.push(&b, 'b');
        }
        for _ in 0..100 {
            q.push(&i, 'i');
        }
        let first: Vec<char> = (0..100).filter_map(|_| q.pop()).collect();
        assert_eq!(first.iter().filter(|c| **c == 'b').count(), 10, "1 in 10 to batch");
        assert_eq!(&first[..9], &['i'; 9], "interactive first");
        let rest: Vec<char> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(rest.len(), 100);
        assert_eq!(first.iter().chain(&rest).filter(|c| **c == 'b').count(), 100, "batch all served in the end");
    }

    #[test]
    fn removed_waiters_leave_no_trace() {
        let mut q = Fair::new(0.1);
        let a = Who::plain("a");
        let ids: Vec<u64> = (0..5).map(|n| q.push(&a, n)).collect();
        for id in &ids {
            assert!(q.remove(&a, *id).is_some());
        }
        assert!(q.is_empty());
        assert_eq!(q.pop(), None);
        q.push(&a, 9);
        assert_eq!(q.waiting_of("a"), 1);
        assert_eq!(q.pop(), Some(9));
    }
}
