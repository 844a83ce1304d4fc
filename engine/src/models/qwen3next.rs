//! qwen3next (Qwen3-Next-80B-A3B and kin): a hybrid of gated DeltaNet (linear attention with a
//! recurrent state) and gated full attention, every FFN a mixture of experts with one shared
//! expert. Norms are zero-centred in HF checkpoints (`x * (1 + w)`; GGUF files and memra hold
//! `1 + w`), except the DeltaNet output's gated norm.
//!
//! Layer `l` (pre-norm, residual adds as in llama.cpp's graph and transformers):
//! - full attention when `(l + 1) % full_attn_interval == 0`: q_proj gives, per head, the query
//!   then a gate of the same size; q/k per-head RMSNorm, RoPE (NeoX) over the first `rope_dim`
//!   values of each head, causal attention, `att *= sigmoid(gate)`, output projection.
//! - gated DeltaNet otherwise: `[q k v] = conv1d_silu(W_qkv h)` (a causal depthwise conv over
//!   the sequence), `z = W_z h`, `[b a] = W_ba h`; the gated delta rule per value head
//!   ([`Ops::gated_delta`]); each head's output RMSNorm'd with `ssm_norm`, times `silu(z)`;
//!   output projection.
//! - FFN: router softmax top-k (renormalised), experts added in ascending index, plus the
//!   shared expert `sigmoid(w_g . h) * down(silu(gate h) * up h)`.
//!
//! Tensors are stored as llama.cpp's current converter writes them (`attn_qkv` / `attn_gate`
//! in the conv's channel order, `ssm_ba` grouped per key head, `ssm_a = -exp(A_log)`); HF
//! folders hold `in_proj_qkvz` grouped per key head and `A_log`, which [`hf_tensor`] maps.

use super::blocks::Embedding;
use super::{Arch, ArchDef, Forward, ModelWeights, Role, Stage, TensorSpec, blocks};
use crate::config::{HybridParams, ModelConfig};
use crate::error::{Error, Result};
use crate::formats::gguf::MetaValue;
use crate::formats::safetensors::HfModel;
use crate::ops::rope::Rope;
use crate::ops::{self, Act, AttnParams, Feature, Glu, KvId, Ops, Residual, RopeId, Rows, StateId};
use crate::weights::Tensor;

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3Next,
    gguf_name: "qwen3next",
    hf_class: "Qwen3NextForCausalLM",
    gguf_qk_permuted: false,
    hf_norm_offset: 1.0,
    chat_template: None,
    layer_names: &NAMES,
    tensors,
    hf_config,
    hf_tensor: Some(hf_tensor),
};

/// (GGUF suffix, HF suffix) of the layer tensors; `*` is the expert index. The q/k/v and gate
/// projections of a DeltaNet layer are one HF tensor (`in_proj_qkvz`), split by [`hf_tensor`].
const NAMES: [(&str, &str); 24] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("attn_qkv.weight", "linear_attn.in_proj_qkvz.weight:qkv"),
    ("attn_gate.weight", "linear_attn.in_proj_qkvz.weight:z"),
    ("ssm_ba.weight", "linear_attn.in_proj_ba.weight"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate_exps.weight", "mlp.experts.*.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.experts.*.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.experts.*.down_proj.weight"),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
];

/// What qwen3next needs beyond the common ops.
const NEEDS: [Feature; 2] = [Feature::Moe, Feature::Recurrent];

/// The hybrid parameters of a config that [`ModelConfig::validate`] accepted.
fn hybrid(c: &ModelConfig) -> Result<HybridParams> {
    c.hybrid.ok_or_else(|| {
        Error::Config("qwen3next config without its linear-attention parameters".into())
    })
}

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (mut out, last) = blocks::embedding_tensors(c);
    // A config without its parameters fails validation; list no layer tensors for it.
    let (Some(p), Some(_)) = (c.hybrid, c.moe) else {
        out.extend(last);
        return out;
    };
    for l in 0..c.n_layers {
        out.extend(layer_tensors(c, l, p.is_attention(l)));
    }
    out.extend(last);
    // MTP layers (qwen3next_mtp.rs): the nextn tensors, then a full-attention layer.
    for l in c.n_layers..c.n_layers + c.mtp_layers {
        out.extend(super::mtp::tensors(c, l));
        out.extend(layer_tensors(c, l, true));
    }
    out
}

/// The tensors of layer `l`: its mixer (full attention or gated DeltaNet), its FFN.
pub(super) fn layer_tensors(c: &ModelConfig, l: usize, attention: bool) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let (Some(p), Some(m)) = (c.hybrid, c.moe) else {
        return out;
    };
    let (h, d) = (c.hidden, p.delta());
    let (e, f) = (m.n_experts, m.expert_ffn);
    {
        out.push(TensorSpec::norm(Role::AttnNorm(l), h));
        if attention {
            let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
            out.push(TensorSpec::matrix(Role::Q(l), 2 * qd, h));
            out.push(TensorSpec::matrix(Role::K(l), kvd, h));
            out.push(TensorSpec::matrix(Role::V(l), kvd, h));
            out.extend(blocks::qk_norm_tensors(c, l));
            out.push(blocks::attn_out_tensor(c, l));
        } else {
            out.push(TensorSpec::matrix(Role::LinQkv(l), d.conv_dim(), h));
            out.push(TensorSpec::matrix(Role::LinGate(l), d.value_dim(), h));
            out.push(TensorSpec::matrix(Role::SsmBa(l), 2 * d.n_v_heads, h));
            out.push(TensorSpec::matrix(
                Role::SsmConv(l),
                d.conv_dim(),
                d.conv_kernel,
            ));
            out.push(TensorSpec::bias(Role::SsmDt(l), d.n_v_heads));
            out.push(TensorSpec::decay(Role::SsmA(l), d.n_v_heads));
            out.push(TensorSpec::norm(Role::SsmNorm(l), d.head_v));
            out.push(TensorSpec::matrix(Role::SsmOut(l), h, d.value_dim()));
        }
        out.push(TensorSpec::norm(Role::AttnPostNorm(l), h));
        out.push(TensorSpec::matrix(Role::FfnGateInp(l), e, h));
        out.push(TensorSpec::experts(Role::GateExps(l), e, f, h));
        out.push(TensorSpec::experts(Role::UpExps(l), e, f, h));
        out.push(TensorSpec::experts(Role::DownExps(l), e, h, f));
        out.push(TensorSpec::bias(Role::ShexpGateInp(l), h));
        out.push(TensorSpec::matrix(Role::ShexpGate(l), p.shared_ffn, h));
        out.push(TensorSpec::matrix(Role::ShexpUp(l), p.shared_ffn, h));
        out.push(TensorSpec::matrix(Role::ShexpDown(l), h, p.shared_ffn));
    }
    out
}

/// The hybrid parameters of a config read from GGUF metadata (`get` looks up
/// `qwen3next.<key>`, llama.cpp's keys); `None` for other architectures.
pub fn gguf_params<'a>(
    c: &ModelConfig,
    get: &dyn Fn(&str) -> Option<&'a MetaValue>,
) -> Result<Option<HybridParams>> {
    if !c.arch.is_recurrent() {
        return Ok(None);
    }
    let uint = |k: &str| -> Result<usize> {
        get(k)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| {
                Error::Config(format!(
                    "GGUF metadata `qwen3next.{k}` is missing or not an integer"
                ))
            })
    };
    let n_v_heads = uint("ssm.time_step_rank")?;
    let inner = uint("ssm.inner_size")?;
    if n_v_heads == 0 || !inner.is_multiple_of(n_v_heads) {
        return Err(Error::Config(format!(
            "GGUF metadata `qwen3next.ssm.inner_size` {inner} is not a multiple of \
             `qwen3next.ssm.time_step_rank` {n_v_heads}"
        )));
    }
    Ok(Some(HybridParams {
        conv_kernel: uint("ssm.conv_kernel")?,
        n_k_heads: uint("ssm.group_count")?,
        n_v_heads,
        head_k: uint("ssm.state_size")?,
        head_v: inner / n_v_heads,
        full_attn_interval: uint("full_attention_interval").unwrap_or(4),
        rope_dim: uint("rope.dimension_count").unwrap_or(c.head_dim),
        shared_ffn: uint("expert_shared_feed_forward_length")?,
    }))
}

/// The GGUF metadata keys [`gguf_params`] reads, for writers (synthetic models, tests).
pub fn gguf_keys(p: &HybridParams) -> Vec<(String, MetaValue)> {
    let k = |s: &str| format!("qwen3next.{s}");
    let u = |v: usize| MetaValue::U32(v as u32);
    vec![
        (k("ssm.conv_kernel"), u(p.conv_kernel)),
        (k("ssm.inner_size"), u(p.n_v_heads * p.head_v)),
        (k("ssm.state_size"), u(p.head_k)),
        (k("ssm.time_step_rank"), u(p.n_v_heads)),
        (k("ssm.group_count"), u(p.n_k_heads)),
        (k("full_attention_interval"), u(p.full_attn_interval)),
        (k("rope.dimension_count"), u(p.rope_dim)),
        (k("expert_shared_feed_forward_length"), u(p.shared_ffn)),
    ]
}

/// The hybrid parameters of an HF `config.json`; `None` for other architectures. Refuses a
/// layer pattern other than one full-attention layer every N (`layer_types`).
pub fn hf_params(c: &ModelConfig, v: &serde_json::Value) -> Result<Option<HybridParams>> {
    if !c.arch.is_recurrent() {
        return Ok(None);
    }
    let uint = |k: &str| -> Result<usize> {
        v.get(k)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| Error::Config(format!("config.json `{k}` is missing or not an integer")))
    };
    let interval = uint("full_attention_interval").unwrap_or(4);
    if let Some(types) = v.get("layer_types").and_then(|t| t.as_array()) {
        let want = |l: usize| match (l + 1).is_multiple_of(interval.max(1)) {
            true => "full_attention",
            false => "linear_attention",
        };
        if let Some((l, t)) = types
            .iter()
            .enumerate()
            .find(|(l, t)| t.as_str() != Some(want(*l)))
        {
            return Err(Error::Unsupported(format!(
                "qwen3next layer_types[{l}] = {t} (supported: a full_attention layer every \
                 {interval} layers, linear_attention between)"
            )));
        }
    }
    let dense = v.get("mlp_only_layers").and_then(|x| x.as_array());
    if dense.is_some_and(|d| !d.is_empty()) {
        return Err(Error::Unsupported(
            "qwen3next mlp_only_layers (dense FFN layers; supported: none)".into(),
        ));
    }
    let rotary = v
        .get("partial_rotary_factor")
        .and_then(|x| x.as_f64())
        .unwrap_or(1.0);
    Ok(Some(HybridParams {
        conv_kernel: uint("linear_conv_kernel_dim")?,
        n_k_heads: uint("linear_num_key_heads")?,
        n_v_heads: uint("linear_num_value_heads")?,
        head_k: uint("linear_key_head_dim")?,
        head_v: uint("linear_value_head_dim")?,
        full_attn_interval: interval,
        rope_dim: (c.head_dim as f64 * rotary).round() as usize,
        shared_ffn: uint("shared_expert_intermediate_size")?,
    }))
}

/// Writes the qwen3next keys of an HF `config.json`.
fn hf_config(c: &ModelConfig, v: &mut serde_json::Value) {
    v["model_type"] = "qwen3_next".into();
    if let Some(p) = c.moe {
        v["num_experts"] = p.n_experts.into();
        v["num_experts_per_tok"] = p.n_used.into();
        v["moe_intermediate_size"] = p.expert_ffn.into();
        v["norm_topk_prob"] = p.norm_topk.into();
        v["decoder_sparse_step"] = 1.into();
        v["mlp_only_layers"] = serde_json::json!([]);
    }
    let Some(p) = c.hybrid else { return };
    v["linear_conv_kernel_dim"] = p.conv_kernel.into();
    v["linear_num_key_heads"] = p.n_k_heads.into();
    v["linear_num_value_heads"] = p.n_v_heads.into();
    v["linear_key_head_dim"] = p.head_k.into();
    v["linear_value_head_dim"] = p.head_v.into();
    v["full_attention_interval"] = p.full_attn_interval.into();
    v["partial_rotary_factor"] = (p.rope_dim as f64 / c.head_dim as f64).into();
    v["shared_expert_intermediate_size"] = p.shared_ffn.into();
}

/// Rows of `in_proj_qkvz` (grouped per key head: q, k, v of its value heads, z of them) that
/// form the conv's `[q k v]` (`qkv`) or the gate `z` (`!qkv`), in internal order.
fn qkvz_rows(p: &HybridParams, qkv: bool) -> Vec<usize> {
    let r = p.n_v_heads / p.n_k_heads;
    let (hk, vr) = (p.head_k, r * p.head_v);
    let group = 2 * hk + 2 * vr;
    let part = |start: usize, len: usize| -> Vec<usize> {
        (0..p.n_k_heads)
            .flat_map(|g| (0..len).map(move |i| g * group + start + i))
            .collect()
    };
    match qkv {
        true => [part(0, hk), part(hk, hk), part(2 * hk, vr)].concat(),
        false => part(2 * hk + vr, vr),
    }
}

/// The HF name of `role` (`:qkv` / `:z` mark the halves of `in_proj_qkvz`): the layer names
/// of the architecture, and for the MTP module (layers from `n_layers`) Qwen3-Next's `mtp.*`
/// names; `None` for an MTP tensor HF checkpoints do not have (its own embedding or head).
pub fn hf_name(c: &ModelConfig, role: Role) -> Option<String> {
    let name = role.hf_name(c.arch);
    let Some(l) = role.layer().filter(|&l| l >= c.n_layers) else {
        return Some(name);
    };
    Some(match role {
        Role::MtpEhProj(_) => "mtp.fc.weight".into(),
        Role::MtpEnorm(_) => "mtp.pre_fc_norm_embedding.weight".into(),
        Role::MtpHnorm(_) => "mtp.pre_fc_norm_hidden.weight".into(),
        Role::MtpSharedNorm(_) => "mtp.norm.weight".into(),
        Role::MtpHead(_) | Role::MtpEmbed(_) => return None,
        _ => name.replacen(
            &format!("model.layers.{l}."),
            &format!("mtp.layers.{}.", l - c.n_layers),
            1,
        ),
    })
}

/// `t + offset` in F32 (an HF norm weight into the internal one).
fn offset(t: Tensor, off: f32) -> Result<Tensor> {
    let v: Vec<f32> = t.to_f32()?.into_iter().map(|x| x + off).collect();
    Tensor::from_f32(t.name.clone(), t.shape.clone(), &v)
}

/// The internal tensor of `role` from an HF folder, where it is not the HF tensor of the
/// role's name as it stands (plus the norm offset): the DeltaNet projections split out of
/// `in_proj_qkvz`, `A_log` as `-exp(A_log)`, the conv's `[C, 1, K]` and the shared gate's
/// `[1, hidden]` as the GGUF shapes. `None`: the default mapping applies.
pub fn hf_tensor(m: &HfModel, c: &ModelConfig, role: Role) -> Result<Option<Option<Tensor>>> {
    let p = hybrid(c)?;
    let mtp = role.layer().is_some_and(|l| l >= c.n_layers);
    let Some(name) = hf_name(c, role) else {
        return Ok(Some(None));
    };
    let get = |n: &str| m.tensor(n);
    let out = match role {
        r if r.is_experts() && mtp => {
            let n = c.moe.map_or(0, |e| e.n_experts);
            return crate::loader::hf_expert_stack(m, &name, n).map(Some);
        }
        Role::LinQkv(_) | Role::LinGate(_) => {
            let (base, _) = name.rsplit_once(':').unwrap_or((&name, ""));
            let Some(t) = get(base)? else {
                return Ok(Some(None));
            };
            let rows = qkvz_rows(&p, matches!(role, Role::LinQkv(_)));
            t.take_rows(role.gguf_name(), &rows)?
        }
        Role::SsmA(_) => {
            let Some(t) = get(&name)? else {
                return Ok(Some(None));
            };
            let v: Vec<f32> = t.to_f32()?.into_iter().map(|a| -a.exp()).collect();
            Tensor::from_f32(role.gguf_name(), t.shape.clone(), &v)?
        }
        Role::SsmConv(_) => {
            let Some(t) = get(&name)? else {
                return Ok(Some(None));
            };
            match t.shape[..] {
                [ch, 1, k] => t.reshaped(vec![ch, k])?,
                _ => t,
            }
        }
        Role::ShexpGateInp(_) => {
            let Some(t) = get(&name)? else {
                return Ok(Some(None));
            };
            match t.shape[..] {
                [1, h] => t.reshaped(vec![h])?,
                _ => t,
            }
        }
        _ if mtp => {
            let Some(t) = get(&name)? else {
                return Ok(Some(None));
            };
            match super::hf_offset(c, role) {
                0.0 => t,
                off => offset(t, off)?,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(Some(out)))
}

/// The HF tensors of `w` (name, tensor), the inverse of the loader's mapping: for writing HF
/// folders of qwen3next models (tests, conversions). Expert stacks become one tensor per
/// expert; norm weights hold their internal values minus the HF offset; F32 where a transform
/// computes values.
pub fn hf_tensors(w: &ModelWeights) -> Result<Vec<(String, Tensor)>> {
    let c = &w.config;
    let p = hybrid(c)?;
    let mut out = Vec::new();
    for (role, t) in w.iter() {
        let Some(name) = hf_name(c, role) else {
            return Err(Error::Weights(format!(
                "{}: HF qwen3next checkpoints have no such MTP tensor",
                role.gguf_name()
            )));
        };
        let t = match role {
            Role::LinGate(_) => continue,
            Role::LinQkv(l) => {
                let (base, _) = name.rsplit_once(':').unwrap_or((&name, ""));
                let gate = w.get(Role::LinGate(l))?;
                if gate.dtype != t.dtype {
                    return Err(Error::Weights(format!(
                        "{}: qkv is {} but the gate is {}",
                        base, t.dtype, gate.dtype
                    )));
                }
                let (qkv, z) = (qkvz_rows(&p, true), qkvz_rows(&p, false));
                let n = qkv.len() + z.len();
                let mut data = vec![0u8; n * t.row_bytes()];
                let rb = t.row_bytes();
                for (src, rows) in [(t, &qkv), (gate, &z)] {
                    for (i, &r) in rows.iter().enumerate() {
                        data[r * rb..(r + 1) * rb].copy_from_slice(src.row(i));
                    }
                }
                let bytes = crate::weights::Bytes::owned(data);
                out.push((
                    base.to_string(),
                    Tensor::new(base, t.dtype, vec![n, t.shape[1]], bytes)?,
                ));
                continue;
            }
            Role::SsmA(_) => {
                let v: Vec<f32> = t.to_f32()?.into_iter().map(|a| (-a).ln()).collect();
                Tensor::from_f32(name.clone(), t.shape.clone(), &v)?
            }
            Role::SsmConv(_) => t.reshaped(vec![t.shape[0], 1, t.shape[1]])?,
            Role::ShexpGateInp(_) => t.reshaped(vec![1, t.shape[0]])?,
            r if r.is_experts() => {
                let (n, shape) = (t.shape[0], t.shape[1..].to_vec());
                let per = t.data.len() / n.max(1);
                for e in 0..n {
                    let one = crate::weights::Bytes::owned(t.data[e * per..(e + 1) * per].to_vec());
                    let name = super::roles::expert_name(&name, e);
                    out.push((
                        name.clone(),
                        Tensor::new(name, t.dtype, shape.clone(), one)?,
                    ));
                }
                continue;
            }
            _ => match super::hf_offset(c, role) {
                0.0 => t.clone(),
                off => {
                    let v: Vec<f32> = t.to_f32()?.into_iter().map(|x| x - off).collect();
                    Tensor::from_f32(name.clone(), t.shape.clone(), &v)?
                }
            },
        };
        out.push((name, t));
    }
    Ok(out)
}

/// A full-attention layer's weights.
struct Attn<O: Ops> {
    /// Q, K, V and the query gate (one input).
    qkvg: O::Mats,
    qk_norm: [O::Vector; 2],
    out: O::Mat,
    kv: KvId,
}

/// A gated DeltaNet layer's weights.
struct Delta<O: Ops> {
    /// The conv input `[q k v]`, the gate `z` and `[b a]` (one input).
    proj: O::Mats,
    conv: O::Vector,
    /// `ssm_a` and `ssm_dt`.
    coef: [O::Vector; 2],
    norm: O::Vector,
    out: O::Mat,
    st: StateId,
}

enum Mixer<O: Ops> {
    Attn(Attn<O>),
    Delta(Delta<O>),
}

struct Layer<O: Ops> {
    attn_norm: O::Vector,
    mixer: Mixer<O>,
    post_norm: O::Vector,
    ffn: Ffn<O>,
}

/// A layer's MoE FFN and shared expert.
enum Ffn<O: Ops> {
    /// The router, the gate, up and down expert stacks, and the shared expert on its own: its
    /// gate and up (one input), down and sigmoid gate `[1, hidden]`.
    Apart {
        router: O::Mat,
        experts: [O::Mat; 3],
        shared: (O::Mats, O::Mat, O::Mat),
    },
    /// The shared expert folded into the MoE as one more expert ([`Ops::fold_shared_expert`]).
    Folded([O::Mat; 4]),
}

/// The activations, declared once and shared by every layer.
pub(super) struct Acts {
    pub(super) x: Act,
    pub(super) h: Act,
    pub(super) o: Act,
    q: Act,
    qgate: Act,
    k: Act,
    v: Act,
    att: Act,
    lin_in: Act,
    z: Act,
    ba: Act,
    lin_conv: Act,
    core: Act,
    router: Act,
    /// The router logits and the shared expert's gate of a folded FFN.
    router_shared: Act,
    sh_gate: Act,
    sh_up: Act,
    sh_out: Act,
    sh_g: Act,
    pub(super) head: Act,
}

impl Acts {
    fn declare<O: Ops>(ops: &mut O, c: &ModelConfig, p: &HybridParams, experts: usize) -> Acts {
        let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let d = p.delta();
        let mut a = |name, width| ops.act(name, width, Rows::Step);
        Acts {
            x: a("x", c.hidden),
            h: a("h", c.hidden),
            o: a("o", c.hidden),
            q: a("q", qd),
            qgate: a("q_gate", qd),
            k: a("k", kvd),
            v: a("v", kvd),
            att: a("att", qd),
            lin_in: a("lin_in", d.conv_dim()),
            z: a("z", d.value_dim()),
            ba: a("ba", 2 * d.n_v_heads),
            lin_conv: a("lin_conv", d.conv_dim()),
            core: a("core", d.value_dim()),
            router: a("router", experts),
            router_shared: a("router_shared", experts + 1),
            sh_gate: a("sh_gate", p.shared_ffn),
            sh_up: a("sh_up", p.shared_ffn),
            sh_out: a("sh_out", c.hidden),
            sh_g: a("sh_g", 1),
            head: ops.act("head_norm", c.hidden, Rows::Head),
        }
    }
}

/// The model (or, with its own embedding and one attention layer, its MTP module:
/// qwen3next_mtp.rs).
pub(super) struct Qwen3Next<O: Ops> {
    pub(super) emb: Embedding<O>,
    layers: Vec<Layer<O>>,
    /// The model index of `layers[0]` (a pipeline stage's first layer; the MTP layer's).
    first: usize,
    pub(super) acts: Acts,
    rope: RopeId,
    attn: AttnParams,
    moe: ops::MoeParams,
    head_dim: usize,
    head_v: usize,
    eps: f32,
}

/// Q's rows split into the query and its gate (HF's q_proj holds them interleaved per head).
fn split_q(t: &Tensor, n_heads: usize, head_dim: usize) -> Result<[Tensor; 2]> {
    let rows = |off: usize| -> Vec<usize> {
        (0..n_heads)
            .flat_map(|h| (0..head_dim).map(move |i| h * 2 * head_dim + off + i))
            .collect()
    };
    Ok([
        t.take_rows(format!("{}:q", t.name), &rows(0))?,
        t.take_rows(format!("{}:gate", t.name), &rows(head_dim))?,
    ])
}

/// Uploads layer `l`, a full-attention one when `attention`, else gated DeltaNet.
fn load_layer<O: Ops>(
    ops: &mut O,
    w: &ModelWeights,
    (l, attention): (usize, bool),
    moe: &ops::MoeParams,
) -> Result<Layer<O>> {
    let c = &w.config;
    let mixer = if attention {
        let [q, gate] = split_q(w.get(Role::Q(l))?, c.n_heads, c.head_dim)?;
        let (k, v) = (w.get(Role::K(l))?, w.get(Role::V(l))?);
        Mixer::Attn(Attn {
            qkvg: ops.mats(&[&q, k, v, &gate])?,
            qk_norm: [
                ops.vector(w.get(Role::QNorm(l))?)?,
                ops.vector(w.get(Role::KNorm(l))?)?,
            ],
            out: ops.mat(w.get(Role::AttnOut(l))?)?,
            kv: ops.kv_layer(c.n_kv_heads * c.head_dim)?,
        })
    } else {
        let proj = [
            w.get(Role::LinQkv(l))?,
            w.get(Role::LinGate(l))?,
            w.get(Role::SsmBa(l))?,
        ];
        let conv = w.get(Role::SsmConv(l))?;
        Mixer::Delta(Delta {
            proj: ops.mats(&proj)?,
            conv: ops.vector(&conv.reshaped(vec![conv.numel()])?)?,
            coef: [
                ops.vector(w.get(Role::SsmA(l))?)?,
                ops.vector(w.get(Role::SsmDt(l))?)?,
            ],
            norm: ops.vector(w.get(Role::SsmNorm(l))?)?,
            out: ops.mat(w.get(Role::SsmOut(l))?)?,
            st: ops.state_layer(&hybrid(c)?.delta())?,
        })
    };
    Ok(Layer {
        attn_norm: ops.vector(w.get(Role::AttnNorm(l))?)?,
        mixer,
        post_norm: ops.vector(w.get(Role::AttnPostNorm(l))?)?,
        ffn: load_ffn(ops, w, l, moe)?,
    })
}

/// Uploads layer `l`'s MoE FFN, its shared expert folded in where the backend does that.
fn load_ffn<O: Ops>(
    ops: &mut O,
    w: &ModelWeights,
    l: usize,
    moe: &ops::MoeParams,
) -> Result<Ffn<O>> {
    let c = &w.config;
    let sh_gate = w.get(Role::ShexpGateInp(l))?;
    let router = w.get(Role::FfnGateInp(l))?;
    let stacks = [Role::GateExps(l), Role::UpExps(l), Role::DownExps(l)].map(|r| w.get(r));
    let [g, u, d] = stacks;
    let stacks = [g?, u?, d?];
    let shared = [Role::ShexpGate(l), Role::ShexpUp(l), Role::ShexpDown(l)].map(|r| w.get(r));
    let [sg, su, sd] = shared;
    let shared = [sg?, su?, sd?];
    if let Some(f) = ops.fold_shared_expert(router, stacks, shared, sh_gate, moe)? {
        return Ok(Ffn::Folded(f));
    }
    let [sg, su, sd] = shared;
    Ok(Ffn::Apart {
        router: ops.mat(router)?,
        experts: [
            ops.experts(stacks[0])?,
            ops.experts(stacks[1])?,
            ops.experts(stacks[2])?,
        ],
        shared: (
            ops.mats(&[sg, su])?,
            ops.mat(sd)?,
            ops.mat(&sh_gate.reshaped(vec![1, c.hidden])?)?,
        ),
    })
}

pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    let p = hybrid(&w.config)?;
    ops.require("qwen3next", &NEEDS)?;
    let emb = Embedding::load_stage(ops, w, s)?;
    let layers = s.layers.clone().map(|l| (l, p.is_attention(l))).collect();
    Ok(Box::new(Qwen3Next::load(ops, w, emb, layers)?))
}

impl<O: Ops> Qwen3Next<O> {
    /// Uploads `layers` (index, full attention) of `w` beside `emb`, declares the activations.
    pub(super) fn load(
        ops: &mut O,
        w: &ModelWeights,
        emb: Embedding<O>,
        layers: Vec<(usize, bool)>,
    ) -> Result<Qwen3Next<O>> {
        let c = &w.config;
        let p = hybrid(c)?;
        let m = c.moe.ok_or_else(|| {
            Error::Config("qwen3next config without its expert parameters".into())
        })?;
        let first = layers.first().map_or(0, |&(l, _)| l);
        let moe = ops::MoeParams {
            n_experts: m.n_experts,
            n_used: m.n_used,
            norm_topk: m.norm_topk,
            glu: Glu::Silu,
        };
        let layers = layers
            .into_iter()
            .map(|la| load_layer(ops, w, la, &moe))
            .collect::<Result<Vec<_>>>()?;
        let rope = ops.rope_table(Rope::new(p.rope_dim, c.rope_theta, None, None))?;
        Ok(Qwen3Next {
            emb,
            layers,
            first,
            acts: Acts::declare(ops, c, &p, m.n_experts),
            rope,
            attn: AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim),
            moe,
            head_dim: c.head_dim,
            head_v: p.head_v,
            eps: c.rms_eps,
        })
    }

    /// Layer `i` of the loaded ones (model layer `l`, for the dumps), into the residual.
    pub(super) fn layer(&self, ops: &mut O, i: usize, l: usize) -> Result<()> {
        let (a, w) = (&self.acts, &self.layers[i]);
        match &w.mixer {
            Mixer::Attn(m) => self.attention(ops, &w.attn_norm, m, l)?,
            Mixer::Delta(m) => self.delta(ops, &w.attn_norm, m, l)?,
        }
        ops.dump("attn_out", l, a.o);
        self.ffn(ops, w, l)?;
        ops.dump("l_out", l, a.x);
        Ok(())
    }

    /// `x += out(sigmoid(gate) * attention(rope(q_norm(q)), rope(k_norm(k)), v))`, q/k/v and
    /// the gate from `norm(x)` (one fused norm + products where the backend fuses them).
    fn attention(&self, ops: &mut O, norm: &O::Vector, w: &Attn<O>, l: usize) -> Result<()> {
        let (a, hd) = (&self.acts, self.head_dim);
        let outs = [a.q, a.k, a.v, a.qgate];
        ops.norm_matmuls(a.x, norm, self.eps, a.h, &w.qkvg, &outs)?;
        ops.dump("attn_norm", l, a.h);
        let [qn, kn] = &w.qk_norm;
        let qkv = (a.q, a.k, a.v);
        ops.qk_norm_rope_kv_write(qkv, [qn, kn], self.eps, self.rope, hd, w.kv)?;
        ops.dump("q", l, a.q);
        ops.dump("k", l, a.k);
        ops.attention(w.kv, a.q, a.att, &self.attn)?;
        ops.sigmoid_mul(a.att, a.qgate)?;
        ops.matmul_add(&w.out, a.att, Residual { res: a.x, tmp: a.o })
    }

    /// `x += out(silu(z) * norm(gated_delta(conv1d_silu(W_qkv h))))`, `h = norm(x)`.
    fn delta(&self, ops: &mut O, norm: &O::Vector, w: &Delta<O>, l: usize) -> Result<()> {
        let a = &self.acts;
        let outs = [a.lin_in, a.z, a.ba];
        ops.norm_matmuls(a.x, norm, self.eps, a.h, &w.proj, &outs)?;
        ops.dump("attn_norm", l, a.h);
        let [ca, cdt] = &w.coef;
        let conv = (&w.conv, a.lin_in, a.lin_conv);
        ops.conv_gated_delta(w.st, conv, a.ba, [ca, cdt], a.core)?;
        ops.dump("conv", l, a.lin_conv);
        ops.dump("delta", l, a.core);
        let core = (a.core, &w.norm, self.head_v, self.eps);
        ops.norm_gate_matmul_add(core, a.z, &w.out, Residual { res: a.x, tmp: a.o })
    }

    /// `x += moe(norm(x)) + sigmoid(g . h) * shared(h)`, `h = norm(x)`.
    fn ffn(&self, ops: &mut O, w: &Layer<O>, l: usize) -> Result<()> {
        let a = &self.acts;
        let xn = (a.x, &w.post_norm, self.eps, a.h);
        let (router, [g, u, d], (gate_up, down, gate)) = match &w.ffn {
            Ffn::Folded(f) => {
                ops.norm_moe_shared(xn, f, a.router_shared, a.o, &self.moe)?;
                ops.dump("ffn_norm", l, a.h);
                ops.dump("ffn_out", l, a.o);
                return Ok(());
            }
            Ffn::Apart {
                router,
                experts,
                shared,
            } => (router, experts, shared),
        };
        ops.norm_moe(xn, (router, a.router), [g, u, d], a.o, false, &self.moe)?;
        ops.dump("ffn_norm", l, a.h);
        ops.matmuls(gate_up, a.h, &[a.sh_gate, a.sh_up])?;
        ops.glu_matmul(Glu::Silu, a.sh_gate, a.sh_up, down, a.sh_out)?;
        ops.matmul(gate, a.h, a.sh_g)?;
        ops.gated_add((a.sh_out, a.sh_g), a.o, a.x)?;
        ops.dump("ffn_out", l, a.o);
        Ok(())
    }
}

impl<O: Ops> Forward<O> for Qwen3Next<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        self.emb.embed(ops, self.acts.x)?;
        for i in 0..self.layers.len() {
            self.layer(ops, i, self.first + i)?;
        }
        Ok(self.acts.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)
    }
}
