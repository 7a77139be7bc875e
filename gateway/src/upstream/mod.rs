//! One configured upstream: its HTTP client (pooled, or `Connection: close`
//! for providers that count idle connections as sessions), its URL and how
//! a client request becomes an upstream request.
//!
//! How the request is addressed, wrapped and signed depends on the
//! upstream's `kind` ([`crate::config::UpstreamKind`]): the provider's own
//! API, or the same models on a cloud ([`bedrock`], [`vertex`], [`azure`]).
//! Everything after (classification, limits, streams, journal) sees one
//! protocol's answers whatever the kind: a Bedrock stream arrives as
//! Anthropic SSE ([`eventstream`]), cloud errors as the protocol's errors.

mod azure;
pub mod bedrock;
mod body;
pub mod eventstream;
mod pool;
pub mod vertex;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::config::{UpstreamConfig, UpstreamKind};
use crate::headers;
use crate::headers::ANTHROPIC_VERSION;
use crate::health::Health;
use crate::limits::Limiter;
use crate::protocol::{Endpoint, Family, gemini};
use crate::retry::RetryBudget;
pub use body::UpstreamBody;
pub use pool::PooledBody;

/// Upstream read buffer. hyper's default adaptive buffer starts at 8 KiB
/// per connection; LLM answers arrive as small SSE events or one modest
/// JSON document, so a smaller fixed buffer saves memory under thousands of
/// concurrent requests at no measurable throughput cost (see bench/).
const READ_BUF: usize = 2048;

/// Client headers that never go upstream; every other header does, so the
/// correlation headers agents send (`session-id`, `x-codex-*`,
/// `openai-beta`, …) reach the provider even when the next client version
/// invents new ones. Dropped: the client's credentials (tidegate's key is
/// not the provider's), hop-by-hop headers, headers hyper sets for the new
/// connection (`host`, `content-length`), `accept-encoding` (bodies must
/// stay readable for classification) and tidegate's own `x-tidegate-*`.
const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "api-key",
    "cookie",
    "host",
    "content-length",
    "accept-encoding",
    "expect",
];

/// Whether a client header is forwarded upstream (see [`NOT_FORWARDED`]
/// and [`headers::HOP_BY_HOP`]); headers the client's `Connection` header
/// names are hop-by-hop too.
fn forwarded(name: &HeaderName, connection: &http::header::GetAll<'_, HeaderValue>) -> bool {
    let name = name.as_str();
    if NOT_FORWARDED.contains(&name) || headers::is_hop_by_hop(name) || name.starts_with(headers::PREFIX) {
        return false;
    }
    !connection
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case(name))
}

pub(crate) use crate::protocol::PATH_LABEL;

/// A cloud's error as the Anthropic error of the same meaning (the
/// protocol's own error body), its message keeping the cloud's name for
/// it (`ThrottlingException: …`, `RESOURCE_EXHAUSTED: …`).
fn anthropic_error(kind: crate::protocol::ErrorKind, name: &str, message: &str) -> Bytes {
    crate::protocol::anthropic::error_body(kind, &format!("{name}: {message}"))
}

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
    pool: Arc<pool::Pool>,
    /// One URL per endpoint this upstream's family serves (direct kind).
    uris: [Option<Uri>; Endpoint::ALL.len()],
    /// `base_url` without its trailing `/` (cloud kinds build their URLs
    /// per request: the model is part of the path).
    base: String,
    auth: Option<(HeaderName, HeaderValue)>,
    reach: Reach,
}

/// How requests are addressed and signed, per kind.
enum Reach {
    Direct,
    Bedrock(bedrock::Bedrock),
    Vertex(vertex::Vertex),
    Azure(azure::Azure),
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
    /// No credentials to sign or authorize the request with (a token that
    /// could not be had, a signature that could not be made).
    #[error("{0}")]
    Credentials(String),
}

/// Why an upstream body could not be read further.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The connection failed mid-body.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The body's framing was broken (a bad event-stream message).
    #[error(transparent)]
    Framing(#[from] eventstream::FrameError),
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
    /// Cloud credentials could not be loaded.
    #[error("upstream {0}: {1}")]
    Credentials(String, String),
}

impl Upstream {
    /// Builds the client and precomputes the request URI and auth header.
    pub fn new(
        config: UpstreamConfig,
        budget: RetryBudget,
        shared: Option<Arc<crate::shared::SharedState>>,
    ) -> Result<Self, BuildError> {
        let base = config.base_url.as_str().trim_end_matches('/');
        let reach = match &config.kind {
            UpstreamKind::Direct => Reach::Direct,
            UpstreamKind::Bedrock(b) => Reach::Bedrock(bedrock::Bedrock::new(b)),
            UpstreamKind::Vertex(v) => Reach::Vertex(
                vertex::Vertex::new(v).map_err(|e| BuildError::Credentials(config.name.clone(), e.to_string()))?,
            ),
            UpstreamKind::Azure(a) => Reach::Azure(azure::Azure::new(a)),
        };
        let mut uris: [Option<Uri>; Endpoint::ALL.len()] = Default::default();
        for (slot, endpoint) in uris.iter_mut().zip(Endpoint::ALL) {
            // Gemini's paths name the model: built per request.
            if matches!(reach, Reach::Direct) && config.protocol.serves(endpoint) && config.protocol != Family::Gemini {
                let uri = format!("{base}{}", endpoint.upstream_path()).parse();
                *slot = Some(uri.map_err(|_| BuildError::Url(config.name.clone()))?);
            }
        }
        let auth = if config.api_key.is_empty() {
            None
        } else {
            let (name, value) = match (&reach, config.protocol) {
                (Reach::Azure(_), _) => (HeaderName::from_static("api-key"), config.api_key.expose().to_owned()),
                (_, family) if family.bearer() => {
                    (header::AUTHORIZATION, format!("Bearer {}", config.api_key.expose()))
                }
                (_, Family::Gemini) => (HeaderName::from_static("x-goog-api-key"), config.api_key.expose().to_owned()),
                (_, _) => (HeaderName::from_static("x-api-key"), config.api_key.expose().to_owned()),
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
        let base_uri: Uri = base.parse().map_err(|_| BuildError::Url(config.name.clone()))?;
        let pool = pool::Pool::new(&base_uri, https, READ_BUF, !config.connection_close);
        Ok(Self {
            limiter: match &shared {
                Some(state) => Limiter::shared(config.limits.clone(), state.clone(), &config.name),
                None => Limiter::new(config.limits.clone()),
            },
            shared,
            health: Health::new(config.breaker.clone()),
            budget,
            base: base.to_owned(),
            config,
            pool,
            uris,
            auth,
            reach,
        })
    }

    /// Whether this upstream serves `endpoint`: its family does (and, on
    /// a cloud, the cloud offers it: Bedrock and Vertex serve messages).
    pub fn serves(&self, endpoint: Endpoint) -> bool {
        self.config.serves(endpoint)
    }

    /// How a request to `endpoint` reaches it: in the client's protocol,
    /// translated (when `translate` allows) to the protocol it speaks, or
    /// not at all (`None`).
    pub fn way(&self, endpoint: Endpoint, translate: bool) -> Option<crate::protocol::Way> {
        self.config.way(endpoint, translate)
    }

    /// The name of how it is reached, for traces and `/admin`
    /// (`anthropic`, `openai`, `bedrock`, `vertex`, `azure`).
    pub fn kind_name(&self) -> &'static str {
        match &self.reach {
            Reach::Direct => self.config.protocol.as_str(),
            _ => self.config.kind.as_str(),
        }
    }

    fn uri(&self, endpoint: Endpoint) -> Option<&Uri> {
        let i = Endpoint::ALL.iter().position(|e| *e == endpoint)?;
        self.uris.get(i)?.as_ref()
    }

    /// The upstream request for a client request to `endpoint`: the body
    /// bytes (the client's, with `model` for this target), the client's
    /// end-to-end headers (see [`NOT_FORWARDED`]), this upstream's auth
    /// and static headers; on a cloud, its URL, body envelope and
    /// signature.
    pub fn request(
        &self,
        endpoint: Endpoint,
        body: Bytes,
        model: &str,
        stream: bool,
        client: &HeaderMap,
    ) -> Result<Request<Full<Bytes>>, SendError> {
        let (uri, body) = match &self.reach {
            // Routing only sends an endpoint to upstreams that serve it;
            // the first URL is a harmless fallback.
            Reach::Direct if self.config.protocol == Family::Gemini => {
                (self.cloud_uri(&format!("/v1beta{}", gemini::upstream_path(endpoint, model, stream)))?, body)
            }
            Reach::Direct => (self.uri(endpoint).or_else(|| self.uris.iter().flatten().next()).cloned(), body),
            // Gemini models on Vertex: the same body, Google's own answers.
            Reach::Vertex(vertex) if self.config.protocol == Family::Gemini => {
                (self.cloud_uri(&vertex.gemini_path(endpoint, model, stream))?, body)
            }
            Reach::Azure(azure) => (self.cloud_uri(&azure.path(endpoint, model))?, body),
            Reach::Bedrock(_) => {
                let wrapped = bedrock::body(&body, client).ok_or_else(unwrappable)?;
                (self.cloud_uri(&bedrock::Bedrock::path(model, stream))?, wrapped)
            }
            Reach::Vertex(vertex) => {
                let wrapped = vertex::body(&body).ok_or_else(unwrappable)?;
                (self.cloud_uri(&vertex.path(model, stream))?, wrapped)
            }
        };
        let cloud = matches!(self.reach, Reach::Bedrock(_) | Reach::Vertex(_));
        // Only a signature needs the body again after it is handed over.
        let to_sign = matches!(self.reach, Reach::Bedrock(_)).then(|| body.clone());
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        if let Some(uri) = uri {
            *req.uri_mut() = uri;
        }
        let headers = req.headers_mut();
        // Sized once: the client's and this upstream's headers, and the
        // few set below (growing as they come reallocated it).
        headers.reserve(client.len() + self.config.headers.len() + 6);
        // The names `Connection` lists, looked up once for all headers.
        let connection = client.get_all(header::CONNECTION);
        for (name, value) in client {
            if forwarded(name, &connection) && !(cloud && moved_to_body(name, &self.reach)) {
                headers.append(name.clone(), value.clone());
            }
        }
        // Answers must stay readable: error bodies are classified and
        // streams scanned.
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if !headers.contains_key(header::CONTENT_TYPE) || cloud {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if self.config.protocol == Family::Anthropic && !cloud && !headers.contains_key(&ANTHROPIC_VERSION) {
            headers.insert(ANTHROPIC_VERSION, self.config.anthropic_version.clone());
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
        headers.insert(headers::HOP, HeaderValue::from_static("1"));
        if let (Reach::Bedrock(aws), Some(body)) = (&self.reach, to_sign) {
            let accept = if stream { eventstream::CONTENT_TYPE } else { "application/json" };
            req.headers_mut().insert(header::ACCEPT, HeaderValue::from_static(accept));
            // The signed host is the one sent.
            if let Some(host) = req.uri().authority().and_then(|a| HeaderValue::try_from(a.as_str()).ok()) {
                req.headers_mut().insert(header::HOST, host);
            }
            aws.sign(&mut req, &body, std::time::SystemTime::now())
                .map_err(|e| SendError::Credentials(e.to_string()))?;
        }
        Ok(req)
    }

    fn cloud_uri(&self, path: &str) -> Result<Option<Uri>, SendError> {
        let uri = format!("{}{path}", self.base).parse::<Uri>();
        uri.map(Some).map_err(|_| SendError::Transport(format!("not a valid URL: {}{path}", self.base)))
    }

    /// Sends a request and waits up to `timeout` for the response headers
    /// (not the body); a Vertex request gets its access token first.
    #[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
    pub fn send(
        &self,
        mut req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, SendError>> + Send + '_ {
        // Not an `async fn`: that would keep the request twice in the
        // future (see `relay::relay`).
        async move {
            let mut left = timeout;
            if let Reach::Vertex(vertex) = &self.reach {
                let started = tokio::time::Instant::now();
                // Boxed: the token future (with gcp_auth's provider discovery)
                // is kilobytes, and inline it would grow every request's
                // future, Vertex or not.
                let token = tokio::time::timeout(timeout, Box::pin(vertex.token()))
                    .await
                    .map_err(|_| SendError::Timeout(timeout))?
                    .map_err(|e| SendError::Credentials(e.to_string()))?;
                let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                    .map_err(|_| SendError::Credentials("the access token cannot be sent as a header".into()))?;
                value.set_sensitive(true);
                req.headers_mut().insert(header::AUTHORIZATION, value);
                left = timeout.saturating_sub(started.elapsed());
            }
            let resp = match tokio::time::timeout(left, self.pool.send(req)).await {
                Err(_) => return Err(SendError::Timeout(timeout)),
                Ok(Err(err)) => return Err(SendError::Transport(err.to_string())),
                Ok(Ok(resp)) => resp,
            };
            let (mut parts, incoming) = resp.into_parts();
            let framed = matches!(self.reach, Reach::Bedrock(_))
                && parts.status.is_success()
                && parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(eventstream::CONTENT_TYPE.as_bytes()));
            let body = if framed {
                parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                // The frames' length is not the events' (an answer that
                // kept it ended the client's connection as cut short).
                parts.headers.remove(header::CONTENT_LENGTH);
                UpstreamBody::EventStream(Box::new(eventstream::EventStreamSse::new(incoming)))
            } else {
                UpstreamBody::Plain(incoming)
            };
            Ok(Response::from_parts(parts, body))
        }
    }

    /// An error answer in the protocol's own shape: a cloud's error
    /// (Bedrock's exceptions, Google's RPC statuses) becomes the protocol
    /// error of the same meaning; anything else is returned as it came.
    pub fn error_body(&self, parts: &mut http::response::Parts, body: Bytes) -> Bytes {
        // The provider's text, before anything reads it: no configured
        // secret in it goes further (see `crate::secrets`).
        crate::secrets::scrub_headers(&mut parts.headers);
        let body = crate::secrets::scrub_bytes(body);
        let converted = match &self.reach {
            Reach::Bedrock(_) => bedrock::error_body(&parts.headers, &body),
            // Gemini's errors are Google's already.
            Reach::Vertex(_) if self.config.protocol == Family::Gemini => None,
            Reach::Vertex(_) => vertex::error_body(&body),
            Reach::Direct | Reach::Azure(_) => None,
        };
        match converted {
            Some(converted) => {
                parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                parts.headers.remove(header::CONTENT_LENGTH);
                converted
            }
            None => body,
        }
    }
}

/// A body that is not a JSON object cannot be wrapped for a cloud (the
/// handler already refused such bodies; this is the safety net).
fn unwrappable() -> SendError {
    SendError::Transport("the request body is not a JSON object".into())
}

/// Client headers a cloud kind carries in the body (or sets itself)
/// instead of forwarding them.
fn moved_to_body(name: &HeaderName, reach: &Reach) -> bool {
    let name = name.as_str();
    match reach {
        Reach::Bedrock(_) => name.starts_with("anthropic-") || name.starts_with("x-amz-"),
        Reach::Vertex(_) => name == "anthropic-version",
        Reach::Direct | Reach::Azure(_) => false,
    }
}

/// `original` (a JSON object) without the `drop` keys and with `add`
/// (key, JSON literal) appended, every other member kept byte for byte and
/// in order; `None` if it is not an object. Used by the cloud kinds, whose
/// body envelopes differ from the protocol's in a few top-level fields.
fn rewrap(original: &[u8], drop: &[&str], add: &[(&str, &str)]) -> Option<Bytes> {
    let members: indexmap::IndexMap<String, &serde_json::value::RawValue> = serde_json::from_slice(original).ok()?;
    let mut out = Vec::with_capacity(original.len() + 64);
    out.push(b'{');
    let kept = members.iter().filter(|(k, _)| !drop.contains(&k.as_str()) && !add.iter().any(|(a, _)| a == k));
    let added = add.iter().map(|(k, v)| (*k, *v));
    for (i, (key, value)) in kept.map(|(k, v)| (k.as_str(), v.get())).chain(added).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
    Some(Bytes::from(out))
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
