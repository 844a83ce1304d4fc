//! The CPU reference pieces both towers use (siglip.rs, qwenvit.rs), in f32: the products, the
//! LayerNorm, tanh-GELU, softmax attention over key groups and the weights' digest. Rows run in
//! parallel (rayon), each row's arithmetic in one fixed order.

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::quant::dot_f32;

/// `y[r] = W x[r] + b` for `m` rows of `k` values (W `[n][k]`).
pub(super) fn linear(x: &[f32], k: usize, w: &[f32], b: &[f32]) -> Vec<f32> {
    let n = b.len();
    let m = x.len() / k;
    let mut y = vec![0f32; m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(r, out)| {
        let xr = &x[r * k..(r + 1) * k];
        for (j, o) in out.iter_mut().enumerate() {
            *o = dot_f32(&w[j * k..(j + 1) * k], xr) + b[j];
        }
    });
    y
}

/// LayerNorm of each row (mean and variance over the row, two passes).
pub(super) fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let h = w.len();
    let mut y = x.to_vec();
    y.par_chunks_mut(h).for_each(|row| {
        let mean = row.iter().sum::<f32>() / h as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, &g), &c) in row.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * inv * g + c;
        }
    });
    y
}

pub(super) fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// Softmax attention of each row `i` over the rows `keys(i)` (visited in that order),
/// `heads` heads of `d`, scale `1 / sqrt(d)`: returns `rows x heads*d`.
pub(super) fn attention<'a>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    d: usize,
    keys: impl Fn(usize) -> &'a [u32] + Sync,
) -> Vec<f32> {
    let w = heads * d;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(w).enumerate().for_each(|(i, row)| {
        let keys = keys(i);
        let mut s = vec![0f32; keys.len()];
        for h in 0..heads {
            let qi = &q[i * w + h * d..i * w + (h + 1) * d];
            let mut max = f32::NEG_INFINITY;
            for (sj, &j) in s.iter_mut().zip(keys) {
                let j = j as usize;
                *sj = dot_f32(qi, &k[j * w + h * d..j * w + (h + 1) * d]) * scale;
                max = max.max(*sj);
            }
            let mut sum = 0f32;
            for sj in s.iter_mut() {
                *sj = (*sj - max).exp();
                sum += *sj;
            }
            let o = &mut row[h * d..(h + 1) * d];
            for (&pj, &j) in s.iter().zip(keys) {
                let j = j as usize;
                for (a, &b) in o.iter_mut().zip(&v[j * w + h * d..j * w + (h + 1) * d]) {
                    *a += pj * b;
                }
            }
            for a in o.iter_mut() {
                *a /= sum;
            }
        }
    });
    out
}

/// SHA-256 of `head` (the tower's shape) and every tensor's length and bits: a tower's
/// identity in content hashes.
pub(super) fn digest(head: &str, tensors: &[&[f32]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(head.as_bytes());
    for t in tensors {
        h.update((t.len() as u64).to_le_bytes());
        for v in *t {
            h.update(v.to_le_bytes());
        }
    }
    h.finalize().into()
}
