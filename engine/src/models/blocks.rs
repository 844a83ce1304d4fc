//! Building blocks shared by the architectures' forward passes (as llama.cpp's `build_attn`,
//! `build_ffn`): the token embedding and output head, a self-attention block and a gated FFN,
//! each with its tensor list, its loading and its ops.

use super::weights::TensorSpec;
use super::{ModelWeights, Role};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::ops::rope::Rope;
use crate::ops::{Act, AttnParams, Glu, KvId, Ops, Residual, RopeId, Rows};

/// The activations of a pre-norm decoder, declared once and shared by every layer.
#[derive(Clone, Copy, Debug)]
pub struct Acts {
    /// The residual stream.
    pub x: Act,
    /// A normed copy of `x` (attention and FFN input).
    pub h: Act,
    pub q: Act,
    pub k: Act,
    pub v: Act,
    /// Attention output, before the output projection.
    pub att: Act,
    /// A block's output (attention or FFN), before the residual add.
    pub o: Act,
    pub gate: Act,
    pub up: Act,
    /// The output norm's rows.
    pub head: Act,
}

impl Acts {
    pub fn declare<O: Ops>(ops: &mut O, c: &ModelConfig) -> Acts {
        let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        Acts {
            x: ops.act("x", c.hidden, Rows::Step),
            h: ops.act("h", c.hidden, Rows::Step),
            q: ops.act("q", qd, Rows::Step),
            k: ops.act("k", kvd, Rows::Step),
            v: ops.act("v", kvd, Rows::Step),
            att: ops.act("att", qd, Rows::Step),
            o: ops.act("o", c.hidden, Rows::Step),
            gate: ops.act("gate", c.ffn, Rows::Step),
            up: ops.act("up", c.ffn, Rows::Step),
            head: ops.act("head_norm", c.hidden, Rows::Head),
        }
    }
}

/// The token embedding, the final norm and the output matrix (the embedding when tied). On a
/// pipeline stage (super::Stage) only the parts the stage uses are loaded.
pub struct Embedding<O: Ops> {
    /// The token table; `None` on a stage that neither embeds nor reads a tied output.
    pub embed: Option<O::Mat>,
    /// The final norm; `None` on a stage before the last.
    pub out_norm: Option<O::Vector>,
    /// `None`: the output shares the embedding.
    pub output: Option<O::Mat>,
    pub eps: f32,
    /// Whether the step's input is its tokens (the first stage); else the previous stage's
    /// residual rows ([`Ops::hidden_in`]).
    pub first: bool,
}

impl<O: Ops> Embedding<O> {
    pub fn load(ops: &mut O, w: &ModelWeights) -> Result<Embedding<O>> {
        Self::load_stage(ops, w, &super::Stage::whole(w.config.n_layers))
    }

    /// The parts stage `s` uses: the table on the first stage (and on the last when the
    /// output is tied to it, uploaded as the unsplit model uploads it), the final norm and
    /// the output matrix on the last.
    pub fn load_stage(ops: &mut O, w: &ModelWeights, s: &super::Stage) -> Result<Embedding<O>> {
        let output = w.opt(Role::Output).filter(|_| s.last());
        let tied = w.opt(Role::Output).is_none();
        let embed = if s.first() || (s.last() && tied) {
            Some(ops.table(w.get(Role::TokenEmbd)?, tied && s.last())?)
        } else {
            None
        };
        let out_norm = match s.last() {
            true => Some(ops.vector(w.get(Role::OutputNorm)?)?),
            false => None,
        };
        Ok(Embedding {
            embed,
            out_norm,
            output: output.map(|t| ops.mat(t)).transpose()?,
            eps: w.config.rms_eps,
            first: s.first(),
        })
    }

    /// The step's token rows into `x` (the first stage), or the previous stage's residual
    /// rows (a later one).
    pub fn embed(&self, ops: &mut O, x: Act) -> Result<()> {
        match (&self.embed, self.first) {
            (Some(t), true) => ops.embed(t, x),
            _ => ops.hidden_in(x),
        }
    }

    /// Final RMSNorm of `x` into `h`, then the output projection into `logits`.
    pub fn head(&self, ops: &mut O, x: Act, h: Act, logits: Act) -> Result<()> {
        let missing = || {
            crate::error::Error::Unsupported(
                "the output head on a pipeline stage before the last".into(),
            )
        };
        let out = self
            .output
            .as_ref()
            .or(self.embed.as_ref())
            .ok_or_else(missing)?;
        let norm = self.out_norm.as_ref().ok_or_else(missing)?;
        ops.norm_matmul(x, norm, self.eps, h, out, logits)
    }
}

/// The llama RoPE table of a config: its theta, llama3 scaling or GGUF frequency factors, and
/// its M-RoPE sections (qwen2vl, qwen3vl).
pub fn llama_rope<O: Ops>(ops: &mut O, w: &ModelWeights) -> Result<RopeId> {
    let c = &w.config;
    let rope = Rope::new(
        c.head_dim,
        c.rope_theta,
        c.rope_scaling,
        w.rope_freq_factors.as_deref(),
    )
    .with_sections(c.vl.map(|v| v.sections));
    ops.rope_table(rope)
}

/// Self-attention of one layer: q/k/v projections (optional biases, optional per-head q/k
/// RMSNorm), RoPE, KV write, causal attention, output projection.
pub struct SelfAttn<O: Ops> {
    /// Q, K and V (one input).
    pub qkv: O::Mats,
    pub out: O::Mat,
    /// q, k, v biases.
    pub bias: Option<[O::Vector; 3]>,
    /// Per-head RMSNorm weights of q and k (before RoPE).
    pub qk_norm: Option<[O::Vector; 2]>,
    pub kv: KvId,
}

impl<O: Ops> SelfAttn<O> {
    /// Loads layer `l`'s attention; biases and q/k norms when the weights have them (the
    /// architecture's tensor list decides).
    pub fn load(ops: &mut O, w: &ModelWeights, l: usize) -> Result<SelfAttn<O>> {
        let c = &w.config;
        let bias = match w.opt(Role::QBias(l)) {
            Some(_) => Some([
                ops.vector(w.get(Role::QBias(l))?)?,
                ops.vector(w.get(Role::KBias(l))?)?,
                ops.vector(w.get(Role::VBias(l))?)?,
            ]),
            None => None,
        };
        let qk_norm = match w.opt(Role::QNorm(l)) {
            Some(_) => Some([
                ops.vector(w.get(Role::QNorm(l))?)?,
                ops.vector(w.get(Role::KNorm(l))?)?,
            ]),
            None => None,
        };
        let qkv = [w.get(Role::Q(l))?, w.get(Role::K(l))?, w.get(Role::V(l))?];
        Ok(SelfAttn {
            qkv: ops.mats(&qkv)?,
            out: ops.mat(w.get(Role::AttnOut(l))?)?,
            bias,
            qk_norm,
            kv: ops.kv_layer(c.n_kv_heads * c.head_dim)?,
        })
    }

    /// Layer `l`'s attention up to its output projection: `a.h = norm(a.x)`, q/k/v (biases,
    /// per-head norms), RoPE and the KV write; attention itself is the caller's (see
    /// [`SelfAttn::forward`]).
    pub fn qkv_rope(&self, ops: &mut O, a: &Acts, l: usize, s: &AttnStep<'_, O>) -> Result<()> {
        let hd = s.params.head_dim;
        ops.norm_matmuls(a.x, s.norm, s.eps, a.h, &self.qkv, &[a.q, a.k, a.v])?;
        ops.dump("attn_norm", l, a.h);
        if let Some([qb, kb, vb]) = &self.bias {
            ops.add_bias(a.q, qb)?;
            ops.add_bias(a.k, kb)?;
            ops.add_bias(a.v, vb)?;
        }
        match &self.qk_norm {
            Some([qn, kn]) => {
                let qkv = (a.q, a.k, a.v);
                ops.qk_norm_rope_kv_write(qkv, [qn, kn], s.eps, s.rope, hd, self.kv)?
            }
            None => ops.rope_kv_write(a.q, a.k, a.v, s.rope, hd, self.kv)?,
        }
        ops.dump("q", l, a.q);
        ops.dump("k", l, a.k);
        ops.dump("v", l, a.v);
        Ok(())
    }

    /// The pre-norm attention block of layer `l`, added into the residual stream:
    /// `a.x += out(attention(qkv_rope(norm(a.x))))` (`a.o` is scratch).
    pub fn forward(&self, ops: &mut O, a: &Acts, l: usize, s: &AttnStep<'_, O>) -> Result<()> {
        self.qkv_rope(ops, a, l, s)?;
        let r = Residual { res: a.x, tmp: a.o };
        ops.attention_matmul_add(self.kv, a.q, a.att, &s.params, &self.out, r)?;
        ops.dump("attn_out", l, a.o);
        Ok(())
    }
}

/// What one attention call needs beyond its weights.
pub struct AttnStep<'a, O: Ops> {
    /// The pre-attention norm.
    pub norm: &'a O::Vector,
    pub eps: f32,
    pub rope: RopeId,
    pub params: AttnParams,
}

/// A gated FFN: `down(act(gate h) * (up h))`.
pub struct GluFfn<O: Ops> {
    /// Gate and up (one input).
    pub gate_up: O::Mats,
    pub down: O::Mat,
}

impl<O: Ops> GluFfn<O> {
    pub fn load(ops: &mut O, w: &ModelWeights, l: usize) -> Result<GluFfn<O>> {
        let (gate, up) = (w.get(Role::Gate(l))?, w.get(Role::Up(l))?);
        Ok(GluFfn {
            gate_up: ops.glu_mats(gate, up)?,
            down: ops.mat(w.get(Role::Down(l))?)?,
        })
    }

    /// The pre-norm FFN block of layer `l`, added into the residual stream:
    /// `a.x += ffn(norm(a.x))` (`a.h` holds the normed input, `a.o` is scratch).
    pub fn forward(
        &self,
        ops: &mut O,
        a: &Acts,
        l: usize,
        norm: &O::Vector,
        eps: f32,
        kind: Glu,
    ) -> Result<()> {
        let r = Residual { res: a.x, tmp: a.o };
        let xn = (a.x, norm, eps, a.h);
        ops.norm_glu_ffn(xn, &self.gate_up, kind, (a.gate, a.up), &self.down, r)?;
        ops.dump("ffn_norm", l, a.h);
        ops.dump("ffn_out", l, a.o);
        Ok(())
    }
}

/// The embedding's tensors, (first, last) in file order: the table; the final norm and the
/// output matrix (optional when embeddings are tied).
pub fn embedding_tensors(c: &ModelConfig) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let first = vec![TensorSpec::matrix(Role::TokenEmbd, c.vocab, c.hidden)];
    let mut output = TensorSpec::matrix(Role::Output, c.vocab, c.hidden);
    output.optional = c.tie_embeddings;
    let last = vec![TensorSpec::norm(Role::OutputNorm, c.hidden), output];
    (first, last)
}

/// The q/k/v projections of layer `l`.
pub fn qkv_tensors(c: &ModelConfig, l: usize) -> [TensorSpec; 3] {
    let (h, kvd) = (c.hidden, c.n_kv_heads * c.head_dim);
    [
        TensorSpec::matrix(Role::Q(l), c.n_heads * c.head_dim, h),
        TensorSpec::matrix(Role::K(l), kvd, h),
        TensorSpec::matrix(Role::V(l), kvd, h),
    ]
}

/// The q/k/v biases of layer `l`.
pub fn qkv_bias_tensors(c: &ModelConfig, l: usize) -> [TensorSpec; 3] {
    let kvd = c.n_kv_heads * c.head_dim;
    [
        TensorSpec::bias(Role::QBias(l), c.n_heads * c.head_dim),
        TensorSpec::bias(Role::KBias(l), kvd),
        TensorSpec::bias(Role::VBias(l), kvd),
    ]
}

/// The per-head q/k norms of layer `l`.
pub fn qk_norm_tensors(c: &ModelConfig, l: usize) -> [TensorSpec; 2] {
    [
        TensorSpec::norm(Role::QNorm(l), c.head_dim),
        TensorSpec::norm(Role::KNorm(l), c.head_dim),
    ]
}

/// The attention output projection of layer `l`.
pub fn attn_out_tensor(c: &ModelConfig, l: usize) -> TensorSpec {
    TensorSpec::matrix(Role::AttnOut(l), c.hidden, c.n_heads * c.head_dim)
}

/// The gate, up and down projections of layer `l`.
pub fn ffn_tensors(c: &ModelConfig, l: usize) -> [TensorSpec; 3] {
    [
        TensorSpec::matrix(Role::Gate(l), c.ffn, c.hidden),
        TensorSpec::matrix(Role::Up(l), c.ffn, c.hidden),
        TensorSpec::matrix(Role::Down(l), c.hidden, c.ffn),
    ]
}
