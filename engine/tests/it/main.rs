//! The integration tests of memra-engine, one module per area, linked into one test binary.

mod chat;
mod common;
mod cpu_invariance;
mod engine_grammar;
mod engine_proptest;
mod engine_scheduler;
mod engine_serve;
mod engine_spec;
mod fuzz_replay;
mod gemma3;
mod gguf_corrupt;
mod gguf_roundtrip;
mod kv_exhaustion;
mod llama_postnorm;
mod load_corrupt_gguf;
mod load_corrupt_hf;
mod quant;
mod quant_dot_fast;
mod qwen3_moe;
mod qwen3_moe_reference;
mod reference_fixture;
mod run_gen;
mod safetensors;
mod spec_generate;
mod tiny_files;
mod tokenizer;
