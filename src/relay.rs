//! The attempt loop: from a routed request to an upstream response.
//!
//! Today one attempt goes to the alias's first target; the retry, failover
//! and queueing issues grow this loop, so it stays plain async code read
//! top to bottom.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;
use http::header::{self, HeaderName};

use crate::config::ModelRoute;
use crate::error::GatewayError;
use crate::protocol::{self, RequestHead};
use crate::stream::RelayBody;
use crate::upstream::{SendError, Upstream};

/// Response headers that describe one hop and must not be relayed.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// What a relay produced: the client response and the upstream that gave it.
pub struct Relayed {
    /// Response to send (upstream status, headers and body, verbatim).
    pub response: Response,
    /// Index of the upstream that answered.
    pub upstream: usize,
}

/// A failure, with the upstream involved if one was.
pub struct RelayFailure {
    /// What went wrong.
    pub error: GatewayError,
    /// Upstream index, when the failure happened talking to one.
    pub upstream: Option<usize>,
}

/// Forwards the request to the route's first target.
pub async fn relay(
    upstreams: &[Upstream],
    route: &ModelRoute,
    head: &RequestHead,
    body: &Bytes,
    client_headers: &HeaderMap,
) -> Result<Relayed, RelayFailure> {
    let target = route.targets.first().ok_or_else(|| RelayFailure {
        error: GatewayError::UnknownModel("model has no targets".into()),
        upstream: None,
    })?;
    let upstream = upstreams.get(target.upstream).ok_or_else(|| RelayFailure {
        error: GatewayError::UnknownModel("target refers to a missing upstream".into()),
        upstream: None,
    })?;
    let req = upstream.request(
        protocol::body_for_target(body, head, &target.model),
        client_headers,
    );
    match upstream.send(req).await {
        Ok(resp) => Ok(Relayed {
            response: to_client(resp, upstream),
            upstream: target.upstream,
        }),
        Err(err) => {
            let name = upstream.config.name.clone();
            let error = match err {
                SendError::Transport(detail) => GatewayError::Unreachable {
                    upstream: name,
                    detail,
                },
                SendError::Timeout(timeout) => GatewayError::UpstreamTimeout {
                    upstream: name,
                    timeout,
                },
            };
            Err(RelayFailure {
                error,
                upstream: Some(target.upstream),
            })
        }
    }
}

fn to_client(resp: http::Response<hyper::body::Incoming>, upstream: &Upstream) -> Response {
    let (mut parts, incoming) = resp.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    parts.headers.remove("keep-alive");
    let body = RelayBody::new(incoming, upstream.config.stream_idle_timeout);
    Response::from_parts(parts, Body::new(body))
}
