//! Admission: what lets a request in before anything else is done with
//! it — the client key, checked in constant time (or, without client
//! keys, a local origin), and the body, read within `max_body` and
//! `body_timeout`. A refused request's body is read and thrown away
//! first, so the client reads the refusal.

pub mod auth;
pub mod body;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use auth::{authenticate, local_only};
use http::HeaderMap;

/// Admission: the client key (or, with no keys configured, a local
/// origin), then the body within `max_body` and `body_timeout`. A refused
/// request's body is read and dropped first, so the client can read the
/// refusal. Returns the key's name and the body.
pub async fn admit(
    gw: &Gateway,
    headers: &HeaderMap,
    body: impl body::ClientBody,
) -> Result<(Option<String>, bytes::Bytes), GatewayError> {
    let admitted = match authenticate(&gw.config.client_keys, headers) {
        Ok(name) if !gw.config.client_keys.is_empty() => Ok(name),
        Ok(name) => local_only(headers, &gw.config.allowed_origins).map(|()| name),
        Err(auth::BadKey) => Err(GatewayError::Unauthorized),
    };
    let name = match admitted {
        Ok(name) => name.map(str::to_owned),
        Err(refused) => {
            body::discard(body, headers, gw.config.body_timeout).await;
            return Err(refused);
        }
    };
    let body = body::read(body, headers, gw.config.max_body, gw.config.body_timeout).await?;
    Ok((name, body))
}
