//! A provider that advertises its rate limits on every answer, as OpenAI
//! and Anthropic do, and refuses over them with the same headers and a
//! "try again in" hint — so that pacing to advertised limits can be
//! tested and measured (see [`Advertise`]).
//!
//! An account (by provider key) may also have a subscription's windows
//! ([`Windows`]): a share of its 5-hour and weekly use, grown by each
//! request, reported in Anthropic's `anthropic-ratelimit-unified-*` or
//! Codex's `x-codex-*` headers, and refused over until the window resets.
//!
//! Each limit is a token bucket: `limit` units, refilled continuously so
//! that an empty bucket is full again after `per_ms`. A request costs one
//! request and `max_tokens` (1,024 when absent) plus a token per 4 bytes
//! of its body, taken when it arrives.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::time::Instant;

use crate::SimState;

/// Advertised limits (see the module docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Advertise {
    /// Whose header names and formats.
    pub shape: Shape,
    /// Requests.
    pub requests: Option<Bucket>,
    /// Tokens.
    pub tokens: Option<Bucket>,
    /// One pair of buckets per model asked for (OpenAI's and Anthropic's
    /// scope), not one for every model.
    #[serde(default)]
    pub per_model: bool,
}

/// Header shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations.
    Openai,
    /// `anthropic-ratelimit-{requests,input-tokens}-{limit,remaining,reset}`,
    /// resets as RFC 3339 times.
    Anthropic,
}

/// One token bucket.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// Units it holds.
    pub limit: u64,
    /// Time an empty bucket takes to fill.
    pub per_ms: u64,
}

/// A subscription's windows for one account.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Windows {
    /// Whose header names and formats.
    pub shape: WindowShape,
    /// The 5-hour window.
    pub short: Window,
    /// The weekly window.
    pub long: Window,
}

/// Whose window headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowShape {
    /// `anthropic-ratelimit-unified-{5h,7d}-{utilization,reset,status}`.
    Anthropic,
    /// `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at}`.
    Codex,
}

/// One window.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Share used when the simulator starts (0 to 1).
    #[serde(default)]
    pub used: f64,
    /// Seconds from the start until it resets (then it is empty again
    /// and resets a window's length later).
    pub resets_in_s: u64,
    /// Share each served request uses.
    pub per_request: f64,
}

/// An account's windows as they stand: share used and reset (Unix s).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WindowLevels {
    used: [f64; 2],
    reset_at: [i64; 2],
    started: bool,
}

/// The buckets' levels (requests, tokens) and when they were last filled.
#[derive(Debug, Default)]
pub(crate) struct Levels {
    levels: [f64; 2],
    at: Option<Instant>,
}

/// What the advertised limits did (see [`SimState::advertised`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdvertStats {
    /// Requests admitted.
    pub served: usize,
    /// Requests refused for an empty bucket.
    pub refused: usize,
}

impl Bucket {
    fn rate(&self) -> f64 {
        self.limit as f64 / (self.per_ms.max(1) as f64 / 1000.0)
    }
}

/// The middleware: an account's windows first, then the advertised
/// buckets.
pub(crate) async fn layer(State(state): State<Arc<SimState>>, req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/sim/") {
        return next.run(req).await;
    }
    let key = crate::provider_key(req.headers());
    let windows = key.as_ref().and_then(|k| Some((k.clone(), state.config.accounts.get(k)?.windows.clone()?)));
    let Some((key, windows)) = windows else { return buckets(state, req, next).await };
    let now = jiff::Timestamp::now().as_second();
    let (levels, refused) = {
        let Ok(mut all) = state.window_levels.lock() else { return buckets(state.clone(), req, next).await };
        let levels = all.entry(key.clone()).or_default();
        if !levels.started {
            *levels = WindowLevels {
                used: [windows.short.used, windows.long.used],
                reset_at: [now + windows.short.resets_in_s as i64, now + windows.long.resets_in_s as i64],
                started: true,
            };
        }
        for (i, span) in [5 * 3600, 7 * 24 * 3600].into_iter().enumerate() {
            if now >= levels.reset_at[i] {
                levels.used[i] = 0.0;
                levels.reset_at[i] = now + span;
            }
        }
        let refused = levels.used.iter().any(|u| *u >= 1.0);
        if !refused {
            levels.used[0] = (levels.used[0] + windows.short.per_request).min(1.0);
            levels.used[1] = (levels.used[1] + windows.long.per_request).min(1.0);
        }
        (*levels, refused)
    };
    if let Ok(mut accounts) = state.per_account.lock() {
        let stats = accounts.entry(key).or_default();
        if refused {
            stats.window_refused += 1;
        } else {
            stats.window_served += 1;
        }
    }
    let mut answer =
        if refused { window_refusal(windows.shape, &levels, now) } else { buckets(state, req, next).await };
    put_windows(answer.headers_mut(), windows.shape, &levels);
    answer
}

/// The 429 of a used-up window.
fn window_refusal(shape: WindowShape, levels: &WindowLevels, now: i64) -> Response {
    let reset =
        levels.used.iter().zip(levels.reset_at).filter(|(u, _)| **u >= 1.0).map(|(_, r)| r).max().unwrap_or(now);
    let body = match shape {
        WindowShape::Anthropic => format!(
            r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Your limit resets at {reset}."}}}}"#
        ),
        WindowShape::Codex => format!(
            r#"{{"error":{{"type":"usage_limit_reached","message":"The usage limit has been reached","resets_at":{reset}}}}}"#
        ),
    };
    let mut answer = Response::new(Body::from(body));
    *answer.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    answer.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

/// An account's windows as headers, in its shape.
fn put_windows(headers: &mut HeaderMap, shape: WindowShape, levels: &WindowLevels) {
    let mut put = |name: String, value: String| {
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            headers.insert(name, value);
        }
    };
    for (i, (anthropic, codex, minutes)) in
        [("5h", "primary", 300), ("7d", "secondary", 10_080)].into_iter().enumerate()
    {
        let (used, reset) = (levels.used[i], levels.reset_at[i]);
        match shape {
            WindowShape::Anthropic => {
                put(format!("anthropic-ratelimit-unified-{anthropic}-utilization"), format!("{used:.4}"));
                put(format!("anthropic-ratelimit-unified-{anthropic}-reset"), reset.to_string());
                let status = if used >= 1.0 {
                    "rejected"
                } else if used >= 0.9 {
                    "allowed_warning"
                } else {
                    "allowed"
                };
                put(format!("anthropic-ratelimit-unified-{anthropic}-status"), status.to_string());
            }
            WindowShape::Codex => {
                put(format!("x-codex-{codex}-used-percent"), format!("{:.2}", used * 100.0));
                put(format!("x-codex-{codex}-window-minutes"), minutes.to_string());
                put(format!("x-codex-{codex}-reset-at"), reset.to_string());
            }
        }
    }
}

/// The advertised buckets: takes the request's costs, refuses when either
/// is short, and puts the figures on the answer either way.
async fn buckets(state: Arc<SimState>, req: Request, next: Next) -> Response {
    let Some(advertise) = state.config.advertise.clone() else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let max_tokens = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("max_tokens").and_then(serde_json::Value::as_u64))
        .unwrap_or(1024);
    let model = if advertise.per_model {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("model").and_then(serde_json::Value::as_str).map(str::to_string))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let costs = [1.0, (max_tokens + body.len() as u64 / 4) as f64];
    let buckets = [advertise.requests, advertise.tokens];
    let now = Instant::now();
    let (admitted, figures) = {
        let Ok(mut all) = state.advert_levels.lock() else {
            return next.run(Request::from_parts(parts, body.into())).await;
        };
        let levels = all.entry(model).or_default();
        let elapsed = levels.at.map_or(f64::INFINITY, |at| now.saturating_duration_since(at).as_secs_f64());
        for (level, bucket) in levels.levels.iter_mut().zip(buckets) {
            if let Some(b) = bucket {
                *level = (*level + b.rate() * elapsed).min(b.limit as f64);
            }
        }
        levels.at = Some(now);
        let short = levels.levels.iter().zip(buckets).zip(costs).find_map(|((level, bucket), cost)| {
            let b = bucket?;
            (*level < cost.min(b.limit as f64))
                .then(|| Duration::from_secs_f64((cost.min(b.limit as f64) - level) / b.rate()))
        });
        if short.is_none() {
            for ((level, bucket), cost) in levels.levels.iter_mut().zip(buckets).zip(costs) {
                if let Some(b) = bucket {
                    *level -= cost.min(b.limit as f64);
                }
            }
        }
        let figures: Vec<(&str, Bucket, f64)> = ["requests", "tokens"]
            .iter()
            .zip(levels.levels.iter().zip(buckets))
            .filter_map(|(n, (l, b))| Some((*n, b?, *l)))
            .collect();
        (short, figures)
    };
    let mut answer = match admitted {
        Some(wait) => {
            if let Ok(mut stats) = state.advert_stats.lock() {
                stats.refused += 1;
            }
            refusal(advertise.shape, wait)
        }
        None => {
            if let Ok(mut stats) = state.advert_stats.lock() {
                stats.served += 1;
            }
            next.run(Request::from_parts(parts, body.into())).await
        }
    };
    put(answer.headers_mut(), advertise.shape, &figures);
    answer
}

/// The 429 over an empty bucket, in the shape's own words.
fn refusal(shape: Shape, wait: Duration) -> Response {
    let secs = (wait.as_secs_f64() * 10.0).ceil() / 10.0;
    let body = match shape {
        Shape::Openai => format!(
            r#"{{"error":{{"message":"Rate limit reached for requests. Please try again in {secs:.1}s.","type":"requests","code":"rate_limit_exceeded"}}}}"#
        ),
        Shape::Anthropic => format!(
            r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit. Please try again in {secs:.1}s."}}}}"#
        ),
    };
    let mut answer = Response::new(Body::from(body));
    *answer.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    answer.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

/// The figures as headers: the limit, what is left, and the time until full.
fn put(headers: &mut HeaderMap, shape: Shape, figures: &[(&str, Bucket, f64)]) {
    let now = jiff::Timestamp::now();
    for (kind, bucket, level) in figures {
        let remaining = level.max(0.0).floor() as u64;
        let full_in = Duration::from_secs_f64(((bucket.limit as f64 - level.max(0.0)) / bucket.rate()).max(0.0));
        let (names, reset) = match shape {
            Shape::Openai => (
                [
                    format!("x-ratelimit-limit-{kind}"),
                    format!("x-ratelimit-remaining-{kind}"),
                    format!("x-ratelimit-reset-{kind}"),
                ],
                format!("{}ms", full_in.as_secs_f64().mul_add(1000.0, 0.999).floor()),
            ),
            Shape::Anthropic => {
                let kind = if *kind == "tokens" { "input-tokens" } else { kind };
                // Whole seconds, rounded up: full by then.
                let at = now + jiff::SignedDuration::from_secs_f64(full_in.as_secs_f64());
                let at =
                    jiff::Timestamp::from_second(at.as_second() + i64::from(at.subsec_nanosecond() > 0)).unwrap_or(at);
                (
                    [
                        format!("anthropic-ratelimit-{kind}-limit"),
                        format!("anthropic-ratelimit-{kind}-remaining"),
                        format!("anthropic-ratelimit-{kind}-reset"),
                    ],
                    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                )
            }
        };
        for (name, value) in names.iter().zip([bucket.limit.to_string(), remaining.to_string(), reset]) {
            if let (Ok(name), Ok(value)) =
                (http::HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value))
            {
                headers.insert(name, value);
            }
        }
    }
}
