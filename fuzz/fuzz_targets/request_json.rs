//! cargo-fuzz target: `memra_server::fuzz::request_json` (its seed corpus: fuzz/corpus/request_json).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = memra_server::fuzz::request_json(data);
});
