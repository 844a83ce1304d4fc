//! Architectures: one file per architecture (its tensor names, its tensor list, its config keys
//! and its forward pass over the op interface, ops/mod.rs), and the registry below.
//!
//! Internal layout is the Hugging Face one: q/k rows in HF order, RoPE by half rotation (NeoX).
//! GGUF llama files store q/k rows permuted for adjacent-pair RoPE; the loader un-permutes them
//! (qk_order.rs), so GGUF and HF copies of a model give identical weights.
//!
//! Adding an architecture: a new `<arch>.rs` with its `DEF` and `build`, a variant of [`Arch`],
//! and one line in each of [`def`] and [`build`]; plus any op it newly needs.

pub mod blocks;
pub mod gemma3;
pub mod llama;
pub mod llama_postnorm;
pub mod mtp;
pub mod qk_order;
pub mod qwen2;
pub mod qwen2vl;
pub mod qwen3;
pub mod qwen3_moe;
pub mod qwen3next;
pub mod qwen3next_mtp;
pub mod qwen3vl;
#[cfg(any(test, feature = "test-util"))]
pub mod random;
pub mod roles;
pub mod weights;

use serde::{Deserialize, Serialize};

pub use qk_order::{gguf_permuted, permute_qk_rows, qk_to_gguf, qk_to_hf, unpermute_qk_rows};
pub use roles::Role;
pub use weights::{Kind, ModelWeights, TensorSource, TensorSpec};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::ops::{self, Act, Ops};

/// Supported architectures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    LlamaPostNorm,
    Gemma3,
    Qwen3Moe,
    Qwen3Next,
    Qwen2Vl,
    Qwen3Vl,
}

/// What the code outside an architecture's file needs to know about it.
pub struct ArchDef {
    pub arch: Arch,
    /// GGUF `general.architecture` (also the prefix of its metadata keys).
    pub gguf_name: &'static str,
    /// HF `architectures[0]`.
    pub hf_class: &'static str,
    /// GGUF files store q/k rows permuted for adjacent-pair RoPE (llama.cpp's llama converter).
    pub gguf_qk_permuted: bool,
    /// Added to every norm weight of an HF checkpoint to give the internal (GGUF) weight
    /// (Gemma's `1 + w`, which llama.cpp's converter folds into the GGUF).
    pub hf_norm_offset: f32,
    /// The chat template used when a file carries none (e.g. a base model's GGUF).
    pub chat_template: Option<&'static str>,
    /// Layer tensor names: (GGUF suffix, HF suffix).
    pub layer_names: &'static [(&'static str, &'static str)],
    /// Every tensor of a model of a config, in file order.
    pub tensors: fn(&ModelConfig) -> Vec<TensorSpec>,
    /// Sets this architecture's own keys of an HF `config.json` written for a config.
    pub hf_config: fn(&ModelConfig, &mut serde_json::Value),
    /// The internal tensor of a role whose HF tensor is not the role's HF name as it stands
    /// (split, reshaped, transformed or renamed: qwen3next); `Ok(None)` for the default
    /// mapping. Asked before the default, expert stacks included.
    pub hf_tensor: Option<HfTensorFn>,
}

/// See [`ArchDef::hf_tensor`]: `Ok(Some(None))` is a missing tensor.
pub type HfTensorFn = fn(
    &crate::formats::safetensors::HfModel,
    &ModelConfig,
    Role,
) -> Result<Option<Option<crate::weights::Tensor>>>;

/// Every architecture, in registry order.
pub const ARCHS: [&ArchDef; 9] = [
    &llama::DEF,
    &qwen2::DEF,
    &qwen3::DEF,
    &llama_postnorm::DEF,
    &gemma3::DEF,
    &qwen3_moe::DEF,
    &qwen3next::DEF,
    &qwen2vl::DEF,
    &qwen3vl::DEF,
];

/// The definition of `arch`.
pub fn def(arch: Arch) -> &'static ArchDef {
    match arch {
        Arch::Llama => &llama::DEF,
        Arch::Qwen2 => &qwen2::DEF,
        Arch::Qwen3 => &qwen3::DEF,
        Arch::LlamaPostNorm => &llama_postnorm::DEF,
        Arch::Gemma3 => &gemma3::DEF,
        Arch::Qwen3Moe => &qwen3_moe::DEF,
        Arch::Qwen3Next => &qwen3next::DEF,
        Arch::Qwen2Vl => &qwen2vl::DEF,
        Arch::Qwen3Vl => &qwen3vl::DEF,
    }
}

/// An architecture's forward pass, built on one backend's ops.
pub trait Forward<O: Ops>: Send {
    /// The embedding and every layer over the step's rows; returns the residual stream.
    fn body(&self, ops: &mut O) -> Result<Act>;
    /// The output head: `x` (step rows, or head rows) into `logits` (head rows).
    fn head(&self, ops: &mut O, x: Act, logits: Act) -> Result<()>;
    /// Whether the body injects given embeddings into its input rows (`Ops::inject`): an
    /// architecture with a vision tower (gemma3, qwen2, qwen3, qwen2vl, qwen3vl). Others
    /// refuse steps that carry embeddings.
    fn takes_embeds(&self) -> bool {
        false
    }
}

/// A function building a forward pass of weights on a backend's ops ([`build`], [`mtp::build`]).
pub type BuildFn<O> = fn(&ModelWeights, &mut O) -> Result<Box<dyn Forward<O>>>;

/// The decoder layers one pipeline stage runs (crate::pipeline), in model numbering. The first
/// stage (layers from 0) embeds the step's tokens; a later one reads the previous stage's
/// residual rows through [`Ops::hidden_in`]. Only the last stage (layers up to `n_layers`)
/// loads the final norm and the output matrix and runs the head. An unsplit model is one
/// stage holding every layer ([`Stage::whole`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub layers: std::ops::Range<usize>,
    /// The model's decoder layers.
    pub n_layers: usize,
}

impl Stage {
    /// Every layer of a model of `n_layers`.
    pub fn whole(n_layers: usize) -> Stage {
        Stage {
            layers: 0..n_layers,
            n_layers,
        }
    }

    /// Whether the stage embeds the tokens (it holds layer 0).
    pub fn first(&self) -> bool {
        self.layers.start == 0
    }

    /// Whether the stage runs the output head (it holds the last layer).
    pub fn last(&self) -> bool {
        self.layers.end == self.n_layers
    }

    /// Refuses a stage that is empty or reaches past the model's layers.
    pub fn check(&self) -> Result<()> {
        if self.layers.start >= self.layers.end || self.layers.end > self.n_layers {
            return Err(Error::Input(format!(
                "pipeline stage of layers {}..{}: a stage needs at least one of the model's {} \
                 layers",
                self.layers.start, self.layers.end, self.n_layers
            )));
        }
        Ok(())
    }
}

/// Uploads `w` to `ops` and returns its architecture's forward pass.
pub fn build<O: Ops>(w: &ModelWeights, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    build_stage(w, &Stage::whole(w.config.n_layers), ops)
}

/// Uploads the tensors of pipeline stage `stage` of `w` to `ops` (its layers; the embedding
/// table on the first stage; the final norm and output matrix on the last) and returns the
/// stage's forward pass: its body ends with the residual stream after its last layer.
pub fn build_stage<O: Ops>(
    w: &ModelWeights,
    stage: &Stage,
    ops: &mut O,
) -> Result<Box<dyn Forward<O>>> {
    stage.check()?;
    if stage.n_layers != w.config.n_layers {
        return Err(Error::Input(format!(
            "pipeline stage planned for {} layers, the model has {}",
            stage.n_layers, w.config.n_layers
        )));
    }
    if !stage.first() {
        ops.require("a pipeline stage after the first", &[ops::Feature::Mtp])?;
    }
    match w.config.arch {
        Arch::Llama => llama::build(w, stage, ops),
        Arch::Qwen2 => qwen2::build(w, stage, ops),
        Arch::Qwen3 => qwen3::build(w, stage, ops),
        Arch::LlamaPostNorm => llama_postnorm::build(w, stage, ops),
        Arch::Gemma3 => gemma3::build(w, stage, ops),
        Arch::Qwen3Moe => qwen3_moe::build(w, stage, ops),
        Arch::Qwen3Next => qwen3next::build(w, stage, ops),
        Arch::Qwen2Vl => qwen2vl::build(w, stage, ops),
        Arch::Qwen3Vl => qwen3vl::build(w, stage, ops),
    }
}

/// What to add to an HF tensor of `role` to get memra's internal (GGUF) values:
/// [`ArchDef::hf_norm_offset`] for the architecture's norm weights, 0 otherwise.
pub fn hf_offset(c: &ModelConfig, role: Role) -> f32 {
    let d = def(c.arch);
    // A DeltaNet output's gated norm is stored plain where the others are zero-centred.
    if d.hf_norm_offset == 0.0 || matches!(role, Role::SsmNorm(_)) {
        return 0.0;
    }
    let norm = (d.tensors)(c)
        .iter()
        .any(|s| s.role == role && s.kind == Kind::Norm);
    if norm { d.hf_norm_offset } else { 0.0 }
}

fn supported(name: fn(&ArchDef) -> &'static str) -> String {
    ARCHS.iter().map(|d| name(d)).collect::<Vec<_>>().join(", ")
}

impl Arch {
    /// Whether the architecture's FFNs are mixtures of experts ([`ModelConfig::moe`]).
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen3Next)
    }

    /// Whether the architecture has gated DeltaNet layers with a recurrent state per sequence
    /// ([`ModelConfig::hybrid`], crate::backend::state).
    pub fn is_recurrent(self) -> bool {
        self == Arch::Qwen3Next
    }

    /// Whether the architecture is a Qwen-VL text model with M-RoPE ([`ModelConfig::vl`]).
    pub fn is_vl(self) -> bool {
        matches!(self, Arch::Qwen2Vl | Arch::Qwen3Vl)
    }

    /// The GGUF `general.architecture` name.
    pub fn gguf_name(self) -> &'static str {
        def(self).gguf_name
    }

    pub fn from_gguf_name(s: &str) -> Result<Arch> {
        match ARCHS.iter().find(|d| d.gguf_name == s) {
            Some(d) => Ok(d.arch),
            None => Err(Error::Unsupported(format!(
                "architecture `{s}` (supported: {})",
                supported(|d| d.gguf_name)
            ))),
        }
    }

    /// The HF `architectures[0]` class name.
    pub fn hf_class(self) -> &'static str {
        def(self).hf_class
    }

    pub fn from_hf_class(s: &str) -> Result<Arch> {
        match ARCHS.iter().find(|d| d.hf_class == s) {
            Some(d) => Ok(d.arch),
            None => Err(Error::Unsupported(format!(
                "architecture `{s}` (supported: {})",
                supported(|d| d.hf_class)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_consistent() {
        for d in ARCHS {
            // By value: references to one `const` need not share an address (promotion is
            // per use site), so pointer identity depends on codegen.
            let got = def(d.arch);
            assert_eq!(
                (got.arch, got.gguf_name, got.hf_class),
                (d.arch, d.gguf_name, d.hf_class)
            );
            assert_eq!(Arch::from_gguf_name(d.gguf_name).unwrap(), d.arch);
            assert_eq!(Arch::from_hf_class(d.hf_class).unwrap(), d.arch);
        }
        assert!(Arch::from_gguf_name("gpt2").is_err());
    }
}
