//! One configured upstream: its HTTP client (pooled, or `Connection: close`
//! for providers that count idle connections as sessions), its URL and how
//! a client request becomes an upstream request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::UpstreamConfig;
use crate::health::Health;
use crate::limits::Limiter;
use crate::protocol::{Endpoint, Family};
use crate::retry::RetryBudget;

/// Upstream read buffer. hyper's default adaptive buffer starts at 8 KiB
/// per connection; LLM answers arrive as small SSE events or one modest
/// JSON document, so a smaller fixed buffer saves memory under thousands of
/// concurrent requests at no measurable throughput cost (see bench/).
const READ_BUF: usize = 2048;

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Client headers that never go upstream; every other header does, so the
/// correlation headers agents send (`session-id`, `x-codex-*`,
/// `openai-beta`, …) reach the provider even when the next client version
/// invents new ones. Dropped: the client's credentials (tidegate's key is
/// not the provider's), hop-by-hop headers, headers hyper sets for the new
/// connection (`host`, `content-length`), `accept-encoding` (bodies must
/// stay readable for classification) and tidegate's own `x-tidegate-*`.
const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "expect",
];

/// Whether a client header is forwarded upstream (see [`NOT_FORWARDED`]);
/// headers the client's `Connection` header names are hop-by-hop too.
fn forwarded(name: &HeaderName, client: &HeaderMap) -> bool {
    let name = name.as_str();
    if NOT_FORWARDED.contains(&name) || name.starts_with("x-tidegate-") {
        return false;
    }
    !client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case(name))
}

/// Marks a request that already passed through a tidegate.
pub const HOP_HEADER: &str = "x-tidegate-hop";

/// An upstream ready to take requests.
pub struct Upstream {
    /// Its configuration.
    pub config: UpstreamConfig,
    /// Retry budget shared by every request to this upstream.
    pub budget: RetryBudget,
    /// Queue, concurrency slots and rate buckets.
    pub limiter: Arc<Limiter>,
    /// Cooldown and circuit breaker.
    pub health: Health,
    /// Shared state, when replicas share limits and health.
    pub shared: Option<Arc<crate::shared::SharedState>>,
    client: HttpClient,
    /// One URL per endpoint this upstream's family serves.
    uris: [Option<Uri>; Endpoint::ALL.len()],
    auth: Option<(HeaderName, HeaderValue)>,
}

/// Why no response came back.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Connect, TLS or connection failure before response headers.
    #[error("{0}")]
    Transport(String),
    /// `header_timeout` elapsed.
    #[error("no response headers within {0:?}")]
    Timeout(Duration),
}

/// Why an upstream could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Base URL plus path is not a valid URI.
    #[error("upstream {0}: invalid URL")]
    Url(String),
    /// The shared state store could not be set up.
    #[error(transparent)]
    Shared(#[from] crate::shared::SharedError),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The OpenTelemetry exporter could not be built.
    #[error("{0}")]
    Otel(String),
    /// Key contains bytes that cannot go in a header.
    #[error("upstream {0}: api_key cannot be sent as a header")]
    Key(String),
}

impl Upstream {
    /// Builds the client and precomputes the request URI and auth header.
    pub fn new(
        config: UpstreamConfig,
        budget: RetryBudget,
        shared: Option<Arc<crate::shared::SharedState>>,
    ) -> Result<Self, BuildError> {
        let base = config.base_url.as_str().trim_end_matches('/');
        let mut uris: [Option<Uri>; Endpoint::ALL.len()] = Default::default();
        for (slot, endpoint) in uris.iter_mut().zip(Endpoint::ALL) {
            if endpoint.protocol().family() == config.protocol {
                let uri = format!("{base}{}", endpoint.upstream_path()).parse();
                *slot = Some(uri.map_err(|_| BuildError::Url(config.name.clone()))?);
            }
        }
        let auth = if config.api_key.is_empty() {
            None
        } else {
            let (name, value) = match config.protocol {
                Family::OpenAi => (header::AUTHORIZATION, format!("Bearer {}", config.api_key.expose())),
                Family::Anthropic => (HeaderName::from_static("x-api-key"), config.api_key.expose().to_owned()),
            };
            let mut value = HeaderValue::try_from(value).map_err(|_| BuildError::Key(config.name.clone()))?;
            value.set_sensitive(true);
            Some((name, value))
        };
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(if config.connection_close { 0 } else { usize::MAX })
            .http1_read_buf_exact_size(READ_BUF)
            .build(https);
        Ok(Self {
            limiter: match &shared {
                Some(state) => Limiter::shared(config.limits.clone(), state.clone(), &config.name),
                None => Limiter::new(config.limits.clone()),
            },
            shared,
            health: Health::new(config.breaker.clone()),
            budget,
            config,
            client,
            uris,
            auth,
        })
    }

    /// Whether this upstream serves `endpoint` (its family does).
    pub fn serves(&self, endpoint: Endpoint) -> bool {
        self.uri(endpoint).is_some()
    }

    fn uri(&self, endpoint: Endpoint) -> Option<&Uri> {
        let i = Endpoint::ALL.iter().position(|e| *e == endpoint)?;
        self.uris.get(i)?.as_ref()
    }

    /// The upstream request for a client request to `endpoint`: same body
    /// bytes, the client's end-to-end headers (see [`NOT_FORWARDED`]), this
    /// upstream's auth and static headers.
    pub fn request(&self, endpoint: Endpoint, body: Bytes, client: &HeaderMap) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        // Routing only sends an endpoint to upstreams of its family, which
        // have its URL; the first URL is a harmless fallback.
        let uri = self.uri(endpoint).or_else(|| self.uris.iter().flatten().next());
        if let Some(uri) = uri {
            *req.uri_mut() = uri.clone();
        }
        let headers = req.headers_mut();
        for (name, value) in client {
            if forwarded(name, client) {
                headers.append(name.clone(), value.clone());
            }
        }
        // Answers must stay readable: error bodies are classified and
        // streams scanned.
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if !headers.contains_key(header::CONTENT_TYPE) {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if self.config.protocol == Family::Anthropic && !headers.contains_key("anthropic-version") {
            headers.insert("anthropic-version", self.config.anthropic_version.clone());
        }
        if let Some((name, value)) = &self.auth {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.config.headers {
            headers.insert(name.clone(), value.clone());
        }
        if self.config.connection_close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // Tells a tidegate behind this one that we do the retrying.
        headers.insert(HOP_HEADER, HeaderValue::from_static("1"));
        req
    }

    /// Sends a request and waits up to `timeout` for the response headers
    /// (not the body).
    pub async fn send(&self, req: Request<Full<Bytes>>, timeout: Duration) -> Result<Response<Incoming>, SendError> {
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Err(_) => Err(SendError::Timeout(timeout)),
            Ok(Err(err)) => Err(SendError::Transport(describe(&err))),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

/// A transport error with its causes, e.g. "connect error: Connection refused".
fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
