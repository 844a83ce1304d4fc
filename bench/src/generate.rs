//! Tensor data of synthetic models, generated in parallel row chunks.

use rayon::prelude::*;

use memra_engine::config::ModelConfig;
use memra_engine::error::{Error, Result};
use memra_engine::models::random::{OracleFill, oracle_value};
use memra_engine::models::{gguf_permuted, hf_offset, qk_to_gguf};
use memra_engine::quant::{DType, QK_K, fp8, quantize};

use crate::plan::{Init, TensorPlan};
use crate::sink::FP8_CKPT_BLOCK;
use crate::{kblocks, rng};

/// Elements generated per parallel work item (whole rows, at least one).
const CHUNK_ELEMS: usize = 1 << 16;

/// The f32 values of elements `first..first + out.len()` of tensor `t` (row-major, HF order).
pub fn fill_values(seed: u64, t: &TensorPlan, first: u64, out: &mut [f32]) {
    let key = rng::tensor_key(seed, &t.draws.hf_name(t.arch));
    match t.init {
        Init::Normal { std } => rng::fill_normal(key, first, 0.0, std, out),
        Init::NearOne { std } => rng::fill_normal(key, first, 1.0, std, out),
        Init::NearMinusOne { std } => rng::fill_normal(key, first, -1.0, std, out),
        Init::Oracle(f) => {
            let cols = t.rows_cols().1;
            for (i, v) in out.iter_mut().enumerate() {
                *v = oracle_value(f, cols, first as usize + i).unwrap_or(0.0);
            }
        }
    }
}

/// All f32 values of a tensor, in HF row order (for tests and conversions).
pub fn tensor_values(seed: u64, t: &TensorPlan) -> Vec<f32> {
    let n: usize = t.shape.iter().product();
    let mut v = vec![0f32; n];
    fill_values(seed, t, 0, &mut v);
    v
}

/// Whether tensor `t` is generated as random k-quant blocks (see [`crate::kblocks`]) rather than
/// quantized from its f32 values.
pub fn is_direct(t: &TensorPlan, direct_kquants: bool) -> bool {
    direct_kquants
        && matches!(t.dtype, DType::Q4_K | DType::Q6_K)
        && matches!(t.init, Init::Normal { .. })
}

/// The bytes of the HF tensors of a matrix (or expert stack, expert by expert) of a checkpoint
/// type, in [`crate::sink::matrix_decls`]'s order: FP8 codes then `weight_scale_inv` (128 x 128
/// blocks); NVFP4 packed pairs, `weight_scale`, `weight_scale_2`, `input_scale` (1.0: synthetic
/// activations have no calibration). Block rows are quantized in parallel; the result does not
/// depend on the thread count.
pub fn checkpoint_bytes(
    name: &str,
    dtype: DType,
    shape: &[usize],
    vals: &[f32],
) -> Result<Vec<u8>> {
    let (experts, k) = match *shape {
        [_, k] => (1, k),
        [e, _, k] => (e, k),
        _ => {
            return Err(Error::Quant(format!(
                "{name}: {dtype} needs a matrix, not {shape:?}"
            )));
        }
    };
    let per = vals.len() / experts.max(1);
    let mut out = Vec::new();
    for ev in vals.chunks(per.max(1)) {
        match dtype {
            DType::FP8 => {
                let b = FP8_CKPT_BLOCK;
                let parts: Vec<(Vec<u8>, Vec<f32>)> = ev
                    .par_chunks(b * k)
                    .map(|c| fp8::quantize_fp8_blocks(c, c.len() / k, k, (b, b)))
                    .collect();
                out.extend(parts.iter().flat_map(|p| p.0.iter().copied()));
                out.extend(
                    parts
                        .iter()
                        .flat_map(|p| p.1.iter().flat_map(|s| s.to_le_bytes())),
                );
            }
            DType::NVFP4 => {
                let amax = ev.iter().fold(0f32, |m, x| m.max(x.abs()));
                let g = fp8::nvfp4_global_scale(amax);
                let parts: Vec<(Vec<u8>, Vec<u8>)> = ev
                    .par_chunks(CHUNK_ELEMS.div_ceil(k).max(1) * k)
                    .map(|c| fp8::quant_nvfp4_with(c, g))
                    .collect();
                let block = fp8::NVFP4_BLOCK_BYTES;
                out.extend(
                    parts
                        .iter()
                        .flat_map(|p| p.0.chunks_exact(block).flat_map(|b| b[4..].iter().copied())),
                );
                out.extend(parts.iter().flat_map(|p| p.1.iter().copied()));
                out.extend(g.to_le_bytes());
                out.extend(1f32.to_le_bytes());
            }
            d => {
                return Err(Error::Quant(format!(
                    "{name}: {d} is not a checkpoint type"
                )));
            }
        }
    }
    Ok(out)
}

/// The stored bytes of tensor `t`: values quantized to `t.dtype`, generated and quantized in
/// parallel chunks of whole rows. With `direct_kquants`, Q4_K/Q6_K matrices are random valid
/// blocks instead (fast). With `gguf_order`, llama q/k rows are permuted the way GGUF files
/// store them. The result depends only on the arguments, never on the thread count.
pub fn tensor_bytes(
    seed: u64,
    t: &TensorPlan,
    cfg: &ModelConfig,
    gguf_order: bool,
    direct_kquants: bool,
) -> Result<Vec<u8>> {
    if DType::HF_ONLY.contains(&t.dtype) {
        let mut vals = vec![0f32; t.shape.iter().product()];
        vals.par_chunks_mut(CHUNK_ELEMS)
            .enumerate()
            .for_each(|(i, c)| fill_values(seed, t, (i * CHUNK_ELEMS) as u64, c));
        return checkpoint_bytes(&t.hf_name(), t.dtype, &t.shape, &vals);
    }
    let (rows, cols) = t.rows_cols();
    let row_bytes = t.dtype.bytes_for(cols as u64).ok_or_else(|| {
        Error::Quant(format!(
            "{}: row length {cols} does not fit {}",
            t.hf_name(),
            t.dtype
        ))
    })? as usize;
    if t.init == Init::Oracle(OracleFill::Zero) {
        // One zero row quantized, repeated: exact in every type, and fast at any size.
        return Ok(quantize(t.dtype, &vec![0f32; cols])?.repeat(rows));
    }
    let rows_per_chunk = (CHUNK_ELEMS / cols.max(1)).max(1);
    let mut out = vec![0u8; rows * row_bytes];
    let direct = is_direct(t, direct_kquants);
    let block_key = rng::tensor_key(seed, &format!("{}#kblocks", t.draws.hf_name(t.arch)));
    let std = match t.init {
        Init::Normal { std } | Init::NearOne { std } | Init::NearMinusOne { std } => std,
        Init::Oracle(_) => 0.0,
    };
    out.par_chunks_mut(rows_per_chunk * row_bytes)
        .enumerate()
        .try_for_each(|(ci, dst)| -> Result<()> {
            if direct {
                let first_block = (ci * rows_per_chunk * cols / QK_K) as u64;
                match t.dtype {
                    DType::Q4_K => kblocks::fill_q4_k(block_key, first_block, std, dst),
                    _ => kblocks::fill_q6_k(block_key, first_block, std, dst),
                }
                return Ok(());
            }
            let first = (ci * rows_per_chunk * cols) as u64;
            let mut vals = vec![0f32; dst.len() / row_bytes * cols];
            fill_values(seed, t, first, &mut vals);
            if !gguf_order {
                // HF stores Gemma's norm weights without the GGUF's + 1.
                let off = hf_offset(cfg, t.role);
                vals.iter_mut().for_each(|v| *v -= off);
            }
            let q = quantize(t.dtype, &vals)?;
            if q.len() != dst.len() {
                return Err(Error::Quant(format!(
                    "{}: quantizer returned {} bytes, expected {}",
                    t.hf_name(),
                    q.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(&q);
            Ok(())
        })?;
    if gguf_order && gguf_permuted(cfg.arch, t.role) {
        out = qk_to_gguf(&out, &t.shape, t.dtype, cfg.head_dim)?;
    }
    Ok(out)
}
