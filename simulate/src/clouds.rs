//! The simulator's cloud endpoints: Amazon Bedrock, Google Vertex AI (and
//! its OAuth token endpoint) and Azure OpenAI, each checking what the real
//! one checks — a SigV4 signature (verified by re-signing with the same
//! crate tidegate signs with), a bearer token it issued for a JWT signed
//! by the service account's key, an `api-key` — and each answering in its
//! own way: Bedrock's event-stream framing and `x-amzn-ErrorType`
//! exceptions, Google's error shape. Behind the envelope every request is
//! answered by the same behaviour table as the protocol endpoints, so a
//! scenario's faults apply to the clouds too.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::{Bytes, BytesMut};
use http::{StatusCode, header};
use http_body::Frame;
use http_body_util::Full;
use serde::Deserialize;

use super::{SimState, arrive, respond, serve};
use tidegate::protocol::Endpoint;
use tidegate::upstream::{bedrock, eventstream, vertex};

/// Credentials the cloud endpoints insist on (each unchecked when unset).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Clouds {
    /// Bedrock: the one key pair whose signatures are accepted.
    pub aws: Option<AwsKey>,
    /// Vertex: tokens are issued for JWTs signed with this service
    /// account's key and required on every Vertex call.
    pub google: Option<GoogleAccount>,
    /// Azure: the `api-key` every call must carry.
    pub azure_key: Option<String>,
}

/// An AWS key pair and region.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsKey {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Region the signature must name.
    pub region: String,
}

/// The service account Vertex tokens are issued to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoogleAccount {
    /// Its key file (the same JSON tidegate is given).
    pub credentials_file: String,
    /// Lifetime of an issued token, in seconds.
    #[serde(default = "hour")]
    pub token_ttl_s: u64,
}

fn hour() -> u64 {
    3600
}

/// What the token endpoint knows of the account: its email, the audience
/// JWTs must name, and its public key (PKCS#1 DER).
pub(super) struct Account {
    email: String,
    token_uri: String,
    public_key: Vec<u8>,
    ttl: Duration,
}

impl Account {
    /// Reads the key file and derives the public key from its private key.
    pub(super) fn load(config: &GoogleAccount) -> std::io::Result<Account> {
        use ring::signature::KeyPair;
        use rustls_pki_types::pem::PemObject;
        let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        let text = std::fs::read_to_string(&config.credentials_file)?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad("key file is not JSON"))?;
        let field = |name: &str| json.get(name).and_then(|v| v.as_str()).map(str::to_owned).ok_or_else(|| bad(name));
        let pem = field("private_key")?;
        let der =
            rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| bad("private_key"))?;
        let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).map_err(|_| bad("private_key"))?;
        Ok(Account {
            email: field("client_email")?,
            token_uri: field("token_uri")?,
            public_key: pair.public_key().as_ref().to_vec(),
            ttl: Duration::from_secs(config.token_ttl_s.max(1)),
        })
    }
}

/// Bedrock error: `x-amzn-ErrorType` and `{"message"}`.
fn aws_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({ "message": message }).to_string();
    let mut resp = respond(status, "application/json", Body::from(body));
    if let Ok(v) = format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/").parse() {
        resp.headers_mut().insert("x-amzn-errortype", v);
    }
    resp
}

/// Google error: `{"error":{"code","message","status"}}`.
pub(super) fn google_error(code: u16, status: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message, "status": status } }).to_string();
    respond(StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST), "application/json", Body::from(body))
}

/// `body` with `model` (and `stream` when given) set: the protocol
/// request the cloud envelope stands for.
fn unwrap(body: &[u8], model: &str, stream: Option<bool>) -> Option<Bytes> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    v.insert("model".into(), model.into());
    if let Some(stream) = stream {
        v.insert("stream".into(), stream.into());
    }
    Some(Bytes::from(serde_json::Value::Object(v).to_string()))
}

/// `POST /model/{id}/invoke`.
pub(super) async fn bedrock_invoke(state: State<Arc<SimState>>, model: Path<String>, req: Request) -> Response {
    bedrock(state, model, false, req).await
}

/// `POST /model/{id}/invoke-with-response-stream`.
pub(super) async fn bedrock_stream(state: State<Arc<SimState>>, model: Path<String>, req: Request) -> Response {
    bedrock(state, model, true, req).await
}

async fn bedrock(
    State(state): State<Arc<SimState>>,
    Path(model): Path<String>,
    stream: bool,
    req: Request,
) -> Response {
    let (flight, parts, body) = arrive(&state, req).await;
    if let Some(key) = &state.config.clouds.aws
        && let Some(refusal) = refuse_sigv4(&parts, &body, key)
    {
        flight.finish();
        return refusal;
    }
    let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let problem = if envelope.get("model").is_some() {
        Some("extraneous key [model] is not permitted")
    } else if envelope.get("stream").is_some() {
        Some("extraneous key [stream] is not permitted")
    } else if envelope.get("anthropic_version").and_then(|v| v.as_str()) != Some(bedrock::ANTHROPIC_VERSION) {
        Some("anthropic_version: must be bedrock-2023-05-31")
    } else {
        None
    };
    let inner = problem.map_or_else(|| unwrap(&body, &model, Some(stream)).ok_or("Malformed input request"), Err);
    let inner = match inner {
        Ok(inner) => inner,
        Err(problem) => {
            flight.finish();
            return aws_error(StatusCode::BAD_REQUEST, "ValidationException", problem);
        }
    };
    let resp = serve(state, Endpoint::Messages, flight, inner).await;
    let sse = resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !(resp.status().is_success() && sse) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(eventstream::CONTENT_TYPE));
    let framed = Framed { inner: body, pending: BytesMut::new() };
    Response::from_parts(parts, Body::new(framed))
}

/// Re-signs the request as received with the known key and compares: a
/// wrong secret, key id, region or a changed byte are all refused as AWS
/// refuses them (`None`: the signature is good).
fn refuse_sigv4(parts: &http::request::Parts, body: &Bytes, key: &AwsKey) -> Option<Response> {
    verify_sigv4(parts, body, key).err().map(|boxed| *boxed)
}

fn verify_sigv4(parts: &http::request::Parts, body: &Bytes, key: &AwsKey) -> Result<(), Box<Response>> {
    let text = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let authorization = text("authorization");
    let invalid = || {
        aws_error(
            StatusCode::FORBIDDEN,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. \
             Check your AWS Secret Access Key and signing method.",
        )
    };
    let Some(rest) = authorization.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return Err(Box::new(aws_error(
            StatusCode::FORBIDDEN,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        )));
    };
    let field = |name: &str| {
        rest.split(", ").find_map(|part| part.strip_prefix(name).and_then(|p| p.strip_prefix('='))).unwrap_or_default()
    };
    let credential = field("Credential");
    let mut scope = credential.split('/');
    if scope.next() != Some(key.access_key_id.as_str()) {
        return Err(Box::new(aws_error(
            StatusCode::FORBIDDEN,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )));
    }
    if scope.nth(1) != Some(key.region.as_str()) {
        return Err(Box::new(invalid()));
    }
    let Ok(at) = jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", text("x-amz-date"))
        .and_then(|dt| jiff::tz::TimeZone::UTC.to_timestamp(dt))
    else {
        return Err(Box::new(invalid()));
    };
    let signed: Vec<String> = field("SignedHeaders")
        .split(';')
        .filter(|h| !h.starts_with("x-amz-date") && *h != "x-amz-security-token")
        .map(str::to_owned)
        .collect();
    let host = text("host");
    let mut again = http::Request::new(Full::new(body.clone()));
    *again.method_mut() = parts.method.clone();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{host}{path}").parse() else { return Err(Box::new(invalid())) };
    *again.uri_mut() = uri;
    for name in &signed {
        if let Some(v) = parts.headers.get(name.as_str())
            && let Ok(n) = http::HeaderName::try_from(name.as_str())
        {
            again.headers_mut().insert(n, v.clone());
        }
    }
    let token = parts.headers.get("x-amz-security-token").and_then(|v| v.to_str().ok());
    let identity = bedrock::identity(&key.access_key_id, &key.secret_access_key, token);
    let names: Vec<&str> = signed.iter().map(String::as_str).collect();
    let time = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(at.as_second()).unwrap_or(0));
    bedrock::sign_request(&mut again, body, &names, &identity, &key.region, "bedrock", time)
        .map_err(|_| Box::new(invalid()))?;
    if again.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(authorization.as_str()) {
        Ok(())
    } else {
        Err(Box::new(invalid()))
    }
}

/// An SSE body re-framed as Bedrock sends streams: each event a `chunk`
/// message, an `error` event an exception of the matching type.
struct Framed {
    inner: Body,
    pending: BytesMut,
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    this.pending.extend_from_slice(&data);
                    let mut out = BytesMut::new();
                    while let Some(end) = this.pending.windows(2).position(|w| w == b"\n\n") {
                        let event = this.pending.split_to(end + 2);
                        frame_event(&event, &mut out);
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                }
                other => return other,
            }
        }
    }
}

fn frame_event(event: &[u8], out: &mut BytesMut) {
    let text = String::from_utf8_lossy(event);
    let mut name = "";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    if data.is_empty() {
        return; // a comment or keep-alive: Bedrock has none
    }
    if name == "error" {
        let v: serde_json::Value = serde_json::from_str(&data).unwrap_or_default();
        let kind = match v["error"]["type"].as_str().unwrap_or_default() {
            "rate_limit_error" => "throttlingException",
            "overloaded_error" => "serviceUnavailableException",
            "invalid_request_error" => "validationException",
            _ => "modelStreamErrorException",
        };
        let message = v["error"]["message"].as_str().unwrap_or("error").to_owned();
        out.extend_from_slice(&eventstream::encode_exception(kind, &message));
    } else {
        out.extend_from_slice(&eventstream::encode_chunk(data.as_bytes()));
    }
}

/// `POST /v1/projects/{project}/locations/{region}/publishers/anthropic/
/// models/{model}:{rawPredict|streamRawPredict}`.
pub(super) async fn vertex(
    State(state): State<Arc<SimState>>,
    Path((_project, _region, action)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let (flight, parts, body) = arrive(&state, req).await;
    if !google_token_valid(&state, &parts.headers) {
        flight.finish();
        return google_error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    let Some((model, verb)) = action.rsplit_once(':') else {
        flight.finish();
        return google_error(404, "NOT_FOUND", "unknown method");
    };
    let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let fits = envelope.get("model").is_none()
        && envelope.get("anthropic_version").and_then(|v| v.as_str()) == Some(vertex::ANTHROPIC_VERSION)
        && matches!(verb, "rawPredict" | "streamRawPredict");
    let inner = if fits { unwrap(&body, model, None) } else { None };
    let Some(inner) = inner else {
        flight.finish();
        return google_error(
            400,
            "INVALID_ARGUMENT",
            "model must be in the URL and anthropic_version vertex-2023-10-16",
        );
    };
    serve(state, Endpoint::Messages, flight, inner).await
}

/// `POST /v1/projects/{p}/locations/{r}/publishers/google/models/
/// {model}:{method}`: Gemini on Vertex AI (an OAuth token when the
/// simulator holds a Google account; the body is Gemini's own).
pub(super) async fn vertex_gemini(State(state): State<Arc<SimState>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let (flight, parts, body) = arrive(&state, req).await;
    if !google_token_valid(&state, &parts.headers) {
        flight.finish();
        return google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.");
    }
    super::serve_gemini(state, &path, flight, body).await
}

/// A Vertex request's bearer token is one the simulated token endpoint
/// issued and still valid (always, when the simulator holds no account).
fn google_token_valid(state: &SimState, headers: &http::HeaderMap) -> bool {
    if state.config.clouds.google.is_none() {
        return true;
    }
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let token = bearer.strip_prefix("Bearer ").unwrap_or_default();
    state.tokens.lock().is_ok_and(|t| t.get(token).is_some_and(|until| *until > tokio::time::Instant::now()))
}

/// `POST /token`: Google's OAuth token endpoint for a service-account JWT
/// (RS256, signed with the account's key, naming this endpoint).
pub(super) async fn token(State(state): State<Arc<SimState>>, body: Bytes) -> Response {
    let refuse = |why: &str| {
        let body = serde_json::json!({ "error": "invalid_grant", "error_description": why }).to_string();
        respond(StatusCode::BAD_REQUEST, "application/json", Body::from(body))
    };
    let Some(account) = state.account.as_ref() else { return refuse("no service account configured") };
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return refuse("unsupported grant_type");
    }
    let jwt = form.get("assertion").map(String::as_str).unwrap_or_default();
    let mut parts = jwt.split('.');
    let (Some(head), Some(claims), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return refuse("not a JWT");
    };
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature.trim_end_matches('=')) else { return refuse("bad signature") };
    let key =
        ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, &account.public_key);
    if key.verify(format!("{head}.{claims}").as_bytes(), &signature).is_err() {
        return refuse("Invalid JWT Signature.");
    }
    let claims: serde_json::Value = URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()
        .and_then(|c| serde_json::from_slice(&c).ok())
        .unwrap_or_default();
    let now = jiff::Timestamp::now().as_second();
    let fits = claims["iss"] == account.email.as_str()
        && claims["aud"] == account.token_uri.as_str()
        && claims["scope"].as_str().is_some_and(|s| s.contains("cloud-platform"))
        && claims["exp"].as_i64().is_some_and(|exp| exp > now);
    if !fits {
        return refuse("Invalid JWT: claims do not fit this account");
    }
    let n = state.token_grants.fetch_add(1, Ordering::SeqCst);
    let token = format!("ya29.sim-{n}-{}", uuid::Uuid::new_v4().simple());
    if let Ok(mut tokens) = state.tokens.lock() {
        tokens.insert(token.clone(), tokio::time::Instant::now() + account.ttl);
    }
    let body =
        serde_json::json!({ "access_token": token, "expires_in": account.ttl.as_secs(), "token_type": "Bearer" });
    respond(StatusCode::OK, "application/json", Body::from(body.to_string()))
}

/// Azure OpenAI: deployment URLs (`?api-version=` required, the
/// deployment's model answers) and the v1 paths.
pub(super) async fn azure(
    state: Arc<SimState>,
    endpoint: Endpoint,
    deployment: Option<String>,
    req: Request,
) -> Response {
    let (flight, parts, body) = arrive(&state, req).await;
    let refuse = |status: StatusCode, code: &str, message: &str| {
        let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
        respond(status, "application/json", Body::from(body))
    };
    if let Some(key) = &state.config.clouds.azure_key
        && parts.headers.get("api-key").map(|v| v.as_bytes()) != Some(key.as_bytes())
    {
        flight.finish();
        return refuse(
            StatusCode::UNAUTHORIZED,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid \
                 key for an active subscription and use a correct regional API endpoint for your resource.",
        );
    }
    let body = match deployment {
        Some(deployment) => {
            if !parts.uri.query().is_some_and(|q| q.contains("api-version=")) {
                flight.finish();
                return refuse(
                    StatusCode::NOT_FOUND,
                    "404",
                    "Resource not found (the api-version query parameter is required)",
                );
            }
            let stream = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["stream"].as_bool());
            unwrap(&body, &deployment, stream).unwrap_or(body)
        }
        None => body,
    };
    serve(state, endpoint, flight, body).await
}

/// Routes Azure's paths to [`azure`].
pub(super) fn azure_routes(router: axum::Router<Arc<SimState>>) -> axum::Router<Arc<SimState>> {
    use axum::routing::post;
    let deployment = |endpoint: Endpoint| {
        move |State(state): State<Arc<SimState>>, Path(d): Path<String>, req: Request| async move {
            azure(state, endpoint, Some(d), req).await
        }
    };
    let v1 = |endpoint: Endpoint| {
        move |State(state): State<Arc<SimState>>, req: Request| async move { azure(state, endpoint, None, req).await }
    };
    router
        .route("/openai/deployments/{d}/chat/completions", post(deployment(Endpoint::ChatCompletions)))
        .route("/openai/deployments/{d}/embeddings", post(deployment(Endpoint::Embeddings)))
        .route("/openai/responses", post(v1(Endpoint::Responses)))
        .route("/openai/v1/chat/completions", post(v1(Endpoint::ChatCompletions)))
        .route("/openai/v1/embeddings", post(v1(Endpoint::Embeddings)))
        .route("/openai/v1/responses", post(v1(Endpoint::Responses)))
}
