//! The v2 weight products (kernels/cu/products.cu): weights repacked into the tile layout
//! (`quant::repack`) on the device, activations prepared per row (int8 blocks or 16-bit), and
//! the typed launchers. Every launch geometry computes the same bits per element (the canonical
//! segment order of products.cu); only `nseg` is part of the arithmetic, and it is fixed per
//! matrix at load by the device profile from (N, K) alone.

use cudarc::driver::CudaSlice;

use super::device::{Arg, Gpu};
use super::profile::{Launch, Profile};
use crate::error::Result;
use crate::ops::Glu;
use crate::quant::DType;
use crate::quant::repack::{Packed, repack};

/// How a product's activations are prepared: 16-bit values (permuted per 32-column block) and
/// the f32 sum of each block's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActKind {
    /// f16 (clamped to +-65504): every quantized type and F16.
    F16,
    /// bf16: BF16 weights.
    BF16,
}

impl ActKind {
    pub fn of(dtype: DType) -> ActKind {
        match dtype {
            DType::BF16 => ActKind::BF16,
            _ => ActKind::F16,
        }
    }
}

/// True when the v2 products read `dtype`.
pub fn product_supports(dtype: DType) -> bool {
    memra_kernels::PRODUCT_TYPES.contains(&dtype.name())
}

/// A weight matrix on the device in the tile layout.
pub struct PMat {
    pub data: CudaSlice<u8>,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Columns with padding (what the prepared activations must have).
    pub kp: usize,
    pub col_tiles: usize,
    /// The canonical K segment count of this matrix (profile, from N and K only).
    pub nseg: u32,
}

impl PMat {
    pub fn act(&self) -> ActKind {
        ActKind::of(self.dtype)
    }

    /// Whether `o` has this matrix's type, shape, tiling and K segmentation (one product launch
    /// can take both with the same arguments).
    pub fn same_layout(&self, o: &PMat) -> bool {
        (
            self.dtype,
            self.rows,
            self.cols,
            self.kp,
            self.col_tiles,
            self.nseg,
        ) == (o.dtype, o.rows, o.cols, o.kp, o.col_tiles, o.nseg)
    }
}

/// Device buffers of prepared activations for up to `rows` rows of `kp` columns.
pub struct ActBuf {
    pub kind: ActKind,
    pub kp: usize,
    pub rows: usize,
    pub values: CudaSlice<u8>,
    /// One f32 per 32 columns: the sum of the block's 16-bit values.
    pub scales: CudaSlice<u8>,
    /// The warp-specialized product's token image (products.cu `ws_image`: per 128 rows and 64
    /// columns, the 16 KiB its bulk copy moves), on sm_90a where the buffer asked for one.
    pub image: Option<CudaSlice<u8>>,
}

/// Where a product's outputs go (products.cu `Outs`).
#[derive(Clone, Copy)]
enum Dest<'a> {
    /// Column ranges to up to three buffers: (buffer, columns) in column order.
    Split(&'a [(u64, usize)]),
    /// A gate/up matrix interleaved by 8: gate rows, up rows (each `rows / 2` wide).
    Interleaved(u64, u64),
    /// The SwiGLU epilogue: `act(gate) * up` prepared into the down product's activations.
    Glu(&'a ActBuf),
}

/// products.cu `GLU_ILV`: `Outs`'s n2 for an interleaved gate/up matrix.
const GLU_ILV: u32 = u32::MAX;

/// Blocks of 8 warps for one warp per (row, 32-column block) of `m` rows of `kp` columns
/// (grid-stride beyond 65536 blocks).
fn warp_grid(m: usize, kp: usize) -> u32 {
    ((m * kp / 32) as u64).div_ceil(8).clamp(1, 1 << 16) as u32
}

impl Gpu {
    /// Repacks `rows` x `cols` of `dtype` (GGUF rows in `src`) and uploads the tiles.
    pub fn upload_packed(
        &self,
        profile: &Profile,
        dtype: DType,
        src: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<PMat> {
        let p = super::load_stats::repacking(|| repack(dtype, src, rows, cols))?;
        self.upload_tiles(profile, &p)
    }

    /// Uploads a matrix already in the tile layout.
    pub fn upload_tiles(&self, profile: &Profile, p: &Packed) -> Result<PMat> {
        Ok(PMat {
            data: self.upload(&p.data)?,
            dtype: p.dtype,
            rows: p.rows,
            cols: p.cols,
            kp: p.padded_cols(),
            col_tiles: p.col_tiles,
            nseg: profile.nseg(p.rows, p.col_tiles),
        })
    }

    /// Allocates prepared-activation buffers; with `image`, on sm_90a, also the token image
    /// that the warp-specialized product reads (as large as the values, rounded up to 128
    /// rows): buffers of dense products, not those of the expert products, which never use it.
    pub fn act_buf(&self, kind: ActKind, rows: usize, kp: usize, image: bool) -> Result<ActBuf> {
        let image = if image && self.arch == "compute_90a" && kp.is_multiple_of(64) {
            Some(self.zeros(rows.div_ceil(128) * 128 * kp * 2)?)
        } else {
            None
        };
        Ok(ActBuf {
            kind,
            kp,
            rows,
            values: self.zeros(rows * kp * 2)?,
            scales: self.zeros(rows * (kp / 32) * 4)?,
            image,
        })
    }

    /// Prepares `m` rows of `k` f32 values at `x` into `a` (converted, permuted, padded, summed).
    pub fn prepare(&self, x: u64, a: &ActBuf, m: usize, k: usize) -> Result<()> {
        self.check_act(a, m, k)?;
        if m == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(self.ptr(&a.values)),
            Arg::Ptr(self.ptr(&a.scales)),
            Arg::U32(m as u32),
            Arg::U32(k as u32),
            Arg::U32(a.kp as u32),
            Arg::U32((a.kind == ActKind::BF16) as u32),
        ];
        self.launch_prep("prepare_h16", (warp_grid(m, a.kp), 1), &args)
    }

    /// RMSNorm of `m` rows of `width` at `x` with weights `w` (f32 output to `y` when given; `y`
    /// may be `x`), prepared into `a` in the same pass.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_prep(
        &self,
        x: u64,
        w: u64,
        y: Option<u64>,
        a: &ActBuf,
        m: usize,
        width: usize,
        eps: f32,
    ) -> Result<()> {
        self.check_act(a, m, width)?;
        if m == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y.unwrap_or(0)),
            Arg::Ptr(self.ptr(&a.values)),
            Arg::Ptr(self.ptr(&a.scales)),
            Arg::U32(width as u32),
            Arg::U32(a.kp as u32),
            Arg::F32(eps),
            Arg::U32((a.kind == ActKind::BF16) as u32),
        ];
        // Small M: several blocks per row (each recomputes the row's sum the same way), unless
        // the output overwrites the input.
        let split = if y == Some(x) || m > 64 {
            1
        } else {
            (a.kp / 32).div_ceil(8).min(8) as u32
        };
        self.launch_prep("norm_prep", (m as u32, split), &args)
    }

    /// SwiGLU of `m` rows of `width` (`g`, `u`; f32 output to `y` when given, may be `g`),
    /// prepared into `a` in the same pass.
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_prep(
        &self,
        g: u64,
        u: u64,
        y: Option<u64>,
        a: &ActBuf,
        m: usize,
        width: usize,
    ) -> Result<()> {
        self.glu_prep(Glu::Silu, (g, u), y, a, m, width)
    }

    /// [`Gpu::swiglu_prep`] for either gated activation (`geglu_prep`: GeGLU with the tanh
    /// GELU, the operations of `geglu_tanh`).
    pub fn glu_prep(
        &self,
        kind: Glu,
        (g, u): (u64, u64),
        y: Option<u64>,
        a: &ActBuf,
        m: usize,
        width: usize,
    ) -> Result<()> {
        self.check_act(a, m, width)?;
        if m == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(g),
            Arg::Ptr(u),
            Arg::Ptr(y.unwrap_or(0)),
            Arg::Ptr(self.ptr(&a.values)),
            Arg::Ptr(self.ptr(&a.scales)),
            Arg::U32(m as u32),
            Arg::U32(width as u32),
            Arg::U32(a.kp as u32),
            Arg::U32((a.kind == ActKind::BF16) as u32),
        ];
        let grid = (warp_grid(m, a.kp), 1);
        match kind {
            Glu::Silu => self.launch_prep("swiglu_prep", grid, &args),
            // elementwise.cu: GeGLU's tanhf under that module's rounding (kernels/src/lib.rs).
            Glu::GeluTanh => self.launch("geglu_prep", grid, 256, &args),
        }
    }

    /// The gated DeltaNet's output gating prepared into `a`: `v = silu(z) * (RMSNorm(c) * w)`
    /// with one norm per `group` values of each of `m` rows of `width` (`w`: `group` weights),
    /// f32 output to `y` when given (may be `z`); the bits of `rms_norm` + `swiglu_prep`. One
    /// launch (`norm_gate_prep`); `group` must be a multiple of 32 dividing `width`.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_gate_prep(
        &self,
        (c, w, z): (u64, u64, u64),
        y: Option<u64>,
        a: &ActBuf,
        m: usize,
        width: usize,
        group: usize,
        eps: f32,
    ) -> Result<()> {
        self.check_act(a, m, width)?;
        if group == 0 || !group.is_multiple_of(32) || !width.is_multiple_of(group) {
            return Err(self.err(format!(
                "gated norm: width {width} in groups of {group} (a multiple of 32)"
            )));
        }
        if m == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(c),
            Arg::Ptr(w),
            Arg::Ptr(z),
            Arg::Ptr(y.unwrap_or(0)),
            Arg::Ptr(self.ptr(&a.values)),
            Arg::Ptr(self.ptr(&a.scales)),
            Arg::U32(m as u32),
            Arg::U32(width as u32),
            Arg::U32(group as u32),
            Arg::F32(eps),
            Arg::U32(a.kp as u32),
            Arg::U32((a.kind == ActKind::BF16) as u32),
        ];
        self.launch_prep("norm_gate_prep", (warp_grid(m, a.kp), 1), &args)
    }

    /// A post-norm sublayer's output added into the residual: `x += RMSNorm(o) * wp` for `m`
    /// rows of `width` (the bits of `rms_norm` into `o` then `add_in_place`; `o` is left as it
    /// was), then with `next` = (w, y, a, eps) the RMSNorm of the new `x` into `y` (f32) prepared
    /// into `a`, as [`Gpu::norm_prep`] computes it. One launch (`add_norm_prep`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_norm_prep(
        &self,
        (o, wp, post_eps): (u64, u64, f32),
        x: u64,
        next: Option<(u64, u64, &ActBuf, f32)>,
        m: usize,
        width: usize,
    ) -> Result<()> {
        if let Some((_, _, a, _)) = next {
            self.check_act(a, m, width)?;
        }
        if m == 0 {
            return Ok(());
        }
        let (w, y, values, scales, kp, eps, bf) = match next {
            Some((w, y, a, eps)) => (
                w,
                y,
                self.ptr(&a.values),
                self.ptr(&a.scales),
                a.kp,
                eps,
                a.kind == ActKind::BF16,
            ),
            None => (0, 0, 0, 0, width.next_multiple_of(32), 0.0, false),
        };
        let args = [
            Arg::Ptr(o),
            Arg::Ptr(wp),
            Arg::F32(post_eps),
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::Ptr(values),
            Arg::Ptr(scales),
            Arg::U32(self.u32_of(width, "add_norm_prep width")?),
            Arg::U32(self.u32_of(kp, "add_norm_prep kp")?),
            Arg::F32(eps),
            Arg::U32(bf as u32),
        ];
        self.launch_prep("add_norm_prep", (self.u32_of(m, "rows")?, 1), &args)
    }

    /// Rewrites `m` prepared rows of `a` into its token image `img` (products.cu `ws_image`).
    fn ws_image(&self, a: &ActBuf, img: &CudaSlice<u8>, m: usize) -> Result<()> {
        let chunks = (m.div_ceil(128) * a.kp / 64 * 1024) as u64;
        let args = [
            Arg::Ptr(self.ptr(&a.values)),
            Arg::Ptr(self.ptr(img)),
            Arg::U32(m as u32),
            Arg::U32(a.kp as u32),
        ];
        let blocks = chunks.div_ceil(256).clamp(1, 1 << 16) as u32;
        self.launch_prep("ws_image", (blocks, 1), &args)
    }

    /// Launches `name` of the products module's default variant (the activation kernels).
    fn launch_prep(&self, name: &str, grid: (u32, u32), args: &[Arg]) -> Result<()> {
        let f = self.variant("products", &[])?;
        let func = f
            .get(name)
            .ok_or_else(|| self.err(format!("kernel {name} missing")))?;
        self.launch_fn(func, name, grid, 256, 0, args)
    }

    pub(super) fn check_act(&self, a: &ActBuf, m: usize, k: usize) -> Result<()> {
        if m > a.rows || k > a.kp {
            return Err(self.err(format!(
                "{m} x {k} does not fit a prepared-activation buffer of {} x {}",
                a.rows, a.kp
            )));
        }
        Ok(())
    }

    /// `y[m][n] = W[n] . x[m]` (+ `r[m][n]` when `r` is given; `r` may equal `y`) for `m` rows
    /// of activations prepared in `a`, launched with geometry `l` (bits do not depend on it).
    pub fn product(
        &self,
        w: &PMat,
        a: &ActBuf,
        y: u64,
        r: Option<u64>,
        m: usize,
        l: Launch,
    ) -> Result<()> {
        self.product_to(w, a, &[(y, w.rows)], r, m, l)
    }

    /// [`Gpu::product`] with the output columns split over up to three buffers: `outs` =
    /// (buffer, columns) in column order, the columns adding up to `w.rows` (a fused QKV or
    /// gate/up matrix). A residual `r` needs a single output.
    pub fn product_to(
        &self,
        w: &PMat,
        a: &ActBuf,
        outs: &[(u64, usize)],
        r: Option<u64>,
        m: usize,
        l: Launch,
    ) -> Result<()> {
        let total: usize = outs.iter().map(|o| o.1).sum();
        if outs.is_empty() || outs.len() > 3 || total != w.rows || (r.is_some() && outs.len() > 1) {
            return Err(self.err(format!(
                "product: outputs {outs:?} do not split {} rows (residual: {})",
                w.rows,
                r.is_some()
            )));
        }
        self.product_into(w, a, Dest::Split(outs), r, m, l)
    }

    /// [`Gpu::product`] of a gate/up matrix with its rows interleaved by 8
    /// (`quant::repack::interleave_glu`): gate rows to `gate`, up rows to `up` (rows of
    /// `w.rows / 2` each), as [`Gpu::product_to`] writes the plain fused matrix.
    pub fn product_glu_split(
        &self,
        w: &PMat,
        a: &ActBuf,
        (gate, up): (u64, u64),
        m: usize,
        l: Launch,
    ) -> Result<()> {
        self.product_into(w, a, Dest::Interleaved(gate, up), None, m, l)
    }

    /// The warp-specialized product of a gate/up matrix interleaved by 8 with the SwiGLU
    /// epilogue (products.cu `mws_glu_<type>`): `act(gate) * up` of `w.rows / 2` features,
    /// prepared into `out` (the down product's activations), the bits of
    /// [`Gpu::product_glu_split`] then [`Gpu::swiglu_prep`]. `l` must be the warp-specialized
    /// launch.
    pub fn product_glu(
        &self,
        w: &PMat,
        a: &ActBuf,
        out: &ActBuf,
        m: usize,
        l: Launch,
    ) -> Result<()> {
        let ff = w.rows / 2;
        // `out` may be padded past the columns the grid covers (a down matrix of 256-column
        // tiles): that padding stays zero, as every writer of a prepared buffer leaves it.
        if !l.ws || !w.rows.is_multiple_of(16) || out.kind != w.act() {
            return Err(self.err(format!(
                "SwiGLU product: {l:?} of {} rows into {:?} activations of kp {}",
                w.rows, out.kind, out.kp
            )));
        }
        self.check_act(out, m, ff)?;
        self.product_into(w, a, Dest::Glu(out), None, m, l)
    }

    fn product_into(
        &self,
        w: &PMat,
        a: &ActBuf,
        dest: Dest,
        r: Option<u64>,
        m: usize,
        l: Launch,
    ) -> Result<()> {
        // Outs (products.cu): Y, Y2, Y3 and n1, n2; n2 = GLU_ILV for an interleaved gate/up.
        let (ys, n1, n2) = match dest {
            Dest::Split(o) => {
                let ptr = |i: usize| o.get(i).map_or(0, |o| o.0);
                let cols = |i: usize| o.get(i).map_or(0, |o| o.1 as u32);
                ([ptr(0), ptr(1), ptr(2)], cols(0), cols(1))
            }
            Dest::Interleaved(gate, up) => ([gate, up, 0], (w.rows / 2) as u32, GLU_ILV),
            Dest::Glu(_) => ([0; 3], 0, 0),
        };
        if a.kind != w.act() || a.kp != w.kp || m > a.rows {
            return Err(self.err(format!(
                "product: {} weights ({} x {}, kp {}) with {:?} activations of {} x {}",
                w.dtype, w.rows, w.cols, w.kp, a.kind, m, a.kp
            )));
        }
        if m == 0 || w.rows == 0 {
            return Ok(());
        }
        if l.wg && self.arch != "compute_90a" {
            return Err(self.err(format!(
                "product: the warpgroup launch needs sm_90a (this device: {})",
                self.arch
            )));
        }
        let wk = if l.split_k { w.nseg } else { 1 };
        let threads = if l.smem {
            l.max_threads()
        } else {
            32 * l.rpb * wk
        };
        let f = self.variant("products", &l.defines())?;
        let glu = matches!(dest, Dest::Glu(_));
        let kind = match (l.smem, l.wg) {
            (true, true) if l.ws && glu => "mws_glu",
            (true, true) if l.ws => "mws",
            (true, true) => "mwg",
            (true, false) => "mms",
            _ => "mmq",
        };
        let name = format!("{kind}_{}", w.dtype.name());
        let func = f
            .get(&name)
            .ok_or_else(|| self.err(format!("kernel {name} missing")))?;
        let row_tiles = w.rows.div_ceil(16) as u32;
        let (rows_per_block, toks_per_block) = if l.smem {
            let (r, t) = l.smem_block();
            (r as u32 / 16, t as u32)
        } else {
            (l.rpb, 8 * l.nt)
        };
        let grid = (
            row_tiles.div_ceil(rows_per_block),
            (m as u32).div_ceil(toks_per_block).min(65535),
        );
        if (m as u32).div_ceil(toks_per_block) > 65535 {
            return Err(self.err(format!("product: {m} rows exceed one launch")));
        }
        let smem = if l.smem {
            self.smem_of(&l, w.dtype, &name)?
        } else if wk > 1 {
            wk * l.rpb * 16 * 8 * l.nt * 4
        } else {
            0
        };
        // The warp-specialized product reads the token image (one more argument).
        let image = if l.ws {
            let img = a.image.as_ref().ok_or_else(|| {
                self.err(format!(
                    "{name}: the prepared activations of {} x {} have no token image",
                    a.rows, a.kp
                ))
            })?;
            self.ws_image(a, img, m)?;
            Some(Arg::Ptr(self.ptr(img)))
        } else {
            None
        };
        let args = match dest {
            // mws_glu_<type>(W, Xi, Xh, Xs, M, N, nkt, nseg, ff, kp, bf)
            Dest::Glu(out) => vec![
                Arg::Ptr(self.ptr(&w.data)),
                image.ok_or_else(|| self.err("SwiGLU product without a token image"))?,
                Arg::Ptr(self.ptr(&out.values)),
                Arg::Ptr(self.ptr(&out.scales)),
                Arg::U32(m as u32),
                Arg::U32(w.rows as u32),
                Arg::U32(w.col_tiles as u32),
                Arg::U32(w.nseg),
                Arg::U32((w.rows / 2) as u32),
                Arg::U32(out.kp as u32),
                Arg::U32((out.kind == ActKind::BF16) as u32),
            ],
            _ => {
                let mut v = vec![
                    Arg::Ptr(self.ptr(&w.data)),
                    Arg::Ptr(self.ptr(&a.values)),
                    Arg::Ptr(self.ptr(&a.scales)),
                    Arg::Ptr(ys[0]),
                    Arg::Ptr(ys[1]),
                    Arg::Ptr(ys[2]),
                    Arg::U32(n1),
                    Arg::U32(n2),
                    Arg::Ptr(r.unwrap_or(0)),
                    Arg::U32(m as u32),
                    Arg::U32(w.rows as u32),
                    Arg::U32(w.col_tiles as u32),
                    Arg::U32(w.nseg),
                    Arg::U32(w.kp as u32),
                ];
                v.extend(image);
                v
            }
        };
        if threads > l.max_threads() {
            return Err(self.err(format!(
                "product launch of {threads} threads exceeds the variant's {}",
                l.max_threads()
            )));
        }
        self.launch_fn(func, &name, grid, threads, smem, &args)
    }

    /// Dynamic shared memory of the shared-memory launch `l` of a `dtype` product (`name`, for
    /// the message), refused where this device cannot give it.
    pub(super) fn smem_of(&self, l: &Launch, dtype: DType, name: &str) -> Result<u32> {
        let fmt = crate::quant::repack::tile_format(dtype)
            .ok_or_else(|| self.err(format!("{name}: no tile format for {dtype}")))?;
        let bytes = l.smem_bytes(fmt.tile_bytes, fmt.kt);
        if !l.fits(dtype, self.smem_optin) {
            return Err(self.err(format!(
                "{name}: {l:?} needs {bytes} bytes of shared memory (this device allows {})",
                self.smem_optin
            )));
        }
        Ok(bytes as u32)
    }
}
