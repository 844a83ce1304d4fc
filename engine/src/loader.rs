//! Opens a model path: a GGUF file (or the first part of a split GGUF) or an HF safetensors folder.
//! Produces the config, the weights in memra's internal (HF) layout, the tokenizer and the chat
//! template.

use std::path::{Path, PathBuf};

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::formats::gguf::Gguf;
use crate::formats::safetensors::HfModel;
use crate::models::roles::expert_name;
use crate::models::{ModelWeights, Role, def, gguf_permuted, hf_offset, qk_to_hf};
use crate::quant::DType;
use crate::tokenizer::Tokenizer;
use crate::weights::{Bytes, Tensor};

/// A loaded model, ready to hand to a backend.
pub struct Model {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
}

/// Un-permutes a GGUF llama q/k tensor (weight rows or bias values) into HF order.
fn unpermute(t: Tensor, head_dim: usize) -> Result<Tensor> {
    let data = qk_to_hf(&t.data, &t.shape, t.dtype, head_dim)
        .map_err(|e| Error::Weights(format!("{}: {e}", t.name)))?;
    Tensor::new(t.name, t.dtype, t.shape, Bytes::owned(data))
}

/// Refuses a layer count the file's tensors cannot back, before the tensor list (about ten
/// entries per layer) is built from it: a claimed `block_count` of 2^24 would otherwise cost
/// gigabytes before the first missing tensor is noticed.
fn check_layers(config: &ModelConfig, n_tensors: usize) -> Result<()> {
    if config.n_layers > n_tensors {
        return Err(Error::Config(format!(
            "the config claims {} layers but the model holds only {n_tensors} tensors",
            config.n_layers
        )));
    }
    Ok(())
}

/// Refuses a tokenizer that can produce ids past the embedding's rows (llama.cpp refuses the
/// same mismatch): such ids would fail every request that contains them.
fn check_vocab(tokenizer: &Tokenizer, config: &ModelConfig) -> Result<()> {
    let rows = config.vocab;
    if tokenizer.vocab_size() > rows {
        return Err(Error::Tokenizer(format!(
            "the tokenizer has {} tokens but the model's embedding has {rows} rows",
            tokenizer.vocab_size()
        )));
    }
    let specials = [tokenizer.bos_id(), tokenizer.eos_id()];
    let mut ids = specials
        .into_iter()
        .flatten()
        .chain(tokenizer.stop_ids().iter().copied());
    if let Some(id) = ids.find(|&id| id as usize >= rows) {
        return Err(Error::Tokenizer(format!(
            "special token id {id} is outside the model's {rows} embedding rows"
        )));
    }
    Ok(())
}

/// Config and weights of a GGUF model.
pub fn gguf_weights(g: &Gguf) -> Result<ModelWeights> {
    let config = ModelConfig::from_gguf(g)?;
    check_layers(&config, g.tensors().len())?;
    let hd = config.head_dim;
    let mut get = |role: Role| -> Result<Option<Tensor>> {
        let Some(t) = g.tensor(&role.gguf_name()) else {
            return Ok(None);
        };
        if gguf_permuted(config.arch, role) {
            return unpermute(t, hd).map(Some);
        }
        Ok(Some(t))
    };
    let mut w = ModelWeights::build(&config, &mut get)?;
    if let Some(f) = g.tensor("rope_freqs.weight") {
        let v = f.to_f32()?;
        if v.len() != hd / 2 {
            return Err(Error::Weights(format!(
                "rope_freqs.weight has {} values, expected {}",
                v.len(),
                hd / 2
            )));
        }
        w.rope_freq_factors = Some(v);
    }
    Ok(w)
}

/// `t + offset` in F32 (an HF norm weight into the internal one, [`hf_offset`]).
fn offset(t: Tensor, offset: f32) -> Result<Tensor> {
    let data: Vec<u8> = t
        .to_f32()?
        .into_iter()
        .flat_map(|v| (v + offset).to_le_bytes())
        .collect();
    Tensor::new(t.name, DType::F32, t.shape, Bytes::owned(data))
}

/// The `[n, rows, cols]` stack of a stacked-experts role from an HF folder's per-expert 2-D
/// tensors (`...experts.{e}...`); `None` when expert 0 is absent. Every expert must be there,
/// 2-D, of one type and shape.
pub fn hf_expert_stack(m: &HfModel, stack: &str, n: usize) -> Result<Option<Tensor>> {
    let mut data = Vec::new();
    let mut first: Option<Tensor> = None;
    for e in 0..n {
        let name = expert_name(stack, e);
        let t = match (m.tensor(&name)?, e) {
            (Some(t), _) => t,
            (None, 0) => return Ok(None),
            (None, _) => return Err(Error::Weights(format!("missing tensor `{name}`"))),
        };
        if let Some(f) = &first
            && (t.dtype != f.dtype || t.shape != f.shape)
        {
            return Err(Error::Weights(format!(
                "`{name}` is {} {:?}, expert 0 is {} {:?}",
                t.dtype, t.shape, f.dtype, f.shape
            )));
        }
        if t.shape.len() != 2 {
            return Err(Error::Weights(format!(
                "`{name}` has shape {:?}, expected a matrix",
                t.shape
            )));
        }
        data.extend_from_slice(&t.data);
        first.get_or_insert(t);
    }
    let Some(f) = first else { return Ok(None) };
    let shape = vec![n, f.shape[0], f.shape[1]];
    Tensor::new(stack, f.dtype, shape, Bytes::owned(data)).map(Some)
}

/// Config and weights of an HF safetensors folder.
pub fn hf_weights(m: &HfModel) -> Result<ModelWeights> {
    let config = m.config.clone();
    check_layers(&config, m.tensor_names().len())?;
    let experts = config.moe.map_or(0, |p| p.n_experts);
    let mut get = |role: Role| -> Result<Option<Tensor>> {
        if let Some(f) = def(config.arch).hf_tensor
            && let Some(t) = f(m, &config, role)?
        {
            return Ok(t);
        }
        if role.is_experts() {
            return hf_expert_stack(m, &role.hf_name(config.arch), experts);
        }
        let t = m.tensor(&role.hf_name(config.arch))?;
        match (t, hf_offset(&config, role)) {
            (Some(t), off) if off != 0.0 => offset(t, off).map(Some),
            (t, _) => Ok(t),
        }
    };
    ModelWeights::build(&config, &mut get)
}

/// The architecture's built-in chat template, for files that carry none.
fn builtin_template(c: &ModelConfig, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
    match def(c.arch).chat_template {
        Some(src) => ChatTemplate::with_tokenizer(src, tok).map(Some),
        None => Ok(None),
    }
}

/// Opens a GGUF file or HF folder with its tokenizer and chat template.
pub fn load_model(path: &Path) -> Result<Model> {
    if path.is_dir() {
        let m = HfModel::open(path)?;
        let weights = hf_weights(&m)?;
        let tj = m
            .tokenizer_json()
            .ok_or_else(|| Error::Tokenizer(format!("{} has no tokenizer.json", path.display())))?;
        let tokenizer = Tokenizer::from_hf_files(&tj, m.tokenizer_config_json().as_deref())?;
        check_vocab(&tokenizer, &weights.config)?;
        let chat = match ChatTemplate::from_hf_dir(path, &tokenizer)? {
            Some(t) => Some(t),
            None => builtin_template(&weights.config, &tokenizer)?,
        };
        Ok(Model {
            path: path.to_path_buf(),
            config: weights.config.clone(),
            weights,
            tokenizer,
            chat,
        })
    } else if path.exists() {
        let g = Gguf::open(path)?;
        let weights = gguf_weights(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        check_vocab(&tokenizer, &weights.config)?;
        let chat = match ChatTemplate::from_gguf(&g, &tokenizer)? {
            Some(t) => Some(t),
            None => builtin_template(&weights.config, &tokenizer)?,
        };
        Ok(Model {
            path: path.to_path_buf(),
            config: weights.config.clone(),
            weights,
            tokenizer,
            chat,
        })
    } else {
        Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such model file or folder"),
        ))
    }
}

/// Opens just the weights of a GGUF file or HF folder (no tokenizer).
pub fn load_weights(path: &Path) -> Result<ModelWeights> {
    if path.is_dir() {
        hf_weights(&HfModel::open(path)?)
    } else {
        gguf_weights(&Gguf::open(path)?)
    }
}
