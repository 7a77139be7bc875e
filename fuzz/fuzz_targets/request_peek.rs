//! A client's request body: the peek that reads model, stream, max_tokens
//! and the Responses fields, then the splice that rewrites the model for a
//! target; the same bytes as a Gemini request (its peek, and translated for
//! an Anthropic and a chat target). Never a panic; the splice keeps the
//! body valid where it was.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gemini(data);
    if let Ok(head) = tidegate::protocol::peek(data) {
        let body = Bytes::copy_from_slice(data);
        let spliced = tidegate::protocol::body_for_target(&body, &head, "target-model-x");
        if serde_json_valid(data) {
            assert!(serde_json_valid(&spliced), "the splice broke a valid body");
        }
    }
});

fn gemini(data: &[u8]) {
    use tidegate::protocol::Protocol;
    let _ = tidegate::protocol::gemini::peek(data, "m", true);
    for target in [Protocol::Anthropic, Protocol::OpenAiChat] {
        let _ = tidegate::translate::request_keeping(Protocol::Gemini, target, data, "m", true, None);
    }
}

fn serde_json_valid(data: &[u8]) -> bool {
    tidegate::protocol::peek(data).is_ok()
}
