//! Raw config → typed config, collecting every problem with its field path.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use indexmap::IndexMap;

use super::fields::duration;
use super::lanes::{self, LaneConfig};
use super::raw::{RawAccount, RawConfig, RawRule, RawSize, RawUpstream};
use super::{
    ClientKey, Config, DEFAULT_MAX_BODY, ModelRoute, PoolMember, PoolPick, Secret, Strategy, Target, UpstreamConfig,
};
use crate::anomaly::AnomalyConfig;
use crate::classify::{Class, Rule, Rules};
use crate::health::BreakerConfig;
use crate::journal::Retention;
use crate::limits::LimitConfig;
use crate::retry::Policy;

const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Non-stream answers arrive only after the whole generation: be generous.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(600);
/// Anthropic pings every ~15 s; a minute of silence means a dead stream.
const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);

/// Validates `raw`, pushing `path: problem` lines. Returns a config only
/// when the structure was complete enough to build one; the caller still
/// rejects it if any problem was pushed.
pub fn validate(raw: RawConfig, lookup: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<String>) -> Option<Config> {
    let listen = match raw.listen.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            problems.push(format!("listen: {:?} is not an address like 127.0.0.1:8787", raw.listen));
            None
        }
    };
    let max_body = size("max_body", &raw.max_body, DEFAULT_MAX_BODY, problems);
    if max_body == 0 {
        problems.push("max_body: must be more than 0 (no request would fit)".into());
    }
    let max_stream_event = size("max_stream_event", &raw.max_stream_event, 16 << 20, problems);
    if max_stream_event < 1024 {
        problems.push("max_stream_event: must be at least 1KiB".into());
    }
    let body_timeout = duration("body_timeout", &raw.body_timeout, Duration::from_secs(60), problems);
    let websocket_idle = duration("websocket_idle", &raw.websocket_idle, Duration::from_secs(300), problems);
    let max_connections = raw.max_connections.unwrap_or(10_000);
    if max_connections == 0 {
        problems.push("max_connections: must be more than 0".into());
    }

    let client_keys = client_keys(&raw, problems);
    if let Some(admin) = raw.admin_key.as_deref().filter(|k| !k.is_empty())
        && raw.client_keys.iter().any(|k| k.key == admin)
    {
        problems.push("admin_key: must differ from every client key (a client could read the journal)".into());
    }
    if let Some(addr) = listen
        && client_keys.is_empty()
        && !addr.ip().is_loopback()
    {
        problems.push(format!(
            "client_keys: none configured while listen {addr} is not a loopback address; \
                 add client_keys or listen on 127.0.0.1"
        ));
    }

    if raw.upstreams.is_empty() {
        problems.push("upstreams: at least one upstream is required".into());
    }
    let mut upstreams = Vec::with_capacity(raw.upstreams.len());
    let mut names: HashSet<String> = HashSet::new();
    // Upstreams the config describes (a pool counts one per account).
    let mut expected = 0;
    for (i, u) in raw.upstreams.iter().enumerate() {
        if !names.insert(u.name.clone()) {
            problems.push(format!("upstreams[{i}].name: {:?} is used twice", u.name));
        }
        if u.name.starts_with("client:") {
            problems
                .push(format!("upstreams[{i}].name: {:?} must not start with client: (client lanes' names)", u.name));
        }
        if u.accounts.is_empty() {
            if u.pick.is_some() || u.reserve.is_some() {
                problems
                    .push(format!("upstreams[{i}]: pick and reserve choose between a pool's accounts: add accounts:"));
            }
            expected += 1;
            if let Some(up) = upstream(i, u, lookup, problems) {
                upstreams.push(up);
            }
            continue;
        }
        // A pool: one upstream per account, named `upstream/account`.
        let (pick, reserve) = pool_policy(i, u, problems);
        let mut accounts = HashSet::new();
        for (j, a) in u.accounts.iter().enumerate() {
            let at = format!("upstreams[{i}].accounts[{j}].name");
            if a.name.trim().is_empty() || a.name.contains('/') {
                problems.push(format!("{at}: must be a non-empty name without /"));
                continue;
            }
            if !accounts.insert(a.name.as_str()) {
                problems.push(format!("{at}: {:?} is used twice", a.name));
                continue;
            }
            let member = account(u, a);
            if !names.insert(member.name.clone()) {
                problems.push(format!("{at}: {:?} is also the name of an upstream", member.name));
            }
            expected += 1;
            if let Some(mut up) = upstream(i, &member, lookup, problems) {
                up.pool = Some(PoolMember { pool: u.name.clone(), account: a.name.clone(), pick, reserve });
                up.limits.prove_first = true;
                upstreams.push(up);
            }
        }
    }

    let retention = Retention {
        max_age: duration("journal_max_age", &raw.journal_max_age, Duration::from_secs(30 * 24 * 3600), problems),
        max_rows: raw.journal_max_rows.unwrap_or(1_000_000),
    };
    let fallback_anomaly = AnomalyConfig::default();
    let anomaly = AnomalyConfig {
        factor: raw.anomaly_factor.unwrap_or(fallback_anomaly.factor),
        min_requests: raw.anomaly_min_requests.unwrap_or(fallback_anomaly.min_requests),
        window: duration("anomaly_window", &raw.anomaly_window, fallback_anomaly.window, problems),
    };
    if anomaly.factor.is_nan() || anomaly.factor <= 1.0 {
        problems.push("anomaly_factor: must be above 1".into());
    }
    let d = &raw.defaults;
    let deadline = duration("defaults.deadline", &d.deadline, DEFAULT_DEADLINE, problems);
    let fallback = Policy::default();
    let retry = Policy {
        max_attempts: d.retry.max_attempts.unwrap_or(fallback.max_attempts),
        base_delay: duration("defaults.retry.base_delay", &d.retry.base_delay, fallback.base_delay, problems),
        max_delay: duration("defaults.retry.max_delay", &d.retry.max_delay, fallback.max_delay, problems),
    };
    if retry.max_attempts == 0 {
        problems.push("defaults.retry.max_attempts: must be at least 1".into());
    }
    if retry.max_delay < retry.base_delay {
        problems.push("defaults.retry.max_delay: must not be shorter than base_delay".into());
    }
    let budget_ratio = d.retry.budget_ratio.unwrap_or(0.2);
    let budget_min_per_second = d.retry.budget_min_per_second.unwrap_or(5.0);
    if !(0.0..=10.0).contains(&budget_ratio) {
        problems.push("defaults.retry.budget_ratio: must be between 0 and 10".into());
    }
    if !(0.0..=10_000.0).contains(&budget_min_per_second) {
        problems.push("defaults.retry.budget_min_per_second: must be between 0 and 10000".into());
    }
    let stream_keepalive_after = match d.stream_keepalive_after.as_deref() {
        Some("off") => None,
        other => Some(duration(
            "defaults.stream_keepalive_after",
            &other.map(str::to_owned),
            Duration::from_secs(5),
            problems,
        )),
    };
    let stream_keepalive_every =
        duration("defaults.stream_keepalive_every", &d.stream_keepalive_every, Duration::from_secs(5), problems);
    let models = models(&raw, &upstreams, deadline, problems);
    let patterns = pattern_order(&models, problems);
    let mut client_keys = client_keys;
    let lane_defaults = lanes::defaults(&raw.client_defaults, problems);
    for (i, (key, raw_key)) in client_keys.iter_mut().zip(&raw.client_keys).enumerate() {
        key.lane = lanes::lane(i, raw_key, &lane_defaults, &models, problems);
    }
    for (i, key) in client_keys.iter().enumerate() {
        if let Some(j) = client_keys[..i].iter().position(|k| k.name == key.name && k.lane != key.lane) {
            problems.push(format!(
                "client_keys[{i}]: has the name of client_keys[{j}] but other limits or group (keys sharing a \
                 name share one lane: give them the same limits and group, or different names)"
            ));
        }
    }
    let batch_share = lanes::batch_share(raw.batch_share, problems);
    for u in &mut upstreams {
        u.limits.batch_share = batch_share;
    }
    let anomaly_action = lanes::anomaly_action(raw.anomaly_action.as_ref(), problems);
    let otel = raw.otel.as_ref().map(|o| otel(o, problems));
    let state = match raw.state.as_deref() {
        None | Some("") | Some("memory") => None,
        Some(url) => match crate::shared::check_url(url) {
            Ok(()) => Some(Secret::new(url)),
            Err(why) => {
                problems.push(format!(
                    "state: {why}: a URL like redis://127.0.0.1:6379/0, valkey://…, \
                     redis+cluster://10.0.0.1:6379,10.0.0.2:6379/ (or `memory`)"
                ));
                None
            }
        },
    };
    let state_lease_ttl = duration("state_lease_ttl", &raw.state_lease_ttl, Duration::from_secs(15), problems);
    if state_lease_ttl < Duration::from_secs(1) {
        problems.push("state_lease_ttl: must be at least 1s".into());
    }
    let response_pin_ttl =
        duration("response_pin_ttl", &raw.response_pin_ttl, Duration::from_secs(30 * 24 * 3600), problems);
    let affinity_ttl = duration("affinity_ttl", &raw.affinity_ttl, Duration::from_secs(3600), problems);
    let shutdown_grace = duration("shutdown_grace", &raw.shutdown_grace, Duration::from_secs(30), problems);
    let listen = listen?;
    if upstreams.len() != expected {
        return None;
    }
    Some(Config {
        listen,
        workers: raw.workers,
        max_body,
        body_timeout,
        max_connections,
        max_stream_event,
        admin_key: raw.admin_key.as_deref().filter(|k| !k.is_empty()).map(Secret::new),
        state,
        state_lease_ttl,
        response_pin_ttl,
        affinity_ttl,
        shutdown_grace,
        journal: match raw.journal.as_deref() {
            Some("off") | Some("") => None,
            Some(path) => Some(path.into()),
            None => Some("tidegate.db".into()),
        },
        retention,
        keep_partial: raw.keep_partial.unwrap_or(true),
        websocket: raw.websocket.unwrap_or(true),
        websocket_idle,
        anomaly,
        client_keys,
        client_deadline: lane_defaults.deadline,
        batch_share,
        anomaly_action,
        otel,
        allowed_origins: raw.allowed_origins.clone(),
        upstreams,
        models,
        patterns,
        retry,
        budget_ratio,
        budget_min_per_second,
        stop_client_retries: d.retry.stop_client_retries.unwrap_or(true),
        stream_keepalive_after,
        stream_keepalive_every,
    })
}

fn client_keys(raw: &RawConfig, problems: &mut Vec<String>) -> Vec<ClientKey> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for (i, k) in raw.client_keys.iter().enumerate() {
        if k.name.trim().is_empty() {
            problems.push(format!("client_keys[{i}].name: must not be empty"));
        }
        if k.key.is_empty() {
            problems.push(format!("client_keys[{i}].key: must not be empty"));
        } else if !seen.insert(k.key.as_str()) {
            problems.push(format!("client_keys[{i}].key: the same key is listed twice"));
        }
        keys.push(ClientKey { name: k.name.clone(), key: Secret::new(k.key.clone()), lane: LaneConfig::default() });
    }
    keys
}

/// A pool's `pick:` and `reserve:` (see [`PoolMember`]).
fn pool_policy(i: usize, u: &RawUpstream, problems: &mut Vec<String>) -> (PoolPick, Option<f64>) {
    let pick = match u.pick.as_deref() {
        None | Some("most-room") => PoolPick::MostRoom,
        Some("reset-first") => PoolPick::ResetFirst,
        Some(other) => {
            problems.push(format!("upstreams[{i}].pick: {other:?} is not most-room or reset-first"));
            PoolPick::MostRoom
        }
    };
    let reserve = u.reserve.as_deref().and_then(|r| {
        let share = r.trim().strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).map(|p| p / 100.0);
        let share = share.filter(|s| (0.0..=1.0).contains(s) && *s > 0.0);
        if share.is_none() {
            problems.push(format!("upstreams[{i}].reserve: {r:?} is not a share like 90%"));
        }
        share
    });
    (pick, reserve)
}

/// The upstream one account of a pool stands for: the pool's settings
/// with the account's name (`pool/account`), credential and limits.
fn account(pool: &RawUpstream, a: &RawAccount) -> RawUpstream {
    let mut member = pool.clone();
    member.accounts = Vec::new();
    member.name = format!("{}/{}", pool.name, a.name);
    if let Some(key) = &a.api_key {
        member.api_key = key.clone();
    }
    for (name, value) in &a.headers {
        member.headers.insert(name.clone(), value.clone());
    }
    member.max_concurrent = a.max_concurrent.or(pool.max_concurrent);
    member.rpm = a.rpm.or(pool.rpm);
    member.tpm = a.tpm.or(pool.tpm);
    let or = |own: &Option<String>, shared: &Option<String>| own.clone().or_else(|| shared.clone());
    member.aws_access_key_id = or(&a.aws_access_key_id, &pool.aws_access_key_id);
    member.aws_secret_access_key = or(&a.aws_secret_access_key, &pool.aws_secret_access_key);
    member.aws_session_token = or(&a.aws_session_token, &pool.aws_session_token);
    member.project = or(&a.project, &pool.project);
    member.credentials_file = or(&a.credentials_file, &pool.credentials_file);
    member.token_command = or(&a.token_command, &pool.token_command);
    member
}

fn upstream(
    i: usize,
    u: &RawUpstream,
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> Option<UpstreamConfig> {
    let at = |field: &str| format!("upstreams[{i}].{field}");
    let mut ok = true;
    if u.name.trim().is_empty() {
        problems.push(format!("{}: must not be empty", at("name")));
        ok = false;
    }
    let reached = super::kinds::kind(i, u, lookup, problems);
    // A missing base_url was reported by `kind` (cloud kinds have defaults).
    let written = reached.as_ref().and_then(|(_, _, url)| url.clone()).or_else(|| u.base_url.clone());
    let base_url = match written.as_deref().map(url::Url::parse) {
        None => None,
        Some(Ok(url)) if !url.username().is_empty() || url.password().is_some() => {
            problems.push(format!(
                "{}: must not hold a user or password (put the key in api_key, other credentials in headers)",
                at("base_url")
            ));
            None
        }
        Some(Ok(url)) if url.query().is_some() || url.fragment().is_some() => {
            problems.push(format!(
                "{}: must not have a ?query or #fragment (tidegate appends the endpoint path, which would lose them)",
                at("base_url")
            ));
            None
        }
        Some(Ok(url)) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Some(trim_slash(url)),
        Some(_) => {
            let written = written.unwrap_or_default();
            problems.push(format!("{}: {written:?} is not a URL (http:// or https://)", at("base_url")));
            None
        }
    };
    if HeaderValue::try_from(format!("Bearer {}", u.api_key)).is_err() {
        problems.push(format!(
            "{}: holds characters that cannot be sent in a header (a newline or control character?)",
            at("api_key")
        ));
        ok = false;
    }
    let mut headers = Vec::new();
    for (name, value) in &u.headers {
        match (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
            (Ok(n), Ok(mut v)) => {
                v.set_sensitive(true);
                // Credentials put in headers are secrets for scrubbing too
                // (other values, such as a version date, are not).
                let lower = n.as_str();
                if ["auth", "key", "token", "secret", "cookie", "password"].iter().any(|w| lower.contains(w)) {
                    crate::secrets::register(value);
                }
                headers.push((n, v));
            }
            _ => {
                problems.push(format!("{}: {name:?} is not a valid header name and value", at("headers")));
                ok = false;
            }
        }
    }
    let version = u.anthropic_version.as_deref().unwrap_or(DEFAULT_ANTHROPIC_VERSION);
    let anthropic_version = HeaderValue::try_from(version).ok().or_else(|| {
        problems.push(format!("{}: not a valid header value", at("anthropic_version")));
        None
    });
    let before = problems.len();
    let connect_timeout = duration(&at("connect_timeout"), &u.connect_timeout, DEFAULT_CONNECT_TIMEOUT, problems);
    let header_timeout = duration(&at("header_timeout"), &u.header_timeout, DEFAULT_HEADER_TIMEOUT, problems);
    let stream_idle_timeout =
        duration(&at("stream_idle_timeout"), &u.stream_idle_timeout, DEFAULT_STREAM_IDLE_TIMEOUT, problems);
    let rules = Rules {
        retry: u.retry.iter().enumerate().map(|(j, r)| rule(&at(&format!("retry[{j}]")), r, false, problems)).collect(),
        fatal: u.fatal.iter().enumerate().map(|(j, r)| rule(&at(&format!("fatal[{j}]")), r, true, problems)).collect(),
    };
    let fallback = LimitConfig::default();
    let limits = LimitConfig {
        max_concurrent: u.max_concurrent,
        adaptive: u.adaptive.unwrap_or(fallback.adaptive),
        adaptive_max: u.adaptive_max.unwrap_or(fallback.adaptive_max),
        max_queue: u.max_queue.unwrap_or(fallback.max_queue),
        slot_release_delay: match &u.slot_release_delay {
            None => Duration::ZERO,
            Some(_) => duration(&at("slot_release_delay"), &u.slot_release_delay, Duration::ZERO, problems),
        },
        rpm: u.rpm,
        tpm: u.tpm,
        // Set once the top level's `batch_share` is read.
        batch_share: fallback.batch_share,
        // Set for a pool's accounts.
        prove_first: false,
    };
    for (field, zero) in [
        ("max_concurrent", u.max_concurrent == Some(0)),
        ("adaptive_max", u.adaptive_max == Some(0)),
        ("rpm", u.rpm == Some(0)),
        ("tpm", u.tpm == Some(0)),
    ] {
        if zero {
            problems.push(format!("{}: must be at least 1", at(field)));
        }
    }
    let fallback_breaker = BreakerConfig::default();
    let breaker = BreakerConfig {
        failures: u.breaker_failures.unwrap_or(fallback_breaker.failures).max(1),
        cooldown: duration(&at("breaker_cooldown"), &u.breaker_cooldown, fallback_breaker.cooldown, problems),
        max_cooldown: duration(
            &at("breaker_max_cooldown"),
            &u.breaker_max_cooldown,
            fallback_breaker.max_cooldown,
            problems,
        ),
    };
    ok &= problems.len() == before;
    if !ok {
        return None;
    }
    let (protocol, kind, _) = reached?;
    Some(UpstreamConfig {
        name: u.name.clone(),
        protocol,
        kind,
        base_url: base_url?,
        api_key: Secret::new(u.api_key.clone()),
        headers,
        connection_close: u.connection_close,
        anthropic_version: anthropic_version?,
        connect_timeout,
        header_timeout,
        stream_idle_timeout,
        rules,
        limits,
        breaker,
        pool: None,
    })
}

fn rule(path: &str, r: &RawRule, fatal: bool, problems: &mut Vec<String>) -> Rule {
    if r.on_status.is_empty() && r.on_body_contains.iter().all(String::is_empty) {
        problems.push(format!("{path}: needs on_status or a non-empty on_body_contains (it would match every answer)"));
    }
    if fatal && (r.delay.is_some() || r.max_attempts.is_some()) {
        problems.push(format!("{path}: a fatal rule forbids retrying, so delay and max_attempts do not apply"));
    }
    if r.max_attempts == Some(0) {
        problems.push(format!("{path}.max_attempts: must be at least 1 (1 disables the rule)"));
    }
    let delay = r.delay.as_ref().and_then(|text| match humantime::parse_duration(text) {
        Ok(d) => Some(d),
        Err(_) => {
            problems.push(format!("{path}.delay: {text:?} is not a duration like 10s or 500ms"));
            None
        }
    });
    let class = r.class.as_deref().and_then(|name| {
        let class = Class::parse(name);
        match class {
            None => problems.push(format!(
                "{path}.class: {name:?} is not one of capacity, transient, entitlement, auth, request"
            )),
            Some(Class::Capacity | Class::Transient) if fatal => problems.push(format!(
                "{path}.class: a fatal rule stops the request, so it cannot be {name} (write it as a retry rule)"
            )),
            Some(Class::Request) if !fatal => problems.push(format!(
                "{path}.class: a request error is never retried (write it as a fatal rule)"
            )),
            Some(Class::Auth | Class::Entitlement) if r.delay.is_some() || r.max_attempts.is_some() => {
                problems.push(format!(
                    "{path}.class: {name} moves the request to another target at once, so delay and max_attempts do not apply"
                ))
            }
            Some(_) => {}
        }
        class
    });
    Rule {
        on_status: r.on_status.clone(),
        on_body_contains: r.on_body_contains.clone(),
        delay,
        max_attempts: r.max_attempts,
        class,
    }
}

fn trim_slash(mut url: url::Url) -> url::Url {
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    url
}

fn models(
    raw: &RawConfig,
    upstreams: &[UpstreamConfig],
    default_deadline: Duration,
    problems: &mut Vec<String>,
) -> IndexMap<String, ModelRoute> {
    if raw.models.is_empty() {
        problems.push("models: at least one model alias is required".into());
    }
    let known = || raw.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>().join(", ");
    let mut out = IndexMap::new();
    for (alias, model) in &raw.models {
        if model.targets.is_empty() {
            problems.push(format!("models.{alias}.targets: at least one target is required"));
            continue;
        }
        if model.targets.len() > 64 {
            problems.push(format!("models.{alias}.targets: at most 64 targets"));
            continue;
        }
        let mut targets = Vec::new();
        for (j, t) in model.targets.iter().enumerate() {
            // A pool's target stands for one target per account, a group.
            let members: Vec<usize> = upstreams
                .iter()
                .enumerate()
                .filter(|(_, u)| u.pool.as_ref().is_some_and(|p| p.pool == t.upstream))
                .map(|(k, _)| k)
                .collect();
            let position = upstreams.iter().position(|u| u.name == t.upstream);
            let (members, group) = match position {
                Some(idx) => (vec![idx], None),
                None if !members.is_empty() => (members, Some(j as u8)),
                None => (Vec::new(), None),
            };
            if members.is_empty() {
                // An upstream that is listed but invalid has its own
                // problems above; only a name nobody listed is unknown.
                if !raw.upstreams.iter().any(|u| u.name == t.upstream) {
                    problems.push(format!(
                        "models.{alias}.targets[{j}].upstream: unknown upstream {:?} (known: {})",
                        t.upstream,
                        known()
                    ));
                }
                continue;
            }
            if t.model.as_deref() == Some("") {
                problems.push(format!("models.{alias}.targets[{j}].model: must not be empty"));
            }
            // No `model`: the name the client asked for (the alias itself,
            // or whatever name a pattern matched).
            if t.weight == Some(0) {
                problems.push(format!(
                    "models.{alias}.targets[{j}].weight: must be at least 1 (remove the target to send it nothing)"
                ));
            }
            for idx in members {
                targets.push(Target {
                    upstream: crate::ids::UpstreamId::at(idx),
                    model: t.model.clone(),
                    weight: t.weight.unwrap_or(1).max(1),
                    translate: t.translate.unwrap_or(true),
                    group,
                });
            }
        }
        if targets.len() > 64 {
            problems.push(format!("models.{alias}.targets: at most 64 targets (a pool counts one per account)"));
            continue;
        }
        let deadline = duration(&format!("models.{alias}.deadline"), &model.deadline, default_deadline, problems);
        let strategy = match model.strategy.as_deref() {
            None | Some("failover") => Strategy::Failover,
            Some("balance") => Strategy::Balance,
            Some(other) => {
                problems.push(format!("models.{alias}.strategy: {other:?} is not one of failover, balance"));
                Strategy::Failover
            }
        };
        let affinity = match model.affinity.as_deref() {
            None | Some("session") => true,
            Some("off") => false,
            Some(other) => {
                problems.push(format!("models.{alias}.affinity: {other:?} is not one of session, off"));
                true
            }
        };
        if !targets.is_empty() {
            let stream_resume = model.stream_resume;
            out.insert(alias.clone(), ModelRoute { targets, deadline, stream_resume, strategy, affinity });
        }
    }
    out
}

/// The pattern keys of `models` in the order they are tried (longer
/// literal prefix first, then config order), and a problem for each
/// pattern that can never match: one that an earlier-tried `prefix*`
/// with the same literal prefix already covers.
fn pattern_order(models: &IndexMap<String, ModelRoute>, problems: &mut Vec<String>) -> Vec<usize> {
    use super::{is_pattern, literal_prefix};
    let mut order: Vec<usize> = models.keys().enumerate().filter(|(_, k)| is_pattern(k)).map(|(i, _)| i).collect();
    let prefix_len = |i: usize| models.get_index(i).map_or(0, |(k, _)| literal_prefix(k).len());
    order.sort_by_key(|&i| std::cmp::Reverse(prefix_len(i)));
    for (n, &i) in order.iter().enumerate() {
        let Some((key, _)) = models.get_index(i) else { continue };
        let covered_by = order[..n].iter().filter_map(|&j| models.get_index(j)).find(|(earlier, _)| {
            let prefix = literal_prefix(earlier);
            earlier.len() == prefix.len() + 1
                && earlier.ends_with('*')
                && key.starts_with(prefix)
                && literal_prefix(key).len() == prefix.len()
        });
        if let Some((earlier, _)) = covered_by {
            problems.push(format!(
                "models.{key}: this pattern can never match: {earlier:?} comes first and matches every name it does \
                 (patterns with the same literal prefix are tried in config order)"
            ));
        }
    }
    order
}

/// A size field: bytes or a number with a unit; `default` when absent.
fn size(path: &str, raw: &Option<RawSize>, default: usize, problems: &mut Vec<String>) -> usize {
    match raw {
        None => default,
        Some(RawSize::Bytes(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
        Some(RawSize::Text(t)) => parse_size(t).unwrap_or_else(|| {
            problems.push(format!("{path}: {t:?} is not a size like 32MiB"));
            default
        }),
    }
}

/// Parses `32MiB`, `512KiB`, `1GiB`, `10MB`, `2048` into bytes.
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().ok()?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn otel(raw: &super::raw::RawOtel, problems: &mut Vec<String>) -> super::OtelConfig {
    let endpoint = match url::Url::parse(&raw.endpoint) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => {
            let base = u.as_str().trim_end_matches('/');
            if base.ends_with("/v1/traces") { base.to_string() } else { format!("{base}/v1/traces") }
        }
        _ => {
            problems
                .push(format!("otel.endpoint: {:?} is not an http(s) URL like http://127.0.0.1:4318", raw.endpoint));
            String::new()
        }
    };
    for name in raw.headers.keys() {
        if HeaderName::try_from(name.as_str()).is_err() {
            problems.push(format!("otel.headers: {name:?} is not a valid header name"));
        }
    }
    super::OtelConfig {
        endpoint,
        service_name: raw.service_name.clone().unwrap_or_else(|| "tidegate".to_string()),
        headers: raw.headers.iter().map(|(k, v)| (k.clone(), Secret::new(v.clone()))).collect(),
        export_every: duration("otel.export_every", &raw.export_every, Duration::from_secs(2), problems),
    }
}
