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
