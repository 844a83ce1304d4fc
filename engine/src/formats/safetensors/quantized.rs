//! Quantized HF checkpoints: the `quantization_config` of config.json (or ModelOpt's
//! `hf_quant_config.json`) and the weight tensors built from a checkpoint's codes and scales
//! into memra's row-block types (quant/fp8.rs).
//!
//! - `quant_method: "fp8"` with `weight_block_size: [bn, bk]` (DeepSeek-V3, Qwen3-FP8,
//!   transformers' FineGrainedFP8): `W.weight` is `F8_E4M3 [N, K]`, `W.weight_scale_inv` is
//!   `F32` / `BF16` / `F16` `[ceil(N / bn), ceil(K / bk)]`, and `w[n][k] = e4m3(q[n][k]) *
//!   scale_inv[n / bn][k / bk]` (the name notwithstanding, the stored value multiplies).
//! - `quant_method: "modelopt"`, `quant_algo: "FP8"`: `W.weight` `F8_E4M3 [N, K]`,
//!   `W.weight_scale` one `F32` for the tensor (`[]` or `[1]`): `w = e4m3(q) * weight_scale`.
//! - `quant_method: "modelopt"`, `quant_algo: "NVFP4"` (group size 16): `W.weight` `U8 [N, K/2]`
//!   (e2m1 pairs, element `2i` in the low nibble), `W.weight_scale` `F8_E4M3 [N, K / 16]`,
//!   `W.weight_scale_2` one `F32`: `w = e2m1(q) * fl32(e4m3(weight_scale) * weight_scale_2)`.
//!   `input_scale` (the activations' global scale for an FP4 x FP4 product) is not read: the
//!   products here take f32 activations.
//!
//! Every malformed piece (a missing scale, a scale of the wrong shape or dtype, a block that
//! does not divide the row into memra's blocks, a non-finite scale) is an error naming the
//! tensor and the problem.

use std::path::Path;

use crate::error::{Error, Result};
use crate::quant::DType;
use crate::quant::fp8::{E4M3, FP8_BLOCK, FP8_BLOCK_BYTES, NVFP4_BLOCK, NVFP4_BLOCK_BYTES};
use crate::weights::{Bytes, Tensor};

/// How a checkpoint's quantized weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// e4m3 weights, one scale per `[rows, cols]` block (`weight_scale_inv`).
    Fp8Block { rows: usize, cols: usize },
    /// e4m3 weights, one scale per tensor (`weight_scale`).
    Fp8Tensor,
    /// ModelOpt NVFP4.
    Nvfp4,
}

/// A tensor as stored: its safetensors dtype name, shape and bytes.
pub struct Raw<'a> {
    pub dtype: &'a str,
    pub shape: &'a [usize],
    pub data: Bytes,
}

fn bad(dir: &Path, what: String) -> Error {
    Error::Safetensors {
        path: dir.to_path_buf(),
        what,
    }
}

/// The scheme of `config.json`'s `quantization_config` (or the folder's `hf_quant_config.json`,
/// `quant_json`); `None` for an unquantized model.
pub fn scheme(
    dir: &Path,
    config: &serde_json::Value,
    quant_json: Option<&serde_json::Value>,
) -> Result<Option<Scheme>> {
    let (q, modelopt_file) = match (
        config.get("quantization_config").filter(|v| !v.is_null()),
        quant_json,
    ) {
        (Some(q), _) => (q, false),
        (None, Some(h)) => (h.get("quantization").unwrap_or(h), true),
        (None, None) => return Ok(None),
    };
    let s = |k: &str| q.get(k).and_then(|v| v.as_str());
    let method = match (s("quant_method"), modelopt_file) {
        (Some(m), _) => m,
        (None, true) => "modelopt",
        (None, false) => {
            return Err(bad(
                dir,
                "config.json's quantization_config has no quant_method".into(),
            ));
        }
    };
    match method {
        "fp8" => {
            if let Some(f) = s("fmt").filter(|f| *f != "e4m3") {
                return Err(bad(
                    dir,
                    format!("quantization_config fmt `{f}`: only e4m3 FP8 is supported"),
                ));
            }
            let (rows, cols) = match q.get("weight_block_size") {
                None => (128, 128),
                Some(v) => match v.as_array().map(|a| a.as_slice()) {
                    Some([r, c]) => match (r.as_u64(), c.as_u64()) {
                        (Some(r), Some(c)) if r > 0 && c > 0 => (r as usize, c as usize),
                        _ => {
                            return Err(bad(
                                dir,
                                format!(
                                    "quantization_config weight_block_size {v} is not two positive integers"
                                ),
                            ));
                        }
                    },
                    _ => {
                        return Err(bad(
                            dir,
                            format!(
                                "quantization_config weight_block_size {v} is not [rows, cols]"
                            ),
                        ));
                    }
                },
            };
            if !cols.is_multiple_of(FP8_BLOCK) {
                return Err(bad(
                    dir,
                    format!(
                        "quantization_config weight_block_size [{rows}, {cols}]: the column block must be a multiple of {FP8_BLOCK}"
                    ),
                ));
            }
            Ok(Some(Scheme::Fp8Block { rows, cols }))
        }
        "modelopt" => match s("quant_algo") {
            Some("NVFP4") => {
                let g = q.get("group_size").and_then(|v| v.as_u64()).unwrap_or(16);
                if g != NVFP4_BLOCK as u64 {
                    return Err(bad(
                        dir,
                        format!("NVFP4 group_size {g}: only {NVFP4_BLOCK} is supported"),
                    ));
                }
                Ok(Some(Scheme::Nvfp4))
            }
            Some("FP8") => Ok(Some(Scheme::Fp8Tensor)),
            other => Err(Error::Unsupported(format!(
                "{}: ModelOpt quant_algo {other:?} (memra reads NVFP4 and FP8)",
                dir.display()
            ))),
        },
        other => Err(Error::Unsupported(format!(
            "{}: quantization_config quant_method `{other}` (memra reads `fp8` with \
             weight_block_size and ModelOpt `modelopt` NVFP4 / FP8)",
            dir.display()
        ))),
    }
}

/// `W.weight` -> `W.<suffix>`.
fn sibling(name: &str, suffix: &str) -> String {
    let stem = name.strip_suffix(".weight").unwrap_or(name);
    format!("{stem}.{suffix}")
}

/// Whether `name` is one of a quantized weight's scale tensors (read with the weight, not a
/// tensor of the model on its own).
pub fn is_scale(name: &str) -> bool {
    [
        "weight_scale_inv",
        "weight_scale",
        "weight_scale_2",
        "input_scale",
    ]
    .iter()
    .any(|s| name.rsplit('.').next() == Some(s))
}

/// Whether a stored tensor of dtype `dtype` is the code tensor of a quantized weight.
pub fn is_quantized(scheme: Scheme, name: &str, dtype: &str) -> bool {
    name.ends_with(".weight")
        && match scheme {
            Scheme::Fp8Block { .. } | Scheme::Fp8Tensor => dtype == "F8_E4M3",
            Scheme::Nvfp4 => dtype == "U8",
        }
}

/// The values of a float scale tensor (F32, BF16 or F16), checked finite.
fn scale_values(dir: &Path, name: &str, r: &Raw) -> Result<Vec<f32>> {
    let d = match r.dtype {
        "F32" => DType::F32,
        "BF16" => DType::BF16,
        "F16" => DType::F16,
        other => {
            return Err(bad(
                dir,
                format!("scale tensor `{name}` has dtype {other}, expected F32, BF16 or F16"),
            ));
        }
    };
    let n: usize = r.shape.iter().product();
    let mut v = vec![0f32; n];
    crate::quant::dequantize_row(d, &r.data, &mut v)
        .map_err(|e| bad(dir, format!("scale tensor `{name}`: {e}")))?;
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(bad(
            dir,
            format!("scale tensor `{name}` holds a non-finite value at index {i}"),
        ));
    }
    Ok(v)
}

/// A weight's `[N, K]` from its stored shape, or an error naming it.
fn matrix(dir: &Path, name: &str, shape: &[usize]) -> Result<(usize, usize)> {
    match *shape {
        [n, k] => Ok((n, k)),
        _ => Err(bad(
            dir,
            format!(
                "quantized weight `{name}` has shape {shape:?}; only 2-D weights are supported"
            ),
        )),
    }
}

/// Builds the memra tensor of quantized weight `name` from its codes `w` and the scale tensors
/// `get` finds by name.
pub fn build<'a>(
    dir: &Path,
    scheme: Scheme,
    name: &str,
    w: Raw<'a>,
    get: &dyn Fn(&str) -> Option<Raw<'a>>,
) -> Result<Tensor> {
    let need = |suffix: &str| {
        let s = sibling(name, suffix);
        get(&s).map(|r| (s.clone(), r)).ok_or_else(|| {
            bad(
                dir,
                format!("quantized weight `{name}` has no scale tensor `{s}`"),
            )
        })
    };
    let (n, cols) = matrix(dir, name, w.shape)?;
    match scheme {
        Scheme::Fp8Block { rows: bn, cols: bk } => {
            let (sname, s) = need("weight_scale_inv")?;
            let sv = scale_values(dir, &sname, &s)?;
            let want = [n.div_ceil(bn), cols.div_ceil(bk)];
            if s.shape != want {
                return Err(bad(
                    dir,
                    format!(
                        "scale tensor `{sname}` has shape {:?}, expected {want:?} for `{name}` {:?} in [{bn}, {bk}] blocks",
                        s.shape, w.shape
                    ),
                ));
            }
            fp8_rows(dir, name, &w, (n, cols), |r, c| {
                sv[(r / bn) * want[1] + c / bk]
            })
        }
        Scheme::Fp8Tensor => {
            let (sname, s) = need("weight_scale")?;
            let sv = scale_values(dir, &sname, &s)?;
            if sv.len() != 1 || s.shape.len() > 1 {
                return Err(bad(
                    dir,
                    format!(
                        "scale tensor `{sname}` has shape {:?}, expected one value ([] or [1])",
                        s.shape
                    ),
                ));
            }
            fp8_rows(dir, name, &w, (n, cols), |_, _| sv[0])
        }
        Scheme::Nvfp4 => nvfp4(dir, name, &w, (n, cols * 2), &need),
    }
}

/// An FP8 tensor whose row block at `(row, col)` has scale `scale(row, col)`.
fn fp8_rows(
    dir: &Path,
    name: &str,
    w: &Raw,
    (n, k): (usize, usize),
    scale: impl Fn(usize, usize) -> f32,
) -> Result<Tensor> {
    if !k.is_multiple_of(FP8_BLOCK) {
        return Err(bad(
            dir,
            format!(
                "quantized weight `{name}`: row length {k} is not a multiple of {FP8_BLOCK} (memra's FP8 row block)"
            ),
        ));
    }
    if let Some(i) = w.data.iter().position(|&b| b & 0x7f == 0x7f) {
        return Err(bad(
            dir,
            format!("quantized weight `{name}` holds an e4m3 NaN code at element {i}"),
        ));
    }
    let mut out = Vec::with_capacity(n * k / FP8_BLOCK * FP8_BLOCK_BYTES);
    for (r, row) in w.data.chunks_exact(k).enumerate() {
        for (b, codes) in row.chunks_exact(FP8_BLOCK).enumerate() {
            out.extend_from_slice(&scale(r, b * FP8_BLOCK).to_le_bytes());
            out.extend_from_slice(codes);
        }
    }
    Tensor::new(name, DType::FP8, vec![n, k], Bytes::owned(out))
        .map_err(|e| bad(dir, e.to_string()))
}

/// An NVFP4 tensor of `n x k` elements from ModelOpt's codes and two scales.
fn nvfp4<'a>(
    dir: &Path,
    name: &str,
    w: &Raw<'a>,
    (n, k): (usize, usize),
    need: &dyn Fn(&str) -> Result<(String, Raw<'a>)>,
) -> Result<Tensor> {
    if !k.is_multiple_of(NVFP4_BLOCK) {
        return Err(bad(
            dir,
            format!(
                "quantized weight `{name}`: row length {k} is not a multiple of the NVFP4 group size {NVFP4_BLOCK}"
            ),
        ));
    }
    let (bname, bs) = need("weight_scale")?;
    if bs.dtype != "F8_E4M3" {
        return Err(bad(
            dir,
            format!(
                "scale tensor `{bname}` has dtype {}, expected F8_E4M3",
                bs.dtype
            ),
        ));
    }
    let groups = k / NVFP4_BLOCK;
    if bs.shape != [n, groups] {
        return Err(bad(
            dir,
            format!(
                "scale tensor `{bname}` has shape {:?}, expected [{n}, {groups}] for `{name}` ({n} x {k} values in groups of {NVFP4_BLOCK})",
                bs.shape
            ),
        ));
    }
    let (gname, gs) = need("weight_scale_2")?;
    let g = scale_values(dir, &gname, &gs)?;
    if g.len() != 1 || gs.shape.len() > 1 {
        return Err(bad(
            dir,
            format!(
                "scale tensor `{gname}` has shape {:?}, expected one value ([] or [1])",
                gs.shape
            ),
        ));
    }
    let mut out = Vec::with_capacity(n * groups * NVFP4_BLOCK_BYTES);
    for (i, (&sc, q)) in bs
        .data
        .iter()
        .zip(w.data.chunks_exact(NVFP4_BLOCK / 2))
        .enumerate()
    {
        let d = E4M3[sc as usize] * g[0];
        if !d.is_finite() {
            return Err(bad(
                dir,
                format!(
                    "scale tensor `{bname}`: group {i} gives a non-finite scale (code {sc:#04x} x {})",
                    g[0]
                ),
            ));
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(q);
    }
    Tensor::new(name, DType::NVFP4, vec![n, k], Bytes::owned(out))
        .map_err(|e| bad(dir, e.to_string()))
}
