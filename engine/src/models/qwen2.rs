//! qwen2: the llama layer with biases on the q/k/v projections; GGUF keeps HF row order.

use super::{Arch, ArchDef, Forward, ModelWeights, Stage, TensorSpec, blocks, llama};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::Ops;

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen2,
    gguf_name: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    gguf_qk_permuted: false,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &llama::NAMES,
    tensors,
    hf_config: |_, v| v["attention_bias"] = true.into(),
    hf_tensor: None,
};

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    llama::decoder_tensors(c, |l| blocks::qkv_bias_tensors(c, l).to_vec())
}

/// The llama forward pass; its attention adds the biases this tensor list declares.
/// It takes image rows (a Qwen ViT's, `+mmproj=`).
pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    llama::build_llama(w, s, ops, true)
}
