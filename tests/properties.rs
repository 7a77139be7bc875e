//! Property tests over the parsers that read what clients and upstreams
//! send: the SSE scanner, the request peek and model splice, hint parsing,
//! error-status reading, config loading. Random input, any chunking: no
//! panic, and the splice keeps every other byte. Bounded (proptest's case
//! count), so they run in every `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;

use tidegate::classify::hints;
use tidegate::config::Config;
use tidegate::protocol::events::Kind;
use tidegate::protocol::{self, Protocol};
use tidegate::stream::sse::Scanner;

fn protocols() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::OpenAiChat), Just(Protocol::OpenAiResponses), Just(Protocol::Anthropic)]
}

/// One SSE event: some `event:`/`data:`/comment lines, ended by a blank line.
fn event() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        "[a-z._]{1,20}".prop_map(|n| format!("event: {n}")),
        "\\PC{0,40}".prop_map(|d| format!("data: {}", d.replace(['\n', '\r'], " "))),
        Just("data: [DONE]".to_owned()),
        Just(r#"data: {"choices":[{"delta":{"content":"hi"}}]}"#.to_owned()),
        Just(r#"data: {"type":"response.output_text.delta","delta":"x"}"#.to_owned()),
        Just(r#"data: {"type":"content_block_delta","delta":{"text":"x"}}"#.to_owned()),
        "\\PC{0,20}".prop_map(|c| format!(": {}", c.replace(['\n', '\r'], " "))),
    ];
    (proptest::collection::vec(line, 1..4), prop_oneof![Just("\n"), Just("\r\n")])
        .prop_map(|(lines, nl)| format!("{}{nl}{nl}", lines.join(nl)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Whatever the chunking, the scanner finds every event and hands out
    /// exactly the bytes it was given, in order.
    #[test]
    fn sse_scanner_any_chunking(protocol in protocols(), events in proptest::collection::vec(event(), 1..12), cut in 1usize..64) {
        let bytes: Vec<u8> = events.concat().into_bytes();
        let mut s = Scanner::new(protocol, 1024);
        let mut out = Vec::new();
        let mut found = 0;
        for piece in bytes.chunks(cut) {
            s.feed(piece);
            while let Some((_, end)) = s.next_event() {
                found += 1;
                out.extend_from_slice(&s.take(end));
            }
        }
        prop_assert_eq!(found, events.len());
        prop_assert_eq!(out, bytes);
    }

    /// Garbage never panics the scanner or any protocol's grammar.
    #[test]
    fn sse_scanner_garbage(protocol in protocols(), data in proptest::collection::vec(any::<u8>(), 0..512), cut in 1usize..32) {
        let mut s = Scanner::with_limit(protocol, 64, 256);
        for piece in data.chunks(cut) {
            s.feed(piece);
            while let Some((kind, end)) = s.next_event() {
                let _ = matches!(kind, Kind::Content);
                let _ = s.take(end);
            }
            let _ = s.oversized();
        }
        let _ = protocol::error_status(&data);
        let _ = protocol::openai_responses::read_answer(&data);
    }

    /// The splice replaces the model's value and nothing else.
    #[test]
    fn splice_keeps_every_other_byte(
        model in "\\PC{0,24}",
        target in "\\PC{1,24}",
        before in proptest::collection::vec(("[a-z]{1,8}", any::<i32>()), 0..4),
        after in proptest::collection::vec(("[a-z]{1,8}", "\\PC{0,12}"), 0..4),
        stream in any::<bool>(),
    ) {
        let mut obj = String::from("{");
        for (k, v) in &before {
            if k != "model" && k != "stream" { obj.push_str(&format!("{}:{v},", serde_json::to_string(k).unwrap())); }
        }
        let literal = serde_json::to_string(&model).unwrap();
        obj.push_str(&format!(r#" "model" : {literal} ,"stream":{stream}"#));
        for (k, v) in &after {
            if k != "model" && k != "stream" {
                obj.push_str(&format!(",{}:{}", serde_json::to_string(k).unwrap(), serde_json::to_string(v).unwrap()));
            }
        }
        obj.push('}');
        let body = Bytes::from(obj.clone());
        let head = protocol::peek(&body).unwrap();
        prop_assert_eq!(&head.model, &model);
        prop_assert_eq!(head.stream, stream);
        let out = protocol::body_for_target(&body, &head, &target);
        let spliced: serde_json::Value = serde_json::from_slice(&out).unwrap();
        prop_assert_eq!(spliced["model"].as_str(), Some(target.as_str()));
        let new_literal = serde_json::to_string(&target).unwrap();
        prop_assert_eq!(&out[..head.model_span.start], &body[..head.model_span.start]);
        prop_assert_eq!(&out[head.model_span.start + new_literal.len()..], &body[head.model_span.end..]);
    }

    /// Any bytes as a request body: an answer (`Ok` or a clear error), no panic.
    #[test]
    fn peek_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = protocol::peek(&data);
    }

    /// Hints from any header values and any body text: no panic.
    #[test]
    fn hints_never_panic(retry_after in "\\PC{0,30}", reset in "\\PC{0,30}", body in "\\PC{0,200}") {
        let now = jiff::Timestamp::now();
        let mut headers = http::HeaderMap::new();
        for (name, value) in [("retry-after", &retry_after), ("retry-after-ms", &retry_after),
                              ("x-ratelimit-reset-requests", &reset), ("anthropic-ratelimit-requests-reset", &reset)] {
            if let Ok(v) = http::HeaderValue::from_str(value) {
                headers.insert(name, v);
            }
        }
        let _ = hints::from_headers(&headers, now);
        let _ = hints::parse_retry_after(&retry_after, now);
        let _ = hints::parse_go_duration(&reset);
        let _ = hints::projected_reset(&body, now);
    }

    /// Numbers of any size where a wait is expected (`retry-after: 1e30`,
    /// `retry-after-ms` of 25 digits, a Go duration of 10^20 hours): a wait
    /// no longer than `LONGEST_HINT`, never a panic. (The fuzz target
    /// `provider_answer` found the overflow this pins.)
    #[test]
    fn hints_of_any_size_are_bounded(
        digits in "[0-9]{1,40}",
        exponent in 0u32..400,
        unit in prop_oneof![Just("h"), Just("m"), Just("s"), Just("ms"), Just("ns")],
    ) {
        let now = jiff::Timestamp::from_second(1_790_000_000).unwrap();
        let sci = format!("{digits}e{exponent}");
        for value in [digits.as_str(), sci.as_str()] {
            let mut headers = http::HeaderMap::new();
            headers.insert("retry-after-ms", http::HeaderValue::from_str(value).unwrap());
            let wait = hints::from_headers(&headers, now).retry_after;
            prop_assert!(wait.is_none_or(|w| w <= hints::LONGEST_HINT));
            let wait = hints::parse_retry_after(value, now);
            prop_assert!(wait.is_none_or(|w| w <= hints::LONGEST_HINT));
        }
        let go = hints::parse_go_duration(&format!("{digits}{unit}"));
        prop_assert!(go.is_none_or(|w| w <= hints::LONGEST_HINT));
    }

    /// A provider's error answer of any status, headers and body is
    /// classified (to a class and a retry verdict), never a panic.
    #[test]
    fn any_provider_answer_is_classified(
        status in 100u16..600,
        retry_after in "\\PC{0,24}",
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let status = http::StatusCode::from_u16(status).unwrap();
        let mut headers = http::HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(&retry_after) {
            headers.insert("retry-after", v);
        }
        let outcome = tidegate::classify::classify(
            status, &headers, &body, &tidegate::classify::rules::Rules::default(), jiff::Timestamp::now(),
        );
        prop_assert!(outcome.hints.retry_after.is_none_or(|w| w <= hints::LONGEST_HINT));
        let _ = protocol::error_status(&body);
    }

    /// Bedrock's event-stream: any bytes in any chunking give SSE events
    /// or a clear error, never a panic.
    #[test]
    fn eventstream_garbage(data in proptest::collection::vec(any::<u8>(), 0..400), cut in 1usize..40) {
        let mut translator = tidegate::upstream::eventstream::Translator::default();
        let mut out = bytes::BytesMut::new();
        for chunk in data.chunks(cut) {
            translator.feed(chunk);
            if translator.drain(&mut out).is_err() {
                break;
            }
        }
    }

    /// A compressed answer, whole or cut anywhere, in any chunking: whole
    /// gzip of a JSON object is complete with its usage; any cut of it is
    /// not; garbage under any encoding is judged without a panic.
    #[test]
    fn compressed_answers_are_judged_by_their_content(
        tokens in 0u32..100_000,
        cut_at in 0usize..400,
        chunk in 1usize..64,
        garbage in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        use std::io::Write;
        use tidegate::stream::json_end::JsonEnd;
        let json = format!(r#"{{"id":"x","choices":[],"usage":{{"prompt_tokens":{tokens},"completion_tokens":1}}}}"#);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(json.as_bytes()).unwrap();
        let whole = gz.finish().unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_ENCODING, http::HeaderValue::from_static("gzip"));
        let judge = |bytes: &[u8]| {
            let mut end = JsonEnd::new(&headers);
            for c in bytes.chunks(chunk) {
                end.feed(c);
            }
            end.finish()
        };
        let end = judge(&whole);
        prop_assert!(end.complete);
        prop_assert_eq!(end.usage.input, Some(u64::from(tokens)));
        let cut = cut_at % whole.len();
        prop_assert!(!judge(&whole[..cut]).complete, "cut at {} of {}", cut, whole.len());
        for coding in ["gzip", "deflate", "br", "identity"] {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::CONTENT_ENCODING, http::HeaderValue::from_static(coding));
            let mut end = JsonEnd::new(&h);
            end.feed(&garbage);
            let _ = end.finish();
        }
    }

    /// Any text as a config file: problems with paths, never a panic.
    #[test]
    fn config_loading_never_panics(text in "\\PC{0,300}") {
        let _ = Config::parse(&text, &|_| None);
    }

    /// YAML-shaped noise around the real fields.
    #[test]
    fn config_fields_with_odd_values(field in "[a-z_]{1,16}", value in "\\PC{0,20}") {
        let yaml = format!(
            "{field}: {}\nupstreams:\n  - {{ name: u, protocol: openai, base_url: \"http://127.0.0.1:1/v1\", {field}: {} }}\nmodels:\n  m: {{ targets: [{{ upstream: u }}] }}\n",
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string(&value).unwrap()
        );
        let _ = Config::parse(&yaml, &|_| None);
    }
}
