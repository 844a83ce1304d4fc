//! Multi-token prediction (MTP) layers, as DeepSeek-V3 (§2.2), GLM-4.5 and Qwen3-Next ship
//! them: extra layers after the decoder, used only to draft (spec/mtp.rs).
//!
//! MTP module `j` sits at layer `n_layers + j`. From the target's final hidden state `h_i` at
//! position `i` (the residual stream after the last decoder layer, before the output norm) and
//! the next token `t_{i+1}`:
//!
//! ```text
//! x  = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])      // concat: embedding first
//! x  = decoder_layer(x)                                   // the model's own layer kind, own KV
//! logits(t_{i+2}) = head(shared_head_norm(x))             // the model's head unless its own
//! ```
//!
//! Tensor names (llama.cpp GGUF / DeepSeek-V3 HF), layer `N = n_layers + j`:
//! `blk.N.nextn.eh_proj.weight` / `model.layers.N.eh_proj.weight` `[hidden, 2*hidden]`;
//! `nextn.enorm`, `nextn.hnorm` / `enorm`, `hnorm`; `nextn.shared_head_norm` /
//! `shared_head.norm`; optional `nextn.shared_head_head` / `shared_head.head` and
//! `nextn.embed_tokens` / `embed_tokens`; the decoder layer's usual tensors under the same `N`.
//! The count: GGUF `{arch}.nextn_predict_layers` (included in `{arch}.block_count`, as
//! llama.cpp does), HF `num_nextn_predict_layers` (not in `num_hidden_layers`).
//!
//! Supported for the llama-family decoder (llama, qwen2, qwen3). The forward pass here runs
//! MTP module 0 only ([`build`]); the drafter chains it for K drafts.

use super::blocks::{Acts, Embedding};
use super::llama::Layer;
use super::{Arch, Forward, ModelWeights, Role, TensorSpec};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::ops::{Act, AttnParams, Feature, Ops, RopeId, Rows};
use crate::quant::DType;
use crate::weights::{Bytes, Tensor};

/// Most MTP layers a config may declare.
const MAX_MTP: usize = 16;

/// Checks a config's MTP layer count against its architecture.
pub fn validate(c: &ModelConfig) -> Result<()> {
    if c.mtp_layers == 0 {
        return Ok(());
    }
    if !matches!(
        c.arch,
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Next
    ) {
        return Err(Error::Config(format!(
            "MTP layers on a {} model: supported for llama, qwen2, qwen3 and qwen3next",
            c.arch.gguf_name()
        )));
    }
    if c.mtp_layers > MAX_MTP {
        return Err(Error::Config(format!(
            "{} MTP layers: at most {MAX_MTP}",
            c.mtp_layers
        )));
    }
    Ok(())
}

/// The MTP tensors of layer `l` (>= `n_layers`), before its decoder-layer tensors.
pub fn tensors(c: &ModelConfig, l: usize) -> Vec<TensorSpec> {
    let h = c.hidden;
    let mut head = TensorSpec::matrix(Role::MtpHead(l), c.vocab, h);
    head.optional = true;
    let mut embed = TensorSpec::matrix(Role::MtpEmbed(l), c.vocab, h);
    embed.optional = true;
    vec![
        embed,
        TensorSpec::norm(Role::MtpEnorm(l), h),
        TensorSpec::norm(Role::MtpHnorm(l), h),
        TensorSpec::matrix(Role::MtpEhProj(l), h, 2 * h),
        TensorSpec::norm(Role::MtpSharedNorm(l), h),
        head,
    ]
}

/// Refuses a model without MTP layers, naming what is missing.
pub fn require(w: &ModelWeights) -> Result<()> {
    let c = &w.config;
    if c.mtp_layers > 0 {
        return Ok(());
    }
    let n = c.n_layers;
    Err(Error::Input(format!(
        "--spec mtp: the model has no MTP layers (GGUF `{a}.nextn_predict_layers` with \
         `blk.{n}.nextn.eh_proj.weight`, ...; HF `num_nextn_predict_layers` with \
         `{hf}`); use --spec ngram or draft:PATH",
        a = c.arch.gguf_name(),
        hf = Role::MtpEhProj(n).hf_name(c.arch),
    )))
}

/// Columns `from..from + n` of a matrix, as f32 (the two halves of `eh_proj`).
pub(super) fn columns(t: &Tensor, from: usize, n: usize) -> Result<Tensor> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let mut row = vec![0f32; cols];
    let mut out = Vec::with_capacity(rows * n * 4);
    for r in 0..rows {
        crate::quant::dequantize_row(t.dtype, t.row(r), &mut row)?;
        for v in &row[from..from + n] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Tensor::new(
        format!("{}[:, {from}..{}]", t.name, from + n),
        DType::F32,
        vec![rows, n],
        Bytes::owned(out),
    )
}

/// MTP module 0 of a llama-family model on one backend: its body runs on the step's tokens
/// (the next tokens) and hidden inputs ([`Ops::hidden_in`]).
pub struct Mtp<O: Ops> {
    emb: Embedding<O>,
    enorm: O::Vector,
    hnorm: O::Vector,
    /// `eh_proj`'s embedding half and hidden half.
    e_proj: O::Mat,
    h_proj: O::Mat,
    layer: Layer<O>,
    acts: Acts,
    /// The hidden input rows.
    hin: Act,
    rope: RopeId,
    attn: AttnParams,
    eps: f32,
}

/// MTP module 0's embedding and head: its own embedding or the model's, its own head or the
/// model's output (the embedding when tied), after its shared norm.
pub(super) fn mtp_embedding<O: Ops>(ops: &mut O, w: &ModelWeights) -> Result<Embedding<O>> {
    let c = &w.config;
    let l = c.n_layers;
    let own_embed = w.opt(Role::MtpEmbed(l));
    let embed_t = match own_embed {
        Some(t) => t,
        None => w.get(Role::TokenEmbd)?,
    };
    let head_t = match (w.opt(Role::MtpHead(l)), w.opt(Role::Output), own_embed) {
        (Some(t), _, _) | (None, Some(t), _) => Some(t),
        (None, None, Some(_)) => Some(w.get(Role::TokenEmbd)?),
        (None, None, None) => None,
    };
    Ok(Embedding {
        embed: Some(ops.table(embed_t, head_t.is_none())?),
        out_norm: Some(ops.vector(w.get(Role::MtpSharedNorm(l))?)?),
        output: head_t.map(|t| ops.mat(t)).transpose()?,
        eps: c.rms_eps,
        first: true,
    })
}

/// Builds MTP module 0 of `w` (layer `n_layers`): the llama-family one here, qwen3next's in
/// its file.
pub fn build<O: Ops>(w: &ModelWeights, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    require(w)?;
    if w.config.arch == Arch::Qwen3Next {
        return super::qwen3next_mtp::build(w, ops);
    }
    let c = &w.config;
    ops.require("mtp", &[Feature::Mtp])?;
    let l = c.n_layers;
    let eh = w.get(Role::MtpEhProj(l))?;
    let h = c.hidden;
    Ok(Box::new(Mtp {
        emb: mtp_embedding(ops, w)?,
        enorm: ops.vector(w.get(Role::MtpEnorm(l))?)?,
        hnorm: ops.vector(w.get(Role::MtpHnorm(l))?)?,
        e_proj: ops.mat(&columns(eh, 0, h)?)?,
        h_proj: ops.mat(&columns(eh, h, h)?)?,
        layer: Layer::load(ops, w, l)?,
        acts: Acts::declare(ops, c),
        hin: ops.act("mtp_hidden_in", h, Rows::Step),
        rope: super::blocks::llama_rope(ops, w)?,
        attn: AttnParams::causal(c.n_heads, c.n_kv_heads, c.head_dim),
        eps: c.rms_eps,
    }))
}

impl<O: Ops> Forward<O> for Mtp<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        let (a, h, eps) = (&self.acts, self.hin.width, self.eps);
        self.emb.embed(ops, a.o)?;
        ops.rms_norm(a.o, &self.enorm, a.h, h, eps)?;
        ops.matmul(&self.e_proj, a.h, a.x)?;
        ops.hidden_in(self.hin)?;
        ops.rms_norm(self.hin, &self.hnorm, a.h, h, eps)?;
        ops.matmul(&self.h_proj, a.h, a.o)?;
        ops.add(a.x, a.o)?;
        ops.dump("mtp_in", 0, a.x);
        self.layer
            .forward(ops, a, 0, (self.rope, self.attn, self.eps))?;
        Ok(a.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.emb.head(ops, x, self.acts.head, logits)
    }
}
