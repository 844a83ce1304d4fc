//! Weight matrices on the device and the products over them: the only code that knows a
//! matrix's device layout. [`Products::upload_mat`] is the one constructor of a [`Mat`] from a
//! host tensor (the v2 tile layout when the v2 products read its type, and/or the stored GGUF
//! layout for the v1 kernels and the embedding); [`Products::matmul`] is the one product.
//! Products read activations prepared per row (products.rs) into buffers kept here, one per
//! (activation kind, K).

use cudarc::driver::CudaSlice;

use super::Gpu;
use super::products::{self, ActBuf, ActKind, PMat};
use super::profile::{Profile, warp_specialized};
use crate::error::Result;
use crate::ops::Glu;
use crate::quant::DType;
use crate::quant::repack::{interleave_glu, repack};
use crate::weights::{Bytes, Tensor};

/// A weight matrix on the device.
pub struct Mat {
    /// The stored GGUF layout (v1 kernels, embedding lookups).
    data: Option<CudaSlice<u8>>,
    /// The v2 tile layout.
    packed: Option<PMat>,
    dtype: DType,
    /// Rows and columns (of one expert, for a stack).
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// Experts of a stack ([`Products::upload_experts`]); 0 for a plain matrix.
    experts: usize,
    /// Bytes from one expert to the next in the layout uploaded (tile or stored).
    expert_stride: usize,
}

impl Mat {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Experts of a stack; 0 for a plain matrix.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Bytes between consecutive experts of a stack.
    pub fn expert_stride(&self) -> usize {
        self.expert_stride
    }

    /// The stored layout's device address and bytes per row, when uploaded.
    pub fn stored(&self, g: &Gpu) -> Option<(u64, usize)> {
        self.data.as_ref().map(|d| (g.ptr(d), self.row_bytes))
    }

    /// The tile layout, when the v2 products read this matrix.
    pub fn packed(&self) -> Option<&PMat> {
        self.packed.as_ref()
    }
}

/// What a matrix is used for, which decides the layouts it is uploaded in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Products only: packed when the v2 products read its type, else stored.
    Product,
    /// Embedding lookups only: stored.
    Lookup,
    /// Both (a tied embedding table): stored, and packed when the v2 products read its type.
    Both,
}

/// Matrices that read one input (Q/K/V; gate/up).
pub enum Mats {
    /// One packed matrix of the matrices' rows concatenated; `rows[i]` rows go to output i.
    Fused {
        mat: Mat,
        rows: Vec<usize>,
    },
    Each(Vec<Mat>),
    /// Runs of consecutive matrices of one type and width, each run fused (a `Fused` part) or
    /// a single matrix (an `Each` of one), in the matrices' order: Q and K of one type beside
    /// a V of another (a Q4_K_M file's Q6_K V layers) in two launches instead of three.
    Parts(Vec<Mats>),
    /// A gate and an up matrix of `ff` rows as one packed matrix with its rows interleaved by
    /// 8 (`quant::repack::interleave_glu`): F16 / BF16 where the warp-specialized product runs,
    /// whose SwiGLU epilogue needs a feature's gate and up in one thread
    /// ([`Products::glu_product`]).
    Glu {
        mat: Mat,
        ff: usize,
    },
}

impl Mat {
    /// The tile layout of a matrix the v2 products must read (`what` names it in the error).
    fn tiles(&self, g: &Gpu, what: &str) -> Result<&PMat> {
        self.packed
            .as_ref()
            .ok_or_else(|| g.err(format!("{what} is not packed")))
    }
}

impl Mats {
    pub(super) fn list(&self) -> Vec<&Mat> {
        match self {
            Mats::Fused { mat, .. } | Mats::Glu { mat, .. } => vec![mat],
            Mats::Each(v) => v.iter().collect(),
            Mats::Parts(p) => p.iter().flat_map(Mats::list).collect(),
        }
    }

    /// The outputs the matrices write (a fused matrix writes one per part).
    fn outputs(&self) -> usize {
        match self {
            Mats::Fused { rows, .. } => rows.len(),
            Mats::Glu { .. } => 2,
            Mats::Each(v) => v.len(),
            Mats::Parts(p) => p.iter().map(Mats::outputs).sum(),
        }
    }
}

/// The product machinery of one device: whether the v2 products are on, their tuned launch
/// parameters, and the prepared-activation buffers every packed matrix reads.
pub struct Products {
    pub v2: bool,
    pub profile: Profile,
    /// (kind, K, padded K) of every packed matrix uploaded.
    keys: Vec<(ActKind, usize, usize)>,
    /// The keys that a matrix with a warp-specialized launch reads: their buffers also hold the
    /// token image that launch reads (`ActBuf::image`).
    images: Vec<(ActKind, usize, usize)>,
    /// Buffers for `rows` rows, per key.
    bufs: Vec<(ActKind, usize, ActBuf)>,
    /// (kind, K, padded K, rows per step row) of the expert products whose inputs are the
    /// (row, slot) pairs of a mixture-of-experts FFN (the down stacks), and their buffers.
    expert_keys: Vec<(ActKind, usize, usize, usize)>,
    expert_bufs: Vec<(ActKind, usize, ActBuf)>,
    rows: usize,
}

impl Products {
    pub fn new(v2: bool, profile: Profile) -> Products {
        Products {
            v2,
            profile,
            keys: Vec::new(),
            images: Vec::new(),
            bufs: Vec::new(),
            expert_keys: Vec::new(),
            expert_bufs: Vec::new(),
            rows: 0,
        }
    }

    /// Uploads the 2-D tensor `t` in the layouts its use needs.
    pub fn upload_mat(&mut self, g: &Gpu, t: &Tensor, usage: Use) -> Result<Mat> {
        let (rows, cols) = t.rows_cols();
        let product = usage != Use::Lookup;
        let packed = if product && self.v2 && products::product_supports(t.dtype) {
            Some(g.upload_packed(&self.profile, t.dtype, &t.data, rows, cols)?)
        } else {
            None
        };
        if let Some(p) = &packed {
            let key = (p.act(), cols, p.kp);
            if !self.keys.contains(&key) {
                self.keys.push(key);
                self.rows = 0; // allocate the new key's buffers at the next reserve
            }
            let ws = self.profile.ws && warp_specialized(t.dtype).is_some();
            if ws && !self.images.contains(&key) {
                self.images.push(key);
                self.rows = 0;
            }
        }
        let data = if usage != Use::Product || packed.is_none() {
            Some(g.upload(&t.data)?)
        } else {
            None
        };
        Ok(Mat {
            data,
            packed,
            dtype: t.dtype,
            rows,
            cols,
            row_bytes: t.row_bytes(),
            experts: 0,
            expert_stride: 0,
        })
    }

    /// Uploads a stack of experts `[E, rows, cols]` (3-D tensor) for [`Products::moe`]: the
    /// experts repacked into the tile layout when the v2 products read the type (the experts'
    /// tiles one after the other; a stack of whole 16-row tiles in one repack), else the stored
    /// layout. `pairs`: when the stack's input is the (row, slot) pairs of the FFN (the down
    /// stack), the pairs per step row (the experts per row), so that [`Products::reserve`]
    /// sizes their prepared activations; otherwise its input is the step's rows.
    pub fn upload_experts(&mut self, g: &Gpu, t: &Tensor, pairs: Option<usize>) -> Result<Mat> {
        self.upload_expert_parts(g, &[t], pairs)
    }

    /// [`Products::upload_experts`] for a stack given in parts: each a stack `[e, rows, cols]`
    /// or one matrix `[rows, cols]` of the same type, their experts one after the other (a
    /// folded shared expert after the routed ones) in one device buffer, with no host copy of
    /// the whole stack.
    pub fn upload_expert_parts(
        &mut self,
        g: &Gpu,
        parts: &[&Tensor],
        pairs: Option<usize>,
    ) -> Result<Mat> {
        let t = parts
            .first()
            .ok_or_else(|| g.err("an expert stack of no parts"))?;
        let (rows, cols) = match t.shape[..] {
            [_, r, c] | [r, c] => (r, c),
            _ => (0, 0),
        };
        let row_bytes = t.row_bytes();
        let stored = rows * row_bytes;
        // Each part's bytes and experts.
        let mut each = Vec::with_capacity(parts.len());
        for p in parts {
            let n = match p.shape[..] {
                [n, r, c] if n > 0 && (r, c) == (rows, cols) => n,
                [r, c] if (r, c) == (rows, cols) && parts.len() > 1 => 1,
                _ => 0,
            };
            if n == 0 || p.dtype != t.dtype || p.data.len() != n * stored {
                return Err(g.err(format!(
                    "expert stack {}: part {} ({:?} {:?}, {} bytes) is not [experts, {rows}, \
                     {cols}] of {:?} in {row_bytes}-byte rows",
                    t.name,
                    p.name,
                    p.dtype,
                    p.shape,
                    p.data.len(),
                    t.dtype
                )));
            }
            each.push((&p.data[..], n));
        }
        let e = each.iter().map(|&(_, n)| n).sum();
        if self.v2 && products::product_supports(t.dtype) {
            let tiles = super::load_stats::repacking(|| repack_parts(t.dtype, &each, rows, cols))?;
            let (stride, kp) = (tiles.stride, tiles.kp);
            let bytes: Vec<&[u8]> = tiles.parts.iter().map(|p| p.as_slice()).collect();
            let pm = PMat {
                data: g.upload_parts(&bytes)?,
                dtype: t.dtype,
                rows,
                cols,
                kp,
                col_tiles: tiles.col_tiles,
                nseg: self.profile.nseg(rows, tiles.col_tiles),
            };
            let kind = pm.act();
            match pairs {
                None if !self.keys.contains(&(kind, cols, kp)) => {
                    self.keys.push((kind, cols, kp));
                    self.rows = 0;
                }
                // One buffer per (kind, K): as many pairs a row as the widest stack reads (a
                // folded shared expert's layers take one more than the others).
                Some(n) => {
                    let key = (kind, cols, kp);
                    match self
                        .expert_keys
                        .iter()
                        .position(|&(k, c, p, _)| (k, c, p) == key)
                    {
                        Some(i) if self.expert_keys[i].3 >= n => {}
                        Some(i) => {
                            self.expert_keys[i].3 = n;
                            self.rows = 0;
                        }
                        None => {
                            self.expert_keys.push((kind, cols, kp, n));
                            self.rows = 0;
                        }
                    }
                }
                _ => {}
            }
            return Ok(Mat {
                data: None,
                packed: Some(pm),
                dtype: t.dtype,
                rows,
                cols,
                row_bytes,
                experts: e,
                expert_stride: stride,
            });
        }
        let bytes: Vec<&[u8]> = each.iter().map(|&(b, _)| b).collect();
        Ok(Mat {
            data: Some(g.upload_parts(&bytes)?),
            packed: None,
            dtype: t.dtype,
            rows,
            cols,
            row_bytes,
            experts: e,
            expert_stride: stored,
        })
    }

    /// Uploads matrices that read one input: as one packed matrix when they share a type and a
    /// width the v2 products read, as [`Mats::Parts`] when only a run of them does, else each
    /// on its own. (A fused matrix's segment count follows its rows, `Profile::nseg`: fusing is
    /// part of the device's arithmetic, as the tile parameters are.)
    pub fn upload_mats(&mut self, g: &Gpu, ts: &[&Tensor]) -> Result<Mats> {
        let Some(first) = ts.first() else {
            return Ok(Mats::Each(Vec::new()));
        };
        let (d, cols) = (first.dtype, first.rows_cols().1);
        if !self.v2 || ts.len() > 3 {
            return self.upload_each(g, ts);
        }
        // Runs of one type and width, in order; with several, a run of two or more the
        // products read is fused ([`Mats::Parts`]).
        let runs: Vec<&[&Tensor]> = ts
            .chunk_by(|a, b| a.dtype == b.dtype && a.rows_cols().1 == b.rows_cols().1)
            .collect();
        if runs.len() > 1 {
            if runs.iter().all(|r| r.len() == 1) {
                return self.upload_each(g, ts);
            }
            let parts = runs.into_iter().map(|r| self.upload_mats(g, r));
            return Ok(Mats::Parts(parts.collect::<Result<_>>()?));
        }
        if !products::product_supports(d) {
            return self.upload_each(g, ts);
        }
        let rows: Vec<usize> = ts.iter().map(|t| t.rows_cols().0).collect();
        let bytes: Vec<u8> = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
        let shape = vec![rows.iter().sum(), cols];
        let fused = Tensor::new(first.name.clone(), d, shape, Bytes::owned(bytes))?;
        let mat = self.upload_mat(g, &fused, Use::Product)?;
        Ok(Mats::Fused { mat, rows })
    }

    /// Uploads each matrix on its own ([`Mats::Each`]).
    fn upload_each(&mut self, g: &Gpu, ts: &[&Tensor]) -> Result<Mats> {
        let each = ts.iter().map(|t| self.upload_mat(g, t, Use::Product));
        Ok(Mats::Each(each.collect::<Result<_>>()?))
    }

    /// Uploads an FFN's gate and up matrices (one input): interleaved by 8 ([`Mats::Glu`])
    /// where the warp-specialized product takes their type (its SwiGLU epilogue, `mws_glu`:
    /// H200 session 16, llama3-8b F16 pp512 21,784 against 20,619 tok/s unfused), else as
    /// [`Products::upload_mats`].
    pub fn upload_glu(&mut self, g: &Gpu, gate: &Tensor, up: &Tensor) -> Result<Mats> {
        let (d, (ff, cols)) = (gate.dtype, gate.rows_cols());
        let fits = self.v2
            && self.profile.ws
            && warp_specialized(d).is_some()
            && products::product_supports(d)
            && up.dtype == d
            && up.rows_cols() == (ff, cols)
            && ff.is_multiple_of(8);
        if !fits {
            return self.upload_mats(g, &[gate, up]);
        }
        let bytes = interleave_glu(&gate.data, &up.data, ff, gate.row_bytes())?;
        let t = Tensor::new(
            gate.name.clone(),
            d,
            vec![2 * ff, cols],
            Bytes::owned(bytes),
        )?;
        let mat = self.upload_mat(g, &t, Use::Product)?;
        Ok(Mats::Glu { mat, ff })
    }

    /// Whether [`Products::glu_product`] runs for `m` rows of `w` into `down`: an interleaved
    /// matrix whose launch at `m` is the warp-specialized one, and a packed `down` reading
    /// `ff` columns of the same activation kind.
    pub fn glu_fuses(&self, w: &Mats, down: &Mat, m: usize) -> bool {
        let Mats::Glu { mat, ff } = w else {
            return false;
        };
        let (Some(p), Some(dp)) = (&mat.packed, &down.packed) else {
            return false;
        };
        self.profile.launch(m, mat.dtype, p.rows).ws && dp.act() == p.act() && down.cols == *ff
    }

    /// SiLU(gate) * up of `m` rows of the interleaved `w`, prepared for `down` in the gate/up
    /// product's epilogue (when [`Products::glu_fuses`]; the same bits as the split product,
    /// then [`Products::swiglu_for`]).
    pub fn glu_product(&self, g: &Gpu, w: &Mats, down: &Mat, m: usize) -> Result<()> {
        let (Mats::Glu { mat, ff }, Some(dp)) = (w, &down.packed) else {
            return Err(g.err("SwiGLU product of matrices that are not interleaved"));
        };
        let p = mat.tiles(g, "interleaved gate/up matrix")?;
        let a = self.act(g, p.act(), mat.cols)?;
        let out = self.act(g, dp.act(), *ff)?;
        g.product_glu(p, a, out, m, self.profile.launch(m, mat.dtype, p.rows))
    }

    /// Makes the prepared-activation buffers hold `rows` rows (after a device sync).
    pub fn reserve(&mut self, g: &Gpu, rows: usize) -> Result<()> {
        if rows <= self.rows {
            return Ok(());
        }
        self.bufs.clear();
        self.expert_bufs.clear();
        for &(kind, k, kp) in &self.keys {
            let image = self.images.contains(&(kind, k, kp));
            self.bufs.push((kind, k, g.act_buf(kind, rows, kp, image)?));
        }
        for &(kind, k, kp, n) in &self.expert_keys {
            self.expert_bufs
                .push((kind, k, g.act_buf(kind, rows * n, kp, false)?));
        }
        self.rows = rows;
        Ok(())
    }

    /// The prepared activations of the (row, slot) pairs of K values (an expert down stack's
    /// input).
    pub(super) fn expert_act(&self, g: &Gpu, kind: ActKind, k: usize) -> Result<&ActBuf> {
        self.expert_bufs
            .iter()
            .find(|(kk, kc, _)| *kk == kind && *kc == k)
            .map(|(_, _, a)| a)
            .ok_or_else(|| g.err(format!("no {kind:?} expert activation buffer for K = {k}")))
    }

    pub(super) fn act(&self, g: &Gpu, kind: ActKind, k: usize) -> Result<&ActBuf> {
        self.bufs
            .iter()
            .find(|(kk, kc, _)| *kk == kind && *kc == k)
            .map(|(_, _, a)| a)
            .ok_or_else(|| g.err(format!("no {kind:?} activation buffer for K = {k}")))
    }

    /// The distinct activation kinds the packed matrices of `ws` read.
    pub(super) fn kinds(ws: &[&Mat]) -> Vec<ActKind> {
        let mut v = Vec::new();
        for p in ws.iter().filter_map(|w| w.packed.as_ref()) {
            if !v.contains(&p.act()) {
                v.push(p.act());
            }
        }
        v
    }

    /// Prepares `m` rows of `k` f32 values at `x` for every packed matrix of `ws`.
    pub fn prep(&self, g: &Gpu, x: u64, k: usize, m: usize, ws: &[&Mat]) -> Result<()> {
        self.prep_kinds(g, x, k, m, &Self::kinds(ws))
    }

    /// Prepares `m` rows of `k` f32 values at `x` for each activation kind of `kinds`.
    fn prep_kinds(&self, g: &Gpu, x: u64, k: usize, m: usize, kinds: &[ActKind]) -> Result<()> {
        for &kind in kinds {
            g.prepare(x, self.act(g, kind, k)?, m, k)?;
        }
        Ok(())
    }

    /// [`Products::prep`] for every matrix of `w`.
    pub fn prep_mats(&self, g: &Gpu, x: u64, k: usize, m: usize, w: &Mats) -> Result<()> {
        self.prep(g, x, k, m, &w.list())
    }

    /// RMSNorm of `m` rows of `width` at `x` into `y` (f32), prepared for the packed matrices
    /// of `ws` in the same pass when there are any.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_for(
        &self,
        g: &Gpu,
        (x, w, y): (u64, u64, u64),
        m: usize,
        width: usize,
        eps: f32,
        ws: &[&Mat],
    ) -> Result<()> {
        let kinds = Self::kinds(ws);
        let Some(&first) = kinds.first() else {
            return g.rms_norm(x, w, y, m, width, eps);
        };
        g.norm_prep(x, w, Some(y), self.act(g, first, width)?, m, width, eps)?;
        self.prep_kinds(g, y, width, m, &kinds[1..])
    }

    /// [`Products::norm_for`] for every matrix of `w`.
    pub fn norm_for_mats(
        &self,
        g: &Gpu,
        xwy: (u64, u64, u64),
        m: usize,
        width: usize,
        eps: f32,
        w: &Mats,
    ) -> Result<()> {
        self.norm_for(g, xwy, m, width, eps, &w.list())
    }

    /// `x += RMSNorm(o) * post` for `m` rows of `width` (a post-norm sublayer into the residual;
    /// `o` is left as it was), then with `next` = (norm, eps, h, ws) the RMSNorm of `x` into `h`
    /// prepared for the packed matrices of `ws` ([`Products::norm_for`]'s bits), in one launch
    /// where `ws` has a packed matrix.
    #[allow(clippy::too_many_arguments)]
    pub fn add_norm_for(
        &self,
        g: &Gpu,
        post: (u64, u64, f32),
        x: u64,
        next: Option<(u64, f32, u64, &[&Mat])>,
        m: usize,
        width: usize,
    ) -> Result<()> {
        let Some((w, eps, h, ws)) = next else {
            return g.add_norm_prep(post, x, None, m, width);
        };
        let kinds = Self::kinds(ws);
        let Some(&first) = kinds.first() else {
            g.add_norm_prep(post, x, None, m, width)?;
            return g.rms_norm(x, w, h, m, width, eps);
        };
        g.add_norm_prep(
            post,
            x,
            Some((w, h, self.act(g, first, width)?, eps)),
            m,
            width,
        )?;
        self.prep_kinds(g, h, width, m, &kinds[1..])
    }

    /// SwiGLU of `m` rows of `width` (`gate`, `up`), prepared for the packed matrices of `ws`;
    /// the f32 result replaces `gate` where a reader needs it, else `gate` is left as it was.
    pub fn swiglu_for(
        &self,
        g: &Gpu,
        gu: (u64, u64),
        m: usize,
        width: usize,
        ws: &[&Mat],
    ) -> Result<()> {
        self.glu_for(Glu::Silu, g, gu, m, width, ws)
    }

    /// [`Products::swiglu_for`] for either gated activation.
    pub fn glu_for(
        &self,
        kind: Glu,
        g: &Gpu,
        (gate, up): (u64, u64),
        m: usize,
        width: usize,
        ws: &[&Mat],
    ) -> Result<()> {
        let kinds = Self::kinds(ws);
        let Some(&first) = kinds.first() else {
            return match kind {
                Glu::Silu => g.swiglu(gate, up, m * width),
                Glu::GeluTanh => g.geglu_tanh(gate, up, m * width),
            };
        };
        // The f32 result goes back to `gate` only where something reads it (another kind's
        // preparation, a matrix without the tile layout): a packed product reads the prepared
        // buffer alone (at 512 tokens of llama3-8b that write was 29 MB per layer).
        let unpacked = ws.iter().any(|w| w.packed.is_none());
        let keep = (kinds.len() > 1 || unpacked).then_some(gate);
        g.glu_prep(kind, (gate, up), keep, self.act(g, first, width)?, m, width)?;
        self.prep_kinds(g, gate, width, m, &kinds[1..])
    }

    /// The gated DeltaNet's output gating of `m` rows of `width`: `z = silu(z) * (RMSNorm(c) *
    /// w)`, one norm per `group` values (`c` is scratch afterwards), prepared for `out` in the
    /// same launch when `out` is packed and `group` a multiple of 32 ([`Gpu::norm_gate_prep`];
    /// `z`'s f32 values are then not written: the product reads the prepared buffer alone).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_gate_for(
        &self,
        g: &Gpu,
        (c, w, z): (u64, u64, u64),
        m: usize,
        width: usize,
        group: usize,
        eps: f32,
        out: &Mat,
    ) -> Result<()> {
        match &out.packed {
            Some(p) if group.is_multiple_of(32) && width.is_multiple_of(group) => {
                let a = self.act(g, p.act(), width)?;
                g.norm_gate_prep((c, w, z), None, a, m, width, group, eps)
            }
            _ => {
                g.rms_norm(c, w, c, m * (width / group.max(1)), group, eps)?;
                self.swiglu_for(g, (z, c), m, width, &[out])
            }
        }
    }

    /// The buffer attention may prepare its output into for the product `w` (`k` = its input
    /// width), when it can (`head_dim` a multiple of 32).
    pub fn attn_prep(
        &self,
        g: &Gpu,
        w: &Mat,
        k: usize,
        head_dim: usize,
    ) -> Result<Option<&ActBuf>> {
        match &w.packed {
            Some(p) if head_dim.is_multiple_of(32) => self.act(g, p.act(), k).map(Some),
            _ => Ok(None),
        }
    }

    /// The product: `y = W x` for `m` rows (`x`: f32 rows of `w`'s width, already prepared by
    /// [`Products::prep`] or a fused producer when `w` is packed); with `res`, `res += W x`
    /// instead (`y` is then scratch for the v1 path).
    pub fn matmul(
        &self,
        g: &Gpu,
        w: &Mat,
        (x, y): (u64, u64),
        res: Option<u64>,
        m: usize,
    ) -> Result<()> {
        if let Some(p) = &w.packed {
            let a = self.act(g, p.act(), w.cols)?;
            let launch = self.profile.launch(m, w.dtype, w.rows);
            return match res {
                Some(r) => g.product(p, a, r, Some(r), m, launch),
                None => g.product(p, a, y, None, m, launch),
            };
        }
        let data = w
            .data
            .as_ref()
            .ok_or_else(|| g.err("weight matrix has no stored layout"))?;
        g.matmul(w.dtype, g.ptr(data), w.row_bytes, x, y, m, w.rows, w.cols)?;
        match res {
            Some(r) => g.add_in_place(r, y, m * w.rows),
            None => Ok(()),
        }
    }

    /// `ys[i] = W[i] x` for `m` rows (prepared like [`Products::matmul`]); `ys`: (buffer,
    /// columns) per matrix.
    pub fn matmuls(&self, g: &Gpu, w: &Mats, x: u64, ys: &[(u64, usize)], m: usize) -> Result<()> {
        match w {
            Mats::Fused { mat, rows } => {
                let p = mat.tiles(g, "fused weight matrix")?;
                if rows.len() != ys.len() || rows.iter().zip(ys).any(|(r, y)| *r != y.1) {
                    return Err(g.err(format!("fused product of {rows:?} rows into {ys:?}")));
                }
                let a = self.act(g, p.act(), mat.cols)?;
                g.product_to(p, a, ys, None, m, self.profile.launch(m, mat.dtype, p.rows))
            }
            Mats::Glu { mat, ff } => {
                let p = mat.tiles(g, "interleaved gate/up matrix")?;
                let [(gate, gw), (up, uw)] = ys else {
                    return Err(g.err(format!("gate/up product into {} outputs", ys.len())));
                };
                if (*gw, *uw) != (*ff, *ff) {
                    return Err(g.err(format!("gate/up product of {ff} features into {ys:?}")));
                }
                let a = self.act(g, p.act(), mat.cols)?;
                let l = self.profile.launch(m, mat.dtype, p.rows);
                g.product_glu_split(p, a, (*gate, *up), m, l)
            }
            Mats::Parts(parts) => {
                if w.outputs() != ys.len() {
                    return Err(g.err(format!("{} outputs for {}", w.outputs(), ys.len())));
                }
                let mut at = 0;
                for part in parts {
                    let n = part.outputs();
                    self.matmuls(g, part, x, &ys[at..at + n], m)?;
                    at += n;
                }
                Ok(())
            }
            Mats::Each(ws) => {
                if ws.len() != ys.len() {
                    return Err(g.err(format!("{} matrices for {} outputs", ws.len(), ys.len())));
                }
                for (w, &(y, _)) in ws.iter().zip(ys) {
                    self.matmul(g, w, (x, y), None, m)?;
                }
                Ok(())
            }
        }
    }

    /// `y[r] = dequantize(table[tokens[r]])` for `m` rows (`tokens`: u32 device array).
    pub fn embed(&self, g: &Gpu, table: &Mat, tokens: u64, y: u64, m: usize) -> Result<()> {
        let data = table
            .data
            .as_ref()
            .ok_or_else(|| g.err("embedding table missing"))?;
        g.embed(
            table.dtype,
            g.ptr(data),
            table.row_bytes,
            tokens,
            y,
            m,
            table.cols,
        )
    }
}

/// An expert stack in the tile layout, part by part ([`repack_parts`]).
struct StackTiles {
    parts: Vec<Vec<u8>>,
    kp: usize,
    col_tiles: usize,
    /// Bytes from one expert to the next.
    stride: usize,
}

/// The tile layout of an expert stack given in parts (each the GGUF bytes of `e` experts of
/// `rows` x `cols` of `dtype`, checked by the caller), the experts' tiles one after the other
/// across the parts. With whole 16-row tiles an expert's tiles are its part's tile rows
/// x * rows / 16 onwards, so a part repacks as one matrix of e * rows rows (every tile row in
/// parallel, no per-expert copy); otherwise expert by expert. The same bytes either way.
fn repack_parts(
    dtype: DType,
    parts: &[(&[u8], usize)],
    rows: usize,
    cols: usize,
) -> Result<StackTiles> {
    let mut out = StackTiles {
        parts: Vec::with_capacity(parts.len()),
        kp: 0,
        col_tiles: 0,
        stride: 0,
    };
    for &(data, e) in parts {
        let stored = data.len() / e.max(1);
        let bytes = if rows.is_multiple_of(16) {
            let t = repack(dtype, data, e * rows, cols)?;
            (out.kp, out.col_tiles) = (t.padded_cols(), t.col_tiles);
            out.stride = t.data.len() / e.max(1);
            t.data
        } else {
            let mut bytes = Vec::new();
            for x in 0..e {
                let t = repack(dtype, &data[x * stored..(x + 1) * stored], rows, cols)?;
                (out.kp, out.col_tiles, out.stride) = (t.padded_cols(), t.col_tiles, t.data.len());
                if x == 0 {
                    bytes.reserve_exact(e * t.data.len());
                }
                bytes.extend_from_slice(&t.data);
            }
            bytes
        };
        out.parts.push(bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack in parts (routed experts, then a folded shared expert) gives the bytes of the
    /// whole stack repacked expert by expert, whole 16-row tiles or not.
    #[test]
    fn a_stack_in_parts_repacks_as_the_whole_stack() {
        for (dtype, rows, cols) in [
            (DType::Q4_K, 32, 512),
            (DType::Q6_K, 24, 256),
            (DType::Q8_0, 16, 96),
        ] {
            let rb = dtype.bytes_for(cols as u64).unwrap() as usize;
            let (e, stored) = (3, rows * rb);
            let all = crate::testing::pseudo_bytes((e + 1) * stored, rows as u64);
            let (stack, shared) = all.split_at(e * stored);
            let got = repack_parts(dtype, &[(stack, e), (shared, 1)], rows, cols).unwrap();
            let mut want = Vec::new();
            for x in 0..=e {
                let t = repack(dtype, &all[x * stored..(x + 1) * stored], rows, cols).unwrap();
                assert_eq!(
                    (got.kp, got.col_tiles, got.stride),
                    (t.padded_cols(), t.col_tiles, t.data.len())
                );
                want.extend_from_slice(&t.data);
            }
            assert_eq!(got.parts.len(), 2);
            assert!(got.parts.concat() == want, "{dtype} {rows} rows");
            assert_eq!(
                got.parts[1].len(),
                got.stride,
                "{dtype}: the shared expert is one expert"
            );
        }
    }
}
