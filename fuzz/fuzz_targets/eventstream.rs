//! Bedrock's binary event-stream from a provider, in any chunking: the
//! decoder turns complete messages into SSE events or a clear error.
//! Never a panic.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tidegate::upstream::eventstream::Translator;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let cut = usize::from(control).max(1);
    let mut translator = Translator::default();
    let mut out = BytesMut::new();
    for chunk in rest.chunks(cut) {
        translator.feed(chunk);
        if translator.drain(&mut out).is_err() {
            return;
        }
    }
    let _ = translator.unfinished();
});
