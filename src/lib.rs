//! tidegate: an LLM gateway that makes provider capacity errors invisible
//! and real errors immediate.
//!
//! A request's path through the code, one module per box:
//!
//! ```text
//! client ──► server    auth (constant time), size limit, keep raw bytes
//!        ──► protocol  read `model` + `stream` only; splice a renamed model
//!        ──► config    alias → ordered equivalent targets (ModelRoute)
//!        ──► relay     the attempt loop: pick target, send, decide
//!        ──► health    cooldowns and circuit breakers (which target)
//!        ──► limits    per-upstream queue, concurrency slots, rate buckets
//!                      (shared: the same as leases in Redis, for replicas)
//!        ──► classify  what an answer means; retry: what to do about it
//!        ──► upstream  per-provider client: auth, headers, pooling, timeouts
//!        ──► stream    body relayed chunk by chunk, idle timeout, owns the
//!                      upstream connection until the last byte
//!        ──► error     what tidegate answers itself, in the client's shape
//! ```
//!
//! Beside the path: `report` finishes each request once (log line,
//! `metrics`, `recent` buckets for the `/ui` dashboard, `journal` row),
//! `anomaly` watches per-client volume; `request_id` makes the ids whose
//! first half is the journal's row key.
//!
//! `simulate` is a fault-injecting upstream (with named scenarios) shared
//! by the tests, the benchmark, `tidegate simulate` and `demo`, which runs
//! one burst straight at it and one through tidegate.

pub mod anomaly;
pub mod classify;
pub mod config;
pub mod demo;
pub mod error;
pub mod gateway;
pub mod health;
pub mod journal;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod pins;
pub mod protocol;
pub mod recent;
pub mod record;
pub mod relay;
pub mod report;
pub mod request_id;
pub mod retry;
pub mod server;
pub mod shared;
pub mod simulate;
pub mod stream;
pub mod upstream;
