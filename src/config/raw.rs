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
    /// Keys clients must present; empty means no client auth (loopback only).
    #[serde(default)]
    pub client_keys: Vec<RawClientKey>,
    /// The providers tidegate forwards to.
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    /// What clients may ask for, mapped to upstream targets.
    #[serde(default)]
    pub models: IndexMap<String, RawModel>,
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

/// One accepted client key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientKey {
    /// Name recorded in logs and the journal instead of the key.
    pub name: String,
    /// The key itself (use `${ENV_VAR}`).
    pub key: String,
}

/// One upstream provider endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Unique name used by model targets, logs and headers.
    pub name: String,
    /// Wire protocol: `openai` or `anthropic`.
    pub protocol: String,
    /// Base URL as the provider's official SDK takes it.
    pub base_url: String,
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
}

/// A model alias clients can ask for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// Equivalent targets, in failover order.
    pub targets: Vec<RawTarget>,
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
}
