//! Small models with deterministic random weights, built in memory (tests, examples).

use super::{Kind, ModelWeights, Role, def};
use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use crate::quant::{DType, quantize};
use crate::weights::{Bytes, Tensor};

/// The splitmix64 output function (shared by every counter-based generator here and in bench).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64: the value for `(seed, stream, index)`, uniform over u64.
pub fn splitmix(seed: u64, stream: u64, index: u64) -> u64 {
    mix64(
        seed.wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(index.wrapping_mul(0xD1B5_4A32_D192_ED03)),
    )
}

/// Uniform in [-1, 1) for `(seed, stream, index)`.
pub fn unit(seed: u64, stream: u64, index: u64) -> f32 {
    (splitmix(seed, stream, index) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// A tiny config of the given architecture (2 layers, hidden 64, 4/2 heads, head dim 16; MoE:
/// 8 experts of 32, 3 per token).
pub fn tiny_config(arch: Arch, vocab: usize) -> ModelConfig {
    ModelConfig {
        arch,
        n_layers: 2,
        hidden: 64,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        ffn: 128,
        vocab,
        rope_theta: 10000.0,
        rope_scaling: None,
        rms_eps: 1e-5,
        max_ctx: 256,
        tie_embeddings: arch == Arch::Llama,
        gemma3: (arch == Arch::Gemma3).then_some(crate::config::Gemma3Params {
            // Small enough that the tests' prompts slide past it.
            sliding_window: 4,
            sliding_window_pattern: 2,
            rope_local_theta: 10000.0,
            query_pre_attn_scalar: 16.0,
            final_logit_softcap: None,
            rope_linear_factor: None,
        }),
        moe: arch.is_moe().then_some(crate::config::MoeParams {
            n_experts: 8,
            n_used: 3,
            expert_ffn: 32,
            norm_topk: true,
        }),
        mtp_layers: 0,
        hybrid: arch.is_recurrent().then_some(crate::config::HybridParams {
            conv_kernel: 4,
            n_k_heads: 2,
            n_v_heads: 4,
            head_k: 16,
            head_v: 16,
            // DeltaNet and attention layers alternate.
            full_attn_interval: 2,
            rope_dim: 8,
            // The experts' width, as the real Qwen3-Next's (512 and 512): the CUDA backend
            // folds such a shared expert into the MoE (Ops::fold_shared_expert).
            shared_ffn: 32,
        }),
        // 8 rotated pairs: qwen2vl's sections [2, 3, 3] contiguous, qwen3vl's [4, 2, 2]
        // interleaved (THW THW TT) and one deepstack layer.
        vl: arch.is_vl().then_some(crate::config::VlParams {
            sections: crate::ops::rope::Sections {
                sizes: if arch == Arch::Qwen3Vl {
                    [4, 2, 2]
                } else {
                    [2, 3, 3]
                },
                interleaved: arch == Arch::Qwen3Vl,
            },
            deepstack: usize::from(arch == Arch::Qwen3Vl),
        }),
    }
}

/// Random weights for `config`: matrices in `dtype` (F32 where a row is not a multiple of the
/// block), norms near 1 and small biases in F32; each tensor of the architecture's list draws
/// from its own stream, in list order (a tied output draws nothing).
pub fn random_weights(config: &ModelConfig, seed: u64, dtype: DType) -> Result<ModelWeights> {
    let specs = (def(config.arch).tensors)(config);
    let mut stream = 0u64;
    let mut get = |role: Role| -> Result<Option<Tensor>> {
        let Some(spec) = specs.iter().find(|s| s.role == role) else {
            return Ok(None);
        };
        if spec.optional {
            return Ok(None);
        }
        stream += 1;
        let shape = spec.shape.clone();
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n as u64)
            .map(|i| {
                let u = unit(seed, stream, i);
                match spec.kind {
                    Kind::Norm => 1.0 + 0.1 * u,
                    Kind::Bias => 0.05 * u,
                    Kind::Decay => -1.0 - 0.5 * u,
                    Kind::Matrix => 0.15 * u,
                }
            })
            .collect();
        let cols = *shape.last().unwrap_or(&1);
        let dt = if spec.kind != Kind::Matrix || !cols.is_multiple_of(dtype.block_size()) {
            DType::F32
        } else {
            dtype
        };
        let bytes = quantize(dt, &vals)?;
        Tensor::new(role.gguf_name(), dt, shape, Bytes::owned(bytes)).map(Some)
    };
    ModelWeights::build(config, &mut get)
}

/// What the MTP oracle ([`oracle_mtp_weights`], `memra-bench synth --mtp-oracle`) puts in a
/// tensor: the one definition of its wiring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OracleFill {
    /// The tensor's random values, as without the oracle.
    Random,
    /// All zeros: every block's output projection, so each layer adds zero to the residual.
    Zero,
    /// 1 at row i, column i of `[hidden, 2 * hidden]`, else 0: `eh_proj` passes the embedding
    /// half through and drops the hidden half.
    Identity,
    /// All ones.
    Ones,
    /// The values of another tensor (the MTP shared norm: the model's output norm).
    CopyOf(Role),
}

/// The oracle's config for `config`: tied embeddings and at least one MTP layer. Refused for an
/// architecture without MTP support (llama, qwen2, qwen3 and qwen3next have it).
pub fn oracle_config(config: &ModelConfig) -> Result<ModelConfig> {
    let cfg = ModelConfig {
        tie_embeddings: true,
        mtp_layers: config.mtp_layers.max(1),
        ..config.clone()
    };
    super::mtp::validate(&cfg)?;
    Ok(cfg)
}

/// The oracle's fill of `role` in a model of config `cfg` (an [`oracle_config`]).
pub fn oracle_fill(cfg: &ModelConfig, role: Role) -> OracleFill {
    match role {
        // Attention, DeltaNet, FFN, experts, shared expert.
        Role::AttnOut(_)
        | Role::Down(_)
        | Role::SsmOut(_)
        | Role::DownExps(_)
        | Role::ShexpDown(_) => OracleFill::Zero,
        Role::MtpEhProj(_) => OracleFill::Identity,
        Role::MtpEnorm(_) => OracleFill::Ones,
        Role::MtpSharedNorm(x) if x == cfg.n_layers => OracleFill::CopyOf(Role::OutputNorm),
        _ => OracleFill::Random,
    }
}

/// Element `i` (row-major) of a constant fill of a tensor with rows of `cols` (`None` for
/// [`OracleFill::Random`] and [`OracleFill::CopyOf`], whose values are drawn).
pub fn oracle_value(fill: OracleFill, cols: usize, i: usize) -> Option<f32> {
    match fill {
        OracleFill::Zero => Some(0.0),
        OracleFill::Ones => Some(1.0),
        OracleFill::Identity => Some(if i % cols == i / cols { 1.0 } else { 0.0 }),
        OracleFill::Random | OracleFill::CopyOf(_) => None,
    }
}

/// `config` (llama-family or qwen3next; made [`oracle_config`]) with weights whose prediction
/// depends on the current token only: every attention and FFN output projection is zero, so
/// the final hidden state is the token's embedding. Its first MTP layer is wired to the same
/// function of the next token (`eh_proj = [I, 0]`, its block's outputs zero, the model's output
/// norm as its shared norm): its drafts are the model's own greedy picks (up to near-ties), so
/// speculation with it accepts nearly every draft. The wiring is [`oracle_fill`]'s; the other
/// weights are [`random_weights`]' in F32.
pub fn oracle_mtp_weights(config: &ModelConfig, seed: u64) -> Result<ModelWeights> {
    let cfg = oracle_config(config)?;
    let base = random_weights(&cfg, seed, DType::F32)?;
    let mut src = |role: Role| -> Result<Option<Tensor>> {
        let fill = oracle_fill(&cfg, role);
        if let OracleFill::CopyOf(of) = fill {
            return Ok(Some(base.get(of)?.clone()));
        }
        let Some(t) = base.opt(role) else {
            return Ok(None);
        };
        let cols = *t.shape.last().unwrap_or(&1);
        let n: usize = t.shape.iter().product();
        let v: Option<Vec<f32>> = (0..n).map(|i| oracle_value(fill, cols, i)).collect();
        match v {
            Some(v) => Tensor::from_f32(role.gguf_name(), t.shape.clone(), &v).map(Some),
            None => Ok(Some(t.clone())),
        }
    };
    ModelWeights::build(&cfg, &mut src)
}
