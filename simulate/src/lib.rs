//! A fake upstream provider speaking every protocol tidegate serves —
//! chat completions, the Responses API, embeddings, Anthropic messages and
//! count_tokens — JSON and SSE.
//!
//! One copy serves the test suite, `tidegate simulate` and the benchmark:
//! tests check what tidegate sent (`received`) and what the upstream saw of
//! the connection (`cancelled`, `max_in_flight`), users point their own
//! clients at it. Behaviour is data ([`Behavior`]) chosen by the model name
//! the request carries, so a scenario is a table, not code.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

pub mod advertise;
mod clouds;
pub mod demo;
pub mod turns;

pub use clouds::{AwsKey, Clouds, GoogleAccount};

use tidegate::protocol::{self, Endpoint, Protocol};
use tidegate::server::listen;

/// How the simulator answers one model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behavior {
    /// Wait before the response headers.
    pub latency_ms: u64,
    /// Content chunks in a stream (and words in a JSON answer).
    pub chunks: usize,
    /// Wait between stream chunks.
    pub chunk_delay_ms: u64,
    /// Answer with this status and `error_body` instead of a completion.
    pub status: Option<u16>,
    /// Body sent with `status`.
    pub error_body: String,
    /// Content type sent with `status`.
    pub error_content_type: String,
    /// Wait between a stream's headers and its first event.
    pub first_chunk_delay_ms: u64,
    /// During `first_chunk_delay_ms`, send an SSE comment (`: ping`) this
    /// often: an upstream that keeps a stream alive without content.
    pub ping_every_ms: Option<u64>,
    /// Make the first content event of a chat stream this many bytes
    /// larger (a huge event; tests of the SSE scanner's limits).
    pub pad_event_bytes: Option<usize>,
    /// Cut the connection after this many stream events (a mid-stream drop).
    pub drop_after: Option<usize>,
    /// Refuse requests whenever more than this many to this model are in
    /// flight, with `over_limit` / `over_limit_stream`.
    pub reject_over: Option<usize>,
    /// The refusal for a request over `reject_over` (default: `429`
    /// "model concurrency limit exceeded", code 3009, no `Retry-After`).
    pub over_limit: Option<Fault>,
    /// The refusal for a *streaming* request over `reject_over` (default:
    /// `over_limit`); e.g. `mode: error_frame` for vendors that answer
    /// `200` and a stream holding only an error.
    pub over_limit_stream: Option<Fault>,
    /// Share of requests refused at random with `fail_with` (seeded by
    /// `SimConfig::seed`, so runs repeat).
    pub fail_rate: f64,
    /// The random refusal (default: `503` "The server is overloaded").
    pub fail_with: Option<Fault>,
    /// Prefix each stream event with a `: ts=<unix µs>` comment taken when
    /// it is sent (for measuring per-event latency through a proxy).
    pub stamp: bool,
    /// Answers for the first requests to this model, in order; once used
    /// up, the behaviour above applies.
    pub script: Vec<Fault>,
    /// Refuse every request to this model with `busy_with` for this long
    /// after its first request (a provider at capacity for a while).
    pub busy_for_ms: Option<u64>,
    /// The refusal while busy (default: `429` "model concurrency limit
    /// exceeded", code 3009, no `Retry-After`).
    pub busy_with: Option<Fault>,
    /// A finished request still counts against `reject_over` for this
    /// long (a provider that frees a session's slot late: what
    /// tidegate's `slot_release_delay` is for). A refused request opened
    /// no session: it stops counting at once.
    pub linger_ms: u64,
}

/// How a scripted fault is delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// An HTTP answer with `status` and `body`.
    #[default]
    Http,
    /// HTTP 200 and an SSE stream whose only event is `body` as an error
    /// (then `[DONE]` for OpenAI).
    ErrorFrame,
    /// HTTP 200, SSE headers, and the stream closes at once.
    EmptyStream,
    /// A normal stream cut (connection dropped) after `status` events.
    DropAfter,
    /// `status` events of a normal stream, then `body` as an error event
    /// (then `[DONE]` for OpenAI).
    ErrorMidStream,
}

/// One scripted answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// How the fault is delivered.
    #[serde(default)]
    pub mode: FaultMode,
    /// HTTP status (for `drop_after`: the number of events sent first).
    #[serde(default)]
    pub status: u16,
    /// Body.
    #[serde(default)]
    pub body: String,
    /// Content type.
    #[serde(default = "json")]
    pub content_type: String,
    /// Extra response headers (`retry-after`, `x-should-retry`, ...).
    #[serde(default)]
    pub headers: HashMap<String, String>,
}

fn json() -> String {
    "application/json".into()
}

impl Fault {
    /// A fault with status and body, JSON content type, no headers.
    pub fn new(status: u16, body: &str) -> Self {
        Self { mode: FaultMode::Http, status, body: body.into(), content_type: json(), headers: HashMap::new() }
    }

    /// A 200 stream whose only event is the error `body`.
    pub fn error_frame(body: &str) -> Self {
        Self { mode: FaultMode::ErrorFrame, ..Self::new(200, body) }
    }

    /// A 200 stream that closes before any event.
    pub fn empty_stream() -> Self {
        Self { mode: FaultMode::EmptyStream, ..Self::new(200, "") }
    }

    /// `events` normal events, then the error `body` as an event.
    pub fn error_mid_stream(events: u16, body: &str) -> Self {
        Self { mode: FaultMode::ErrorMidStream, ..Self::new(events, body) }
    }

    /// A normal stream dropped after `events` events.
    pub fn drop_after(events: u16) -> Self {
        Self { mode: FaultMode::DropAfter, ..Self::new(events, "") }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            chunks: 5,
            chunk_delay_ms: 0,
            status: None,
            error_body: String::new(),
            error_content_type: "application/json".into(),
            first_chunk_delay_ms: 0,
            ping_every_ms: None,
            pad_event_bytes: None,
            drop_after: None,
            reject_over: None,
            over_limit: None,
            over_limit_stream: None,
            fail_rate: 0.0,
            fail_with: None,
            stamp: false,
            script: Vec::new(),
            busy_for_ms: None,
            busy_with: None,
            linger_ms: 0,
        }
    }
}

/// The whole simulator setup (a scenario file has this shape).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// What the scenario shows (printed by `tidegate simulate`).
    pub description: String,
    /// Behaviour for models not listed in `models`.
    pub default: Behavior,
    /// Behaviour per model name.
    pub models: HashMap<String, Behavior>,
    /// Keep every received request (tests); off for benchmarks.
    pub record: bool,
    /// Seed of the random faults (`fail_rate`).
    pub seed: u64,
    /// Credentials the cloud endpoints (Bedrock, Vertex, Azure) insist on.
    pub clouds: Clouds,
    /// Serve chat completions (and embeddings) only, as most
    /// OpenAI-compatible providers do: `/v1/responses` and `/v1/messages`
    /// answer 404.
    pub chat_only: bool,
    /// Answers reason first (`reasoning_content`, thinking blocks).
    pub reasoning: bool,
    /// Each request body received is written here, numbered, named by
    /// its path (`0001-v1-messages.json`).
    pub dump: Option<std::path::PathBuf>,
    /// Per provider key (bearer, `x-api-key` or `x-goog-api-key`): what
    /// that account allows, for pools of accounts behind one base URL.
    pub accounts: HashMap<String, AccountBehavior>,
    /// A prompt cache per account (provider key): a chat or messages
    /// request whose leading messages (system prompt included) the same
    /// account saw within `ttl_ms` reads them cached, reported in the JSON
    /// answer's usage (`prompt_tokens_details.cached_tokens`,
    /// `cache_read_input_tokens`); off when absent.
    pub prompt_cache: Option<PromptCache>,
    /// Rate limits advertised on every answer and enforced (see
    /// [`advertise`]); off when absent.
    pub advertise: Option<advertise::Advertise>,
    /// Keep each request's arrival time per model (`GET /sim/arrivals`):
    /// what a benchmark checks a rate limit against; off by default.
    pub arrivals: bool,
}

/// How the simulator's prompt cache behaves (see [`SimConfig::prompt_cache`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptCache {
    /// How long a prefix stays cached after it was last read.
    pub ttl_ms: u64,
    /// Time added to an answer per 1,000 prompt tokens read uncached (a
    /// prompt is about 4 bytes a token); cached tokens cost a tenth.
    pub uncached_ms_per_1k_tokens: u64,
}

/// What one account (provider key) of the simulator allows.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccountBehavior {
    /// At most this many of its requests in flight (sessions); beyond,
    /// the model's `over_limit` refusal (default `429` code 3009).
    pub max_in_flight: Option<usize>,
    /// Every request of this account is refused so (no plan, a wrong key,
    /// a session limit hours away).
    pub refuse: Option<Fault>,
    /// A subscription's 5-hour and weekly windows, reported on every
    /// answer and refused over (see [`advertise::Windows`]).
    pub windows: Option<advertise::Windows>,
}

/// What one account saw (see [`SimState::account`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccountStats {
    /// Requests that arrived with its key.
    pub requests: usize,
    /// Of those, refused for being over `max_in_flight`.
    pub over_cap: usize,
    /// Of those, refused by `refuse`.
    pub refused: usize,
    /// Requests in flight now.
    pub in_flight: usize,
    /// The most in flight at once, refused ones not counted.
    pub max_in_flight: usize,
    /// Requests that arrived with its key and were served (windows on).
    pub window_served: usize,
    /// Requests refused for a used-up window.
    pub window_refused: usize,
}

/// Named fault scenarios (`tidegate simulate --scenario NAME`, the demo,
/// the tests): each is a [`SimConfig`] written as YAML in
/// `src/simulate/scenarios/`, so a scenario is data.
pub const SCENARIOS: &[(&str, &str)] = &[
    ("healthy", include_str!("scenarios/healthy.yaml")),
    ("capacity", include_str!("scenarios/capacity.yaml")),
    ("overloaded", include_str!("scenarios/overloaded.yaml")),
    ("quirks", include_str!("scenarios/quirks.yaml")),
    ("gemini", include_str!("scenarios/gemini.yaml")),
];

/// Why a simulator config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// No scenario has this name.
    #[error("no scenario {name:?}; scenarios: {}", SCENARIOS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// The YAML does not describe a simulator config.
    #[error("{0}")]
    Invalid(String),
}

impl SimConfig {
    /// A provider refusing `rate` of all requests at random (`fail_with`'s
    /// default: `503` overloaded) after 20 ms, seeded so runs repeat, every
    /// request recorded: the capacity tests' and `bench/capacity.sh`'s.
    pub fn refusing(rate: f64, seed: u64) -> SimConfig {
        SimConfig {
            default: Behavior { fail_rate: rate, latency_ms: 20, ..Default::default() },
            record: true,
            seed,
            ..Default::default()
        }
    }

    /// The named built-in scenario.
    pub fn scenario(name: &str) -> Result<SimConfig, ScenarioError> {
        let (_, text) =
            SCENARIOS.iter().find(|(n, _)| *n == name).ok_or_else(|| ScenarioError::Unknown { name: name.into() })?;
        Self::from_yaml(text)
    }

    /// A simulator config from YAML (the shape of the scenario files);
    /// errors name the field.
    pub fn from_yaml(text: &str) -> Result<SimConfig, ScenarioError> {
        let tree: yaml_serde::Value = yaml_serde::from_str(text).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
        tidegate::config::from_tree(tree).map_err(|p| ScenarioError::Invalid(p.0))
    }
}

/// One request as the simulator received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Request path.
    pub path: String,
    /// Its query, if any (`alt=sse`).
    pub query: Option<String>,
    /// Request headers.
    pub headers: HeaderMap,
    /// Exact body bytes.
    pub body: Bytes,
    /// When it arrived.
    pub at: tokio::time::Instant,
}

/// Counters and recordings, readable while the simulator runs.
#[derive(Default)]
pub struct SimState {
    config: SimConfig,
    received: Mutex<Vec<Received>>,
    served: Mutex<HashMap<String, usize>>,
    rng: Mutex<Option<fastrand::Rng>>,
    /// Per model: requests in flight now, and the most seen.
    per_model: Mutex<HashMap<String, (usize, usize)>>,
    /// Per provider key.
    per_account: Mutex<HashMap<String, AccountStats>>,
    /// The advertised buckets' levels (see [`SimConfig::advertise`]).
    advert_levels: Mutex<HashMap<String, advertise::Levels>>,
    /// What the advertised limits admitted and refused.
    advert_stats: Mutex<advertise::AdvertStats>,
    /// Per provider key: its windows' shares used and when they reset.
    window_levels: Mutex<HashMap<String, advertise::WindowLevels>>,
    /// Requests being answered right now.
    pub in_flight: AtomicUsize,
    /// Highest `in_flight` seen.
    pub max_in_flight: AtomicUsize,
    /// Answers sent to the end.
    pub completed: AtomicUsize,
    /// Requests whose connection closed before the answer was complete.
    pub cancelled: AtomicUsize,
    /// Requests refused by `reject_over`.
    pub rejected: AtomicUsize,
    /// Responses API ids this simulator answered with (its stored state):
    /// a `previous_response_id` it does not hold is refused, as a provider
    /// refuses another account's id.
    stored: Mutex<std::collections::HashSet<String>>,
    next_response: AtomicUsize,
    /// Request bodies dumped so far (`SimConfig::dump`).
    dumped: AtomicUsize,
    /// The Vertex service account tokens are issued to.
    account: Option<clouds::Account>,
    /// Access tokens issued, with their expiry.
    tokens: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Tokens granted by `/token` so far.
    pub token_grants: AtomicUsize,
    /// Every request is answered with this from now on (tests start and
    /// end an outage mid-run with [`SimState::set_outage`]).
    outage: Mutex<Option<Fault>>,
    /// When each model was first asked for (for `busy_for_ms`).
    first_asked: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Requests per model, refused ones included (`/sim/stats`'s `asked`).
    asked: Mutex<HashMap<String, usize>>,
    /// Per model, when each request arrived (ms since the Unix epoch;
    /// with `arrivals: true`, at most [`MOST_ARRIVALS`] a model).
    arrivals: Mutex<HashMap<String, Vec<u64>>>,
    /// Per account: cached prompt prefixes (by hash) and when they expire.
    cache: Mutex<HashMap<String, HashMap<u64, tokio::time::Instant>>>,
    /// Prompt tokens read so far, and how many of them cached.
    pub prompt_tokens: AtomicUsize,
    /// Of [`SimState::prompt_tokens`], the cached ones.
    pub cached_tokens: AtomicUsize,
}

/// A prompt's size and what of it an account had cached.
#[derive(Debug, Clone, Copy, Default)]
struct PromptRead {
    tokens: usize,
    cached: usize,
}

impl SimState {
    /// Reads a request's prompt through `account`'s cache: its leading
    /// messages seen within the TTL are cached; every prefix is cached
    /// (again) after. `None` without a prompt cache or a message list.
    fn read_prompt(&self, account: &str, body: &[u8]) -> Option<PromptRead> {
        use std::hash::{Hash, Hasher};
        let config = self.config.prompt_cache.as_ref()?;
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let mut segments: Vec<String> = Vec::new();
        if let Some(system) = v.get("system") {
            segments.push(system.to_string());
        }
        for m in v.get("messages")?.as_array()? {
            segments.push(m.to_string());
        }
        let now = tokio::time::Instant::now();
        let ttl = Duration::from_millis(config.ttl_ms);
        let mut cache = self.cache.lock().ok()?;
        let seen = cache.entry(account.to_owned()).or_default();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let (mut read, mut prefix_cached) = (PromptRead::default(), true);
        for segment in &segments {
            segment.hash(&mut hasher);
            let h = hasher.finish();
            let tokens = segment.len().div_ceil(4);
            read.tokens += tokens;
            prefix_cached &= seen.get(&h).is_some_and(|until| *until > now);
            if prefix_cached {
                read.cached += tokens;
            }
            seen.insert(h, now + ttl);
        }
        self.prompt_tokens.fetch_add(read.tokens, Ordering::Relaxed);
        self.cached_tokens.fetch_add(read.cached, Ordering::Relaxed);
        Some(read)
    }
}

/// Writes what a prompt read into a JSON answer's usage, in the
/// protocol's words.
fn with_usage(protocol: Protocol, answer: String, read: PromptRead) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&answer) else { return answer };
    let Some(usage) = v.get_mut("usage").and_then(|u| u.as_object_mut()) else { return answer };
    match protocol {
        Protocol::Anthropic => {
            usage.insert("input_tokens".into(), (read.tokens - read.cached).into());
            usage.insert("cache_read_input_tokens".into(), read.cached.into());
        }
        _ => {
            usage.insert("prompt_tokens".into(), read.tokens.into());
            usage.insert("prompt_tokens_details".into(), serde_json::json!({ "cached_tokens": read.cached }));
        }
    }
    v.to_string()
}

impl SimState {
    /// The most requests to `model` that were in flight at once.
    pub fn max_in_flight_of(&self, model: &str) -> usize {
        self.per_model.lock().map_or(0, |m| m.get(model).map_or(0, |(_, max)| *max))
    }

    /// Answers every request with `fault` from now on (`None`: serve again).
    pub fn set_outage(&self, fault: Option<Fault>) {
        if let Ok(mut outage) = self.outage.lock() {
            *outage = fault;
        }
    }

    /// What the advertised limits admitted and refused so far.
    pub fn advertised(&self) -> advertise::AdvertStats {
        self.advert_stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// What the account of provider key `key` saw so far.
    pub fn account(&self, key: &str) -> AccountStats {
        self.per_account.lock().map_or(AccountStats::default(), |a| a.get(key).copied().unwrap_or_default())
    }

    /// What the running scenario shows.
    pub fn description(&self) -> &str {
        &self.config.description
    }

    /// Requests received so far (only with `record: true`).
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// A running simulator; dropping it stops accepting connections.
pub struct Simulator {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its counters.
    pub state: Arc<SimState>,
    task: JoinHandle<()>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Simulator {
    /// Starts on `addr` (port 0 picks a free one).
    pub fn start(addr: SocketAddr, config: SimConfig) -> std::io::Result<Simulator> {
        let listener = listen::bind(addr)?;
        let addr = listener.local_addr()?;
        let account = config.clouds.google.as_ref().map(clouds::Account::load).transpose()?;
        let state = Arc::new(SimState { config, account, ..Default::default() });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .route("/v1beta/models/{action}", post(gemini))
            .route(
                "/v1/projects/{project}/locations/{region}/publishers/google/models/{action}",
                post(clouds::vertex_gemini),
            )
            .route("/model/{model}/invoke", post(clouds::bedrock_invoke))
            .route("/model/{model}/invoke-with-response-stream", post(clouds::bedrock_stream))
            .route(
                "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{action}",
                post(clouds::vertex),
            )
            .route("/token", post(clouds::token))
            .route("/sim/stats", axum::routing::get(stats))
            .route("/sim/arrivals", axum::routing::get(arrivals));
        let app = clouds::azure_routes(app)
            .layer(axum::middleware::from_fn_with_state(state.clone(), advertise::layer))
            .with_state(state.clone());
        let task = tokio::spawn(listen::serve(listener, app));
        Ok(Simulator { addr, state, task })
    }

    /// Base URL for an OpenAI upstream pointing here.
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Base URL for an Anthropic upstream pointing here (also the base
    /// URL of its Bedrock, Vertex and Azure endpoints).
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Base URL for a Gemini upstream (Google AI Studio's root) pointing here.
    pub fn gemini_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs until the accept loop ends.
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

/// `GET /sim/stats`: per model, requests in flight now and the most seen
/// at once (since start, or since the last `?reset=1`, which starts the
/// count again from those in flight), requests per model refused ones
/// included (`asked`), and the totals: what a soak outside
/// the process reads to check that no cap was ever exceeded.
async fn stats(
    State(state): State<Arc<SimState>>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
) -> axum::Json<serde_json::Value> {
    let reset = q.get("reset").is_some_and(|v| v == "1");
    let mut models = serde_json::Map::new();
    if let Ok(mut per_model) = state.per_model.lock() {
        for (model, (now, max)) in per_model.iter_mut() {
            models.insert(model.clone(), serde_json::json!({ "in_flight": *now, "max_in_flight": *max }));
            if reset {
                *max = *now;
            }
        }
    }
    let asked = state.asked.lock().map(|a| serde_json::json!(*a)).unwrap_or_default();
    let advertised = state.advertised();
    let accounts: serde_json::Map<String, serde_json::Value> = state
        .per_account
        .lock()
        .map(|a| {
            a.iter()
                .map(|(k, s)| {
                    let v = serde_json::json!({ "requests": s.requests, "over_cap": s.over_cap, "refused": s.refused, "max_in_flight": s.max_in_flight, "window_served": s.window_served, "window_refused": s.window_refused });
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    axum::Json(serde_json::json!({
        "models": models,
        "asked": asked,
        "accounts": accounts,
        "advertised": { "served": advertised.served, "refused": advertised.refused },
        "completed": state.completed.load(Ordering::Relaxed),
        "cancelled": state.cancelled.load(Ordering::Relaxed),
        "rejected": state.rejected.load(Ordering::Relaxed),
    }))
}

/// Most arrival times kept per model (see [`SimConfig::arrivals`]).
const MOST_ARRIVALS: usize = 1_000_000;

/// `GET /sim/arrivals`: per model, the arrival time of every request (ms
/// since the Unix epoch), with `arrivals: true`.
async fn arrivals(State(state): State<Arc<SimState>>) -> axum::Json<serde_json::Value> {
    let all = state.arrivals.lock().map(|a| serde_json::json!(*a)).unwrap_or_default();
    axum::Json(all)
}

async fn chat(State(state): State<Arc<SimState>>, req: Request) -> Response {
    answer(state, Endpoint::ChatCompletions, req).await
}

async fn responses(State(state): State<Arc<SimState>>, req: Request) -> Response {
    answer(state, Endpoint::Responses, req).await
}

async fn embeddings(State(state): State<Arc<SimState>>, req: Request) -> Response {
    answer(state, Endpoint::Embeddings, req).await
}

async fn messages(State(state): State<Arc<SimState>>, req: Request) -> Response {
    answer(state, Endpoint::Messages, req).await
}

async fn count_tokens(State(state): State<Arc<SimState>>, req: Request) -> Response {
    answer(state, Endpoint::CountTokens, req).await
}

/// Counts a request in flight; if dropped before `finish`, the client
/// (tidegate) went away mid-answer.
struct Flight {
    state: Arc<SimState>,
    done: bool,
    model: Option<String>,
    /// The provider key the request came with (when accounts are set).
    key: Option<String>,
    /// The provider key, counted in its account while in flight.
    account: Option<String>,
    /// Served (not refused): its session counts `linger_ms` longer.
    lingers: bool,
}

impl Flight {
    fn new(state: Arc<SimState>) -> Self {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self { state, done: false, model: None, key: None, account: None, lingers: false }
    }

    /// Counts the request against its model too; returns how many
    /// requests to that model are in flight, this one included.
    fn of_model(&mut self, model: &str) -> usize {
        self.model = Some(model.to_owned());
        if self.state.config.arrivals
            && let Ok(mut arrivals) = self.state.arrivals.lock()
        {
            let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            let list = arrivals.entry(model.to_owned()).or_default();
            if list.len() < MOST_ARRIVALS {
                list.push(at as u64);
            }
        }
        let Ok(mut per_model) = self.state.per_model.lock() else { return 0 };
        let (now, max) = per_model.entry(model.to_owned()).or_default();
        *now += 1;
        *max = (*max).max(*now);
        *now
    }

    fn finish(mut self) {
        self.done = true;
    }

    /// Counts the request against its account (by provider key) and says
    /// how that account answers it: `None` to serve it, else the refusal.
    fn of_account(&mut self, key: &str) -> Option<Fault> {
        let behavior = self.state.config.accounts.get(key)?;
        let Ok(mut accounts) = self.state.per_account.lock() else { return None };
        let stats = accounts.entry(key.to_owned()).or_default();
        stats.requests += 1;
        if let Some(fault) = &behavior.refuse {
            stats.refused += 1;
            return Some(fault.clone());
        }
        if behavior.max_in_flight.is_some_and(|cap| stats.in_flight >= cap) {
            stats.over_cap += 1;
            return Some(CONCURRENCY_3009.clone());
        }
        stats.in_flight += 1;
        stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
        self.account = Some(key.to_owned());
        None
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(model) = self.model.take() {
            let behavior = self.state.config.models.get(&model).unwrap_or(&self.state.config.default);
            let linger = if self.lingers { behavior.linger_ms } else { 0 };
            let state = self.state.clone();
            let free = move || {
                if let Ok(mut per_model) = state.per_model.lock()
                    && let Some((now, _)) = per_model.get_mut(&model)
                {
                    *now = now.saturating_sub(1);
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) if linger > 0 => {
                    runtime.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(linger)).await;
                        free();
                    });
                }
                _ => free(),
            }
        }
        if let (Some(key), Ok(mut accounts)) = (self.account.take(), self.state.per_account.lock())
            && let Some(stats) = accounts.get_mut(&key)
        {
            stats.in_flight = stats.in_flight.saturating_sub(1);
        }
        let counter = if self.done { &self.state.completed } else { &self.state.cancelled };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

async fn answer(state: Arc<SimState>, endpoint: Endpoint, req: Request) -> Response {
    let (flight, _, body) = arrive(&state, req).await;
    serve(state, endpoint, flight, body).await
}

/// `POST /v1beta/models/{model}:{method}`: Google AI Studio, the key in
/// `x-goog-api-key`.
async fn gemini(State(state): State<Arc<SimState>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let (flight, _, body) = arrive(&state, req).await;
    serve_gemini(state, &path, flight, body).await
}

/// A Gemini request (`path` names the method and model).
pub(crate) async fn serve_gemini(state: Arc<SimState>, path: &str, flight: Flight, body: Bytes) -> Response {
    let local = path.rsplit_once("/models/").map(|(_, rest)| format!("/v1beta/models/{rest}")).unwrap_or_default();
    match protocol::gemini::parse_path(&local) {
        Some((endpoint, model)) => serve_named(state, endpoint, Some(model), flight, body).await,
        None => {
            flight.finish();
            clouds::google_error(404, "NOT_FOUND", "unknown method")
        }
    }
}

/// The provider key a request carries: a bearer token, `x-api-key` or
/// `x-goog-api-key`.
pub(crate) fn provider_key(headers: &HeaderMap) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| header("x-api-key"))
        .or_else(|| header("x-goog-api-key"))
        .map(str::to_owned)
}

/// A request arrives: counted in flight, read whole, recorded.
async fn arrive(state: &Arc<SimState>, req: Request) -> (Flight, http::request::Parts, Bytes) {
    let mut flight = Flight::new(state.clone());
    let (parts, body) = req.into_parts();
    if !state.config.accounts.is_empty() || state.config.prompt_cache.is_some() {
        flight.key = provider_key(&parts.headers);
    }
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    state.record(&parts, &body);
    (flight, parts, body)
}

impl SimState {
    /// Keeps a received request (with `record: true`).
    fn record(&self, parts: &http::request::Parts, body: &Bytes) {
        if let Some(dir) = &self.config.dump {
            let n = self.dumped.fetch_add(1, Ordering::SeqCst) + 1;
            let name = parts.uri.path().trim_start_matches('/').replace('/', "-");
            let _ = std::fs::write(dir.join(format!("{n:04}-{name}.json")), body);
        }
        if self.config.record
            && let Ok(mut r) = self.received.lock()
        {
            r.push(Received {
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().map(str::to_owned),
                headers: parts.headers.clone(),
                body: body.clone(),
                at: tokio::time::Instant::now(),
            });
        }
    }
}

/// Answers a request body (in the protocol's own shape) to `endpoint`,
/// following the behaviour configured for its model.
async fn serve(state: Arc<SimState>, endpoint: Endpoint, flight: Flight, body: Bytes) -> Response {
    serve_named(state, endpoint, None, flight, body).await
}

/// [`serve`], for a model `named` in the path (Gemini).
async fn serve_named(
    state: Arc<SimState>,
    endpoint: Endpoint,
    named: Option<String>,
    mut flight: Flight,
    body: Bytes,
) -> Response {
    let protocol = endpoint.protocol();
    if state.config.chat_only && !matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Embeddings) {
        flight.finish();
        let error = format!(
            r#"{{"error":{{"message":"Not Found: {} is not served here","type":"invalid_request_error","code":"not_found"}}}}"#,
            endpoint.path()
        );
        return respond(StatusCode::NOT_FOUND, "application/json", Body::from(error));
    }
    let head = match &named {
        Some(model) => protocol::gemini::peek(&body, model, endpoint == Endpoint::StreamGenerateContent),
        None => protocol::peek(&body),
    };
    let Ok(head) = head else {
        flight.finish();
        return respond(StatusCode::BAD_REQUEST, "application/json", Body::from(r#"{"error":{"message":"bad json"}}"#));
    };
    if let Some(previous) = &head.previous_response_id {
        let known = state.stored.lock().is_ok_and(|s| s.contains(previous));
        if !known {
            flight.finish();
            let error = format!(
                r#"{{"error":{{"message":"Previous response with id '{previous}' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}}}"#
            );
            return respond(StatusCode::BAD_REQUEST, "application/json", Body::from(error));
        }
    }
    if let Some(fault) = state.outage.lock().ok().and_then(|o| o.clone()) {
        flight.finish();
        return deliver(protocol, head.stream, &fault);
    }
    if let Ok(mut asked) = state.asked.lock() {
        // The model's name is copied once, not on every request.
        match asked.get_mut(&head.model) {
            Some(n) => *n += 1,
            None => {
                asked.insert(head.model.clone(), 1);
            }
        }
    }
    let behavior = state.config.models.get(&head.model).unwrap_or(&state.config.default);
    if let Some(busy) = behavior.busy_for_ms {
        let now = tokio::time::Instant::now();
        let first = state.first_asked.lock().map_or(now, |mut m| *m.entry(head.model.clone()).or_insert(now));
        if now.duration_since(first) < Duration::from_millis(busy) {
            state.rejected.fetch_add(1, Ordering::SeqCst);
            flight.finish();
            return deliver(protocol, head.stream, behavior.busy_with.as_ref().unwrap_or(&CONCURRENCY_3009));
        }
    }
    if behavior.fail_rate > 0.0 {
        let roll = state
            .rng
            .lock()
            .map_or(1.0, |mut r| r.get_or_insert_with(|| fastrand::Rng::with_seed(state.config.seed)).f64());
        if roll < behavior.fail_rate {
            flight.finish();
            return deliver(protocol, head.stream, behavior.fail_with.as_ref().unwrap_or(&OVERLOADED));
        }
    }
    let of_model = flight.of_model(&head.model);
    if behavior.reject_over.is_some_and(|n| of_model > n) {
        state.rejected.fetch_add(1, Ordering::SeqCst);
        flight.finish();
        let fault = match (head.stream, &behavior.over_limit_stream, &behavior.over_limit) {
            (true, Some(f), _) | (_, _, Some(f)) => f,
            _ => &CONCURRENCY_3009,
        };
        return deliver(protocol, head.stream, fault);
    }
    if let Some(key) = flight.key.clone()
        && let Some(fault) = flight.of_account(&key)
    {
        state.rejected.fetch_add(1, Ordering::SeqCst);
        flight.finish();
        return deliver(protocol, head.stream, &fault);
    }
    flight.lingers = true;
    let nth = match state.served.lock() {
        Ok(mut served) => {
            let n = served.entry(head.model.clone()).or_insert(0);
            *n += 1;
            *n - 1
        }
        Err(_) => 0,
    };
    let prompt = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => {
            state.read_prompt(flight.key.as_deref().unwrap_or_default(), &body)
        }
        _ => None,
    };
    let prefill = match (prompt, &state.config.prompt_cache) {
        (Some(read), Some(cache)) => {
            let cost = (read.tokens - read.cached) as u64 * 10 + read.cached as u64;
            Duration::from_micros(cost * cache.uncached_ms_per_1k_tokens / 10)
        }
        _ => Duration::ZERO,
    };
    let latency = Duration::from_millis(behavior.latency_ms) + prefill;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut drop_after = behavior.drop_after;
    let mut error_after: Option<(usize, &str)> = None;
    if let Some(fault) = behavior.script.get(nth) {
        match fault.mode {
            FaultMode::ErrorMidStream => error_after = Some((usize::from(fault.status), fault.body.as_str())),
            FaultMode::DropAfter => drop_after = Some(usize::from(fault.status)),
            FaultMode::Http | FaultMode::ErrorFrame | FaultMode::EmptyStream => {
                flight.finish();
                return deliver(protocol, head.stream, fault);
            }
        }
    }
    if let Some(status) = behavior.status {
        flight.finish();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return respond(status, &behavior.error_content_type, Body::from(behavior.error_body.clone()));
    }
    let response_id = (endpoint == Endpoint::Responses).then(|| {
        let id = format!("resp_sim_{}", state.next_response.fetch_add(1, Ordering::SeqCst));
        if let Ok(mut stored) = state.stored.lock() {
            stored.insert(id.clone());
        }
        id
    });
    let id = response_id.as_deref().unwrap_or("resp_sim");
    let turn = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => turns::turn_of(protocol, &body, state.config.reasoning),
        _ => None,
    };
    if head.stream
        && matches!(
            endpoint,
            Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages | Endpoint::StreamGenerateContent
        )
    {
        let mut frames = match &turn {
            Some(turn) => turns::frames(protocol, &head.model, behavior.chunks, turn),
            None => stream_frames(protocol, id, &head.model, already_answered(&body), behavior.chunks),
        };
        if let Some((n, error)) = error_after {
            frames.truncate(n);
            frames.push(Bytes::from(error_frame(protocol, error)));
        }
        if let (Some(pad), Protocol::OpenAiChat) = (behavior.pad_event_bytes, protocol) {
            let chunk = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                "p".repeat(pad)
            );
            frames.insert(1.min(frames.len()), Bytes::from(chunk));
        }
        let first = Duration::from_millis(behavior.first_chunk_delay_ms);
        let pings = behavior
            .ping_every_ms
            .filter(|_| !first.is_zero())
            .map(|every| (Duration::from_millis(every.max(1)), tokio::time::Instant::now() + first));
        let first = pings.map_or(first, |(every, _)| every.min(first));
        let body = SseBody {
            pings,
            frames: frames.into_iter(),
            delay: Duration::from_millis(behavior.chunk_delay_ms),
            sleep: (!first.is_zero()).then(|| Box::pin(tokio::time::sleep(first))),
            flight: Some(flight),
            drop_after,
            sent: 0,
            stamp: behavior.stamp,
        };
        return respond(StatusCode::OK, "text/event-stream", Body::new(body));
    }
    flight.finish();
    let answer = match &turn {
        Some(turn) => turns::answer(protocol, &head.model, behavior.chunks, turn),
        None => json_answer(endpoint, id, &head.model, behavior.chunks),
    };
    let answer = match prompt {
        Some(read) => with_usage(protocol, answer, read),
        None => answer,
    };
    respond(StatusCode::OK, "application/json", Body::from(answer))
}

/// An error as a stream's event(s), in each protocol's way: OpenAI chat a
/// `data:` object then `[DONE]`, Anthropic `event: error`, Responses
/// `response.failed` whose `response.error` is the body's error object.
fn error_frame(protocol: Protocol, body: &str) -> String {
    match protocol {
        Protocol::OpenAiChat => format!("data: {body}\n\ndata: [DONE]\n\n"),
        Protocol::Anthropic => format!("event: error\ndata: {body}\n\n"),
        Protocol::Gemini => format!("data: {body}\r\n\r\n"),
        Protocol::OpenAiResponses => {
            let parsed: serde_json::Value = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
            let error = parsed.get("error").cloned().unwrap_or(parsed);
            let failed = serde_json::json!({"type": "response.failed", "response": {
                "id": "resp_sim", "object": "response", "status": "failed", "output": [], "error": error}});
            format!("event: response.failed\ndata: {failed}\n\n")
        }
    }
}

/// The simulator's default answer to a request over `reject_over`:
/// a coding plan's concurrency cap (`429` code 3009), no `Retry-After`.
static CONCURRENCY_3009: std::sync::LazyLock<Fault> = std::sync::LazyLock::new(|| {
    Fault::new(429, r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#)
});

/// The default random failure.
static OVERLOADED: std::sync::LazyLock<Fault> = std::sync::LazyLock::new(|| {
    Fault::new(503, r#"{"error":{"message":"The server is overloaded","type":"overloaded"}}"#)
});

/// Delivers a fault that is a whole answer (`http`, `error_frame`,
/// `empty_stream`); the stream-cutting modes need a stream and are sent as
/// their plain HTTP answer here. A Responses `error_frame` to a non-stream
/// request is a `200` response object with `status: failed`.
fn deliver(protocol: Protocol, stream: bool, fault: &Fault) -> Response {
    let mut resp = match fault.mode {
        FaultMode::ErrorFrame if protocol == Protocol::OpenAiResponses && !stream => {
            let parsed: serde_json::Value = serde_json::from_str(&fault.body).unwrap_or(serde_json::Value::Null);
            let error = parsed.get("error").cloned().unwrap_or(parsed);
            let answer = serde_json::json!({"id": "resp_sim_failed", "object": "response", "status": "failed",
                "output": [], "error": error, "usage": null});
            respond(StatusCode::OK, "application/json", Body::from(answer.to_string()))
        }
        FaultMode::ErrorFrame => {
            let mut frame = String::new();
            if protocol == Protocol::OpenAiResponses {
                frame.push_str("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_sim\",\"status\":\"in_progress\"}}\n\n");
            }
            frame.push_str(&error_frame(protocol, &fault.body));
            respond(StatusCode::OK, "text/event-stream", Body::from(frame))
        }
        FaultMode::EmptyStream => respond(StatusCode::OK, "text/event-stream", Body::empty()),
        FaultMode::Http | FaultMode::DropAfter | FaultMode::ErrorMidStream => {
            let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            respond(status, &fault.content_type, Body::from(fault.body.clone()))
        }
    };
    for (k, v) in &fault.headers {
        if let (Ok(k), Ok(v)) = (http::HeaderName::try_from(k.as_str()), http::HeaderValue::try_from(v.as_str())) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// Words of the answer already given in a trailing assistant message (a
/// client or tidegate continuing a partial answer): the simulator goes on
/// from there.
fn already_answered(body: &[u8]) -> usize {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return 0 };
    let Some(last) = v["messages"].as_array().and_then(|m| m.last()) else { return 0 };
    if last["role"] != "assistant" {
        return 0;
    }
    let text = match &last["content"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.matches("tok").count()
}

fn respond(status: StatusCode, content_type: &str, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn words(n: usize) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

fn json_answer(endpoint: Endpoint, id: &str, model: &str, chunks: usize) -> String {
    let text = words(chunks);
    let v = match endpoint {
        Endpoint::ChatCompletions => serde_json::json!({
            "id": "chatcmpl-sim", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks}
        }),
        Endpoint::Responses => serde_json::json!({
            "id": id, "object": "response", "created_at": 0, "status": "completed", "model": model,
            "output": [message_item(&text, "completed")],
            "usage": {"input_tokens": 10, "output_tokens": chunks, "total_tokens": 10 + chunks}
        }),
        Endpoint::Embeddings => serde_json::json!({
            "object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}
        }),
        Endpoint::Messages => serde_json::json!({
            "id": "msg_sim", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": chunks}
        }),
        Endpoint::CountTokens => serde_json::json!({"input_tokens": 10}),
        Endpoint::GenerateContent | Endpoint::StreamGenerateContent => serde_json::json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": chunks, "totalTokenCount": 10 + chunks},
            "modelVersion": model, "responseId": id
        }),
        Endpoint::GeminiCountTokens => serde_json::json!({"totalTokens": 10}),
        Endpoint::EmbedContent => serde_json::json!({"embedding": {"values": [0.25, -0.5, 0.125]}}),
    };
    v.to_string()
}

fn message_item(text: &str, status: &str) -> serde_json::Value {
    let content: Vec<serde_json::Value> = if status == "completed" {
        vec![serde_json::json!({"type": "output_text", "text": text, "annotations": []})]
    } else {
        Vec::new()
    };
    serde_json::json!({"id": "msg_sim", "type": "message", "status": status, "role": "assistant", "content": content})
}

/// The SSE events of a complete answer, one `Bytes` per event.
pub fn sse_frames(protocol: Protocol, model: &str, chunks: usize) -> Vec<Bytes> {
    stream_frames(protocol, "resp_sim", model, 0, chunks)
}

/// Like [`sse_frames`], with content words `tok{start}`..`tok{chunks-1}`:
/// the continuation of an answer whose first `start` words were already
/// given (a resumed stream).
pub fn sse_frames_from(protocol: Protocol, model: &str, start: usize, chunks: usize) -> Vec<Bytes> {
    stream_frames(protocol, "resp_sim", model, start, chunks)
}

/// The events of an answer whose Responses id is `id`.
fn stream_frames(protocol: Protocol, id: &str, model: &str, start: usize, chunks: usize) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(chunks + 10);
    match protocol {
        Protocol::OpenAiResponses => {
            let mut seq = 0u64;
            let mut event = |name: &str, mut v: serde_json::Value| {
                v["type"] = serde_json::Value::from(name);
                v["sequence_number"] = serde_json::Value::from(seq);
                seq += 1;
                Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
            };
            let text: String = (start..chunks).map(|i| format!("tok{i} ")).collect();
            let response = |status: &str, output: Vec<serde_json::Value>, usage: serde_json::Value| {
                serde_json::json!({"id": id, "object": "response", "created_at": 0, "status": status,
                    "model": model, "output": output, "usage": usage})
            };
            out.push(event(
                "response.created",
                serde_json::json!({"response": response("in_progress", vec![], serde_json::Value::Null)}),
            ));
            out.push(event(
                "response.in_progress",
                serde_json::json!({"response": response("in_progress", vec![], serde_json::Value::Null)}),
            ));
            out.push(event(
                "response.output_item.added",
                serde_json::json!({"output_index": 0, "item": message_item("", "in_progress")}),
            ));
            out.push(event(
                "response.content_part.added",
                serde_json::json!({"item_id": "msg_sim", "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
            for i in start..chunks {
                out.push(event(
                    "response.output_text.delta",
                    serde_json::json!({"item_id": "msg_sim", "output_index": 0,
                    "content_index": 0, "delta": format!("tok{i} ")}),
                ));
            }
            out.push(event(
                "response.output_text.done",
                serde_json::json!({"item_id": "msg_sim", "output_index": 0,
                "content_index": 0, "text": text}),
            ));
            out.push(event(
                "response.content_part.done",
                serde_json::json!({"item_id": "msg_sim", "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}),
            ));
            out.push(event(
                "response.output_item.done",
                serde_json::json!({"output_index": 0, "item": message_item(&text, "completed")}),
            ));
            let usage = serde_json::json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": chunks, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10 + chunks});
            out.push(event(
                "response.completed",
                serde_json::json!({"response": response("completed", vec![message_item(&text, "completed")], usage)}),
            ));
        }
        Protocol::OpenAiChat => {
            let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                let v = serde_json::json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                Bytes::from(format!("data: {v}\n\n"))
            };
            out.push(chunk(serde_json::json!({"role": "assistant", "content": ""}), None));
            for i in start..chunks {
                out.push(chunk(serde_json::json!({"content": format!("tok{i} ")}), None));
            }
            out.push(chunk(serde_json::json!({}), Some("stop")));
            out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        Protocol::Gemini => {
            // Google's framing: CRLF, no event names, no terminal event.
            let chunk = |v: serde_json::Value| Bytes::from(format!("data: {v}\r\n\r\n"));
            let part = |i: usize| serde_json::json!({"text": format!("tok{i} ")});
            for i in start..chunks {
                let mut v = serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [part(i)]},
                    "index": 0}], "modelVersion": model, "responseId": id});
                if i + 1 == chunks {
                    v["candidates"][0]["finishReason"] = "STOP".into();
                    v["usageMetadata"] = serde_json::json!({"promptTokenCount": 10,
                        "candidatesTokenCount": chunks, "totalTokenCount": 10 + chunks});
                }
                out.push(chunk(v));
            }
            if start >= chunks {
                out.push(chunk(
                    serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                    "finishReason": "STOP", "index": 0}], "modelVersion": model, "responseId": id}),
                ));
            }
        }
        Protocol::Anthropic => {
            let event = |name: &str, v: serde_json::Value| Bytes::from(format!("event: {name}\ndata: {v}\n\n"));
            out.push(event(
                "message_start",
                serde_json::json!({"type": "message_start", "message": {
                "id": "msg_sim", "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
            ));
            out.push(event(
                "content_block_start",
                serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ));
            out.push(event("ping", serde_json::json!({"type": "ping"})));
            for i in start..chunks {
                out.push(event(
                    "content_block_delta",
                    serde_json::json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": format!("tok{i} ")}}),
                ));
            }
            out.push(event("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})));
            out.push(event(
                "message_delta",
                serde_json::json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": chunks}}),
            ));
            out.push(event("message_stop", serde_json::json!({"type": "message_stop"})));
        }
    }
    out
}

/// An SSE body that sends its frames with a delay between them and counts
/// the request cancelled if dropped before the last one.
struct SseBody {
    /// Comments to send, every so often, until the first event is due.
    pings: Option<(Duration, tokio::time::Instant)>,
    frames: std::vec::IntoIter<Bytes>,
    delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    flight: Option<Flight>,
    drop_after: Option<usize>,
    sent: usize,
    stamp: bool,
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(sleep) = this.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
        if let Some((every, until)) = this.pings {
            let now = tokio::time::Instant::now();
            if now < until {
                this.sleep = Some(Box::pin(tokio::time::sleep_until((now + every).min(until))));
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b": ping\n\n")))));
            }
            this.pings = None;
        }
        if this.drop_after.is_some_and(|n| this.sent >= n) {
            // Pause once so hyper flushes what was sent, then fail: an
            // error makes hyper abort the connection, a mid-stream drop.
            if this.sent != usize::MAX {
                this.sent = usize::MAX;
                let mut pause = Box::pin(tokio::time::sleep(Duration::from_millis(20)));
                let _ = pause.as_mut().poll(cx);
                this.sleep = Some(pause);
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err(std::io::Error::other("simulated connection drop"))));
        }
        match this.frames.next() {
            Some(frame) => {
                this.sent += 1;
                if !this.delay.is_zero() && this.frames.len() > 0 {
                    this.sleep = Some(Box::pin(tokio::time::sleep(this.delay)));
                }
                // The last event handed over ends the request here: a
                // client that read it may send its next one at once, and it
                // must not count as two in flight.
                if this.frames.len() == 0
                    && let Some(f) = this.flight.take()
                {
                    f.finish();
                }
                let frame = if this.stamp {
                    let micros =
                        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
                    Bytes::from([format!(": ts={micros}\n").as_bytes(), &frame[..]].concat())
                } else {
                    frame
                };
                Poll::Ready(Some(Ok(Frame::data(frame))))
            }
            None => {
                if let Some(f) = this.flight.take() {
                    f.finish();
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_parses_and_describes_itself() {
        for (name, _) in SCENARIOS {
            let config = SimConfig::scenario(name).unwrap_or_else(|e| panic!("scenario {name}: {e}"));
            assert!(config.description.len() > 40, "scenario {name} says what it shows");
        }
        let err = SimConfig::scenario("nope").unwrap_err().to_string();
        assert!(err.contains("capacity") && err.contains("healthy"), "{err}");
        let err = SimConfig::from_yaml("default: { latncy_ms: 5 }").unwrap_err().to_string();
        assert!(err.starts_with("default.latncy_ms: unknown field"), "{err}");
    }
}
