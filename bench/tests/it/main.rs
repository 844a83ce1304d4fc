//! The integration tests of memra-bench, one module per area, linked into one test binary.

mod flags;
mod logits_equivalence;
mod peer_build;
mod peer_import;
mod real_tokenizer;
mod report;
mod schema;
mod spec_bench;
mod synth_fp8;
mod synth_gguf;
mod synth_hf;
mod synth_oracle;
