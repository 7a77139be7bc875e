//! Configuration: YAML file → interpolated tree → raw serde structs →
//! validated, typed [`Config`].
//!
//! Each stage reports problems with the field path that caused them
//! (`upstreams[1].base_url: not a URL`), and validation collects every
//! problem it finds instead of stopping at the first, so `tidegate check`
//! shows the whole list at once.

mod env;
mod fields;
pub mod kinds;
pub mod lanes;
pub mod raw;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use indexmap::IndexMap;

use crate::anomaly::AnomalyConfig;
use crate::classify::Rules;
use crate::health::BreakerConfig;
use crate::ids::{RouteId, UpstreamId};
use crate::journal::Retention;
use crate::limits::LimitConfig;
use crate::protocol::Family;
use crate::retry::Policy;

pub use kinds::{AzureConfig, BedrockConfig, GoogleAuth, UpstreamKind, VertexConfig};
pub use lanes::{AnomalyAction, LaneConfig, LaneLimits};
pub use validate::parse_size;

/// The commented config `tidegate serve` writes when none exists.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

/// Default `max_body`: big enough for long contexts with images.
pub const DEFAULT_MAX_BODY: usize = 32 * 1024 * 1024;

/// A validated configuration, ready to serve.
#[derive(Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Runtime worker threads (0 = one per CPU).
    pub workers: usize,
    /// Largest accepted request body in bytes.
    pub max_body: usize,
    /// Time a client has to send its whole request body.
    pub body_timeout: Duration,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Largest single SSE event accepted from an upstream.
    pub max_stream_event: usize,
    /// Accepted client keys; empty disables client auth (loopback only).
    pub client_keys: Vec<ClientKey>,
    /// `client_defaults.deadline`: the default deadline of requests
    /// without a client key (keys carry theirs in their lane).
    pub client_deadline: Option<Duration>,
    /// Share of contended slots batch requests get while interactive ones
    /// wait too.
    pub batch_share: f64,
    /// OpenTelemetry trace export; `None`: off.
    pub otel: Option<OtelConfig>,
    /// What a flagged flood does to its key; `None`: it only warns.
    pub anomaly_action: Option<AnomalyAction>,
    /// Without client keys: Hosts and Origins served besides loopback.
    pub allowed_origins: Vec<String>,
    /// Key for `/admin`; `None` disables it.
    pub admin_key: Option<Secret>,
    /// Redis URL for limits shared by replicas (may hold a password).
    pub state: Option<Secret>,
    /// Lease lifetime without renewal in shared state.
    pub state_lease_ttl: Duration,
    /// How long a shutdown lets in-flight requests finish.
    pub shutdown_grace: Duration,
    /// How long a stored response stays pinned to its upstream.
    pub response_pin_ttl: Duration,
    /// How long a session stays bound to the target that last answered it.
    pub affinity_ttl: Duration,
    /// Journal file; `None` when journaling is off.
    pub journal: Option<PathBuf>,
    /// Journal retention.
    pub retention: Retention,
    /// Keep partial stream text in the journal.
    pub keep_partial: bool,
    /// Serve Codex's Responses WebSocket transport (else `426`, and Codex
    /// uses HTTP).
    pub websocket: bool,
    /// A WebSocket with no message for this long is closed.
    pub websocket_idle: Duration,
    /// Flood warning thresholds.
    pub anomaly: AnomalyConfig,
    /// Upstreams, in config order; targets refer to them by index.
    pub upstreams: Vec<UpstreamConfig>,
    /// Model aliases in config order; a key with `*` is a pattern.
    pub models: IndexMap<String, ModelRoute>,
    /// Indices of the pattern keys in `models`, in the order they are
    /// tried: longer literal prefix first, then config order.
    pub patterns: Vec<usize>,
    /// Retry policy for every request.
    pub retry: Policy,
    /// Retry budget: fraction of recent requests.
    pub budget_ratio: f64,
    /// Retry budget: floor in retries per second.
    pub budget_min_per_second: f64,
    /// Answer `x-should-retry: false` when giving up.
    pub stop_client_retries: bool,
    /// Commit a waiting stream after this long (`None`: never).
    pub stream_keepalive_after: Option<Duration>,
    /// Interval between keep-alive comments.
    pub stream_keepalive_every: Duration,
}

/// `otel:` as configured (see [`crate::otel`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OtelConfig {
    /// Full OTLP/HTTP traces URL (`…/v1/traces`).
    pub endpoint: String,
    /// `service.name` of the resource.
    pub service_name: String,
    /// Extra headers on every export (e.g. a collector's auth token).
    pub headers: Vec<(String, Secret)>,
    /// Longest time a finished span waits before it is exported.
    pub export_every: Duration,
}

/// A client key and the name that stands for it everywhere it is reported.
#[derive(Debug)]
pub struct ClientKey {
    /// Reported name.
    pub name: String,
    /// The key; never printed.
    pub key: Secret,
    /// Its limits, weight and priority.
    pub lane: LaneConfig,
}

/// One upstream, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Unique name.
    pub name: String,
    /// Wire protocol it speaks.
    pub protocol: Family,
    /// How it is reached (the provider's own API or a cloud's).
    pub kind: UpstreamKind,
    /// Base URL (trailing `/` removed).
    pub base_url: url::Url,
    /// Provider key; may be empty.
    pub api_key: Secret,
    /// Static headers for every request.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `Connection: close`, no pooling.
    pub connection_close: bool,
    /// `anthropic-version` used when the client sends none.
    pub anthropic_version: HeaderValue,
    /// TCP + TLS connect limit.
    pub connect_timeout: Duration,
    /// Request sent → response headers limit.
    pub header_timeout: Duration,
    /// Longest gap between body chunks.
    pub stream_idle_timeout: Duration,
    /// Operator `retry:` / `fatal:` rules.
    pub rules: Rules,
    /// Concurrency, queue and rate limits.
    pub limits: LimitConfig,
    /// Circuit breaker settings.
    pub breaker: BreakerConfig,
    /// The pool this upstream is one account of (`accounts:`), if any.
    pub pool: Option<PoolMember>,
}

/// An upstream built from one of a pool's `accounts:`: its targets are
/// one group, and the request goes to the account with the most room.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolMember {
    /// The pool's name (the upstream name targets use).
    pub pool: String,
    /// The account's name.
    pub account: String,
    /// How the pool chooses between accounts with room.
    pub pick: PoolPick,
    /// Past this share of its longest window (0 to 1), an account serves
    /// interactive requests only.
    pub reserve: Option<f64>,
}

/// How a pool chooses between accounts with room (`pick:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolPick {
    /// The account with the most free slots.
    #[default]
    MostRoom,
    /// The account whose subscription window resets soonest (accounts
    /// that report none after those that do), then the most room.
    ResetFirst,
}

impl UpstreamConfig {
    /// Whether it serves `endpoint` in that endpoint's own protocol: its
    /// family does, and its kind offers it (Bedrock and Vertex serve
    /// messages only; Azure chat completions, Responses and embeddings).
    pub fn serves(&self, endpoint: crate::protocol::Endpoint) -> bool {
        use crate::protocol::Endpoint;
        match &self.kind {
            UpstreamKind::Direct => self.protocol.serves(endpoint),
            UpstreamKind::Vertex(_) if self.protocol == crate::protocol::Family::Gemini => {
                self.protocol.serves(endpoint)
            }
            UpstreamKind::Bedrock(_) | UpstreamKind::Vertex(_) => endpoint == Endpoint::Messages,
            UpstreamKind::Azure(_) => {
                matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Embeddings | Endpoint::Responses)
            }
        }
    }

    /// How a request to `endpoint` reaches it: in the client's protocol,
    /// translated (when `translate` allows) to a protocol it speaks —
    /// Anthropic messages, else chat completions, else Gemini — or not at
    /// all.
    pub fn way(&self, endpoint: crate::protocol::Endpoint, translate: bool) -> Option<crate::protocol::Way> {
        use crate::protocol::{Endpoint, Protocol, Way};
        if self.serves(endpoint) {
            return Some(Way::Native);
        }
        if !translate || !endpoint.translatable() {
            return None;
        }
        if self.serves(Endpoint::Messages) {
            Some(Way::Translate(Protocol::Anthropic))
        } else if self.serves(Endpoint::ChatCompletions) {
            Some(Way::Translate(Protocol::OpenAiChat))
        } else if self.serves(Endpoint::GenerateContent) {
            Some(Way::Translate(Protocol::Gemini))
        } else {
            None
        }
    }
}

/// What a model alias routes to.
#[derive(Debug)]
pub struct ModelRoute {
    /// Equivalent targets in failover order (never empty).
    pub targets: Vec<Target>,
    /// Time budget per request for this alias.
    pub deadline: Duration,
    /// Continue broken text streams from the text already delivered.
    pub stream_resume: bool,
    /// How targets are chosen.
    pub strategy: Strategy,
    /// Keep each conversation on the target (account) that holds its
    /// prompt cache (`affinity: session`).
    pub affinity: bool,
}

/// How an alias picks among its targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// In order: the first available target.
    Failover,
    /// The least loaded target (in-flight relative to weight × limit).
    Balance,
}

/// One routing target.
#[derive(Debug, Clone)]
pub struct Target {
    /// Which of [`Config::upstreams`].
    pub upstream: UpstreamId,
    /// Model name to send upstream; `None`: the name the client asked for.
    pub model: Option<String>,
    /// Relative share under `balance`.
    pub weight: u32,
    /// Clients of another protocol may reach it translated (`translate:`).
    pub translate: bool,
    /// Targets of one pool share a group (the index of the target as
    /// written): the pick takes the account with the most room.
    pub group: Option<u8>,
}

/// A secret string: `Debug` and `Display` print `***`, so a stray `{:?}` in a
/// log line cannot leak a key; made, it is registered with
/// [`crate::secrets`], so a provider's message that echoes it is scrubbed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        crate::secrets::register(&value);
        Self(value)
    }
    /// The raw value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// True when no secret was configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// Underlying IO error.
        source: std::io::Error,
    },
    /// The file is not valid YAML.
    #[error("not valid YAML: {0}")]
    Yaml(String),
    /// The YAML is valid but its content is not; one line per problem.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

impl ConfigError {
    /// Every problem as its own line (for `tidegate check`).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid(p) => p.clone(),
            other => vec![other.to_string()],
        }
    }
}

impl Config {
    /// Reads and validates a config file, taking `${VAR}` from the process
    /// environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, &|name| std::env::var(name).ok())
    }

    /// Parses and validates config text with an explicit variable lookup
    /// (tests pass their own instead of mutating the process environment).
    pub fn parse(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut tree: yaml_serde::Value = yaml_serde::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        if tree.is_null() {
            tree = yaml_serde::Value::Mapping(Default::default());
        }
        let mut problems = Vec::new();
        env::interpolate(&mut tree, "", lookup, &mut problems);
        let raw: raw::RawConfig = match from_tree(tree) {
            Ok(raw) => raw,
            Err(problem) => {
                problems.push(problem.0);
                return Err(ConfigError::Invalid(problems));
            }
        };
        match validate::validate(raw, lookup, &mut problems) {
            Some(config) if problems.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }

    /// A route by its id: its alias (or pattern) and how it is served.
    pub fn route(&self, id: RouteId) -> Option<(&str, &ModelRoute)> {
        self.models.get_index(id.index()).map(|(alias, route)| (alias.as_str(), route))
    }

    /// The route for the model a client asked for: an exact alias, else the
    /// first pattern that matches (longer literal prefix first).
    pub fn find_route(&self, model: &str) -> Option<(RouteId, &ModelRoute)> {
        if let Some((i, _, route)) = self.models.get_full(model) {
            return Some((RouteId::at(i), route));
        }
        self.patterns.iter().find_map(|&i| {
            let (pattern, route) = self.models.get_index(i)?;
            glob(pattern, model).then_some((RouteId::at(i), route))
        })
    }

    /// What `tidegate check` says about translation: per alias, which
    /// clients reach which targets translated, and which clients it does
    /// not serve at all (every target that could says `translate: false`).
    pub fn translation_report(&self) -> Vec<String> {
        use crate::protocol::{Endpoint, Way};
        let clients = [Endpoint::ChatCompletions, Endpoint::Responses, Endpoint::Messages, Endpoint::GenerateContent];
        let mut lines = Vec::new();
        for (alias, route) in &self.models {
            let mut said = Vec::new();
            for endpoint in clients {
                let ways: Vec<(&str, Option<Way>)> = route
                    .targets
                    .iter()
                    .filter_map(|t| {
                        self.upstreams.get(t.upstream.index()).map(|u| (u.name.as_str(), u.way(endpoint, t.translate)))
                    })
                    .collect();
                let client = endpoint.protocol().name();
                let translated: Vec<String> = ways
                    .iter()
                    .filter_map(|(name, way)| match way {
                        Some(Way::Translate(to)) => Some(format!("{name} ({})", to.name())),
                        _ => None,
                    })
                    .collect();
                if ways.iter().all(|(_, w)| w.is_none()) {
                    said.push(format!("not served to {client} clients"));
                } else if !translated.is_empty() {
                    said.push(format!("{client} clients reach {} translated", translated.join(", ")));
                }
            }
            if !said.is_empty() {
                lines.push(format!("models.{alias}: {}", said.join("; ")));
            }
        }
        lines
    }

    /// Exact aliases, for error messages and `/v1/models` (patterns are
    /// not models a client can list). Every alias is served on every
    /// endpoint: a target of another protocol is reached translated.
    pub fn aliases(&self) -> impl Iterator<Item = &str> {
        self.models.iter().filter(|(name, _)| !is_pattern(name)).map(|(name, _)| name.as_str())
    }
}

/// A `models` key with a `*` is a pattern.
pub fn is_pattern(key: &str) -> bool {
    key.contains('*')
}

/// The characters of a pattern before its first `*`: its precedence.
pub fn literal_prefix(pattern: &str) -> &str {
    pattern.split('*').next().unwrap_or_default()
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (possibly none) and everything else for itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else { return pattern == name };
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One thing wrong with a config (or a scenario file), said as `tidegate
/// check` prints it: the field's path, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Problem(pub String);

/// Deserializes a parsed YAML tree; an error names the field's path
/// (`upstreams[1].base_url: …`). Shared by the config and the simulator's
/// scenario files.
pub fn from_tree<T: serde::de::DeserializeOwned>(tree: yaml_serde::Value) -> Result<T, Problem> {
    serde_path_to_error::deserialize(tree).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner().to_string();
        Problem(if path == "." { inner } else { format!("{path}: {inner}") })
    })
}
