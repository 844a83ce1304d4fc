//! memra-bench: synthetic models (`synth`), GGUF -> HF conversion (`convert`) and benchmarks.

pub mod concurrency;
pub mod convert;
pub mod flags;
pub mod generate;
pub mod http;
pub mod kblocks;
pub mod kernel_cache;
pub mod kernels;
pub mod load;
pub mod peer;
pub mod peer_build;
pub mod peer_import;
pub mod plan;
pub mod record;
pub mod report;
pub mod rng;
pub mod rope;
pub mod serve_ttft;
pub mod shapes;
pub mod sink;
pub mod soak;
pub mod spec;
pub mod speed;
pub mod synth;
pub mod to_gguf;
pub mod tok;
