//! Translation both ways, from bytes a client or a provider chose: the
//! request read in every client protocol and written for every target
//! (JSON nested to any depth included: a reader that recursed without a
//! bound overflowed its stack), and the same bytes as a target's stream
//! translated for every client (garbage events, cut events, huge tool
//! calls). Never a panic, never a stack overflow; a translated stream that
//! breaks says so in the client's words and writes nothing after.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::protocol::{ErrorKind, Protocol};
use tidegate::translate;

const CLIENTS: [Protocol; 4] = [Protocol::OpenAiChat, Protocol::OpenAiResponses, Protocol::Anthropic, Protocol::Gemini];
const TARGETS: [Protocol; 3] = [Protocol::OpenAiChat, Protocol::Anthropic, Protocol::Gemini];

/// A small request of `client`'s, to get a translation's way back.
fn sample(client: Protocol) -> &'static [u8] {
    match client {
        Protocol::OpenAiChat => br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        Protocol::OpenAiResponses => br#"{"model":"m","stream":true,"store":false,"input":"hi"}"#,
        Protocol::Anthropic => br#"{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
        Protocol::Gemini => br#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#,
    }
}

fuzz_target!(|data: &[u8]| {
    for client in CLIENTS {
        for target in TARGETS {
            if client == target {
                continue;
            }
            let _ = translate::request_keeping(client, target, data, "m", true, None);
            let Ok(t) = translate::request(client, target, sample(client), "m") else { continue };
            let _ = translate::answer(&t.back, data);
            let _ = translate::error(&t.back, 429, data);
            let Some(mut stream) = translate::Stream::new(&t.back, 4096) else { continue };
            let mut out = stream.events(data).to_vec();
            if stream.take_broken().is_some() {
                out.extend_from_slice(&stream.fail(ErrorKind::Api, "broken"));
                assert!(stream.events(b"data: {}\n\n").is_empty(), "written after the break");
            } else {
                out.extend_from_slice(&stream.finish());
            }
            let _ = out;
        }
    }
});
