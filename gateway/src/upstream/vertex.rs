//! Google Vertex AI as an Anthropic upstream (and, with `protocol:
//! gemini`, a Gemini one: `…/publishers/google/models/{model}:
//! generateContent`, the body and answers Gemini's own).
//!
//! `POST {base}/v1/projects/{project}/locations/{region}/publishers/
//! anthropic/models/{model}:rawPredict` (`:streamRawPredict` for a
//! stream), the Messages body without `model` and with
//! `anthropic_version: vertex-2023-10-16`; answers and stream events are
//! Anthropic's own. Auth is an OAuth access token: from a service-account
//! key (a signed JWT exchanged at the key's `token_uri`, by `gcp_auth`,
//! which caches it and fetches a new one 20 s before it expires), from a
//! command, or from application default credentials. Google-shaped errors
//! (`429 RESOURCE_EXHAUSTED`, …) are rewritten into the Anthropic error of
//! the same meaning.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;

use crate::config::{GoogleAuth, VertexConfig};
use crate::protocol::ErrorKind;

/// `anthropic_version` Vertex requires in the body.
pub const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// OAuth scope of Vertex AI calls.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Longest a `token_command` may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A Vertex upstream's project, region and token source.
pub struct Vertex {
    path: String,
    tokens: Tokens,
}

enum Tokens {
    /// `gcp_auth` (key file, or application default credentials found on
    /// first use).
    Provider { from: GoogleAuth, provider: OnceCell<Arc<dyn gcp_auth::TokenProvider>> },
    /// A command's output, reused for `ttl`.
    Command { command: String, ttl: Duration, cached: Mutex<Option<(String, Instant)>> },
}

impl Vertex {
    /// From the validated config; a key file is read here (a bad one is a
    /// build error, as at `check`).
    pub fn new(config: &VertexConfig) -> Result<Self, TokenError> {
        let tokens = match &config.auth {
            GoogleAuth::KeyFile(path) => {
                let account = gcp_auth::CustomServiceAccount::from_file(path)
                    .map_err(|e| TokenError::KeyFile(path.display().to_string(), e.to_string()))?;
                let provider: Arc<dyn gcp_auth::TokenProvider> = Arc::new(account);
                Tokens::Provider { from: config.auth.clone(), provider: OnceCell::new_with(Some(provider)) }
            }
            GoogleAuth::Default => Tokens::Provider { from: GoogleAuth::Default, provider: OnceCell::new() },
            GoogleAuth::Command { command, ttl } => {
                Tokens::Command { command: command.clone(), ttl: *ttl, cached: Mutex::new(None) }
            }
        };
        let path = format!("/v1/projects/{}/locations/{}/publishers", config.project, config.region);
        Ok(Self { path, tokens })
    }

    /// The path for Anthropic `model`.
    pub fn path(&self, model: &str, stream: bool) -> String {
        let verb = if stream { "streamRawPredict" } else { "rawPredict" };
        format!("{}/anthropic/models/{model}:{verb}", self.path)
    }

    /// The path for Gemini `model` (Google's own publisher).
    pub fn gemini_path(&self, endpoint: crate::protocol::Endpoint, model: &str, stream: bool) -> String {
        format!("{}/google{}", self.path, crate::protocol::gemini::upstream_path(endpoint, model, stream))
    }

    /// A current access token (cached; fetched when missing or about to
    /// expire). The error never holds the token or key.
    pub async fn token(&self) -> Result<String, TokenError> {
        match &self.tokens {
            Tokens::Provider { from, provider } => {
                let provider = provider
                    .get_or_try_init(|| async {
                        match from {
                            GoogleAuth::Default => gcp_auth::provider().await.map_err(|e| e.to_string()),
                            _ => Err("no token provider".to_owned()),
                        }
                    })
                    .await
                    .map_err(TokenError::NoCredentials)?;
                let token = provider.token(&[SCOPE]).await.map_err(|e| TokenError::NoToken(e.to_string()))?;
                // A token is a secret too (registering one already known is a look-up).
                crate::secrets::register(token.as_str());
                Ok(token.as_str().to_owned())
            }
            Tokens::Command { command, ttl, cached } => {
                let mut cached = cached.lock().await;
                if let Some((token, at)) = cached.as_ref()
                    && at.elapsed() < *ttl
                {
                    return Ok(token.clone());
                }
                let token = run(command).await?;
                crate::secrets::register(&token);
                *cached = Some((token.clone(), Instant::now()));
                Ok(token)
            }
        }
    }
}

/// Why there is no access token. No variant holds a token or key, and a
/// failed command's output is not repeated (it may hold a credential).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// `credentials_file` could not be read as a service account key.
    #[error("credentials_file {0}: {1}")]
    KeyFile(String, String),
    /// No application default credentials were found.
    #[error("no Google credentials: {0}")]
    NoCredentials(String),
    /// The credentials gave no token.
    #[error("no access token: {0}")]
    NoToken(String),
    /// `token_command` ran too long.
    #[error("token_command took over {0:?}")]
    CommandSlow(Duration),
    /// `token_command` could not be started.
    #[error("token_command could not run: {0}")]
    CommandNotRun(String),
    /// `token_command` exited with a failure.
    #[error("token_command failed ({0})")]
    CommandFailed(String),
    /// `token_command` printed no token on its first line.
    #[error("token_command printed no token")]
    NoTokenPrinted,
}

/// Runs `token_command`; its first line of output is the token.
async fn run(command: &str) -> Result<String, TokenError> {
    let mut child = tokio::process::Command::new("sh");
    child.arg("-c").arg(command).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.output())
        .await
        .map_err(|_| TokenError::CommandSlow(COMMAND_TIMEOUT))?
        .map_err(|e| TokenError::CommandNotRun(e.to_string()))?;
    if !output.status.success() {
        // Its output is not repeated: it may hold a credential.
        return Err(TokenError::CommandFailed(output.status.to_string()));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    match text.lines().next().map(str::trim) {
        Some(token) if !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()) => Ok(token.to_owned()),
        _ => Err(TokenError::NoTokenPrinted),
    }
}

/// The Messages body as Vertex takes it: no `model`, its own
/// `anthropic_version`.
pub fn body(original: &[u8]) -> Option<Bytes> {
    let version = serde_json::to_string(ANTHROPIC_VERSION).unwrap_or_default();
    super::rewrap(original, &["model"], &[("anthropic_version", version.as_str())])
}

/// The error kind of a Google RPC status (or, for a status it does not
/// name, of its HTTP code).
fn kind_of(status: &str, code: u64) -> ErrorKind {
    match status {
        "RESOURCE_EXHAUSTED" => ErrorKind::RateLimit,
        "UNAVAILABLE" => ErrorKind::Overloaded,
        "PERMISSION_DENIED" => ErrorKind::Permission,
        "UNAUTHENTICATED" => ErrorKind::Authentication,
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => ErrorKind::InvalidRequest,
        "NOT_FOUND" => ErrorKind::NotFound,
        _ => match code {
            429 => ErrorKind::RateLimit,
            503 | 529 => ErrorKind::Overloaded,
            401 => ErrorKind::Authentication,
            403 => ErrorKind::Permission,
            400 => ErrorKind::InvalidRequest,
            404 => ErrorKind::NotFound,
            _ => ErrorKind::Api,
        },
    }
}

/// A Google-shaped error (`{"error":{"code","message","status"}}`, or a
/// list of them) as the Anthropic error it stands for; `None` for anything
/// else (Anthropic's own errors pass as they are).
pub fn error_body(body: &[u8]) -> Option<Bytes> {
    let parsed: serde_json::Value = serde_json::from_slice(body).ok()?;
    let outer = parsed.as_array().and_then(|a| a.first()).unwrap_or(&parsed);
    let error = outer.get("error")?;
    let status = error.get("status").and_then(|s| s.as_str())?;
    let code = error.get("code").and_then(|c| c.as_u64()).unwrap_or(0);
    let message = error.get("message").and_then(|m| m.as_str()).unwrap_or_default();
    Some(super::anthropic_error(kind_of(status, code), status, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn google_errors_read_as_anthropic_ones() {
        let quota = br#"[{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model","status":"RESOURCE_EXHAUSTED"}}]"#;
        let v: serde_json::Value = serde_json::from_slice(&error_body(quota).unwrap()).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert!(v["error"]["message"].as_str().unwrap().starts_with("RESOURCE_EXHAUSTED: Quota exceeded"));
        let denied = br#"{"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED"}}"#;
        assert!(String::from_utf8_lossy(&error_body(denied).unwrap()).contains("permission_error"));
        assert!(error_body(br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#).is_none());
    }

    #[test]
    fn body_drops_the_model_and_sets_the_version() {
        let out = body(br#"{"model":"claude-x","stream":true,"max_tokens":1}"#).unwrap();
        assert_eq!(&out[..], br#"{"stream":true,"max_tokens":1,"anthropic_version":"vertex-2023-10-16"}"#);
    }
}
