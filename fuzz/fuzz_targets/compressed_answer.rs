//! A provider's JSON answer under a content encoding (gzip, deflate, or
//! one tidegate does not decode), in any chunking: its end and usage read
//! as it passes, and a whole body decoded for reading. Never a panic, and
//! the decoded copy stays within its limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::stream::json_end::{JsonEnd, decoded};

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let coding = ["gzip", "deflate", "br", "identity"][usize::from(control % 4)];
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_ENCODING, http::HeaderValue::from_static(coding));
    if control & 4 != 0 {
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(rest.len()));
    }
    let mut end = JsonEnd::new(&headers);
    for chunk in rest.chunks(usize::from(control / 8).max(1)) {
        end.feed(chunk);
    }
    let _ = end.finish();
    if let Some(plain) = decoded(&headers, rest, 4096) {
        assert!(plain.len() <= 4096);
    }
});
