//! Thin handlers: authenticate, read, route, relay, label the answer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, header, request::Parts};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::time::Duration;

use tokio::time::Instant;

use super::Gateway;
use super::auth::authenticate;
use crate::error::GatewayError;
use crate::protocol::{self, PeekError, Protocol};
use crate::relay;
use crate::upstream::HOP_HEADER;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(&gw, Protocol::OpenAi, req).await
}

/// `POST /v1/messages`.
pub async fn messages(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    proxy(&gw, Protocol::Anthropic, req).await
}

/// `GET /v1/models`: the configured aliases. Clients that send
/// `anthropic-version` (the Anthropic SDK) get Anthropic's list shape and
/// aliases; everyone else OpenAI's.
pub async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let protocol = if headers.contains_key("anthropic-version") { Protocol::Anthropic } else { Protocol::OpenAi };
    if authenticate(&gw.config.client_keys, &headers).is_err() {
        return GatewayError::Unauthorized.into_response(protocol);
    }
    let aliases = gw.config.aliases(protocol);
    let body = match protocol {
        Protocol::OpenAi => protocol::openai::models_list(aliases),
        Protocol::Anthropic => protocol::anthropic::models_list(aliases),
    };
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Any other path: a protocol-shaped 404 instead of an empty body.
pub async fn fallback(req: Request) -> Response {
    let protocol = if req.headers().contains_key("anthropic-version") { Protocol::Anthropic } else { Protocol::OpenAi };
    GatewayError::NoRoute(format!("{} {}", req.method(), req.uri().path())).into_response(protocol)
}

/// What the one log line per request reports.
#[derive(Default)]
struct Facts<'a> {
    client: Option<&'a str>,
    model: Option<String>,
    stream: bool,
    upstream: Option<usize>,
    attempts: usize,
}

async fn proxy(gw: &Gateway, protocol: Protocol, req: Request) -> Response {
    let started = Instant::now();
    let id = uuid::Uuid::now_v7();
    let (parts, body) = req.into_parts();
    let mut facts = Facts::default();
    let gone = ClientGone { id };
    let mut resp = match handle(gw, protocol, &parts, body, &mut facts).await {
        Ok(resp) => resp,
        Err(err) => err.into_response(protocol),
    };
    let upstream = facts.upstream.and_then(|i| gw.upstreams.get(i)).map(|u| u.config.name.as_str());
    let headers = resp.headers_mut();
    if let Ok(v) = HeaderValue::try_from(id.to_string()) {
        headers.insert("x-tidegate-request-id", v);
    }
    let upstream_header = upstream.and_then(|u| HeaderValue::try_from(u).ok());
    headers.insert("x-tidegate-upstream", upstream_header.unwrap_or(HeaderValue::from_static("none")));
    headers.insert("x-tidegate-attempts", HeaderValue::from(facts.attempts));
    tracing::info!(
        id = %id,
        client = facts.client.unwrap_or("-"),
        model = facts.model.as_deref().unwrap_or("-"),
        stream = facts.stream,
        upstream = upstream.unwrap_or("-"),
        attempts = facts.attempts,
        status = resp.status().as_u16(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    // Answered: disarm the cancellation log line.
    std::mem::forget(gone);
    resp
}

/// Logs a request whose client disconnected before the answer was ready
/// (hyper then drops the handler future, and with it the upstream call).
struct ClientGone {
    id: uuid::Uuid,
}

impl Drop for ClientGone {
    fn drop(&mut self) {
        tracing::info!(id = %self.id, "request cancelled: the client went away before the answer");
    }
}

async fn handle<'g>(
    gw: &'g Gateway,
    protocol: Protocol,
    parts: &Parts,
    body: Body,
    facts: &mut Facts<'g>,
) -> Result<Response, GatewayError> {
    facts.client = authenticate(&gw.config.client_keys, &parts.headers).map_err(|()| GatewayError::Unauthorized)?;
    let body = read_body(body, &parts.headers, gw.config.max_body).await?;
    let head = protocol::peek(&body).map_err(|e| match e {
        PeekError::Malformed(_) | PeekError::MissingModel | PeekError::ModelNotString => {
            GatewayError::BadRequest(e.to_string())
        }
    })?;
    facts.model = Some(head.model.clone());
    facts.stream = head.stream;
    let route = match gw.config.route(&head.model) {
        Some(route) if route.protocol == protocol => route,
        Some(route) => {
            return Err(GatewayError::UnknownModel(format!(
                "model {:?} is served on {} ({} protocol), not on {}",
                head.model,
                route.protocol.endpoint(),
                route.protocol,
                protocol.endpoint()
            )));
        }
        None => {
            let known: Vec<&str> = gw.config.aliases(protocol).collect();
            return Err(GatewayError::UnknownModel(format!(
                "model {:?} is not configured on this gateway; available: {}",
                head.model,
                if known.is_empty() { "(none)".to_string() } else { known.join(", ") }
            )));
        }
    };
    let deadline = deadline(route.deadline, &parts.headers)?;
    let settings = relay::Settings { policy: &gw.config.retry, stop_client_retries: gw.config.stop_client_retries };
    let relayed = relay::relay(
        &gw.upstreams,
        &settings,
        relay::RelayRequest {
            protocol,
            route,
            head: &head,
            body: &body,
            client_headers: &parts.headers,
            deadline,
            chained: parts.headers.contains_key(HOP_HEADER),
        },
    )
    .await;
    facts.upstream = relayed.upstream;
    facts.attempts = relayed.attempts.len();
    Ok(relayed.response)
}

/// The request's deadline: the alias's, shortened (never lengthened) by a
/// client's `x-tidegate-deadline: 30s`.
fn deadline(route_deadline: Duration, headers: &HeaderMap) -> Result<Instant, GatewayError> {
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
    Ok(Instant::now() + budget)
}

/// Reads the whole request body, refusing more than `max` bytes (at once
/// from `Content-Length` when the client sent one).
async fn read_body(body: Body, headers: &HeaderMap, max: usize) -> Result<Bytes, GatewayError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(GatewayError::TooLarge { limit: max });
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(GatewayError::TooLarge { limit: max }),
        Err(err) => Err(GatewayError::BadRequest(format!("could not read the request body: {err}"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_codes_are_the_documented_ones() {
        use super::*;
        use http::StatusCode;
        assert_eq!(GatewayError::TooLarge { limit: 1 }.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(GatewayError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
    }
}
