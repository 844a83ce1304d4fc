//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::ops::Range;
use std::path::PathBuf;

use memra_engine::backend::{StepBatch, StepRow};
use memra_engine::engine::EngineHandle;
use memra_engine::request::ValidRequest;
pub use memra_engine::testing::media_request;

/// The real SmolLM2-135M-Instruct GGUF.
pub fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

/// A path relative to the repository root.
pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// The engine configuration of the CPU serving tests (`memra_engine::testing::engine_config`):
/// `kv_blocks` blocks of 4 tokens, steps of `budget` tokens, 8 running sequences.
pub fn cpu_engine_config(kv_blocks: usize, budget: usize) -> memra_engine::engine::EngineConfig {
    memra_engine::testing::engine_config(memra_engine::backend::Device::Cpu, kv_blocks, budget, 8)
}

/// Positions `r` of `toks` as one step of sequence 0 over blocks `table` (recurrent-state
/// slots `slots`, empty for a model without state); every row wants logits.
pub fn seq_step(toks: &[u32], r: Range<usize>, table: &[u32], slots: Vec<u32>) -> StepBatch {
    StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: r
            .map(|p| StepRow {
                token: toks[p],
                pos: p as u32,
                seq: 0,
                want_logits: true,
            })
            .collect(),
        block_tables: vec![table.to_vec()],
        state_slots: slots,
    }
}

/// Each row's logits as bits.
pub fn logit_bits(logits: &[Vec<f32>]) -> Vec<Vec<u32>> {
    logits
        .iter()
        .map(|l| l.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// Tokens, logprob bits and cached tokens of one request.
pub fn run_request(e: &EngineHandle, r: ValidRequest) -> (Vec<(u32, u32)>, usize) {
    memra_engine::testing::run_request(e, r).unwrap()
}

/// A random Q8_0 model of `arch` at the tiny shape with SmolLM2's tokenizer (seed 17).
pub fn tiny_model(arch: memra_engine::config::Arch) -> memra_engine::loader::Model {
    use memra_engine::models::random::{random_weights, tiny_config};
    let g = memra_engine::formats::gguf::Gguf::open(&real_model()).unwrap();
    let tokenizer = memra_engine::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let config = tiny_config(arch, tokenizer.vocab_size());
    let weights = random_weights(&config, 17, memra_engine::quant::DType::Q8_0).unwrap();
    memra_engine::loader::Model {
        path: "tiny".into(),
        config,
        weights,
        tokenizer,
        chat: None,
    }
}

/// An engine serving [`tiny_model`] of `arch` as model "m" with `cfg`.
pub fn start_tiny(
    arch: memra_engine::config::Arch,
    cfg: memra_engine::engine::EngineConfig,
) -> EngineHandle {
    memra_engine::engine::Engine::start(
        vec![("m".into(), tiny_model(arch), cfg)],
        memra_engine::engine::AdmissionLimits::default(),
    )
    .unwrap()
}
