//! qwen3: the llama layer with a per-head RMSNorm of q and k before RoPE; GGUF keeps HF row order.

use super::{Arch, ArchDef, Forward, ModelWeights, Stage, TensorSpec, blocks, llama};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::Ops;

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3,
    gguf_name: "qwen3",
    hf_class: "Qwen3ForCausalLM",
    gguf_qk_permuted: false,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &llama::NAMES,
    tensors,
    hf_config: |_, _| {},
    hf_tensor: None,
};

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    llama::decoder_tensors(c, |l| blocks::qk_norm_tensors(c, l).to_vec())
}

/// The llama forward pass; its attention norms q and k per head with this list's weights.
/// It takes image rows (a Qwen ViT's, `+mmproj=`).
pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    llama::build_llama(w, s, ops, true)
}
