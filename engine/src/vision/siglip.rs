//! The CPU reference forward of Gemma 3's tower (HF `SiglipVisionModel` +
//! `Gemma3MultiModalProjector`, llama.cpp `clip_graph_siglip` with projector `gemma3`), in f32:
//! patch embedding (a stride-`patch` convolution as one product per patch) plus learned
//! positions; per block `x += attn(LN1(x))`, `x += fc2(gelu_tanh(fc1(LN2(x))))` with full
//! (bidirectional) attention over the patches; the final LayerNorm; average pooling of the
//! patch grid in `pool x pool` windows (tokens row-major over the pooled grid); RMSNorm times
//! `soft_norm`; `x @ proj`. Rows run in parallel (rayon), each row's arithmetic in one fixed
//! order, so the result does not depend on the thread count.

use rayon::prelude::*;

use super::TowerParams;
use super::vit_ops::{attention, digest, gelu_tanh, layer_norm, linear};

/// One encoder block's weights (matrices `[out][in]`, row-major).
pub struct Layer {
    pub ln1_w: Vec<f32>,
    pub ln1_b: Vec<f32>,
    pub q_w: Vec<f32>,
    pub q_b: Vec<f32>,
    pub k_w: Vec<f32>,
    pub k_b: Vec<f32>,
    pub v_w: Vec<f32>,
    pub v_b: Vec<f32>,
    pub o_w: Vec<f32>,
    pub o_b: Vec<f32>,
    pub ln2_w: Vec<f32>,
    pub ln2_b: Vec<f32>,
    pub up_w: Vec<f32>,
    pub up_b: Vec<f32>,
    pub down_w: Vec<f32>,
    pub down_b: Vec<f32>,
}

/// The tower's weights in f32, in the shapes of [`TowerParams::tensor_shapes`].
pub struct TowerWeights {
    pub patch_w: Vec<f32>,
    pub patch_b: Vec<f32>,
    pub pos: Vec<f32>,
    pub layers: Vec<Layer>,
    pub post_w: Vec<f32>,
    pub post_b: Vec<f32>,
    pub soft_norm: Vec<f32>,
    /// `[hidden][text_hidden]`.
    pub proj: Vec<f32>,
}

impl TowerWeights {
    /// Every tensor in [`TowerParams::tensor_shapes`] order.
    pub fn tensors(&self) -> Vec<&[f32]> {
        let mut v: Vec<&[f32]> = vec![&self.patch_w, &self.patch_b, &self.pos];
        for l in &self.layers {
            v.extend([
                &l.ln1_w[..],
                &l.ln1_b,
                &l.ln2_w,
                &l.ln2_b,
                &l.q_w,
                &l.q_b,
                &l.k_w,
                &l.k_b,
                &l.v_w,
                &l.v_b,
                &l.o_w,
                &l.o_b,
                &l.up_w,
                &l.up_b,
                &l.down_w,
                &l.down_b,
            ]);
        }
        v.extend([&self.post_w[..], &self.post_b, &self.soft_norm, &self.proj]);
        v
    }

    /// Builds the weights from tensors in [`TowerParams::tensor_shapes`] order.
    pub fn from_tensors(p: &TowerParams, mut t: Vec<Vec<f32>>) -> TowerWeights {
        t.reverse();
        let mut next = || t.pop().unwrap_or_default();
        let (patch_w, patch_b, pos) = (next(), next(), next());
        let layers = (0..p.layers)
            .map(|_| {
                let (ln1_w, ln1_b, ln2_w, ln2_b) = (next(), next(), next(), next());
                let (q_w, q_b, k_w, k_b) = (next(), next(), next(), next());
                let (v_w, v_b, o_w, o_b) = (next(), next(), next(), next());
                let (up_w, up_b, down_w, down_b) = (next(), next(), next(), next());
                Layer {
                    ln1_w,
                    ln1_b,
                    q_w,
                    q_b,
                    k_w,
                    k_b,
                    v_w,
                    v_b,
                    o_w,
                    o_b,
                    ln2_w,
                    ln2_b,
                    up_w,
                    up_b,
                    down_w,
                    down_b,
                }
            })
            .collect();
        TowerWeights {
            patch_w,
            patch_b,
            pos,
            layers,
            post_w: next(),
            post_b: next(),
            soft_norm: next(),
            proj: next(),
        }
    }

    /// SHA-256 of the shape and every weight's bits: the tower's identity in content hashes.
    pub fn digest(&self, p: &TowerParams) -> [u8; 32] {
        digest(&format!("{p:?}"), &self.tensors())
    }
}

/// The patch rows: each patch's `3 x patch x patch` values (channel, y, x) times the
/// convolution's weights, plus its bias and its position's embedding.
fn embed_patches(p: &TowerParams, w: &TowerWeights, px: &[f32]) -> Vec<f32> {
    let (s, ps, g) = (p.image_size, p.patch_size, p.grid());
    let k = 3 * ps * ps;
    let mut cols = vec![0f32; p.patches() * k];
    for (i, col) in cols.chunks_mut(k).enumerate() {
        let (py, pxx) = (i / g, i % g);
        for c in 0..3 {
            for y in 0..ps {
                let src = c * s * s + (py * ps + y) * s + pxx * ps;
                col[c * ps * ps + y * ps..c * ps * ps + (y + 1) * ps]
                    .copy_from_slice(&px[src..src + ps]);
            }
        }
    }
    let mut x = linear(&cols, k, &w.patch_w, &w.patch_b);
    for (a, b) in x.iter_mut().zip(&w.pos) {
        *a += b;
    }
    x
}

/// Average pool of the `grid x grid` rows in `pool x pool` windows, then RMSNorm times
/// `soft_norm`, then the projection.
fn project(p: &TowerParams, w: &TowerWeights, x: &[f32]) -> Vec<f32> {
    let (h, g, k) = (p.hidden, p.grid(), p.pool);
    let side = g / k;
    let mut pooled = vec![0f32; side * side * h];
    let inv = 1.0 / (k * k) as f32;
    for (t, row) in pooled.chunks_mut(h).enumerate() {
        let (ty, tx) = (t / side, t % side);
        for y in 0..k {
            for xx in 0..k {
                let src = (ty * k + y) * g + tx * k + xx;
                for (a, b) in row.iter_mut().zip(&x[src * h..(src + 1) * h]) {
                    *a += b;
                }
            }
        }
        for a in row.iter_mut() {
            *a *= inv;
        }
    }
    let n = p.text_hidden;
    let mut out = vec![0f32; side * side * n];
    out.par_chunks_mut(n)
        .zip(pooled.par_chunks(h))
        .for_each(|(o, row)| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / h as f32;
            let r = 1.0 / (ms + p.eps).sqrt();
            for (c, (&v, &g)) in row.iter().zip(&w.soft_norm).enumerate() {
                let a = v * r * g;
                for (oj, &wj) in o.iter_mut().zip(&w.proj[c * n..(c + 1) * n]) {
                    *oj += a * wj;
                }
            }
        });
    out
}

/// The embedding rows (`tokens_per_image x text_hidden`) of one image's input values.
pub fn forward(p: &TowerParams, w: &TowerWeights, px: &[f32]) -> Vec<f32> {
    let h = p.hidden;
    // Full (bidirectional) attention: every row over every patch.
    let all: Vec<u32> = (0..p.patches() as u32).collect();
    let mut x = embed_patches(p, w, px);
    for l in &w.layers {
        let a = layer_norm(&x, &l.ln1_w, &l.ln1_b, p.eps);
        let q = linear(&a, h, &l.q_w, &l.q_b);
        let k = linear(&a, h, &l.k_w, &l.k_b);
        let v = linear(&a, h, &l.v_w, &l.v_b);
        let att = attention(&q, &k, &v, p.heads, p.head_dim(), |_| &all);
        let o = linear(&att, h, &l.o_w, &l.o_b);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let a = layer_norm(&x, &l.ln2_w, &l.ln2_b, p.eps);
        let mut u = linear(&a, h, &l.up_w, &l.up_b);
        u.iter_mut().for_each(|v| *v = gelu_tanh(*v));
        let d = linear(&u, p.ffn, &l.down_w, &l.down_b);
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
    }
    let x = layer_norm(&x, &w.post_w, &w.post_b, p.eps);
    project(p, w, &x)
}
