//! A provider's error answer: status, headers and body classified (with a
//! retry rule that reads the body), the retry hints read from its headers
//! (Retry-After, the reset headers) and from its text (a projected reset),
//! and an error event's status. Never a panic, never a wait beyond the cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::classify::{self, hints};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let status = http::StatusCode::from_u16(100 + u16::from_le_bytes([data[0], data[1]]) % 500)
        .unwrap_or(http::StatusCode::TOO_MANY_REQUESTS);
    let split = usize::from(data[2]).min(data.len() - 3);
    let (header_bytes, body) = data[3..].split_at(split);
    let header_text = String::from_utf8_lossy(header_bytes);
    let mut headers = http::HeaderMap::new();
    for (i, name) in
        ["retry-after", "retry-after-ms", "x-ratelimit-reset-requests", "anthropic-ratelimit-tokens-reset", "x-should-retry"]
            .into_iter()
            .enumerate()
    {
        if let Some(value) = header_text.split('|').nth(i)
            && let Ok(v) = http::HeaderValue::from_str(value)
        {
            headers.insert(name, v);
        }
    }
    let now = jiff::Timestamp::from_second(1_790_000_000).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let _ = hints::from_headers(&headers, now);
    let _ = hints::parse_retry_after(&header_text, now);
    let _ = hints::parse_go_duration(&header_text);
    let _ = hints::projected_reset(&String::from_utf8_lossy(body), now);
    let _ = tidegate::protocol::error_status(body);
    let outcome = classify::classify(status, &headers, body, &classify::rules::Rules::default(), now);
    let _ = tidegate::classify::summary::summarize(body);
    let _ = outcome;
});
