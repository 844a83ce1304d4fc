//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::ops::Range;
use std::path::PathBuf;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, Device, OpenOptions, StepBatch, StepRow, open_backend_opts};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::engine::EngineHandle;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::ModelWeights;
use memra_engine::models::random::tiny_config;
use memra_engine::pipeline::{self, PpConfig};
use memra_engine::request::ValidRequest;
use memra_engine::sampling::SamplingParams;
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

/// Values as bits.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Each row's logits as bits.
pub fn logit_bits(logits: &[Vec<f32>]) -> Vec<Vec<u32>> {
    logits.iter().map(|l| bits(l)).collect()
}

/// `n` token ids below `vocab` that depend on `seed`.
pub fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % vocab as u32)
        .collect()
}

/// A `w x h` RGB test pattern (an image or a video frame) that depends on `seed`.
pub fn image(w: usize, h: usize, seed: u32) -> Vec<u8> {
    (0..(w * h * 3) as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 7919)) >> 11) as u8)
        .collect()
}

/// `arch` at the tiny shape with 4 layers and a vocabulary of `vocab`: the pipeline and
/// recurrent-state tests' model.
pub fn four_layers(arch: Arch, vocab: usize) -> ModelConfig {
    ModelConfig {
        n_layers: 4,
        ..tiny_config(arch, vocab)
    }
}

/// The pipeline tests' backend options: `kv_blocks` blocks of 16 positions, 2 threads, no
/// graphs, 8 recurrent-state slots.
pub fn pp_opts(kv_blocks: usize) -> OpenOptions {
    OpenOptions {
        kv_blocks,
        block_size: 16,
        threads: 2,
        graphs: false,
        state_slots: 8,
        kv_dtype: Default::default(),
    }
}

/// A CPU backend over `w` with `opts`: the unsplit model when `micro` is 0, else the model
/// split at layers `starts` with up to `micro` micro-batches.
pub fn open_cpu(
    w: ModelWeights,
    starts: &[usize],
    micro: usize,
    opts: &OpenOptions,
) -> Box<dyn Backend> {
    if micro == 0 {
        return open_backend_opts(Device::Cpu, w, opts).expect("backend");
    }
    let pp = PpConfig {
        stages: starts.len() + 1,
        split: Some(starts.to_vec()),
        micro,
        ..Default::default()
    };
    pipeline::open(Device::Cpu, w, opts, &pp).expect("pipeline")
}

/// The tokens of `generate()` alone on a fresh CPU backend over `w` (2 threads, 32 blocks of
/// 4 positions): the serving tests' reference for a request of `max_tokens` with `params`.
pub fn generate_alone(
    w: ModelWeights,
    prompt: &[u32],
    max_tokens: usize,
    params: SamplingParams,
) -> Vec<u32> {
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 32,
        block_size: 4,
        ..Default::default()
    };
    let mut b = CpuBackend::new(w, &opts).unwrap();
    let mut r = GenRequest::greedy(prompt.to_vec(), max_tokens);
    r.params = params;
    generate(&mut b, &r, &mut |_| Ok(())).unwrap().tokens
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

/// An engine serving [`tiny_model`] of `arch` as model "m" with [`cpu_engine_config`]
/// (`kv_blocks`, `budget`).
pub fn start_cpu(arch: Arch, kv_blocks: usize, budget: usize) -> EngineHandle {
    start_tiny(arch, cpu_engine_config(kv_blocks, budget))
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
