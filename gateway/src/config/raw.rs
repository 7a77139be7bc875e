//! The config file exactly as written: serde structs, nothing validated yet.
//!
//! Every struct denies unknown fields, so a typo (`max_concurent`) is an
//! error with its path instead of a setting that silently does nothing.
//! `config::validate` turns these into the typed [`super::Config`].

use indexmap::IndexMap;
use serde::Deserialize;

/// Top level of `tidegate.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Address to listen on, `host:port`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Runtime worker threads; 0 means one per CPU.
    #[serde(default)]
    pub workers: usize,
    /// Largest request body accepted, e.g. `32MiB` or a number of bytes.
    #[serde(default)]
    pub max_body: Option<RawSize>,
    /// Time a client has to send its whole request body.
    #[serde(default)]
    pub body_timeout: Option<String>,
    /// Most client connections open at once; beyond, new ones get a 503.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Largest single SSE event accepted from an upstream.
    #[serde(default)]
    pub max_stream_event: Option<RawSize>,
    /// Request-wide defaults: deadline and retry policy.
    #[serde(default)]
    pub defaults: RawDefaults,
    /// Journal file (SQLite); `off` disables journaling.
    #[serde(default)]
    pub journal: Option<String>,
    /// Journal rows older than this are deleted.
    #[serde(default)]
    pub journal_max_age: Option<String>,
    /// At most this many requests are kept in the journal.
    #[serde(default)]
    pub journal_max_rows: Option<u64>,
    /// Keep the text of streams cut mid-way in the journal.
    #[serde(default)]
    pub keep_partial: Option<bool>,
    /// Serve the Responses WebSocket transport.
    #[serde(default)]
    pub websocket: Option<bool>,
    /// Close a WebSocket idle this long.
    #[serde(default)]
    pub websocket_idle: Option<String>,
    /// Flag a client whose window volume exceeds this × its baseline.
    #[serde(default)]
    pub anomaly_factor: Option<f64>,
    /// ...with at least this many requests in the window.
    #[serde(default)]
    pub anomaly_min_requests: Option<u64>,
    /// Window for the volume comparison.
    #[serde(default)]
    pub anomaly_window: Option<String>,
    /// Key for the `/admin` endpoints; without it they answer 401.
    #[serde(default)]
    pub admin_key: Option<String>,
    /// Shared limit state for several replicas: `redis://host:port/db`.
    #[serde(default)]
    pub state: Option<String>,
    /// How long a replica's concurrency lease lives without renewal.
    #[serde(default)]
    pub state_lease_ttl: Option<String>,
    /// How long a shutdown lets in-flight requests finish.
    #[serde(default)]
    pub shutdown_grace: Option<String>,
    /// How long tidegate remembers which upstream stores a Responses API
    /// response (for `previous_response_id`).
    #[serde(default)]
    pub response_pin_ttl: Option<String>,
    /// How long a conversation stays bound to the account that last
    /// answered it (session affinity).
    #[serde(default)]
    pub affinity_ttl: Option<String>,
    /// Keys clients must present; empty means no client auth (loopback only).
    #[serde(default)]
    pub client_keys: Vec<RawClientKey>,
    /// Lane limits for every client key that sets none of its own.
    #[serde(default)]
    pub client_defaults: RawClientDefaults,
    /// Share of contended slots batch requests get while interactive
    /// ones wait (0..1, default 0.1).
    #[serde(default)]
    pub batch_share: Option<f64>,
    /// OpenTelemetry trace export (off when absent).
    #[serde(default)]
    pub otel: Option<RawOtel>,
    /// Turn the flood warning into a temporary penalty for the key.
    #[serde(default)]
    pub anomaly_action: Option<RawAnomalyAction>,
    /// Without client_keys: Host names and Origins (besides loopback) whose
    /// requests are served.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The providers tidegate forwards to.
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    /// What clients may ask for, mapped to upstream targets.
    #[serde(default)]
    pub models: IndexMap<String, RawModel>,
}

/// `defaults:` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    /// Time budget per request: queueing + waits + attempts.
    #[serde(default)]
    pub deadline: Option<String>,
    /// Retry policy.
    #[serde(default)]
    pub retry: RawRetry,
    /// Commit a waiting stream and send keep-alive comments after this
    /// (`off` disables).
    #[serde(default)]
    pub stream_keepalive_after: Option<String>,
    /// Interval between keep-alive comments.
    #[serde(default)]
    pub stream_keepalive_every: Option<String>,
}

/// `defaults.retry:` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// Attempts per request, the first included.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// First backoff step.
    #[serde(default)]
    pub base_delay: Option<String>,
    /// Largest backoff step.
    #[serde(default)]
    pub max_delay: Option<String>,
    /// Retries may add this fraction of an upstream's recent requests.
    #[serde(default)]
    pub budget_ratio: Option<f64>,
    /// ...plus this many retries per second.
    #[serde(default)]
    pub budget_min_per_second: Option<f64>,
    /// Send `x-should-retry: false` when tidegate gives up.
    #[serde(default)]
    pub stop_client_retries: Option<bool>,
}

/// A `retry:` or `fatal:` rule of an upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Statuses the rule applies to; empty means any.
    #[serde(default)]
    pub on_status: Vec<u16>,
    /// Body substrings, any of which matches.
    #[serde(default)]
    pub on_body_contains: Vec<String>,
    /// Wait between attempts (retry rules only).
    #[serde(default)]
    pub delay: Option<String>,
    /// Attempts when the rule matches (retry rules only).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// What a matching answer means: `capacity` (retry rules' default),
    /// `transient`, `entitlement` or `auth` (this upstream or account
    /// cannot serve; another may), `request` (fatal rules' default).
    #[serde(default)]
    pub class: Option<String>,
}

fn default_listen() -> String {
    "127.0.0.1:8787".to_string()
}

/// A size written as bytes (`1048576`) or with a unit (`32MiB`, `512KiB`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    /// Plain number of bytes.
    Bytes(u64),
    /// Number with a unit.
    Text(String),
}

/// One accepted client key, with its lane (limits and standing).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientKey {
    /// Name recorded in logs and the journal instead of the key.
    pub name: String,
    /// The key itself (use `${ENV_VAR}`).
    pub key: String,
    /// Requests of this key served at once (across all upstreams).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Requests per minute for this key.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute for this key.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Requests of this key allowed to wait in its lane.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// Share of contended slots relative to other keys.
    #[serde(default)]
    pub weight: Option<u32>,
    /// `interactive` or `batch`: the default and the most a request may ask.
    #[serde(default)]
    pub priority: Option<String>,
    /// Limits of this key per model alias (the key as written in `models`).
    #[serde(default)]
    pub models: IndexMap<String, RawLaneLimits>,
    /// Default deadline of this key's requests (an agent waits minutes,
    /// a chat app seconds); replaces the alias's.
    #[serde(default)]
    pub deadline: Option<String>,
    /// Keys of one group share what tidegate keeps for them (Responses
    /// conversations, pins, session bindings); a key without one sees
    /// only its own.
    #[serde(default)]
    pub group: Option<String>,
}

/// Limits applied to every client key that does not set its own.
///
/// The same fields stand on [`RawClientKey`] and (the limits) on
/// [`RawLaneLimits`]: serde's `flatten` cannot be combined with
/// `deny_unknown_fields`, and a misspelt limit must stay an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientDefaults {
    /// Requests of a key served at once.
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Requests per minute per key.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute per key.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Requests of a key allowed to wait in its lane.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// Weight of a key.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Priority of a key.
    #[serde(default)]
    pub priority: Option<String>,
    /// Default deadline of a key's requests (and of requests without a
    /// key) that sets none of its own.
    #[serde(default)]
    pub deadline: Option<String>,
}

/// A key's limits for one model alias.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLaneLimits {
    /// Requests served at once.
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Requests per minute.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Requests allowed to wait.
    #[serde(default)]
    pub max_queue: Option<usize>,
}

/// What a flagged flood does to its key (opt-in).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnomalyAction {
    /// Lower the key's priority to this while the penalty lasts.
    #[serde(default)]
    pub priority: Option<String>,
    /// Cap the key's concurrent requests at this while the penalty lasts.
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// How long the penalty lasts after the last flagged request.
    #[serde(default)]
    pub r#for: Option<String>,
}

/// One upstream provider endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Unique name used by model targets, logs and headers.
    pub name: String,
    /// Wire protocol: `openai`, `openai-chat` (chat completions only) or
    /// `anthropic` (implied by a cloud `kind`).
    #[serde(default)]
    pub protocol: Option<String>,
    /// How it is reached: `anthropic`, `openai` (the default: the
    /// protocol's own API), `bedrock`, `vertex` or `azure`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Base URL as the provider's official SDK takes it (cloud kinds
    /// default to the provider's regional endpoint).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Bedrock and Vertex: the cloud region.
    #[serde(default)]
    pub region: Option<String>,
    /// Bedrock: access key id (default `AWS_ACCESS_KEY_ID`).
    #[serde(default)]
    pub aws_access_key_id: Option<String>,
    /// Bedrock: secret access key (default `AWS_SECRET_ACCESS_KEY`).
    #[serde(default)]
    pub aws_secret_access_key: Option<String>,
    /// Bedrock: session token of temporary credentials (default
    /// `AWS_SESSION_TOKEN`).
    #[serde(default)]
    pub aws_session_token: Option<String>,
    /// Vertex: Google Cloud project id.
    #[serde(default)]
    pub project: Option<String>,
    /// Vertex: service-account key file (JSON).
    #[serde(default)]
    pub credentials_file: Option<String>,
    /// Vertex: a command that prints an access token.
    #[serde(default)]
    pub token_command: Option<String>,
    /// Vertex: how long a `token_command` token is used.
    #[serde(default)]
    pub token_command_ttl: Option<String>,
    /// Azure: `api-version` (absent or `v1`: the v1 API).
    #[serde(default)]
    pub api_version: Option<String>,
    /// Azure: the deployment (default: the target's model name).
    #[serde(default)]
    pub deployment: Option<String>,
    /// Provider key (use `${ENV_VAR}`); empty sends no auth header.
    #[serde(default)]
    pub api_key: String,
    /// Static headers added to every request to this upstream.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Send `Connection: close` and never pool connections.
    #[serde(default)]
    pub connection_close: bool,
    /// `anthropic-version` sent when the client sent none.
    #[serde(default)]
    pub anthropic_version: Option<String>,
    /// Time allowed to open a TCP (and TLS) connection.
    #[serde(default)]
    pub connect_timeout: Option<String>,
    /// Time allowed from sending the request to the response headers.
    #[serde(default)]
    pub header_timeout: Option<String>,
    /// Longest silence allowed between two body chunks.
    #[serde(default)]
    pub stream_idle_timeout: Option<String>,
    /// Concurrent requests allowed; beyond, requests queue.
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Requests allowed to wait for a slot.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// A slot frees this long after its request ended.
    #[serde(default)]
    pub slot_release_delay: Option<String>,
    /// Requests per minute.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Learn a concurrency limit from "concurrency limit" answers.
    #[serde(default)]
    pub adaptive: Option<bool>,
    /// Ceiling of the learned limit when `max_concurrent` is not set.
    #[serde(default)]
    pub adaptive_max: Option<u32>,
    /// Consecutive transient/auth/entitlement failures that open the breaker.
    #[serde(default)]
    pub breaker_failures: Option<u32>,
    /// First open period of the breaker.
    #[serde(default)]
    pub breaker_cooldown: Option<String>,
    /// Longest open period of the breaker.
    #[serde(default)]
    pub breaker_max_cooldown: Option<String>,
    /// Answers to retry although the built-in classification would not.
    #[serde(default)]
    pub retry: Vec<RawRule>,
    /// Answers never to retry.
    #[serde(default)]
    pub fatal: Vec<RawRule>,
    /// Several credentials of this one provider, each with its own
    /// limits and health (a pool); requests go to the one with room.
    #[serde(default)]
    pub accounts: Vec<RawAccount>,
    /// A pool's choice between accounts with room: `most-room` (the
    /// default) or `reset-first` (the one whose subscription window resets
    /// soonest, so capacity that would expire is used first).
    #[serde(default)]
    pub pick: Option<String>,
    /// A pool's reserve: an account past this share of its longest
    /// subscription window (`90%`) serves interactive requests only.
    #[serde(default)]
    pub reserve: Option<String>,
}

/// One account of a pooled upstream: its credential and its own limits;
/// whatever it leaves out is the upstream's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccount {
    /// Reported name (in the admin API, metrics and journal as
    /// `upstream/name`); never the key.
    pub name: String,
    /// This account's provider key.
    #[serde(default)]
    pub api_key: Option<String>,
    /// This account's concurrency cap, when known.
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// This account's requests per minute.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// This account's tokens per minute.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Headers added (or replaced) for this account.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Bedrock: this account's access key id.
    #[serde(default)]
    pub aws_access_key_id: Option<String>,
    /// Bedrock: this account's secret access key.
    #[serde(default)]
    pub aws_secret_access_key: Option<String>,
    /// Bedrock: this account's session token.
    #[serde(default)]
    pub aws_session_token: Option<String>,
    /// Vertex: this account's project.
    #[serde(default)]
    pub project: Option<String>,
    /// Vertex: this account's service-account key file.
    #[serde(default)]
    pub credentials_file: Option<String>,
    /// Vertex: this account's token command.
    #[serde(default)]
    pub token_command: Option<String>,
}

/// A model alias clients can ask for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// Equivalent targets, in failover order.
    pub targets: Vec<RawTarget>,
    /// Deadline for this alias, overriding `defaults.deadline`.
    #[serde(default)]
    pub deadline: Option<String>,
    /// Continue a text stream that broke mid-way instead of failing it.
    #[serde(default)]
    pub stream_resume: bool,
    /// `failover` (in order) or `balance` (least loaded).
    #[serde(default)]
    pub strategy: Option<String>,
    /// `session` (the default: keep a conversation on the account that
    /// holds its prompt cache) or `off`.
    #[serde(default)]
    pub affinity: Option<String>,
}

/// One `{upstream, model}` pair.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    /// Name of an entry in `upstreams`.
    pub upstream: String,
    /// Model name sent upstream; omitted means the alias itself.
    #[serde(default)]
    pub model: Option<String>,
    /// Relative share under `strategy: balance`.
    #[serde(default)]
    pub weight: Option<u32>,
    /// `false`: this target serves only clients of its own protocol (no
    /// translation to reach it).
    #[serde(default)]
    pub translate: Option<bool>,
}

/// `otel:` section: OTLP/HTTP trace export.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtel {
    /// Collector URL (`http://127.0.0.1:4318`; `/v1/traces` is added).
    pub endpoint: String,
    /// `service.name` of the exported spans.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Headers on every export (use `${ENV_VAR}` for tokens).
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Longest time a finished span waits before it is exported.
    #[serde(default)]
    pub export_every: Option<String>,
}
