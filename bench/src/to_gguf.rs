//! `memra-bench convert --to gguf`: an HF folder (F32/F16/BF16) to a GGUF file. Tensors keep
//! their type; llama q/k rows are permuted into llama.cpp's order. The tokenizer metadata can be
//! copied from a GGUF (`--tokenizer-from`), since tokenizer.json holds no GGUF pre-tokenizer name.

use std::path::PathBuf;
use std::time::Instant;

use memra_engine::error::{Error, Result};
use memra_engine::formats::safetensors::{HfModel, quantized};
use memra_engine::loader::hf_expert_stack;
use memra_engine::models::weights::widen_to_float;
use memra_engine::models::{Role, gguf_permuted, hf_offset, qk_to_gguf};
use memra_engine::quant::DType;
use memra_engine::weights::Tensor;

use crate::convert::ConvertReport;
use crate::plan::SynthDType;
use crate::sink::{GgufDecl, gguf_sink};
use crate::synth::{TokenizerSource, gguf_metadata, load_tokenizer, stream_tensors};

/// Arguments of `convert --to gguf`.
#[derive(Clone, Debug)]
pub struct ToGgufArgs {
    pub input: PathBuf,
    pub out: PathBuf,
    pub tokenizer_from: Option<PathBuf>,
    pub progress: bool,
}

/// Converts an HF folder into a GGUF file.
pub fn convert_hf_to_gguf(args: &ToGgufArgs) -> Result<ConvertReport> {
    let start = Instant::now();
    let m = HfModel::open(&args.input)?;
    let cfg = m.config.clone();
    if cfg.arch == memra_engine::config::Arch::Qwen3Next {
        return hybrid_to_gguf(args, start);
    }
    let mut jobs: Vec<(String, Role)> = Vec::new();
    for name in m.tensor_names() {
        // A quantized checkpoint's scales come with their weights (formats/safetensors/quantized.rs).
        if m.scheme.is_some() && quantized::is_scale(&name) {
            continue;
        }
        // One tensor per expert: the stack is read (and written) once, at expert 0.
        let (name, role) = match Role::from_hf_expert_name(&name, cfg.arch) {
            Some((role, 0)) => (role.hf_name(cfg.arch), role),
            Some(_) => continue,
            None => match Role::from_hf_name(&name, cfg.arch) {
                Some(role) => (name, role),
                None => {
                    return Err(Error::Unsupported(format!(
                        "HF tensor `{name}` has no GGUF equivalent"
                    )));
                }
            },
        };
        if role == Role::Output && cfg.tie_embeddings {
            continue; // tied: GGUF marks it by leaving output.weight out
        }
        jobs.push((name, role));
    }
    if !cfg.tie_embeddings && !jobs.iter().any(|(_, r)| *r == Role::Output) {
        return Err(Error::Weights("untied model without lm_head.weight".into()));
    }
    let mut decls = Vec::with_capacity(jobs.len());
    let mut file_type = SynthDType::F32;
    let experts = cfg.moe.map_or(0, |p| p.n_experts);
    let read = |name: &str, role: Role| -> Result<Tensor> {
        let t = match role.is_experts() {
            true => hf_expert_stack(&m, name, experts)?,
            false => m.tensor(name)?,
        };
        let t = t.ok_or_else(|| Error::Weights(format!("`{name}` vanished")))?;
        // FP8 / NVFP4 have no GGUF type: written as F16 of their exact values (BF16 past
        // F16's range), as the CUDA backend uploads them.
        match DType::HF_ONLY.contains(&t.dtype) {
            true => widen_to_float(&t),
            false => Ok(t),
        }
    };
    for (name, role) in &jobs {
        let t = read(name, *role)?;
        if t.shape.len() == 2 && *role != Role::TokenEmbd {
            file_type = match t.dtype {
                DType::F16 => SynthDType::F16,
                DType::BF16 => SynthDType::BF16,
                _ => SynthDType::F32,
            };
        }
        decls.push(GgufDecl {
            name: role.gguf_name(),
            // Norms that gain an offset (Gemma's 1 + w) are written as F32.
            dtype: if hf_offset(&cfg, *role) != 0.0 {
                DType::F32
            } else {
                t.dtype
            },
            dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
        });
    }
    let meta = gguf_meta(args, &cfg, file_type)?;
    let sink = gguf_sink(&args.out, meta, &decls)?;
    let produce = |i: usize| -> Result<Vec<u8>> {
        let (name, role) = jobs
            .get(i)
            .ok_or_else(|| Error::Input(format!("tensor {i} out of range")))?;
        let t = read(name, *role)?;
        let off = hf_offset(&cfg, *role);
        if off != 0.0 {
            let vals = t.to_f32()?;
            Ok(vals.iter().flat_map(|v| (v + off).to_le_bytes()).collect())
        } else if gguf_permuted(cfg.arch, *role) {
            qk_to_gguf(&t.data, &t.shape, t.dtype, cfg.head_dim)
        } else {
            Ok(t.data.to_vec())
        }
    };
    let names: Vec<String> = decls.iter().map(|d| d.name.clone()).collect();
    let bytes = stream_tensors(&names, &produce, sink, args.progress)?;
    Ok(ConvertReport {
        config: cfg,
        tensors: names.len(),
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The GGUF metadata of `cfg` and the tokenizer of `--tokenizer-from`.
fn gguf_meta(
    args: &ToGgufArgs,
    cfg: &memra_engine::config::ModelConfig,
    file_type: SynthDType,
) -> Result<Vec<(String, memra_engine::formats::gguf::MetaValue)>> {
    let tok = match &args.tokenizer_from {
        Some(p) => load_tokenizer(&TokenizerSource::Gguf(p.clone()))?,
        None => load_tokenizer(&TokenizerSource::None { vocab: cfg.vocab })?,
    };
    if !tok.gguf_meta.is_empty() && tok.vocab != cfg.vocab {
        return Err(Error::Input(format!(
            "the tokenizer has {} tokens but the model's vocabulary is {}",
            tok.vocab, cfg.vocab
        )));
    }
    let mut meta = gguf_metadata(cfg, "memra-convert", file_type, false);
    meta.extend(tok.gguf_meta);
    Ok(meta)
}

/// A qwen3next HF folder as a GGUF file: loaded by the engine's own mapping (models/qwen3next.rs
/// `hf_tensor`), whose internal tensors are llama.cpp's layout, in memory.
fn hybrid_to_gguf(args: &ToGgufArgs, start: Instant) -> Result<ConvertReport> {
    let w = memra_engine::loader::load_weights(&args.input)?;
    let mut file_type = SynthDType::F32;
    let mut decls = Vec::new();
    let mut data = Vec::new();
    for (role, t) in w.iter() {
        if t.shape.len() >= 2 && role != Role::TokenEmbd {
            file_type = match t.dtype {
                DType::F16 => SynthDType::F16,
                DType::BF16 => SynthDType::BF16,
                _ => SynthDType::F32,
            };
        }
        decls.push(GgufDecl {
            name: role.gguf_name(),
            dtype: t.dtype,
            dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
        });
        data.push(t.data.to_vec());
    }
    let meta = gguf_meta(args, &w.config, file_type)?;
    let sink = gguf_sink(&args.out, meta, &decls)?;
    let names: Vec<String> = decls.iter().map(|d| d.name.clone()).collect();
    let produce = |i: usize| -> Result<Vec<u8>> {
        data.get(i)
            .cloned()
            .ok_or_else(|| Error::Input(format!("tensor {i} out of range")))
    };
    let bytes = stream_tensors(&names, &produce, sink, args.progress)?;
    Ok(ConvertReport {
        config: w.config.clone(),
        tensors: names.len(),
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}
