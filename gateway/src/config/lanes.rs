//! Client lanes as configured: per-key limits, weight and priority, the
//! defaults every key inherits, and the opt-in penalty for floods.
//!
//! A key's field wins over `client_defaults`; a field set in neither is
//! unlimited (weight 1, priority `interactive`). Limits per model alias
//! (`models:` on a key) come on top of the key's own.

use std::time::Duration;

use indexmap::IndexMap;

use super::raw::{RawAnomalyAction, RawClientDefaults, RawClientKey, RawLaneLimits};
use crate::limits::{LimitConfig, Priority};

/// Requests of one key that may wait in its lane unless configured.
pub const DEFAULT_LANE_QUEUE: usize = 1024;

/// Limits of a lane: beyond them requests wait in it, within their deadline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LaneLimits {
    /// Requests served at once.
    pub max_concurrent: Option<u32>,
    /// Requests per minute.
    pub rpm: Option<u64>,
    /// Tokens per minute.
    pub tpm: Option<u64>,
    /// Requests allowed to wait; beyond, an immediate 429.
    pub max_queue: usize,
}

impl LaneLimits {
    /// Whether any limit is set (a lane without one costs nothing).
    pub fn is_limited(&self) -> bool {
        self.max_concurrent.is_some() || self.rpm.is_some() || self.tpm.is_some()
    }

    /// The limiter settings that enforce these limits.
    pub fn limit_config(&self, batch_share: f64) -> LimitConfig {
        LimitConfig {
            max_concurrent: self.max_concurrent,
            adaptive: false,
            adaptive_max: u32::MAX,
            max_queue: self.max_queue,
            slot_release_delay: Duration::ZERO,
            rpm: self.rpm,
            tpm: self.tpm,
            batch_share,
            prove_first: false,
        }
    }
}

/// One key's lane.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneConfig {
    /// The key's own limits.
    pub limits: LaneLimits,
    /// Share of contended slots relative to other keys.
    pub weight: u32,
    /// Default priority of the key's requests, and the most they may ask.
    pub priority: Priority,
    /// Limits per model alias, by the alias's index in `models`.
    pub models: Vec<(crate::ids::RouteId, LaneLimits)>,
    /// The key's default deadline (its own, else `client_defaults`'):
    /// replaces the alias's; a request's `x-tidegate-deadline` may only
    /// shorten it.
    pub deadline: Option<Duration>,
    /// Whose the conversations, pins and session bindings it makes are
    /// (`key:<name>`, or `group:<group>` for keys of a `group`): what
    /// another key's requests cannot see.
    pub owner: std::sync::Arc<str>,
}

impl Default for LaneConfig {
    fn default() -> Self {
        Self {
            limits: LaneLimits::default(),
            weight: 1,
            priority: Priority::Interactive,
            models: Vec::new(),
            deadline: None,
            owner: std::sync::Arc::from(""),
        }
    }
}

/// An optional deadline field, checked.
fn deadline(path: &str, raw: &Option<String>, problems: &mut Vec<String>) -> Option<Duration> {
    raw.as_ref().map(|_| super::fields::duration(path, raw, Duration::from_secs(120), problems))
}

/// What a flagged flood does to its key while the penalty lasts.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalyAction {
    /// The key's requests get at most this priority.
    pub priority: Option<Priority>,
    /// The key's concurrent requests are capped at this.
    pub max_concurrent: Option<u32>,
    /// How long after the last flagged request the penalty lasts.
    pub lasts: Duration,
}

fn priority(path: &str, text: Option<&str>, problems: &mut Vec<String>) -> Option<Priority> {
    let text = text?;
    let parsed = Priority::parse(text);
    if parsed.is_none() {
        problems.push(format!("{path}: {text:?} is not a priority (interactive or batch)"));
    }
    parsed
}

fn limits(path: &str, raw: &RawLaneLimits, fallback: &LaneLimits, problems: &mut Vec<String>) -> LaneLimits {
    if raw.max_concurrent == Some(0) {
        problems.push(format!("{path}.max_concurrent: must be at least 1"));
    }
    if raw.rpm == Some(0) {
        problems.push(format!("{path}.rpm: must be at least 1"));
    }
    if raw.tpm == Some(0) {
        problems.push(format!("{path}.tpm: must be at least 1"));
    }
    LaneLimits {
        max_concurrent: raw.max_concurrent.or(fallback.max_concurrent),
        rpm: raw.rpm.or(fallback.rpm),
        tpm: raw.tpm.or(fallback.tpm),
        max_queue: raw.max_queue.unwrap_or(fallback.max_queue),
    }
}

fn weight(path: &str, weight: Option<u32>, problems: &mut Vec<String>) -> Option<u32> {
    let w = weight?;
    if !(1..=1000).contains(&w) {
        problems.push(format!("{path}: must be between 1 and 1000"));
    }
    Some(w.clamp(1, 1000))
}

/// The lane every key starts from (`client_defaults`).
pub fn defaults(raw: &RawClientDefaults, problems: &mut Vec<String>) -> LaneConfig {
    let as_limits =
        RawLaneLimits { max_concurrent: raw.max_concurrent, rpm: raw.rpm, tpm: raw.tpm, max_queue: raw.max_queue };
    let base = LaneLimits { max_queue: DEFAULT_LANE_QUEUE, ..LaneLimits::default() };
    LaneConfig {
        limits: limits("client_defaults", &as_limits, &base, problems),
        weight: weight("client_defaults.weight", raw.weight, problems).unwrap_or(1),
        priority: priority("client_defaults.priority", raw.priority.as_deref(), problems)
            .unwrap_or(Priority::Interactive),
        models: Vec::new(),
        deadline: deadline("client_defaults.deadline", &raw.deadline, problems),
        ..LaneConfig::default()
    }
}

/// Key `i`'s lane: its own fields over the defaults. `aliases` are the
/// keys of `models` (per-alias limits must name one of them).
pub fn lane(
    i: usize,
    raw: &RawClientKey,
    defaults: &LaneConfig,
    aliases: &IndexMap<String, impl Sized>,
    problems: &mut Vec<String>,
) -> LaneConfig {
    let at = format!("client_keys[{i}]");
    let own =
        RawLaneLimits { max_concurrent: raw.max_concurrent, rpm: raw.rpm, tpm: raw.tpm, max_queue: raw.max_queue };
    let mut models = Vec::new();
    for (alias, raw_limits) in &raw.models {
        let path = format!("{at}.models.{alias}");
        let base = LaneLimits { max_queue: DEFAULT_LANE_QUEUE, ..LaneLimits::default() };
        let per = limits(&path, raw_limits, &base, problems);
        match aliases.get_index_of(alias) {
            Some(index) if per.is_limited() => models.push((crate::ids::RouteId::at(index), per)),
            Some(_) => problems.push(format!("{path}: sets no limit (max_concurrent, rpm or tpm)")),
            None => problems.push(format!("{path}: no model {alias:?} is configured")),
        }
    }
    LaneConfig {
        limits: limits(&at, &own, &defaults.limits, problems),
        weight: weight(&format!("{at}.weight"), raw.weight, problems).unwrap_or(defaults.weight),
        priority: priority(&format!("{at}.priority"), raw.priority.as_deref(), problems).unwrap_or(defaults.priority),
        models,
        deadline: deadline(&format!("{at}.deadline"), &raw.deadline, problems).or(defaults.deadline),
        owner: match raw.group.as_deref() {
            Some(group) if group.trim().is_empty() => {
                problems.push(format!("{at}.group: must not be empty (leave it out for a key of its own)"));
                std::sync::Arc::from(format!("key:{}", raw.name))
            }
            Some(group) => std::sync::Arc::from(format!("group:{group}")),
            None => std::sync::Arc::from(format!("key:{}", raw.name)),
        },
    }
}

/// `batch_share`, checked.
pub fn batch_share(raw: Option<f64>, problems: &mut Vec<String>) -> f64 {
    let share = raw.unwrap_or(0.1);
    if !(0.0..=1.0).contains(&share) || share.is_nan() {
        problems.push("batch_share: must be between 0 and 1 (e.g. 0.1: 1 slot in 10)".into());
        return 0.1;
    }
    share
}

/// `anomaly_action`, checked; `None` when not configured.
pub fn anomaly_action(raw: Option<&RawAnomalyAction>, problems: &mut Vec<String>) -> Option<AnomalyAction> {
    let raw = raw?;
    let priority = priority("anomaly_action.priority", raw.priority.as_deref(), problems);
    if raw.max_concurrent == Some(0) {
        problems.push("anomaly_action.max_concurrent: must be at least 1".into());
    }
    if priority.is_none() && raw.max_concurrent.is_none() {
        problems.push("anomaly_action: set priority, max_concurrent or both".into());
    }
    let lasts = super::fields::duration("anomaly_action.for", &raw.r#for, Duration::from_secs(600), problems);
    Some(AnomalyAction { priority, max_concurrent: raw.max_concurrent, lasts })
}
