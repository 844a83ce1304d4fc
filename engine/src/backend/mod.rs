//! The narrow Backend trait: run one step over a batch of token rows against a paged KV cache.
//!
//! Everything above it (scheduler, prefix cache, speculation, sampling policy) is backend-agnostic.
//! A backend must be row-invariant (../EXACTNESS.md): a row's logits and KV bytes depend only on
//! that row's token, position and its sequence's earlier KV, never on the other rows or on M.

pub mod cpu;
pub mod cuda;

use crate::config::ModelConfig;
use crate::error::Result;

/// One token row of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    pub token: u32,
    /// Position of the token in its sequence.
    pub pos: u32,
    /// Index into [`StepBatch::block_tables`].
    pub seq: usize,
    /// Whether the caller wants this row's logits.
    pub want_logits: bool,
}

/// The rows of one step and, per sequence, its KV block table. A row's K/V is written at
/// `block_tables[seq][pos / block_size]`, slot `pos % block_size`; attention reads positions
/// `0..=pos` of the same sequence. Rows of one sequence within a step must be in position order.
#[derive(Clone, Debug, Default)]
pub struct StepBatch {
    pub rows: Vec<StepRow>,
    pub block_tables: Vec<Vec<u32>>,
}

/// Logits of the rows that asked for them, in row order.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub logits: Vec<Vec<f32>>,
}

/// Receives named intermediates (`attn_norm`, `q`, `k`, `v`, `attn_out`, `ffn_out`, ...) per layer:
/// `(name, layer, rows, values)` with `values.len()` a multiple of `rows`.
pub type DumpFn = Box<dyn FnMut(&str, usize, usize, &[f32]) + Send>;

/// A compute backend holding one model's weights and its KV cache.
pub trait Backend: Send {
    /// Short name (`cpu`, `cuda:0`).
    fn name(&self) -> String;
    fn config(&self) -> &ModelConfig;
    /// Positions per KV block.
    fn kv_block_size(&self) -> usize;
    /// KV blocks the backend holds.
    fn kv_blocks(&self) -> usize;
    /// Runs one step: writes the rows' K/V and returns the logits asked for.
    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput>;
    /// Copies one KV block (all layers) to another.
    fn copy_kv_block(&mut self, src: u32, dst: u32) -> Result<()>;
    /// The raw bytes of one KV block (all layers, K then V), for invariance checks.
    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>>;
    /// Installs (or removes) a sink for named intermediates; backends may ignore it.
    fn set_dump(&mut self, _dump: Option<DumpFn>) {}
}

/// Which backend to run on, as given by `--device auto|cpu|cuda[:N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Auto,
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    crate::Error::Input(format!("device `{s}`: expected auto, cpu, cuda or cuda:N"))
                }),
        }
    }
}
