//! tidegate: an LLM gateway that makes provider capacity errors invisible
//! and real errors immediate.
//!
//! A request's path through the code, one module per box (the same
//! hallway, file by file, is `ARCHITECTURE.md` at the repository's root):
//!
//! ```text
//! client ──► server    model endpoints straight to their handler (`Front`),
//!                      the rest via the route table; thin handlers
//!        ──► exchange  the request's one owner, made at arrival: it admits,
//!                      routes, starts every run of the attempt loop, answers
//!                      and reports it once
//!        ──► admission the client key (constant time), the size limit, raw
//!                      bytes kept
//!        ──► route     (`exchange::route`) `protocol` reads `model`, `stream` and the routing
//!                      fields; `config` gives the alias or pattern's targets;
//!                      the deadline, priority, the pin of stored state
//!                      (`pins`, `kept`), the key's `lanes` → a `relay::Job`
//!        ──► relay     the attempt loop: pick target → acquire → send →
//!                      classify → feed back → decide (gateway: shared state)
//!        ──► health    cooldowns and circuit breakers (which target)
//!        ──► limits    per-upstream queue (priority, then weighted fair
//!                      between keys), concurrency slots, rate buckets
//!                      (shared: the same as leases in Redis, for replicas)
//!        ──► translate only for a target of another protocol: the body
//!                      through `protocol::turn` (read client, write
//!                      target), and the answer, stream or error back
//!        ──► upstream  per-provider client: auth, headers, timeouts; its own
//!                      connection pool over hyper's connection API
//!        ──► classify  what an answer means (`secrets` scrubs provider text
//!                      first); retry: what to do about it
//!        ──► stream    body relayed by whole events (a burst in one write),
//!                      idle timeout, owns the upstream slot until the last
//!                      byte; asks `protocol` what each event is
//!        ──► error     what tidegate answers itself, in the client's shape
//! ```
//!
//! Four wire protocols (OpenAI chat completions, the Responses API,
//! Anthropic messages, Gemini), each one module under `protocol/`.
//!
//! Beside the path: `record` is the per-request vocabulary (outcome,
//! attempts, verdicts, usage) everything below the relay shares; `report`
//! finishes each request once (log line, `metrics`, `recent` buckets for
//! the `/ui` dashboard, `journal` row); `pins` remembers which upstream
//! stores a Responses API response, and `affinity` which target holds a
//! conversation's prompt cache; `anomaly` watches per-client volume;
//! `request_id` makes the ids whose first half is the journal's row key;
//! `client` recognises the client program (Codex, Claude Code, …) whose
//! retry contract `error` speaks when tidegate gives up.
//!
//! The fake provider is not here: the `tidegate-simulate` crate
//! (`simulate/`) is a fault-injecting upstream with named scenarios, and
//! the demo that runs one burst straight at it and one through tidegate;
//! the command line (`src/main.rs`), the tests and the benches use it.

#![warn(missing_docs)]

pub mod admission;
pub mod affinity;
pub mod anomaly;
pub mod classify;
pub mod client;
pub mod closing;
pub mod config;
pub mod error;
pub mod exchange;
pub mod flood;
pub mod gateway;
pub mod headers;
pub mod health;
pub mod ids;
pub mod journal;
pub mod kept;
pub mod lanes;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod pins;
pub mod protocol;
pub mod recent;
pub mod record;
pub mod relay;
pub mod report;
pub mod request_id;
pub mod retry;
pub mod secrets;
pub mod server;
pub mod shared;
pub mod stream;
pub mod translate;
pub mod upstream;
