//! The CPU reference forward of the Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower (HF
//! `Qwen2VisionTransformerPretrainedModel`, `Qwen2_5_VisionTransformerPretrainedModel`,
//! `Qwen3VLVisionModel`; llama.cpp mtmd projectors `qwen2vl_merger`, `qwen2.5vl_merger`,
//! `qwen3vl_merger`), in f32.
//!
//! An image of `H x W` pixels (both multiples of `patch * merge`, [`QwenParams::input_size`])
//! is cut into `patch x patch` patches, ordered so that each `merge x merge` block of the grid is
//! consecutive (blocks row-major, patches row-major inside a block). Each patch's row is a product
//! over its `2 x 3 x patch x patch` values (frame, channel, y, x): a still image is both frames of
//! the temporal patch, a video's frames `2k` and `2k + 1` are group `k`'s ([`forward_pair`]).
//! Then (Qwen3-VL) a bias and the learned positions, bilinearly interpolated from their square
//! grid to the patch grid (align corners). Per block:
//! `x += attn(norm1(x))`, `x += ffn(norm2(x))`, the norms LayerNorm (Qwen2-VL, Qwen3-VL) or
//! RMSNorm (Qwen2.5-VL); q and k of each head rotated by the 2D RoPE (the first half of the
//! rotated pairs by the patch's row, the second by its column, `rotate_half` pairs `i`,
//! `i + d/2`, frequencies `10000^(-4j/d)`); attention over every patch, or (Qwen2.5-VL, layers
//! other than every `wa_pattern`-th) over the patches of the patch's window (`window / patch /
//! merge` merged tokens a side, windows from the top-left corner). The FFN is `fc2(act(fc1 x))`
//! (QuickGELU: Qwen2-VL; tanh-GELU: Qwen3-VL) or `down(silu(gate x) * up x)` (Qwen2.5-VL).
//! The merger: the final norm per patch, each `merge x merge` block's rows side by side
//! (`merge^2 x hidden` values), `fc2(gelu_erf(fc1 x))` into the text width. Qwen3-VL's
//! deepstack mergers take the output of their layers the same way (the norm over the block's
//! concatenated values) and their rows follow the main ones in each output row (llama.cpp's
//! layout: `text_hidden x (1 + deepstack)` values per token).
//!
//! Rows run in parallel (rayon), each row's arithmetic in one fixed order, so the result does
//! not depend on the thread count. Keys of a window are visited in patch order.

use rayon::prelude::*;

use super::vit_ops::{attention, digest, gelu_tanh, layer_norm, linear};
use crate::error::{Error, Result};

/// The member of the family (llama.cpp's projector type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QwenKind {
    /// `qwen2vl_merger`: LayerNorm, QuickGELU FFN, full attention.
    Qwen2Vl,
    /// `qwen2.5vl_merger`: RMSNorm, SiLU-gated FFN, window attention.
    Qwen25Vl,
    /// `qwen3vl_merger`: LayerNorm, tanh-GELU FFN, patch bias, learned positions, deepstack.
    Qwen3Vl,
}

impl QwenKind {
    /// llama.cpp's `clip.projector_type`.
    pub fn projector(self) -> &'static str {
        match self {
            QwenKind::Qwen2Vl => "qwen2vl_merger",
            QwenKind::Qwen25Vl => "qwen2.5vl_merger",
            QwenKind::Qwen3Vl => "qwen3vl_merger",
        }
    }

    pub fn from_projector(s: &str) -> Option<QwenKind> {
        [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl]
            .into_iter()
            .find(|k| k.projector() == s)
    }

    /// Whether the norms are RMSNorm (no bias) rather than LayerNorm.
    pub fn rms(self) -> bool {
        self == QwenKind::Qwen25Vl
    }
}

/// The FFN activation of the blocks (llama.cpp `clip.use_gelu` / `clip.use_silu` / neither).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VitAct {
    QuickGelu,
    GeluTanh,
    /// SiLU of the gate times the up projection.
    SiluGated,
}

/// The shape of a Qwen vision tower and its image preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenParams {
    pub kind: QwenKind,
    pub act: VitAct,
    pub patch_size: usize,
    /// Side of the merged block (2).
    pub merge: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub eps: f32,
    /// Width of the main output rows (the text model's hidden size).
    pub text_hidden: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Window attention: every `wa_pattern`-th layer attends fully, the others within windows
    /// (Qwen2.5-VL: 8); 0: every layer attends fully.
    pub wa_pattern: usize,
    /// Side of an attention window in pixels (112).
    pub window: usize,
    /// Side of the learned position grid (Qwen3-VL: 48); 0: none.
    pub pos_grid: usize,
    /// Layers whose output feeds a deepstack merger, ascending (Qwen3-VL).
    pub deepstack: Vec<usize>,
    /// A square input side the tower takes as is (tests, `image_size`).
    pub image_size: usize,
    /// Bounds of the resized image's area ([`QwenParams::input_size`]).
    pub min_pixels: usize,
    pub max_pixels: usize,
    /// Temporal positions a second of video spans (HF `vision_config.tokens_per_second`,
    /// Qwen2.5-VL's video M-RoPE; the released models' 2).
    pub tokens_per_second: usize,
}

/// OpenAI CLIP's image mean and std (Qwen2-VL, Qwen2.5-VL).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

impl QwenParams {
    /// Pixels per merged token side.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Values of one output row: the main merger's and each deepstack merger's.
    pub fn out_width(&self) -> usize {
        self.text_hidden * (1 + self.deepstack.len())
    }

    /// Merged tokens a window side (Qwen2.5-VL: 112 / 14 / 2 = 4).
    pub fn window_tokens(&self) -> usize {
        (self.window / self.factor()).max(1)
    }

    /// Whether layer `l` attends within windows.
    pub fn windowed(&self, l: usize) -> bool {
        self.wa_pattern > 0 && !(l + 1).is_multiple_of(self.wa_pattern)
    }

    /// Output rows of an input image of `w x h` pixels (multiples of [`QwenParams::factor`]).
    pub fn tokens(&self, w: usize, h: usize) -> usize {
        (w / self.factor()) * (h / self.factor())
    }

    /// The merged-token grid `(rows, cols)` of a `w x h` input: `h / (patch * merge)` by
    /// `w / (patch * merge)`, rows in raster order (HF's `llm_grid_h`, `llm_grid_w`).
    pub fn grid(&self, w: usize, h: usize) -> (usize, usize) {
        (h / self.factor(), w / self.factor())
    }

    /// The size an image of `w x h` pixels is resized to (HF `smart_resize`): both sides
    /// rounded to multiples of `patch * merge` (half to even), then scaled down (rounding
    /// down) to at most `max_pixels` or up (rounding up) to at least `min_pixels`, keeping
    /// the aspect ratio as well as the rounding allows. Returns `(w, h)`.
    pub fn input_size(&self, w: usize, h: usize) -> Result<(usize, usize)> {
        let f = self.factor() as f64;
        let (wf, hf) = (w as f64, h as f64);
        if w == 0 || h == 0 || wf.max(hf) / wf.min(hf) > 200.0 {
            return Err(Error::Input(format!(
                "a {w}x{h} image: the sides must be non-zero and within 200:1 of each other"
            )));
        }
        let round = |v: f64| (v / f).round_ties_even().max(1.0) * f;
        let (mut nw, mut nh) = (round(wf), round(hf));
        if nw * nh > self.max_pixels as f64 {
            let beta = (wf * hf / self.max_pixels as f64).sqrt();
            nh = ((hf / beta / f).floor() * f).max(f);
            nw = ((wf / beta / f).floor() * f).max(f);
        } else if nw * nh < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (wf * hf)).sqrt();
            nh = (hf * beta / f).ceil() * f;
            nw = (wf * beta / f).ceil() * f;
        }
        Ok((nw as usize, nh as usize))
    }

    /// Refuses shapes the forward cannot run (a corrupt or foreign file).
    pub fn check(&self) -> Result<()> {
        let bad = |w: String| Err(Error::Config(format!("mmproj: {w}")));
        if self.patch_size == 0 || self.patch_size > 64 || self.merge == 0 || self.merge > 8 {
            return bad(format!(
                "patch size {} or merge size {} out of range",
                self.patch_size, self.merge
            ));
        }
        if self.heads == 0 || self.hidden == 0 || !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "{} heads do not divide the width {}",
                self.heads, self.hidden
            ));
        }
        if !self.head_dim().is_multiple_of(4) {
            return bad(format!(
                "head size {} is not a multiple of 4 (2D rotary)",
                self.head_dim()
            ));
        }
        if self.ffn == 0 || self.text_hidden == 0 || self.layers == 0 || self.layers > 256 {
            return bad(format!(
                "ffn {}, text width {}, {} layers",
                self.ffn, self.text_hidden, self.layers
            ));
        }
        if self.deepstack.iter().any(|&l| l >= self.layers)
            || self.deepstack.windows(2).any(|w| w[0] >= w[1])
        {
            return bad(format!(
                "deepstack layers {:?} of {}",
                self.deepstack, self.layers
            ));
        }
        if self.wa_pattern > 0 && self.window < self.factor() {
            return bad(format!(
                "window of {} pixels under one merged token ({})",
                self.window,
                self.factor()
            ));
        }
        if self.pos_grid > 1024 {
            return bad(format!("position grid of {} a side", self.pos_grid));
        }
        let f = self.factor();
        if self.image_size == 0 || !self.image_size.is_multiple_of(f) || self.image_size > 4096 {
            return bad(format!(
                "image size {} is not a multiple of {f} up to 4096",
                self.image_size
            ));
        }
        if self.min_pixels == 0
            || self.min_pixels > self.max_pixels
            || self.max_pixels > 4096 * 4096
        {
            return bad(format!(
                "image pixels {}..{}",
                self.min_pixels, self.max_pixels
            ));
        }
        if self.tokens_per_second == 0 || self.tokens_per_second > 1000 {
            return bad(format!(
                "{} video tokens per second (1..=1000)",
                self.tokens_per_second
            ));
        }
        if !(self.eps > 0.0 && self.eps < 1.0) || self.std.iter().any(|&s| s.abs() < 1e-6) {
            return bad("epsilon or image std out of range".into());
        }
        Ok(())
    }
}

/// One encoder block's weights (matrices `[out][in]`, row-major). RMSNorm towers have empty
/// norm biases; towers without a gate an empty gate.
pub struct QwenLayer {
    pub norm1_w: Vec<f32>,
    pub norm1_b: Vec<f32>,
    pub q_w: Vec<f32>,
    pub q_b: Vec<f32>,
    pub k_w: Vec<f32>,
    pub k_b: Vec<f32>,
    pub v_w: Vec<f32>,
    pub v_b: Vec<f32>,
    pub o_w: Vec<f32>,
    pub o_b: Vec<f32>,
    pub norm2_w: Vec<f32>,
    pub norm2_b: Vec<f32>,
    pub up_w: Vec<f32>,
    pub up_b: Vec<f32>,
    pub gate_w: Vec<f32>,
    pub gate_b: Vec<f32>,
    pub down_w: Vec<f32>,
    pub down_b: Vec<f32>,
}

/// A merger: a norm, `fc1` (`[m][m]`, m = merge^2 x hidden), GELU, `fc2` (`[out][m]`).
pub struct Merger {
    pub norm_w: Vec<f32>,
    pub norm_b: Vec<f32>,
    pub fc1_w: Vec<f32>,
    pub fc1_b: Vec<f32>,
    pub fc2_w: Vec<f32>,
    pub fc2_b: Vec<f32>,
}

/// The tower's weights in f32.
pub struct QwenWeights {
    /// `[hidden][2][3][patch][patch]`: both frames' convolution weights of each output.
    pub patch_w: Vec<f32>,
    /// `[hidden]` (zeros where the file has none).
    pub patch_b: Vec<f32>,
    /// `[pos_grid^2][hidden]` (Qwen3-VL), else empty.
    pub pos: Vec<f32>,
    pub layers: Vec<QwenLayer>,
    /// The main merger; its norm (`ln_q`) is per patch (`hidden` values).
    pub merger: Merger,
    /// The deepstack mergers, in [`QwenParams::deepstack`] order; their norms are over the
    /// merged block (`merge^2 x hidden` values).
    pub deepstack: Vec<Merger>,
}

impl Merger {
    fn tensors(&self) -> [&[f32]; 6] {
        [
            &self.norm_w,
            &self.norm_b,
            &self.fc1_w,
            &self.fc1_b,
            &self.fc2_w,
            &self.fc2_b,
        ]
    }
}

impl QwenWeights {
    /// Every tensor, in a fixed order (the digest's).
    pub fn tensors(&self) -> Vec<&[f32]> {
        let mut v: Vec<&[f32]> = vec![&self.patch_w, &self.patch_b, &self.pos];
        for l in &self.layers {
            v.extend([
                &l.norm1_w[..],
                &l.norm1_b,
                &l.q_w,
                &l.q_b,
                &l.k_w,
                &l.k_b,
                &l.v_w,
                &l.v_b,
                &l.o_w,
                &l.o_b,
                &l.norm2_w,
                &l.norm2_b,
                &l.up_w,
                &l.up_b,
                &l.gate_w,
                &l.gate_b,
                &l.down_w,
                &l.down_b,
            ]);
        }
        v.extend(self.merger.tensors());
        for m in &self.deepstack {
            v.extend(m.tensors());
        }
        v
    }

    /// SHA-256 of the shape and every weight's bits: the tower's identity in content hashes.
    pub fn digest(&self, p: &QwenParams) -> [u8; 32] {
        digest(&format!("qwen vit {p:?}"), &self.tensors())
    }
}

/// RMSNorm of each row of `w.len()` values, times `w`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let h = w.len();
    let mut y = x.to_vec();
    y.par_chunks_mut(h).for_each(|row| {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * r * g;
        }
    });
    y
}

/// The family's norm: RMSNorm where there is no bias, else LayerNorm.
fn norm(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    if b.is_empty() {
        rms_norm(x, w, eps)
    } else {
        layer_norm(x, w, b, eps)
    }
}

/// `erf(x)` to about 1e-7 (the Chebyshev fit of `erfc` of Numerical Recipes, `erfcc`), in f64.
fn erf(x: f64) -> f64 {
    const C: [f64; 10] = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = C.iter().rev().fold(0.0, |acc, &c| acc * t + c);
    let erfc = t * (-z * z + poly).exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

/// GELU with the exact (erf) form, as PyTorch's `nn.GELU()`.
fn gelu_erf(x: f32) -> f32 {
    (0.5 * x as f64 * (1.0 + erf(x as f64 * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

fn quick_gelu(x: f32) -> f32 {
    x / (1.0 + (-1.702 * x).exp())
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The patch grid of an input image: `gh x gw` patches, in merge-block order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    pub(crate) gh: usize,
    pub(crate) gw: usize,
    pub(crate) m: usize,
}

impl Grid {
    /// The grid of an input image of `w x h` pixels.
    pub(crate) fn of(p: &QwenParams, w: usize, h: usize) -> Grid {
        Grid {
            gh: h / p.patch_size,
            gw: w / p.patch_size,
            m: p.merge,
        }
    }

    pub(crate) fn n(&self) -> usize {
        self.gh * self.gw
    }

    /// Row and column of patch `i` (merge-block order).
    pub(crate) fn pos(&self, i: usize) -> (usize, usize) {
        let mm = self.m * self.m;
        let (b, r) = (i / mm, i % mm);
        let bw = self.gw / self.m;
        (
            (b / bw) * self.m + r / self.m,
            (b % bw) * self.m + r % self.m,
        )
    }
}

/// The patch rows (`n x 2*3*p*p`, frame / channel / y / x) of the temporal patch `[px0, px1]`
/// (each `[3][h][w]`): frame 0 meets the patch convolution's first temporal kernel, frame 1 its
/// second (a still image is both frames; a video's frames `2k` and `2k + 1`).
fn patch_cols(p: &QwenParams, g: Grid, w: usize, h: usize, px: [&[f32]; 2]) -> Vec<f32> {
    let ps = p.patch_size;
    let k = 3 * ps * ps;
    let mut cols = vec![0f32; g.n() * 2 * k];
    for (i, col) in cols.chunks_mut(2 * k).enumerate() {
        let (py, pxx) = g.pos(i);
        for (frame, half) in px.iter().zip(col.chunks_mut(k)) {
            for c in 0..3 {
                for y in 0..ps {
                    let src = c * w * h + (py * ps + y) * w + pxx * ps;
                    let dst = c * ps * ps + y * ps;
                    half[dst..dst + ps].copy_from_slice(&frame[src..src + ps]);
                }
            }
        }
    }
    cols
}

/// Adds the learned positions ([`positions`]).
fn add_positions(p: &QwenParams, wt: &QwenWeights, g: Grid, x: &mut [f32]) {
    let pos = positions(p, &wt.pos, g);
    x.par_iter_mut().zip(&pos).for_each(|(a, s)| *a += s);
}

/// The learned positions `pos` (`pos_grid^2 x hidden`) at every patch (`n x hidden`, patch
/// order), bilinearly interpolated (align corners) from their `pos_grid` square to the
/// `gh x gw` patch grid: per value the four corners' weighted sum in order, from 0 (the CUDA
/// tower adds the same values).
pub(crate) fn positions(p: &QwenParams, pos: &[f32], g: Grid) -> Vec<f32> {
    let (n, h) = (p.pos_grid, p.hidden);
    let coord = |i: usize, len: usize| -> (usize, usize, f32) {
        let v = if len > 1 {
            i as f64 * (n - 1) as f64 / (len - 1) as f64
        } else {
            0.0
        };
        let lo = (v.floor() as usize).min(n - 1);
        (lo, (lo + 1).min(n - 1), (v - lo as f64) as f32)
    };
    let mut out = vec![0f32; g.n() * h];
    out.par_chunks_mut(h).enumerate().for_each(|(i, row)| {
        let (py, pxx) = g.pos(i);
        let (y0, y1, dy) = coord(py, g.gh);
        let (x0, x1, dx) = coord(pxx, g.gw);
        let corners = [
            (y0 * n + x0, (1.0 - dy) * (1.0 - dx)),
            (y0 * n + x1, (1.0 - dy) * dx),
            (y1 * n + x0, dy * (1.0 - dx)),
            (y1 * n + x1, dy * dx),
        ];
        for (c, a) in row.iter_mut().enumerate() {
            let mut s = 0f32;
            for &(r, wgt) in &corners {
                s += wgt * pos[r * h + c];
            }
            *a = s;
        }
    });
    out
}

/// The 2D rotary table: per patch, `d/2` (cos, sin) pairs; pair `j < d/4` turns by the row
/// times `10000^(-4j/d)`, pair `d/4 + j` by the column times the same frequency.
pub(crate) fn rope_table(g: Grid, d: usize) -> Vec<(f32, f32)> {
    let q = d / 4;
    let mut t = Vec::with_capacity(g.n() * d / 2);
    for i in 0..g.n() {
        let (py, pxx) = g.pos(i);
        for half in [py, pxx] {
            for j in 0..q {
                let freq = 10000f64.powf(-((4 * j) as f64) / d as f64);
                let a = half as f64 * freq;
                t.push((a.cos() as f32, a.sin() as f32));
            }
        }
    }
    t
}

/// Rotates every head of every row of `x` (`n x heads*d`): `rotate_half` pairs `i`, `i + d/2`.
fn rope(x: &mut [f32], table: &[(f32, f32)], heads: usize, d: usize) {
    let half = d / 2;
    x.par_chunks_mut(heads * d)
        .enumerate()
        .for_each(|(i, row)| {
            let t = &table[i * half..(i + 1) * half];
            for head in row.chunks_mut(d) {
                let (a, b) = head.split_at_mut(half);
                for ((x1, x2), &(c, s)) in a.iter_mut().zip(b.iter_mut()).zip(t) {
                    let (u, v) = (*x1, *x2);
                    *x1 = u * c - v * s;
                    *x2 = v * c + u * s;
                }
            }
        });
}

/// Attention groups: patch `i` attends to the patches of `groups[of[i]]` (ascending).
pub(crate) struct Groups {
    pub(crate) groups: Vec<Vec<u32>>,
    of: Vec<u32>,
}

impl Groups {
    fn full(n: usize) -> Groups {
        Groups {
            groups: vec![(0..n as u32).collect()],
            of: vec![0; n],
        }
    }

    /// Windows of `ws x ws` merged tokens from the top-left corner (smaller at the edges).
    pub(crate) fn windows(g: Grid, ws: usize) -> Groups {
        let (th, tw) = (g.gh / g.m, g.gw / g.m);
        let (nh, nw) = (th.div_ceil(ws), tw.div_ceil(ws));
        let mut groups = vec![Vec::new(); nh * nw];
        let mut of = Vec::with_capacity(g.n());
        let mm = g.m * g.m;
        for i in 0..g.n() {
            let b = i / mm;
            let (by, bx) = (b / tw, b % tw);
            let id = (by / ws) * nw + bx / ws;
            groups[id].push(i as u32);
            of.push(id as u32);
        }
        Groups { groups, of }
    }
}

/// One block: `x += attn(norm1 x)`, `x += ffn(norm2 x)`.
fn block(p: &QwenParams, l: &QwenLayer, x: &mut [f32], table: &[(f32, f32)], gr: &Groups) {
    let (h, d) = (p.hidden, p.head_dim());
    let a = norm(x, &l.norm1_w, &l.norm1_b, p.eps);
    let mut q = linear(&a, h, &l.q_w, &l.q_b);
    let mut k = linear(&a, h, &l.k_w, &l.k_b);
    let v = linear(&a, h, &l.v_w, &l.v_b);
    rope(&mut q, table, p.heads, d);
    rope(&mut k, table, p.heads, d);
    let att = attention(&q, &k, &v, p.heads, d, |i| &gr.groups[gr.of[i] as usize]);
    let o = linear(&att, h, &l.o_w, &l.o_b);
    x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
    let a = norm(x, &l.norm2_w, &l.norm2_b, p.eps);
    let mut u = linear(&a, h, &l.up_w, &l.up_b);
    match p.act {
        VitAct::QuickGelu => u.iter_mut().for_each(|v| *v = quick_gelu(*v)),
        VitAct::GeluTanh => u.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        VitAct::SiluGated => {
            let gate = linear(&a, h, &l.gate_w, &l.gate_b);
            u.iter_mut().zip(&gate).for_each(|(v, &g)| *v *= silu(g));
        }
    }
    let dn = linear(&u, p.ffn, &l.down_w, &l.down_b);
    x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
}

/// A merger over `x` (patch rows in merge-block order): the norm (per patch when its weight
/// has `hidden` values, per merged block when `merge^2 x hidden`), the block's rows side by
/// side, then `fc2(gelu_erf(fc1 ·))`. Returns `tokens x text_hidden` values.
fn merge(p: &QwenParams, m: &Merger, x: &[f32]) -> Vec<f32> {
    let wide = p.hidden * p.merge * p.merge;
    let normed = norm(x, &m.norm_w, &m.norm_b, p.eps);
    let mut u = linear(&normed, wide, &m.fc1_w, &m.fc1_b);
    u.iter_mut().for_each(|v| *v = gelu_erf(*v));
    linear(&u, wide, &m.fc2_w, &m.fc2_b)
}

/// The output rows (`tokens x out_width`) of one input image of `w x h` pixels given as
/// `[3][h][w]` normalised values.
pub fn forward(p: &QwenParams, wt: &QwenWeights, w: usize, h: usize, px: &[f32]) -> Vec<f32> {
    forward_pair(p, wt, w, h, [px, px])
}

/// The output rows of one temporal patch: two frames of `w x h` pixels (`[3][h][w]` values
/// each), frame 0 through the patch convolution's first temporal kernel, frame 1 through its
/// second. A video's frame group: every other step is per patch or within the group (HF
/// attends within each group: `cu_seqlens` of `h x w` patches per temporal patch, the windows
/// of Qwen2.5-VL inside it; the 2D rotary table and the learned positions repeat per group;
/// the merger is per merged block), so a video's rows are its groups' rows one after another.
pub fn forward_pair(
    p: &QwenParams,
    wt: &QwenWeights,
    w: usize,
    h: usize,
    px: [&[f32]; 2],
) -> Vec<f32> {
    let g = Grid::of(p, w, h);
    let cols = patch_cols(p, g, w, h, px);
    let mut x = linear(
        &cols,
        6 * p.patch_size * p.patch_size,
        &wt.patch_w,
        &wt.patch_b,
    );
    if p.pos_grid > 0 {
        add_positions(p, wt, g, &mut x);
    }
    let table = rope_table(g, p.head_dim());
    let full = Groups::full(g.n());
    let windows = (p.wa_pattern > 0).then(|| Groups::windows(g, p.window_tokens()));
    let mut deep = Vec::with_capacity(p.deepstack.len());
    for (i, l) in wt.layers.iter().enumerate() {
        let gr = match &windows {
            Some(win) if p.windowed(i) => win,
            _ => &full,
        };
        block(p, l, &mut x, &table, gr);
        if let Some(k) = p.deepstack.iter().position(|&d| d == i) {
            deep.push(merge(p, &wt.deepstack[k], &x));
        }
    }
    let main = merge(p, &wt.merger, &x);
    if deep.is_empty() {
        return main;
    }
    let t = p.text_hidden;
    let mut out = Vec::with_capacity(main.len() * (1 + deep.len()));
    for r in 0..main.len() / t {
        out.extend_from_slice(&main[r * t..(r + 1) * t]);
        for d in &deep {
            out.extend_from_slice(&d[r * t..(r + 1) * t]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-2.0, -0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
        ] {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn patches_are_in_merge_block_order() {
        let g = Grid { gh: 4, gw: 6, m: 2 };
        let got: Vec<_> = (0..8).map(|i| g.pos(i)).collect();
        assert_eq!(
            got,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        assert_eq!(g.pos(12), (2, 0));
    }

    #[test]
    fn windows_tile_the_merged_grid_from_the_top_left() {
        // 6 x 10 merged tokens, windows of 4: 2 x 3 windows, the last row and column smaller.
        let g = Grid {
            gh: 12,
            gw: 20,
            m: 2,
        };
        let w = Groups::windows(g, 4);
        let sizes: Vec<usize> = w.groups.iter().map(|m| m.len() / 4).collect();
        assert_eq!(sizes, [16, 16, 8, 8, 8, 4]);
        assert_eq!(w.of.len(), g.n());
        assert!(w.groups.iter().all(|m| m.windows(2).all(|p| p[0] < p[1])));
    }
}
