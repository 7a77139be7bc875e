//! A provider that advertises its rate limits on every answer, as OpenAI
//! and Anthropic do, and refuses over them with the same headers and a
//! "try again in" hint — so that pacing to advertised limits can be
//! tested and measured (see [`Advertise`]).
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

/// The middleware: takes the request's costs from the buckets, refuses
/// when either is short, and puts the figures on the answer either way.
pub(crate) async fn layer(State(state): State<Arc<SimState>>, req: Request, next: Next) -> Response {
    let Some(advertise) = state.config.advertise.clone().filter(|_| !req.uri().path().starts_with("/sim/")) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let max_tokens = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("max_tokens").and_then(serde_json::Value::as_u64))
        .unwrap_or(1024);
    let costs = [1.0, (max_tokens + body.len() as u64 / 4) as f64];
    let buckets = [advertise.requests, advertise.tokens];
    let now = Instant::now();
    let (admitted, figures) = {
        let Ok(mut levels) = state.advert_levels.lock() else {
            return next.run(Request::from_parts(parts, body.into())).await;
        };
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
