//! cargo-fuzz target: `memra_engine::testing::fuzz::chat_template` (its seed corpus: fuzz/corpus/chat_template).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = memra_engine::testing::fuzz::chat_template(data);
});
