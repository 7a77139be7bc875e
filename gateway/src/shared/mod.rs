//! Limits shared by replicas, in Redis (`state: redis://…`).
//!
//! Several tidegates in front of one provider must hold one set of limits:
//! three replicas each allowing 3 sessions to an upstream that allows 3
//! send it 9, and 6 come back refused. With shared state, per upstream:
//!
//! - **Concurrency slots are leases** in a sorted set scored by expiry,
//!   taken and given back by Lua scripts (atomic), renewed every third of
//!   `state_lease_ttl` while the request runs: a replica that crashes or
//!   hangs stops renewing and its slots free within the TTL.
//! - **Waiting is event-driven**: a release publishes on the upstream's
//!   channel and wakes the waiters of every replica; a 250 ms poll is the
//!   fallback. Waiters register in a second sorted set by arrival time and
//!   a free slot goes to the oldest, so replicas take turns (FIFO-ish) and
//!   nobody starves.
//! - **rpm/tpm** are the same GCRA as `limits::gcra`, one timestamp per
//!   bucket in Redis.
//! - **Adaptive limits** live in one key per upstream: "concurrency limit"
//!   lowers it to the leases held when the refusal comes back, minus the
//!   refused one's own; successes grow it back by 1/limit, below that
//!   level for the learned limit's memory.
//! - **Cooldowns and open breakers** are published to the other replicas
//!   (and kept in keys that expire with them, read when a replica joins),
//!   so one replica's `429 Retry-After: 5` makes the others hold off too.
//!
//! The store is watched like an upstream, by a breaker: a request waits
//! at most [`BUDGET`] (50 ms) for one call; an error, or [`SLOW_TRIP`]
//! calls over the budget within a second (at least [`SLOW_SPACING`]
//! apart: one burst queued on the connection is one slow moment), trips
//! it. Tripped, tidegate logs
//! it loudly once, journals it, sets `tidegate_upstream_state{what=
//! "shared_state_up"}` to 0 and goes on with each replica's share of every
//! limit; a probe every 250 ms closes it again after [`CLOSE_AFTER`] fast
//! answers in a row (hysteresis: a store that answers one call in two
//! does not flap), journaled too. On the way back every lease this
//! replica holds, those taken meanwhile included, is put in the store
//! before it counts as up ("adopted"), so a store that returns empty or
//! not sees every request in flight and no cap is exceeded on rejoin. The
//! queue in front of the slots (order between client keys) stays in each
//! process.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::{PushInfo, PushKind, Script, Value};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::health::HoldKind;

mod conn;
use conn::Conn;
pub use conn::check_url;

/// Every key starts with this, then `{upstream}`.
const PREFIX: &str = "tidegate";
/// Fallback wake-up of a shared waiter when no release message arrives.
const POLL: Duration = Duration::from_millis(250);
/// Longest a request waits on the store for one call: past it the call
/// is given up (the request goes on with this replica's share) and counts
/// as slow (see [`SLOW_TRIP`]).
const BUDGET: Duration = Duration::from_millis(50);
/// The client library's connection and response timeouts, and the wait
/// of work off the request path (giving a lease back, renewals).
const TIMEOUT: Duration = Duration::from_millis(250);
/// Calls over [`BUDGET`] within [`SLOW_WINDOW`] that trip the store's
/// breaker: a store that slows under load is left before it slows every
/// request, one stray slow answer is not.
const SLOW_TRIP: u32 = 3;
const SLOW_WINDOW: Duration = Duration::from_secs(1);
/// Slow calls count apart only this far apart: a burst of requests whose
/// calls queue together on the connection is one slow moment, not
/// [`SLOW_TRIP`] of them (a replica that tripped alone on a burst kept to
/// its share while the others went on with the store, whose buckets did
/// not see its requests); a store that stays slow trips within ~250 ms of
/// its first late answer.
const SLOW_SPACING: Duration = Duration::from_millis(100);
/// While tripped, the store is probed this often…
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// …and rejoined after this many probes in a row answered within half
/// the budget.
const CLOSE_AFTER: u32 = 4;
/// Most lease ids put back in one call (see [`RENEW_ALL`]).
const RENEW_CHUNK: usize = 500;

/// A lease under the shared limit, or a place in the waiting line. KEYS:
/// leases, waiters, waiters' expiries, limit, slow start's window; ARGV:
/// id, ms to live, the cap, slow start's first window (0: past it), and
/// the limit this replica learned (0: none). With no limit stored (a store
/// that restarted empty) the one learned is put back, so that a cap learned
/// is not learned again from the provider's refusals.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, w in ipairs(stale) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
local stored = redis.call('GET', KEYS[4])
local learned = tonumber(ARGV[5])
local limit
if stored then
  limit = math.floor(tonumber(stored))
elseif learned > 0 then
  redis.call('SET', KEYS[4], ARGV[5])
  limit = math.floor(learned)
else
  limit = tonumber(ARGV[3])
  local first = tonumber(ARGV[4])
  if first > 0 then
    limit = math.min(limit, math.floor(tonumber(redis.call('HGET', KEYS[5], 'w') or first)))
  end
end
if limit < 1 then limit = 1 end
local held = redis.call('ZCARD', KEYS[1])
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
local ahead = rank or redis.call('ZCARD', KEYS[2])
if held < limit and ahead < limit - held then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {1, limit, held + 1}
end
if not rank then redis.call('ZADD', KEYS[2], now, ARGV[1]) end
redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
return {0, limit, held}
";

/// Gives lease ARGV[1] back (or leaves the waiting line) and wakes the
/// waiters. KEYS: leases, waiters, waiters' expiries, release channel
/// (see [`lease_keys`]). A macro, not a constant: [`LOWER`] ends with it.
macro_rules! release_lua {
    () => {
        "
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('PUBLISH', KEYS[4], ARGV[1])
"
    };
}

const RELEASE: &str = concat!(release_lua!(), "return 1\n");

/// On rejoining, [`RENEW_ALL`] and more: removes this replica's leases
/// the store has that it no longer holds (their give-back was lost while
/// the store was away: left, they would hold slots for a TTL) and its
/// places in the waiting line (none of its requests waits there now).
/// KEYS: leases, waiters, waiters' expiries, release channel; ARGV: ms to
/// live, this replica's id prefix, then every id it holds.
const ADOPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local prefix = ARGV[2]
local live = {}
for i = 3, #ARGV do live[ARGV[i]] = true end
local freed = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(id, 1, #prefix) == prefix and not live[id] then
    redis.call('ZREM', KEYS[1], id)
    freed = freed + 1
  end
end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if string.sub(id, 1, #prefix) == prefix then
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
end
local added = 0
for i = 3, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if freed > 0 then redis.call('PUBLISH', KEYS[4], 'adopted') end
return {added, redis.call('ZCARD', KEYS[1])}
";

/// Renews this replica's leases of one upstream, and puts back those the
/// store lost (it restarted empty, or a lease expired while the store or
/// this replica stood still): every one is a request still running, so
/// it counts. KEYS: leases; ARGV: ms to live, then the ids. Returns how
/// many the store did not have, and the leases held across replicas.
const RENEW_ALL: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return {added, redis.call('ZCARD', KEYS[1])}
";

/// GCRA reserve: ARGV cost, interval (ms per unit), burst (ms); returns
/// the wait in ms and how far the bucket's time is ahead of now (how full
/// it is, every replica's reservations counted: each replica's own bucket
/// follows it, so that when the store goes the shares start from what is
/// left, not from a full bucket each). Same arithmetic as
/// `limits::gcra::Gcra::reserve`. ARGV[4]: how far this replica's own
/// bucket is ahead of now, taken for the bucket's time when the store has
/// none (it returned empty: the bucket is not full again for that).
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local burst = tonumber(ARGV[3])
local cost = math.min(tonumber(ARGV[1]) * tonumber(ARGV[2]), burst)
local tat = tonumber(redis.call('GET', KEYS[1]) or (now + tonumber(ARGV[4])))
if tat < now then tat = now end
local new = tat + cost
redis.call('SET', KEYS[1], new, 'PX', math.ceil(new - now + burst) + 1)
return {math.max(0, math.ceil(new - burst - now)), math.ceil(new - now)}
";

/// GCRA adjust: ARGV delta units (may be negative), interval (ms per unit),
/// burst (ms): a correction moves the bucket by at most one period.
const GCRA_ADJUST: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat then return 0 end
local burst = tonumber(ARGV[3])
local step = math.max(-burst, math.min(burst, tonumber(ARGV[1]) * tonumber(ARGV[2])))
local new = math.max(now, tat + step)
redis.call('SET', KEYS[1], new, 'KEEPTTL')
return 1
";

/// A rejoining replica pays a rate bucket what it reserved on its own
/// while the store was away (ARGV: units, interval, burst as for
/// [`GCRA_ADJUST`]; how far its own bucket is ahead of now, ms): a bucket
/// the store has moves on by them; one it lost (it restarted empty) starts
/// from this replica's own bucket, which counted the others' shares too.
const PAY: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local burst = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]))
local new
if tat then
  new = math.max(now, tat) + math.min(burst, tonumber(ARGV[1]) * tonumber(ARGV[2]))
else
  new = now + math.min(burst, tonumber(ARGV[4]))
end
if new - now > burst then new = now + burst end
redis.call('SET', KEYS[1], new, 'PX', math.ceil(new - now + burst) + 1)
return 1
";

/// A replica says it is alive (ARGV: its id, ms until it counts as gone,
/// ms within which a heartbeat is fresh) and learns how many are, and how
/// many said so lately: the sorted set of replicas, scored by expiry.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
local fresh = redis.call('ZCOUNT', KEYS[1], now + ttl - tonumber(ARGV[3]), '+inf')
return {redis.call('ZCARD', KEYS[1]), fresh}
";

/// How long a replica that stopped saying it is alive still counts.
const REPLICA_TTL: Duration = Duration::from_secs(5);
/// A replica that said it is alive within this is back (heartbeats come
/// every second at most; see [`SharedState::settled`]).
const FRESH: Duration = Duration::from_millis(2500);

/// Keeps one turn of a translated Responses conversation (see `kept`):
/// KEYS[1] the turn's key; ARGV the response it continued ('' for none),
/// its new items (a JSON array), ms to keep it, its owner (empty without
/// client keys).
const KEEP_TURN: &str = r"
redis.call('HSET', KEYS[1], 'previous', ARGV[1], 'items', ARGV[2], 'owner', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
";

/// Reads a conversation back, newest turn first, renewing each turn's TTL
/// (a conversation in use does not expire from its oldest end): ARGV the
/// key prefix, the response id, ms to keep, most turns, the owner (empty
/// without client keys). Nil when a turn is missing (the conversation is
/// no longer whole) or is not the owner's: a turn written before owners
/// were kept has none, so only a deployment without client keys reads it. The keys are found by
/// walking the chain, so they cannot all be declared: on a cluster (where
/// a script reaches only its declared keys' slot) the same walk is done
/// a turn at a time ([`SharedState::kept_walk`]).
const KEPT: &str = r"
local id = ARGV[2]
local out = {}
for i = 1, tonumber(ARGV[4]) do
  local key = ARGV[1] .. id
  local turn = redis.call('HMGET', key, 'previous', 'items', 'owner')
  if not turn[2] then return nil end
  if (turn[3] or '') ~= ARGV[5] then return nil end
  redis.call('PEXPIRE', key, tonumber(ARGV[3]))
  out[#out + 1] = turn[2]
  if not turn[1] or turn[1] == '' then return out end
  id = turn[1]
end
return nil
";

/// Most turns read back for one conversation.
const MAX_TURNS: u32 = 10_000;

/// Longest wait for a conversation read back (it may be megabytes); a
/// slow read fails the read, not the store.
const KEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Lower the shared limit, when a concurrency refusal comes back, to the
/// leases held now (the refused request's still among them) minus its own,
/// and give that lease back in the same step: every request the provider
/// had accepted when it refused is among them (plus some sent after, which
/// a later refusal corrects), so the level is never below what the
/// provider accepts. (The leases held when the refused request took its
/// own are not: requests sent together reach the provider in any order,
/// and the first one taken may be the one refused.) One step, because
/// refusals come back together: lowered apart from the give-back, each of
/// a wave of k refusals saw the same leases and lowered to the same level,
/// one below them, not k. Floor 1. That level is remembered as the
/// ceiling of growth for ARGV[3] ms (only ever lowered meanwhile). KEYS:
/// [`RELEASE`]'s, then limit, ceiling; ARGV: the refused request's lease
/// id, cap, memory.
const LOWER: &str = concat!(
    "
local limit = tonumber(redis.call('GET', KEYS[5]) or ARGV[2])
local lowered = math.max(1, redis.call('ZCARD', KEYS[1]) - 1)
local ceiling = tonumber(redis.call('GET', KEYS[6]) or ARGV[2])
redis.call('SET', KEYS[6], tostring(math.min(ceiling, lowered)), 'PX', ARGV[3])
if lowered < limit then
  redis.call('SET', KEYS[5], tostring(lowered))
  limit = lowered
end
",
    release_lua!(),
    "return tostring(limit)\n"
);

/// Slow start's step across replicas (see `limits`): KEYS window (a hash
/// of the window `w` and the level proven `p`), leases, waiters, limit;
/// ARGV the first window, the level the answer proved, the most the
/// window may reach, requests waiting at the replica. Once a limit is
/// learned (KEYS[4] set) slow start is over: returns 0.
const SLOW_START: &str = r"
if redis.call('EXISTS', KEYS[4]) == 1 then return '0' end
local w = tonumber(redis.call('HGET', KEYS[1], 'w') or ARGV[1])
local proven = math.max(tonumber(redis.call('HGET', KEYS[1], 'p') or 0), tonumber(ARGV[2]))
local held = redis.call('ZCARD', KEYS[2])
local waiting = redis.call('ZCARD', KEYS[3]) + tonumber(ARGV[4])
if waiting > 0 or held >= math.floor(w) then
  local ahead = math.max(1, math.floor(proven / 4))
  w = math.max(w, math.min(w + 1, proven + ahead, tonumber(ARGV[3])))
end
redis.call('HSET', KEYS[1], 'w', tostring(w), 'p', tostring(proven))
return tostring(w)
";

/// Grow the shared limit by 1/limit, up to ARGV cap and, while the level
/// last refused is remembered (KEYS[2]), never up to it.
const GROW: &str = r"
local limit = tonumber(redis.call('GET', KEYS[1]))
if not limit then return ARGV[1] end
local cap = tonumber(ARGV[1])
local ceiling = redis.call('GET', KEYS[2])
if ceiling then cap = math.min(cap, math.floor(tonumber(ceiling))) end
local grown = math.max(limit, math.min(cap, limit + 1 / limit))
redis.call('SET', KEYS[1], tostring(grown))
return tostring(grown)
";

/// Cooldown / open breaker: extend-only keys that expire with them, and a
/// message to the other replicas. ARGV: kind, ms, payload.
const HEALTH: &str = r"
local left = tonumber(redis.call('PTTL', KEYS[1]))
if left < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
end
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 1
";

/// What the shared store tells the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedEvent {
    /// Another replica's cooldown or open breaker.
    Health(HealthEvent),
    /// The store's breaker tripped or closed (the gateway journals it).
    Store(StoreChange),
}

/// The store's breaker tripped (`engaged`: each replica keeps to its
/// share of every limit from now on) or closed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreChange {
    /// Tripped (true) or closed (false).
    pub engaged: bool,
    /// Why it tripped (an error, or slow calls); on closing, how long
    /// it was tripped and how many leases were adopted.
    pub detail: String,
}

/// A cooldown or open breaker announced by another replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// Upstream name.
    pub upstream: String,
    /// A provider's wait or an open breaker.
    pub kind: HoldKind,
    /// Time left.
    pub left: Duration,
}

struct Scripts {
    keep_turn: Script,
    kept: Script,
    acquire: Script,
    slow_start: Script,
    release: Script,
    renew_all: Script,
    adopt: Script,
    gcra: Script,
    gcra_adjust: Script,
    pay: Script,
    lower: Script,
    grow: Script,
    health: Script,
    heartbeat: Script,
}

/// One upstream's Redis keys and its waiters' wake-up, built once: the
/// request path never formats a key.
struct Keys {
    name: String,
    leases: String,
    waiters: String,
    waiters_exp: String,
    limit: String,
    /// Slow start's window and proven level while no limit is learned.
    window: String,
    /// The highest level known to be accepted after a concurrency refusal
    /// (expires with the learned limit's memory).
    ceiling: String,
    released: String,
    rpm: String,
    tpm: String,
    hold: String,
    open: String,
    wake: Notify,
    /// The leases this replica holds on this upstream (see [`Live`]).
    live: std::sync::Mutex<Live>,
    /// Leases held without the store having them (taken while it was
    /// down, not yet adopted): while any is, this replica keeps to its
    /// share even with the store up. Changed under `live`'s lock.
    unadopted: AtomicU32,
    /// The same, over every upstream: what the request path reads first.
    unadopted_any: Arc<AtomicU32>,
    /// Rpm and tpm: units reserved on this replica's own bucket while the
    /// breaker was tripped (calls the store never saw), with the bucket's
    /// limit; put in the store's bucket when this replica rejoins, so that
    /// the others do not spend them again.
    owed: std::sync::Mutex<[Owed; 2]>,
}

/// One replica's leases of one upstream, by id: whether the store has
/// each (false: taken while it was down), and the longest any was held
/// lately (how long another replica's requests may still run when the
/// store goes away).
#[derive(Debug, Default)]
struct Live {
    ids: HashMap<String, (bool, Instant)>,
    /// The leases held across replicas, and this replica's, as the store
    /// last said (see [`SharedState::others_held`]).
    seen: Option<Seen>,
    /// Longest held in the current and the previous [`LONGEST_SPAN`].
    longest: [Duration; 2],
    span_from: Option<Instant>,
}

/// What one bucket is owed (see [`Keys::owed`]).
#[derive(Debug, Default, Clone, Copy)]
struct Owed {
    /// Units reserved here with the breaker tripped.
    units: u64,
    /// The bucket's limit a minute.
    limit: u64,
    /// Where this replica's own bucket stood after the last of them (its
    /// time: how far ahead of now it is).
    own: Option<Instant>,
}

/// How long the longest lease held is remembered (two spans of it).
const LONGEST_SPAN: Duration = Duration::from_secs(150);

/// What the store said when a lease was last taken.
#[derive(Debug, Clone, Copy)]
struct Seen {
    held: u32,
    mine: u32,
    at: Instant,
}

impl Live {
    fn note_held(&mut self, held: Duration, now: Instant) {
        let from = *self.span_from.get_or_insert(now);
        if now.saturating_duration_since(from) > LONGEST_SPAN {
            self.longest = [Duration::ZERO, self.longest[0]];
            self.span_from = Some(now);
        }
        self.longest[0] = self.longest[0].max(held);
    }

    fn longest(&self) -> Duration {
        self.longest[0].max(self.longest[1])
    }
}

impl Keys {
    fn new(prefix: &str, name: &str, unadopted_any: Arc<AtomicU32>) -> Self {
        let key = |what: &str| format!("{prefix}:{{{name}}}:{what}");
        Keys {
            name: name.to_owned(),
            leases: key("leases"),
            waiters: key("waiters"),
            waiters_exp: key("waiters_exp"),
            limit: key("limit"),
            window: key("window"),
            ceiling: key("ceiling"),
            released: key("released"),
            rpm: key("rpm"),
            tpm: key("tpm"),
            hold: key("hold"),
            open: key("open"),
            wake: Notify::new(),
            live: Default::default(),
            unadopted: AtomicU32::new(0),
            unadopted_any,
            owed: std::sync::Mutex::new([Owed::default(); 2]),
        }
    }

    /// Counts one more lease unadopted (`by` 1) or one fewer (`by` -1).
    fn count_unadopted(&self, by: i32) {
        if by > 0 {
            self.unadopted.fetch_add(1, Ordering::AcqRel);
            self.unadopted_any.fetch_add(1, Ordering::AcqRel);
        } else {
            self.unadopted.fetch_sub(1, Ordering::AcqRel);
            self.unadopted_any.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Counts lease `id` as held, by the store or not; `held`: the leases
    /// across replicas the store said it has with it (see [`Keys::saw`]).
    fn hold(&self, id: &str, in_store: bool, held: Option<u32>) {
        if let Ok(mut live) = self.live.lock() {
            live.ids.insert(id.to_owned(), (in_store, Instant::now()));
            if !in_store {
                self.count_unadopted(1);
            }
            if let Some(held) = held {
                self.note_seen(&mut live, held);
            }
        }
    }

    /// Lease `id` ends; whether the store had it (then it must be given
    /// back there).
    fn forget(&self, id: &str) -> bool {
        let Ok(mut live) = self.live.lock() else { return true };
        let Some((in_store, since)) = live.ids.remove(id) else { return false };
        let now = Instant::now();
        live.note_held(now.saturating_duration_since(since), now);
        if !in_store {
            self.count_unadopted(-1);
        }
        in_store
    }

    /// Whether the store has lease `id`.
    fn is_stored(&self, id: &str) -> bool {
        self.live.lock().is_ok_and(|l| l.ids.get(id).is_some_and(|(stored, _)| *stored))
    }

    /// Every lease id held now.
    fn held_ids(&self) -> Vec<String> {
        self.live.lock().map(|l| l.ids.keys().cloned().collect()).unwrap_or_default()
    }

    /// The store has these leases now (still held ones are marked).
    fn stored(&self, ids: &[String]) {
        if let Ok(mut live) = self.live.lock() {
            for id in ids {
                if let Some((in_store, _)) = live.ids.get_mut(id)
                    && !*in_store
                {
                    *in_store = true;
                    self.count_unadopted(-1);
                }
            }
        }
    }

    /// The store answered: `held` leases across replicas.
    fn saw(&self, held: u32) {
        if let Ok(mut live) = self.live.lock() {
            self.note_seen(&mut live, held);
        }
    }

    /// [`Keys::saw`] with the lock held: this replica's share of `held`
    /// is what it holds less what the store does not have.
    fn note_seen(&self, live: &mut Live, held: u32) {
        let mine = (live.ids.len() as u32).saturating_sub(self.unadopted.load(Ordering::Acquire));
        live.seen = Some(Seen { held, mine, at: Instant::now() });
    }

    /// The key of a rate bucket.
    fn rate(&self, what: Bucket) -> &str {
        match what {
            Bucket::Rpm => &self.rpm,
            Bucket::Tpm => &self.tpm,
        }
    }

    /// The health key of `kind`.
    fn health(&self, kind: HoldKind) -> &str {
        match kind {
            HoldKind::Open => &self.open,
            HoldKind::Hold => &self.hold,
        }
    }
}

/// Which rate bucket a cost is taken from (the limiter's, shared here
/// under one key each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Requests per minute.
    Rpm,
    /// Tokens per minute.
    Tpm,
}

impl Bucket {
    /// The label in config, messages and shared-store keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Rpm => "rpm",
            Bucket::Tpm => "tpm",
        }
    }
}

/// The connection to the shared store and what rides on it.
pub struct SharedState {
    conn: Conn,
    up: AtomicBool,
    ttl: Duration,
    health_channel: String,
    replica: String,
    next: AtomicU64,
    scripts: Scripts,
    /// Per upstream name.
    upstreams: HashMap<String, Arc<Keys>>,
    /// The same, by release channel (for incoming messages).
    by_channel: HashMap<String, Arc<Keys>>,
    events: std::sync::Mutex<Option<mpsc::UnboundedReceiver<SharedEvent>>>,
    events_tx: mpsc::UnboundedSender<SharedEvent>,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Short-lived work started on the request path (giving a lease or a
    /// waiting place back when its request ends), for shutdown to wait on.
    background: TaskTracker,
    /// Replicas seen sharing the store (see [`SharedState::replicas`]).
    replica_count: std::sync::Mutex<ReplicaCount>,
    /// The store's breaker: slow calls lately, and since when it is
    /// tripped.
    breaker: std::sync::Mutex<Breaker>,
    /// When the store last went away (ms after `epoch`, 0: up or never
    /// joined), read on the request path.
    down_at: AtomicU64,
    /// When a call to the store first went unanswered since its last
    /// answer (ms after `epoch`, 0: it answered last time). A paused store
    /// answers nothing but trips the breaker only after [`SLOW_TRIP`]
    /// calls: from the first, what the other replicas took is unknown.
    doubt_at: AtomicU64,
    epoch: Instant,
    /// Every replica last seen is back (see [`SharedState::settled`]),
    /// as the last heartbeat said.
    settled: AtomicBool,
    /// Leases held here that the store does not have, over every upstream.
    unadopted_any: Arc<AtomicU32>,
}

/// The store's breaker (see the module docs).
#[derive(Debug, Default)]
struct Breaker {
    /// When a slow call last counted (see [`SLOW_SPACING`]).
    slow_at: Option<Instant>,
    /// Slow calls since `window_from`.
    slow: u32,
    window_from: Option<Instant>,
    /// Joined once: a later join closes a tripped breaker (journaled).
    joined: bool,
    tripped_at: Option<Instant>,
}

/// The replicas count as heartbeats read it, falling only slowly: a
/// Redis that restarted empty first shows this replica alone, until the
/// others' next heartbeats; taken at its word, this replica's share of a
/// limit would jump to all of it while the others still hold theirs. So
/// a lower count is believed only once the higher one is older than a
/// replica's lifetime in the set ([`REPLICA_TTL`]).
#[derive(Debug, Default)]
struct ReplicaCount {
    high: u32,
    seen: Option<Instant>,
    /// Replicas whose heartbeat is fresh ([`FRESH`]); 0 from a rejoin
    /// until this replica's next heartbeat.
    fresh: u32,
}

impl ReplicaCount {
    fn observe(&mut self, n: u32, now: Instant) -> u32 {
        let n = n.max(1);
        let stale = self.seen.is_none_or(|at| now.saturating_duration_since(at) > REPLICA_TTL);
        if n >= self.high || stale {
            self.high = n;
            self.seen = Some(now);
        }
        self.high
    }
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState").field("up", &self.is_up()).finish()
    }
}

impl Drop for SharedState {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.lock() {
            tasks.iter().for_each(JoinHandle::abort);
        }
    }
}

/// Why the shared store could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("state: {0}")]
pub struct SharedError(String);

/// The keys and the argument [`RELEASE`] (and [`LOWER`]'s give-back) work
/// on: lease `id` of the upstream with `keys`.
fn lease_keys(inv: &mut redis::ScriptInvocation<'_>, keys: &Keys, id: &str) {
    inv.key(&keys.leases).key(&keys.waiters).key(&keys.waiters_exp).key(&keys.released).arg(id);
}

/// A shared concurrency lease; given back when dropped (in a task). The
/// replica renews every lease it holds in one call per upstream (see
/// [`watch`]). A lease taken while the store was away ([`SharedSlot::Outage`])
/// is this replica's own until the store has it again ("adopted").
pub struct SharedLease {
    spot: Spot,
}

impl SharedLease {
    /// Gives the lease back now and waits until Redis has it (dropping the
    /// lease does the same in the background).
    pub async fn give_back(mut self) {
        let (armed, in_store) = self.spot.disarm();
        if armed || in_store {
            self.spot.state.release(&self.spot.keys, &self.spot.id, in_store).await;
        }
    }
}

/// A lease or a place in the shared waiting line: while `armed` (the
/// store may have it) or `held` and in the store, dropping it removes it
/// from Redis (in a task: drops cannot wait).
struct Spot {
    state: Arc<SharedState>,
    keys: Arc<Keys>,
    id: String,
    armed: bool,
    /// Counted among this replica's leases (see [`Live`]).
    held: bool,
}

impl Spot {
    /// Ends the spot here: whether it was armed, and whether the store
    /// had it as a lease; either way it must be removed from the store.
    fn disarm(&mut self) -> (bool, bool) {
        let in_store = self.held && self.keys.forget(&self.id);
        let armed = self.armed;
        (self.armed, self.held) = (false, false);
        (armed, in_store)
    }
}

impl Drop for Spot {
    fn drop(&mut self) {
        let (armed, in_store) = self.disarm();
        if armed || in_store {
            let (state, keys, id) = (self.state.clone(), self.keys.clone(), std::mem::take(&mut self.id));
            let background = self.state.background.clone();
            background.spawn(async move { state.release(&keys, &id, in_store).await });
        }
    }
}

/// The outcome of asking the shared store for a slot.
pub enum SharedSlot {
    /// A lease, the limit in force across replicas, and the leases held
    /// across replicas with it (what its success proves, see slow start).
    Leased(SharedLease, u32, u32),
    /// The deadline came first.
    Deadline,
    /// The store is away (or did not answer within the budget): go on
    /// with this replica's share; the lease is adopted when it returns.
    Outage(SharedLease),
    /// The upstream is not shared.
    Unavailable,
}

impl SharedState {
    /// Connects lazily to `url` for these upstream names; must run inside
    /// a tokio runtime (it starts the message and rejoin tasks).
    pub fn start(url: &str, ttl: Duration, upstreams: &[String]) -> Result<Arc<Self>, SharedError> {
        let (push_tx, push_rx) = mpsc::unbounded_channel::<PushInfo>();
        let conn = Conn::open(url, TIMEOUT, push_tx)?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let unadopted_any = Arc::new(AtomicU32::new(0));
        let keys: Vec<Arc<Keys>> =
            upstreams.iter().map(|u| Arc::new(Keys::new(PREFIX, u, unadopted_any.clone()))).collect();
        let state = Arc::new(SharedState {
            health_channel: format!("{PREFIX}:health"),
            conn,
            up: AtomicBool::new(false),
            ttl,
            replica: uuid::Uuid::now_v7().simple().to_string(),
            next: AtomicU64::new(0),
            scripts: Scripts {
                keep_turn: Script::new(KEEP_TURN),
                kept: Script::new(KEPT),
                acquire: Script::new(ACQUIRE),
                slow_start: Script::new(SLOW_START),
                release: Script::new(RELEASE),
                renew_all: Script::new(RENEW_ALL),
                adopt: Script::new(ADOPT),
                gcra: Script::new(GCRA),
                gcra_adjust: Script::new(GCRA_ADJUST),
                pay: Script::new(PAY),
                lower: Script::new(LOWER),
                grow: Script::new(GROW),
                health: Script::new(HEALTH),
                heartbeat: Script::new(HEARTBEAT),
            },
            replica_count: std::sync::Mutex::new(ReplicaCount::default()),
            breaker: Default::default(),
            down_at: AtomicU64::new(0),
            doubt_at: AtomicU64::new(0),
            epoch: Instant::now(),
            settled: AtomicBool::new(true),
            unadopted_any,
            upstreams: keys.iter().map(|k| (k.name.clone(), k.clone())).collect(),
            by_channel: keys.iter().map(|k| (k.released.clone(), k.clone())).collect(),
            events: std::sync::Mutex::new(Some(events_rx)),
            events_tx,
            tasks: std::sync::Mutex::new(Vec::new()),
            background: TaskTracker::new(),
        });
        let weak = Arc::downgrade(&state);
        let messages = tokio::spawn(read_messages(weak.clone(), push_rx));
        let rejoin = tokio::spawn(watch(weak));
        if let Ok(mut tasks) = state.tasks.lock() {
            tasks.extend([messages, rejoin]);
        }
        Ok(state)
    }

    /// Work started on the request path that may still be running.
    pub fn background(&self) -> &TaskTracker {
        &self.background
    }

    /// Health events from other replicas and the store's breaker; taken
    /// once by the gateway.
    pub fn take_events(&self) -> Option<mpsc::UnboundedReceiver<SharedEvent>> {
        self.events.lock().ok().and_then(|mut e| e.take())
    }

    /// Whether the shared store answered last time it was asked.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Up, and the last call to it was answered in time: what it says of
    /// the other replicas is current. Otherwise each replica keeps to its
    /// share and below what the others last held (see
    /// [`Self::others_held`]), before the breaker trips too.
    pub fn trusted(&self) -> bool {
        self.is_up() && self.doubt_at.load(Ordering::Acquire) == 0
    }

    /// Since a call went unanswered, or the store went away (the earlier).
    fn doubt_since(&self) -> Option<Instant> {
        let at = |v: &AtomicU64| match v.load(Ordering::Acquire) {
            0 => None,
            at => Some(self.epoch + Duration::from_millis(at)),
        };
        let down = if self.is_up() { None } else { at(&self.down_at) };
        match (at(&self.doubt_at), down) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A call went unanswered (timed out or failed): doubt from now
    /// unless already in doubt.
    fn doubt(&self) {
        let since = Instant::now().saturating_duration_since(self.epoch).as_millis() as u64;
        let _ = self.doubt_at.compare_exchange(0, since.max(1), Ordering::AcqRel, Ordering::Acquire);
    }

    /// Replicas sharing the store, as last seen while it answered (this
    /// one included; at least 1). While the store is down each replica
    /// holds its share of a counted limit (see `limits::Limiter`), so
    /// together they stay within it.
    pub fn replicas(&self) -> u32 {
        self.replica_count.lock().map_or(1, |c| c.high.max(1))
    }

    /// Whether every replica last seen sharing the store is back on it:
    /// after the store returns, a replica that has not rejoined yet still
    /// runs requests it took meanwhile, unknown to the store, so until all
    /// have said they are alive again (or the missing one is counted
    /// gone) each keeps to its share.
    pub fn settled(&self) -> bool {
        self.is_up() && self.settled.load(Ordering::Acquire)
    }

    /// Says this replica is alive and reads how many are.
    async fn heartbeat(&self) {
        let mut inv = self.scripts.heartbeat.prepare_invoke();
        inv.key(format!("{PREFIX}:replicas")).arg(&self.replica).arg(REPLICA_TTL.as_millis() as u64);
        inv.arg(FRESH.as_millis() as u64);
        if let Some((n, fresh)) = self.call::<(u32, u32)>(inv).await
            && let Ok(mut count) = self.replica_count.lock()
        {
            count.observe(n, Instant::now());
            count.fresh = fresh;
            self.settled.store(count.fresh >= count.high, Ordering::Release);
        }
    }

    /// Trips the store's breaker (once): from now on each replica keeps
    /// to its share, until [`watch`] closes it.
    fn down(&self, why: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            let now = Instant::now();
            let since = now.saturating_duration_since(self.epoch).as_millis() as u64;
            self.down_at.store(since.max(1), Ordering::Release);
            if let Ok(mut b) = self.breaker.lock() {
                b.tripped_at = Some(now);
            }
            tracing::error!(
                why,
                "shared state (Redis) breaker tripped: every replica now keeps to its share of each limit; will rejoin when the store answers fast again"
            );
            let _ = self.events_tx.send(SharedEvent::Store(StoreChange { engaged: true, detail: why.to_owned() }));
        }
    }

    /// A call went over [`BUDGET`]: [`SLOW_TRIP`] of them within
    /// [`SLOW_WINDOW`] trip the breaker.
    fn slow_call(&self) {
        let now = Instant::now();
        let trip = self.breaker.lock().is_ok_and(|mut b| {
            if b.slow_at.is_some_and(|at| now.saturating_duration_since(at) < SLOW_SPACING) {
                return false;
            }
            b.slow_at = Some(now);
            if b.window_from.is_none_or(|from| now.saturating_duration_since(from) > SLOW_WINDOW) {
                b.window_from = Some(now);
                b.slow = 0;
            }
            b.slow += 1;
            b.slow >= SLOW_TRIP
        });
        if trip {
            self.down(&format!(
                "slow: {SLOW_TRIP} calls over {} ms within {} s",
                BUDGET.as_millis(),
                SLOW_WINDOW.as_secs()
            ));
        }
    }

    async fn call<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Option<T> {
        self.call_within(inv, BUDGET, true).await
    }

    /// A script call given `within`; an error trips the breaker, a
    /// timeout counts as slow when `late_is_slow` (a slow answer to a
    /// large read is that read failing, not the store).
    async fn call_within<T: redis::FromRedisValue>(
        &self,
        inv: redis::ScriptInvocation<'_>,
        within: Duration,
        late_is_slow: bool,
    ) -> Option<T> {
        if !self.is_up() {
            return None;
        }
        let mut conn = self.conn.clone();
        match tokio::time::timeout(within, inv.invoke_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => {
                if self.doubt_at.load(Ordering::Relaxed) != 0 {
                    self.doubt_at.store(0, Ordering::Release);
                }
                Some(v)
            }
            Ok(Err(err)) => {
                self.doubt();
                self.down(&format!("unreachable: {err}"));
                None
            }
            Err(_) => {
                if late_is_slow {
                    self.doubt();
                    self.slow_call();
                }
                None
            }
        }
    }

    /// Work off the request path (giving a lease back): tried even while
    /// the breaker is tripped, since a store that is only slow still takes
    /// it (it is queued on the connection), within [`TIMEOUT`].
    async fn call_background(&self, inv: redis::ScriptInvocation<'_>) {
        let mut conn = self.conn.clone();
        if let Ok(Err(err)) = tokio::time::timeout(TIMEOUT, inv.invoke_async::<i64>(&mut conn)).await {
            self.down(&format!("unreachable: {err}"));
        }
    }

    /// Leases of `upstream` other replicas held when the store went away,
    /// for as long as they may still run (a lease's TTL, or the longest a
    /// lease was held here lately if longer): until then this replica
    /// keeps below the cap minus them, not only to its share, so that
    /// nothing is sent on top of the requests another replica had in
    /// flight above its share when the store went. 0 with the store up,
    /// or once that time is past; with it, the time left. The same from
    /// the first call the store left unanswered (see [`Self::trusted`]).
    pub fn others_held(&self, upstream: &str) -> (u32, Duration) {
        let (Some(keys), Some(went)) = (self.upstreams.get(upstream), self.doubt_since()) else {
            return (0, Duration::ZERO);
        };
        let Some((longest, Some(seen))) = keys.live.lock().ok().map(|l| (l.longest().max(self.ttl), l.seen)) else {
            return (0, Duration::ZERO);
        };
        let down = went.elapsed();
        // A reading older than a lease's life says nothing of the outage.
        if down >= longest || went.saturating_duration_since(seen.at) > self.ttl {
            return (0, Duration::ZERO);
        }
        (seen.held.saturating_sub(seen.mine), longest - down)
    }

    /// Leases of `upstream` held here that the store does not have yet.
    pub fn unadopted(&self, upstream: &str) -> u32 {
        if self.unadopted_any.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.upstreams.get(upstream).map_or(0, |k| k.unadopted.load(Ordering::Acquire))
    }

    /// Waits for a slot under the shared limit of `upstream` (`cap`: its
    /// declared or adaptive maximum; `learned`: the limit this replica
    /// learned, 0 if none) until `deadline`.
    pub async fn acquire(
        self: &Arc<Self>,
        upstream: &str,
        (cap, first_window, learned): (u32, u32, f64),
        deadline: Instant,
    ) -> SharedSlot {
        let Some(keys) = self.upstreams.get(upstream) else { return SharedSlot::Unavailable };
        let id = format!("{}-{}", self.replica, self.next.fetch_add(1, Ordering::Relaxed));
        let mut spot = Spot { state: self.clone(), keys: keys.clone(), id, armed: false, held: false };
        loop {
            let notified = keys.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut inv = self.scripts.acquire.prepare_invoke();
            inv.key(&keys.leases).key(&keys.waiters).key(&keys.waiters_exp).key(&keys.limit).key(&keys.window);
            inv.arg(&spot.id).arg(self.ttl.as_millis() as u64).arg(cap).arg(first_window).arg(learned);
            // From the moment the script may run, this id may be a waiter
            // or hold a lease: dropped before its answer is read (a pool's
            // request that another account served first), it must leave
            // Redis at once, not when its TTL runs out — a lease left
            // behind counts against the limit and inflates every level
            // learned meanwhile. (The release follows the script on the
            // same connection; removing an id Redis never added is a no-op.)
            spot.armed = true;
            let Some((taken, limit_now, level)) = self.call::<(u8, u32, u32)>(inv).await else {
                // Down, or slower than the budget: this replica's own
                // lease until the store has it. Still armed: a late answer
                // may have made it a lease or a waiter there.
                keys.hold(&spot.id, false, None);
                spot.held = true;
                return SharedSlot::Outage(SharedLease { spot });
            };
            if taken == 1 {
                keys.hold(&spot.id, true, Some(level));
                spot.held = true;
                return SharedSlot::Leased(SharedLease { spot }, limit_now, level);
            }
            keys.saw(level);
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = tokio::time::sleep_until(deadline) => return SharedSlot::Deadline,
            }
        }
    }

    /// Removes lease or waiter `id` from the store; tried with the breaker
    /// tripped too when the store had it as a lease (`in_store`).
    async fn release(&self, keys: &Keys, id: &str, in_store: bool) {
        if !in_store && !self.is_up() {
            return;
        }
        let mut inv = self.scripts.release.prepare_invoke();
        lease_keys(&mut inv, keys, id);
        self.call_background(inv).await;
    }

    /// Reserves `cost` units of a shared rate bucket of `limit` a
    /// `period`: the wait, and how far the bucket is ahead of now (see
    /// [`GCRA`]; `own`: this replica's view of that); `None` when the
    /// store is unreachable (use the local bucket).
    pub async fn reserve(
        &self,
        upstream: &str,
        what: Bucket,
        (cost, limit, period): (u64, u64, Duration),
        own: Duration,
    ) -> Option<(Duration, Duration)> {
        let keys = self.upstreams.get(upstream)?;
        let interval = period.as_secs_f64() * 1000.0 / limit.max(1) as f64;
        let mut inv = self.scripts.gcra.prepare_invoke();
        // Never more than the bucket holds (the script bounds it too).
        inv.key(keys.rate(what)).arg(cost.min(limit)).arg(interval).arg(period.as_millis() as u64);
        inv.arg(own.as_millis() as u64);
        let (wait, ahead) = self.call::<(u64, u64)>(inv).await?;
        Some((Duration::from_millis(wait), Duration::from_millis(ahead)))
    }

    /// `cost` units of `upstream`'s bucket `what` (of `limit` a minute)
    /// reserved on this replica's own bucket with the breaker tripped, which
    /// then stood at `own`: owed to the store's bucket (see [`Keys::owed`]).
    pub fn owe(&self, upstream: &str, what: Bucket, (cost, limit): (u64, u64), own: Instant) {
        if self.is_up() {
            // A call that went unanswered may still have run there.
            return;
        }
        if let Some(keys) = self.upstreams.get(upstream)
            && let Ok(mut owed) = keys.owed.lock()
        {
            let slot = &mut owed[what as usize];
            *slot = Owed { units: slot.units.saturating_add(cost), limit, own: Some(own) };
        }
    }

    /// Pays what each bucket is owed (see [`SharedState::owe`]) once the
    /// store answers again (see [`PAY`]).
    async fn pay_owed(&self) {
        for keys in self.upstreams.values() {
            let owed = keys.owed.lock().map(|mut o| std::mem::take(&mut *o)).unwrap_or_default();
            for (what, owed) in [Bucket::Rpm, Bucket::Tpm].into_iter().zip(owed) {
                if owed.units == 0 || owed.limit == 0 {
                    continue;
                }
                let period = Duration::from_secs(60);
                let interval = period.as_secs_f64() * 1000.0 / owed.limit as f64;
                let own = owed.own.map_or(Duration::ZERO, |at| at.saturating_duration_since(Instant::now()));
                let mut inv = self.scripts.pay.prepare_invoke();
                inv.key(keys.rate(what)).arg(owed.units).arg(interval).arg(period.as_millis() as u64);
                inv.arg(own.as_millis() as u64);
                let _ = self.call::<i64>(inv).await;
            }
        }
    }

    /// Corrects a shared rate reservation by `delta` units.
    pub async fn adjust(&self, upstream: &str, what: Bucket, delta: i64, limit: u64, period: Duration) {
        let Some(keys) = self.upstreams.get(upstream) else { return };
        let interval = period.as_secs_f64() * 1000.0 / limit.max(1) as f64;
        let mut inv = self.scripts.gcra_adjust.prepare_invoke();
        inv.key(keys.rate(what)).arg(delta).arg(interval).arg(period.as_millis() as u64);
        let _ = self.call::<i64>(inv).await;
    }

    /// "Concurrency limit" seen by a request still holding `lease`: the
    /// shared limit drops to the other leases held now, growth stays below
    /// that level for `memory`, and the lease is given back in the same
    /// step (see [`LOWER`]). Returns the new limit (`None`: the store did
    /// not answer, and the lease is given back in the background).
    pub async fn lower(&self, mut lease: SharedLease, cap: u32, memory: Duration) -> Option<f64> {
        let spot = &mut lease.spot;
        // A lease the store does not have lowers nothing there (its drop
        // gives it back if it was adopted meanwhile).
        if !spot.keys.is_stored(&spot.id) {
            return None;
        }
        let keys = spot.keys.clone();
        let mut inv = self.scripts.lower.prepare_invoke();
        lease_keys(&mut inv, &keys, &spot.id);
        inv.key(&keys.limit).key(&keys.ceiling).arg(cap).arg(memory.as_millis() as u64);
        let lowered = self.call::<String>(inv).await.and_then(|s| s.parse().ok());
        // Answered: the script gave the lease back. Otherwise the spot's
        // drop tries again.
        if lowered.is_some() {
            spot.disarm();
        }
        lowered
    }

    /// Slow start's step for an answer that proved `level` (see
    /// [`SLOW_START`]): the window now (`Some(0)`: a limit is learned,
    /// slow start is over; `None`: the store did not answer).
    pub async fn slow_start(&self, upstream: &str, first: u32, level: u32, most: u32, waiting: usize) -> Option<f64> {
        let keys = self.upstreams.get(upstream)?;
        let mut inv = self.scripts.slow_start.prepare_invoke();
        inv.key(&keys.window).key(&keys.leases).key(&keys.waiters).key(&keys.limit);
        inv.arg(first).arg(level).arg(most).arg(waiting);
        self.call::<String>(inv).await.and_then(|s| s.parse().ok())
    }

    /// A success while the shared limit is below `cap`: grow it.
    pub async fn grow(&self, upstream: &str, cap: u32) -> Option<f64> {
        let keys = self.upstreams.get(upstream)?;
        let mut inv = self.scripts.grow.prepare_invoke();
        inv.key(&keys.limit).key(&keys.ceiling).arg(cap);
        self.call::<String>(inv).await.and_then(|s| s.parse().ok())
    }

    /// Tells the other replicas that `upstream` cools down (or has its
    /// breaker open) for `left`.
    pub async fn announce(&self, upstream: &str, kind: HoldKind, left: Duration) {
        let Some(keys) = self.upstreams.get(upstream) else { return };
        let ms = left.as_millis().max(1) as u64;
        let mut inv = self.scripts.health.prepare_invoke();
        // The channel is an argument, not a key: in a cluster a script's
        // keys share one slot, and a channel is no key.
        inv.key(keys.health(kind)).arg(kind.as_str()).arg(ms).arg(format!(
            "{}|{}|{ms}|{upstream}",
            self.replica,
            kind.as_str()
        ));
        inv.arg(&self.health_channel);
        let _ = self.call::<i64>(inv).await;
    }

    /// Remembers, for every replica, that `upstream` holds `id` (a
    /// response the Responses API stores, kind `pin`; a conversation's
    /// prompt cache, kind `session`), for `ttl`.
    pub async fn pin(&self, kind: &str, id: &str, upstream: &str, ttl: Duration) {
        if !self.is_up() {
            return;
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SET")
            .arg(format!("tidegate:{kind}:{id}"))
            .arg(upstream)
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .to_owned();
        match tokio::time::timeout(BUDGET, cmd.query_async::<()>(&mut conn)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => self.down(&format!("unreachable: {err}")),
            Err(_) => self.slow_call(),
        }
    }

    /// Keeps one turn of a translated Responses conversation: response
    /// `id`, the response it continued, its new items (a JSON array).
    pub async fn keep_turn(&self, id: &str, previous: Option<&str>, items: &str, owner: &str, ttl: Duration) {
        let mut inv = self.scripts.keep_turn.prepare_invoke();
        inv.key(format!("{PREFIX}:kept:{id}")).arg(previous.unwrap_or_default()).arg(items);
        inv.arg(ttl.as_millis() as u64).arg(owner);
        let _ = self.call::<i64>(inv).await;
    }

    /// The whole conversation through response `id` (its input items and
    /// answers, oldest first), if every turn of it is still kept and is
    /// `owner`'s (empty: a deployment without client keys).
    pub async fn kept(&self, id: &str, ttl: Duration, owner: &str) -> Option<Vec<serde_json::Value>> {
        let turns = if self.conn.is_cluster() {
            let walk = self.kept_walk(id, ttl, owner);
            tokio::time::timeout(KEPT_TIMEOUT, walk).await.ok()??
        } else {
            let mut inv = self.scripts.kept.prepare_invoke();
            inv.arg(format!("{PREFIX}:kept:")).arg(id).arg(ttl.as_millis() as u64).arg(MAX_TURNS).arg(owner);
            self.call_within::<Option<Vec<String>>>(inv, KEPT_TIMEOUT, false).await??
        };
        let mut items = Vec::new();
        for turn in turns.iter().rev() {
            match serde_json::from_str::<Vec<serde_json::Value>>(turn) {
                Ok(new) => items.extend(new),
                Err(_) => return None,
            }
        }
        Some(items)
    }

    /// [`KEPT`]'s walk a turn at a time, for a cluster: each turn is one
    /// key (in its own slot), read and renewed in one round trip.
    async fn kept_walk(&self, id: &str, ttl: Duration, owner: &str) -> Option<Vec<String>> {
        if !self.is_up() {
            return None;
        }
        let mut conn = self.conn.clone();
        let (mut id, mut out) = (id.to_string(), Vec::new());
        for _ in 0..MAX_TURNS {
            let key = format!("{PREFIX}:kept:{id}");
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET").arg(&key).arg("previous").arg("items").arg("owner");
            pipe.cmd("PEXPIRE").arg(&key).arg(ttl.as_millis() as u64).ignore();
            let (turn,): ((Option<String>, Option<String>, Option<String>),) = match pipe.query_async(&mut conn).await {
                Ok(turn) => turn,
                Err(err) => {
                    self.down(&format!("unreachable: {err}"));
                    return None;
                }
            };
            let (previous, items, turn_owner) = turn;
            if turn_owner.as_deref().unwrap_or_default() != owner {
                return None;
            }
            out.push(items?);
            match previous.filter(|p| !p.is_empty()) {
                Some(p) => id = p,
                None => return Some(out),
            }
        }
        None
    }

    /// The upstream that holds `id` (of `kind`, see [`SharedState::pin`]),
    /// if any replica pinned it.
    pub async fn pinned(&self, kind: &str, id: &str) -> Option<String> {
        if !self.is_up() {
            return None;
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("GET").arg(format!("tidegate:{kind}:{id}")).to_owned();
        match tokio::time::timeout(BUDGET, cmd.query_async::<Option<String>>(&mut conn)).await {
            Ok(Ok(name)) => name,
            Ok(Err(err)) => {
                self.down(&format!("unreachable: {err}"));
                None
            }
            Err(_) => {
                self.slow_call();
                None
            }
        }
    }

    /// Reads the cooldowns and open breakers other replicas announced (one
    /// key of each upstream's slot: on a cluster, every node that holds
    /// one answers): the probe of a tripped breaker.
    async fn probe(&self) -> redis::RedisResult<Vec<HealthEvent>> {
        let mut conn = self.conn.clone();
        let mut found = Vec::new();
        for (upstream, keys) in &self.upstreams {
            // One pipeline per upstream: its keys share a slot.
            let mut pipe = redis::pipe();
            for kind in HoldKind::ALL {
                pipe.cmd("PTTL").arg(keys.health(kind));
            }
            let lefts: Vec<i64> = pipe.query_async(&mut conn).await?;
            for (kind, left) in HoldKind::ALL.into_iter().zip(lefts) {
                if left > 0 {
                    let left = Duration::from_millis(left as u64);
                    found.push(HealthEvent { upstream: upstream.clone(), kind, left });
                }
            }
        }
        Ok(found)
    }

    /// Renews every lease this replica holds, putting back those the store
    /// lost (see [`RENEW_ALL`]); returns how many it did not have. With
    /// the breaker tripped this is the adoption of the leases taken
    /// meanwhile.
    async fn renew_all(&self, adopting: bool) -> Result<u64, ()> {
        let mut lost = 0;
        let prefix = format!("{}-", self.replica);
        for keys in self.upstreams.values() {
            let ids = keys.held_ids();
            // Once per upstream even with no lease held here: the answer
            // says how many the other replicas hold (see [`Self::others_held`]).
            // Adopting, every id in one call: the script frees the ones
            // it is not given.
            let mut chunks: Vec<&[String]> = if adopting { vec![&ids[..]] } else { ids.chunks(RENEW_CHUNK).collect() };
            if chunks.is_empty() {
                chunks.push(&[]);
            }
            for chunk in chunks {
                let mut inv = if adopting {
                    let mut inv = self.scripts.adopt.prepare_invoke();
                    inv.key(&keys.leases).key(&keys.waiters).key(&keys.waiters_exp).key(&keys.released);
                    inv.arg(self.ttl.as_millis() as u64).arg(&prefix);
                    inv
                } else {
                    let mut inv = self.scripts.renew_all.prepare_invoke();
                    inv.key(&keys.leases).arg(self.ttl.as_millis() as u64);
                    inv
                };
                for id in chunk {
                    inv.arg(id);
                }
                let mut conn = self.conn.clone();
                match tokio::time::timeout(TIMEOUT, inv.invoke_async::<(u64, u32)>(&mut conn)).await {
                    Ok(Ok((added, held))) => {
                        keys.stored(chunk);
                        keys.saw(held);
                        lost += added;
                    }
                    Ok(Err(err)) => {
                        self.down(&format!("unreachable: {err}"));
                        return Err(());
                    }
                    Err(_) => {
                        self.slow_call();
                        return Err(());
                    }
                }
            }
        }
        Ok(lost)
    }

    /// Joins (or rejoins): subscribes, applies the cooldowns and breakers
    /// the probe read, adopts the leases held here, and only then counts
    /// as up (then adopts again what was taken while it joined). A rejoin
    /// closes the breaker (journaled).
    async fn join(&self, health: Vec<HealthEvent>) -> Result<(), String> {
        let mut conn = self.conn.clone();
        let mut channels: Vec<&str> = self.by_channel.keys().map(String::as_str).collect();
        channels.push(&self.health_channel);
        conn.subscribe(&channels).await.map_err(|e| e.to_string())?;
        for event in health {
            let _ = self.events_tx.send(SharedEvent::Health(event));
        }
        let adopted = self.renew_all(true).await.map_err(|()| "the store did not take the leases held".to_owned())?;
        // Not settled until a heartbeat counts who else is back (see
        // [`Self::settled`]).
        if let Ok(mut count) = self.replica_count.lock() {
            count.fresh = 0;
            self.settled.store(count.high == 0, Ordering::Release);
        }
        self.up.store(true, Ordering::Release);
        self.down_at.store(0, Ordering::Release);
        self.doubt_at.store(0, Ordering::Release);
        let adopted = adopted + self.renew_all(false).await.unwrap_or(0);
        self.pay_owed().await;
        let (rejoined, tripped_at) = self
            .breaker
            .lock()
            .map(|mut b| (std::mem::replace(&mut b.joined, true), b.tripped_at.take()))
            .unwrap_or((true, None));
        if rejoined {
            let lasted = tripped_at.map_or(0.0, |at| at.elapsed().as_secs_f64());
            let detail = format!("closed after {lasted:.1} s; {adopted} leases held here adopted by the store");
            tracing::info!(detail, "shared state (Redis) breaker closed: limits are shared across replicas again");
            let _ = self.events_tx.send(SharedEvent::Store(StoreChange { engaged: false, detail }));
        } else {
            tracing::info!("shared state (Redis) reachable: limits, cooldowns and breakers are shared across replicas");
        }
        Ok(())
    }
}

/// Joins at start; then, while the store is up, says this replica is
/// alive and renews its leases (every third of their TTL, at most a
/// second apart); while the breaker is tripped, probes every
/// [`PROBE_EVERY`] and rejoins after [`CLOSE_AFTER`] fast answers in a
/// row (the first join needs one answer, fast or not).
async fn watch(state: std::sync::Weak<SharedState>) {
    let mut logged_waiting = false;
    let mut fast = 0u32;
    let mut renewed = Instant::now();
    loop {
        let Some(s) = state.upgrade() else { return };
        let tick = if s.is_up() {
            s.heartbeat().await;
            if s.is_up() && renewed.elapsed() >= s.ttl / 3 {
                renewed = Instant::now();
                let _ = s.renew_all(false).await;
            }
            (s.ttl / 3).min(Duration::from_secs(1))
        } else {
            let first = s.breaker.lock().is_ok_and(|b| !b.joined);
            let asked = Instant::now();
            match tokio::time::timeout(TIMEOUT, s.probe()).await {
                Ok(Ok(health)) => {
                    fast = if asked.elapsed() <= BUDGET / 2 { fast + 1 } else { 0 };
                    if first || fast >= CLOSE_AFTER {
                        match s.join(health).await {
                            Ok(()) => {
                                logged_waiting = false;
                                renewed = Instant::now();
                            }
                            Err(err) if !logged_waiting => {
                                tracing::error!(error = %err, "shared state (Redis) rejoin failed: keeping to this replica's share until it answers");
                                logged_waiting = true;
                            }
                            Err(_) => {}
                        }
                        fast = 0;
                    }
                }
                Ok(Err(err)) => {
                    fast = 0;
                    if !logged_waiting {
                        tracing::error!(error = %err, "shared state (Redis) unreachable: keeping to this replica's share until it answers");
                        logged_waiting = true;
                    }
                }
                Err(_) => fast = 0,
            }
            PROBE_EVERY
        };
        drop(s);
        tokio::time::sleep(tick).await;
    }
}

/// Routes pub/sub messages: releases wake that upstream's waiters, health
/// messages from other replicas go to the gateway.
async fn read_messages(state: std::sync::Weak<SharedState>, mut pushes: mpsc::UnboundedReceiver<PushInfo>) {
    while let Some(push) = pushes.recv().await {
        let Some(state) = state.upgrade() else { return };
        match push.kind {
            PushKind::Message => {
                let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
                    (push.data.first(), push.data.get(1))
                else {
                    continue;
                };
                let channel = String::from_utf8_lossy(channel);
                let payload = String::from_utf8_lossy(payload);
                if let Some(keys) = state.by_channel.get(channel.as_ref()) {
                    keys.wake.notify_waiters();
                } else if let Some(event) = parse_health(&payload, &state.replica) {
                    let _ = state.events_tx.send(SharedEvent::Health(event));
                }
            }
            PushKind::Disconnection => {
                state.down("unreachable: the connection to the store was lost");
            }
            _ => {}
        }
    }
}

/// `replica|kind|ms|upstream`, ignoring this replica's own messages.
fn parse_health(payload: &str, me: &str) -> Option<HealthEvent> {
    let mut parts = payload.splitn(4, '|');
    let (from, kind, ms, upstream) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let kind = HoldKind::parse(kind)?;
    if from == me {
        return None;
    }
    Some(HealthEvent { upstream: upstream.into(), kind, left: Duration::from_millis(ms.parse().ok()?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_messages_parse_and_own_messages_are_ignored() {
        let e = parse_health("r1|hold|5000|codearts|x", "r2").unwrap();
        assert_eq!(
            e,
            HealthEvent { upstream: "codearts|x".into(), kind: HoldKind::Hold, left: Duration::from_secs(5) }
        );
        assert!(parse_health("r2|hold|5000|codearts", "r2").is_none());
        assert!(parse_health("r1|drop|5|u", "r2").is_none());
        assert!(parse_health("garbage", "r2").is_none());
    }

    #[test]
    fn the_replica_count_falls_only_after_a_replica_could_have_gone() {
        let t0 = Instant::now();
        let mut count = ReplicaCount::default();
        assert_eq!(count.observe(2, t0), 2);
        // Redis restarted empty: this replica's first heartbeat sees itself
        // alone; the other is still there and holds its share.
        assert_eq!(count.observe(1, t0 + Duration::from_secs(1)), 2);
        assert_eq!(count.observe(1, t0 + Duration::from_secs(4)), 2);
        // Beyond a replica's lifetime in the set, the lower count is real.
        assert_eq!(count.observe(1, t0 + Duration::from_secs(6)), 1);
        assert_eq!(count.observe(3, t0 + Duration::from_secs(7)), 3);
        assert_eq!(count.observe(0, t0 + Duration::from_secs(20)), 1, "never below one");
    }
}
