//! GGUF files of in-memory models (tests): a config's shape metadata, the architecture's own
//! keys (gemma3, MoE, M-RoPE) and the weights under their GGUF names.

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::formats::gguf::MetaValue;
use crate::formats::gguf_write::{TensorData, write_gguf};
use crate::models::{ModelWeights, gemma3, qwen3_moe};

/// The metadata `ModelConfig::from_gguf` reads for `c` (no tokenizer).
pub fn gguf_meta(c: &ModelConfig) -> Vec<(String, MetaValue)> {
    let a = c.arch.gguf_name();
    let u = |v: usize| MetaValue::U32(v as u32);
    let k = |s: &str| format!("{a}.{s}");
    let mut m = vec![
        ("general.architecture".into(), MetaValue::Str(a.into())),
        (k("context_length"), u(c.max_ctx)),
        (k("embedding_length"), u(c.hidden)),
        // llama.cpp counts the MTP (`nextn`) layers in the block count.
        (k("block_count"), u(c.n_layers + c.mtp_layers)),
        (k("feed_forward_length"), u(c.ffn)),
        (k("attention.head_count"), u(c.n_heads)),
        (k("attention.head_count_kv"), u(c.n_kv_heads)),
        (k("attention.key_length"), u(c.head_dim)),
        (k("rope.freq_base"), MetaValue::F32(c.rope_theta)),
        (
            k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(c.rms_eps),
        ),
    ];
    if let Some(p) = &c.gemma3 {
        m.extend(gemma3::gguf_keys(p));
    }
    if c.mtp_layers > 0 {
        m.push((k("nextn_predict_layers"), u(c.mtp_layers)));
    }
    if let Some(p) = &c.moe {
        m.extend(qwen3_moe::gguf_keys(c.arch, p));
    }
    if let Some(p) = &c.hybrid {
        m.extend(crate::models::qwen3next::gguf_keys(p));
    }
    if let Some(p) = &c.vl {
        m.extend(crate::models::qwen2vl::gguf_keys(c.arch, p));
    }
    m
}

/// Writes `w` with `meta` to `path`, tensors in HF row order (architectures whose GGUF files
/// permute q/k rows are not handled).
pub fn write_model(w: &ModelWeights, meta: &[(String, MetaValue)], path: &Path) -> Result<()> {
    let owned: Vec<(String, &crate::weights::Tensor, Vec<u64>)> = w
        .iter()
        .map(|(r, t)| {
            (
                r.gguf_name(),
                t,
                t.shape.iter().rev().map(|&d| d as u64).collect(),
            )
        })
        .collect();
    let data: Vec<TensorData<'_>> = owned
        .iter()
        .map(|(n, t, dims)| (n.as_str(), t.dtype, dims.as_slice(), &t.data[..]))
        .collect();
    write_gguf(path, meta, &data)
}
