//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::ops::Range;
use std::path::PathBuf;

use memra_engine::backend::{StepBatch, StepRow};

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

/// The engine configuration of the CPU serving tests: 2 threads, blocks of 4 tokens,
/// `kv_blocks` of them, steps of `budget` tokens, 8 running sequences, the prefix cache on, no
/// speculation.
pub fn cpu_engine_config(kv_blocks: usize, budget: usize) -> memra_engine::engine::EngineConfig {
    use memra_engine::engine::{EngineConfig, KvBudget};
    use memra_engine::scheduler::SchedulerConfig;
    EngineConfig {
        device: memra_engine::backend::Device::Cpu,
        threads: 2,
        block_size: 4,
        kv: KvBudget::Blocks(kv_blocks),
        kv_dtype: Default::default(),
        scheduler: SchedulerConfig {
            max_batch_tokens: budget,
            max_running: 8,
            max_running_per_tenant: 8,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        },
        prefix_cache: true,
        spec: None,
        pp: Default::default(),
    }
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
