//! Codex's Responses WebSocket transport: `GET /v1/responses` with
//! `Upgrade: websocket`, as Codex opens it with its built-in OpenAI
//! provider. The client sends `response.create` messages (a Responses
//! request, `type` added) and gets each response's events as text
//! messages, several responses one after another on one socket.
//!
//! Each `response.create` is served exactly as an HTTP `POST
//! /v1/responses` with `stream: true` and the upgrade's headers: the same
//! attempt loop (capacity retried before the first event, other accounts,
//! translated targets), one journal row per response, the same admission
//! (the client key is also checked at the upgrade, so a bad key never gets
//! a socket). What only the socket knows is kept here:
//!
//! - **Connection-local continuation.** Codex sends the next turn as
//!   `previous_response_id` of the socket's last response and only the new
//!   input (OpenAI's WebSocket mode keeps the rest on the connection, even
//!   with `store: false`). The socket keeps the last request's input and the
//!   items its response returned, and sends the provider the whole
//!   conversation: an HTTP upstream, or one of another protocol, knows
//!   nothing of the socket. An id the socket does not hold goes on as sent
//!   (tidegate's kept conversations, or the provider's stored ones).
//! - **Warm-up.** `generate: false` (Codex's pre-warm) is answered here with
//!   an empty completed response whose id the next turn may continue.
//! - **Failures before the first event** go out as Codex reads them: an
//!   `error` message with the HTTP `status`, the error object and the retry
//!   headers (`retry-after`, rate-limit resets), after which the socket stays
//!   open for the next `response.create`.
//!
//! Limits as for HTTP: a message is at most `max_body` bytes, a socket with
//! no message for `websocket_idle` is closed (code 1000), and a response
//! whose client goes away is cancelled like an HTTP request whose client
//! disconnected. `websocket: off` keeps the `426` that makes Codex use HTTP.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::admission::auth::authenticate;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::protocol::{Endpoint, Protocol};

/// What the socket remembers of its last response (see the module docs).
#[derive(Default)]
struct Last {
    /// The response's id.
    id: String,
    /// The whole input it was given.
    input: Vec<Value>,
    /// The items it returned.
    output: Vec<Value>,
}

/// `GET /v1/responses`: a WebSocket upgrade, or (not one, or `websocket:
/// off`) the `426` Codex falls back to HTTP on.
pub async fn upgrade(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let asked = req.headers().get(header::UPGRADE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !asked || !gw.config.websocket {
        return super::handlers::wrong_method(State(gw), req).await;
    }
    let (mut parts, _) = req.into_parts();
    if authenticate(&gw.config.client_keys, &parts.headers).is_err() {
        gw.sink.refused(GatewayError::Unauthorized.reason());
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiResponses);
    }
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let headers = forwarded(&parts.headers);
    ws.max_message_size(gw.config.max_body)
        .max_frame_size(gw.config.max_body)
        .on_upgrade(move |socket| session(gw, headers, socket))
}

/// The upgrade's headers as each response's request carries them (the
/// WebSocket handshake's own left out, and `accept-encoding`: the events
/// are read here, so they must come uncompressed).
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if n.starts_with("sec-websocket-")
            || matches!(
                n,
                "upgrade" | "connection" | "host" | "content-length" | "transfer-encoding" | "accept-encoding"
            )
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    out
}

/// One socket: its messages in turn, until it closes or idles out.
async fn session(gw: Arc<Gateway>, headers: HeaderMap, socket: WebSocket) {
    let idle = gw.config.websocket_idle;
    tracing::debug!("responses websocket opened");
    let mut tx = socket;
    let mut last: Option<Last> = None;
    loop {
        let message = match tokio::time::timeout(idle, tx.recv()).await {
            Err(_) => {
                let frame = axum::extract::ws::CloseFrame { code: 1000, reason: "idle".into() };
                let _ = tx.send(Message::Close(Some(frame))).await;
                return;
            }
            Ok(None | Some(Err(_))) => return,
            Ok(Some(Ok(message))) => message,
        };
        let text = match message {
            Message::Text(text) => text,
            Message::Binary(_) => {
                if send(&mut tx, &error_event(400, "invalid_request_error", "binary messages are not served")).await {
                    continue;
                }
                return;
            }
            Message::Close(_) => return,
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        let Ok(mut request) = serde_json::from_str::<Value>(text.as_str()) else {
            if send(&mut tx, &error_event(400, "invalid_request_error", "the message is not JSON")).await {
                continue;
            }
            return;
        };
        let kind = request.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
        match kind.as_str() {
            "response.create" => {}
            // Codex tells the server it has read a response: nothing to do.
            "response.processed" => continue,
            other => {
                let message = format!("message type {other:?} is not served (only response.create)");
                if send(&mut tx, &error_event(400, "invalid_request_error", &message)).await {
                    continue;
                }
                return;
            }
        }
        let Some(fields) = request.as_object_mut() else { continue };
        fields.remove("type");
        continue_from(fields, last.as_ref());
        let input = input_items(fields.get("input"));
        if fields.get("generate") == Some(&Value::Bool(false)) {
            let id = format!("resp_{}", uuid::Uuid::now_v7().simple());
            if !warm_up(&mut tx, &id, fields).await {
                return;
            }
            last = Some(Last { id, input, output: Vec::new() });
            continue;
        }
        // Fields of the socket only: an HTTP upstream refuses them.
        fields.remove("generate");
        fields.remove("client_metadata");
        fields.insert("stream".into(), Value::Bool(true));
        match respond(&gw, &headers, &request, &mut tx).await {
            Respond::Done(Some((id, output))) => last = Some(Last { id, input, output }),
            Respond::Done(None) => last = None,
            Respond::Gone => return,
        }
    }
}

/// Sends `v` as a text message; whether the socket took it.
async fn send(tx: &mut WebSocket, v: &Value) -> bool {
    tx.send(Message::Text(v.to_string().into())).await.is_ok()
}

/// An `error` message as Codex reads one (its `status` taken as the HTTP
/// status of a failed request).
fn error_event(status: u16, kind: &str, message: &str) -> Value {
    json!({"type": "error", "status": status, "error": {"type": kind, "message": message}})
}

/// A `previous_response_id` naming this socket's last response: the
/// request made whole (that response's input and output, then the new
/// input), the id dropped.
fn continue_from(fields: &mut serde_json::Map<String, Value>, last: Option<&Last>) {
    let Some(last) = last else { return };
    if fields.get("previous_response_id").and_then(Value::as_str) != Some(last.id.as_str()) {
        return;
    }
    fields.remove("previous_response_id");
    let mut whole = last.input.clone();
    whole.extend(last.output.iter().cloned());
    whole.extend(input_items(fields.get("input")));
    fields.insert("input".into(), Value::Array(whole));
}

/// A request's `input` as items (a string is one user message).
fn input_items(input: Option<&Value>) -> Vec<Value> {
    match input {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::String(text)) => {
            vec![json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})]
        }
        _ => Vec::new(),
    }
}

/// Codex's warm-up (`generate: false`): an empty response, completed at
/// once, that the next turn continues.
async fn warm_up(tx: &mut WebSocket, id: &str, fields: &serde_json::Map<String, Value>) -> bool {
    let model = fields.get("model").cloned().unwrap_or(Value::Null);
    let response = |status: &str| {
        json!({"id": id, "object": "response", "created_at": jiff::Timestamp::now().as_second(), "status": status,
            "model": model, "output": [], "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}})
    };
    send(tx, &json!({"type": "response.created", "response": response("in_progress")})).await
        && send(tx, &json!({"type": "response.completed", "response": response("completed")})).await
}

/// How serving one response ended.
enum Respond {
    /// Answered (its id and output items, when it completed).
    Done(Option<(String, Vec<Value>)>),
    /// The socket is gone.
    Gone,
}

/// Serves one `response.create` as the HTTP request it stands for, its
/// events sent as messages.
async fn respond(gw: &Arc<Gateway>, headers: &HeaderMap, request: &Value, tx: &mut WebSocket) -> Respond {
    let body = Bytes::from(request.to_string());
    let mut req = http::Request::new(http_body_util::Full::new(body));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static("/v1/responses");
    *req.headers_mut() = headers.clone();
    let response = super::handlers::proxy(gw.clone(), Endpoint::Responses, req).await;
    let status = response.status();
    let (parts, body) = response.into_parts();
    if !status.is_success() {
        let bytes = match tokio::time::timeout(gw.config.body_timeout, body.collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            _ => Bytes::new(),
        };
        let said: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let error = match said.get("error") {
            Some(e) if e.is_object() => e.clone(),
            _ => json!({"type": "api_error", "message": String::from_utf8_lossy(&bytes)}),
        };
        let retry: serde_json::Map<String, Value> = parts
            .headers
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                n == "retry-after" || n.starts_with("x-ratelimit-") || n.starts_with("x-tidegate-")
            })
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), Value::String(v.to_str().ok()?.to_owned()))))
            .collect();
        let event = json!({"type": "error", "status": status.as_u16(), "error": error, "headers": retry});
        return if send(tx, &event).await { Respond::Done(None) } else { Respond::Gone };
    }
    let mut body = body;
    let mut pending = BytesMut::new();
    let mut output = Vec::new();
    let mut completed = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Ok(chunk) = frame.into_data() else { continue };
        pending.extend_from_slice(&chunk);
        while let Some(end) = event_end(&pending) {
            let event = pending.split_to(end);
            let Some(data) = event_data(&event) else { continue };
            if data == "[DONE]" {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(&data) {
                match v["type"].as_str() {
                    Some("response.output_item.done") => output.push(v["item"].clone()),
                    Some("response.completed") => {
                        let id = v["response"]["id"].as_str().unwrap_or_default().to_owned();
                        let items = v["response"]["output"].as_array().filter(|o| !o.is_empty()).cloned();
                        completed = Some((id, items));
                    }
                    _ => {}
                }
            }
            // Dropping the body (the socket gone) cancels the request as a
            // client's disconnect does.
            if tx.send(Message::Text(data.into())).await.is_err() {
                return Respond::Gone;
            }
        }
    }
    Respond::Done(completed.map(|(id, items)| (id, items.unwrap_or(output))))
}

/// Where the first whole SSE event of `buf` ends (after its blank line).
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(buf, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::find(buf, b"\r\n\r\n").map(|at| at + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An SSE event's data lines, joined (`None` without any).
fn event_data(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continuation_of_the_sockets_last_response_is_made_whole() {
        let last = Last {
            id: "resp_1".into(),
            input: vec![json!({"type": "message", "role": "user", "content": "hi"})],
            output: vec![json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"})],
        };
        let mut fields = json!({"model": "m", "previous_response_id": "resp_1",
            "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]});
        let fields = fields.as_object_mut().unwrap();
        continue_from(fields, Some(&last));
        assert!(!fields.contains_key("previous_response_id"));
        let kinds: Vec<&str> =
            fields["input"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
        // Another id is not this socket's: left as sent.
        let mut other = json!({"previous_response_id": "resp_9", "input": []});
        continue_from(other.as_object_mut().unwrap(), Some(&last));
        assert_eq!(other["previous_response_id"], "resp_9");
    }

    #[test]
    fn sse_events_are_cut_at_their_blank_line_and_their_data_joined() {
        let buf = b"event: a\ndata: {\"x\":1}\n\ndata: par";
        let end = event_end(buf).unwrap();
        assert_eq!(event_data(&buf[..end]).as_deref(), Some("{\"x\":1}"));
        assert_eq!(event_end(&buf[end..]), None);
        assert_eq!(event_data(b"data: a\r\ndata: b\r\n\r\n").as_deref(), Some("a\nb"));
    }
}
