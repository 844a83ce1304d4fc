//! Architectures: tensor names (GGUF and HF) and the per-layer recipe flags.
//!
//! Internal layout is the Hugging Face one: q/k rows in HF order, RoPE by half rotation (NeoX).
//! GGUF llama files store q/k rows permuted for adjacent-pair RoPE; the loader un-permutes them
//! with [`unpermute_qk_rows`], so GGUF and HF copies of a model give identical weights.

pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod random;
pub mod weights;

pub use weights::{LayerWeights, ModelWeights, TensorSource};

use crate::config::Arch;

/// The role of a tensor in a decoder-only transformer, by layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    TokenEmbd,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    QNorm(usize),
    KNorm(usize),
    AttnOut(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

/// Per-layer roles, (GGUF suffix, HF suffix), shared by every architecture here.
const LAYER_NAMES: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

fn layer_role(i: usize, l: usize) -> Role {
    match i {
        0 => Role::AttnNorm(l),
        1 => Role::Q(l),
        2 => Role::K(l),
        3 => Role::V(l),
        4 => Role::QBias(l),
        5 => Role::KBias(l),
        6 => Role::VBias(l),
        7 => Role::QNorm(l),
        8 => Role::KNorm(l),
        9 => Role::AttnOut(l),
        10 => Role::FfnNorm(l),
        11 => Role::Gate(l),
        12 => Role::Up(l),
        _ => Role::Down(l),
    }
}

fn role_index(r: Role) -> Option<(usize, usize)> {
    Some(match r {
        Role::AttnNorm(l) => (0, l),
        Role::Q(l) => (1, l),
        Role::K(l) => (2, l),
        Role::V(l) => (3, l),
        Role::QBias(l) => (4, l),
        Role::KBias(l) => (5, l),
        Role::VBias(l) => (6, l),
        Role::QNorm(l) => (7, l),
        Role::KNorm(l) => (8, l),
        Role::AttnOut(l) => (9, l),
        Role::FfnNorm(l) => (10, l),
        Role::Gate(l) => (11, l),
        Role::Up(l) => (12, l),
        Role::Down(l) => (13, l),
        _ => return None,
    })
}

impl Role {
    /// The GGUF tensor name of this role.
    pub fn gguf_name(self) -> String {
        match self {
            Role::TokenEmbd => "token_embd.weight".into(),
            Role::OutputNorm => "output_norm.weight".into(),
            Role::Output => "output.weight".into(),
            r => {
                let (i, l) = role_index(r).unwrap_or((0, 0));
                format!("blk.{l}.{}", LAYER_NAMES[i].0)
            }
        }
    }

    /// The Hugging Face tensor name of this role.
    pub fn hf_name(self) -> String {
        match self {
            Role::TokenEmbd => "model.embed_tokens.weight".into(),
            Role::OutputNorm => "model.norm.weight".into(),
            Role::Output => "lm_head.weight".into(),
            r => {
                let (i, l) = role_index(r).unwrap_or((0, 0));
                format!("model.layers.{l}.{}", LAYER_NAMES[i].1)
            }
        }
    }

    /// The role of a GGUF tensor name.
    pub fn from_gguf_name(name: &str) -> Option<Role> {
        match name {
            "token_embd.weight" => return Some(Role::TokenEmbd),
            "output_norm.weight" => return Some(Role::OutputNorm),
            "output.weight" => return Some(Role::Output),
            _ => {}
        }
        let rest = name.strip_prefix("blk.")?;
        let (l, suffix) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        let i = LAYER_NAMES.iter().position(|(g, _)| *g == suffix)?;
        Some(layer_role(i, l))
    }

    /// The role of a Hugging Face tensor name.
    pub fn from_hf_name(name: &str) -> Option<Role> {
        match name {
            "model.embed_tokens.weight" => return Some(Role::TokenEmbd),
            "model.norm.weight" => return Some(Role::OutputNorm),
            "lm_head.weight" => return Some(Role::Output),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (l, suffix) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        let i = LAYER_NAMES.iter().position(|(_, h)| *h == suffix)?;
        Some(layer_role(i, l))
    }

    /// The layer this role belongs to, if any.
    pub fn layer(self) -> Option<usize> {
        role_index(self).map(|(_, l)| l)
    }
}

/// What differs between the supported architectures' decoder layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchSpec {
    pub arch: Arch,
    /// q/k/v projections have biases.
    pub qkv_bias: bool,
    /// RMSNorm over each head of q and k before RoPE.
    pub qk_norm: bool,
    /// GGUF files of this architecture store q/k rows permuted for adjacent-pair RoPE.
    pub gguf_qk_permuted: bool,
}

/// The spec of an architecture (one registry line per architecture).
pub fn spec(arch: Arch) -> ArchSpec {
    match arch {
        Arch::Llama => llama::SPEC,
        Arch::Qwen2 => qwen2::SPEC,
        Arch::Qwen3 => qwen3::SPEC,
    }
}

/// Maps HF row `r` of a q or k projection (heads of `head_dim` rows) to its GGUF row.
/// Within a head, HF row `j * half + i` is GGUF row `2 * i + j` (j in 0..2, i in 0..half).
pub fn gguf_row_of_hf_row(r: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (h, within) = (r / head_dim, r % head_dim);
    let (j, i) = (within / half, within % half);
    h * head_dim + 2 * i + j
}

/// Reorders the rows of a GGUF llama q/k weight (or bias) into HF order. `row_bytes` is the
/// stored size of one row; `data.len()` must be a multiple of `head_dim * row_bytes`.
pub fn unpermute_qk_rows(data: &[u8], row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let rows = data.len() / row_bytes.max(1);
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let g = gguf_row_of_hf_row(r, head_dim);
        out.extend_from_slice(&data[g * row_bytes..(g + 1) * row_bytes]);
    }
    out
}

/// Reorders HF q/k rows into the GGUF llama order (inverse of [`unpermute_qk_rows`]).
pub fn permute_qk_rows(data: &[u8], row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let rows = data.len() / row_bytes.max(1);
    let mut out = vec![0u8; rows * row_bytes];
    for r in 0..rows {
        let g = gguf_row_of_hf_row(r, head_dim);
        out[g * row_bytes..(g + 1) * row_bytes]
            .copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in [0usize, 7, 29] {
            for i in 0..LAYER_NAMES.len() {
                let r = layer_role(i, l);
                assert_eq!(Role::from_gguf_name(&r.gguf_name()), Some(r));
                assert_eq!(Role::from_hf_name(&r.hf_name()), Some(r));
            }
        }
        assert_eq!(Role::from_hf_name("lm_head.weight"), Some(Role::Output));
        assert_eq!(Role::from_gguf_name("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn permutation_inverts() {
        let head_dim = 8;
        let data: Vec<u8> = (0..(2 * head_dim * 3) as u8).collect();
        let p = permute_qk_rows(&data, 3, head_dim);
        assert_ne!(p, data);
        assert_eq!(unpermute_qk_rows(&p, 3, head_dim), data);
        // HF rows 0 and 4 (first element of each half) are adjacent in GGUF order.
        assert_eq!(gguf_row_of_hf_row(0, 8), 0);
        assert_eq!(gguf_row_of_hf_row(4, 8), 1);
        assert_eq!(gguf_row_of_hf_row(1, 8), 2);
    }
}
