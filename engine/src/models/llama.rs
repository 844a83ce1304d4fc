//! llama (SmolLM2, Llama 3 incl. `llama3` rope scaling): the plain pre-norm decoder layer.

use super::ArchSpec;
use crate::config::Arch;

pub const SPEC: ArchSpec = ArchSpec {
    arch: Arch::Llama,
    qkv_bias: false,
    qk_norm: false,
    gguf_qk_permuted: true,
};
