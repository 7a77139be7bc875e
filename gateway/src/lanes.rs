//! Client lanes: what each client key may take of the shared capacity.
//!
//! Every configured key has a lane. A lane with limits (`max_concurrent`,
//! `rpm`, `tpm`, per key and/or per model alias) is a [`Limiter`] of its
//! own in front of the upstreams': a request first enters its key's lane —
//! waiting there, in priority order, when the key is at its limits — and
//! only then joins an upstream's queue. So a key over its limits waits
//! behind itself and never takes an upstream slot or rate budget another
//! key could use; a full lane (`max_queue`) is refused at once with `429`
//! and a `Retry-After`. The lane's pass is held until the request's last
//! byte, and its tpm reservation is settled with the usage the upstream
//! reported.
//!
//! Weight and priority travel with the request as a [`Who`] and order the
//! upstream queues (see [`crate::limits::fair`]). A request may lower its
//! priority with `x-tidegate-priority: batch`, never raise it above its
//! key's. With `anomaly_action`, a key flagged as flooding is penalised —
//! its priority lowered and/or its concurrency capped — until `for` after
//! its last flagged request.
//!
//! With shared state (Redis) a lane's slots and buckets are shared by all
//! replicas (as `client:<name>` and `client:<name>:<alias>`); the penalty
//! is each replica's own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{AnomalyAction, Config, LaneConfig, LaneLimits};
use crate::error::GatewayError;
use crate::ids::RouteId;
use crate::limits::{Limiter, Permit, Priority, Refused, Who};
use crate::shared::SharedState;

/// Every key's lane, by key name.
pub struct Lanes {
    by_name: HashMap<String, Arc<Lane>>,
    /// In config order, for the admin API.
    order: Vec<Arc<Lane>>,
    /// Who a request without a client key is (built once: its name is
    /// shared, not allocated per request).
    anonymous: Who,
}

/// One client key's lane.
pub struct Lane {
    name: Arc<str>,
    config: LaneConfig,
    action: Option<AnomalyAction>,
    batch_share: f64,
    /// The key-wide limiter, when the key has limits (or a penalty may cap
    /// it).
    limiter: Option<Arc<Limiter>>,
    /// Per model alias (route index).
    models: Vec<(RouteId, Arc<Limiter>)>,
    /// Penalised until then.
    penalty: Mutex<Option<Instant>>,
    in_flight: AtomicU32,
}

/// A request's place in its lane, held until its last byte.
pub struct Pass {
    lane: Arc<Lane>,
    permits: Vec<Permit>,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("client", &self.lane.name).finish()
    }
}

impl Pass {
    /// Corrects the lane's tpm reservation with the tokens really used.
    pub fn settle(&mut self, used_tokens: u64) {
        for permit in &mut self.permits {
            permit.settle(used_tokens);
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the admin API and metrics show of a lane.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneSnapshot {
    /// Key name.
    pub name: String,
    /// Requests between entering the lane and their last byte.
    pub in_flight: u32,
    /// Requests waiting in the lane (key and per-model limits).
    pub queued: usize,
    /// Requests and tokens counted in the last minute (when limited).
    pub rate_used: (Option<u64>, Option<u64>),
    /// Priority its requests get now (penalty included).
    pub priority: Priority,
    /// Configured weight.
    pub weight: u32,
    /// Time left of a penalty.
    pub penalised_for: Option<Duration>,
    /// Its limits.
    pub limits: LaneLimits,
}

/// Shared-store name of a key's lane, or of its lane for one alias.
fn shared_name(key: &str, alias: Option<&str>) -> String {
    match alias {
        None => format!("client:{key}"),
        Some(alias) => format!("client:{key}:{alias}"),
    }
}

impl Lanes {
    /// The shared-store names of every limited lane (registered with the
    /// store alongside the upstreams).
    pub fn shared_names(config: &Config) -> Vec<String> {
        let mut names = Vec::new();
        for key in &config.client_keys {
            if key.lane.limits.is_limited() {
                names.push(shared_name(&key.name, None));
            }
            for (route, _) in &key.lane.models {
                if let Some((alias, _)) = config.route(*route) {
                    names.push(shared_name(&key.name, Some(alias)));
                }
            }
        }
        names
    }

    /// Builds every key's lane; keys sharing a name share the first one's.
    /// A lane of `previous` (a config reload) whose settings are unchanged
    /// is kept as it is: its requests in flight and waiting, and its
    /// buckets, carry over.
    pub fn new(config: &Config, shared: Option<&Arc<SharedState>>, previous: Option<&Lanes>) -> Self {
        let mut by_name = HashMap::new();
        let mut order = Vec::new();
        let action = config.anomaly_action.clone();
        let capped_by_action = action.as_ref().is_some_and(|a| a.max_concurrent.is_some());
        for key in &config.client_keys {
            if by_name.contains_key(&key.name) {
                continue;
            }
            let kept = previous
                .and_then(|p| p.get(&key.name))
                .filter(|old| old.config == key.lane && old.action == action && old.batch_share == config.batch_share);
            if let Some(kept) = kept {
                by_name.insert(key.name.clone(), kept.clone());
                order.push(kept.clone());
                continue;
            }
            let build = |limits: &LaneLimits, name: String| {
                let limit_config = limits.limit_config(config.batch_share);
                match shared {
                    Some(state) => Limiter::shared(limit_config, state.clone(), &name),
                    None => Limiter::new(limit_config),
                }
            };
            let limiter = (key.lane.limits.is_limited() || capped_by_action)
                .then(|| build(&key.lane.limits, shared_name(&key.name, None)));
            let models = key
                .lane
                .models
                .iter()
                .filter_map(|(route, limits)| {
                    let (alias, _) = config.route(*route)?;
                    Some((*route, build(limits, shared_name(&key.name, Some(alias)))))
                })
                .collect();
            let lane = Arc::new(Lane {
                name: Arc::from(key.name.as_str()),
                config: key.lane.clone(),
                action: action.clone(),
                batch_share: config.batch_share,
                limiter,
                models,
                penalty: Mutex::new(None),
                in_flight: AtomicU32::new(0),
            });
            by_name.insert(key.name.clone(), lane.clone());
            order.push(lane);
        }
        Self { by_name, order, anonymous: Who::plain("-") }
    }

    /// The lane of key `name` (none without client keys).
    pub fn get(&self, name: &str) -> Option<&Arc<Lane>> {
        self.by_name.get(name)
    }

    /// Who a request without a client key is, at `priority`.
    pub fn anonymous(&self, priority: Priority) -> Who {
        Who { priority, ..self.anonymous.clone() }
    }

    /// Every lane, in config order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.order.iter()
    }

    /// Every limiter the lanes own (for shutdown to wait on their work).
    pub fn limiters(&self) -> impl Iterator<Item = &Arc<Limiter>> {
        self.order.iter().flat_map(|l| l.limiter.iter().chain(l.models.iter().map(|(_, m)| m)))
    }
}

impl Lane {
    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key's default deadline (`client_keys[].deadline`, else
    /// `client_defaults.deadline`), if either is set.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.config.deadline
    }

    /// Whose what this key's requests make tidegate keep is (see
    /// [`crate::kept::Owner`]).
    pub fn owner(&self) -> &Arc<str> {
        &self.config.owner
    }

    /// Who a request of this key is: its weight, and the priority it asked
    /// for (`None`: the key's), never above the key's own nor, during a
    /// penalty, above the penalty's.
    pub fn who(&self, asked: Option<Priority>, now: Instant) -> Who {
        let mut priority = asked.map_or(self.config.priority, |p| p.max(self.config.priority));
        if let Some(lowered) = self.penalised(now).then(|| self.action.as_ref().and_then(|a| a.priority)).flatten() {
            priority = priority.max(lowered);
        }
        Who { name: self.name.clone(), weight: self.config.weight, priority }
    }

    /// Whether a penalty is running; lifts one that ran out.
    fn penalised(&self, now: Instant) -> bool {
        let Ok(mut penalty) = self.penalty.lock() else { return false };
        match *penalty {
            Some(until) if until > now => true,
            Some(_) => {
                *penalty = None;
                if let Some(limiter) = &self.limiter {
                    limiter.set_ceiling(None);
                }
                tracing::info!(client = %self.name, "flood penalty over");
                false
            }
            None => false,
        }
    }

    /// The key was flagged as flooding: with `anomaly_action`, start (or
    /// extend) its penalty. Returns whether a penalty applies.
    pub fn flagged(&self, now: Instant) -> bool {
        let Some(action) = &self.action else { return false };
        let Ok(mut penalty) = self.penalty.lock() else { return false };
        if penalty.is_none() {
            tracing::warn!(client = %self.name, priority = ?action.priority.map(Priority::as_str), max_concurrent = action.max_concurrent, "flood penalty: this key slows down instead of the others");
        }
        *penalty = Some(now + action.lasts);
        if let (Some(limiter), Some(cap)) = (&self.limiter, action.max_concurrent) {
            limiter.set_ceiling(Some(cap));
        }
        true
    }

    /// Enters the lane for a request to model route `route`, waiting (in
    /// priority order) while the key is at its limits, until `deadline`.
    /// Cancel-safe.
    pub async fn enter(
        self: &Arc<Self>,
        who: &Who,
        route: RouteId,
        tokens: u64,
        deadline: Instant,
    ) -> Result<Pass, GatewayError> {
        // `who` (built by `Lane::who`) already lifted a penalty that ran out.
        let started = Instant::now();
        // Empty (no allocation) for a key without limits: most keys.
        let mut permits = Vec::new();
        let per_model = self.models.iter().find(|(r, _)| *r == route).map(|(_, l)| l);
        for limiter in per_model.into_iter().chain(&self.limiter) {
            match limiter.acquire(who, tokens, deadline).await {
                Ok(permit) => permits.push(permit),
                Err(refused) => return Err(self.refusal(limiter, refused, started.elapsed())),
            }
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Pass { lane: self.clone(), permits })
    }

    fn refusal(&self, limiter: &Limiter, refused: Refused, waited: Duration) -> GatewayError {
        let limits = self.limits_text();
        let (message, retry_after) = match refused {
            Refused::QueueFull { queued, retry_after } => (
                format!(
                    "client key {} is at its limits ({limits}) and {queued} of its requests already wait \
                     (max_queue {}); retry after {}s",
                    self.name,
                    self.config.limits.max_queue,
                    retry_after.as_secs().max(1)
                ),
                retry_after,
            ),
            Refused::Deadline { retry_after, .. } => (
                format!(
                    "client key {} is at its limits ({limits}; {} in flight here): the request's deadline came \
                     after {}ms in its lane; retry after {}s",
                    self.name,
                    limiter.in_flight(),
                    waited.as_millis(),
                    retry_after.as_secs().max(1)
                ),
                retry_after,
            ),
        };
        GatewayError::ClientLimit { message, retry_after }
    }

    fn limits_text(&self) -> String {
        let l = &self.config.limits;
        let mut parts = Vec::new();
        if let Some(n) = l.max_concurrent {
            parts.push(format!("max_concurrent {n}"));
        }
        if let Some(n) = l.rpm {
            parts.push(format!("rpm {n}"));
        }
        if let Some(n) = l.tpm {
            parts.push(format!("tpm {n}"));
        }
        if !self.models.is_empty() {
            parts.push("per-model limits".into());
        }
        if self.penalty.lock().is_ok_and(|p| p.is_some()) {
            parts.push("flood penalty".into());
        }
        parts.join(", ")
    }

    /// Requests of this key waiting in its lane.
    pub fn queued(&self) -> usize {
        let own = self.limiter.as_ref().map_or(0, |l| l.snapshot().queued);
        own + self.models.iter().map(|(_, l)| l.snapshot().queued).sum::<usize>()
    }

    /// State for the admin API and metrics.
    pub fn snapshot(&self, now: Instant) -> LaneSnapshot {
        let penalised_for = self.penalty.lock().ok().and_then(|p| *p).map(|until| until.saturating_duration_since(now));
        LaneSnapshot {
            name: self.name.to_string(),
            in_flight: self.in_flight.load(Ordering::Acquire),
            queued: self.queued(),
            rate_used: self.limiter.as_ref().map_or((None, None), |l| l.rate_used()),
            priority: self.who(None, now).priority,
            weight: self.config.weight,
            penalised_for: penalised_for.filter(|d| !d.is_zero()),
            limits: self.config.limits.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(extra: &str) -> Lanes {
        let yaml = format!(
            "listen: 127.0.0.1:0\njournal: \"off\"\n{extra}\nclient_keys:\n  - {{ name: loop, key: k-loop }}\n  - {{ name: ci, key: k-ci, priority: batch, weight: 2 }}\n\
             upstreams:\n  - {{ name: u, protocol: openai, base_url: \"http://127.0.0.1:9/v1\" }}\n\
             models:\n  m: {{ targets: [{{ upstream: u }}] }}\n"
        );
        let config = Config::parse(&yaml, &|_| None).unwrap();
        Lanes::new(&config, None, None)
    }

    #[tokio::test]
    async fn a_request_may_lower_its_priority_never_raise_it() {
        let lanes = lanes("");
        let now = Instant::now();
        let (ide, ci) = (lanes.get("loop").unwrap(), lanes.get("ci").unwrap());
        assert_eq!(ide.who(None, now).priority, Priority::Interactive);
        assert_eq!(ide.who(Some(Priority::Batch), now).priority, Priority::Batch);
        assert_eq!(ci.who(Some(Priority::Interactive), now).priority, Priority::Batch);
        assert_eq!(ci.who(None, now).weight, 2);
        assert!(!ide.flagged(now), "without anomaly_action a flood only warns");
        assert_eq!(ide.who(None, now).priority, Priority::Interactive);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flagged_key_is_slowed_until_the_penalty_ends() {
        let lanes = lanes("anomaly_action: { priority: batch, max_concurrent: 1, for: 10s }");
        let lane = lanes.get("loop").unwrap().clone();
        let soon = || Instant::now() + Duration::from_millis(200);
        let who = lane.who(None, Instant::now());
        let first = lane.enter(&who, RouteId::at(0), 1, soon()).await.unwrap();
        let second = lane.enter(&who, RouteId::at(0), 1, soon()).await.unwrap();
        drop((first, second));
        assert!(lane.flagged(Instant::now()));
        let who = lane.who(None, Instant::now());
        assert_eq!(who.priority, Priority::Batch, "penalty lowers the priority");
        let held = lane.enter(&who, RouteId::at(0), 1, soon()).await.unwrap();
        let refused = lane.enter(&who, RouteId::at(0), 1, soon()).await;
        assert!(
            matches!(&refused, Err(GatewayError::ClientLimit { message, .. }) if message.contains("flood penalty")),
            "capped at 1 during the penalty"
        );
        assert!(lane.snapshot(Instant::now()).penalised_for.is_some());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(lane.who(None, Instant::now()).priority, Priority::Interactive, "penalty over");
        let again = lane.enter(&who, RouteId::at(0), 1, soon()).await;
        assert!(again.is_ok(), "the cap is lifted with it");
        drop((held, again));
        assert_eq!(lane.snapshot(Instant::now()).in_flight, 0);
    }
}
