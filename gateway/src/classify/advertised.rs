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
//! - Subscription windows (a coding plan's 5-hour and weekly use), as the
//!   clients that hold such plans read them: Anthropic's
//!   `anthropic-ratelimit-unified-{5h,7d}-{utilization,reset,status}`
//!   (a fraction, Unix seconds, `allowed`/`allowed_warning`/`rejected`;
//!   read by Claude Code and the tools around it) and Codex's
//!   `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at}`
//!   (a percentage, minutes, Unix seconds; older answers say
//!   `reset-after-seconds`), as `codex-rs/codex-api/src/rate_limits.rs`
//!   in openai/codex parses them.
//!
//! Both rate limits describe a token bucket: `limit` units, `remaining` now, refilled
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
    /// A subscription's windows: the short one (5 hours) and the long
    /// one (a week).
    pub windows: [Option<Window>; 2],
}

/// One subscription window as an answer reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Share used, 0 to 1 (a value above 1 is read as 1).
    pub used: f64,
    /// Time until it resets.
    pub resets_in: Option<Duration>,
    /// Its length, when said (Codex), else the usual one for its name.
    pub span: Option<Duration>,
    /// The provider says requests are refused until it resets.
    pub rejected: bool,
}

impl Window {
    /// Used up: nothing more is served before its reset.
    pub fn exhausted(&self) -> bool {
        self.rejected || self.used >= 1.0
    }
}

impl Advert {
    /// Nothing advertised (most answers of most providers).
    pub fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none() && self.windows.iter().all(Option::is_none)
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

#[derive(Default)]
struct WindowParts {
    used: Option<f64>,
    reset_at: Option<f64>,
    reset_after: Option<f64>,
    minutes: Option<f64>,
    rejected: bool,
}

impl WindowParts {
    fn window(&self, now: impl Fn() -> Timestamp, usual: Duration) -> Option<Window> {
        let used = self.used.filter(|u| u.is_finite() && *u >= 0.0)?.min(1.0);
        let until = |secs: f64| {
            (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(LONGEST_HINT.as_secs_f64())))
        };
        let resets_in = self
            .reset_at
            .and_then(|at| until((at - now().as_millisecond() as f64 / 1000.0).max(0.0)))
            .or_else(|| self.reset_after.and_then(until));
        let span = self.minutes.and_then(|m| until(m * 60.0)).filter(|s| !s.is_zero()).or(Some(usual));
        Some(Window { used, resets_in, span, rejected: self.rejected })
    }
}

/// The usual lengths of the short and the long window.
const SPANS: [Duration; 2] = [Duration::from_secs(5 * 3600), Duration::from_secs(7 * 24 * 3600)];

/// Reads an answer's advertised limits in one pass over its headers (an
/// answer without any costs a prefix comparison a header).
pub fn read(headers: &HeaderMap, clock: impl Fn() -> Timestamp) -> Advert {
    // The clock is read once, and only if a figure is a time.
    let at = std::cell::OnceCell::new();
    let now = || *at.get_or_init(&clock);
    // A header that may be one of these was seen (else: nothing to build).
    let mut maybe = false;
    let (mut requests, mut tokens, mut input) = (Parts::default(), Parts::default(), Parts::default());
    let mut windows = [WindowParts::default(), WindowParts::default()];
    for (name, value) in headers {
        let name = name.as_str();
        // Most headers are none of these: one look at the first byte.
        if name.len() < 12 || !matches!(name.as_bytes()[0], b'x' | b'a') {
            continue;
        }
        maybe = true;
        if let Some(rest) = name.strip_prefix("anthropic-ratelimit-unified-") {
            let Some((which, field)) = rest.split_once('-') else { continue };
            let w = match which {
                "5h" => &mut windows[0],
                "7d" => &mut windows[1],
                _ => continue,
            };
            let Ok(value) = value.to_str() else { continue };
            let value = value.trim();
            match field {
                "utilization" => w.used = value.parse().ok(),
                "reset" => w.reset_at = value.parse().ok(),
                "status" => w.rejected = value == "rejected",
                _ => {}
            }
            continue;
        }
        if let Some(rest) = name.strip_prefix("x-codex-") {
            let Some((which, field)) = rest.split_once('-') else { continue };
            let w = match which {
                "primary" => &mut windows[0],
                "secondary" => &mut windows[1],
                _ => continue,
            };
            let Ok(value) = value.to_str() else { continue };
            let value: Option<f64> = value.trim().parse().ok();
            match field {
                "used-percent" => w.used = value.map(|p| p / 100.0),
                "reset-at" => w.reset_at = value,
                "reset-after-seconds" => w.reset_after = value,
                "window-minutes" => w.minutes = value,
                _ => {}
            }
            continue;
        }
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
            "reset" if anthropic => parts.reset = reset_at(value, now()),
            "reset" => parts.reset = parse_go_duration(value).map(|d| d.min(LONGEST_HINT)),
            _ => {}
        }
    }
    if !maybe {
        return Advert::default();
    }
    Advert {
        requests: requests.quota(),
        tokens: tokens.quota().or_else(|| input.quota()),
        windows: [windows[0].window(now, SPANS[0]), windows[1].window(now, SPANS[1])],
    }
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
            || now,
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
            || now,
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
            || now,
        );
        assert!(odd.is_empty(), "{odd:?}");
        let over =
            read(&headers(&[("x-ratelimit-limit-requests", "10"), ("x-ratelimit-remaining-requests", "50")]), || now);
        assert_eq!(over.requests.map(|q| q.remaining), Some(10));
        let far = read(
            &headers(&[
                ("x-ratelimit-limit-requests", "10"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "99999999h"),
            ]),
            || now,
        );
        assert_eq!(far.requests.map(|q| q.reset), Some(LONGEST_HINT));
        assert!(read(&headers(&[("content-type", "application/json")]), || now).is_empty());
    }

    #[test]
    fn subscription_windows_of_claude_and_codex_plans_are_read() {
        let now: Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let at = |secs: i64| (now.as_second() + secs).to_string();
        let claude = read(
            &headers(&[
                ("anthropic-ratelimit-unified-5h-utilization", "0.8"),
                ("anthropic-ratelimit-unified-5h-reset", &at(600)),
                ("anthropic-ratelimit-unified-5h-status", "allowed_warning"),
                ("anthropic-ratelimit-unified-7d-utilization", "1.0"),
                ("anthropic-ratelimit-unified-7d-reset", &at(86_400)),
                ("anthropic-ratelimit-unified-7d-status", "rejected"),
            ]),
            || now,
        );
        let [short, long] = claude.windows;
        let short = short.unwrap();
        assert_eq!((short.used, short.resets_in, short.exhausted()), (0.8, Some(Duration::from_secs(600)), false));
        assert_eq!(short.span, Some(Duration::from_secs(5 * 3600)));
        assert!(long.unwrap().exhausted());
        let codex = read(
            &headers(&[
                ("x-codex-primary-used-percent", "42.5"),
                ("x-codex-primary-window-minutes", "300"),
                ("x-codex-primary-reset-at", &at(3600)),
                ("x-codex-secondary-used-percent", "9"),
                ("x-codex-secondary-window-minutes", "10080"),
                ("x-codex-secondary-reset-after-seconds", "7200"),
            ]),
            || now,
        );
        let [primary, secondary] = codex.windows;
        assert_eq!(primary.unwrap().used, 0.425);
        assert_eq!(primary.unwrap().resets_in, Some(Duration::from_secs(3600)));
        assert_eq!(secondary.unwrap().resets_in, Some(Duration::from_secs(7200)));
        assert_eq!(secondary.unwrap().span, Some(Duration::from_secs(10_080 * 60)));
        // Odd values: not numbers, negative, past resets, absurd spans.
        let odd = read(
            &headers(&[
                ("x-codex-primary-used-percent", "many"),
                ("anthropic-ratelimit-unified-5h-utilization", "-1"),
                ("anthropic-ratelimit-unified-7d-utilization", "7"),
                ("anthropic-ratelimit-unified-7d-reset", "1"),
            ]),
            || now,
        );
        assert_eq!(odd.windows[0], None);
        let long = odd.windows[1].unwrap();
        assert_eq!((long.used, long.resets_in), (1.0, Some(Duration::ZERO)));
    }
}
