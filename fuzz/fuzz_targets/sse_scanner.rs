//! A provider's SSE stream, in any chunking, for each protocol: the
//! scanner frames events, inspects them (usage, text, errors, the end) and
//! hands every byte back exactly once. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::protocol::Protocol;
use tidegate::stream::sse::Scanner;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let protocol = match control % 4 {
        0 => Protocol::OpenAiChat,
        1 => Protocol::OpenAiResponses,
        2 => Protocol::Gemini,
        _ => Protocol::Anthropic,
    };
    let cut = usize::from(control / 4).max(1);
    let mut scanner = Scanner::with_limit(protocol, 4096, 16 * 1024);
    let mut out = Vec::new();
    for chunk in rest.chunks(cut) {
        scanner.feed(chunk);
        while let Some((_, end)) = scanner.next_event() {
            out.extend_from_slice(&scanner.take(end));
        }
        if scanner.oversized() {
            return;
        }
    }
    out.extend_from_slice(&scanner.take(scanner.held()));
    assert_eq!(out, rest, "the scanner lost or repeated bytes");
});
