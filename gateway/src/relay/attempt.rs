//! One attempt: a request sent to one upstream, and whatever came back
//! made into an answer for the client or a classified failure for the
//! attempt loop ([`super`]) to decide about.
//!
//! A 2xx JSON answer is relayed as it streams (a protocol that can hide a
//! failure in a 2xx answer has it read first); a 2xx SSE answer first
//! passes the stream handshake ([`crate::stream::handshake`]); an error
//! body is read (it is small) so it can be classified and, if it is the
//! final answer, returned verbatim. Provider text is scrubbed of
//! configured secrets where it is read ([`crate::secrets`]).

use bytes::Bytes;
use http::header;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use super::Job;
use super::answer::Answer;
use super::targets::Sent;
use crate::classify::{self, Classified, TransportFailure};
use crate::headers;
use crate::ids::UpstreamId;
use crate::protocol;
use crate::stream::RelayBody;
use crate::stream::handshake::{self, Handshake};
use crate::stream::json_end::{self, JsonEnd};
use crate::translate;
use crate::upstream::{SendError, Upstream};

/// Largest error body read for classification.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// Largest 2xx JSON answer read whole to check it (protocols whose
/// answers can say `failed` under 200); a larger one fails the attempt.
const MAX_CHECKED_ANSWER: usize = 64 * 1024 * 1024;

/// What a single attempt produced.
pub(super) enum Attempt {
    /// A usable answer: done.
    Success(Answer),
    /// A failure to classify: its outcome and, for an HTTP answer, the
    /// buffered answer to return verbatim if it is final.
    Failure(Classified, Option<(http::response::Parts, Bytes)>),
    /// The request's deadline ended the attempt while the upstream was
    /// still working: not the upstream's failure.
    Ended(Classified),
}

/// One attempt: send, and turn whatever came back into an answer or a
/// classified failure. Every wait in it answers to the request's
/// deadline, an `Instant` to the end: a body read after the headers gets
/// what is left of it, not a budget computed before they came.
pub(super) async fn attempt(job: &Job, index: UpstreamId, upstream: &Upstream, sent: (Sent, &str)) -> Attempt {
    let (Sent { body, endpoint, back }, model) = sent;
    let deadline = job.deadline;
    let timeout = upstream.config.header_timeout.min(deadline.saturating_duration_since(Instant::now()));
    // The request is built in a block so that it is not also kept in this
    // future beside the copy the send future holds.
    let sending = {
        let mut req = match upstream.request(endpoint, body, model, job.head.stream, &job.client_headers) {
            Ok(req) => req,
            Err(error) => return unsent(error),
        };
        if let Some(trace) = &job.trace {
            // The upstream continues this attempt's span, not the client's.
            if let Some(parent) = trace.begin_attempt(model) {
                req.headers_mut().insert("traceparent", parent);
            }
        }
        upstream.send(req, timeout)
    };
    let sent = sending.await;
    if let Some(trace) = &job.trace {
        trace.end_attempt();
    }
    let resp = match sent {
        Ok(resp) => resp,
        Err(SendError::Timeout(after)) => {
            let failure = TransportFailure::Timeout(format!("no response headers within {after:?}"));
            let outcome = classify::classify_transport(&failure);
            // Cut by the request's deadline, not by the upstream's
            // header_timeout: the upstream was still working.
            return if after < upstream.config.header_timeout {
                Attempt::Ended(outcome)
            } else {
                Attempt::Failure(outcome, None)
            };
        }
        Err(error) => return unsent(error),
    };
    let status = resp.status();
    if let Some(odd) = odd_answer(status, resp.headers()) {
        return Attempt::Failure(classify::classify_odd(status.as_u16(), &odd), None);
    }
    if !status.is_success() {
        let (parts, bytes) = read_error(resp, deadline).await;
        return failed(parts, bytes, upstream, back.as_deref());
    }
    let (mut parts, incoming) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    // The upstream's answer is in the target's protocol; what tidegate
    // says itself is in the client's. Every wait stays in this future
    // (a nested one is moved into it, a copy of its size): the rest is
    // plain functions.
    let answering = Answering { job, upstream, index, protocol: endpoint.protocol(), back: back.as_deref() };
    let idle = upstream.config.stream_idle_timeout;
    if !is_sse(&parts.headers) {
        let json = JsonEnd::new(&parts.headers);
        if !answering.protocol.reads_json_answers() && answering.back.is_none() {
            let body = RelayBody::raw(incoming, json, idle, answering.protocol, answering.name());
            return Attempt::Success(Answer::Stream(parts, Box::new(body)));
        }
        let read = tokio::time::timeout_at(deadline, Limited::new(incoming, MAX_CHECKED_ANSWER).collect()).await;
        return match read {
            Ok(Ok(collected)) => answering.checked(parts, json, collected.to_bytes()),
            Ok(Err(err)) => {
                let failure = TransportFailure::Connection(format!("answer body could not be read: {err}"));
                Attempt::Failure(classify::classify_transport(&failure), None)
            }
            Err(_) => {
                let failure = TransportFailure::Timeout("the answer body did not arrive before the deadline".into());
                Attempt::Ended(classify::classify_transport(&failure))
            }
        };
    }
    let max_event = job.gw.config.max_stream_event;
    let shook = handshake::handshake(incoming, answering.protocol, idle, deadline, max_event, back.is_some()).await;
    answering.opened(parts, shook)
}

/// An upstream's error answer (its body read within the deadline):
/// scrubbed and classified as the target said it, and told in the
/// client's words when translated.
fn failed(
    mut parts: http::response::Parts,
    bytes: Bytes,
    upstream: &Upstream,
    back: Option<&translate::Back>,
) -> Attempt {
    let mut bytes = upstream.error_body(&mut parts, bytes);
    let rules = &upstream.config.rules;
    let outcome = classify::classify(parts.status, &parts.headers, &bytes, rules, jiff::Timestamp::now());
    if let Some(back) = back {
        bytes = translate::error(back, parts.status.as_u16(), &bytes);
        parts.headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    }
    Attempt::Failure(outcome, Some((parts, bytes)))
}

/// A 2xx answer on its way to becoming the client's.
struct Answering<'a> {
    job: &'a Job,
    upstream: &'a Upstream,
    index: UpstreamId,
    /// The target's protocol (the answer's).
    protocol: protocol::Protocol,
    /// The way back, for a translated request.
    back: Option<&'a translate::Back>,
}

impl Answering<'_> {
    fn name(&self) -> (UpstreamId, &str) {
        (self.index, self.upstream.config.name.as_str())
    }

    /// A JSON answer read whole (a protocol that can hide a failure under
    /// 200, or a translation): checked, then relayed as one frame, in the
    /// client's protocol when translated.
    fn checked(self, mut parts: http::response::Parts, json: JsonEnd, bytes: Bytes) -> Attempt {
        let (protocol, name) = (self.protocol, self.name());
        // What it says is read from its content (decoded if compressed);
        // the client gets the bytes as they came.
        let plain = json_end::decoded(&parts.headers, &bytes, MAX_CHECKED_ANSWER);
        let read = protocol.read_answer(plain.as_deref().unwrap_or(&bytes));
        if let Some(error) = read.failed {
            return carried_failure(&parts.headers, error, self.upstream, self.back);
        }
        parts.headers.remove(header::CONTENT_LENGTH);
        let Some(back) = self.back else {
            let body = RelayBody::read(bytes, json, protocol, name, read.id);
            return Attempt::Success(Answer::Stream(parts, Box::new(body)));
        };
        let bytes = match translate::answer(back, plain.as_deref().unwrap_or(&bytes)) {
            Ok(bytes) => bytes,
            Err(why) => return Attempt::Failure(classify::classify_odd(parts.status.as_u16(), &why.to_string()), None),
        };
        parts.headers.remove(header::CONTENT_ENCODING);
        parts.headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        let json = JsonEnd::new(&parts.headers);
        let body = RelayBody::read(bytes, json, back.client, name, None);
        Attempt::Success(Answer::Stream(parts, Box::new(body)))
    }

    /// How an SSE answer's handshake went: relayed event by event from its
    /// first content (translated when the client speaks another protocol),
    /// or the failure it was.
    fn opened(self, mut parts: http::response::Parts, shook: Handshake) -> Attempt {
        match shook {
            Handshake::Open { inner, scanner, ready } => {
                // What the client gets is not always the upstream's bytes
                // (an error event of tidegate's after a break, a
                // translation), so an upstream's length is never passed
                // on: the stream is chunked.
                parts.headers.remove(header::CONTENT_LENGTH);
                let idle = self.upstream.config.stream_idle_timeout;
                let mut body = RelayBody::sse(inner, idle, scanner, ready, self.protocol, self.name());
                body.close_with(&self.job.gw.closing);
                if let Some(back) = self.back {
                    body.translate(back);
                }
                Attempt::Success(Answer::Stream(parts, Box::new(body)))
            }
            Handshake::Rejected(data) => carried_failure(&parts.headers, data, self.upstream, self.back),
            Handshake::Empty => {
                let note = b"empty stream: the upstream ended the stream before any content";
                let (rules, now) = (&self.upstream.config.rules, jiff::Timestamp::now());
                Attempt::Failure(classify::classify(StatusCode::OK, &parts.headers, note, rules, now), None)
            }
            Handshake::Broken(detail) => {
                let failure = TransportFailure::Connection(format!("stream broke before any content: {detail}"));
                Attempt::Failure(classify::classify_transport(&failure), None)
            }
            Handshake::Deadline => {
                let failure = TransportFailure::Timeout("the stream sent no content before the deadline".into());
                Attempt::Ended(classify::classify_transport(&failure))
            }
        }
    }
}

/// A request that never left: a transport failure (transient), or no
/// credentials to send it with (auth: this upstream cannot take it now).
fn unsent(error: SendError) -> Attempt {
    match error {
        SendError::Credentials(detail) => Attempt::Failure(classify::classify_credentials(&detail), None),
        SendError::Transport(detail) => {
            Attempt::Failure(classify::classify_transport(&TransportFailure::Connection(detail)), None)
        }
        SendError::Timeout(after) => {
            let failure = TransportFailure::Timeout(format!("no response headers within {after:?}"));
            Attempt::Failure(classify::classify_transport(&failure), None)
        }
    }
}

/// A failure carried inside a 2xx answer (an error event, a failed
/// response object): classified like the status it stands for, and kept
/// as the answer to return verbatim if it is final (502 when it names no
/// status).
fn carried_failure(headers: &HeaderMap, data: Bytes, upstream: &Upstream, back: Option<&translate::Back>) -> Attempt {
    let data = crate::secrets::scrub_bytes(data);
    let status = StatusCode::from_u16(protocol::error_status(&data)).unwrap_or(StatusCode::OK);
    let outcome = classify::classify(status, headers, &data, &upstream.config.rules, jiff::Timestamp::now());
    let data = match back {
        Some(back) => translate::error(back, status.as_u16(), &data),
        None => data,
    };
    let mut error = http::Response::new(());
    *error.status_mut() = if status.is_success() { StatusCode::BAD_GATEWAY } else { status };
    error.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Attempt::Failure(outcome, Some((error.into_parts().0, data)))
}

/// What makes an answer no answer at all, if anything (see
/// [`classify::classify_odd`]).
fn odd_answer(status: StatusCode, headers: &HeaderMap) -> Option<String> {
    let header = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    if status.is_informational() {
        return Some("an informational answer (1xx) where a response was due".into());
    }
    if status == StatusCode::NO_CONTENT || status == StatusCode::RESET_CONTENT {
        return Some("no content where a response was due".into());
    }
    if !status.is_success() {
        return None;
    }
    let content_type = header(header::CONTENT_TYPE).trim_start().as_bytes();
    if content_type.get(..9).is_some_and(|t| t.eq_ignore_ascii_case(b"text/html")) {
        return Some("an HTML page instead of an API answer (a wrong base_url, or a captive portal?)".into());
    }
    let encoding = header(header::CONTENT_ENCODING).trim();
    if !encoding.is_empty() && !encoding.eq_ignore_ascii_case("identity") && is_sse(headers) {
        return Some(format!("a stream compressed with {encoding} although identity was asked for"));
    }
    None
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// Reads an error body, keeping at most [`MAX_ERROR_BODY`] bytes (a
/// bigger one is passed on cut there, never emptied); a gzip-compressed
/// one (a proxy that ignored `accept-encoding: identity`) is decompressed
/// so it can be classified and read.
async fn read_error(
    resp: http::Response<crate::upstream::UpstreamBody>,
    deadline: Instant,
) -> (http::response::Parts, Bytes) {
    let (mut parts, mut incoming) = resp.into_parts();
    let mut kept = bytes::BytesMut::new();
    let read = async {
        while let Some(Ok(frame)) = incoming.frame().await {
            if let Ok(data) = frame.into_data() {
                let room = MAX_ERROR_BODY.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..data.len().min(room)]);
                if room <= data.len() {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, read).await;
    let mut bytes = kept.freeze();
    if let Some(plain) = json_end::decoded(&parts.headers, &bytes, MAX_ERROR_BODY) {
        bytes = Bytes::from(plain);
        parts.headers.remove(header::CONTENT_ENCODING);
    }
    (parts, bytes)
}
