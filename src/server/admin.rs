//! `/admin`: what the gateway's upstreams are doing, behind `admin_key`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, header};
use serde_json::json;
use tokio::time::Instant;

use super::Gateway;
use super::auth::authenticate;
use crate::config::ClientKey;
use crate::error::GatewayError;
use crate::protocol::Protocol;

/// Admin requests need the configured `admin_key` (as a bearer token or
/// `x-api-key`); without one configured, every admin request is refused.
fn authorized(gw: &Gateway, headers: &HeaderMap) -> bool {
    let Some(key) = &gw.config.admin_key else { return false };
    let keys = [ClientKey { name: "admin".into(), key: key.clone() }];
    matches!(authenticate(&keys, headers), Ok(Some(_)))
}

/// `GET /admin/upstreams`: health, in-flight, queue, effective limit.
pub async fn upstreams(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAi);
    }
    let now = Instant::now();
    let list: Vec<_> = gw
        .upstreams
        .iter()
        .map(|u| {
            let limits = u.limiter.snapshot();
            let health = u.health.snapshot(now);
            json!({
                "name": u.config.name,
                "protocol": u.config.protocol.to_string(),
                "health": {"state": health.state, "for_ms": health.for_ms, "failure_streak": health.streak},
                "in_flight": limits.in_flight,
                "queued": limits.queued,
                "effective_limit": limits.effective_limit,
                "max_concurrent": u.config.limits.max_concurrent,
                "adaptive": u.config.limits.adaptive,
            })
        })
        .collect();
    ([(header::CONTENT_TYPE, "application/json")], json!({ "upstreams": list }).to_string()).into_response()
}
