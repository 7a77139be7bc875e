//! The rate limits a provider advertises on its answers — on every one,
//! successes included, not only on refusals — read so that tidegate can
//! pace to them before the provider has to refuse anything.
//!
//! - OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the
//!   reset as a Go duration (`1s`, `6m0s`, `20ms`); documented at
//!   <https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers>.
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
//!   the reset as an RFC 3339 time; documented at
//!   <https://docs.anthropic.com/en/api/rate-limits#response-headers>.
//!
//! Both describe a token bucket: `limit` units, `remaining` now, refilled
//! continuously so that it is full again after `reset`. Values that are
//! not numbers, a remaining above the limit (clamped) or a limit of zero
//! are ignored; a reset is at most [`super::hints::LONGEST_HINT`], and the
//! pacer bounds every wait it derives from one (see `limits::paced`).

use std::time::Duration;

use http::HeaderMap;
use jiff::Timestamp;

use super::hints::{LONGEST_HINT, parse_go_duration};

/// One advertised limit: a bucket of `limit` units with `remaining` left,
/// full again after `reset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    /// Units the bucket holds (requests or tokens).
    pub limit: u64,
    /// Units left as the provider admitted the answered request.
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

/// What one answer advertised.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Advert {
    /// Requests.
    pub requests: Option<Quota>,
    /// Tokens (Anthropic's input tokens where it sends no combined
    /// figure: output tokens are not known before a request is sent).
    pub tokens: Option<Quota>,
}

impl Advert {
    /// Nothing advertised (most answers of most providers).
    pub fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }
}

/// The largest limit believed: a number past this is not a limit anyone
/// can reach, and it keeps every sum and product far from overflow.
const LARGEST: u64 = 1_000_000_000_000;

#[derive(Default)]
struct Parts {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
}

impl Parts {
    fn quota(&self) -> Option<Quota> {
        let limit = self.limit.filter(|l| (1..=LARGEST).contains(l))?;
        let remaining = self.remaining?.min(limit);
        Some(Quota { limit, remaining, reset: self.reset.unwrap_or(Duration::ZERO) })
    }
}

/// Reads an answer's advertised limits in one pass over its headers (an
/// answer without any costs a prefix comparison a header).
pub fn read(headers: &HeaderMap, now: Timestamp) -> Advert {
    let (mut requests, mut tokens, mut input) = (Parts::default(), Parts::default(), Parts::default());
    for (name, value) in headers {
        let name = name.as_str();
        let (kind, field, anthropic) = if let Some(rest) = name.strip_prefix("x-ratelimit-") {
            let Some((field, kind)) = rest.split_once('-') else { continue };
            (kind, field, false)
        } else if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
            let Some((kind, field)) = rest.rsplit_once('-') else { continue };
            (kind, field, true)
        } else {
            continue;
        };
        let parts = match kind {
            "requests" => &mut requests,
            "tokens" => &mut tokens,
            "input-tokens" if anthropic => &mut input,
            _ => continue,
        };
        let Ok(value) = value.to_str() else { continue };
        let value = value.trim();
        match field {
            "limit" => parts.limit = value.parse().ok(),
            "remaining" => parts.remaining = value.parse().ok(),
            "reset" if anthropic => parts.reset = reset_at(value, now),
            "reset" => parts.reset = parse_go_duration(value).map(|d| d.min(LONGEST_HINT)),
            _ => {}
        }
    }
    Advert { requests: requests.quota(), tokens: tokens.quota().or_else(|| input.quota()) }
}

/// An RFC 3339 reset time as the time left until it (zero if past).
fn reset_at(value: &str, now: Timestamp) -> Option<Duration> {
    let at: Timestamp = value.parse().ok()?;
    Some(Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO).min(LONGEST_HINT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn openai_and_anthropic_shapes_are_read_and_odd_values_ignored() {
        let now: Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let openai = read(
            &headers(&[
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-limit-tokens", "40000"),
                ("x-ratelimit-remaining-tokens", "39800"),
                ("x-ratelimit-reset-tokens", "300ms"),
            ]),
            now,
        );
        assert_eq!(openai.requests, Some(Quota { limit: 60, remaining: 59, reset: Duration::from_secs(1) }));
        assert_eq!(openai.tokens, Some(Quota { limit: 40_000, remaining: 39_800, reset: Duration::from_millis(300) }));
        let anthropic = read(
            &headers(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-reset", "2026-12-07T12:00:02Z"),
                ("anthropic-ratelimit-input-tokens-limit", "30000"),
                ("anthropic-ratelimit-input-tokens-remaining", "29000"),
                ("anthropic-ratelimit-input-tokens-reset", "2026-12-07T11:59:00Z"),
            ]),
            now,
        );
        assert_eq!(anthropic.requests, Some(Quota { limit: 50, remaining: 49, reset: Duration::from_secs(2) }));
        assert_eq!(anthropic.tokens, Some(Quota { limit: 30_000, remaining: 29_000, reset: Duration::ZERO }));
        // Not numbers, a zero or absurd limit, a remaining above the limit.
        let odd = read(
            &headers(&[
                ("x-ratelimit-limit-requests", "lots"),
                ("x-ratelimit-remaining-requests", "5"),
                ("x-ratelimit-limit-tokens", "0"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("anthropic-ratelimit-requests-limit", "99999999999999999999"),
            ]),
            now,
        );
        assert!(odd.is_empty(), "{odd:?}");
        let over =
            read(&headers(&[("x-ratelimit-limit-requests", "10"), ("x-ratelimit-remaining-requests", "50")]), now);
        assert_eq!(over.requests.map(|q| q.remaining), Some(10));
        let far = read(
            &headers(&[
                ("x-ratelimit-limit-requests", "10"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "99999999h"),
            ]),
            now,
        );
        assert_eq!(far.requests.map(|q| q.reset), Some(LONGEST_HINT));
        assert!(read(&headers(&[("content-type", "application/json")]), now).is_empty());
    }
}
