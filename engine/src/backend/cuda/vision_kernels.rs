//! The typed launchers of the vision towers' kernels (kernels/cu/vision.cu, and norm.cu's
//! `rms_norm` and elementwise.cu's `add_in_place` with [`super::Gpu`]'s geometry) on any
//! [`TowerDevice`]: the forwards (vision.rs, vision_qwen.rs) and `memra-verify kernels` (group
//! `vision`) launch through them. Arguments are device addresses; shapes are checked against the
//! kernels' u32 range.

use super::device::Arg;
use super::vision::TowerDevice;
use crate::error::{Error, Result};

/// Head dimensions of the attention kernels (`vit_attn_mma_d<D>`, `qvit_attn_win_mma_d<D>`).
pub const HEAD_DIMS: &[usize] = memra_kernels::VIT_HEAD_DIMS;

/// Query rows of one attention block, and at most of one window-attention tile (`VA_Q`).
pub const ATT_ROWS: usize = 128;

/// Threads of the products, the attention and the grid-stride and row kernels.
const BLOCK: u32 = 256;
/// Output tile side of a product block (`GM_BM`, `GM_BN`).
const TILE: usize = 128;
/// The products' K tile (`GM_BK`): weight rows are zero-padded to a multiple of it.
pub const K_TILE: usize = 32;

/// The columns of a weight matrix's rows on the device: `k` zero-padded to [`K_TILE`].
pub fn padded_k(k: usize) -> usize {
    k.div_ceil(K_TILE).max(1) * K_TILE
}

/// The attention's head dimension: `d` zero-padded to 16 (one mma k-step).
pub fn padded_head(d: usize) -> usize {
    d.div_ceil(16) * 16
}

/// u16 values of the f16 Q / K / V of `rows` rows (`vit_qkv_half`: `[3][heads][rows][padded d]`).
pub fn half_qkv_len(rows: usize, heads: usize, d: usize) -> usize {
    3 * heads * rows * padded_head(d)
}

/// The epilogue of a product (`mode` of `vit_gemm_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// `y = x W^T + b`.
    Plain = 0,
    /// `y = gelu_tanh(x W^T + b)`.
    Gelu = 1,
    /// `y = y + (x W^T + b)` (into the residual stream).
    Add = 2,
    /// `y = quick_gelu(x W^T + b)` (Qwen2-VL's FFN).
    QuickGelu = 3,
    /// `y = gelu_erf(x W^T + b)` (the Qwen ViT's mergers; the CPU's erf fit in double).
    GeluErf = 4,
    /// `y = y * silu(x W^T + b)` (Qwen2.5-VL's gated FFN: `y` holds the up product).
    MulSilu = 5,
}

/// One product `y[m][n] = epilogue(sum_k f16(x[m][k]) w[n][k] + bias[n])` on tensor cores.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    /// `[m][k]` f32 (rounded to f16 by the product).
    pub x: u64,
    /// `[n][kp]` f16 bits, each row zero-padded from `k` to `kp` ([`padded_k`]).
    pub w: u64,
    /// `[n]` f32, or none.
    pub bias: Option<u64>,
    /// `[m][n]` f32.
    pub y: u64,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub kp: usize,
    pub epilogue: Epilogue,
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Input(format!("tower: {what} = {v} exceeds u32")))
}

/// Blocks of a grid-stride launch over `n` values (at most 65,536: the kernels loop).
fn stride_grid(n: usize) -> (u32, u32) {
    (n.div_ceil(BLOCK as usize).clamp(1, 1 << 16) as u32, 1)
}

/// Refuses a head dimension without an attention kernel ([`HEAD_DIMS`]).
fn check_head(d: usize) -> Result<()> {
    if !HEAD_DIMS.contains(&d) {
        return Err(Error::Unsupported(format!(
            "the CUDA tower has no attention kernel for heads of {d}"
        )));
    }
    Ok(())
}

/// The launchers, on one device.
pub struct TowerKernels<'a, D: TowerDevice> {
    pub dev: &'a D,
}

impl<D: TowerDevice> TowerKernels<'_, D> {
    /// The patch rows `[g^2][3 patch^2]` of an image's values `[3][size][size]`.
    pub fn patches(&self, px: u64, cols: u64, size: usize, patch: usize) -> Result<()> {
        if patch == 0 || !size.is_multiple_of(patch) {
            return Err(Error::Input(format!(
                "tower: {size} is not a multiple of {patch}"
            )));
        }
        let g = size / patch;
        let args = [
            Arg::Ptr(px),
            Arg::Ptr(cols),
            Arg::U32(u32_of(size, "image size")?),
            Arg::U32(u32_of(patch, "patch size")?),
        ];
        let n = g * g * 3 * patch * patch;
        self.dev.launch("vit_patches", stride_grid(n), BLOCK, &args)
    }

    pub fn product(&self, p: &Product) -> Result<()> {
        if p.m == 0 || p.n == 0 {
            return Ok(());
        }
        let grid = (
            u32_of(p.n.div_ceil(TILE), "product column tiles")?,
            u32_of(p.m.div_ceil(TILE), "product row tiles")?,
        );
        if grid.1 > 65_535 {
            return Err(Error::Input(format!("tower: {} rows in one product", p.m)));
        }
        if p.kp != padded_k(p.k) {
            return Err(Error::Input(format!(
                "tower: weight rows of {} columns for K = {}",
                p.kp, p.k
            )));
        }
        let args = [
            Arg::Ptr(p.x),
            Arg::Ptr(p.w),
            Arg::Ptr(p.bias.unwrap_or(0)),
            Arg::Ptr(p.y),
            Arg::U32(u32_of(p.m, "M")?),
            Arg::U32(u32_of(p.n, "N")?),
            Arg::U32(u32_of(p.k, "K")?),
            Arg::U32(u32_of(p.kp, "padded K")?),
            Arg::U32(p.epilogue as u32),
        ];
        self.dev.launch("vit_gemm_mma", grid, BLOCK, &args)
    }

    /// LayerNorm with weights `w` and bias `b` of `rows` rows of `width` (`y` may be `x`).
    pub fn layer_norm(
        &self,
        x: u64,
        (w, b): (u64, u64),
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.row_norm("vit_layer_norm", &[x, w, b, y], rows, width, eps)
    }

    /// Q, K and V of `qkv` (`[rows][3 heads d]`, f32) as f16 into `half` ([`half_qkv_len`]
    /// u16 values) for the attention.
    pub fn half_qkv(&self, qkv: u64, half: u64, rows: usize, heads: usize, d: usize) -> Result<()> {
        if d == 0 || !d.is_multiple_of(2) {
            return Err(Error::Input(format!("tower: heads of {d}")));
        }
        let args = [
            Arg::Ptr(qkv),
            Arg::Ptr(half),
            Arg::U32(u32_of(rows, "rows")?),
            Arg::U32(u32_of(heads, "heads")?),
            Arg::U32(u32_of(d, "head size")?),
            Arg::U32(u32_of(padded_head(d), "padded head size")?),
        ];
        let n = half_qkv_len(rows, heads, d) / 2;
        self.dev
            .launch("vit_qkv_half", stride_grid(n), BLOCK, &args)
    }

    /// Every row of `half` (the f16 Q / K / V of `n` rows, [`TowerKernels::half_qkv`]) attends
    /// to all `n` rows, per head, scale `1 / sqrt(d)`, into `out` (`[n][heads d]`, f32).
    pub fn attention(&self, half: u64, out: u64, n: usize, heads: usize, d: usize) -> Result<()> {
        check_head(d)?;
        let args = [
            Arg::Ptr(half),
            Arg::Ptr(out),
            Arg::U32(u32_of(n, "patches")?),
            Arg::U32(u32_of(heads, "heads")?),
            Arg::F32(1.0 / (d as f32).sqrt()),
        ];
        let grid = (
            u32_of(n.div_ceil(ATT_ROWS), "query tiles")?,
            u32_of(heads, "heads")?,
        );
        self.dev
            .launch(&format!("vit_attn_mma_d{d}"), grid, BLOCK, &args)
    }

    /// The Qwen ViT's patch rows `[rows][2 x 3 patch^2]` of a temporal patch, two frames'
    /// values `[3][h][w]` each (`px[0]` frame 0, `px[1]` frame 1; an image: the same address
    /// twice): row `r` the patch at grid row `pos[r] >> 16`, column `pos[r] & 0xffff` (`pos`:
    /// `rows` u32 words on the device).
    pub fn qwen_patches(
        &self,
        px: [u64; 2],
        pos: u64,
        cols: u64,
        rows: usize,
        (w, h): (usize, usize),
        patch: usize,
    ) -> Result<()> {
        if patch == 0 || !w.is_multiple_of(patch) || !h.is_multiple_of(patch) {
            return Err(Error::Input(format!(
                "tower: a {w}x{h} image in patches of {patch}"
            )));
        }
        let args = [
            Arg::Ptr(px[0]),
            Arg::Ptr(px[1]),
            Arg::Ptr(pos),
            Arg::Ptr(cols),
            Arg::U32(u32_of(rows, "patches")?),
            Arg::U32(u32_of(w, "image width")?),
            Arg::U32(u32_of(h, "image height")?),
            Arg::U32(u32_of(patch, "patch size")?),
        ];
        let n = rows * 6 * patch * patch;
        self.dev
            .launch("qvit_patches", stride_grid(n), BLOCK, &args)
    }

    /// The 2D rotary embedding of the Q and K parts of `qkv` (`[rows][3 heads d]`) in place,
    /// from `table` (`[rows][d/2]` (cos, sin) pairs of f32).
    pub fn rope(&self, qkv: u64, table: u64, rows: usize, heads: usize, d: usize) -> Result<()> {
        if d == 0 || !d.is_multiple_of(2) {
            return Err(Error::Input(format!("tower: rotary heads of {d}")));
        }
        let args = [
            Arg::Ptr(qkv),
            Arg::Ptr(table),
            Arg::U32(u32_of(rows, "rows")?),
            Arg::U32(u32_of(heads, "heads")?),
            Arg::U32(u32_of(d, "head size")?),
        ];
        self.dev
            .launch("qvit_rope", stride_grid(rows * heads * d), BLOCK, &args)
    }

    /// Attention within windows: `tiles` (`count` x 4 u32 words on the device: query rows q0 ..
    /// q1, at most [`ATT_ROWS`] of them, attend to the rows k0 .. k1) over `half` (the f16 Q / K
    /// / V of `rows` rows, [`TowerKernels::half_qkv`]) into `out` (`[rows][heads d]`), scale
    /// `1 / sqrt(d)`.
    #[allow(clippy::too_many_arguments)]
    pub fn window_attention(
        &self,
        half: u64,
        out: u64,
        tiles: u64,
        count: usize,
        rows: usize,
        heads: usize,
        d: usize,
    ) -> Result<()> {
        check_head(d)?;
        if count == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(half),
            Arg::Ptr(out),
            Arg::Ptr(tiles),
            Arg::U32(u32_of(rows, "rows")?),
            Arg::U32(u32_of(heads, "heads")?),
            Arg::F32(1.0 / (d as f32).sqrt()),
        ];
        let grid = (u32_of(count, "window tiles")?, u32_of(heads, "heads")?);
        self.dev
            .launch(&format!("qvit_attn_win_mma_d{d}"), grid, BLOCK, &args)
    }

    /// The average of the `g x g` rows of `x` (`width` each) in `pool x pool` windows.
    pub fn pool(&self, x: u64, y: u64, g: usize, pool: usize, width: usize) -> Result<()> {
        if pool == 0 || !g.is_multiple_of(pool) {
            return Err(Error::Input(format!(
                "tower: grid {g} in windows of {pool}"
            )));
        }
        let side = g / pool;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::U32(u32_of(g, "grid")?),
            Arg::U32(u32_of(pool, "pool")?),
            Arg::U32(u32_of(width, "width")?),
            Arg::F32(1.0 / (pool * pool) as f32),
        ];
        self.dev
            .launch("vit_pool", stride_grid(side * side * width), BLOCK, &args)
    }

    /// norm.cu `rms_norm` (a warp per row), the launch of [`super::Gpu::rms_norm`].
    pub fn rms_norm(
        &self,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.row_norm("rms_norm", &[x, w, y], rows, width, eps)
    }

    /// A row-norm kernel (8 rows a block): its pointers (`x`, the weights, `y`), then `rows`,
    /// `width` and `eps`.
    fn row_norm(
        &self,
        kernel: &str,
        ptrs: &[u64],
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
        args.extend([
            Arg::U32(u32_of(rows, "rows")?),
            Arg::U32(u32_of(width, "width")?),
            Arg::F32(eps),
        ]);
        let grid = (u32_of(rows.div_ceil(8), "norm blocks")?, 1);
        self.dev.launch(kernel, grid, BLOCK, &args)
    }

    /// elementwise.cu `add_in_place`: `x[i] += y[i]` for `n` values.
    pub fn add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::U64(n as u64)];
        self.dev
            .launch("add_in_place", stride_grid(n), BLOCK, &args)
    }
}
