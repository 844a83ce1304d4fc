//! Random towers (Gemma 3's and the Qwen ViT) for tests and `memra-bench synth-mmproj`
//! (counter-based values, as models::random).

use super::{
    QwenKind, QwenParams, QwenWeights, TowerParams, TowerWeights, VisionTower, qwen_mmproj,
};
use crate::error::Result;
use crate::formats::gguf_write::{TensorData, write_gguf};
use crate::models::random::unit;
use crate::quant::DType;

/// The values of each named tensor of `shapes` from `seed`, tensor i its own stream: norm
/// weights (`is_norm`) near 1, biases small, positions small, matrices uniform in
/// `+-1/sqrt(fan_in)`.
fn draw(
    shapes: &[(String, Vec<usize>)],
    seed: u64,
    is_norm: impl Fn(&str) -> bool,
) -> Vec<Vec<f32>> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product();
            let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
            let u = |j: usize| unit(seed, i as u64, j as u64);
            let norm = is_norm(name);
            (0..n)
                .map(|j| {
                    if name.ends_with(".weight") && norm {
                        1.0 + 0.1 * u(j)
                    } else if name.ends_with(".bias") {
                        0.02 * u(j)
                    } else if name == "v.position_embd.weight" {
                        0.1 * u(j)
                    } else {
                        u(j) / (fan_in as f32).sqrt()
                    }
                })
                .collect()
        })
        .collect()
}

/// Weights of `p`'s shape from `seed`: matrices uniform in `+-1/sqrt(fan_in)`, biases small,
/// LayerNorm weights near 1, the soft-embedding norm near 1.
pub fn random_tower(p: &TowerParams, seed: u64) -> TowerWeights {
    let norm = |name: &str| name.contains("ln") || name.contains("soft_emb_norm");
    let t = draw(&p.tensor_shapes(), seed, norm);
    TowerWeights::from_tensors(p, t)
}

/// Writes `w` as an mmproj GGUF file with tensors in `dtype` (F32 or F16).
pub fn write_mmproj(
    p: &TowerParams,
    w: &TowerWeights,
    dtype: DType,
    path: &std::path::Path,
) -> Result<()> {
    let shapes = p.tensor_shapes();
    let bytes: Vec<Vec<u8>> = w
        .tensors()
        .iter()
        .map(|t| match dtype {
            DType::F16 => t
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => t.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
        .collect();
    let dtype = if dtype == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    let dims: Vec<Vec<u64>> = shapes
        .iter()
        .map(|(_, s)| s.iter().rev().map(|&d| d as u64).collect())
        .collect();
    let data: Vec<TensorData<'_>> = shapes
        .iter()
        .zip(&dims)
        .zip(&bytes)
        .map(|(((n, _), d), b)| (n.as_str(), dtype, d.as_slice(), b.as_slice()))
        .collect();
    write_gguf(path, &p.gguf_meta(), &data)
}

/// A random tower in memory.
pub fn tiny_tower(text_hidden: usize, seed: u64) -> VisionTower {
    let p = TowerParams::tiny(text_hidden);
    VisionTower::new(p, random_tower(&p, seed))
}

/// Weights of a Qwen ViT of `p`'s shape from `seed`, drawn as [`random_tower`] draws: each
/// tensor of [`QwenParams::tensor_shapes`] its own stream; matrices uniform in
/// `+-1/sqrt(fan_in)`, biases small, norm weights near 1, positions small.
pub fn random_qwen(p: &QwenParams, seed: u64) -> Result<QwenWeights> {
    let shapes = p.tensor_shapes();
    let values = draw(&shapes, seed, |name| {
        name.contains("ln") || name.contains(".norm.")
    });
    let mut get = |name: &str, _: &[usize]| -> Result<Vec<f32>> {
        let i = shapes.iter().position(|(n, _)| n == name);
        i.map(|i| values[i].clone())
            .ok_or_else(|| crate::error::Error::Weights(format!("no tensor {name}")))
    };
    let has = |name: &str| shapes.iter().any(|(n, _)| n == name);
    qwen_mmproj::build(p, &mut get, &has)
}

/// Writes a Qwen ViT as an mmproj GGUF file with tensors in `dtype` (F32 or F16).
pub fn write_qwen_mmproj(
    p: &QwenParams,
    w: &QwenWeights,
    dtype: DType,
    path: &std::path::Path,
) -> Result<()> {
    let tensors = qwen_mmproj::file_tensors(p, w);
    write_named(&tensors, &p.gguf_meta(), dtype, path)
}

/// Writes named tensors (shape outermost first) as a GGUF file in `dtype` (F32 or F16).
fn write_named(
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    meta: &[(String, crate::formats::gguf::MetaValue)],
    dtype: DType,
    path: &std::path::Path,
) -> Result<()> {
    let dtype = if dtype == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, t)| match dtype {
            DType::F16 => t
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => t.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
        .collect();
    let dims: Vec<Vec<u64>> = tensors
        .iter()
        .map(|(_, s, _)| s.iter().rev().map(|&d| d as u64).collect())
        .collect();
    let data: Vec<TensorData<'_>> = tensors
        .iter()
        .zip(&dims)
        .zip(&bytes)
        .map(|(((n, _, _), d), b)| (n.as_str(), dtype, d.as_slice(), b.as_slice()))
        .collect();
    write_gguf(path, meta, &data)
}

/// A tiny random Qwen ViT of `kind` in memory.
pub fn tiny_qwen(kind: QwenKind, text_hidden: usize, seed: u64) -> Result<VisionTower> {
    let p = QwenParams::tiny(kind, text_hidden);
    let w = random_qwen(&p, seed)?;
    Ok(VisionTower::new_qwen(p, w))
}
