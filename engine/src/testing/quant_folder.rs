//! Quantized HF checkpoints for tests: a model's weights written as an HF `fp8` (128 x 128
//! block scales) or ModelOpt NVFP4 folder, tensor by tensor, so that a test can break one piece
//! (a scale's shape, dtype or presence) before the folder is written.

use std::path::Path;

use crate::error::Result;
use crate::formats::safetensors::{HfFolderSpec, HfFolderWriter, TensorDecl};
use crate::models::{ModelWeights, Role};
use crate::quant::DType;
use crate::quant::fp8::{quantize_fp8_blocks, quantize_nvfp4_checkpoint};
use crate::weights::{Bytes, Tensor};

/// A checkpoint format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ckpt {
    /// HF `fp8`, `weight_block_size` `[128, 128]`.
    Fp8,
    /// ModelOpt FP8: one `weight_scale` per tensor.
    Fp8Tensor,
    /// ModelOpt NVFP4.
    Nvfp4,
}

impl Ckpt {
    /// config.json's `quantization_config`.
    pub fn config(self) -> serde_json::Value {
        match self {
            Ckpt::Fp8 => serde_json::json!({
                "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]
            }),
            Ckpt::Nvfp4 => serde_json::json!({
                "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16
            }),
            Ckpt::Fp8Tensor => serde_json::json!({"quant_method": "modelopt", "quant_algo": "FP8"}),
        }
    }
}

/// One tensor to write: its declaration and bytes.
pub type Entry = (TensorDecl, Vec<u8>);

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The HF tensors of `w` as checkpoint `ck` stores them ([`entries_of`]).
pub fn entries(w: &ModelWeights, ck: Ckpt) -> Result<Vec<Entry>> {
    let arch = w.config.arch;
    let named: Vec<(String, Tensor)> = w
        .iter()
        .map(|(role, t)| (role.hf_name(arch), t.clone()))
        .collect();
    entries_of(&named, ck)
}

/// HF tensors (by HF name) as checkpoint `ck` stores them: each 2-D matrix other than the
/// embedding and the LM head quantized (codes, then its scales), everything else F32.
pub fn entries_of(tensors: &[(String, Tensor)], ck: Ckpt) -> Result<Vec<Entry>> {
    let head = [
        Role::TokenEmbd.hf_name(crate::config::Arch::Llama),
        Role::Output.hf_name(crate::config::Arch::Llama),
    ];
    let mut out = Vec::new();
    for (name, t) in tensors {
        let name = name.clone();
        let v = t.to_f32()?;
        let quantize = t.shape.len() == 2 && !head.contains(&name);
        let stem = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        match (quantize, ck) {
            (false, _) => out.push((
                TensorDecl::new(name, DType::F32, t.shape.clone()),
                f32_bytes(&v),
            )),
            (true, Ckpt::Fp8) => {
                let (n, k) = (t.shape[0], t.shape[1]);
                let (codes, scales) = quantize_fp8_blocks(&v, n, k, (128, 128));
                out.push((
                    TensorDecl::raw_bytes(name, "F8_E4M3", t.shape.clone()),
                    codes,
                ));
                let sshape = vec![n.div_ceil(128), k.div_ceil(128)];
                out.push((
                    TensorDecl::new(format!("{stem}.weight_scale_inv"), DType::F32, sshape),
                    f32_bytes(&scales),
                ));
            }
            (true, Ckpt::Fp8Tensor) => {
                let (n, k) = (t.shape[0], t.shape[1]);
                let (codes, scale) = quantize_fp8_blocks(&v, n, k, (n, k));
                out.push((
                    TensorDecl::raw_bytes(name, "F8_E4M3", t.shape.clone()),
                    codes,
                ));
                out.push((
                    TensorDecl::new(format!("{stem}.weight_scale"), DType::F32, vec![]),
                    f32_bytes(&scale),
                ));
            }
            (true, Ckpt::Nvfp4) => {
                let (n, k) = (t.shape[0], t.shape[1]);
                let (packed, scales, g) = quantize_nvfp4_checkpoint(&v);
                out.push((TensorDecl::raw_bytes(name, "U8", vec![n, k / 2]), packed));
                out.push((
                    TensorDecl::raw_bytes(
                        format!("{stem}.weight_scale"),
                        "F8_E4M3",
                        vec![n, k / 16],
                    ),
                    scales,
                ));
                out.push((
                    TensorDecl::new(format!("{stem}.weight_scale_2"), DType::F32, vec![]),
                    g.to_le_bytes().to_vec(),
                ));
            }
        }
    }
    Ok(out)
}

/// Writes an HF folder of `spec`'s files and `entries`, with `quant` as config.json's
/// `quantization_config` (left as `spec` has it when `None`).
pub fn write(
    dir: &Path,
    spec: &HfFolderSpec,
    quant: Option<serde_json::Value>,
    entries: Vec<Entry>,
) -> Result<()> {
    let mut spec = spec.clone();
    if let (Some(q), Some(o)) = (quant, spec.config_json.as_object_mut()) {
        o.insert("quantization_config".into(), q);
    }
    let (decls, data): (Vec<_>, Vec<_>) = entries.into_iter().unzip();
    let mut wr = HfFolderWriter::create(dir, &spec, decls)?;
    for d in data {
        wr.write_tensor(&d)?;
    }
    wr.finish()
}

/// `w` with every tensor of a checkpoint type replaced by its dequantized values as F32.
pub fn as_f32(w: &ModelWeights) -> Result<ModelWeights> {
    w.map_tensors(&mut |t: &Tensor| {
        if !DType::HF_ONLY.contains(&t.dtype) {
            return Ok(t.clone());
        }
        let data = Bytes::owned(f32_bytes(&t.to_f32()?));
        Tensor::new(t.name.clone(), DType::F32, t.shape.clone(), data)
    })
}
