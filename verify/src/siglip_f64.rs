//! A float64 reference of Gemma 3's vision tower in Rust, for `memra-verify vision --reference
//! f64` where python with numpy and gguf is not installed (the GPU machines). It follows
//! verify/reference/siglip_reference.py operation for operation and shares no arithmetic with
//! engine/src/vision/siglip.rs: the metadata is read here key by key, the tensors are only
//! dequantized by the GGUF reader (to f32, exact for F32 / F16 / BF16 files, as gguf-py's
//! `dequantize`), and everything else is f64: the patch convolution as a product over the
//! unrolled patch, LayerNorm, softmax attention, tanh-GELU, the average pool, RMSNorm and the
//! projection. With both references run, the gate reports their distance too (f32 output:
//! they agree to the last bits or so).

use std::collections::HashMap;
use std::path::Path;

use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::{Gguf, MetaValue};

/// The tower's shape and its weights as f64, by GGUF tensor name.
pub struct Reference {
    size: usize,
    patch: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    eps: f64,
    pool: usize,
    mean: [f64; 3],
    std: [f64; 3],
    w: HashMap<String, Vec<f64>>,
}

fn uint(g: &Gguf, key: &str) -> Result<usize> {
    g.get_u64(key)
        .map(|v| v as usize)
        .ok_or_else(|| Error::Input(format!("mmproj: `{key}` is missing")))
}

fn triplet(g: &Gguf, key: &str) -> [f64; 3] {
    let v: Vec<f64> = g
        .get(key)
        .and_then(MetaValue::as_array)
        .map(|a| a.iter().filter_map(MetaValue::as_f64).collect())
        .unwrap_or_default();
    match v.as_slice() {
        [a, b, c] => [*a, *b, *c],
        _ => [0.5; 3],
    }
}

impl Reference {
    pub fn open(path: &Path) -> Result<Reference> {
        let g = Gguf::open(path)?;
        if g.get_str("clip.projector_type") != Some("gemma3") {
            return Err(Error::Input(
                "the f64 reference implements the gemma3 projector only".into(),
            ));
        }
        let k = |s: &str| format!("clip.vision.{s}");
        let mut w = HashMap::new();
        for t in g.tensors() {
            let name = t.name.clone();
            let tensor = g
                .tensor(&name)
                .ok_or_else(|| Error::Input(format!("mmproj: tensor {name} unreadable")))?;
            let v = tensor.to_f32()?.into_iter().map(f64::from).collect();
            w.insert(name, v);
        }
        Ok(Reference {
            size: uint(&g, &k("image_size"))?,
            patch: uint(&g, &k("patch_size"))?,
            hidden: uint(&g, &k("embedding_length"))?,
            layers: uint(&g, &k("block_count"))?,
            heads: uint(&g, &k("attention.head_count"))?,
            eps: g
                .get_f64(&k("attention.layer_norm_epsilon"))
                .unwrap_or(1e-6),
            pool: g
                .get_u64(&k("projector.scale_factor"))
                .map_or(4, |v| v as usize),
            mean: triplet(&g, &k("image_mean")),
            std: triplet(&g, &k("image_std")),
            w,
        })
    }

    fn t(&self, name: &str) -> Result<&[f64]> {
        self.w
            .get(name)
            .map(|v| v.as_slice())
            .ok_or_else(|| Error::Input(format!("mmproj: tensor {name} is missing")))
    }

    /// The embedding rows (tokens x text width, as f32) of one `size x size` RGB image.
    pub fn embed(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let (s, p, h) = (self.size, self.patch, self.hidden);
        if rgb.len() != s * s * 3 || p == 0 || s % p != 0 || self.heads == 0 {
            return Err(Error::Input(format!(
                "f64 reference: {} bytes for a {s}x{s} image",
                rgb.len()
            )));
        }
        let g = s / p;
        // Patch embedding: x[patch][o] = sum over (c, dy, dx) of pixel * W[o][c][dy][dx].
        let (pw, pb) = (self.t("v.patch_embd.weight")?, self.t("v.patch_embd.bias")?);
        let pos = self.t("v.position_embd.weight")?;
        let cols = 3 * p * p;
        let mut x = vec![vec![0f64; h]; g * g];
        for (pi, row) in x.iter_mut().enumerate() {
            let (gy, gx) = (pi / g, pi % g);
            let mut col = Vec::with_capacity(cols);
            for c in 0..3 {
                for dy in 0..p {
                    for dx in 0..p {
                        let (y, xx) = (gy * p + dy, gx * p + dx);
                        let v = f64::from(rgb[(y * s + xx) * 3 + c]) / 255.0;
                        col.push((v - self.mean[c]) / self.std[c]);
                    }
                }
            }
            for (o, r) in row.iter_mut().enumerate() {
                let wrow = &pw[o * cols..(o + 1) * cols];
                *r = dot(&col, wrow) + pb[o] + pos[pi * h + o];
            }
        }
        for l in 0..self.layers {
            self.block(l, &mut x)?;
        }
        let (lw, lb) = (self.t("v.post_ln.weight")?, self.t("v.post_ln.bias")?);
        for r in x.iter_mut() {
            *r = layer_norm(r, lw, lb, self.eps);
        }
        // Average pool of k x k patches, RMSNorm, projection.
        let k = self.pool.max(1);
        let side = g / k;
        let norm = self.t("mm.soft_emb_norm.weight")?;
        let proj = self.t("mm.input_projection.weight")?;
        let text = proj.len() / h.max(1);
        let mut out = Vec::with_capacity(side * side * text);
        for sy in 0..side {
            for sx in 0..side {
                let mut m = vec![0f64; h];
                for ky in 0..k {
                    for kx in 0..k {
                        let r = &x[(sy * k + ky) * g + sx * k + kx];
                        for (a, b) in m.iter_mut().zip(r) {
                            *a += b;
                        }
                    }
                }
                let kk = (k * k) as f64;
                m.iter_mut().for_each(|v| *v /= kk);
                let ms = m.iter().map(|v| v * v).sum::<f64>() / h as f64;
                let inv = 1.0 / (ms + self.eps).sqrt();
                let m: Vec<f64> = m.iter().zip(norm).map(|(v, w)| v * inv * w).collect();
                for j in 0..text {
                    let v: f64 = (0..h).map(|i| m[i] * proj[i * text + j]).sum();
                    out.push(v as f32);
                }
            }
        }
        Ok(out)
    }

    /// One ViT block: pre-LN attention and pre-LN GELU MLP, each added to the residual.
    fn block(&self, l: usize, x: &mut [Vec<f64>]) -> Result<()> {
        let b = |n: &str| self.t(&format!("v.blk.{l}.{n}"));
        let (h, nh) = (self.hidden, self.heads);
        let d = h / nh;
        let a: Vec<Vec<f64>> = x
            .iter()
            .map(|r| Ok(layer_norm(r, b("ln1.weight")?, b("ln1.bias")?, self.eps)))
            .collect::<Result<_>>()?;
        let lin = |n: &str| -> Result<Vec<Vec<f64>>> {
            let (w, bias) = (b(&format!("{n}.weight"))?, b(&format!("{n}.bias"))?);
            Ok(a.iter().map(|r| linear(r, w, bias)).collect())
        };
        let (q, k, v) = (lin("attn_q")?, lin("attn_k")?, lin("attn_v")?);
        let n = x.len();
        let mut o = vec![vec![0f64; h]; n];
        let scale = 1.0 / (d as f64).sqrt();
        for hd in 0..nh {
            let c = hd * d..(hd + 1) * d;
            for i in 0..n {
                let sc: Vec<f64> = (0..n)
                    .map(|j| dot(&q[i][c.clone()], &k[j][c.clone()]) * scale)
                    .collect();
                let mx = sc.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for (dd, oo) in o[i][c.clone()].iter_mut().enumerate() {
                        *oo += ej / sum * v[j][hd * d + dd];
                    }
                }
            }
        }
        let (ow, ob) = (b("attn_out.weight")?, b("attn_out.bias")?);
        for (r, oi) in x.iter_mut().zip(&o) {
            for (a, y) in r.iter_mut().zip(linear(oi, ow, ob)) {
                *a += y;
            }
        }
        let (uw, ub) = (b("ffn_up.weight")?, b("ffn_up.bias")?);
        let (dw, db) = (b("ffn_down.weight")?, b("ffn_down.bias")?);
        let (g2, b2) = (b("ln2.weight")?, b("ln2.bias")?);
        for r in x.iter_mut() {
            let a = layer_norm(r, g2, b2, self.eps);
            let u: Vec<f64> = linear(&a, uw, ub).into_iter().map(gelu_tanh).collect();
            for (a, y) in r.iter_mut().zip(linear(&u, dw, db)) {
                *a += y;
            }
        }
        Ok(())
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `x @ W.T + b` for `W` of shape `[out, in]`.
fn linear(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let n = x.len();
    (0..b.len())
        .map(|o| dot(x, &w[o * n..(o + 1) * n]) + b[o])
        .collect()
}

fn layer_norm(x: &[f64], g: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mu = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    x.iter()
        .zip(g.iter().zip(b))
        .map(|(v, (g, b))| (v - mu) * inv * g + b)
        .collect()
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}
