//! qwen3moe (Qwen3-30B-A3B and kin): the qwen3 attention (per-head q/k RMSNorm before RoPE)
//! and, in every layer, a mixture-of-experts FFN instead of the dense one: a router
//! (`ffn_gate_inp`, `[E, hidden]`, no bias) gives each row E logits; softmax, top-k
//! (`n_used`, equal probabilities to the lowest expert index), renormalised when the config says
//! so; each chosen expert is a SwiGLU FFN of `expert_ffn`, and their outputs are added in
//! ascending expert index, weighted (the [`Ops::moe`] contract). No shared experts.
//!
//! GGUF stores each layer's experts as 3-D stacks `ffn_{gate,up,down}_exps` (`[E, out, in]`,
//! the internal layout); HF checkpoints hold one tensor per expert
//! (`mlp.experts.{e}.gate_proj.weight`), which the loader stacks. GGUF keeps HF q/k row order.
//!
//! Renormalisation: HF's `norm_topk_prob` (default false, as transformers' `Qwen3MoeConfig`);
//! GGUF files carry no key for it and llama.cpp always renormalises for qwen3moe, so GGUF reads
//! `qwen3moe.expert_weights_norm` when present and true otherwise.

use super::blocks::{self, Acts, AttnStep, Embedding, SelfAttn};
use super::{Arch, ArchDef, Forward, ModelWeights, Role, Stage, TensorSpec};
use crate::config::{ModelConfig, MoeParams};
use crate::error::{Error, Result};
use crate::formats::gguf::MetaValue;
use crate::ops::{self, Act, AttnParams, Feature, Glu, Ops, RopeId, Rows};

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3Moe,
    gguf_name: "qwen3moe",
    hf_class: "Qwen3MoeForCausalLM",
    gguf_qk_permuted: false,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &NAMES,
    tensors,
    hf_config,
    hf_tensor: None,
};

/// (GGUF suffix, HF suffix) of the layer tensors; `*` is the expert index
/// ([`super::roles::expert_name`]).
const NAMES: [(&str, &str); 12] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate_exps.weight", "mlp.experts.*.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.experts.*.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.experts.*.down_proj.weight"),
];

/// What qwen3moe needs beyond the common ops.
const NEEDS: [Feature; 1] = [Feature::Moe];

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (mut out, last) = blocks::embedding_tensors(c);
    // A config without expert parameters fails validation; list no experts for it.
    let p = c.moe.unwrap_or(MoeParams {
        n_experts: 0,
        n_used: 0,
        expert_ffn: 0,
        norm_topk: false,
    });
    let (e, f, h) = (p.n_experts, p.expert_ffn, c.hidden);
    for l in 0..c.n_layers {
        out.push(TensorSpec::norm(Role::AttnNorm(l), h));
        out.extend(blocks::qkv_tensors(c, l));
        out.extend(blocks::qk_norm_tensors(c, l));
        out.push(blocks::attn_out_tensor(c, l));
        out.push(TensorSpec::norm(Role::FfnNorm(l), h));
        out.push(TensorSpec::matrix(Role::FfnGateInp(l), e, h));
        out.push(TensorSpec::experts(Role::GateExps(l), e, f, h));
        out.push(TensorSpec::experts(Role::UpExps(l), e, f, h));
        out.push(TensorSpec::experts(Role::DownExps(l), e, h, f));
    }
    out.extend(last);
    out
}

/// The expert parameters of a config read from GGUF metadata (`get` looks up
/// `qwen3moe.<key>`); `None` for other architectures.
pub fn gguf_params<'a>(
    c: &ModelConfig,
    get: &dyn Fn(&str) -> Option<&'a MetaValue>,
) -> Result<Option<MoeParams>> {
    if !c.arch.is_moe() {
        return Ok(None);
    }
    let a = c.arch.gguf_name();
    let uint = |k: &str| -> Result<usize> {
        get(k)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| {
                Error::Config(format!(
                    "GGUF metadata `{a}.{k}` is missing or not an integer"
                ))
            })
    };
    Ok(Some(MoeParams {
        n_experts: uint("expert_count")?,
        n_used: uint("expert_used_count")?,
        expert_ffn: uint("expert_feed_forward_length")?,
        norm_topk: get("expert_weights_norm")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
    }))
}

/// The GGUF metadata keys [`gguf_params`] reads, for writers (synthetic models, conversions).
pub fn gguf_keys(arch: Arch, p: &MoeParams) -> Vec<(String, MetaValue)> {
    let k = |s: &str| format!("{}.{s}", arch.gguf_name());
    let u = |v: usize| MetaValue::U32(v as u32);
    vec![
        (k("expert_count"), u(p.n_experts)),
        (k("expert_used_count"), u(p.n_used)),
        (k("expert_feed_forward_length"), u(p.expert_ffn)),
        (k("expert_weights_norm"), MetaValue::Bool(p.norm_topk)),
    ]
}

/// The expert parameters of an HF `config.json`; `None` for other architectures. Refuses
/// dense layers among the sparse ones (`decoder_sparse_step` other than 1, `mlp_only_layers`).
pub fn hf_params(c: &ModelConfig, v: &serde_json::Value) -> Result<Option<MoeParams>> {
    if !c.arch.is_moe() {
        return Ok(None);
    }
    let uint = |k: &str| -> Result<usize> {
        v.get(k)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| Error::Config(format!("config.json `{k}` is missing or not an integer")))
    };
    let step = v.get("decoder_sparse_step").and_then(|x| x.as_u64());
    if step.is_some_and(|s| s != 1) {
        return Err(Error::Unsupported(format!(
            "qwen3moe decoder_sparse_step {} (dense layers between MoE layers; supported: 1)",
            step.unwrap_or(0)
        )));
    }
    let dense = v.get("mlp_only_layers").and_then(|x| x.as_array());
    if dense.is_some_and(|d| !d.is_empty()) {
        return Err(Error::Unsupported(format!(
            "qwen3moe mlp_only_layers {:?} (dense layers; supported: none)",
            dense.cloned().unwrap_or_default()
        )));
    }
    for k in ["shared_expert_intermediate_size", "n_shared_experts"] {
        if c.arch == Arch::Qwen3Moe && v.get(k).and_then(|x| x.as_u64()).is_some_and(|n| n > 0) {
            return Err(Error::Unsupported(format!(
                "qwen3moe with shared experts (`{k}`)"
            )));
        }
    }
    Ok(Some(MoeParams {
        n_experts: uint("num_experts")?,
        n_used: uint("num_experts_per_tok")?,
        expert_ffn: uint("moe_intermediate_size")?,
        norm_topk: v
            .get("norm_topk_prob")
            .and_then(|x| x.as_bool())
            .unwrap_or(false),
    }))
}

/// Writes the qwen3moe keys of an HF `config.json`.
fn hf_config(c: &ModelConfig, v: &mut serde_json::Value) {
    v["model_type"] = "qwen3_moe".into();
    let Some(p) = c.moe else { return };
    v["num_experts"] = p.n_experts.into();
    v["num_experts_per_tok"] = p.n_used.into();
    v["moe_intermediate_size"] = p.expert_ffn.into();
    v["norm_topk_prob"] = p.norm_topk.into();
    v["decoder_sparse_step"] = 1.into();
    v["mlp_only_layers"] = serde_json::json!([]);
}

struct Layer<O: Ops> {
    attn_norm: O::Vector,
    attn: SelfAttn<O>,
    ffn_norm: O::Vector,
    router: O::Mat,
    /// Gate, up and down expert stacks.
    experts: [O::Mat; 3],
}

struct Qwen3Moe<O: Ops> {
    emb: Embedding<O>,
    layers: Vec<Layer<O>>,
    /// The model index of `layers[0]` (a pipeline stage's first layer).
    first: usize,
    acts: Acts,
    /// Router logits, one per expert.
    router: Act,
    rope: RopeId,
    attn: AttnParams,
    moe: ops::MoeParams,
    eps: f32,
}

pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    let c = &w.config;
    let p = c
        .moe
        .ok_or_else(|| Error::Config("qwen3moe config without its expert parameters".into()))?;
    ops.require("qwen3moe", &NEEDS)?;
    let emb = Embedding::load_stage(ops, w, s)?;
    let mut layers = Vec::with_capacity(s.layers.len());
    for l in s.layers.clone() {
        layers.push(Layer {
            attn_norm: ops.vector(w.get(Role::AttnNorm(l))?)?,
            attn: SelfAttn::load(ops, w, l)?,
            ffn_norm: ops.vector(w.get(Role::FfnNorm(l))?)?,
            router: ops.mat(w.get(Role::FfnGateInp(l))?)?,
            experts: [
                ops.experts(w.get(Role::GateExps(l))?)?,
                ops.experts(w.get(Role::UpExps(l))?)?,
                ops.experts(w.get(Role::DownExps(l))?)?,
            ],
        });
    }
    Ok(Box::new(Qwen3Moe {
        emb,
        layers,
        first: s.layers.start,
        acts: Acts::declare(ops, c),
        router: ops.act("router", p.n_experts, Rows::Step),
        rope: blocks::llama_rope(ops, w)?,
        attn: AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim),
        moe: ops::MoeParams {
            n_experts: p.n_experts,
            n_used: p.n_used,
            norm_topk: p.norm_topk,
            glu: Glu::Silu,
        },
        eps: c.rms_eps,
    }))
}

impl<O: Ops> Forward<O> for Qwen3Moe<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        let a = &self.acts;
        self.emb.embed(ops, a.x)?;
        for (i, w) in self.layers.iter().enumerate() {
            let l = self.first + i;
            let s = AttnStep {
                norm: &w.attn_norm,
                eps: self.eps,
                rope: self.rope,
                params: self.attn,
            };
            w.attn.forward(ops, a, l, &s)?;
            let [g, u, d] = &w.experts;
            let xn = (a.x, &w.ffn_norm, self.eps, a.h);
            let router = (&w.router, self.router);
            ops.norm_moe(xn, router, [g, u, d], a.o, true, &self.moe)?;
            ops.dump("ffn_norm", l, a.h);
            ops.dump("router", l, self.router);
            ops.dump("ffn_out", l, a.o);
            ops.dump("l_out", l, a.x);
        }
        Ok(a.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ModelConfig {
        crate::models::random::tiny_config(Arch::Qwen3Moe, 100)
    }

    #[test]
    fn hf_params_read_and_refuse() {
        let c = base();
        let mut v = c.to_hf_json(None, None);
        assert_eq!(hf_params(&c, &v).unwrap(), c.moe);
        v["norm_topk_prob"] = serde_json::Value::Null;
        assert!(!hf_params(&c, &v).unwrap().unwrap().norm_topk);
        v["decoder_sparse_step"] = 2.into();
        assert!(
            hf_params(&c, &v)
                .unwrap_err()
                .to_string()
                .contains("decoder_sparse_step")
        );
        v["decoder_sparse_step"] = 1.into();
        v["mlp_only_layers"] = serde_json::json!([0]);
        assert!(
            hf_params(&c, &v)
                .unwrap_err()
                .to_string()
                .contains("mlp_only_layers")
        );
        v["mlp_only_layers"] = serde_json::json!([]);
        v["num_experts"] = serde_json::Value::Null;
        assert!(
            hf_params(&c, &v)
                .unwrap_err()
                .to_string()
                .contains("num_experts")
        );
    }

    #[test]
    fn gguf_keys_round_trip() {
        let c = base();
        let p = c.moe.unwrap();
        let keys = gguf_keys(c.arch, &p);
        let get = |k: &str| {
            let k = format!("qwen3moe.{k}");
            keys.iter().find(|(n, _)| *n == k).map(|(_, v)| v)
        };
        assert_eq!(gguf_params(&c, &get).unwrap(), Some(p));
        // Without the norm key: renormalised, as llama.cpp does for qwen3moe.
        let no_norm = |k: &str| {
            if k == "expert_weights_norm" {
                None
            } else {
                get(k)
            }
        };
        assert!(gguf_params(&c, &no_norm).unwrap().unwrap().norm_topk);
    }
}
