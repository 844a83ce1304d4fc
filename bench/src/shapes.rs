//! The model shapes `memra-bench synth` can generate.

use memra_engine::config::{
    Arch, Gemma3Params, HybridParams, Llama3RopeScaling, ModelConfig, MoeParams,
};
use memra_engine::error::{Error, Result};
use memra_engine::models::random::tiny_config;

/// A named model shape. The vocabulary comes from the tokenizer the model is paired with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// SmolLM2-135M: llama, 30 layers, hidden 576, 9/3 heads, tied embeddings.
    Smollm2_135m,
    /// Llama-3-8B body (llama3 RoPE scaling, untied) with the SmolLM2 vocabulary.
    Llama3_8b,
    /// Qwen3-8B body (q/k norm, untied) with the SmolLM2 vocabulary.
    Qwen3_8b,
    /// 2 layers, hidden 64, 4/2 heads of 16, ffn 128: for tests.
    TinyLlama,
    TinyQwen2,
    TinyQwen3,
    /// tiny-llama with a post-attention norm (llama-postnorm, untied).
    TinyPostNorm,
    /// Gemma 3 270M body (18 layers, hidden 640, 4/1 heads of 256, window 512) with the
    /// paired tokenizer's vocabulary.
    Gemma3_270m,
    /// 2 layers (local, then global), window 4: for tests.
    TinyGemma3,
    /// Qwen3-30B-A3B body (qwen3moe: 48 layers, hidden 2048, 32/4 heads of 128, 128 experts of
    /// 768, 8 per token, renormalised; untied) with the paired tokenizer's vocabulary.
    Qwen3_30bA3b,
    /// tiny-qwen3 with 8 experts of 32, 3 per token: for tests.
    TinyQwen3Moe,
    /// Qwen3-Next-80B-A3B body (qwen3next: 48 layers, hidden 2048, gated DeltaNet with 16/32
    /// heads of 128 and gated attention every 4th layer with 16/2 heads of 256, RoPE over 64;
    /// 512 experts of 512, 10 per token, a shared expert of 512; untied) with the paired
    /// tokenizer's vocabulary.
    Qwen3Next80bA3b,
    /// qwen3next in 4 layers (DeltaNet and attention alternating), hidden 64: for tests.
    TinyQwen3Next,
    /// tiny-qwen2 as a qwen2vl (Qwen2-VL / Qwen2.5-VL text model: M-RoPE sections [2, 3, 3]
    /// of its 8 rotated pairs): pairs with `synth-mmproj --shape tiny-qwen2vl|tiny-qwen25vl`.
    TinyQwen2Vl,
    /// tiny-qwen3 as a qwen3vl (Qwen3-VL text model: interleaved sections [4, 2, 2], one
    /// deepstack layer): pairs with `synth-mmproj --shape tiny-qwen3vl` (one deepstack merger).
    TinyQwen3Vl,
}

impl Shape {
    pub const ALL: [Shape; 15] = [
        Shape::Smollm2_135m,
        Shape::Llama3_8b,
        Shape::Qwen3_8b,
        Shape::TinyLlama,
        Shape::TinyQwen2,
        Shape::TinyQwen3,
        Shape::TinyPostNorm,
        Shape::Gemma3_270m,
        Shape::TinyGemma3,
        Shape::Qwen3_30bA3b,
        Shape::TinyQwen3Moe,
        Shape::Qwen3Next80bA3b,
        Shape::TinyQwen3Next,
        Shape::TinyQwen2Vl,
        Shape::TinyQwen3Vl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Smollm2_135m => "smollm2-135m",
            Shape::Llama3_8b => "llama3-8b",
            Shape::Qwen3_8b => "qwen3-8b",
            Shape::TinyLlama => "tiny-llama",
            Shape::TinyQwen2 => "tiny-qwen2",
            Shape::TinyQwen3 => "tiny-qwen3",
            Shape::TinyPostNorm => "tiny-postnorm",
            Shape::Gemma3_270m => "gemma3-270m",
            Shape::TinyGemma3 => "tiny-gemma3",
            Shape::Qwen3_30bA3b => "qwen3-30b-a3b",
            Shape::TinyQwen3Moe => "tiny-qwen3moe",
            Shape::Qwen3Next80bA3b => "qwen3-next-80b-a3b",
            Shape::TinyQwen3Next => "tiny-qwen3next",
            Shape::TinyQwen2Vl => "tiny-qwen2vl",
            Shape::TinyQwen3Vl => "tiny-qwen3vl",
        }
    }

    /// The config of this shape with vocabulary `vocab`.
    pub fn config(self, vocab: usize) -> ModelConfig {
        let base = ModelConfig {
            max_ctx: 8192,
            ..tiny_config(Arch::Llama, vocab)
        };
        match self {
            Shape::Smollm2_135m => ModelConfig {
                n_layers: 30,
                hidden: 576,
                n_heads: 9,
                n_kv_heads: 3,
                head_dim: 64,
                ffn: 1536,
                rope_theta: 100000.0,
                ..base
            },
            Shape::Llama3_8b => ModelConfig {
                n_layers: 32,
                hidden: 4096,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 128,
                ffn: 14336,
                rope_theta: 500000.0,
                rope_scaling: Some(Llama3RopeScaling {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
                tie_embeddings: false,
                ..base
            },
            Shape::Qwen3_8b => ModelConfig {
                arch: Arch::Qwen3,
                n_layers: 36,
                hidden: 4096,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 128,
                ffn: 12288,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                tie_embeddings: false,
                ..base
            },
            Shape::TinyLlama => base,
            Shape::TinyQwen2 => ModelConfig {
                arch: Arch::Qwen2,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                tie_embeddings: false,
                ..base
            },
            Shape::TinyQwen3 => ModelConfig {
                arch: Arch::Qwen3,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                ..base
            },
            Shape::TinyQwen2Vl => ModelConfig {
                max_ctx: base.max_ctx,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                tie_embeddings: false,
                ..tiny_config(Arch::Qwen2Vl, vocab)
            },
            Shape::TinyQwen3Vl => ModelConfig {
                max_ctx: base.max_ctx,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                ..tiny_config(Arch::Qwen3Vl, vocab)
            },
            Shape::TinyPostNorm => ModelConfig {
                arch: Arch::LlamaPostNorm,
                tie_embeddings: false,
                ..base
            },
            Shape::TinyQwen3Moe => ModelConfig {
                max_ctx: base.max_ctx,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                ..tiny_config(Arch::Qwen3Moe, vocab)
            },
            Shape::Qwen3_30bA3b => ModelConfig {
                n_layers: 48,
                hidden: 2048,
                n_heads: 32,
                n_kv_heads: 4,
                head_dim: 128,
                ffn: 6144,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                max_ctx: 40960,
                moe: Some(MoeParams {
                    n_experts: 128,
                    n_used: 8,
                    expert_ffn: 768,
                    norm_topk: true,
                }),
                ..tiny_config(Arch::Qwen3Moe, vocab)
            },
            Shape::TinyQwen3Next => ModelConfig {
                n_layers: 4,
                max_ctx: base.max_ctx,
                rope_theta: 10_000_000.0,
                rms_eps: 1e-6,
                ..tiny_config(Arch::Qwen3Next, vocab)
            },
            Shape::Qwen3Next80bA3b => ModelConfig {
                n_layers: 48,
                hidden: 2048,
                n_heads: 16,
                n_kv_heads: 2,
                head_dim: 256,
                ffn: 5120,
                rope_theta: 10_000_000.0,
                rms_eps: 1e-6,
                max_ctx: 262_144,
                moe: Some(MoeParams {
                    n_experts: 512,
                    n_used: 10,
                    expert_ffn: 512,
                    norm_topk: true,
                }),
                hybrid: Some(HybridParams {
                    conv_kernel: 4,
                    n_k_heads: 16,
                    n_v_heads: 32,
                    head_k: 128,
                    head_v: 128,
                    full_attn_interval: 4,
                    rope_dim: 64,
                    shared_ffn: 512,
                }),
                ..tiny_config(Arch::Qwen3Next, vocab)
            },
            Shape::TinyGemma3 => ModelConfig {
                max_ctx: base.max_ctx,
                ..tiny_config(Arch::Gemma3, vocab)
            },
            Shape::Gemma3_270m => ModelConfig {
                n_layers: 18,
                hidden: 640,
                n_heads: 4,
                n_kv_heads: 1,
                head_dim: 256,
                ffn: 2048,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
                max_ctx: 32768,
                gemma3: Some(Gemma3Params {
                    sliding_window: 512,
                    sliding_window_pattern: 6,
                    rope_local_theta: 10000.0,
                    query_pre_attn_scalar: 256.0,
                    final_logit_softcap: None,
                    rope_linear_factor: None,
                }),
                ..tiny_config(Arch::Gemma3, vocab)
            },
        }
    }
}

impl std::str::FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Shape> {
        Shape::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Shape::ALL.iter().map(|x| x.name()).collect();
                Error::Input(format!("unknown shape `{s}` (known: {})", names.join(", ")))
            })
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
