//! qwen2: the llama layer with biases on the q/k/v projections; GGUF keeps HF row order.

use super::ArchSpec;
use crate::config::Arch;

pub const SPEC: ArchSpec = ArchSpec {
    arch: Arch::Qwen2,
    qkv_bias: true,
    qk_norm: false,
    gguf_qk_permuted: false,
};
