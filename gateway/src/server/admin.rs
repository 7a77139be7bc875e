//! `/admin`: what the gateway's upstreams are doing, behind `admin_key`.

use std::sync::Arc;

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, header};
use serde_json::json;
use tokio::time::Instant;

use super::Gateway;
use crate::admission::auth::authenticate;
use crate::config::ClientKey;
use crate::error::GatewayError;
use crate::journal;
use crate::limits::paced::Paced;
use crate::protocol::Protocol;

/// Admin requests need the configured `admin_key` (as a bearer token or
/// `x-api-key`); without one configured, every admin request is refused.
fn authorized(gw: &Gateway, headers: &HeaderMap) -> bool {
    let Some(key) = &gw.config.admin_key else { return false };
    let keys = [ClientKey { name: "admin".into(), key: key.clone(), lane: Default::default() }];
    matches!(authenticate(&keys, headers), Ok(Some(_)))
}

/// `GET /admin/requests?outcome=&model=&since=&limit=`: recent requests,
/// newest first. `since` is a duration back from now (`1h`) or an RFC 3339
/// instant.
pub async fn requests(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    let Some(journal) = gw.sink.journal.clone() else {
        return GatewayError::NoRoute("the journal is off (journal: off)".into()).into_response(Protocol::OpenAiChat);
    };
    let since_ms = match params.get("since").map(|s| parse_since(s)) {
        None => None,
        Some(Some(ms)) => Some(ms),
        Some(None) => {
            return GatewayError::BadRequest("since: not a duration (1h) or an RFC 3339 time".into())
                .into_response(Protocol::OpenAiChat);
        }
    };
    let query = journal::Query {
        outcome: params.get("outcome").cloned(),
        model: params.get("model").cloned(),
        since_ms,
        limit: params.get("limit").and_then(|l| l.parse().ok()).unwrap_or(50).min(1000),
    };
    let found = tokio::task::spawn_blocking(move || journal::list(caught_up(&journal), &query)).await;
    match found {
        Ok(Ok(rows)) => json_response(&json!({ "requests": rows })),
        Ok(Err(err)) => journal_error(&err.to_string()),
        Err(err) => journal_error(&err.to_string()),
    }
}

/// `GET /admin/requests/{id}`: one request with its attempts and partial text.
pub async fn request(State(gw): State<Arc<Gateway>>, headers: HeaderMap, uri: http::Uri) -> Response {
    // The id is read from the path as is: an extractor's rejection of an
    // odd id would answer in plain text.
    let id = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    let Some(journal) = gw.sink.journal.clone() else {
        return GatewayError::NoRoute("the journal is off (journal: off)".into()).into_response(Protocol::OpenAiChat);
    };
    match tokio::task::spawn_blocking(move || journal::get(caught_up(&journal), &id)).await {
        Ok(Ok(Some(row))) => json_response(&json!(row)),
        Ok(Ok(None)) => {
            GatewayError::NoRoute("no such request in the journal".into()).into_response(Protocol::OpenAiChat)
        }
        Ok(Err(err)) => journal_error(&err.to_string()),
        Err(err) => journal_error(&err.to_string()),
    }
}

/// The journal's file once the rows of requests answered so far are in
/// it (the writer otherwise commits up to a second later), waiting half
/// a second at most: reading the journal right after a request shows it.
fn caught_up(journal: &journal::Journal) -> &std::path::Path {
    journal.flush(std::time::Duration::from_millis(500));
    journal.path()
}

/// `GET /admin/stats`: the last five minutes per upstream in 10-second
/// buckets (requests by outcome, failed attempts by class), from memory.
pub async fn stats(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    let mut stats = gw.sink.recent.snapshot();
    if let Some(obj) = stats.as_object_mut() {
        obj.insert("rejected_before_routing".into(), json!(gw.sink.flood.total()));
    }
    json_response(&stats)
}

/// `1h`, `30m` back from now, or an RFC 3339 instant, as unix ms.
pub fn parse_since(text: &str) -> Option<i64> {
    if let Ok(d) = humantime::parse_duration(text) {
        return Some(jiff::Timestamp::now().as_millisecond() - d.as_millis() as i64);
    }
    text.parse::<jiff::Timestamp>().ok().map(|t| t.as_millisecond())
}

fn json_response(v: &serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn journal_error(detail: &str) -> Response {
    let mut resp =
        GatewayError::BadRequest(format!("journal unreadable: {detail}")).into_response(Protocol::OpenAiChat);
    *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    resp
}

/// `GET /metrics`: Prometheus text. Needs `admin_key` when one is set.
pub async fn metrics(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if gw.config.admin_key.is_some() && !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    for u in &gw.upstreams {
        let snap = u.limiter.snapshot();
        let name = u.config.name.as_str();
        gw.sink.metrics.gauge(name, "in_flight", i64::from(snap.in_flight));
        gw.sink.metrics.gauge(name, "effective_limit", i64::from(snap.effective_limit));
        gw.sink.metrics.gauge(name, "queued", snap.queued as i64);
        if u.shared.is_some() {
            gw.sink.metrics.gauge(name, "shared_state_up", i64::from(u.limiter.is_shared()));
        }
        for (kind, window) in ["window_short", "window_long"].iter().zip(u.limiter.windows().view(Instant::now())) {
            if let Some(w) = window {
                gw.sink.metrics.gauge(name, &format!("{kind}_used_pct"), (w.used * 100.0).round() as i64);
                let left = w.resets_in.map_or(-1, |r| r.as_secs() as i64);
                gw.sink.metrics.gauge(name, &format!("{kind}_resets_in_s"), left);
            }
        }
        // Per upstream, the model with the least left of each bucket.
        let advertised = u.limiter.advertised();
        for (i, kind) in ["requests", "tokens"].iter().enumerate() {
            let tightest =
                advertised.iter().filter_map(|(_, b)| b[i]).min_by(|a, b| a.left_part().total_cmp(&b.left_part()));
            if let Some(p) = tightest {
                gw.sink.metrics.gauge(name, &format!("advertised_{kind}_limit"), p.limit as i64);
                gw.sink.metrics.gauge(name, &format!("advertised_{kind}_left"), p.level);
            }
        }
    }
    let now = Instant::now();
    for lane in gw.lanes.iter() {
        let snap = lane.snapshot(now);
        gw.sink.metrics.client_gauge(&snap.name, "in_flight", i64::from(snap.in_flight));
        gw.sink.metrics.client_gauge(&snap.name, "queued", snap.queued as i64);
        gw.sink.metrics.client_gauge(&snap.name, "penalised", i64::from(snap.penalised_for.is_some()));
    }
    let dropped = gw.sink.journal.as_ref().map_or(0, |j| j.dropped());
    gw.sink.metrics.gauge("-", "journal_dropped_rows", dropped as i64);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], gw.sink.metrics.render()).into_response()
}

/// `GET /admin/upstreams`: health, in-flight, queue, effective limit.
pub async fn upstreams(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    let now = Instant::now();
    let list: Vec<_> = gw
        .upstreams
        .iter()
        .map(|u| {
            let limits = u.limiter.snapshot();
            let health = u.health.snapshot(now);
            let [short, long] = u.limiter.windows().view(now).map(|w| {
                w.map(|w| {
                    json!({
                        "used": w.used,
                        "resets_in_s": w.resets_in.map(|r| r.as_secs()),
                        "span_s": w.span.map(|s| s.as_secs()),
                        "exhausted": w.exhausted,
                        "history": w.history,
                    })
                })
            });
            let paced =
                |p: Option<Paced>| p.map(|p| json!({ "limit": p.limit, "left": p.level, "per_minute": p.per_minute }));
            let advertised: serde_json::Map<String, serde_json::Value> = u
                .limiter
                .advertised()
                .into_iter()
                .map(|(model, [requests, tokens])| {
                    (model, json!({ "requests": paced(requests), "tokens": paced(tokens) }))
                })
                .collect();
            json!({
                "name": u.config.name,
                "protocol": u.config.protocol.to_string(),
                "kind": u.kind_name(),
                "pool": u.config.pool.as_ref().map(|p| p.pool.as_str()),
                "account": u.config.pool.as_ref().map(|p| p.account.as_str()),
                "health": {
                    "state": health.state,
                    "for_ms": health.for_ms,
                    "failure_streak": health.streak,
                    "reason": health.reason,
                    "projected_reset": health.reset.map(|r| r.to_string()),
                },
                "in_flight": limits.in_flight,
                "queued": limits.queued,
                "effective_limit": limits.effective_limit,
                "max_concurrent": u.config.limits.max_concurrent,
                "adaptive": u.config.limits.adaptive,
                "shared": u.limiter.is_shared(),
                "shared_replicas": u.limiter.replicas(),
                "advertised": advertised,
                "windows": { "short": short, "long": long },
            })
        })
        .collect();
    let dropped = gw.sink.journal.as_ref().map_or(0, |j| j.dropped());
    json_response(&json!({ "upstreams": list, "journal_dropped_rows": dropped }))
}

/// `GET /admin/clients`: per client key (by name, never the key): requests
/// in flight, waiting (in its lane and in upstream queues), rate used in
/// the last minute, the priority its requests get now, weight, limits and
/// any flood penalty.
pub async fn clients(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    let now = Instant::now();
    let list: Vec<_> = gw
        .lanes
        .iter()
        .map(|lane| {
            let s = lane.snapshot(now);
            let upstream_queued: usize = gw.upstreams.iter().map(|u| u.limiter.waiting_of(lane.name())).sum();
            json!({
                "name": s.name,
                "in_flight": s.in_flight,
                "queued": s.queued,
                "queued_upstream": upstream_queued,
                "rpm_used": s.rate_used.0,
                "tpm_used": s.rate_used.1,
                "priority": s.priority.as_str(),
                "weight": s.weight,
                "penalised_ms": s.penalised_for.map(|d| d.as_millis() as u64),
                "limits": {
                    "max_concurrent": s.limits.max_concurrent,
                    "rpm": s.limits.rpm,
                    "tpm": s.limits.tpm,
                    "max_queue": s.limits.max_queue,
                },
            })
        })
        .collect();
    json_response(&json!({ "clients": list, "batch_share": gw.config.batch_share }))
}

/// `POST /admin/reload`: re-reads the config file and applies it to new
/// requests (as `SIGHUP` does). `200` with what changed, or `400` with the
/// config's problems (field paths, as `tidegate check` prints them) and
/// nothing changed.
pub async fn reload(State(app): State<super::AppState>, headers: HeaderMap) -> Response {
    let gw = app.0.load();
    if !authorized(&gw, &headers) {
        return GatewayError::Unauthorized.into_response(Protocol::OpenAiChat);
    }
    match app.0.reload().await {
        Ok(changes) => json_response(&json!({ "reloaded": true, "changes": changes })),
        Err(error) => {
            tracing::error!(error = %error, "config reload refused; the running config stays");
            let problems = match &error {
                crate::gateway::ReloadError::Config(e) => e.problems(),
                other => vec![other.to_string()],
            };
            let body = json!({ "reloaded": false, "problems": problems });
            (http::StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], body.to_string())
                .into_response()
        }
    }
}
