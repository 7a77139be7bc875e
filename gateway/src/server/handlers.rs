//! Thin handlers: admit (key, origin, body) and hand the request to its
//! [`Exchange`], which routes it, runs the attempt loop and answers.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, header};

use crate::admission::auth::{GOOG_API_KEY, authenticate, key_from_query};
use crate::admission::body;
use crate::error::GatewayError;
use crate::exchange::Exchange;
use crate::gateway::Gateway;
use crate::headers;
use crate::protocol::{self, Endpoint, Protocol};

/// The protocol a request outside the model endpoints is answered in:
/// Anthropic's for clients that send `anthropic-version`, Google's for
/// paths under `/v1beta` or clients that send `x-goog-api-key`, else
/// OpenAI's.
fn protocol_of(uri: &http::Uri, headers: &HeaderMap) -> Protocol {
    if headers.contains_key(headers::ANTHROPIC_VERSION) {
        Protocol::Anthropic
    } else if uri.path().starts_with("/v1beta/") || headers.contains_key(GOOG_API_KEY) {
        Protocol::Gemini
    } else {
        Protocol::OpenAiChat
    }
}

/// `GET /v1/models` and `GET /v1beta/models`: the configured aliases
/// (patterns are not listed: they are not names a client can pick), in
/// the shape of the client's protocol ([`protocol_of`]).
pub async fn models(State(gw): State<Arc<Gateway>>, uri: http::Uri, mut headers: HeaderMap) -> Response {
    let protocol = protocol_of(&uri, &headers);
    key_from_query(&uri, &mut headers);
    if authenticate(&gw.config.client_keys, &headers).is_err() {
        return GatewayError::Unauthorized.into_response(protocol);
    }
    let aliases = gw.config.aliases();
    let body = match protocol {
        Protocol::Anthropic => protocol::anthropic::models_list(aliases),
        Protocol::Gemini => protocol::gemini::models_list(aliases),
        Protocol::OpenAiChat | Protocol::OpenAiResponses => protocol::openai_chat::models_list(aliases),
    };
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `/v1beta/models/{model}[:method]` (and `POST /v1/models/{model}:method`)
/// when served by the route table: a POST to a method goes to its model
/// endpoint, `GET /v1beta/models/{alias}` describes one alias.
pub async fn gemini_model(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    if req.method() == http::Method::POST
        && let Some((endpoint, _)) = protocol::gemini::split_path(req.uri().path())
    {
        return proxy(gw, endpoint, req).await;
    }
    let name = req.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
    if req.method() != http::Method::GET || name.contains(':') {
        return fallback(State(gw), req).await;
    }
    let mut headers = req.headers().clone();
    key_from_query(req.uri(), &mut headers);
    if authenticate(&gw.config.client_keys, &headers).is_err() {
        return GatewayError::Unauthorized.into_response(Protocol::Gemini);
    }
    let name = percent_encoding::percent_decode_str(&name).decode_utf8_lossy().into_owned();
    if !gw.config.aliases().any(|a| a == name) {
        let error = GatewayError::UnknownModel(format!("model {name:?} is not configured on this gateway"));
        return error.into_response(Protocol::Gemini);
    }
    let body = protocol::gemini::model_entry(&name).to_string();
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
    let error = GatewayError::NoRoute(format!("{} {}", req.method(), req.uri().path()));
    refuse(&gw, error, req).await
}

/// A known path with the wrong method: a protocol-shaped 405.
pub async fn wrong_method(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let websocket = req.headers().get(header::UPGRADE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let error = match websocket {
        true => GatewayError::NoWebSocket(req.uri().path().to_owned()),
        false => GatewayError::WrongMethod(format!("{} {}", req.method(), req.uri().path())),
    };
    refuse(&gw, error, req).await
}

/// A refusal outside the model endpoints: the body read and dropped
/// first, counted (not journaled), labelled with a fresh request id.
async fn refuse(gw: &Gateway, error: GatewayError, req: Request) -> Response {
    let protocol = protocol_of(req.uri(), req.headers());
    let (parts, body) = req.into_parts();
    body::discard(body, &parts.headers, gw.config.body_timeout).await;
    gw.sink.refused(error.reason());
    let mut response = error.into_response(protocol);
    headers::label(response.headers_mut(), crate::request_id::next(), None, 0);
    response
}

/// A model endpoint's request: taken apart here (a Gemini model named in
/// the path, its key in the query), then served by its [`Exchange`].
pub(super) fn proxy(
    gw: Arc<Gateway>,
    endpoint: Endpoint,
    req: http::Request<impl body::ClientBody + 'static>,
) -> impl Future<Output = Response> + Send {
    // The request is taken apart before its future: the future holds its
    // headers and body only (what it captures keeps its room to the end).
    let (mut parts, body) = req.into_parts();
    // A Gemini stream asked for without `alt=sse`: one JSON array.
    let array = endpoint == Endpoint::StreamGenerateContent && !protocol::gemini::wants_sse(parts.uri.query());
    // Gemini names the model in the path (and may send the key in the query).
    let named = match endpoint.protocol() {
        Protocol::Gemini => {
            key_from_query(&parts.uri, &mut parts.headers);
            protocol::gemini::parse_path(parts.uri.path()).map(|(_, model)| model)
        }
        _ => None,
    };
    let reframe: fn(Response) -> Response = if array { as_json_array } else { std::convert::identity };
    Exchange::serve(gw, endpoint, parts.headers, body, named, reframe)
}

/// A Gemini stream answer re-framed as Google's streamed JSON array (an
/// error answer is one JSON object already, and stays so).
fn as_json_array(response: Response) -> Response {
    let sse =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !response.status().is_success() || !sse {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::new(protocol::gemini::array::JsonArray::new(body)))
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
