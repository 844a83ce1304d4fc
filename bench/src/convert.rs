//! `memra-bench convert`: a GGUF file to an HF folder (config.json, safetensors, tokenizer).
//!
//! Each tensor keeps its float type (F32/F16/BF16) unless `--dtype` is given; quantized tensors
//! are dequantized to f32. `--dtype fp8` / `nvfp4` write an HF `fp8` (128 x 128 block scales) /
//! ModelOpt NVFP4 checkpoint of the matrices (from their dequantized values). Llama q/k rows
//! are un-permuted to HF order.

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

use memra_engine::config::ModelConfig;
use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::{Gguf, GgufTensorInfo};
use memra_engine::formats::safetensors::HfFolderSpec;
use memra_engine::models::{Role, gguf_permuted, hf_offset, qk_to_hf};
use memra_engine::quant::{DType, dequantize_row, quantize};

use crate::generate::checkpoint_bytes;
use crate::plan::SynthDType;
use crate::rope::{ROPE_FREQS, recognise};
use crate::sink::{hf_decls, hf_sink, split_sink};
use crate::synth::stream_tensors;

/// Arguments of `convert`.
#[derive(Clone, Debug)]
pub struct ConvertArgs {
    pub input: PathBuf,
    pub out: PathBuf,
    /// Output type of every tensor (F32/F16/BF16); None keeps float tensors and makes quantized
    /// ones F32.
    pub dtype: Option<DType>,
    pub shard_bytes: u64,
    pub progress: bool,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub config: ModelConfig,
    pub tensors: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// One tensor to convert.
struct Job {
    info: GgufTensorInfo,
    role: Role,
    out_dtype: DType,
    shape: Vec<usize>,
}

/// The HF output type of a GGUF tensor of role `role` and shape `shape` (HF order). A
/// checkpoint type (fp8, nvfp4) applies to the 2-D matrices and expert stacks other than the
/// embedding and the LM head (BF16, as real checkpoints keep them) whose rows its blocks divide;
/// the other tensors keep a float type or become F32.
fn out_dtype(src: DType, forced: Option<DType>, role: Role, shape: &[usize]) -> DType {
    let keep = || if src.is_float() { src } else { DType::F32 };
    match forced {
        Some(d) if DType::HF_ONLY.contains(&d) => {
            let cols = *shape.last().unwrap_or(&1);
            match (shape.len(), role) {
                (_, Role::TokenEmbd | Role::Output) => DType::BF16,
                (2 | 3, _) if cols.is_multiple_of(d.block_size()) => d,
                (2 | 3, _) => DType::BF16,
                _ => keep(),
            }
        }
        Some(d) => d,
        None => keep(),
    }
}

/// Dequantizes `data` (`rows` rows of `cols` elements of `dtype`) to f32, rows in parallel.
pub fn dequantize_par(dtype: DType, data: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    let rb = dtype.bytes_for(cols as u64).ok_or_else(|| {
        Error::Quant(format!(
            "{dtype}: row length {cols} is not a multiple of the block"
        ))
    })? as usize;
    if data.len() != rb * rows {
        return Err(Error::Quant(format!(
            "{dtype}: {rows}x{cols} needs {} bytes, got {}",
            rb * rows,
            data.len()
        )));
    }
    let mut out = vec![0f32; rows * cols];
    let chunk_rows = (65536 / cols.max(1)).max(1);
    out.par_chunks_mut(chunk_rows * cols)
        .zip(data.par_chunks(chunk_rows * rb))
        .try_for_each(|(dst, src)| dequantize_row(dtype, src, dst))?;
    Ok(out)
}

/// HF-order bytes of one GGUF tensor in `job.out_dtype`.
fn convert_tensor(g: &Gguf, cfg: &ModelConfig, job: &Job) -> Result<Vec<u8>> {
    let t = g
        .tensor(&job.info.name)
        .ok_or_else(|| Error::Weights(format!("GGUF tensor `{}` cannot be read", job.info.name)))?;
    let (rows, cols) = t.rows_cols();
    let permute = gguf_permuted(cfg.arch, job.role);
    let off = hf_offset(cfg, job.role);
    if off != 0.0 {
        // HF stores Gemma's norm weights without the GGUF's + 1 (F32 out unless forced).
        let vals: Vec<f32> = t.to_f32()?.into_iter().map(|v| v - off).collect();
        return match job.out_dtype {
            DType::F32 => Ok(vals.iter().flat_map(|v| v.to_le_bytes()).collect()),
            d => quantize(d, &vals),
        };
    }
    let unpermute = |bytes: &[u8], dtype: DType| qk_to_hf(bytes, &t.shape, dtype, cfg.head_dim);
    if t.dtype == job.out_dtype {
        return if permute {
            unpermute(&t.data, t.dtype)
        } else {
            Ok(t.data.to_vec())
        };
    }
    let vals = dequantize_par(t.dtype, &t.data, rows, cols)?;
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f32_bytes = if permute {
        unpermute(&f32_bytes, DType::F32)?
    } else {
        f32_bytes
    };
    if job.out_dtype == DType::F32 {
        return Ok(f32_bytes);
    }
    let vals: Vec<f32> = f32_bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if DType::HF_ONLY.contains(&job.out_dtype) {
        let name = job.role.hf_name(cfg.arch);
        return checkpoint_bytes(&name, job.out_dtype, &job.shape, &vals);
    }
    quantize(job.out_dtype, &vals)
}

/// Converts a GGUF file into an HF folder.
pub fn convert_gguf_to_hf(args: &ConvertArgs) -> Result<ConvertReport> {
    let start = Instant::now();
    if let Some(d) = args.dtype
        && !d.is_float()
        && !DType::HF_ONLY.contains(&d)
    {
        return Err(Error::Input(format!(
            "--dtype must be f32, f16, bf16, fp8 or nvfp4, not {d}"
        )));
    }
    let g = Gguf::open(&args.input)?;
    let mut cfg = ModelConfig::from_gguf(&g)?;
    let mut jobs = Vec::new();
    for info in g.tensors() {
        if info.name == ROPE_FREQS {
            // llama3 RoPE factors: config.json's rope_scaling says the same.
            if cfg.rope_scaling.is_none() {
                let f = g
                    .tensor(ROPE_FREQS)
                    .filter(|t| t.dtype == DType::F32)
                    .map(|t| t.to_f32())
                    .transpose()?
                    .unwrap_or_default();
                cfg.rope_scaling = Some(recognise(&cfg, &f).ok_or_else(|| {
                    Error::Unsupported(format!(
                        "{ROPE_FREQS} holds RoPE factors that are not Llama 3.1's; HF config.json cannot express them"
                    ))
                })?);
            }
            continue;
        }
        let role = Role::from_gguf_name(&info.name).ok_or_else(|| {
            Error::Unsupported(format!(
                "GGUF tensor `{}` has no Hugging Face equivalent",
                info.name
            ))
        })?;
        jobs.push(Job {
            out_dtype: out_dtype(info.dtype, args.dtype, role, &info.shape()),
            shape: info.shape(),
            role,
            info: info.clone(),
        });
    }
    let (tokenizer_json, tokenizer_config_json) = if g.get("tokenizer.ggml.tokens").is_some() {
        let (tj, tc) = crate::tok::hf_tokenizer_files(&g)?;
        (Some(tj), Some(tc))
    } else {
        (None, None)
    };
    let id = |k: &str| g.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
    let mut config_json = cfg.to_hf_json(
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
    );
    let quant = match args.dtype {
        Some(DType::FP8) => SynthDType::Fp8.quantization_config(),
        Some(DType::NVFP4) => SynthDType::Nvfp4.quantization_config(),
        _ => None,
    };
    if let (Some(q), Some(o)) = (quant, config_json.as_object_mut()) {
        o.insert("quantization_config".into(), q);
    }
    let hf_spec = HfFolderSpec {
        config_json,
        tokenizer_json,
        tokenizer_config_json,
        max_shard_bytes: args.shard_bytes,
    };
    if cfg.arch == memra_engine::config::Arch::Qwen3Next {
        return hybrid_to_hf(args, &hf_spec, start);
    }
    let (decls, parts) = hf_decls(
        jobs.iter()
            .map(|j| (j.role, cfg.arch, j.out_dtype, j.shape.clone())),
    )?;
    let sink = split_sink(hf_sink(&args.out, &hf_spec, decls)?, parts);
    let names: Vec<String> = jobs.iter().map(|j| j.role.hf_name(cfg.arch)).collect();
    let produce = |i: usize| -> Result<Vec<u8>> {
        let job = jobs
            .get(i)
            .ok_or_else(|| Error::Input(format!("tensor {i} out of range")))?;
        convert_tensor(&g, &cfg, job)
    };
    let bytes = stream_tensors(&names, &produce, sink, args.progress)?;
    Ok(ConvertReport {
        config: cfg,
        tensors: jobs.len(),
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A qwen3next GGUF as an HF folder: the engine's own mapping (`qwen3next::hf_tensors`:
/// `in_proj_qkvz`, `A_log`, the MTP module's `mtp.*` names), in memory, float tensors as they
/// are (quantized ones are refused: HF folders hold floats).
fn hybrid_to_hf(args: &ConvertArgs, spec: &HfFolderSpec, start: Instant) -> Result<ConvertReport> {
    if args.dtype.is_some() {
        return Err(Error::Input(
            "--dtype: a qwen3next GGUF converts with its own float types".into(),
        ));
    }
    let w = memra_engine::loader::load_weights(&args.input)?;
    if let Some((_, t)) = w.iter().find(|(_, t)| !t.dtype.is_float()) {
        return Err(Error::Input(format!(
            "qwen3next: `{}` is {}; convert a float (f32/f16/bf16) GGUF",
            t.name, t.dtype
        )));
    }
    let tensors = memra_engine::models::qwen3next::hf_tensors(&w)?;
    memra_engine::formats::safetensors::write_hf_folder(&args.out, spec, &tensors)?;
    Ok(ConvertReport {
        config: w.config.clone(),
        tensors: tensors.len(),
        bytes: tensors.iter().map(|(_, t)| t.data.len() as u64).sum(),
        seconds: start.elapsed().as_secs_f64(),
    })
}
