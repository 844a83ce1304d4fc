//! cargo-fuzz target: `memra_engine::testing::fuzz::safetensors` (its seed corpus: fuzz/corpus/safetensors_header).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = memra_engine::testing::fuzz::safetensors(data);
});
