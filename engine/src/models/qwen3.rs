//! qwen3: the llama layer with a per-head RMSNorm of q and k before RoPE; GGUF keeps HF row order.

use super::ArchSpec;
use crate::config::Arch;

pub const SPEC: ArchSpec = ArchSpec {
    arch: Arch::Qwen3,
    qkv_bias: false,
    qk_norm: true,
    gguf_qk_permuted: false,
};
