//! qwen3vl: the text model of Qwen3-VL: qwen3 (per-head q/k RMSNorm) with M-RoPE, the rotary
//! frequencies interleaved over the temporal, height and width positions (crate::vision::mrope),
//! and deepstack: an image row carries the tower's deepstack mergers' rows after its input
//! embedding, the k-th added into the residual after layer k-1 (HF `_deepstack_process`,
//! llama.cpp's `deepstack_out`). GGUF: llama.cpp's `qwen3vl` with
//! `qwen3vl.rope.dimension_sections` and `qwen3vl.n_deepstack_layers`.

use super::{Arch, ArchDef, Forward, ModelWeights, Stage, TensorSpec, blocks, llama, qwen2vl};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::Ops;

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3Vl,
    gguf_name: "qwen3vl",
    hf_class: "Qwen3VLForConditionalGeneration",
    gguf_qk_permuted: false,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &llama::NAMES,
    tensors,
    hf_config: qwen2vl::hf_config,
    hf_tensor: None,
};

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    llama::decoder_tensors(c, |l| blocks::qk_norm_tensors(c, l).to_vec())
}

/// The llama forward pass with this list's q/k norms, the config's M-RoPE table and the
/// deepstack adds.
pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    llama::build_llama(w, s, ops, true)
}
