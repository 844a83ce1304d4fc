//! ModelWeights: the tensors of a decoder-only model, by role, with shapes checked against the config.

use super::{ArchSpec, Role};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::weights::Tensor;

/// One decoder layer's tensors (HF row order for q/k).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub q_bias: Option<Tensor>,
    pub k_bias: Option<Tensor>,
    pub v_bias: Option<Tensor>,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub attn_out: Tensor,
    pub ffn_norm: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// All tensors of a model. `output` is the token embedding when embeddings are tied.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    pub spec: ArchSpec,
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Tensor,
    pub output: Tensor,
    /// Per-dimension RoPE frequency divisors (GGUF `rope_freqs.weight`, llama3 scaling), if any.
    pub rope_freq_factors: Option<Vec<f32>>,
}

/// Where the loader finds a role's tensor (already in HF row order).
pub trait TensorSource {
    fn get(&mut self, role: Role) -> Result<Option<Tensor>>;
}

impl<F: FnMut(Role) -> Result<Option<Tensor>>> TensorSource for F {
    fn get(&mut self, role: Role) -> Result<Option<Tensor>> {
        self(role)
    }
}

fn expect_shape(t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape != shape {
        return Err(Error::Weights(format!(
            "tensor `{}` has shape {:?}, expected {:?}",
            t.name, t.shape, shape
        )));
    }
    Ok(())
}

fn required(src: &mut dyn TensorSource, role: Role, shape: &[usize]) -> Result<Tensor> {
    let t = src.get(role)?.ok_or_else(|| {
        Error::Weights(format!(
            "missing tensor `{}` / `{}`",
            role.gguf_name(),
            role.hf_name()
        ))
    })?;
    expect_shape(&t, shape)?;
    Ok(t)
}

fn optional(
    src: &mut dyn TensorSource,
    role: Role,
    shape: &[usize],
    want: bool,
) -> Result<Option<Tensor>> {
    if !want {
        return Ok(None);
    }
    required(src, role, shape).map(Some)
}

impl ModelWeights {
    /// Collects and checks every tensor the architecture needs.
    pub fn build(
        config: &ModelConfig,
        spec: ArchSpec,
        src: &mut dyn TensorSource,
    ) -> Result<ModelWeights> {
        let c = config;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let embed = required(src, Role::TokenEmbd, &[c.vocab, h])?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            layers.push(LayerWeights {
                attn_norm: required(src, Role::AttnNorm(l), &[h])?,
                q: required(src, Role::Q(l), &[qd, h])?,
                k: required(src, Role::K(l), &[kvd, h])?,
                v: required(src, Role::V(l), &[kvd, h])?,
                q_bias: optional(src, Role::QBias(l), &[qd], spec.qkv_bias)?,
                k_bias: optional(src, Role::KBias(l), &[kvd], spec.qkv_bias)?,
                v_bias: optional(src, Role::VBias(l), &[kvd], spec.qkv_bias)?,
                q_norm: optional(src, Role::QNorm(l), &[hd], spec.qk_norm)?,
                k_norm: optional(src, Role::KNorm(l), &[hd], spec.qk_norm)?,
                attn_out: required(src, Role::AttnOut(l), &[h, qd])?,
                ffn_norm: required(src, Role::FfnNorm(l), &[h])?,
                gate: required(src, Role::Gate(l), &[c.ffn, h])?,
                up: required(src, Role::Up(l), &[c.ffn, h])?,
                down: required(src, Role::Down(l), &[h, c.ffn])?,
            });
        }
        let out_norm = required(src, Role::OutputNorm, &[h])?;
        let output = match src.get(Role::Output)? {
            Some(t) => {
                expect_shape(&t, &[c.vocab, h])?;
                t
            }
            None if c.tie_embeddings => embed.clone(),
            None => {
                return Err(Error::Weights(
                    "missing tensor `output.weight` / `lm_head.weight`".into(),
                ));
            }
        };
        Ok(ModelWeights {
            config: config.clone(),
            spec,
            embed,
            layers,
            out_norm,
            output,
            rope_freq_factors: None,
        })
    }

    /// Bytes of all weight tensors (the output counted once when tied).
    pub fn nbytes(&self) -> usize {
        let mut n = self.embed.data.len() + self.out_norm.data.len();
        if !self.config.tie_embeddings {
            n += self.output.data.len();
        }
        for l in &self.layers {
            let ts = [
                &l.attn_norm,
                &l.q,
                &l.k,
                &l.v,
                &l.attn_out,
                &l.ffn_norm,
                &l.gate,
                &l.up,
                &l.down,
            ];
            n += ts.iter().map(|t| t.data.len()).sum::<usize>();
            let opt = [&l.q_bias, &l.k_bias, &l.v_bias, &l.q_norm, &l.k_norm];
            n += opt
                .iter()
                .filter_map(|t| t.as_ref())
                .map(|t| t.data.len())
                .sum::<usize>();
        }
        n
    }
}
