//! llama-postnorm: the llama layer with an RMSNorm of the attention output before its residual
//! add (Gemma's `post_attention_layernorm`), and Gemma-style HF names, where
//! `post_attention_layernorm` is that norm and the FFN's input norm is
//! `pre_feedforward_layernorm`. A small architecture of memra's own: it shows what adding an
//! architecture takes (this file, its registry lines in mod.rs, one new tensor role) and is
//! tested on the CPU (engine/tests/it/llama_postnorm.rs).

use super::blocks::{self, Acts, AttnStep, Embedding, GluFfn, SelfAttn};
use super::{Arch, ArchDef, Forward, ModelWeights, Role, Stage, TensorSpec};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::{Act, AttnParams, Glu, Ops, RopeId};

pub const DEF: ArchDef = ArchDef {
    arch: Arch::LlamaPostNorm,
    gguf_name: "llama-postnorm",
    hf_class: "LlamaPostNormForCausalLM",
    gguf_qk_permuted: true,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &NAMES,
    tensors,
    hf_config: |_, _| {},
    hf_tensor: None,
};

/// (GGUF suffix, HF suffix) of the layer tensors.
const NAMES: [(&str, &str); 10] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (mut out, last) = blocks::embedding_tensors(c);
    for l in 0..c.n_layers {
        out.push(TensorSpec::norm(Role::AttnNorm(l), c.hidden));
        out.extend(blocks::qkv_tensors(c, l));
        out.push(blocks::attn_out_tensor(c, l));
        out.push(TensorSpec::norm(Role::AttnPostNorm(l), c.hidden));
        out.push(TensorSpec::norm(Role::FfnNorm(l), c.hidden));
        out.extend(blocks::ffn_tensors(c, l));
    }
    out.extend(last);
    out
}

struct Layer<O: Ops> {
    attn_norm: O::Vector,
    attn: SelfAttn<O>,
    attn_post_norm: O::Vector,
    ffn_norm: O::Vector,
    ffn: GluFfn<O>,
}

struct LlamaPostNorm<O: Ops> {
    emb: Embedding<O>,
    layers: Vec<Layer<O>>,
    /// The model index of `layers[0]` (a pipeline stage's first layer).
    first: usize,
    acts: Acts,
    rope: RopeId,
    attn: AttnParams,
    eps: f32,
}

pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    let c = &w.config;
    let emb = Embedding::load_stage(ops, w, s)?;
    let mut layers = Vec::with_capacity(s.layers.len());
    for l in s.layers.clone() {
        layers.push(Layer {
            attn_norm: ops.vector(w.get(Role::AttnNorm(l))?)?,
            attn: SelfAttn::load(ops, w, l)?,
            attn_post_norm: ops.vector(w.get(Role::AttnPostNorm(l))?)?,
            ffn_norm: ops.vector(w.get(Role::FfnNorm(l))?)?,
            ffn: GluFfn::load(ops, w, l)?,
        });
    }
    Ok(Box::new(LlamaPostNorm {
        emb,
        layers,
        first: s.layers.start,
        acts: Acts::declare(ops, c),
        rope: blocks::llama_rope(ops, w)?,
        attn: AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim),
        eps: c.rms_eps,
    }))
}

impl<O: Ops> Forward<O> for LlamaPostNorm<O> {
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
            w.attn.qkv_rope(ops, a, l, &s)?;
            ops.attention(w.attn.kv, a.q, a.att, &self.attn)?;
            ops.matmul(&w.attn.out, a.att, a.o)?;
            ops.dump("attn_out", l, a.o);
            ops.rms_norm(a.o, &w.attn_post_norm, a.o, a.o.width, self.eps)?;
            ops.dump("attn_post_norm", l, a.o);
            ops.add(a.x, a.o)?;
            w.ffn.forward(ops, a, l, &w.ffn_norm, self.eps, Glu::Silu)?;
            ops.dump("l_out", l, a.x);
        }
        Ok(a.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)
    }
}
