//! A config file's text (operators paste them; a reload reads one while
//! serving): parsed and validated into problems, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let lookup = |name: &str| (name == "KEY").then(|| "sk-test".to_owned());
    match tidegate::config::Config::parse(text, &lookup) {
        Ok(_) => {}
        Err(err) => {
            let _ = err.problems();
        }
    }
});
