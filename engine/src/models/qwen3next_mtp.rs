//! qwen3next's multi-token-prediction module (Qwen3-Next-80B-A3B ships one: HF `mtp.*`,
//! llama.cpp's `blk.N.nextn.*` with N = `n_layers`), the model's own drafter (spec/mtp.rs).
//! As llama.cpp's MTP graph and vLLM's Qwen3-Next MTP: from the target's final hidden state
//! `h_i` (the residual after the last layer, which this module puts through the model's own
//! final norm first: the target hands over its normed state) and the next token `t_{i+1}`,
//!
//! ```text
//! x = fc([pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(norm(h_i))])
//! x = full-attention layer + MoE with the shared expert (the model's layer kind, own KV)
//! logits(t_{i+2}) = head(mtp.norm(x))                     // the model's head
//! ```

use super::mtp::{columns, mtp_embedding};
use super::qwen3next::Qwen3Next;
use super::{Forward, ModelWeights, Role};
use crate::error::Result;
use crate::ops::{Act, Feature, Ops, Rows};

/// MTP module 0 of a qwen3next model on one backend.
struct Qwen3NextMtp<O: Ops> {
    /// Its embedding and head (mtp_embedding), its attention layer, the activations.
    core: Qwen3Next<O>,
    /// The model's final norm: the hidden input is normed as the target's head input.
    out_norm: O::Vector,
    enorm: O::Vector,
    hnorm: O::Vector,
    /// `fc`'s embedding half and hidden half.
    e_proj: O::Mat,
    h_proj: O::Mat,
    hin: Act,
    layer: usize,
    eps: f32,
}

/// Builds MTP module 0 of `w` (layer `n_layers`; models/mtp.rs `build` checked it has one).
pub fn build<O: Ops>(w: &ModelWeights, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    let c = &w.config;
    ops.require("qwen3next mtp", &[Feature::Mtp, Feature::Moe])?;
    let (l, h) = (c.n_layers, c.hidden);
    let emb = mtp_embedding(ops, w)?;
    let core = Qwen3Next::load(ops, w, emb, vec![(l, true)])?;
    let eh = w.get(Role::MtpEhProj(l))?;
    Ok(Box::new(Qwen3NextMtp {
        core,
        out_norm: ops.vector(w.get(Role::OutputNorm)?)?,
        enorm: ops.vector(w.get(Role::MtpEnorm(l))?)?,
        hnorm: ops.vector(w.get(Role::MtpHnorm(l))?)?,
        e_proj: ops.mat(&columns(eh, 0, h)?)?,
        h_proj: ops.mat(&columns(eh, h, h)?)?,
        hin: ops.act("mtp_hidden_in", h, Rows::Step),
        layer: l,
        eps: c.rms_eps,
    }))
}

impl<O: Ops> Forward<O> for Qwen3NextMtp<O> {
    fn body(&self, ops: &mut O) -> Result<Act> {
        let (a, h, eps) = (&self.core.acts, self.hin.width, self.eps);
        self.core.emb.embed(ops, a.o)?;
        ops.rms_norm(a.o, &self.enorm, a.h, h, eps)?;
        ops.matmul(&self.e_proj, a.h, a.x)?;
        ops.hidden_in(self.hin)?;
        ops.rms_norm(self.hin, &self.out_norm, a.h, h, eps)?;
        ops.rms_norm(a.h, &self.hnorm, a.h, h, eps)?;
        ops.matmul(&self.h_proj, a.h, a.o)?;
        ops.add(a.x, a.o)?;
        ops.dump("mtp_in", self.layer, a.x);
        self.core.layer(ops, 0, self.layer)?;
        Ok(a.x)
    }

    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()> {
        self.core.emb.head(ops, x, self.core.acts.head, logits)
    }
}
