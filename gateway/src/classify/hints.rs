//! When to come back, as the provider said it: headers, strongest first,
//! and a reset time written in the body (kept as a projection only).

use std::time::Duration;

use http::HeaderMap;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Everything an answer said about waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// `x-should-retry`: `Some(false)` forbids a retry, `Some(true)` asks for one.
    pub should_retry: Option<bool>,
    /// The strongest explicit wait found in the headers.
    pub retry_after: Option<Duration>,
    /// Which header gave `retry_after` (for messages and the journal).
    pub source: Option<&'static str>,
    /// A reset instant written in the body ("resets 3:20am (America/New_York)").
    /// Reported, never slept on: it has proven to be hours off.
    pub projected_reset: Option<Timestamp>,
}

/// Reads every wait hint from response headers, strongest first:
/// `retry-after-ms`, `Retry-After` (seconds or HTTP date),
/// `x-ratelimit-reset-requests`/`-tokens` (`1s`, `6m0s`, `20ms`), then
/// `anthropic-ratelimit-*-reset` (RFC 3339). Malformed values are ignored.
pub fn from_headers(headers: &HeaderMap, now: Timestamp) -> Hints {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let should_retry = match text("x-should-retry") {
        Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    };
    let candidates: [(&'static str, Option<Duration>); 4] = [
        ("retry-after-ms", text("retry-after-ms").and_then(parse_millis)),
        ("retry-after", text("retry-after").and_then(|v| parse_retry_after(v, now))),
        ("x-ratelimit-reset", ratelimit_reset(&text)),
        ("anthropic-ratelimit-reset", anthropic_reset(headers, now)),
    ];
    let found = candidates.into_iter().find_map(|(source, wait)| wait.map(|w| (source, w)));
    Hints { should_retry, retry_after: found.map(|(_, w)| w), source: found.map(|(s, _)| s), projected_reset: None }
}

/// The longest wait a hint is read as. A provider's number is anything it
/// sends (`retry-after: 1e30`); past this it means "not soon", which is all
/// any request's deadline can use, and it stays far from the overflow of
/// `Duration` and of an `Instant` it is added to.
pub const LONGEST_HINT: Duration = Duration::from_secs(366 * 24 * 3600);

/// `secs` as a wait: `None` unless a finite number ≥ 0; at most
/// [`LONGEST_HINT`].
fn wait_of(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(LONGEST_HINT.as_secs_f64())))
}

fn parse_millis(v: &str) -> Option<Duration> {
    let ms: f64 = v.parse().ok()?;
    wait_of(ms / 1000.0)
}

/// `Retry-After`: delay seconds (integer, or decimal as some providers send)
/// or an HTTP date.
pub fn parse_retry_after(v: &str, now: Timestamp) -> Option<Duration> {
    if let Ok(secs) = v.parse::<f64>() {
        return wait_of(secs);
    }
    static PARSER: jiff::fmt::rfc2822::DateTimeParser = jiff::fmt::rfc2822::DateTimeParser::new();
    let at = PARSER.parse_timestamp(v).ok()?;
    until(now, at)
}

fn until(now: Timestamp, at: Timestamp) -> Option<Duration> {
    let d = at.duration_since(now);
    Some(Duration::try_from(d).unwrap_or(Duration::ZERO).min(LONGEST_HINT))
}

/// OpenAI's `x-ratelimit-reset-{requests,tokens}`: the reset of the limit
/// that is exhausted (`x-ratelimit-remaining-*: 0`), else the later one.
fn ratelimit_reset<'a>(text: &dyn Fn(&str) -> Option<&'a str>) -> Option<Duration> {
    let pick = |kind: &str| {
        let reset = text(&format!("x-ratelimit-reset-{kind}")).and_then(parse_go_duration)?;
        let exhausted = text(&format!("x-ratelimit-remaining-{kind}")) == Some("0");
        Some((exhausted, reset))
    };
    choose([pick("requests"), pick("tokens")].into_iter().flatten())
}

/// Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339), same choice.
fn anthropic_reset(headers: &HeaderMap, now: Timestamp) -> Option<Duration> {
    let kinds = ["requests", "tokens", "input-tokens", "output-tokens"];
    let found = kinds.iter().filter_map(|kind| {
        let reset = headers.get(format!("anthropic-ratelimit-{kind}-reset"))?.to_str().ok()?;
        let at: Timestamp = reset.trim().parse().ok()?;
        let remaining = headers.get(format!("anthropic-ratelimit-{kind}-remaining"));
        let exhausted = remaining.and_then(|v| v.to_str().ok()) == Some("0");
        Some((exhausted, until(now, at)?))
    });
    choose(found)
}

/// The exhausted limit's reset if any is marked exhausted, else the longest.
fn choose(found: impl Iterator<Item = (bool, Duration)>) -> Option<Duration> {
    let all: Vec<(bool, Duration)> = found.collect();
    let exhausted = all.iter().filter(|(e, _)| *e).map(|(_, d)| *d).max();
    exhausted.or_else(|| all.iter().map(|(_, d)| *d).max())
}

/// Go-style durations as OpenAI sends them: `1s`, `6m0s`, `20ms`, `1h2m3.5s`.
pub fn parse_go_duration(v: &str) -> Option<Duration> {
    let mut rest = v.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * secs;
    }
    wait_of(total)
}

/// A quota reset further away than this is not waited for (Gemini CLI
/// stops retrying beyond it too): the target is out until then.
pub const LONG_RESET: Duration = Duration::from_secs(300);

/// What a Google RPC error body says about waiting: `RetryInfo`'s
/// `retryDelay`, "Please retry in 3.5s" or "Your quota will reset after
/// 15h57m40s" in its message, and whether a `QuotaFailure` names a daily
/// quota (`…PerDay…`, `…Daily…`): Gemini's own capacity contract.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GoogleWait {
    /// When to come back, as the body says it.
    pub retry: Option<Duration>,
    /// A quota that resets after this long (said in words).
    pub reset_after: Option<Duration>,
    /// A per-day quota ran out.
    pub daily: bool,
    /// A per-minute quota ran out (capacity, whatever the words say:
    /// Google's message for it speaks of "plan and billing details").
    pub per_minute: bool,
}

/// Reads [`GoogleWait`] from an error body (anything else reads as none).
pub fn google_wait(body: &str) -> GoogleWait {
    let mut out = GoogleWait::default();
    let after = |marker: &str| {
        let at = body.find(marker)? + marker.len();
        let word: String =
            body[at..].trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
        parse_go_duration(word.trim_end_matches('.'))
    };
    out.reset_after = after("quota will reset after");
    let said = after("Please retry in");
    if !body.contains("type.googleapis.com/google.rpc.") {
        out.retry = said;
        return out;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else { return out };
    let outer = v.as_array().and_then(|a| a.first()).unwrap_or(&v);
    let details = outer["error"]["details"].as_array().map(Vec::as_slice).unwrap_or_default();
    for d in details {
        match d["@type"].as_str().unwrap_or_default() {
            "type.googleapis.com/google.rpc.RetryInfo" => {
                out.retry = d["retryDelay"].as_str().and_then(parse_go_duration);
            }
            "type.googleapis.com/google.rpc.QuotaFailure" => {
                let violations = d["violations"].as_array().map(Vec::as_slice).unwrap_or_default();
                for q in violations {
                    let id = q["quotaId"].as_str().unwrap_or_default();
                    out.daily |= id.contains("PerDay") || id.contains("Daily");
                    out.per_minute |= id.contains("PerMinute");
                }
            }
            _ => {}
        }
    }
    out.retry = out.retry.or(said);
    out
}

/// The next midnight in Google's quota day (Pacific time), when a daily
/// quota of the Gemini API resets.
pub fn next_pacific_midnight(now: Timestamp) -> Option<Timestamp> {
    let tz = TimeZone::get("America/Los_Angeles").ok()?;
    let tomorrow = tz.to_datetime(now).date().tomorrow().ok()?;
    tz.to_ambiguous_timestamp(tomorrow.to_datetime(jiff::civil::Time::midnight())).compatible().ok()
}

/// Finds "resets 3:20am (America/New_York)" (also "resets at 15:20 (Europe/Paris)",
/// "resets 3am") in a body and turns it into the next such instant after
/// `now` in that zone, using the bundled time-zone database (so DST is right).
pub fn projected_reset(body: &str, now: Timestamp) -> Option<Timestamp> {
    let lower = body.to_ascii_lowercase();
    let mut search = 0;
    while let Some(pos) = lower[search..].find("resets") {
        let start = search + pos + "resets".len();
        search = start;
        let rest = body[start..].trim_start();
        let rest = rest.strip_prefix("at ").unwrap_or(rest).trim_start();
        if let Some(ts) = parse_wall_time(rest, now) {
            return Some(ts);
        }
    }
    None
}

fn parse_wall_time(text: &str, now: Timestamp) -> Option<Timestamp> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let mut hour: i8 = text.get(..digits)?.parse().ok()?;
    let mut rest = &text[digits..];
    let mut minute: i8 = 0;
    if let Some(r) = rest.strip_prefix(':') {
        let d = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        minute = r.get(..d)?.parse().ok()?;
        rest = &r[d..];
    }
    let trimmed = rest.trim_start();
    let lower = trimmed.to_ascii_lowercase();
    if lower.starts_with("am") || lower.starts_with("pm") {
        if !(1..=12).contains(&hour) {
            return None;
        }
        let pm = lower.starts_with("pm");
        hour = match (hour, pm) {
            (12, false) => 0,
            (12, true) => 12,
            (h, true) => h + 12,
            (h, false) => h,
        };
        rest = &trimmed[2..];
    } else if digits == text.len() || !text[digits..].starts_with(':') {
        return None; // a bare number is not a time
    }
    if !(0..24).contains(&hour) || !(0..60).contains(&minute) {
        return None;
    }
    let zone = rest.trim_start().strip_prefix('(').and_then(|z| z.split(')').next());
    let tz = match zone {
        Some(name) => TimeZone::get(name.trim()).ok()?,
        None => TimeZone::UTC,
    };
    let today = tz.to_datetime(now).date();
    for date in [Some(today), today.tomorrow().ok()].into_iter().flatten() {
        let local = date.at(hour, minute, 0, 0);
        let ts = tz.to_ambiguous_timestamp(local).compatible().ok()?;
        if ts > now {
            return Some(ts);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-11-29T12:00:00Z".parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn header_forms_strongest_first() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<u64>, Option<&'a str>);
        let cases: &[Case<'_>] = &[
            (&[], None, None),
            (&[("retry-after", "2")], Some(2000), Some("retry-after")),
            (&[("retry-after", "1.5")], Some(1500), Some("retry-after")),
            (&[("retry-after", "Sun, 29 Nov 2026 12:00:30 GMT")], Some(30_000), Some("retry-after")),
            (&[("retry-after", "Sun, 29 Nov 2026 11:00:00 GMT")], Some(0), Some("retry-after")),
            (&[("retry-after-ms", "250"), ("retry-after", "9")], Some(250), Some("retry-after-ms")),
            (
                &[("retry-after", "soon"), ("x-ratelimit-reset-requests", "6m0s")],
                Some(360_000),
                Some("x-ratelimit-reset"),
            ),
            (&[("retry-after", "-3")], None, None),
            (&[("x-ratelimit-reset-requests", "20ms")], Some(20), Some("x-ratelimit-reset")),
            (
                &[("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "6m0s")],
                Some(360_000),
                Some("x-ratelimit-reset"),
            ),
            (
                &[
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                    ("x-ratelimit-remaining-tokens", "1200"),
                ],
                Some(1000),
                Some("x-ratelimit-reset"),
            ),
            (&[("x-ratelimit-reset-tokens", "bogus")], None, None),
            (
                &[("anthropic-ratelimit-requests-reset", "2026-11-29T12:00:07Z")],
                Some(7000),
                Some("anthropic-ratelimit-reset"),
            ),
            (&[("anthropic-ratelimit-tokens-reset", "yesterday")], None, None),
        ];
        for (pairs, want_ms, want_source) in cases {
            let h = from_headers(&headers(pairs), now());
            assert_eq!(h.retry_after.map(|d| d.as_millis() as u64), *want_ms, "{pairs:?}");
            assert_eq!(h.source, *want_source, "{pairs:?}");
        }
    }

    #[test]
    fn should_retry_header() {
        assert_eq!(from_headers(&headers(&[("x-should-retry", "false")]), now()).should_retry, Some(false));
        assert_eq!(from_headers(&headers(&[("x-should-retry", "TRUE")]), now()).should_retry, Some(true));
        assert_eq!(from_headers(&headers(&[("x-should-retry", "maybe")]), now()).should_retry, None);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        // A provider's absurd number is a long wait, not a panic (found by
        // the provider_answer fuzz target: retry-after-ms of 2.5e24).
        let now = Timestamp::from_second(1_790_000_000).unwrap();
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", http::HeaderValue::from_static("2511111111111111111111110"));
        assert_eq!(from_headers(&h, now).retry_after, Some(LONGEST_HINT));
        assert_eq!(parse_retry_after("1e300", now), Some(LONGEST_HINT));
        assert_eq!(parse_go_duration("99999999999999999999999h"), Some(LONGEST_HINT));

        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("5x"), None);
    }

    #[test]
    fn reset_text_in_body_becomes_an_instant() {
        let body = "You've hit your session limit · resets 3:20am (America/New_York)";
        // 12:00Z = 07:00 EST, so 3:20am is tomorrow: 08:20Z.
        assert_eq!(projected_reset(body, now()).unwrap().to_string(), "2026-11-30T08:20:00Z");
        // Before 3:20 local on the same day.
        let early: Timestamp = "2026-11-29T06:00:00Z".parse().unwrap(); // 01:00 EST
        assert_eq!(projected_reset(body, early).unwrap().to_string(), "2026-11-29T08:20:00Z");
        assert_eq!(
            projected_reset("limit resets at 15:20 (Europe/Paris).", now()).unwrap().to_string(),
            "2026-11-29T14:20:00Z"
        );
        assert_eq!(projected_reset("resets 12pm", now()).unwrap().to_string(), "2026-11-30T12:00:00Z");
        assert_eq!(projected_reset("nothing here", now()), None);
        assert_eq!(projected_reset("resets 3:20am (Mars/Olympus)", now()), None);
        assert_eq!(projected_reset("resets 99 times", now()), None);
    }

    #[test]
    fn reset_text_across_a_dst_change() {
        // 2026-03-08: New York springs forward at 02:00 EST → 03:00 EDT.
        let before: Timestamp = "2026-03-08T05:00:00Z".parse().unwrap(); // 00:00 EST
        let body = "session limit · resets 3:20am (America/New_York)";
        // 03:20 EDT (UTC-4), not EST: 07:20Z.
        assert_eq!(projected_reset(body, before).unwrap().to_string(), "2026-03-08T07:20:00Z");
        // 2:30am does not exist that day: the compatible reading is 03:30 EDT.
        let gap = "resets 2:30am (America/New_York)";
        assert_eq!(projected_reset(gap, before).unwrap().to_string(), "2026-03-08T07:30:00Z");
    }
}
