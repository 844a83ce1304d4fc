//! llama (SmolLM2, Llama 3 incl. `llama3` rope scaling): the plain pre-norm decoder layer.
//! qwen2 and qwen3 run this forward pass too, with the extra tensors their lists declare.

use super::blocks::{self, Acts, AttnStep, Embedding, GluFfn, SelfAttn};
use super::{Arch, ArchDef, Forward, ModelWeights, Role, Stage, TensorSpec};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::{Act, AttnParams, Glu, Ops, RopeId};

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Llama,
    gguf_name: "llama",
    hf_class: "LlamaForCausalLM",
    gguf_qk_permuted: true,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &NAMES,
    tensors,
    hf_config: |_, _| {},
    hf_tensor: None,
};

/// (GGUF suffix, HF suffix) of the llama family's layer tensors (qwen2 and qwen3 use them too).
pub const NAMES: [(&str, &str); 20] = [
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
    // MTP layers (models/mtp.rs): llama.cpp `nextn.*`, DeepSeek-V3 HF names.
    ("nextn.eh_proj.weight", "eh_proj.weight"),
    ("nextn.enorm.weight", "enorm.weight"),
    ("nextn.hnorm.weight", "hnorm.weight"),
    ("nextn.shared_head_norm.weight", "shared_head.norm.weight"),
    ("nextn.shared_head_head.weight", "shared_head.head.weight"),
    ("nextn.embed_tokens.weight", "embed_tokens.weight"),
];

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    decoder_tensors(c, |_| Vec::new())
}

/// The llama-family tensor list, with `extra(l)` after layer l's q/k/v projections.
pub fn decoder_tensors(
    c: &ModelConfig,
    extra: impl Fn(usize) -> Vec<TensorSpec>,
) -> Vec<TensorSpec> {
    let (mut out, last) = blocks::embedding_tensors(c);
    for l in 0..c.n_layers + c.mtp_layers {
        if l >= c.n_layers {
            out.extend(super::mtp::tensors(c, l));
        }
        out.push(TensorSpec::norm(Role::AttnNorm(l), c.hidden));
        out.extend(blocks::qkv_tensors(c, l));
        out.extend(extra(l));
        out.push(blocks::attn_out_tensor(c, l));
        out.push(TensorSpec::norm(Role::FfnNorm(l), c.hidden));
        out.extend(blocks::ffn_tensors(c, l));
    }
    out.extend(last);
    out
}

/// One pre-norm decoder layer (also an MTP layer's block, models/mtp.rs).
pub(crate) struct Layer<O: Ops> {
    attn_norm: O::Vector,
    attn: SelfAttn<O>,
    ffn_norm: O::Vector,
    ffn: GluFfn<O>,
}

impl<O: Ops> Layer<O> {
    /// Loads layer `l` (its own KV layer).
    pub(crate) fn load(ops: &mut O, w: &ModelWeights, l: usize) -> Result<Layer<O>> {
        Ok(Layer {
            attn_norm: ops.vector(w.get(Role::AttnNorm(l))?)?,
            attn: SelfAttn::load(ops, w, l)?,
            ffn_norm: ops.vector(w.get(Role::FfnNorm(l))?)?,
            ffn: GluFfn::load(ops, w, l)?,
        })
    }

    /// `a.x += attn(a.x)`, then `a.x += ffn(a.x)`.
    pub(crate) fn forward(
        &self,
        ops: &mut O,
        a: &Acts,
        l: usize,
        (rope, params, eps): (RopeId, AttnParams, f32),
    ) -> Result<()> {
        let s = AttnStep {
            norm: &self.attn_norm,
            eps,
            rope,
            params,
        };
        self.attn.forward(ops, a, l, &s)?;
        self.ffn
            .forward(ops, a, l, &self.ffn_norm, eps, Glu::Silu)?;
        ops.dump("l_out", l, a.x);
        Ok(())
    }
}

/// A llama-family model on one backend.
pub struct Llama<O: Ops> {
    emb: Embedding<O>,
    layers: Vec<Layer<O>>,
    /// The model index of `layers[0]` (a pipeline stage's first layer).
    first: usize,
    acts: Acts,
    rope: RopeId,
    attn: AttnParams,
    eps: f32,
    /// Whether image rows replace the token embeddings (qwen2, qwen3, qwen2vl, qwen3vl: the
    /// Qwen ViT's).
    embeds: bool,
    /// Qwen3-VL's deepstack: part `l + 1` of each image row is added into the residual after
    /// layer `l < deepstack` (`Ops::inject_add`).
    deepstack: usize,
}

pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    build_llama(w, s, ops, false)
}

/// The llama forward pass; `embeds`: it takes image rows (`Ops::inject` after the embedding).
pub(crate) fn build_llama<O: Ops>(
    w: &ModelWeights,
    s: &Stage,
    ops: &mut O,
    embeds: bool,
) -> Result<Box<dyn Forward<O>>> {
    let c = &w.config;
    let emb = Embedding::load_stage(ops, w, s)?;
    let mut layers = Vec::with_capacity(s.layers.len());
    for l in s.layers.clone() {
        layers.push(Layer::load(ops, w, l)?);
    }
    Ok(Box::new(Llama {
        emb,
        layers,
        first: s.layers.start,
        acts: Acts::declare(ops, c),
        rope: blocks::llama_rope(ops, w)?,
        attn: AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim),
        eps: c.rms_eps,
        embeds,
        deepstack: c.vl.map_or(0, |v| v.deepstack),
    }))
}

impl<O: Ops> Forward<O> for Llama<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        let a = &self.acts;
        self.emb.embed(ops, a.x)?;
        if self.embeds && self.emb.first {
            // Image rows replace their placeholder tokens' embeddings.
            ops.inject(a.x)?;
        }
        for (i, w) in self.layers.iter().enumerate() {
            let l = self.first + i;
            w.forward(ops, a, l, (self.rope, self.attn, self.eps))?;
            if self.embeds && l < self.deepstack {
                ops.inject_add(a.x, l + 1, a.o)?;
                ops.dump("deepstack_out", l, a.x);
            }
        }
        Ok(a.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)
    }

    fn takes_embeds(&self) -> bool {
        self.embeds
    }
}
