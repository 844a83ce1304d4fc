//! ModelWeights: the tensors of a model by role, as its architecture lists them
//! ([`TensorSpec`]s from `ArchDef::tensors`), with shapes checked against the config.

use std::collections::BTreeMap;

use super::{Role, def};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::DType;
use crate::weights::{Bytes, Tensor};

/// What a tensor is for (how synthetic models initialise it; how backends upload it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A weight matrix `[out_features, in_features]` (or the embedding table), or a stack of
    /// them `[n_experts, out_features, in_features]`.
    Matrix,
    /// A norm weight (values near 1).
    Norm,
    /// A bias vector (or another small vector of values near 0).
    Bias,
    /// A negative decay coefficient per head (values near -1: gated DeltaNet's `ssm_a`).
    Decay,
}

/// One tensor an architecture expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub role: Role,
    /// Outermost first (HF order).
    pub shape: Vec<usize>,
    pub kind: Kind,
    /// May be absent (the output matrix of a model with tied embeddings).
    pub optional: bool,
}

impl TensorSpec {
    pub fn matrix(role: Role, rows: usize, cols: usize) -> TensorSpec {
        TensorSpec {
            role,
            shape: vec![rows, cols],
            kind: Kind::Matrix,
            optional: false,
        }
    }

    /// A stack of `n` expert matrices `[n, rows, cols]` (expert-major, each as [`Self::matrix`]).
    pub fn experts(role: Role, n: usize, rows: usize, cols: usize) -> TensorSpec {
        TensorSpec {
            role,
            shape: vec![n, rows, cols],
            kind: Kind::Matrix,
            optional: false,
        }
    }

    pub fn norm(role: Role, n: usize) -> TensorSpec {
        TensorSpec {
            role,
            shape: vec![n],
            kind: Kind::Norm,
            optional: false,
        }
    }

    pub fn decay(role: Role, n: usize) -> TensorSpec {
        TensorSpec {
            role,
            shape: vec![n],
            kind: Kind::Decay,
            optional: false,
        }
    }

    pub fn bias(role: Role, n: usize) -> TensorSpec {
        TensorSpec {
            role,
            shape: vec![n],
            kind: Kind::Bias,
            optional: false,
        }
    }
}

/// All tensors of a model, by role (HF row order for q/k).
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    tensors: BTreeMap<Role, Tensor>,
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

impl ModelWeights {
    /// Collects and checks every tensor the architecture lists, in its order.
    pub fn build(config: &ModelConfig, src: &mut dyn TensorSource) -> Result<ModelWeights> {
        let arch = config.arch;
        let mut tensors = BTreeMap::new();
        for spec in (def(arch).tensors)(config) {
            let Some(t) = src.get(spec.role)? else {
                if spec.optional {
                    continue;
                }
                return Err(Error::Weights(format!(
                    "missing tensor `{}` / `{}`",
                    spec.role.gguf_name(),
                    spec.role.hf_name(arch)
                )));
            };
            if t.shape != spec.shape {
                return Err(Error::Weights(format!(
                    "tensor `{}` has shape {:?}, expected {:?}",
                    t.name, t.shape, spec.shape
                )));
            }
            tensors.insert(spec.role, t);
        }
        Ok(ModelWeights {
            config: config.clone(),
            tensors,
            rope_freq_factors: None,
        })
    }

    /// The tensor of `role`; an error naming it when the model has none.
    pub fn get(&self, role: Role) -> Result<&Tensor> {
        self.tensors.get(&role).ok_or_else(|| {
            Error::Weights(format!(
                "missing tensor `{}` / `{}`",
                role.gguf_name(),
                role.hf_name(self.config.arch)
            ))
        })
    }

    /// The tensor of `role`, if the model has one.
    pub fn opt(&self, role: Role) -> Option<&Tensor> {
        self.tensors.get(&role)
    }

    /// Every tensor with its role.
    pub fn iter(&self) -> impl Iterator<Item = (Role, &Tensor)> {
        self.tensors.iter().map(|(r, t)| (*r, t))
    }

    /// A copy with every tensor replaced by `f(tensor)` (same roles).
    pub fn map_tensors(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    ) -> Result<ModelWeights> {
        let mut out = self.clone();
        for t in out.tensors.values_mut() {
            *t = f(t)?;
        }
        Ok(out)
    }

    /// For a backend without products of the [`DType::HF_ONLY`] types (FP8, NVFP4): a copy in
    /// which each such tensor is dequantized (exactly, `Tensor::to_f32`) and stored as F16, or as
    /// BF16 when one of its values is beyond F16's largest finite value (65504); `None` when the
    /// model has no such tensor. The choice depends only on the tensor's values, so a model
    /// always runs the same products.
    pub fn dequantize_hf_only(&self) -> Result<Option<ModelWeights>> {
        if !self
            .tensors
            .values()
            .any(|t| DType::HF_ONLY.contains(&t.dtype))
        {
            return Ok(None);
        }
        self.map_tensors(&mut |t: &Tensor| {
            if !DType::HF_ONLY.contains(&t.dtype) {
                return Ok(t.clone());
            }
            widen_to_float(t)
        })
        .map(Some)
    }

    /// Bytes of all weight tensors.
    pub fn nbytes(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// The weight bytes one batch-1 decode token reads (plain decoding, no drafter), from the
    /// stored tensors whatever the backend makes of them: every tensor's bytes, except that an
    /// expert stack `[n_experts, rows, cols]` counts the `n_used` experts a token is routed to
    /// (`n_used / n_experts` of its bytes; a shared expert and the router count whole), the
    /// token embedding counts the one row a token looks up, the output head counts whole (the
    /// embedding table when tied), and the MTP layers (past `n_layers`, read only by a drafter)
    /// count nothing. The roofline's numerator: memra-bench's `weight_bytes_per_token`.
    pub fn decode_read_bytes(&self) -> usize {
        let c = &self.config;
        let mut bytes = 0;
        for (role, t) in self.iter() {
            bytes += match role {
                _ if role.layer().is_some_and(|l| l >= c.n_layers) => 0,
                Role::TokenEmbd => t.row_bytes(),
                _ if role.is_experts() => match c.moe {
                    Some(m) if m.n_experts > 0 => t.data.len() / m.n_experts * m.n_used,
                    _ => t.data.len(),
                },
                _ => t.data.len(),
            };
        }
        // A tied head is the embedding table, read whole.
        if self.opt(Role::Output).is_none() {
            bytes += self.opt(Role::TokenEmbd).map_or(0, |t| t.data.len());
        }
        bytes
    }
}

/// A checkpoint-type (FP8, NVFP4) tensor as F16 of its exact values, or BF16 when one is beyond
/// F16's range (what the CUDA backend uploads and `memra-bench convert --to gguf` writes).
pub fn widen_to_float(t: &Tensor) -> Result<Tensor> {
    let (to, data) = widen(t)?;
    Tensor::new(t.name.clone(), to, t.shape.clone(), Bytes::owned(data))
}

/// [`widen_to_float`]'s type and bytes; rows split over the host's cores (each chunk's bytes
/// do not depend on the split).
fn widen(t: &Tensor) -> Result<(DType, Vec<u8>)> {
    let (rows, cols) = t.rows_cols();
    let rb = t.row_bytes();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16);
    let per = rows.div_ceil(threads).max(1);
    let convert = |to: DType| -> Result<Vec<Option<Vec<u8>>>> {
        std::thread::scope(|s| {
            let jobs: Vec<_> = t
                .data
                .chunks(per * rb)
                .map(|src| {
                    s.spawn(move || -> Result<Option<Vec<u8>>> {
                        let mut v = vec![0f32; src.len() / rb * cols];
                        crate::quant::dequantize_row(t.dtype, src, &mut v)?;
                        if to == DType::F16 && v.iter().any(|x| x.abs() > 65504.0) {
                            return Ok(None);
                        }
                        crate::quant::quantize(to, &v).map(Some)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join().map_err(|_| {
                        Error::Weights(format!("{}: a widening thread panicked", t.name))
                    })?
                })
                .collect()
        })
    };
    let f16 = convert(DType::F16)?;
    if f16.iter().all(Option::is_some) {
        return Ok((DType::F16, f16.into_iter().flatten().flatten().collect()));
    }
    let bf16 = convert(DType::BF16)?;
    Ok((DType::BF16, bf16.into_iter().flatten().flatten().collect()))
}
