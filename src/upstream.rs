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
use crate::protocol::Protocol;
use crate::retry::RetryBudget;

/// Upstream read buffer. hyper's default adaptive buffer starts at 8 KiB
/// per connection; LLM answers arrive as small SSE events or one modest
/// JSON document, so a smaller fixed buffer saves memory under thousands of
/// concurrent requests at no measurable throughput cost (see bench/).
const READ_BUF: usize = 2048;

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Client headers forwarded upstream. Everything else (the client's own
/// key, cookies, hop-by-hop headers, `accept-encoding` so bodies stay
/// readable for classification) stays behind.
const FORWARDED: &[&str] = &[
    "accept",
    "content-type",
    "user-agent",
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "idempotency-key",
];

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
    uri: Uri,
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
        let uri: Uri = format!("{}{}", config.base_url.as_str().trim_end_matches('/'), config.protocol.upstream_path())
            .parse()
            .map_err(|_| BuildError::Url(config.name.clone()))?;
        let auth = if config.api_key.is_empty() {
            None
        } else {
            let (name, value) = match config.protocol {
                Protocol::OpenAi => (header::AUTHORIZATION, format!("Bearer {}", config.api_key.expose())),
                Protocol::Anthropic => (HeaderName::from_static("x-api-key"), config.api_key.expose().to_owned()),
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
            uri,
            auth,
        })
    }

    /// The upstream request for a client request: same body bytes, this
    /// upstream's auth, the forwarded protocol headers, static headers.
    pub fn request(&self, body: Bytes, client: &HeaderMap) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        let headers = req.headers_mut();
        for name in FORWARDED {
            for value in client.get_all(*name) {
                headers.append(*name, value.clone());
            }
        }
        if !headers.contains_key(header::CONTENT_TYPE) {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if self.config.protocol == Protocol::Anthropic && !headers.contains_key("anthropic-version") {
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
