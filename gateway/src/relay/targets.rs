//! Which target an attempt goes to.
//!
//! An alias lists equivalent targets. `failover` tries them in order,
//! `balance` the least loaded first (in-flight relative to weight × limit).
//! Either way a target that is ready beats one cooling down after a
//! capacity error, and a target whose breaker is open is skipped until its
//! probe is due. Targets that refused this request for auth, entitlement or
//! a missing model are left out for the rest of it, and a request that
//! continues stored state (`previous_response_id`) sees only the targets on
//! the upstream that stores it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::Job;
use crate::classify::Class;
use crate::config::{ModelRoute, PoolPick, Strategy};
use crate::gateway::Gateway;
use crate::health::Availability;
use crate::ids::{TargetId, UpstreamId};
use crate::limits::Priority;
use crate::protocol::{self, Endpoint};
use crate::translate::{self, Back, Translated, Way};

/// What one attempt sends: the body, the endpoint it goes to, and, when
/// it is translated, what the answer's way back needs.
#[derive(Clone)]
pub struct Sent {
    /// The body.
    pub body: Bytes,
    /// The target's endpoint (the client's unless translated).
    pub endpoint: Endpoint,
    /// `Some` when translated.
    pub back: Option<Arc<Back>>,
}

/// What was tried on one target, for the final message.
#[derive(Debug, Clone)]
pub struct Tried {
    /// The upstream.
    pub upstream: UpstreamId,
    /// Attempts made on it.
    pub attempts: u32,
    /// Class of its last failure.
    pub class: Class,
    /// Its last answer, in one line.
    pub last: String,
}

/// Where the next attempt goes.
pub enum Pick {
    /// This target.
    Use(TargetId),
    /// Every target left has an open breaker: the first probe (on this
    /// target) is due then.
    WaitUntil(Instant, TargetId),
    /// The best target left (this one) asked (`Retry-After`) for nothing
    /// before then.
    HoldUntil(Instant, TargetId),
    /// No target left.
    NoneLeft,
}

/// Per-request view of an alias's targets.
pub struct Targets<'a> {
    gw: &'a Gateway,
    route: &'a ModelRoute,
    /// Bit i: target i is left out (config allows at most 64 targets).
    excluded: u64,
    /// Bit i: target i was used.
    used: u64,
    /// What each failed target said, in order of first failure.
    pub tried: Vec<Tried>,
    endpoint: Endpoint,
    /// Bodies translated so far, by target (none for the same protocol).
    translated: Vec<(usize, Translated)>,
    /// The target holding this conversation's prompt cache (affinity),
    /// until it fails for this request.
    bound: Option<usize>,
    /// What moving the conversation elsewhere costs (see `affinity`).
    moving_cost: std::time::Duration,
    /// The pick chose to wait for the bound target's next free slot.
    stay: bool,
    /// The target picked last, counted in its upstream's load until its
    /// slot is taken ([`Targets::arrived`]); only with more than one target.
    arriving: Option<(usize, crate::limits::Arriving<'a>)>,
    /// The request is interactive: a pool's reserve serves it (see
    /// [`Targets::reserved`]).
    interactive: bool,
}

impl<'a> Targets<'a> {
    /// The route's targets that serve `endpoint`, none tried yet; with
    /// `pin`, only those on that upstream (it stores the state the request
    /// continues).
    pub fn new(
        gw: &'a Gateway,
        route: &'a ModelRoute,
        endpoint: Endpoint,
        (pin, priority): (Option<UpstreamId>, Priority),
        session: Option<&crate::affinity::Session>,
    ) -> Self {
        let mut excluded = 0u64;
        for (i, t) in route.targets.iter().enumerate() {
            let serves = gw.upstreams.get(t.upstream).is_some_and(|u| u.way(endpoint, t.translate).is_some());
            if !serves || pin.is_some_and(|pin| t.upstream != pin) {
                excluded |= 1 << i;
            }
        }
        let bound = session
            .and_then(|s| s.bound)
            .and_then(|b| route.targets.iter().position(|t| t.upstream == b))
            .filter(|b| excluded & (1 << b) == 0);
        Self {
            gw,
            route,
            excluded,
            used: 0,
            tried: Vec::new(),
            endpoint,
            translated: Vec::new(),
            bound,
            moving_cost: session.map_or(std::time::Duration::ZERO, |s| s.moving_cost),
            stay: false,
            arriving: None,
            interactive: priority == Priority::Interactive,
        }
    }

    /// How target `i` is reached.
    fn way(&self, i: usize) -> Way {
        let t = &self.route.targets[i];
        self.gw.upstreams.get(t.upstream).and_then(|u| u.way(self.endpoint, t.translate)).unwrap_or(Way::Native)
    }

    /// What an attempt on target `i` sends: the client's bytes (with its
    /// model), or the request translated for it (once per request and
    /// target); `Err` names what the target's protocol cannot say.
    pub fn sent(&mut self, i: TargetId, job: &Job) -> Result<Sent, crate::protocol::turn::Refusal> {
        let at = i.index();
        let Way::Translate(target) = self.way(at) else {
            return Ok(Sent { body: self.body(i, job), endpoint: self.endpoint, back: None });
        };
        let endpoint = target.endpoint();
        if let Some((_, t)) = self.translated.iter().find(|(k, _)| *k == at) {
            return Ok(Sent { body: t.body.clone(), endpoint, back: Some(t.back.clone()) });
        }
        let t = translate::request_keeping(
            self.endpoint.protocol(),
            target,
            &job.body,
            self.model(i, job),
            job.head.stream,
            Some((&self.gw.kept, &job.owner)),
        )?;
        let sent = Sent { body: t.body.clone(), endpoint, back: Some(t.back.clone()) };
        self.translated.push((at, t));
        Ok(sent)
    }

    /// Target `i` is a pool's account past its `reserve:` share of its
    /// longest window, and this request is not interactive: it waits for
    /// the others instead.
    fn reserved(&self, i: usize, now: Instant) -> bool {
        if self.interactive {
            return false;
        }
        let Some(u) = self.gw.upstreams.get(self.route.targets[i].upstream) else { return false };
        let Some(reserve) = u.config.pool.as_ref().and_then(|p| p.reserve) else { return false };
        u.limiter.windows().longest_used(now).is_some_and(|used| used >= reserve)
    }

    fn is_excluded(&self, i: usize) -> bool {
        self.excluded & (1 << i) != 0
    }

    /// Slots an account (any target's upstream) could take now.
    fn room(&self, i: usize) -> i64 {
        self.gw
            .upstreams
            .get(self.route.targets[i].upstream)
            .map_or(i64::MIN, |u| i64::from(u.limiter.effective_limit()) - i64::from(u.limiter.load()))
    }

    /// Where target `i`'s group starts (its own index outside a pool).
    fn group_start(&self, i: usize) -> usize {
        match self.route.targets[i].group {
            Some(g) => self.route.targets.iter().position(|t| t.group == Some(g)).unwrap_or(i),
            None => i,
        }
    }

    fn order(&self) -> Vec<usize> {
        let now = Instant::now();
        let mut order: Vec<usize> =
            (0..self.route.targets.len()).filter(|i| !self.is_excluded(*i) && !self.reserved(*i, now)).collect();
        if self.route.strategy == Strategy::Failover && self.route.targets.iter().any(|t| t.group.is_some()) {
            // In order, and within a pool the account with the most room
            // (`pick: reset-first`: of those with room, the one whose
            // window resets soonest).
            order.sort_by_key(|&i| {
                let room = self.room(i);
                let first = self
                    .gw
                    .upstreams
                    .get(self.route.targets[i].upstream)
                    .filter(|u| u.config.pool.as_ref().is_some_and(|p| p.pick == PoolPick::ResetFirst))
                    .map(|u| (room <= 0, u.limiter.windows().next_reset(now).unwrap_or(Duration::MAX)));
                (self.group_start(i), first, std::cmp::Reverse(room))
            });
        }
        if self.route.strategy == Strategy::Balance {
            let load = |i: usize| {
                let t = &self.route.targets[i];
                self.gw.upstreams.get(t.upstream).map_or(f64::MAX, |u| {
                    let capacity = f64::from(t.weight) * f64::from(u.limiter.effective_limit());
                    f64::from(u.limiter.load()) / capacity
                })
            };
            order.sort_by(|a, b| load(*a).total_cmp(&load(*b)));
        }
        order
    }

    fn availability(&self, i: usize, now: Instant, claim: bool) -> Availability {
        let Some(u) = self.gw.upstreams.get(self.route.targets[i].upstream) else { return Availability::Open(now) };
        if claim { u.health.check(now) } else { u.health.peek(now) }
    }

    /// Chooses the target for the next attempt (claiming a half-open probe
    /// if that is what it picks): the conversation's bound target first
    /// while it serves (see [`crate::affinity`]).
    pub fn pick(&mut self, now: Instant) -> Pick {
        self.arriving = None;
        // A choice of one needs no count.
        if self.route.targets.len() == 1 {
            return self.choose(now);
        }
        // Counted as load until its slot is taken, chosen and counted under
        // one lock: a pick on another thread meanwhile sees it.
        let _picking = self.gw.picking.lock();
        let pick = self.choose(now);
        if let Pick::Use(ti) = pick
            && let Some(u) = self.gw.upstreams.get(self.route.targets[ti.index()].upstream)
        {
            self.arriving = Some((ti.index(), u.limiter.arrive()));
        }
        pick
    }

    /// The picked target has its slot (or will not get one): it no longer
    /// counts as arriving.
    pub fn arrived(&mut self) {
        self.arriving = None;
    }

    /// [`Targets::pick`] without the count.
    fn choose(&mut self, now: Instant) -> Pick {
        self.stay = false;
        // A pool's benched account whose probe is due gets it first: one
        // request finds out whether it serves again (and moves on at once
        // if not), so capacity comes back without waiting for others to
        // fill — before any binding, or a busy pool would never probe.
        for i in 0..self.route.targets.len() {
            if self.route.targets[i].group.is_some()
                && !self.is_excluded(i)
                && self.availability(i, now, false) == Availability::Probe
                && self.availability(i, now, true) == Availability::Probe
            {
                return Pick::Use(TargetId::at(i));
            }
        }
        if let Some(b) = self.bound
            && !self.is_excluded(b)
            && let Some(stay) = self.stay_on(b, now)
        {
            self.stay = stay;
            return Pick::Use(TargetId::at(b));
        }
        self.pick_any(now)
    }

    /// Whether the conversation goes to its bound target `b` now: `Some`
    /// (waiting for its next slot when `true`) or `None` to move on — when
    /// it is benched, broken or held, or busy for longer than moving costs
    /// (its expected wait from its queue's drain rate; unknown: move).
    fn stay_on(&self, b: usize, now: Instant) -> Option<bool> {
        match self.availability(b, now, false) {
            Availability::Ready | Availability::Cooling(_) if self.room(b) > 0 => Some(false),
            Availability::Ready | Availability::Cooling(_) => {
                let u = self.gw.upstreams.get(self.route.targets[b].upstream)?;
                let wait = u.limiter.expected_wait()?;
                (wait <= self.moving_cost).then_some(true)
            }
            Availability::Probe => (self.availability(b, now, true) == Availability::Probe).then_some(false),
            Availability::Held(_) | Availability::Open(_) => None,
        }
    }

    /// Whether the request waits for target `i`'s own next slot (the
    /// bound account, see [`Targets::pick`]) rather than any account's.
    pub fn staying(&self, i: TargetId) -> bool {
        self.stay && self.bound == Some(i.index())
    }

    /// [`Targets::pick`] without a binding.
    fn pick_any(&self, now: Instant) -> Pick {
        // The common case, one target: no ordering to compute.
        if self.route.targets.len() == 1 {
            return match (self.is_excluded(0), self.availability(0, now, true)) {
                (true, _) => Pick::NoneLeft,
                (false, Availability::Open(until)) => Pick::WaitUntil(until, TargetId::at(0)),
                (false, Availability::Held(until)) => Pick::HoldUntil(until, TargetId::at(0)),
                (false, Availability::Ready | Availability::Probe | Availability::Cooling(_)) => {
                    Pick::Use(TargetId::at(0))
                }
            };
        }
        let order = self.order();
        if order.is_empty() {
            return self.in_reserve(now);
        }
        let mut cooling: Option<(Instant, usize)> = None;
        let mut held: Option<(Instant, usize)> = None;
        let mut open: Option<(Instant, usize)> = None;
        // The earliest of two (time, target) pairs, the first on a tie.
        let sooner = |kept: Option<(Instant, usize)>, until: Instant, i: usize| {
            kept.filter(|(k, _)| *k <= until).or(Some((until, i)))
        };
        for &i in &order {
            match self.availability(i, now, false) {
                Availability::Ready | Availability::Probe => {
                    // Claim for real (a probe is given to one request only).
                    match self.availability(i, now, true) {
                        Availability::Ready | Availability::Probe => return Pick::Use(TargetId::at(i)),
                        Availability::Cooling(until) => cooling = sooner(cooling, until, i),
                        Availability::Open(until) => open = sooner(open, until, i),
                        Availability::Held(until) => held = sooner(held, until, i),
                    }
                }
                Availability::Held(until) => held = sooner(held, until, i),
                Availability::Cooling(until) => cooling = sooner(cooling, until, i),
                Availability::Open(until) => open = sooner(open, until, i),
            }
        }
        // Busy everywhere: the one that frees first (the retry wait
        // already paced this attempt).
        if let Some((_, i)) = cooling {
            return Pick::Use(TargetId::at(i));
        }
        if let Some((until, i)) = held {
            return Pick::HoldUntil(until, TargetId::at(i));
        }
        open.map_or(Pick::NoneLeft, |(until, i)| Pick::WaitUntil(until, TargetId::at(i)))
    }

    /// No target left but accounts kept in reserve for interactive
    /// requests: this one is held until the soonest of their windows
    /// resets (given up at once, with that wait, when its deadline comes
    /// first).
    fn in_reserve(&self, now: Instant) -> Pick {
        let reset = |i: usize| {
            let u = self.gw.upstreams.get(self.route.targets[i].upstream)?;
            let [short, long] = u.limiter.windows().view(now);
            long.or(short)?.resets_in
        };
        (0..self.route.targets.len())
            .filter(|&i| !self.is_excluded(i) && self.reserved(i, now))
            .filter_map(|i| Some((reset(i)?, i)))
            .min()
            .map_or(Pick::NoneLeft, |(left, i)| Pick::HoldUntil(now + left, TargetId::at(i)))
    }

    /// Another target than `current` could take an attempt right now.
    pub fn other_ready(&self, current: TargetId, now: Instant) -> bool {
        let current = current.index();
        self.order().into_iter().any(|i| {
            i != current && matches!(self.availability(i, now, false), Availability::Ready | Availability::Probe)
        })
    }

    /// The other accounts of `current`'s pool a request may wait for
    /// (not left out, not benched, broken or held), `current` first; just
    /// `current` outside a pool.
    pub fn pool_of(&self, current: TargetId, now: Instant) -> Vec<TargetId> {
        let at = current.index();
        let Some(group) = self.route.targets[at].group else { return vec![current] };
        let mut members = vec![current];
        for i in 0..self.route.targets.len() {
            if i != at
                && self.route.targets[i].group == Some(group)
                && !self.is_excluded(i)
                && !self.reserved(i, now)
                && matches!(self.availability(i, now, false), Availability::Ready | Availability::Cooling(_))
            {
                members.push(TargetId::at(i));
            }
        }
        members
    }

    /// Whether target `i` takes requests now (neither benched, broken
    /// nor held).
    pub fn serving(&self, i: TargetId, now: Instant) -> bool {
        matches!(
            self.availability(i.index(), now, false),
            Availability::Ready | Availability::Cooling(_) | Availability::Probe
        )
    }

    /// Whether target `i` was benched after `t` (see
    /// [`crate::health::Health::benched_after`]).
    pub fn benched_after(&self, i: TargetId, t: Instant) -> bool {
        self.gw.upstreams.get(self.route.targets[i.index()].upstream).is_some_and(|u| u.health.benched_after(t))
    }

    /// Whether target `i`'s account has a slot free now.
    pub fn has_room(&self, i: TargetId) -> bool {
        // This request's own arrival is not in the way of its slot.
        let own = self.arriving.as_ref().is_some_and(|(a, _)| *a == i.index());
        self.room(i.index()) + i64::from(own) > 0
    }

    /// What the benched targets left for this request say: each one's
    /// name, the class and answer that benched it, and its projected
    /// reset — for the answer when nothing else is left.
    pub fn benched(&self) -> Vec<(UpstreamId, crate::health::Benched)> {
        let mut seen = Vec::new();
        for t in &self.route.targets {
            if let Some(u) = self.gw.upstreams.get(t.upstream)
                && let Some(b) = u.health.benched()
                && !seen.iter().any(|(id, _)| *id == t.upstream)
            {
                seen.push((t.upstream, b));
            }
        }
        seen
    }

    /// Another target than `current` is still allowed for this request.
    pub fn other_left(&self, current: TargetId) -> bool {
        let current = current.index();
        (0..self.route.targets.len()).any(|i| i != current && !self.is_excluded(i))
    }

    /// The upstream of target `i`.
    pub fn upstream(&self, i: TargetId) -> UpstreamId {
        let i = i.index();
        self.route.targets[i].upstream
    }

    /// Leaves a target out for the rest of this request.
    pub fn exclude(&mut self, i: TargetId) {
        let i = i.index();
        self.excluded |= 1 << i;
    }

    /// The body for target `i`: the client's bytes with its model (the
    /// same bytes on every attempt; no copy when the name is unchanged).
    pub fn body(&self, i: TargetId, job: &Job) -> Bytes {
        let i = i.index();
        protocol::body_for_target(
            &job.body,
            &job.head,
            self.route.targets[i].model.as_deref().unwrap_or(&job.head.model),
        )
    }

    /// The model name target `i` is sent.
    pub fn model<'j>(&'j self, i: TargetId, job: &'j Job) -> &'j str {
        let i = i.index();
        self.route.targets[i].model.as_deref().unwrap_or(&job.head.model)
    }

    /// Marks the first use of a target (the retry budget counts requests).
    pub fn first_use(&mut self, i: TargetId) -> bool {
        let i = i.index();
        let first = self.used & (1 << i) == 0;
        self.used |= 1 << i;
        first
    }

    /// Failed attempts made on target `i`'s upstream so far.
    pub fn attempts_on(&self, i: TargetId) -> u32 {
        let i = i.index();
        let upstream = self.route.targets[i].upstream;
        self.tried.iter().find(|t| t.upstream == upstream).map_or(0, |t| t.attempts)
    }

    /// Records a failed attempt on target `i`.
    pub fn failed(&mut self, i: TargetId, class: Class, last: &str) {
        let i = i.index();
        if self.bound == Some(i) {
            // Failed here: the conversation moves for the rest of this
            // request (and is bound where it is answered).
            self.bound = None;
        }
        let upstream = self.route.targets[i].upstream;
        match self.tried.iter_mut().find(|t| t.upstream == upstream) {
            Some(t) => {
                t.attempts += 1;
                t.class = class;
                t.last = last.to_owned();
            }
            None => self.tried.push(Tried { upstream, attempts: 1, class, last: last.to_owned() }),
        }
    }
}
