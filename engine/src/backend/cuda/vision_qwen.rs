//! The Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower on a CUDA device (kernels/cu/vision.cu):
//! the function of the CPU reference (vision/qwenvit.rs) on the GPU, one image at a time, its
//! products and attention on tensor cores (f16 inputs, f32 accumulation), written over
//! [`TowerDevice`] like Gemma 3's tower (vision.rs).
//!
//! [`CudaQwenTower::new`] uploads the weights once (Q, K and V of a block as one `[3 hidden]
//! [hidden]` matrix and bias; every matrix as f16 rows, zero-padded to the products' K tile)
//! and allocates the activations of the largest image the tower takes (`max_pixels`; a larger
//! one grows them), so the memory is taken before a backend on the same device sizes its KV
//! cache.
//!
//! [`CudaQwenTower::forward`] of a `w x h` image (and [`CudaQwenTower::forward_pair`] of a
//! video's frame group, two frames through the two temporal kernels) runs every patch as one
//! row, in the tower's row
//! order: the CPU's merge-block order, or (window attention, Qwen2.5-VL) the windows one after
//! another, each window's patches in merge-block order (HF's `window_index`): each window is then
//! consecutive rows, each merged 2 x 2 block still four consecutive rows, and the rows go back to
//! the CPU's order when the output is read. The host computes the per-image tables the CPU
//! computes the same way (the 2D rotary table in f64, Qwen3-VL's interpolated learned positions in
//! f32; vision/qwenvit.rs `rope_table`, `positions`) and uploads them with the patch positions and
//! the window tiles. Then: the patch rows (both frames of the temporal patch the same image, or
//! the group's two frames), the
//! patch product (+ bias), the positions; per block the norm (LayerNorm, or RMSNorm where the
//! norm has no bias: Qwen2.5-VL), the Q/K/V product, the rotary embedding of Q and K (f32), Q/K/V
//! as f16 per head, attention
//! (over every row, or within the row's window), the output product added into the residual, the
//! norm, the FFN (QuickGELU, tanh-GELU, or SiLU-gated: the gate's product multiplies the up
//! product in its epilogue), the down product added into the residual; after each deepstack
//! layer (Qwen3-VL) its merger; the main merger (the norm, each merged block's four rows side by
//! side, `fc2(gelu_erf(fc1 ·))`). Every kernel computes each value in one fixed order (no
//! atomics): an image's rows are the same bits run after run on a device class.

use std::sync::Mutex;

use super::device::Gpu;
use super::vision::{DevMat, TowerDevice, product_of, upload_mat};
use super::vision_kernels::{ATT_ROWS, Epilogue, HEAD_DIMS, TowerKernels, half_qkv_len};
use crate::error::{Error, Result};
use crate::vision::qwenvit::{Grid, Groups, Merger, VitAct, positions, rope_table};
use crate::vision::{QwenParams, QwenWeights};

/// A norm's weights: LayerNorm with a bias, RMSNorm without; over rows of `width`.
struct DevNorm<D: TowerDevice> {
    w: D::F32,
    b: Option<D::F32>,
    width: usize,
}

struct DevLayer<D: TowerDevice> {
    norm1: DevNorm<D>,
    qkv: DevMat<D>,
    qkv_b: Option<D::F32>,
    o: DevMat<D>,
    o_b: Option<D::F32>,
    norm2: DevNorm<D>,
    up: DevMat<D>,
    up_b: Option<D::F32>,
    /// The gate of a SiLU-gated FFN.
    gate: Option<(DevMat<D>, Option<D::F32>)>,
    down: DevMat<D>,
    down_b: Option<D::F32>,
}

struct DevMerger<D: TowerDevice> {
    norm: DevNorm<D>,
    fc1: DevMat<D>,
    fc1_b: Option<D::F32>,
    fc2: DevMat<D>,
    fc2_b: Option<D::F32>,
}

/// The activations of an image of up to `cap` patches.
struct Scratch<D: TowerDevice> {
    cap: usize,
    /// `[2][3][h][w]` input values: a temporal patch's two frames (an image's only the first).
    px: D::F32,
    /// `[n]` u32 words: the patch (row << 16 | column) of each row.
    pos: D::F32,
    /// `[n][6 patch^2]` patch rows.
    cols: D::F32,
    /// `[n][hidden]`: the residual stream, the normalized rows, the attention output (and the
    /// merger's middle: `[n / merge^2][merge^2 hidden]`).
    x: D::F32,
    a: D::F32,
    att: D::F32,
    /// `[n][3 hidden]`: Q | K | V.
    qkv: D::F32,
    /// Q, K and V as f16 for the attention (`vit_qkv_half`'s layout, two values a word).
    half: D::F32,
    /// `[n][ffn]`.
    up: D::F32,
    /// `[n][head_dim / 2][2]`: the rotary (cos, sin) of each row.
    rope: D::F32,
    /// `[n][hidden]`: the learned positions of each row (Qwen3-VL).
    posv: D::F32,
    /// u32 words, 4 per window tile (q0, q1, k0, k1).
    tiles: D::F32,
    /// `[1 + deepstack][n / merge^2][text_hidden]`: the mergers' outputs.
    out: D::F32,
}

impl<D: TowerDevice> Scratch<D> {
    fn new(dev: &D, p: &QwenParams, cap: usize) -> Result<Scratch<D>> {
        let (h, ps) = (p.hidden, p.patch_size);
        let z = |len: usize| dev.alloc_f32(len.max(1));
        let tokens = cap.div_ceil(p.merge * p.merge);
        Ok(Scratch {
            cap,
            px: z(6 * cap * ps * ps)?,
            pos: z(cap)?,
            cols: z(cap * 6 * ps * ps)?,
            x: z(cap * h)?,
            a: z(cap * h)?,
            att: z(cap * h)?,
            qkv: z(cap * 3 * h)?,
            half: z(half_qkv_len(cap, p.heads, p.head_dim()) / 2)?,
            up: z(cap * p.ffn)?,
            rope: z(cap * p.head_dim())?,
            posv: z(if p.pos_grid > 0 { cap * h } else { 1 })?,
            tiles: z(if p.wa_pattern > 0 {
                4 * max_tiles(cap)
            } else {
                1
            })?,
            out: z((1 + p.deepstack.len()) * tokens * p.text_hidden)?,
        })
    }
}

/// The most window tiles of `n` patches: each window (of at least one merged block of four
/// patches) one tile per [`ATT_ROWS`] of its rows.
fn max_tiles(n: usize) -> usize {
    n / 4 + n / ATT_ROWS + 1
}

/// u32 words as the bits of f32 values (index buffers travel as 4-byte words).
fn words(v: &[u32]) -> Vec<f32> {
    v.iter().map(|&u| f32::from_bits(u)).collect()
}

/// The per-image layout: the patch of each row, and the window tiles.
struct Layout {
    /// Row `r` holds patch `order[r]` (merge-block order index).
    order: Vec<u32>,
    /// `(q0, q1, k0, k1)` per window tile (windowed towers).
    tiles: Vec<u32>,
}

/// The rows of grid `g` in the tower's order, and (`window`: merged tokens a side) the tiles
/// of the window attention.
fn layout(g: Grid, window: Option<usize>) -> Layout {
    let Some(ws) = window else {
        return Layout {
            order: (0..g.n() as u32).collect(),
            tiles: Vec::new(),
        };
    };
    let groups = Groups::windows(g, ws).groups;
    let mut order = Vec::with_capacity(g.n());
    let mut tiles = Vec::new();
    for w in groups.iter().filter(|w| !w.is_empty()) {
        let k0 = order.len();
        order.extend_from_slice(w);
        let k1 = order.len();
        for q0 in (k0..k1).step_by(ATT_ROWS) {
            let q1 = (q0 + ATT_ROWS).min(k1);
            tiles.extend([q0, q1, k0, k1].map(|v| v as u32));
        }
    }
    Layout { order, tiles }
}

/// The Qwen ViT's weights and one image's activations on a device.
pub struct CudaQwenTower<D: TowerDevice = Gpu> {
    p: QwenParams,
    dev: D,
    patch: DevMat<D>,
    patch_b: Option<D::F32>,
    /// The learned position grid (Qwen3-VL), interpolated on the host per image.
    pos: Vec<f32>,
    layers: Vec<DevLayer<D>>,
    merger: DevMerger<D>,
    deepstack: Vec<DevMerger<D>>,
    scratch: Mutex<Scratch<D>>,
}

impl<D: TowerDevice> CudaQwenTower<D> {
    /// Uploads `w` (of shape `p`) to `dev` and allocates the activations of an image of
    /// `max_pixels` (or the square `image_size`, if larger).
    pub fn new(dev: D, p: &QwenParams, w: &QwenWeights) -> Result<CudaQwenTower<D>> {
        p.check()?;
        let d = p.head_dim();
        if !HEAD_DIMS.contains(&d) {
            return Err(Error::Unsupported(format!(
                "the CUDA tower has no attention kernel for heads of {d} (kernels for \
                 {HEAD_DIMS:?})"
            )));
        }
        let (h, f, ps, mm) = (p.hidden, p.ffn, p.patch_size, p.merge * p.merge);
        let wide = mm * h;
        let mat = |m: &[f32], n: usize, k: usize| upload_mat(&dev, m, n, k);
        let bias = |b: &[f32], n: usize, what: &str| -> Result<Option<D::F32>> {
            match b.len() {
                0 => Ok(None),
                l if l == n => Ok(Some(dev.upload_f32(b)?)),
                l => Err(Error::Weights(format!(
                    "tower {what} bias of {l} values, expected {n}"
                ))),
            }
        };
        let norm = |w: &[f32], b: &[f32], widths: &[usize], what: &str| -> Result<DevNorm<D>> {
            if !widths.contains(&w.len()) || !(b.is_empty() || b.len() == w.len()) {
                return Err(Error::Weights(format!(
                    "tower {what} norm of {} weights and {} biases (widths {widths:?})",
                    w.len(),
                    b.len()
                )));
            }
            Ok(DevNorm {
                w: dev.upload_f32(w)?,
                b: bias(b, w.len(), what)?,
                width: w.len(),
            })
        };
        let merger = |m: &Merger, what: &str, widths: &[usize]| -> Result<DevMerger<D>> {
            Ok(DevMerger {
                norm: norm(&m.norm_w, &m.norm_b, widths, what)?,
                fc1: mat(&m.fc1_w, wide, wide)?,
                fc1_b: bias(&m.fc1_b, wide, what)?,
                fc2: mat(&m.fc2_w, p.text_hidden, wide)?,
                fc2_b: bias(&m.fc2_b, p.text_hidden, what)?,
            })
        };
        if w.layers.len() != p.layers || w.deepstack.len() != p.deepstack.len() {
            return Err(Error::Weights(format!(
                "tower of {} blocks and {} deepstack mergers, expected {} and {}",
                w.layers.len(),
                w.deepstack.len(),
                p.layers,
                p.deepstack.len()
            )));
        }
        if p.pos_grid > 0 && w.pos.len() != p.pos_grid * p.pos_grid * h {
            return Err(Error::Weights(format!(
                "tower positions of {} values, expected {}^2 x {h}",
                w.pos.len(),
                p.pos_grid
            )));
        }
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let qkv_w = [&l.q_w[..], &l.k_w, &l.v_w].concat();
            let qkv_b = [&l.q_b[..], &l.k_b, &l.v_b].concat();
            let gate = match p.act {
                VitAct::SiluGated => Some((mat(&l.gate_w, f, h)?, bias(&l.gate_b, f, "gate")?)),
                _ => None,
            };
            layers.push(DevLayer {
                norm1: norm(&l.norm1_w, &l.norm1_b, &[h], "block")?,
                qkv: mat(&qkv_w, 3 * h, h)?,
                qkv_b: bias(&qkv_b, 3 * h, "qkv")?,
                o: mat(&l.o_w, h, h)?,
                o_b: bias(&l.o_b, h, "output")?,
                norm2: norm(&l.norm2_w, &l.norm2_b, &[h], "block")?,
                up: mat(&l.up_w, f, h)?,
                up_b: bias(&l.up_b, f, "up")?,
                gate,
                down: mat(&l.down_w, h, f)?,
                down_b: bias(&l.down_b, h, "down")?,
            });
        }
        let deepstack = w
            .deepstack
            .iter()
            .map(|m| merger(m, "deepstack merger", &[h, wide]))
            .collect::<Result<Vec<_>>>()?;
        let cap = p.max_pixels.max(p.image_size * p.image_size) / (ps * ps);
        Ok(CudaQwenTower {
            patch: mat(&w.patch_w, h, 6 * ps * ps)?,
            patch_b: bias(&w.patch_b, h, "patch")?,
            pos: if p.pos_grid > 0 {
                w.pos.clone()
            } else {
                Vec::new()
            },
            layers,
            merger: merger(&w.merger, "merger", &[h, wide])?,
            deepstack,
            scratch: Mutex::new(Scratch::new(&dev, p, cap)?),
            p: p.clone(),
            dev,
        })
    }

    /// The device's name (`cuda:0 (compute_90a)`).
    pub fn label(&self) -> String {
        self.dev.label()
    }

    /// The output rows (`tokens(w, h) x out_width`, the CPU's layout: vision/qwenvit.rs
    /// `forward`) of one input image of `w x h` pixels given as `[3][h][w]` normalised values
    /// ([`crate::vision::VisionTower::pixels_image`]). Calls from several threads take turns.
    pub fn forward(&self, w: usize, h: usize, px: &[f32]) -> Result<Vec<f32>> {
        self.forward_pair(w, h, [px, px])
    }

    /// The output rows of a temporal patch of two frames (a video's frame group: frame 0
    /// through the patch convolution's first temporal kernel, frame 1 through its second;
    /// vision/qwenvit.rs `forward_pair`), `[3][h][w]` values each.
    pub fn forward_pair(&self, w: usize, h: usize, px: [&[f32]; 2]) -> Result<Vec<f32>> {
        let p = &self.p;
        let f = p.factor();
        if w == 0 || h == 0 || !w.is_multiple_of(f) || !h.is_multiple_of(f) {
            return Err(Error::Input(format!(
                "the tower takes images whose sides are multiples of {f}, got {w}x{h}"
            )));
        }
        if let Some(bad) = px.iter().find(|v| v.len() != 3 * w * h) {
            return Err(Error::Input(format!(
                "the tower takes 3x{h}x{w} values, got {}",
                bad.len()
            )));
        }
        // An image is its frame twice: one upload, both kernels read it.
        let two = !std::ptr::eq(px[0], px[1]);
        let g = Grid::of(p, w, h);
        if g.gh > 0xffff || g.gw > 0xffff {
            return Err(Error::Input(format!(
                "a {w}x{h} image has too many patches"
            )));
        }
        let (n, hd, d, mm) = (g.n(), p.hidden, p.head_dim(), p.merge * p.merge);
        let windowed = p.wa_pattern > 0;
        let lay = layout(g, windowed.then(|| p.window_tokens()));
        // The per-image tables in row order.
        let pos: Vec<u32> = lay
            .order
            .iter()
            .map(|&i| {
                let (py, pxx) = g.pos(i as usize);
                ((py as u32) << 16) | pxx as u32
            })
            .collect();
        let table = rope_table(g, d);
        let half = d / 2;
        let mut rope = Vec::with_capacity(n * d);
        for &i in &lay.order {
            for &(c, s) in &table[i as usize * half..(i as usize + 1) * half] {
                rope.extend([c, s]);
            }
        }
        let mut sc = self
            .scratch
            .lock()
            .map_err(|_| Error::Input("the CUDA tower's activations are poisoned".into()))?;
        if n > sc.cap {
            *sc = Scratch::new(&self.dev, p, n)?;
        }
        match two {
            true => self.dev.write_f32(&mut sc.px, &[px[0], px[1]].concat())?,
            false => self.dev.write_f32(&mut sc.px, px[0])?,
        }
        self.dev.write_f32(&mut sc.pos, &words(&pos))?;
        self.dev.write_f32(&mut sc.rope, &rope)?;
        if p.pos_grid > 0 {
            let at = positions(p, &self.pos, g);
            let mut v = Vec::with_capacity(n * hd);
            for &i in &lay.order {
                v.extend_from_slice(&at[i as usize * hd..(i as usize + 1) * hd]);
            }
            self.dev.write_f32(&mut sc.posv, &v)?;
        }
        if windowed {
            self.dev.write_f32(&mut sc.tiles, &words(&lay.tiles))?;
        }
        let k = TowerKernels { dev: &self.dev };
        let a = |b: &D::F32| self.dev.addr_f32(b);
        let opt = |b: &Option<D::F32>| b.as_ref().map(a);
        let prod = |x: u64, w: &DevMat<D>, b: &Option<D::F32>, y: u64, m, e| {
            k.product(&product_of(&self.dev, x, w, opt(b), y, m, e))
        };
        let norm = |x: u64, nm: &DevNorm<D>, y: u64| match &nm.b {
            Some(b) => k.layer_norm(x, (a(&nm.w), a(b)), y, n * hd / nm.width, nm.width, p.eps),
            None => k.rms_norm(x, a(&nm.w), y, n * hd / nm.width, nm.width, p.eps),
        };
        let t = n / mm;
        let th = p.text_hidden;
        // A merger of the residual stream into the output rows `slot`.
        let merge = |m: &DevMerger<D>, slot: usize| -> Result<()> {
            norm(a(&sc.x), &m.norm, a(&sc.a))?;
            prod(a(&sc.a), &m.fc1, &m.fc1_b, a(&sc.att), t, Epilogue::GeluErf)?;
            let y = a(&sc.out) + 4 * (slot * t * th) as u64;
            prod(a(&sc.att), &m.fc2, &m.fc2_b, y, t, Epilogue::Plain)
        };
        let px1 = a(&sc.px) + if two { 4 * (3 * w * h) as u64 } else { 0 };
        k.qwen_patches(
            [a(&sc.px), px1],
            a(&sc.pos),
            a(&sc.cols),
            n,
            (w, h),
            p.patch_size,
        )?;
        prod(
            a(&sc.cols),
            &self.patch,
            &self.patch_b,
            a(&sc.x),
            n,
            Epilogue::Plain,
        )?;
        if p.pos_grid > 0 {
            k.add(a(&sc.x), a(&sc.posv), n * hd)?;
        }
        for (i, l) in self.layers.iter().enumerate() {
            norm(a(&sc.x), &l.norm1, a(&sc.a))?;
            prod(a(&sc.a), &l.qkv, &l.qkv_b, a(&sc.qkv), n, Epilogue::Plain)?;
            k.rope(a(&sc.qkv), a(&sc.rope), n, p.heads, d)?;
            k.half_qkv(a(&sc.qkv), a(&sc.half), n, p.heads, d)?;
            if windowed && p.windowed(i) {
                let count = lay.tiles.len() / 4;
                let (half, att, tiles) = (a(&sc.half), a(&sc.att), a(&sc.tiles));
                k.window_attention(half, att, tiles, count, n, p.heads, d)?;
            } else {
                k.attention(a(&sc.half), a(&sc.att), n, p.heads, d)?;
            }
            prod(a(&sc.att), &l.o, &l.o_b, a(&sc.x), n, Epilogue::Add)?;
            norm(a(&sc.x), &l.norm2, a(&sc.a))?;
            match (&l.gate, p.act) {
                (Some((gate, gate_b)), _) => {
                    prod(a(&sc.a), &l.up, &l.up_b, a(&sc.up), n, Epilogue::Plain)?;
                    prod(a(&sc.a), gate, gate_b, a(&sc.up), n, Epilogue::MulSilu)?;
                }
                (None, act) => {
                    let e = match act {
                        VitAct::QuickGelu => Epilogue::QuickGelu,
                        _ => Epilogue::Gelu,
                    };
                    prod(a(&sc.a), &l.up, &l.up_b, a(&sc.up), n, e)?;
                }
            }
            prod(a(&sc.up), &l.down, &l.down_b, a(&sc.x), n, Epilogue::Add)?;
            if let Some(j) = p.deepstack.iter().position(|&ds| ds == i) {
                merge(&self.deepstack[j], 1 + j)?;
            }
        }
        merge(&self.merger, 0)?;
        let res = self.dev.read_f32(&sc.out)?;
        drop(sc);
        // Back to the CPU's token order, the deepstack rows after the main ones in each row.
        let (slots, ow) = (1 + p.deepstack.len(), p.out_width());
        let mut out = vec![0f32; t * ow];
        for r in 0..t {
            let b = lay.order[r * mm] as usize / mm;
            for s in 0..slots {
                let src = (s * t + r) * th;
                let dst = b * ow + s * th;
                out[dst..dst + th].copy_from_slice(&res[src..src + th]);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::vision::tests::DryRun;
    use super::*;
    use crate::vision::QwenKind;
    use crate::vision::random::random_qwen;

    #[test]
    fn every_launch_of_a_forward_takes_its_kernel_s_arguments() {
        for kind in [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl] {
            let p = QwenParams::tiny(kind, 24);
            let t =
                CudaQwenTower::new(DryRun::default(), &p, &random_qwen(&p, 3).unwrap()).unwrap();
            let (w, h) = (48, 32);
            let px = vec![0f32; 3 * w * h];
            let got = t.forward(w, h, &px).unwrap();
            assert_eq!(got.len(), p.tokens(w, h) * p.out_width());
            let l = t.dev.launches.borrow();
            assert_eq!(l[0], "qvit_patches");
            assert!(l.contains(&"qvit_rope".to_string()));
            assert!(l.contains(&"vit_qkv_half".to_string()));
            assert!(l.contains(&"vit_attn_mma_d8".to_string()) || kind == QwenKind::Qwen25Vl);
            assert_eq!(
                l.contains(&"qvit_attn_win_mma_d8".to_string()),
                kind == QwenKind::Qwen25Vl
            );
            drop(l);
            // A video's frame group: two frames, the launches' arguments checked the same.
            let px1 = vec![1f32; 3 * w * h];
            let pair = t.forward_pair(w, h, [&px, &px1]).unwrap();
            assert_eq!(pair.len(), got.len());
            assert!(t.forward_pair(w, h, [&px, &px1[1..]]).is_err());
            assert!(t.forward(w, h, &px[1..]).is_err());
            assert!(t.forward(w + 1, h, &px).is_err());
            assert!(t.forward(0, h, &[]).is_err());
        }
    }

    #[test]
    fn windows_are_consecutive_rows_cut_into_tiles() {
        // 6 x 10 merged tokens, windows of 4: 2 x 3 windows (64, 64, 32, 32, 32, 16 patches).
        let g = Grid {
            gh: 12,
            gw: 20,
            m: 2,
        };
        let l = layout(g, Some(4));
        let mut sorted = l.order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..240).collect::<Vec<u32>>());
        let tiles: Vec<_> = l
            .tiles
            .chunks(4)
            .map(|t| (t[0], t[1], t[2], t[3]))
            .collect();
        assert_eq!(tiles[0], (0, 64, 0, 64));
        assert_eq!(tiles[1], (64, 128, 64, 128));
        assert_eq!(tiles.len(), 6);
        assert_eq!(tiles[5], (224, 240, 224, 240));
        // Merged blocks stay four consecutive rows.
        assert!(l.order.chunks(4).all(|b| b[0] % 4 == 0 && b[3] == b[0] + 3));
        // A window of more than ATT_ROWS patches is cut into tiles over the same keys.
        let big = layout(
            Grid {
                gh: 16,
                gw: 14,
                m: 2,
            },
            Some(6),
        );
        assert_eq!(&big.tiles[..8], &[0, 128, 0, 144, 128, 144, 0, 144]);
        assert!(big.tiles.len() / 4 <= max_tiles(224));
    }
}
