//! cargo-fuzz target: `memra_engine::testing::fuzz::gguf` (its seed corpus: fuzz/corpus/gguf_reader).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = memra_engine::testing::fuzz::gguf(data);
});
