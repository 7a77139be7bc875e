//! Thin handlers: authenticate, read, route, hand over to the relay, label
//! the answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue, header, request::Parts};
use tokio::time::Instant;

use super::auth::{authenticate, local_only};
use super::body;
use crate::anomaly::Verdict;
use crate::config::ModelRoute;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::limits::Priority;
use crate::protocol::{self, Endpoint, Family, Protocol};
use crate::record::Outcome;
use crate::relay::waiting::{Progress, RelayFuture, WaitingBody};
use crate::relay::{self, Answer, Job, Relayed};
use crate::report::Report;
use crate::upstream::HOP_HEADER;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(gw, Endpoint::ChatCompletions, req).await
}

/// `POST /v1/responses` (the OpenAI Responses API; Codex speaks only this).
pub async fn responses(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(gw, Endpoint::Responses, req).await
}

/// `POST /v1/embeddings`.
pub async fn embeddings(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(gw, Endpoint::Embeddings, req).await
}

/// `POST /v1/messages`.
pub async fn messages(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(gw, Endpoint::Messages, req).await
}

/// `POST /v1/messages/count_tokens`.
pub async fn count_tokens(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(gw, Endpoint::CountTokens, req).await
}

/// The protocol a request outside the model endpoints is answered in:
/// Anthropic's for clients that send `anthropic-version`, else OpenAI's.
fn protocol_of(headers: &HeaderMap) -> Protocol {
    if headers.contains_key("anthropic-version") { Protocol::Anthropic } else { Protocol::OpenAiChat }
}

/// `GET /v1/models`: the configured aliases (patterns are not listed: they
/// are not names a client can pick). Clients that send
/// `anthropic-version` (the Anthropic SDK) get Anthropic's list shape and
/// aliases; everyone else OpenAI's.
pub async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let protocol = protocol_of(&headers);
    if authenticate(&gw.config.client_keys, &headers).is_err() {
        return GatewayError::Unauthorized.into_response(protocol);
    }
    let family = protocol.family();
    let aliases = gw.config.aliases(family);
    let body = match family {
        Family::OpenAi => protocol::openai_chat::models_list(aliases),
        Family::Anthropic => protocol::anthropic::models_list(aliases),
    };
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /healthz`: `200 ok` while serving, `503 draining` once a shutdown
/// began (a load balancer then stops sending requests here).
pub async fn healthz(State(gw): State<Arc<Gateway>>) -> Response {
    if gw.draining.load(std::sync::atomic::Ordering::Acquire) {
        return (http::StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    "ok\n".into_response()
}

/// `GET /` and `HEAD /`: clients probe their base URL before the first
/// request (older Claude Code versions send `HEAD /`).
pub async fn root() -> &'static str {
    "tidegate\n"
}

/// Any other path: a protocol-shaped 404 instead of an empty body.
pub async fn fallback(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let protocol = protocol_of(req.headers());
    let error = GatewayError::NoRoute(format!("{} {}", req.method(), req.uri().path()));
    let (parts, body) = req.into_parts();
    body::discard(body, &parts.headers, gw.config.body_timeout).await;
    gw.sink.refused(error.reason());
    label(error.into_response(protocol), crate::request_id::next(), None, 0)
}

/// A known path with the wrong method: a protocol-shaped 405.
pub async fn wrong_method(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let protocol = protocol_of(req.headers());
    let error = GatewayError::WrongMethod(format!("{} {}", req.method(), req.uri().path()));
    let (parts, body) = req.into_parts();
    body::discard(body, &parts.headers, gw.config.body_timeout).await;
    gw.sink.refused(error.reason());
    label(error.into_response(protocol), crate::request_id::next(), None, 0)
}

/// A model endpoint's request, from arrival to the answer's head.
#[allow(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
pub(super) fn proxy(gw: Arc<Gateway>, endpoint: Endpoint, req: Request) -> impl Future<Output = Response> + Send {
    // Not an `async fn`: it would keep the request twice in this future,
    // which lives as long as the request (see `relay::relay`).
    async move {
        let protocol = endpoint.protocol();
        let id = crate::request_id::next();
        // One clock read for the request's arrival: its report, deadline,
        // lane and volume count all start from it.
        let arrived = Instant::now();
        let mut report = Report::new(id, arrived).into(gw.sink.clone());
        if gw.draining.load(std::sync::atomic::Ordering::Acquire) {
            // Shutting down: an honest 503 at once, and no keep-alive, so the
            // client goes to another replica.
            let error = GatewayError::ShuttingDown;
            let (parts, body) = req.into_parts();
            body::discard(body, &parts.headers, gw.config.body_timeout).await;
            report.status = error.status().as_u16();
            report.error = Some(error.to_string());
            report.finish(Outcome::Rejected);
            let mut response = label(error.into_response(protocol), id, None, 0);
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        let (parts, body) = req.into_parts();
        let mut job = match prepare(&gw, endpoint, parts, body, &mut report).await {
            Ok(job) => job,
            Err(error) => {
                report.status = error.status().as_u16();
                report.error = Some(error.to_string());
                if let GatewayError::Unauthorized | GatewayError::Forbidden(_) = &error {
                    report.counted_only = !gw.sink.refused(error.reason());
                }
                report.finish(Outcome::Rejected);
                return label(error.into_response(protocol), id, None, 0);
            }
        };
        if let Verdict::Flood { first, count, baseline } = gw.anomaly.observe(&job.who.name, arrived) {
            report.anomaly = true;
            let penalised = job.lane.as_ref().is_some_and(|lane| lane.flagged(Instant::now()));
            if let (true, Some(lane)) = (penalised, &job.lane) {
                // This request already goes at the penalty's priority.
                job.who = lane.who(Some(job.who.priority), Instant::now());
            }
            if first {
                gw.sink.metrics.anomaly(&job.who.name);
                tracing::warn!(
                    client = %job.who.name,
                    count,
                    baseline,
                    penalised,
                    "request volume far above this client's baseline"
                );
            }
        }
        let keepalive = if job.head.stream { gw.config.stream_keepalive_after } else { None };
        let progress = job.progress.clone();
        let mut relay_future: RelayFuture = Box::pin(relay::relay(job));
        let relayed = match keepalive {
            None => relay_future.await,
            Some(after) => {
                tokio::select! {
                    relayed = &mut relay_future => relayed,
                    () = tokio::time::sleep(after) => {
                        return commit_waiting(&gw, protocol, relay_future, progress, report);
                    }
                }
            }
        };
        respond(&gw, protocol, relayed, report)
    }
}

/// The relay finished before any keep-alive: answer with its result.
fn respond(gw: &Gateway, protocol: Protocol, relayed: Relayed, mut report: Report) -> Response {
    let upstream = relayed.upstream.and_then(|i| gw.sink.names.get(i)).cloned();
    let attempts = relayed.attempts.len();
    report.upstream = upstream.clone();
    report.attempts = relayed.attempts;
    report.queue_wait = relayed.queue_wait;
    report.pass = relayed.pass;
    report.class = relayed.answer.class();
    let id = report.id;
    let response = match relayed.answer {
        Answer::Stream(parts, mut body) => {
            report.status = parts.status.as_u16();
            body.attach(report);
            Answer::Stream(parts, body).into_response(protocol)
        }
        other => {
            let outcome = match &other {
                Answer::Gateway(GatewayError::QueueFull { .. } | GatewayError::ClientLimit { .. }) => Outcome::Rejected,
                Answer::Gateway(_) => Outcome::Failed,
                // The upstream's own error, passed on: the request failed.
                Answer::Verbatim { .. } => Outcome::Failed,
                Answer::Stream(..) => Outcome::Completed,
            };
            if let Answer::Gateway(error) = &other {
                report.error = Some(error.to_string());
            }
            let response = other.into_response(protocol);
            report.status = response.status().as_u16();
            report.finish(outcome);
            response
        }
    };
    label(response, id, upstream.as_deref(), attempts)
}

/// The relay is still waiting after `stream_keepalive_after`: commit 200
/// and SSE headers now, and let the body run the rest of the loop.
fn commit_waiting(
    gw: &Gateway,
    protocol: Protocol,
    relay: RelayFuture,
    progress: Arc<Progress>,
    mut report: Report,
) -> Response {
    report.status = 200;
    let id = report.id;
    let attempts = progress.attempt.load(std::sync::atomic::Ordering::Relaxed) as usize;
    let body =
        WaitingBody::new(relay, gw.config.stream_keepalive_every, progress, gw.sink.names.clone(), protocol, report);
    let mut response = Response::new(Body::new(body));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    label(response, id, None, attempts)
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-tidegate-request-id");
const UPSTREAM: HeaderName = HeaderName::from_static("x-tidegate-upstream");
const ATTEMPTS: HeaderName = HeaderName::from_static("x-tidegate-attempts");
const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The headers every answer carries. (Static names and small counts
/// need no allocation: this runs for every request.)
fn label(mut response: Response, id: uuid::Uuid, upstream: Option<&str>, attempts: usize) -> Response {
    let headers = response.headers_mut();
    let mut text = uuid::Uuid::encode_buffer();
    if let Ok(v) = HeaderValue::from_str(id.hyphenated().encode_lower(&mut text)) {
        headers.insert(REQUEST_ID, v);
    }
    let upstream = upstream.and_then(|u| HeaderValue::try_from(u).ok());
    headers.insert(UPSTREAM, upstream.unwrap_or(HeaderValue::from_static("none")));
    let attempts = match DIGITS.get(attempts) {
        Some(digit) => HeaderValue::from_static(digit),
        None => HeaderValue::from(attempts),
    };
    headers.insert(ATTEMPTS, attempts);
    response
}

/// Everything before the first upstream call: auth, body, model, route,
/// deadline. Errors here are tidegate's own answers.
#[allow(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice in its future")]
fn prepare<'a>(
    gw: &'a Arc<Gateway>,
    endpoint: Endpoint,
    parts: Parts,
    body: Body,
    report: &'a mut Report,
) -> impl Future<Output = Result<Job, GatewayError>> + Send + 'a {
    // Not an `async fn`: it would keep the request's head twice.
    async move {
        let admitted = match authenticate(&gw.config.client_keys, &parts.headers) {
            Ok(name) if !gw.config.client_keys.is_empty() => Ok(name),
            Ok(name) => {
                local_only(&parts.headers, &gw.config.allowed_origins).map(|()| name).map_err(GatewayError::Forbidden)
            }
            Err(()) => Err(GatewayError::Unauthorized),
        };
        match admitted {
            Ok(name) => report.client = name.map(str::to_owned),
            Err(refused) => {
                body::discard(body, &parts.headers, gw.config.body_timeout).await;
                return Err(refused);
            }
        }
        let body = body::read(body, &parts.headers, gw.config.max_body, gw.config.body_timeout).await?;
        let head = protocol::peek(&body).map_err(|e| GatewayError::BadRequest(e.to_string()))?;
        report.stream = head.stream;
        let found = gw.config.find_route(&head.model);
        // A configured alias is recorded as the config's shared string; a name
        // a pattern matched, as asked.
        report.model =
            Some(match found.and_then(|(i, _)| gw.aliases.get(i)).filter(|a| a.as_ref() == head.model.as_str()) {
                Some(alias) => alias.clone(),
                None => Arc::from(head.model.as_str()),
            });
        let family = endpoint.protocol().family();
        let (route, model) = match found {
            Some((index, model)) if model.protocol == family => (index, model),
            Some((_, model)) => {
                return Err(GatewayError::UnknownModel(format!(
                    "model {:?} is served by {} upstreams, not on {endpoint} ({}: {})",
                    head.model,
                    model.protocol,
                    model.protocol,
                    endpoints_of(model.protocol)
                )));
            }
            None => {
                let known: Vec<&str> = gw.config.aliases(family).collect();
                return Err(GatewayError::UnknownModel(format!(
                    "model {:?} is not configured on this gateway; available: {}",
                    head.model,
                    if known.is_empty() { "(none)".to_string() } else { known.join(", ") }
                )));
            }
        };
        let serving = |t: &crate::config::Target| gw.upstreams.get(t.upstream).is_some_and(|u| u.serves(endpoint));
        if !model.targets.iter().any(serving) {
            let kinds: Vec<&str> =
                model.targets.iter().filter_map(|t| gw.upstreams.get(t.upstream)).map(|u| u.kind_name()).collect();
            return Err(GatewayError::UnknownModel(format!(
                "model {:?} has no target that serves {endpoint} (its upstreams are {}; bedrock and vertex serve \
                 /v1/messages only)",
                head.model,
                kinds.join(", ")
            )));
        }
        let deadline = deadline(model.deadline, &parts.headers, report.started)?;
        let pin = match &head.previous_response_id {
            Some(id) => pinned(gw, id, model).await?,
            None => None,
        };
        let asked = match parts.headers.get("x-tidegate-priority") {
            None => None,
            Some(v) => Some(Priority::parse(v.to_str().unwrap_or_default()).ok_or_else(|| {
                GatewayError::BadRequest(format!(
                    "x-tidegate-priority: {:?} is not a priority (interactive or batch)",
                    String::from_utf8_lossy(v.as_bytes())
                ))
            })?),
        };
        let lane = report.client.as_deref().and_then(|name| gw.lanes.get(name)).cloned();
        let trace = gw
            .sink
            .tracer
            .as_ref()
            .map(|_| Arc::new(crate::otel::TraceCtx::start(&parts.headers, endpoint.operation(), family.as_str())));
        report.trace = trace.clone();
        let who = match &lane {
            Some(lane) => lane.who(asked, report.started),
            None => gw.lanes.anonymous(asked.unwrap_or_default()),
        };
        Ok(Job {
            gw: gw.clone(),
            endpoint,
            route,
            chained: parts.headers.contains_key(HOP_HEADER),
            head,
            body,
            client_headers: unpinned(parts.headers),
            deadline,
            progress: Arc::new(Progress::default()),
            who,
            lane,
            trace,
            resumes: relay::MAX_RESUMES,
            pin,
        })
    }
}

/// The client's headers with their values copied out of hyper's read
/// buffer. Parsed values are slices of that buffer; a request keeps its
/// headers and body to its end (retries resend them), and a buffer still
/// referenced cannot be reused in place: hyper's read for a client hanging
/// up mid-request then allocates a fresh one, and each request in flight
/// holds two. A few small copies cost less (peak RSS with 1000 requests in
/// flight −3 MiB, throughput unchanged: `bench/core.sh`). The values are
/// copied into one buffer that each new value is a slice of: two
/// allocations for all of them, not one each.
fn unpinned(headers: HeaderMap) -> HeaderMap {
    let mut copy = bytes::BytesMut::with_capacity(headers.values().map(|v| v.len()).sum());
    for value in headers.values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    let mut out = HeaderMap::with_capacity(headers.len());
    let mut at = 0;
    for (name, value) in &headers {
        let end = at + value.len();
        if let Ok(v) = HeaderValue::from_maybe_shared(copy.slice(at..end)) {
            out.append(name.clone(), v);
        }
        at = end;
    }
    out
}

/// The upstream that stores response `id`, which a request continuing it
/// must go to. Unknown ids (never seen, expired) are routed as usual: the
/// provider says whether it has them.
async fn pinned(gw: &Gateway, id: &str, route: &ModelRoute) -> Result<Option<usize>, GatewayError> {
    let Some(upstream) = gw.pins.find(id).await else { return Ok(None) };
    if route.targets.iter().any(|t| t.upstream == upstream) {
        return Ok(Some(upstream));
    }
    let name = gw.sink.names.get(upstream).map_or("?", String::as_str);
    Err(GatewayError::BadRequest(format!(
        "previous_response_id {id:?} is stored at upstream {name}, which this model does not route to; \
         ask the model that produced it"
    )))
}

/// The endpoints an upstream family serves, for messages.
fn endpoints_of(family: Family) -> String {
    let paths: Vec<&str> = Endpoint::ALL.iter().filter(|e| e.protocol().family() == family).map(|e| e.path()).collect();
    paths.join(", ")
}

/// The request's deadline: the alias's, shortened (never lengthened) by a
/// client's `x-tidegate-deadline: 30s`.
fn deadline(route_deadline: Duration, headers: &HeaderMap, arrived: Instant) -> Result<Instant, GatewayError> {
    let asked = match headers.get("x-tidegate-deadline") {
        None => None,
        Some(v) => {
            let text = v.to_str().unwrap_or_default().trim();
            match humantime::parse_duration(text) {
                Ok(d) => Some(d),
                Err(_) => return Err(GatewayError::BadDeadline(text.to_string())),
            }
        }
    };
    let budget = asked.map_or(route_deadline, |d| d.min(route_deadline));
    Ok(arrived + budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::StatusCode;

    #[test]
    fn status_codes_are_the_documented_ones() {
        assert_eq!(GatewayError::TooLarge { limit: 1 }.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(GatewayError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
    }
}
