//! gemma3 (Gemma 3 text models, e.g. Gemma 3 270M): embeddings scaled by `sqrt(hidden)`; four
//! RMSNorms per layer (before and after attention, before and after the FFN) and per-head q/k
//! RMSNorms; GeGLU with tanh-GELU; local layers with sliding-window attention and their own RoPE
//! base, a global layer every `sliding_window_pattern` layers; attention scaled by
//! `query_pre_attn_scalar^-0.5`; tied embeddings; optional final logit softcapping.
//!
//! Norm weights: Gemma's RMSNorm multiplies by `1 + w`. llama.cpp's converter stores `1 + w` in
//! the GGUF (the 270M file's `attn_norm` weights are 7.4..62.5), so the internal weights are the
//! GGUF's; HF checkpoints store `w`, and the HF loader adds [`ArchDef::hf_norm_offset`].
//! GGUF q/k rows are in HF order (NeoX RoPE), not permuted.

use super::blocks::{self, Acts, AttnStep, Embedding, GluFfn, SelfAttn};
use super::{Arch, ArchDef, Forward, ModelWeights, Role, Stage, TensorSpec};
use crate::config::{Gemma3Params, ModelConfig};
use crate::error::{Error, Result};
use crate::formats::gguf::MetaValue;
use crate::ops::rope::Rope;
use crate::ops::{Act, AttnParams, Feature, Glu, Ops, RopeId};

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Gemma3,
    gguf_name: "gemma3",
    hf_class: "Gemma3ForCausalLM",
    gguf_qk_permuted: false,
    hf_norm_offset: 1.0,
    chat_template: Some(CHAT_TEMPLATE),
    layer_names: &NAMES,
    tensors,
    hf_config,
    hf_tensor: None,
};

/// The Gemma instruct turn format (the 270M GGUF is the base model and carries no template):
/// `<bos>`, then `<start_of_turn>{user|model}\n{content}<end_of_turn>\n` per message, with a
/// system message's text put before the first user message's, and `<start_of_turn>model\n` to
/// prompt the answer.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages and messages[0].role == 'system' -%}\
{%- set prefix = messages[0].content ~ '\\n\\n' -%}{%- set turns = messages[1:] -%}\
{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}\
{%- for m in turns -%}\
{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Gemma conversations alternate user and assistant turns') }}\
{%- endif -%}\
{{ '<start_of_turn>' ~ ('model' if m.role == 'assistant' else m.role) ~ '\\n' }}\
{{- (prefix if loop.first else '') ~ (m.content | trim) ~ '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

/// (GGUF suffix, HF suffix) of the layer tensors.
const NAMES: [(&str, &str); 13] = [
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
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
];

/// Default pattern and local RoPE base (llama.cpp and transformers hard-code these for gemma3;
/// files rarely carry them).
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_LOCAL_THETA: f32 = 10000.0;

/// What gemma3 needs beyond the common ops.
const NEEDS: [Feature; 3] = [Feature::GeluTanh, Feature::SlidingWindow, Feature::Scale];

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (mut out, last) = blocks::embedding_tensors(c);
    for l in 0..c.n_layers {
        out.push(TensorSpec::norm(Role::AttnNorm(l), c.hidden));
        out.extend(blocks::qkv_tensors(c, l));
        out.extend(blocks::qk_norm_tensors(c, l));
        out.push(blocks::attn_out_tensor(c, l));
        out.push(TensorSpec::norm(Role::AttnPostNorm(l), c.hidden));
        out.push(TensorSpec::norm(Role::FfnNorm(l), c.hidden));
        out.extend(blocks::ffn_tensors(c, l));
        out.push(TensorSpec::norm(Role::FfnPostNorm(l), c.hidden));
    }
    out.extend(last);
    out
}

/// The gemma3 parameters of a config read from GGUF metadata (`get` looks up `gemma3.<key>`);
/// `None` for other architectures.
pub fn gguf_params<'a>(
    c: &ModelConfig,
    get: &dyn Fn(&str) -> Option<&'a MetaValue>,
) -> Result<Option<Gemma3Params>> {
    if c.arch != Arch::Gemma3 {
        return Ok(None);
    }
    let uint = |k: &str| get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
    let float = |k: &str| get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
    let sliding_window = uint("attention.sliding_window").ok_or_else(|| {
        Error::Config("GGUF metadata `gemma3.attention.sliding_window` is missing".into())
    })?;
    let linear = get("rope.scaling.type").and_then(|v| v.as_str()) == Some("linear");
    let p = Gemma3Params {
        sliding_window,
        sliding_window_pattern: uint("attention.sliding_window_pattern").unwrap_or(DEFAULT_PATTERN),
        rope_local_theta: float("rope.freq_base_swa").unwrap_or(DEFAULT_LOCAL_THETA),
        query_pre_attn_scalar: default_scalar(c),
        final_logit_softcap: float("final_logit_softcapping"),
        rope_linear_factor: if linear {
            float("rope.scaling.factor")
        } else {
            None
        },
    };
    Ok(Some(p))
}

/// The GGUF metadata keys [`gguf_params`] reads, for writers (synthetic models, conversions).
pub fn gguf_keys(p: &Gemma3Params) -> Vec<(String, MetaValue)> {
    let k = |s: &str| format!("gemma3.{s}");
    let mut m = vec![
        (
            k("attention.sliding_window"),
            MetaValue::U32(p.sliding_window as u32),
        ),
        (
            k("attention.sliding_window_pattern"),
            MetaValue::U32(p.sliding_window_pattern as u32),
        ),
        (k("rope.freq_base_swa"), MetaValue::F32(p.rope_local_theta)),
    ];
    if let Some(c) = p.final_logit_softcap {
        m.push((k("final_logit_softcapping"), MetaValue::F32(c)));
    }
    if let Some(f) = p.rope_linear_factor {
        m.push((k("rope.scaling.type"), MetaValue::Str("linear".into())));
        m.push((k("rope.scaling.factor"), MetaValue::F32(f)));
    }
    m
}

/// llama.cpp's choice when the file does not say: `hidden / n_heads` for the 27B model
/// (62 layers), the head dimension otherwise (as the models' config.json files say).
fn default_scalar(c: &ModelConfig) -> f32 {
    if c.n_layers == 62 {
        (c.hidden / c.n_heads) as f32
    } else {
        c.head_dim as f32
    }
}

/// The gemma3 parameters of an HF `config.json`; `None` for other architectures.
pub fn hf_params(c: &ModelConfig, v: &serde_json::Value) -> Result<Option<Gemma3Params>> {
    if c.arch != Arch::Gemma3 {
        return Ok(None);
    }
    let float = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
    let sliding_window = v
        .get("sliding_window")
        .and_then(|x| x.as_u64())
        .ok_or_else(|| Error::Config("config.json `sliding_window` is missing".into()))?
        as usize;
    let pattern = match v.get("layer_types").and_then(|x| x.as_array()) {
        Some(types) => pattern_of(types, c.n_layers)?,
        None => v
            .get("sliding_window_pattern")
            .or_else(|| v.get("_sliding_window_pattern"))
            .and_then(|x| x.as_u64())
            .map_or(DEFAULT_PATTERN, |x| x as usize),
    };
    let rope_linear_factor = match v.get("rope_scaling") {
        Some(serde_json::Value::Null) | None => None,
        Some(rs) => match rs.get("rope_type").or_else(|| rs.get("type")) {
            Some(t) if t.as_str() == Some("linear") => {
                rs.get("factor").and_then(|x| x.as_f64()).map(|x| x as f32)
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "gemma3 rope_scaling type {other:?} (supported: linear)"
                )));
            }
        },
    };
    Ok(Some(Gemma3Params {
        sliding_window,
        sliding_window_pattern: pattern,
        rope_local_theta: float("rope_local_base_freq").unwrap_or(DEFAULT_LOCAL_THETA),
        query_pre_attn_scalar: float("query_pre_attn_scalar").unwrap_or(default_scalar(c)),
        final_logit_softcap: float("final_logit_softcapping"),
        rope_linear_factor,
    }))
}

/// The period of a `layer_types` list (`sliding_attention` x (p - 1), `full_attention`, ...).
fn pattern_of(types: &[serde_json::Value], n_layers: usize) -> Result<usize> {
    let global: Vec<bool> = types
        .iter()
        .map(|t| t.as_str() == Some("full_attention"))
        .collect();
    let p = global
        .iter()
        .position(|&g| g)
        .map_or(n_layers + 1, |i| i + 1);
    let periodic = global.len() == n_layers
        && global
            .iter()
            .enumerate()
            .all(|(l, &g)| g == (l + 1).is_multiple_of(p));
    if !periodic {
        return Err(Error::Unsupported(format!(
            "gemma3 layer_types that are not one global layer every N layers: {types:?}"
        )));
    }
    Ok(p)
}

/// Writes the gemma3 keys of an HF `config.json`.
fn hf_config(c: &ModelConfig, v: &mut serde_json::Value) {
    v["model_type"] = "gemma3_text".into();
    v["hidden_activation"] = "gelu_pytorch_tanh".into();
    v["hidden_act"] = "gelu_pytorch_tanh".into();
    let Some(p) = c.gemma3 else { return };
    v["sliding_window"] = p.sliding_window.into();
    v["layer_types"] = (0..c.n_layers)
        .map(|l| match p.is_global(l) {
            true => "full_attention",
            false => "sliding_attention",
        })
        .collect::<Vec<_>>()
        .into();
    v["rope_local_base_freq"] = p.rope_local_theta.into();
    v["query_pre_attn_scalar"] = p.query_pre_attn_scalar.into();
    v["final_logit_softcapping"] = p.final_logit_softcap.into();
    if let Some(f) = p.rope_linear_factor {
        v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": f});
    }
}

struct Layer<O: Ops> {
    attn_norm: O::Vector,
    attn: SelfAttn<O>,
    attn_post_norm: O::Vector,
    ffn_norm: O::Vector,
    ffn: GluFfn<O>,
    ffn_post_norm: O::Vector,
    /// The layer's RoPE table and attention (window on local layers).
    rope: RopeId,
    params: AttnParams,
}

struct Gemma3<O: Ops> {
    emb: Embedding<O>,
    layers: Vec<Layer<O>>,
    /// The model index of `layers[0]` (a pipeline stage's first layer).
    first: usize,
    acts: Acts,
    embed_scale: f32,
    softcap: Option<f32>,
    eps: f32,
}

pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    let c = &w.config;
    let p = c
        .gemma3
        .ok_or_else(|| Error::Config("gemma3 config without its parameters".into()))?;
    ops.require("gemma3", &NEEDS)?;
    if p.final_logit_softcap.is_some() {
        ops.require("gemma3", &[Feature::Softcap])?;
    }
    let local = ops.rope_table(Rope::new(c.head_dim, p.rope_local_theta, None, None))?;
    let factors = p.rope_linear_factor.map(|f| vec![f; c.head_dim / 2]);
    let global = ops.rope_table(Rope::new(
        c.head_dim,
        c.rope_theta,
        None,
        factors.as_deref(),
    ))?;
    let base = AttnParams {
        scale: 1.0 / p.query_pre_attn_scalar.sqrt(),
        // Image tokens attend bidirectionally within their image (HF, llama.cpp mtmd).
        spans: true,
        ..AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim)
    };
    let emb = Embedding::load_stage(ops, w, s)?;
    let mut layers = Vec::with_capacity(s.layers.len());
    for l in s.layers.clone() {
        let g = p.is_global(l);
        layers.push(Layer {
            attn_norm: ops.vector(w.get(Role::AttnNorm(l))?)?,
            attn: SelfAttn::load(ops, w, l)?,
            attn_post_norm: ops.vector(w.get(Role::AttnPostNorm(l))?)?,
            ffn_norm: ops.vector(w.get(Role::FfnNorm(l))?)?,
            ffn: GluFfn::load(ops, w, l)?,
            ffn_post_norm: ops.vector(w.get(Role::FfnPostNorm(l))?)?,
            rope: if g { global } else { local },
            params: AttnParams {
                window: (!g).then_some(p.sliding_window),
                ..base
            },
        });
    }
    Ok(Box::new(Gemma3 {
        emb,
        layers,
        first: s.layers.start,
        acts: Acts::declare(ops, c),
        embed_scale: (c.hidden as f32).sqrt(),
        softcap: p.final_logit_softcap,
        eps: c.rms_eps,
    }))
}

impl<O: Ops> Forward<O> for Gemma3<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        let a = &self.acts;
        self.emb.embed(ops, a.x)?;
        if self.emb.first {
            ops.scale(a.x, self.embed_scale)?;
            // Image soft tokens: the tower's rows replace the scaled token embeddings (they
            // are not scaled, as in HF and llama.cpp).
            ops.inject(a.x)?;
        }
        for (i, w) in self.layers.iter().enumerate() {
            let l = self.first + i;
            let s = AttnStep {
                norm: &w.attn_norm,
                eps: self.eps,
                rope: w.rope,
                params: w.params,
            };
            w.attn.qkv_rope(ops, a, l, &s)?;
            ops.attention_matmul(w.attn.kv, a.q, a.att, &w.params, &w.attn.out, a.o)?;
            ops.dump("attn_out", l, a.o);
            // Sandwich norms: the attention output normed into the residual, then the FFN's
            // pre-norm of the new residual (one pass where the backend fuses them).
            ops.post_norm_add_norm_matmuls(
                (a.o, &w.attn_post_norm, self.eps),
                a.x,
                (&w.ffn_norm, self.eps, a.h),
                &w.ffn.gate_up,
                &[a.gate, a.up],
            )?;
            ops.dump("ffn_norm", l, a.h);
            ops.glu_matmul(Glu::GeluTanh, a.gate, a.up, &w.ffn.down, a.o)?;
            ops.dump("ffn_out", l, a.o);
            ops.post_norm_add(a.o, &w.ffn_post_norm, self.eps, a.x)?;
            ops.dump("l_out", l, a.x);
        }
        Ok(a.x)
    }

    fn takes_embeds(&self) -> bool {
        true
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)?;
        match self.softcap {
            Some(cap) => ops.softcap(logits, cap),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types_give_the_pattern() {
        let t = |g: bool| serde_json::Value::from(if g { "full_attention" } else { "x" });
        let types: Vec<_> = (0..12).map(|l| t((l + 1) % 6 == 0)).collect();
        assert_eq!(pattern_of(&types, 12).unwrap(), 6);
        let mut bad = types.clone();
        bad[2] = t(true);
        assert!(pattern_of(&bad, 12).is_err());
        assert!(pattern_of(&types, 13).is_err());
    }
}
