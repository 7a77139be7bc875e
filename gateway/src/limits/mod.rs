//! Backpressure per upstream: a concurrency limit with a fair queue in
//! front of it, rate buckets, and a limit that learns what nobody declared.
//!
//! Requests wait here instead of failing upstream: beyond the effective
//! concurrency limit they queue (round robin between client keys, so one
//! client's flood cannot starve another's single request), and a full queue
//! is shed at once with a `Retry-After` from the queue's drain rate. A
//! [`Permit`] is held for the whole request, stream included, and gives its
//! slot back when dropped — on completion, error, client disconnect or
//! panic alike. When a "concurrency limit" answer comes back while tidegate
//! holds N slots (the refused request's included), the effective limit
//! drops to N − 1 — at least what the provider accepted (floor 1) — and
//! grows back by
//! 1/limit per success, up to the declared `max_concurrent` or
//! `adaptive_max` but, for [`ADAPTIVE_MEMORY`] after the refusal, never
//! back to the level that was refused: a hard cap is learned once, not
//! probed again every few requests.
//!
//! An upstream whose cap is unknown (none declared, learning on) starts
//! in slow start: a window of [`INITIAL_WINDOW`] (64) requests at once (one for
//! a pool's account, see [`LimitConfig::prove_first`]) that grows by one
//! with every answer that came while the window was full, but never more
//! than a quarter (at least one) above the most requests at once the
//! provider has been seen to accept (a request answered that took its
//! slot as the n-th in flight proves n). A waiting crowd is let through
//! at the pace the window grows, never all at once: an account of unknown
//! size meets at most a quarter of its cap in refusals (one, for the
//! small caps of coding plans), and the window grows by a quarter each
//! round trip. The first refusal ends slow start and sets the limit to
//! what was accepted, as above.
//!
//! With a `slot_release_delay`, a refusal that meets a slot a delayed
//! release has just handed over says the provider still counted that
//! session: the release came early, not that the cap is lower. Such a
//! refusal lengthens the delay by a margin (see [`Limiter::release_margin`])
//! instead of lowering the limit, a few times at most; after that,
//! refusals lower the limit as any other.

pub mod fair;
pub mod gcra;
pub mod paced;
pub mod slots;
pub mod windows;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use fair::Fair;
pub use fair::{Priority, Who};
use gcra::Gcra;
use paced::{Buckets, Paced, Scopes};
use slots::{Lease, MemorySlots};
use tokio_util::task::TaskTracker;

use crate::shared::{Bucket, SharedLease, SharedSlot, SharedState};

/// An upstream's limits, from its config.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitConfig {
    /// Declared concurrency cap.
    pub max_concurrent: Option<u32>,
    /// Learn the cap from "concurrency limit" answers.
    pub adaptive: bool,
    /// Ceiling of the learned cap when none is declared. By default none
    /// (`u32::MAX`): an upstream that never refused is never held at a
    /// number someone guessed; the first refusal teaches the limit.
    pub adaptive_max: u32,
    /// Requests allowed to wait; beyond, an immediate 429.
    pub max_queue: usize,
    /// A slot frees only this long after its request ended.
    pub slot_release_delay: Duration,
    /// Requests per minute.
    pub rpm: Option<u64>,
    /// Tokens per minute.
    pub tpm: Option<u64>,
    /// Share of slots batch requests get while interactive ones wait too.
    pub batch_share: f64,
    /// One request at a time until the first answer (a pool's account:
    /// an account without a plan or with a wrong key is met by one
    /// request, not by a crowd).
    pub prove_first: bool,
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            adaptive: true,
            adaptive_max: u32::MAX,
            max_queue: 4096,
            slot_release_delay: Duration::ZERO,
            rpm: None,
            tpm: None,
            batch_share: 0.1,
            prove_first: false,
        }
    }
}

/// Why no slot was given.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// The queue is full: come back after `retry_after`.
    QueueFull {
        /// Requests waiting.
        queued: usize,
        /// Estimated from the drain rate.
        retry_after: Duration,
    },
    /// The request's deadline came first; no slot was taken.
    Deadline {
        /// Time spent waiting.
        waited: Duration,
        /// Estimated time until a slot frees.
        retry_after: Duration,
    },
}

/// What the admin API and metrics show.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Slots taken.
    pub in_flight: u32,
    /// The limit in force now.
    pub effective_limit: u32,
    /// Requests waiting.
    pub queued: usize,
}

struct Waiter {
    tx: oneshot::Sender<Permit>,
}

struct Queue {
    fair: Fair<Waiter>,
    last_release: Option<Instant>,
    drain_per_sec: f64,
}

impl Queue {
    fn retry_after(&self) -> Duration {
        let rate = if self.drain_per_sec > 0.0 { self.drain_per_sec } else { 1.0 };
        Duration::from_secs_f64(((self.fair.len() + 1) as f64 / rate).clamp(1.0, 300.0))
    }
}

/// One upstream's limiter.
pub struct Limiter {
    me: std::sync::Weak<Limiter>,
    config: LimitConfig,
    slots: MemorySlots,
    /// Background updates of the shared store and delayed slot releases:
    /// owned here so shutdown can wait for them.
    tasks: TaskTracker,
    rpm: Option<Gcra>,
    tpm: Option<Gcra>,
    /// What the provider advertises on its answers (requests, tokens),
    /// per model sent: paced to beside the configured buckets, so the
    /// smaller wins.
    advertised: Scopes,
    /// A subscription account's windows, as its answers report them.
    windows: windows::Windows,
    effective: Mutex<f64>,
    /// The lowest level refused within [`ADAPTIVE_MEMORY`], and when.
    refused: Mutex<Option<(u32, Instant)>>,
    /// A temporary lower cap (0: none), e.g. a client key's penalty.
    ceiling: AtomicU32,
    /// Microseconds added to `slot_release_delay`, learned from refusals
    /// that met a slot a delayed release had just freed. Two clocks that
    /// count the same delay (the provider's and this one) disagree by a
    /// millisecond or so; which one ends first is a coin toss, and every
    /// toss lost is a refusal. Grows by [`margin_step`], up to
    /// [`margin_cap`]; never shrinks (a delay a little long costs little).
    margin_us: std::sync::atomic::AtomicU64,
    /// Slow start while the cap is unknown and no refusal has taught it.
    slow: SlowStart,
    /// An answer came back (see [`LimitConfig::prove_first`]).
    proven: std::sync::atomic::AtomicBool,
    queue: Mutex<Queue>,
    shared: Option<Shared>,
    /// A dispatch is set for when the leases other replicas held as the
    /// store went away may have ended (see [`Limiter::effective_limit`]).
    kick: std::sync::atomic::AtomicBool,
    /// Requests that chose this upstream and have not yet taken (or given
    /// up) its slot: counted in [`Limiter::load`], so that two picks at
    /// once (one per runtime thread) do not both see the same account as
    /// the least loaded one.
    arriving: AtomicU32,
}

/// A request on its way from the pick to this limiter's slot (see
/// [`Limiter::arrive`]); dropping it ends the count.
pub struct Arriving<'a>(&'a Limiter);

impl Drop for Arriving<'_> {
    fn drop(&mut self) {
        self.0.arriving.fetch_sub(1, Ordering::AcqRel);
    }
}

/// This limiter's part of the shared state: the store, the upstream's
/// name there, and the shared limit last seen.
struct Shared {
    state: Arc<SharedState>,
    upstream: String,
    limit: Mutex<Option<f64>>,
}

/// A held slot (and the tokens reserved for the request).
pub struct Permit {
    limiter: Arc<Limiter>,
    lease: Option<Lease>,
    shared: Option<SharedLease>,
    tokens: u64,
    /// Its slot was handed over by a delayed release (see
    /// [`Limiter::release_margin`]).
    after_delayed_release: bool,
    /// What the provider said of its attempt (see
    /// [`Permit::refused_for_concurrency`]).
    refusal: Refusal,
    /// Its reservations from the advertised buckets (requests, tokens),
    /// for its answer's figures (see [`Permit::observe`]).
    tickets: [Option<u64>; 2],
    /// The advertised buckets of its model (see [`paced::Scopes`]).
    scope: Option<Arc<Buckets>>,
    /// When it was given: its request goes upstream from then on.
    granted: Instant,
    /// Slots taken here when this one was, itself included: what its
    /// answer proves the provider accepts at once (see slow start).
    level: u32,
}

/// A permit's attempt and the provider's concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Not refused for concurrency.
    None,
    /// Refused: the limits are lowered (the shared one when it drops).
    LowersLimit,
    /// Refused right after a delayed release handed over its slot: put
    /// down to that release coming early; it lowers no limit.
    EarlyRelease,
}

impl Permit {
    /// Corrects the token reservation with the usage the upstream reported.
    /// Both numbers are bounded by the bucket first, and the difference
    /// is exact (`gcra::correction`), so a request refused by the provider
    /// (`used_tokens` 0) gives back exactly what it reserved, whatever
    /// number it asked for.
    pub fn settle(&mut self, used_tokens: u64) {
        if let Some(tpm) = &self.limiter.tpm {
            let used = tpm.bounded(used_tokens);
            let delta = gcra::correction(self.tokens, used, u64::MAX);
            tpm.adjust(delta, Instant::now());
            self.tokens = used;
            if let (Some(shared), Some(limit)) = (&self.limiter.shared, self.limiter.config.tpm)
                && delta != 0
                && shared.state.is_up()
            {
                let (state, upstream) = (shared.state.clone(), shared.upstream.clone());
                self.limiter.tasks.spawn(async move {
                    state.adjust(&upstream, Bucket::Tpm, delta, limit, MINUTE).await;
                });
            }
        }
    }
}

impl Permit {
    /// Applies what its answer advertised (success or refusal alike) to
    /// the upstream's advertised buckets: the next requests are paced to
    /// them. With shared state, to this replica's share. `model` is the
    /// name its request was sent with (the scope of OpenAI's and
    /// Anthropic's rate limits).
    pub fn observe(&self, advert: &crate::classify::advertised::Advert, model: &str) {
        if advert.is_empty() {
            return;
        }
        let limiter = &self.limiter;
        let share = match &limiter.shared {
            Some(shared) if shared.state.is_up() => 1.0 / f64::from(shared.state.replicas().max(1)),
            _ => 1.0,
        };
        let now = Instant::now();
        limiter.windows.observe(&advert.windows, now);
        let scope = self.scope.clone().unwrap_or_else(|| limiter.advertised.of(model));
        for ((quota, pacer), ticket) in [advert.requests, advert.tokens].iter().zip(scope.iter()).zip(self.tickets) {
            if let Some(quota) = quota {
                pacer.observe(*quota, (ticket, self.granted), share, now);
            }
        }
    }

    /// Slots taken when this one was, itself included: the concurrency
    /// its success proves.
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Its attempt was refused with "concurrency limit", as this permit
    /// still holds its slot. The local limit is lowered now, to the other
    /// slots held (every request the provider had accepted when it
    /// refused is still among them; the count when this one took its slot
    /// is no bound, as requests sent together arrive in any order). When
    /// it drops, the shared limit is lowered the same way, its lease given
    /// back, and its slot freed without `slot_release_delay` (the provider
    /// opened no session for it). A refusal put down to an early release
    /// lowers nothing (see [`Limiter::release_margin`]).
    pub fn refused_for_concurrency(&mut self) {
        let held = self.limiter.in_flight();
        let lowered = self.limiter.on_concurrency_error(held, self.after_delayed_release);
        self.refusal = if lowered { Refusal::LowersLimit } else { Refusal::EarlyRelease };
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.refusal == Refusal::LowersLimit
            && self.limiter.config.adaptive
            && let (Some(lease), Some(shared)) = (self.shared.take(), &self.limiter.shared)
        {
            let (state, cap) = (shared.state.clone(), self.limiter.cap() as u32);
            let me = self.limiter.me.clone();
            // The local slot too is kept until the shared limit is lowered:
            // freed first, it lets a waiter here (the refused request's own
            // retry among them) take a lease before the lowering, which
            // then counts that lease among those the provider accepted and
            // lowers nothing — a wave of refusals each replaced by a new
            // request teaches no limit.
            let local = self.lease.take();
            self.limiter.tasks.spawn(async move {
                // Lowered while the lease still counts (the level is the
                // others held) and given back in the same step: a waiter
                // it wakes sees the lowered limit.
                let lowered = state.lower(lease, cap, ADAPTIVE_MEMORY).await;
                if let Some(me) = me.upgrade() {
                    if let Some(limit) = lowered {
                        me.set_shared_limit(limit);
                    }
                    if let Some(local) = local {
                        me.give_back(local, false);
                    }
                }
            });
        }
        if let Some(lease) = self.lease.take() {
            // A refused request opened no session upstream: nothing to
            // wait for before its slot is free again.
            let delay = if self.refusal == Refusal::None { self.limiter.release_delay() } else { Duration::ZERO };
            self.limiter.clone().release(lease, self.shared.take(), delay);
        }
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// Slow start's state (see the module docs): atomics, as every answer
/// and every slot taken reads it.
#[derive(Debug)]
struct SlowStart {
    /// Requests let in at once; 0: over (a declared cap, learning off,
    /// or a cap learned).
    window: AtomicU32,
    /// The most requests at once the provider is known to have accepted.
    proven: AtomicU32,
}

impl SlowStart {
    /// The window, while slow start lasts.
    fn window(&self) -> Option<u32> {
        match self.window.load(Ordering::Acquire) {
            0 => None,
            w => Some(w),
        }
    }

    /// Widens the window to `to` if slow start lasts and it is narrower;
    /// whether it grew.
    fn widen(&self, to: u32) -> bool {
        self.window.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| (w != 0 && to > w).then_some(to)).is_ok()
    }

    /// Ends slow start; whether it was on.
    fn end(&self) -> bool {
        self.window.swap(0, Ordering::AcqRel) != 0
    }
}

/// Slow start's first window for an upstream of unknown size that is not
/// a pool's account: a burst this large goes at once, as it always did
/// (an agent's fan-out, a test suite's parallel requests); a larger one is
/// let in as the window grows. Large enough that a lone upstream's first
/// round trip is not a queue for most users, small enough that a fan-out
/// of hundreds does not arrive at an unknown cap at once. A pool's
/// accounts start at one (see [`LimitConfig::prove_first`]).
pub const INITIAL_WINDOW: f64 = 64.0;

/// How long a concurrency refusal is remembered: the limit does not grow
/// back to the level that was refused before this much time without a
/// refusal has passed (then it probes upward again, slowly).
pub const ADAPTIVE_MEMORY: Duration = Duration::from_secs(600);

/// How much one refusal after an early release adds to the release
/// margin: a thirtieth of the delay (10 ms of 300 ms), at least 1 ms.
fn margin_step(delay: Duration) -> Duration {
    (delay / 30).max(Duration::from_millis(1))
}

/// The most the release margin grows to: a tenth of the delay, so about
/// three refusals are put down to early releases before refusals lower the
/// limit again (a provider whose cap really dropped costs three refusals).
fn margin_cap(delay: Duration) -> Duration {
    (delay / 10).max(margin_step(delay))
}

/// A rate reservation not yet used by a slot: a request refused at its
/// deadline, shed by a full queue or abandoned by its client while it
/// waited gives its request and tokens back when this drops, so waiting
/// and refused requests do not push everyone else's turn further out.
struct RateHold<'a> {
    limiter: &'a Limiter,
    tokens: u64,
    /// Per bucket (rpm, tpm): reserved, and whether in the shared store.
    reserved: [Option<bool>; 2],
    /// Per bucket: how many times the local bucket counted the cost (the
    /// replicas, while the store is down).
    scale: [u64; 2],
    /// The client's token estimate, as the advertised bucket took it.
    asked: u64,
    /// Tickets of the advertised buckets (requests, tokens).
    tickets: [Option<u64>; 2],
    scope: Option<Arc<Buckets>>,
}

impl RateHold<'_> {
    /// The request holds a slot now: its reservation stays (the permit
    /// settles the tokens with the real usage); its advertised buckets'
    /// tickets go to the permit.
    fn keep(mut self) -> ([Option<u64>; 2], Option<Arc<Buckets>>) {
        self.reserved = [None; 2];
        (std::mem::take(&mut self.tickets), self.scope.take())
    }
}

impl Drop for RateHold<'_> {
    fn drop(&mut self) {
        let costs = [(Bucket::Rpm, 1), (Bucket::Tpm, self.tokens)];
        for ((reserved, scale), (what, cost)) in self.reserved.iter().zip(self.scale).zip(costs) {
            if let Some(shared_store) = *reserved {
                self.limiter.unreserve(what, cost.saturating_mul(scale), shared_store);
            }
        }
        for ((ticket, pacer), cost) in
            self.tickets.iter().zip(self.scope.iter().flat_map(|s| s.iter())).zip([1, self.asked])
        {
            if ticket.is_some() {
                pacer.unreserve(cost);
            }
        }
    }
}

/// Removes a waiter that gave up (deadline, client gone) from the queue.
struct QueueSpot<'a> {
    limiter: &'a Limiter,
    who: &'a Who,
    id: u64,
}

impl Drop for QueueSpot<'_> {
    fn drop(&mut self) {
        if let Ok(mut q) = self.limiter.queue.lock() {
            q.fair.remove(self.who, self.id);
        }
    }
}

impl Limiter {
    /// A limiter with in-process slots.
    pub fn new(config: LimitConfig) -> Arc<Self> {
        Self::build(config, None)
    }

    /// A limiter whose slots, rate buckets and adaptive limit are also
    /// shared with other replicas through `state` (as `upstream`).
    pub fn shared(config: LimitConfig, state: Arc<SharedState>, upstream: &str) -> Arc<Self> {
        Self::build(config, Some(Shared { state, upstream: upstream.to_owned(), limit: Mutex::new(None) }))
    }

    fn build(config: LimitConfig, shared: Option<Shared>) -> Arc<Self> {
        let minute = Duration::from_secs(60);
        let start = f64::from(config.max_concurrent.unwrap_or(config.adaptive_max).max(1));
        let unknown = config.max_concurrent.is_none() && config.adaptive;
        let first = if config.prove_first { 1.0 } else { INITIAL_WINDOW.min(start) };
        let window = if unknown { first.max(1.0) as u32 } else { 0 };
        Arc::new_cyclic(|me| Self {
            slow: SlowStart { window: AtomicU32::new(window), proven: AtomicU32::new(0) },
            me: me.clone(),
            rpm: config.rpm.map(|n| Gcra::new(n, minute)),
            tpm: config.tpm.map(|n| Gcra::new(n, minute)),
            advertised: Default::default(),
            windows: Default::default(),
            effective: Mutex::new(start),
            refused: Mutex::new(None),
            ceiling: AtomicU32::new(0),
            margin_us: std::sync::atomic::AtomicU64::new(0),
            proven: std::sync::atomic::AtomicBool::new(!config.prove_first),
            queue: Mutex::new(Queue { fair: Fair::new(config.batch_share), last_release: None, drain_per_sec: 0.0 }),
            slots: MemorySlots::default(),
            tasks: TaskTracker::new(),
            shared,
            kick: Default::default(),
            arriving: AtomicU32::new(0),
            config,
        })
    }

    fn cap(&self) -> f64 {
        f64::from(self.config.max_concurrent.unwrap_or(self.config.adaptive_max).max(1))
    }

    /// The concurrency limit in force: the shared one while shared state
    /// is reachable. While it is not — and until the permits taken
    /// meanwhile are back, since a store that restarted empty knows nothing
    /// of them — this replica's share of it: the limit divided by the
    /// replicas last seen sharing the store (at least 1), so that together
    /// they stay within the provider's cap instead of each applying all of
    /// it. From the first call the store leaves unanswered (before its
    /// breaker trips) also below what the other replicas last held.
    pub fn effective_limit(&self) -> u32 {
        let mut eff = self.effective.lock().map_or(self.cap(), |e| *e);
        let mut replicas = 1;
        let mut others = 0;
        if let Some(shared) = &self.shared {
            let up = shared.state.is_up();
            if up && let Some(limit) = shared.limit.lock().ok().and_then(|l| *l) {
                eff = limit;
            }
            // Not answered lately (paused, or gone): what the others took
            // meanwhile is unknown.
            let trusted = shared.state.trusted();
            if !trusted || !shared.state.settled() || shared.state.unadopted(&shared.upstream) > 0 {
                replicas = shared.state.replicas();
            }
            if !trusted {
                let left;
                (others, left) = shared.state.others_held(&shared.upstream);
                if others > 0 {
                    self.kick_after(left);
                }
            }
        }
        let whole = eff.floor() as u32;
        let mut limit = (whole / replicas).max(1);
        if others > 0 {
            // The store just went away with other replicas holding
            // `others` leases: not above what they leave of the cap (0
            // included), until they may have ended.
            limit = limit.min(whole.saturating_sub(others));
        }
        if !self.proven.load(Ordering::Acquire) {
            return limit.min(1);
        }
        if let Some(window) = self.slow.window() {
            limit = limit.min(window).max(1);
        }
        match self.ceiling.load(Ordering::Acquire) {
            0 => limit,
            ceiling => limit.min(ceiling),
        }
    }

    /// Hands free slots to waiters `after` from now (once at a time): a
    /// limit held down until then rises without a slot given back.
    fn kick_after(&self, after: Duration) {
        if self.kick.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        self.tasks.spawn(async move {
            tokio::time::sleep(after + Duration::from_millis(1)).await;
            if let Some(me) = me.upgrade() {
                me.kick.store(false, Ordering::Release);
                me.dispatch();
            }
        });
    }

    /// Caps the limit at `ceiling` until lifted with `None` (a client key
    /// under penalty); lifting hands freed capacity to waiters at once.
    pub fn set_ceiling(&self, ceiling: Option<u32>) {
        let before = self.ceiling.swap(ceiling.map_or(0, |c| c.max(1)), Ordering::AcqRel);
        if before != 0 && ceiling.is_none() {
            self.dispatch();
        }
    }

    /// How long a new request would wait for a slot here, from the rate
    /// slots free (`None` before two have): the queue ahead of it and
    /// itself, at the drain rate.
    pub fn expected_wait(&self) -> Option<Duration> {
        let q = self.queue.lock().ok()?;
        (q.drain_per_sec > 0.0).then(|| Duration::from_secs_f64((q.fair.len() + 1) as f64 / q.drain_per_sec))
    }

    /// Requests of client `name` waiting here.
    pub fn waiting_of(&self, name: &str) -> usize {
        self.queue.lock().map_or(0, |q| q.fair.waiting_of(name))
    }

    /// Units of the rpm and tpm buckets used in the last minute (this
    /// replica's view).
    pub fn rate_used(&self) -> (Option<u64>, Option<u64>) {
        let now = Instant::now();
        (self.rpm.as_ref().map(|b| b.used(now)), self.tpm.as_ref().map(|b| b.used(now)))
    }

    /// Whether this limiter's state is shared with other replicas right now.
    pub fn is_shared(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.state.is_up())
    }

    /// Replicas last seen sharing this limiter's store (`None` without
    /// `state:`): what the limit is divided by while the store is down.
    pub fn replicas(&self) -> Option<u32> {
        self.shared.as_ref().map(|s| s.state.replicas())
    }

    /// Reserves one request and `tokens` from the rate buckets (shared
    /// ones while the store answers) and says how long to wait for them.
    /// The reservation is returned by the [`RateHold`]'s drop unless the
    /// request goes on to hold a slot.
    async fn rate_wait(&self, model: &str, (tokens, asked): (u64, u64), now: Instant) -> (Duration, RateHold<'_>) {
        let mut wait = Duration::ZERO;
        let scope = self.advertised.told(model);
        let mut hold = RateHold {
            limiter: self,
            tokens,
            reserved: [None; 2],
            scale: [1; 2],
            asked,
            tickets: [None; 2],
            scope: None,
        };
        if let Some(scope) = scope {
            for (i, (pacer, cost)) in scope.iter().zip([1, asked]).enumerate() {
                if let Some((paced, ticket)) = pacer.reserve(cost, now) {
                    hold.tickets[i] = Some(ticket);
                    wait = wait.max(paced);
                }
            }
            hold.scope = Some(scope);
        }
        for (i, (what, bucket, limit, cost)) in
            [(Bucket::Rpm, &self.rpm, self.config.rpm, 1), (Bucket::Tpm, &self.tpm, self.config.tpm, tokens)]
                .into_iter()
                .enumerate()
        {
            let (Some(bucket), Some(limit)) = (bucket, limit) else { continue };
            let (shared, scale) = match &self.shared {
                Some(s) => match s.state.reserve(&s.upstream, what, (cost, limit, MINUTE), bucket.ahead(now)).await {
                    Some((wait, ahead)) => {
                        bucket.follow(ahead, Instant::now());
                        (Some(wait), 1)
                    }
                    // The store is down: this replica keeps to its share
                    // of the bucket (each request counts once per replica
                    // last seen), as it does of a concurrency limit; what
                    // it spends is paid to the store's bucket on rejoining.
                    None => (None, u64::from(s.state.replicas().max(1))),
                },
                None => (None, 1),
            };
            hold.reserved[i] = Some(shared.is_some());
            hold.scale[i] = scale;
            wait = wait.max(shared.unwrap_or_else(|| bucket.reserve(cost.saturating_mul(scale), now)));
            if let (None, Some(s)) = (shared, &self.shared) {
                let at = Instant::now();
                s.state.owe(&s.upstream, what, (cost, limit), at + bucket.ahead(at));
            }
        }
        (wait, hold)
    }

    /// Gives back a rate reservation that was never used (see [`RateHold`]).
    fn unreserve(&self, what: Bucket, cost: u64, shared_store: bool) {
        let (bucket, limit) = match what {
            Bucket::Rpm => (&self.rpm, self.config.rpm),
            Bucket::Tpm => (&self.tpm, self.config.tpm),
        };
        let (Some(bucket), Some(limit)) = (bucket, limit) else { return };
        let delta = gcra::correction(cost, 0, limit);
        if !shared_store {
            bucket.adjust(delta, Instant::now());
            return;
        }
        if let Some(shared) = &self.shared {
            let (state, upstream) = (shared.state.clone(), shared.upstream.clone());
            self.tasks.spawn(async move {
                state.adjust(&upstream, what, delta, limit, MINUTE).await;
            });
        }
    }

    /// The advertised buckets (requests, tokens) of each model sent, as
    /// tidegate reckons them now, once the provider has said anything.
    pub fn advertised(&self) -> Vec<(String, [Option<Paced>; 2])> {
        self.advertised.snapshot(Instant::now())
    }

    /// The account's subscription windows (see [`windows::Windows`]).
    pub fn windows(&self) -> &windows::Windows {
        &self.windows
    }

    /// Current state for the admin API and metrics.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            in_flight: self.slots.taken(),
            effective_limit: self.effective_limit(),
            queued: self.queue.lock().map_or(0, |q| q.fair.len()),
        }
    }

    /// Waits for the rate buckets and a slot, in turn with other clients,
    /// until `deadline`; with shared state, then for a shared lease too.
    /// Cancel-safe: dropping the future leaves the queues.
    ///
    /// `tokens` is a client's estimate (its `max_tokens` and body): it is
    /// bounded by the tpm bucket (see [`gcra::Gcra::bounded`]) before
    /// anything is reserved, here and in the shared store alike.
    pub async fn acquire(self: &Arc<Self>, who: &Who, tokens: u64, deadline: Instant) -> Result<Permit, Refused> {
        self.acquire_for("", who, tokens, deadline).await
    }

    /// [`Limiter::acquire`] for a request of `model` (the name sent
    /// upstream): paced to what the provider advertised for that model.
    pub async fn acquire_for(
        self: &Arc<Self>,
        model: &str,
        who: &Who,
        tokens: u64,
        deadline: Instant,
    ) -> Result<Permit, Refused> {
        let asked = tokens;
        let tokens = self.tpm.as_ref().map_or(0, |tpm| tpm.bounded(tokens));
        let started = Instant::now();
        // Only a counted limit has leases to share (rate buckets are
        // shared in `rate_wait`).
        let counted = self.config.max_concurrent.is_some() || self.config.adaptive;
        // Once more at most: a request that took its slot here as the
        // store went away waits again under the share.
        let mut again = false;
        loop {
            let mut permit = self.acquire_local((who, model), (tokens, asked), deadline, started).await?;
            let Some(shared) = self.shared.as_ref().filter(|_| counted) else { return Ok(permit) };
            // In slow start the store keeps one window for every replica
            // until one learns the cap: what any replica's answers prove, all
            // replicas' requests count (see `shared::SLOW_START`).
            let slow = self.slow.window().is_some();
            let first = if slow { self.first_window() as u32 } else { 0 };
            match shared.state.acquire(&shared.upstream, (self.cap() as u32, first, self.learned()), deadline).await {
                SharedSlot::Leased(lease, limit, level) => {
                    permit.shared = Some(lease);
                    permit.level = level;
                    if slow {
                        self.widen_window(f64::from(limit));
                    }
                    self.set_shared_whole(limit);
                    return Ok(permit);
                }
                SharedSlot::Outage(lease) => {
                    // Its slot here was taken under the limit shared
                    // across replicas, and the store has just gone away:
                    // over this replica's share now, it waits again (its
                    // tokens back first; a request unit stays spent).
                    if !again && self.slots.taken() > self.effective_limit() {
                        permit.settle(0);
                        again = true;
                        continue;
                    }
                    // This replica's own until the store has it again; until
                    // then this replica keeps to its share.
                    permit.shared = Some(lease);
                    return Ok(permit);
                }
                SharedSlot::Unavailable => return Ok(permit),
                SharedSlot::Deadline => {
                    // Nothing was sent: the tokens come back whole.
                    permit.settle(0);
                    drop(permit);
                    return Err(Refused::Deadline { waited: started.elapsed(), retry_after: Duration::from_secs(1) });
                }
            }
        }
    }

    async fn acquire_local(
        self: &Arc<Self>,
        (who, model): (&Who, &str),
        (tokens, asked): (u64, u64),
        deadline: Instant,
        started: Instant,
    ) -> Result<Permit, Refused> {
        let (wait, hold) = self.rate_wait(model, (tokens, asked), started).await;
        if !wait.is_zero() {
            if started + wait >= deadline {
                return Err(Refused::Deadline { waited: Duration::ZERO, retry_after: wait });
            }
            tokio::time::sleep(wait).await;
        }
        let rx = {
            let Ok(mut q) = self.queue.lock() else {
                return Err(Refused::QueueFull { queued: 0, retry_after: Duration::from_secs(1) });
            };
            if q.fair.is_empty()
                && let Some(lease) = self.slots.try_take(self.effective_limit())
            {
                let (tickets, scope) = hold.keep();
                return Ok(Permit {
                    limiter: self.clone(),
                    lease: Some(lease),
                    shared: None,
                    tokens,
                    after_delayed_release: false,
                    refusal: Refusal::None,
                    tickets,
                    scope,
                    granted: if wait.is_zero() { started } else { Instant::now() },
                    level: self.slots.taken(),
                });
            }
            if q.fair.len() >= self.config.max_queue {
                return Err(Refused::QueueFull { queued: q.fair.len(), retry_after: q.retry_after() });
            }
            let (tx, rx) = oneshot::channel();
            let id = q.fair.push(who, Waiter { tx });
            (rx, id)
        };
        let (rx, id) = rx;
        let spot = QueueSpot { limiter: self, who, id };
        // A slot may have freed between the failed take and the push.
        self.dispatch();
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(mut permit)) => {
                drop(spot);
                (permit.tickets, permit.scope) = hold.keep();
                permit.tokens = tokens;
                Ok(permit)
            }
            Ok(Err(_)) | Err(_) => {
                drop(spot);
                let retry_after = self.queue.lock().map_or(Duration::from_secs(1), |q| q.retry_after());
                Err(Refused::Deadline { waited: started.elapsed(), retry_after })
            }
        }
    }

    /// The upstream said "concurrency limit" and `held` slots are taken as
    /// the refusal comes back, the refused request's included: lower the
    /// effective limit to the others (what the provider accepted, plus any
    /// sent after the refused one, which a later refusal corrects; floor 1).
    /// `after_delayed_release`: the refused request's slot was handed over
    /// by a delayed release; if the margin may still grow, the refusal is
    /// put down to that release and lowers nothing. Returns whether the
    /// limit was lowered (or would have been, adaptive off).
    pub fn on_concurrency_error(&self, held: u32, after_delayed_release: bool) -> bool {
        self.prove();
        if after_delayed_release && self.widen_margin() {
            return false;
        }
        if !self.config.adaptive {
            return true;
        }
        // The shared limit is lowered when the refused attempt's permit
        // drops (see [`Permit::refused_for_concurrency`]). Slow start
        // ends: the limit is what was accepted from now on.
        self.slow.end();
        let now = Instant::now();
        if let Ok(mut refused) = self.refused.lock() {
            let level = match *refused {
                Some((level, at)) if now.saturating_duration_since(at) < ADAPTIVE_MEMORY => level.min(held.max(2)),
                _ => held.max(2),
            };
            *refused = Some((level, now));
        }
        if let Ok(mut eff) = self.effective.lock() {
            let lowered = f64::from(held.saturating_sub(1).max(1));
            if lowered < *eff {
                tracing::info!(from = *eff, to = lowered, held, "concurrency limit lowered");
                *eff = lowered;
            }
        }
        true
    }

    /// `slot_release_delay` plus the margin learned (see
    /// [`Limiter::release_margin`]).
    fn release_delay(&self) -> Duration {
        let delay = self.config.slot_release_delay;
        if delay.is_zero() { delay } else { delay + self.release_margin() }
    }

    /// What is added to `slot_release_delay` now: grown by a refusal that
    /// met a slot a delayed release had just handed over (the provider
    /// still counted that session), by [`margin_step`] each time, up to
    /// [`margin_cap`] — at most a few refusals are put down to it.
    pub fn release_margin(&self) -> Duration {
        Duration::from_micros(self.margin_us.load(Ordering::Acquire))
    }

    /// Widens the release margin by a step if it may still grow; says
    /// whether it did.
    fn widen_margin(&self) -> bool {
        let delay = self.config.slot_release_delay;
        let (step, cap) = (margin_step(delay).as_micros() as u64, margin_cap(delay).as_micros() as u64);
        let widened = self
            .margin_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| (m < cap).then(|| (m + step).min(cap)));
        if let Ok(before) = widened {
            let after = Duration::from_micros((before + step).min(cap));
            tracing::info!(?delay, margin = ?after, "a refusal met a slot just released: slot release delay lengthened");
        }
        widened.is_ok()
    }

    /// A request succeeded that took its slot as the `level`-th in flight
    /// ([`Permit::level`]): in slow start, the window grows by one if it
    /// was full (the answer's own slot still counted); after a refusal the
    /// limit grows back slowly (additive).
    pub fn on_success(&self, level: u32) {
        self.prove();
        if !self.config.adaptive {
            return;
        }
        let ceiling = self.growth_ceiling(Instant::now());
        self.grow_window(level, ceiling);
        let slow = self.slow.window().is_some();
        if let Some(shared) = self.shared.as_ref().filter(|s| s.state.is_up())
            && slow
        {
            let (state, upstream, me) = (shared.state.clone(), shared.upstream.clone(), self.me.clone());
            let (first, most) = (self.first_window() as u32, ceiling.min(f64::from(u32::MAX)) as u32);
            let waiting = self.queue.lock().map_or(0, |q| q.fair.len());
            self.tasks.spawn(async move {
                let window = state.slow_start(&upstream, first, level, most, waiting).await;
                if let (Some(window), Some(me)) = (window, me.upgrade()) {
                    me.widen_window(window);
                }
            });
        }
        if let Some(shared) = self.shared.as_ref().filter(|s| s.state.is_up() && !slow) {
            let below = shared.limit.lock().ok().and_then(|l| *l).is_some_and(|l| l < self.cap());
            if below {
                let (state, upstream, cap) = (shared.state.clone(), shared.upstream.clone(), self.cap() as u32);
                let me = self.me.clone();
                self.tasks.spawn(async move {
                    if let (Some(limit), Some(me)) = (state.grow(&upstream, cap).await, me.upgrade()) {
                        me.set_shared_limit(limit);
                    }
                });
            }
        }
        if let Ok(mut eff) = self.effective.lock()
            && *eff < ceiling
        {
            *eff = (*eff + 1.0 / *eff).min(ceiling);
        }
    }

    /// Slow start's step (see the module docs): an answer that came while
    /// the window was full, or requests waited, widens it by one and lets
    /// one more waiter in; one that came with room to spare says nothing
    /// of the cap, so a quiet upstream's window does not grow into a
    /// crowd released later at once.
    fn grow_window(&self, level: u32, ceiling: f64) {
        // Past slow start (a declared or learned cap): nothing to do.
        let Some(window) = self.slow.window() else { return };
        let proven = self.slow.proven.fetch_max(level, Ordering::AcqRel).max(level);
        let full = self.slots.taken() >= window || self.queue.lock().is_ok_and(|q| !q.fair.is_empty());
        if !full {
            return;
        }
        let ahead = (proven / 4).max(1);
        let to =
            window.saturating_add(1).min(proven.saturating_add(ahead)).min(ceiling.min(f64::from(u32::MAX)) as u32);
        if self.slow.widen(to) {
            self.dispatch();
        }
    }

    /// The limit learned (past slow start, below the cap), 0 if none: put
    /// back in a store that lost it (see `shared::ACQUIRE`).
    fn learned(&self) -> f64 {
        if !self.config.adaptive || self.slow.window().is_some() {
            return 0.0;
        }
        let learned = self.effective.lock().map_or(0.0, |e| *e);
        if learned < self.cap() { learned.max(0.0) } else { 0.0 }
    }

    /// Slow start's first window (see [`INITIAL_WINDOW`]).
    fn first_window(&self) -> f64 {
        if self.config.prove_first { 1.0 } else { INITIAL_WINDOW.min(self.cap()) }
    }

    /// The shared store's window reached this replica: at least that
    /// many from now on (`0`: another replica learned the cap, slow start
    /// is over here too).
    fn widen_window(&self, window: f64) {
        let grew =
            if window <= 0.0 { self.slow.end() } else { self.slow.widen(window.min(f64::from(u32::MAX)) as u32) };
        if grew {
            self.dispatch();
        }
    }

    /// The account answered: it takes more than one request from now on
    /// (the waiters get the slots of its window).
    fn prove(&self) {
        if !self.proven.swap(true, Ordering::AcqRel) {
            self.dispatch();
        }
    }

    /// How far the learned limit may grow now: the cap, or just below the
    /// level refused within [`ADAPTIVE_MEMORY`].
    fn growth_ceiling(&self, now: Instant) -> f64 {
        let refused = self.refused.lock().ok().and_then(|r| *r);
        match refused {
            Some((level, at)) if now.saturating_duration_since(at) < ADAPTIVE_MEMORY => {
                f64::from(level - 1).min(self.cap())
            }
            _ => self.cap(),
        }
    }

    /// The limit shared across replicas, as the store said; this
    /// replica's own learned limit follows it, so that while the store is
    /// away each replica's share is of what all had learned, not of what
    /// it learned alone.
    fn set_shared_limit(&self, limit: f64) {
        self.update_shared_limit(|_| limit);
    }

    /// [`Limiter::set_shared_limit`] for the whole number an acquire
    /// reports: the fraction additive increase has reached is kept if it
    /// agrees.
    fn set_shared_whole(&self, whole: u32) {
        self.update_shared_limit(|old| old.filter(|o| o.floor() as u32 == whole).unwrap_or(f64::from(whole)));
    }

    fn update_shared_limit(&self, limit: impl FnOnce(Option<f64>) -> f64) {
        if let Some(shared) = &self.shared
            && let Ok(mut l) = shared.limit.lock()
        {
            let limit = limit(*l);
            *l = Some(limit);
            if self.config.adaptive
                && let Ok(mut eff) = self.effective.lock()
            {
                *eff = limit.min(self.cap());
            }
        }
    }

    /// Background work this limiter started (shared-store updates,
    /// delayed slot releases), for shutdown to wait on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Slots taken right now (by this replica).
    pub fn in_flight(&self) -> u32 {
        self.slots.taken()
    }

    /// What a choice between accounts weighs: the slots taken and the
    /// requests already on their way to one (see [`Limiter::arrive`]).
    pub fn load(&self) -> u32 {
        self.slots.taken() + self.arriving.load(Ordering::Acquire)
    }

    /// Counts a request that chose this upstream until the guard drops
    /// (once it holds its slot, or gave up waiting for one).
    pub fn arrive(&self) -> Arriving<'_> {
        self.arriving.fetch_add(1, Ordering::AcqRel);
        Arriving(self)
    }

    fn release(self: Arc<Self>, lease: Lease, shared: Option<SharedLease>, delay: Duration) {
        if delay.is_zero() {
            drop(shared);
            self.give_back(lease, false);
            return;
        }
        // The upstream keeps the session open a while after the answer:
        // the slot frees later. The task only sleeps and gives back.
        let tasks = self.tasks.clone();
        tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            drop(shared);
            self.give_back(lease, true);
        });
    }

    fn give_back(&self, lease: Lease, delayed: bool) {
        self.slots.give_back(lease);
        if let Ok(mut q) = self.queue.lock() {
            let now = Instant::now();
            if let Some(last) = q.last_release.replace(now) {
                let dt = now.saturating_duration_since(last).as_secs_f64().max(1e-3);
                q.drain_per_sec = 0.8 * q.drain_per_sec + 0.2 / dt;
            }
        }
        self.hand_over(delayed);
    }

    /// Hands free slots to waiters, in the order of [`fair`].
    fn dispatch(&self) {
        self.hand_over(false);
    }

    /// [`Limiter::dispatch`], marking the permits when a delayed release
    /// freed their slots.
    fn hand_over(&self, after_delayed_release: bool) {
        let Ok(mut q) = self.queue.lock() else { return };
        while !q.fair.is_empty() {
            let Some(lease) = self.slots.try_take(self.effective_limit()) else { break };
            let Some(waiter) = q.fair.pop() else {
                self.slots.give_back(lease);
                break;
            };
            let Some(limiter) = self.me.upgrade() else {
                self.slots.give_back(lease);
                break;
            };
            let permit = Permit {
                limiter,
                lease: Some(lease),
                shared: None,
                tokens: 0,
                after_delayed_release,
                refusal: Refusal::None,
                tickets: [None; 2],
                scope: None,
                granted: Instant::now(),
                level: self.slots.taken(),
            };
            if let Err(mut unsent) = waiter.tx.send(permit) {
                // The waiter left: take the slot back without re-entering.
                if let Some(lease) = unsent.lease.take() {
                    self.slots.give_back(lease);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max: u32) -> Arc<Limiter> {
        Limiter::new(LimitConfig { max_concurrent: Some(max), adaptive: false, ..Default::default() })
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn a_request_on_its_way_to_a_slot_counts_as_load_until_it_holds_it() {
        let l = limiter(4);
        let arriving = l.arrive();
        assert_eq!((l.load(), l.in_flight()), (1, 0), "a pick on another thread would not see it");
        let p = l.acquire(&Who::plain("a"), 1, far()).await.unwrap();
        drop(arriving);
        assert_eq!((l.load(), l.in_flight()), (1, 1));
        drop(p);
        assert_eq!(l.load(), 0);
    }

    #[tokio::test]
    async fn slots_come_back_on_drop_and_on_panic() {
        let l = limiter(1);
        let p = l.acquire(&Who::plain("a"), 1, far()).await.unwrap();
        assert_eq!(l.in_flight(), 1);
        drop(p);
        assert_eq!(l.in_flight(), 0);
        let l2 = l.clone();
        let task = tokio::spawn(async move {
            let _permit = l2.acquire(&Who::plain("a"), 1, far()).await;
            panic!("request handler panicked while holding a slot");
        });
        assert!(task.await.is_err());
        assert_eq!(l.in_flight(), 0, "a panic leaked the slot");
        assert!(l.acquire(&Who::plain("a"), 1, far()).await.is_ok());
    }

    #[tokio::test]
    async fn waiters_are_served_round_robin_across_clients() {
        let l = limiter(1);
        let first = l.acquire(&Who::plain("a"), 1, far()).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, client) in ["a", "a", "a", "b", "a", "b"].iter().enumerate() {
            let (l, order) = (l.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = l.acquire(&Who::plain(client), 1, far()).await.unwrap();
                order.lock().unwrap().push(format!("{client}{i}"));
                drop(p);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(l.snapshot().queued, 6);
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["a0", "b3", "a1", "b5", "a2", "a4"]);
    }

    #[tokio::test(start_paused = true)]
    async fn slot_release_delay_holds_the_slot_after_the_request() {
        let l = Limiter::new(LimitConfig {
            max_concurrent: Some(1),
            slot_release_delay: Duration::from_secs(45),
            ..Default::default()
        });
        drop(l.acquire(&Who::plain("a"), 1, far()).await.unwrap());
        assert_eq!(l.in_flight(), 1, "freed too early");
        let started = Instant::now();
        let p = l.acquire(&Who::plain("a"), 1, started + Duration::from_secs(120)).await.unwrap();
        assert!(started.elapsed() >= Duration::from_secs(45));
        drop(p);
    }

    #[tokio::test(start_paused = true)]
    async fn one_clients_huge_token_estimate_cannot_lock_out_the_rest() {
        let l = Limiter::new(LimitConfig { tpm: Some(60_000), ..Default::default() });
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(120);
        let mut huge = l.acquire(&Who::plain("a"), u64::MAX, deadline).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert_eq!(l.rate_used().1, Some(60_000), "bounded by the bucket");
        // Another client waits for its own tokens to drain, not for 50 days.
        let other = l.acquire(&Who::plain("b"), 1_000, deadline).await.unwrap();
        assert!(t0.elapsed() <= Duration::from_secs(2), "{:?}", t0.elapsed());
        drop(other);
        // A request refused at its deadline gives its reservation back.
        let before = l.rate_used().1.unwrap();
        let short = Instant::now() + Duration::from_millis(10);
        assert!(l.acquire(&Who::plain("c"), 50_000, short).await.is_err());
        assert!(l.rate_used().1.unwrap() <= before, "a refused reservation stayed in the bucket");
        // The provider refused the huge one: all of it comes back.
        huge.settle(0);
        drop(huge);
        let used = l.rate_used().1.unwrap();
        assert!(used <= 1_000, "{used} tokens still held after the refund");
    }

    #[tokio::test]
    async fn adaptive_limit_decreases_then_grows_back() {
        let l = Limiter::new(LimitConfig::default());
        assert_eq!(l.effective_limit(), INITIAL_WINDOW as u32, "no refusal yet: slow start's first window");
        // Refused with 8 held (this one included): 7 were accepted.
        l.on_concurrency_error(8, false);
        assert_eq!(l.effective_limit(), 7);
        l.on_concurrency_error(2, false);
        assert_eq!(l.effective_limit(), 1);
        for _ in 0..3 {
            l.on_success(1);
        }
        // Additive increase, slowly, and never back to the refused level 2.
        assert_eq!(l.effective_limit(), 1, "grew back to a level the provider refused");
        let fixed = limiter(3);
        fixed.on_concurrency_error(2, false);
        assert_eq!(fixed.effective_limit(), 3, "adaptive off keeps the declared limit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_right_after_a_delayed_release_lengthens_the_delay_not_the_limit() {
        let delay = Duration::from_millis(300);
        let l = Limiter::new(LimitConfig { slot_release_delay: delay, ..Default::default() });
        l.on_concurrency_error(4, false);
        assert_eq!(l.effective_limit(), 3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(l.acquire(&Who::plain("a"), 1, far()).await.unwrap());
        }
        let (l2, waiter) = (l.clone(), Who::plain("b"));
        let next = tokio::spawn(async move { l2.acquire(&waiter, 1, far()).await });
        tokio::task::yield_now().await;
        drop(held.pop());
        // The provider's clock ran a little longer than this one: the
        // request that got the freed slot is refused.
        let mut refused = next.await.unwrap().unwrap();
        assert!(refused.after_delayed_release);
        refused.refused_for_concurrency();
        assert_eq!(l.effective_limit(), 3, "an early release lowered the learned limit");
        assert_eq!(l.release_margin(), Duration::from_millis(10));
        drop(refused);
        assert_eq!(l.in_flight(), 2, "a refused request's slot frees at once");
        // Releases wait the delay and the margin now.
        drop(held.pop());
        tokio::time::sleep(delay + Duration::from_millis(5)).await;
        assert_eq!(l.in_flight(), 2, "freed before the margin");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(l.in_flight(), 1);
        // A few refusals are put down to early releases, not more: a cap
        // that really dropped is learned after them.
        assert!(!l.on_concurrency_error(3, true));
        assert!(!l.on_concurrency_error(3, true));
        assert_eq!(l.release_margin(), Duration::from_millis(30));
        assert!(l.on_concurrency_error(3, true));
        assert_eq!(l.effective_limit(), 2);
        // A refusal not after a delayed release lowers the limit at once.
        let plain = Limiter::new(LimitConfig { slot_release_delay: delay, ..Default::default() });
        assert!(plain.on_concurrency_error(4, false));
        assert_eq!((plain.effective_limit(), plain.release_margin()), (3, Duration::ZERO));
    }

    #[tokio::test]
    async fn slow_start_lets_a_crowd_in_a_little_above_what_was_proven() {
        let l = Limiter::new(LimitConfig { prove_first: true, ..Default::default() });
        let first = l.acquire(&Who::plain("a"), 1, far()).await.unwrap();
        let crowd: Vec<_> = (0..40)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.acquire(&Who::plain("b"), 1, far()).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(l.in_flight(), 1, "unproven: one at a time");
        // The first answer proves 1: the window grows to 2, not to the crowd.
        l.on_success(first.level());
        assert_eq!(l.effective_limit(), 2);
        // Answers of requests that took their slot as the 1st or 2nd prove
        // at most 2: the window runs ahead of that by one, never more.
        for _ in 0..5 {
            l.on_success(2);
        }
        assert_eq!(l.effective_limit(), 3, "ran ahead of what was proven by more than one");
        // A proven 8 lets the window reach 10 (a quarter ahead), one answer at a time.
        for _ in 0..20 {
            l.on_success(8);
        }
        assert_eq!(l.effective_limit(), 10);
        // The first refusal ends slow start: the limit is what was accepted.
        l.on_concurrency_error(10, false);
        assert_eq!(l.effective_limit(), 9);
        drop(first);
        for task in crowd {
            task.abort();
        }
        // A quiet upstream's window does not grow: answers with room to spare prove nothing new.
        let quiet = Limiter::new(LimitConfig::default());
        for _ in 0..100 {
            quiet.on_success(1);
        }
        assert_eq!(quiet.effective_limit(), INITIAL_WINDOW as u32);
    }

    #[tokio::test(start_paused = true)]
    async fn a_learned_cap_is_kept_then_probed_again_after_the_memory() {
        let l = Limiter::new(LimitConfig::default());
        // Refused with 4 held: the cap is 3.
        l.on_concurrency_error(4, false);
        assert_eq!(l.effective_limit(), 3);
        for _ in 0..100 {
            l.on_success(1);
        }
        assert_eq!(l.effective_limit(), 3, "grew to the refused level within the memory");
        tokio::time::advance(ADAPTIVE_MEMORY).await;
        for _ in 0..4 {
            l.on_success(1);
        }
        assert_eq!(l.effective_limit(), 4, "after the memory the limit probes upward again");
    }

    #[tokio::test]
    async fn ten_thousand_waiters_cost_little_and_leave_cleanly() {
        let l = Limiter::new(LimitConfig { max_concurrent: Some(1), max_queue: 20_000, ..Default::default() });
        let holder = l.acquire(&Who::plain("a"), 1, far()).await.unwrap();
        let tasks: Vec<_> = (0..10_000)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    l.acquire(&Who::plain(if i % 2 == 0 { "a" } else { "b" }), 1, far()).await.is_ok()
                })
            })
            .collect();
        for _ in 0..2000 {
            if l.snapshot().queued == 10_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(l.snapshot().queued, 10_000);
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        assert_eq!(l.snapshot().queued, 0, "cancelled waiters must leave the queue");
        drop(holder);
        assert_eq!(l.in_flight(), 0);
    }
}
