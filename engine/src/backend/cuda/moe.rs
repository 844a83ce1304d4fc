//! The mixture-of-experts FFN on the device ([`crate::ops::Ops::moe`], issue 16): routing, the
//! chosen experts' products through an indirection, and the weighted sum, all on the stream with
//! no host copy (it runs inside CUDA graph captures).
//!
//! 1. `moe_route` (kernels/cu/moe.cu), one block per row: softmax over the E router logits, the
//!    k highest probabilities (equal ones: the lowest expert index), renormalised when the
//!    config says so, sorted by expert index: k (expert, weight) pairs per row in device memory.
//!    A decode step of up to 8 rows may have routed already (`moe_norm_route`: the FFN norm,
//!    the F32 router and this routing in one launch; [`MoeBufs::routed`]), and prepared the
//!    normalized rows for the gate and up products in it ([`MoeBufs::prepared`]).
//! 2. The gate and up products of every (row, slot) pair: `mmq_id_<type>` (the v2 tensor-core
//!    product of products.cu at M = 1, its weights offset by the pair's expert id; gate and up
//!    in one launch when their stacks are packed alike) or
//!    `matmul_id_<type>` (the v1 kernel likewise, for the types the v2 products do not read).
//!    A pair's bits are those of the dense product of its expert on its row: they depend on
//!    nothing else (not on how many rows chose the expert, nor on the other rows).
//!    Grouped (prefill-sized calls, [`super::profile::Profile::moe_grouped`]): `moe_group` first sorts the
//!    pairs by expert on the device (a counting sort: ascending pair index within an expert,
//!    per-expert pair and token-tile offsets), then `mms_grouped_<type>` runs, per expert, the
//!    shared-memory v2 product over that expert's pairs as a block of rows
//!    ([`MOE_GROUPED_LAUNCH`]: 128 rows x 16 pairs a block, each weight tile staged once for the
//!    16 pairs and each pair's activations once for the 128 rows), each row gathered from and
//!    written to its pair's row. The v2
//!    products compute one per-element sequence at every M and launch geometry, so the grouped
//!    and per-pair paths give the same bits (`memra-verify kernels` compares them bitwise). The
//!    grid is sized from the host-known bound on tiles (blocks past the last tile exit): no
//!    host copy, graph-safe.
//! 3. The GLU over the pairs (fused with the preparation of the down product's activations),
//!    then the down product of every pair the same way.
//! 4. `moe_combine`: each row adds its k weighted expert outputs in ascending expert index onto
//!    +0, as the CPU does (backend/cpu/moe.rs).
//!
//! Speed: decode reads each chosen expert's weights once per (row, slot), as a dense decode
//! product does. Per pair, prefill would do the same (an expert chosen by many rows of a chunk
//! read once per row, every pair an 8-token mma tile with one live token); the grouped path
//! reads an expert's weights once per [`MOE_TILE`] of its pairs instead. The stored (v1) layout always
//! runs per pair.

use super::device::{Arg, Gpu};
use super::mat::{Mat, Products};
use super::products::{ActBuf, ActKind, PMat};
use super::profile::{Launch, MOE_GROUPED_LAUNCH};
use crate::error::Result;
use crate::ops::{Glu, MoeParams};
use crate::quant::DType;

/// Device addresses of one MoE call over `m` rows with `k` experts each (P = m k pairs).
#[derive(Clone, Copy, Debug)]
pub struct MoeBufs {
    /// Input rows (f32, `m x hidden`).
    pub x: u64,
    /// Router logits (f32, `m x E`).
    pub router: u64,
    /// Output rows (f32, `m x hidden`).
    pub out: u64,
    /// P expert ids (u32) and P weights (f32), row-major by (row, slot).
    pub ids: u64,
    pub wts: u64,
    /// The gate and up outputs of every pair (f32, `P x expert_ffn` each).
    pub gate: u64,
    pub up: u64,
    /// The down outputs of every pair (f32, `P x hidden`).
    pub y: u64,
    /// The grouped path's scratch ([`super::profile::Profile::moe_grouped`]; unused by the per-pair path): the
    /// P pair indices sorted by expert (u32), and [`group_offsets_len`] u32 offsets.
    pub order: u64,
    pub offs: u64,
    /// The residual rows (f32, `m x hidden`) the output is added into (`res += out`, the bits
    /// of `add_in_place`), or 0 for none.
    pub res: u64,
    /// Whether `ids` / `wts` already hold the routing ([`Gpu::moe_norm_route`] ran).
    pub routed: bool,
    /// Whether the stacks' last expert is a shared expert every row takes ([`Route::shared`]:
    /// the call's `n_experts` and `n_used` count it; the router logits are `n_experts` wide).
    pub shared: bool,
    /// Whether that launch also prepared `x` for the gate and up products
    /// ([`Products::moe_prep_buf`]).
    pub prepared: bool,
}

/// u32 values of the grouped path's offsets for `n_experts` experts (`moe_group`: pair offsets
/// and token-tile offsets, E + 1 each).
pub fn group_offsets_len(n_experts: usize) -> usize {
    2 * (n_experts + 1)
}

/// u32 values of a model's MoE index scratch: the grouped offsets, then the ticket of
/// [`Gpu::moe_norm_route`] (0 between launches).
pub fn moe_scratch_len(n_experts: usize) -> usize {
    group_offsets_len(n_experts) + 1
}

/// A routing ([`Gpu::moe_route`], [`Gpu::moe_norm_route`]): `k` of `e` experts by the softmax
/// of their logits, renormalised when `norm`. With `shared` a row's logits have one more, the
/// gate of a shared expert folded in as expert `e` (the stacks' last), which every row takes as
/// its slot `k` with weight `sigmoid(logit e)` (qwen3next: the combine then adds it after the
/// routed experts, as the CPU adds `sigmoid(g) * shared(h)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub e: usize,
    pub k: usize,
    pub norm: bool,
    pub shared: bool,
}

impl Route {
    /// The routing of `p` (`shared`: its last expert and slot are the shared expert's).
    pub fn of(p: &MoeParams, shared: bool) -> Route {
        let s = shared as usize;
        Route {
            e: p.n_experts.saturating_sub(s),
            k: p.n_used.saturating_sub(s),
            norm: p.norm_topk,
            shared,
        }
    }

    /// Pairs per row (`k`, and the shared slot).
    pub fn slots(&self) -> usize {
        self.k + self.shared as usize
    }

    /// Router logits per row (`e`, and the shared expert's gate).
    pub fn logits(&self) -> usize {
        self.e + self.shared as usize
    }

    fn check(&self, g: &Gpu, what: &str) -> Result<()> {
        let (e, k) = (self.e, self.k);
        if e > memra_kernels::MOE_MAX_EXPERTS
            || k == 0
            || k > e
            || self.slots() > memra_kernels::MOE_MAX_USED
        {
            return Err(g.err(format!("{what}: {k} of {e} experts")));
        }
        Ok(())
    }

    /// `moe_route`'s arguments: the logits, ids and weights, then [`Route::args`].
    fn route_args(&self, router: u64, (ids, wts): (u64, u64)) -> [Arg; 7] {
        let [e, k, norm, shared] = self.args();
        [
            Arg::Ptr(router),
            Arg::Ptr(ids),
            Arg::Ptr(wts),
            e,
            k,
            norm,
            shared,
        ]
    }

    fn args(&self) -> [Arg; 4] {
        [
            Arg::U32(self.e as u32),
            Arg::U32(self.k as u32),
            Arg::U32(self.norm as u32),
            Arg::U32(self.shared as u32),
        ]
    }
}

/// Most bytes of normalized rows `moe_norm_route` keeps in dynamic shared memory (rows x
/// hidden x 4; with its ~9 KiB of static arrays under the 48 KiB a launch gets without opting
/// in): larger steps take rms_norm, matmul_f32_rows and moe_route.
pub const NORM_ROUTE_SMEM: usize = 32 * 1024;

/// Pairs of one expert per block of the grouped products (the tokens of a
/// [`MOE_GROUPED_LAUNCH`] block; `moe_group` cuts each expert's pairs into tiles of this many).
pub const MOE_TILE: usize = MOE_GROUPED_LAUNCH.smem_block().1;

/// A bound on the token tiles of `pairs` pairs over `n_experts` experts (sum over experts of
/// ceil(count / MOE_TILE) <= floor(pairs / MOE_TILE) + the non-empty experts): the grid of a
/// grouped product, whose blocks past the real count exit.
fn tile_bound(pairs: usize, n_experts: usize) -> usize {
    pairs / MOE_TILE + n_experts.min(pairs)
}

/// Threads of `moe_route` (`MOE_RT` in kernels/cu/moe.cu: one block per row).
const MOE_ROUTE_THREADS: u32 = 256;

/// Most pairs one expert-product launch takes (grid.y); larger calls are cut into launches of
/// this many, offset by `p0` (the bits do not depend on the cut).
const PAIRS_PER_LAUNCH: usize = 65535;

/// The (first pair, pairs) of each launch over `pairs` pairs.
fn pair_chunks(pairs: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..pairs)
        .step_by(PAIRS_PER_LAUNCH)
        .map(move |p0| (p0, PAIRS_PER_LAUNCH.min(pairs - p0)))
}

/// The launch geometry of the expert products: the decode shape of products.cu (one 16-row tile
/// per block, one 8-token fragment, K split over `nseg` warps). Only `nseg` (the matrix's, fixed
/// at load) is arithmetic.
pub const ID_LAUNCH: Launch = Launch {
    nt: 1,
    rpb: 1,
    split_k: true,
    smem: false,
    wg: false,
    ws: false,
    stages: 0,
    wgs: 0,
};

/// Checks the expert stacks and the call's shapes; returns (expert_ffn, hidden).
fn check_shapes(g: &Gpu, w: [&Mat; 3], p: &MoeParams) -> Result<(usize, usize)> {
    let [gate, up, down] = w;
    let (e, k) = (p.n_experts, p.n_used);
    let (f, h) = (gate.rows(), gate.cols());
    let stacks_ok = [gate, up, down].iter().all(|s| s.experts() == e)
        && (up.rows(), up.cols()) == (f, h)
        && (down.rows(), down.cols()) == (h, f);
    if !stacks_ok {
        return Err(g.err(format!(
            "moe: expert stacks gate {}x[{}, {}], up {}x[{}, {}], down {}x[{}, {}] for {e} experts",
            gate.experts(),
            gate.rows(),
            gate.cols(),
            up.experts(),
            up.rows(),
            up.cols(),
            down.experts(),
            down.rows(),
            down.cols()
        )));
    }
    if k == 0 || k > e || k > memra_kernels::MOE_MAX_USED || e > memra_kernels::MOE_MAX_EXPERTS {
        return Err(g.err(format!(
            "moe: {k} of {e} experts (the kernels take up to {} of up to {})",
            memra_kernels::MOE_MAX_USED,
            memra_kernels::MOE_MAX_EXPERTS
        )));
    }
    Ok((f, h))
}

impl Products {
    /// The MoE FFN of `m` rows (the [`crate::ops::Ops::moe`] contract) through the buffers of
    /// `b`; `w`: the gate, up and down stacks ([`Products::upload_experts`]).
    pub fn moe(&self, g: &Gpu, w: [&Mat; 3], b: &MoeBufs, m: usize, p: &MoeParams) -> Result<()> {
        let (f, h) = check_shapes(g, w, p)?;
        let [gate, up, down] = w;
        let k = p.n_used;
        if m == 0 {
            return Ok(());
        }
        if !b.routed {
            g.moe_route(b.router, (b.ids, b.wts), m, Route::of(p, b.shared))?;
        }
        let pairs = m * k;
        let all_packed = w.iter().all(|s| s.packed().is_some());
        let group = (all_packed && self.profile.moe_grouped(pairs, p.n_experts))
            .then_some((b.order, b.offs));
        if group.is_some() {
            g.moe_group(b.ids, (b.order, b.offs), pairs, p.n_experts)?;
        }
        if !b.prepared {
            self.prep(g, b.x, h, m, &[gate, up])?;
        }
        if !self.gate_up_product(g, [gate, up], (b.gate, b.up), b.ids, group, k, pairs)? {
            self.expert_product(g, gate, (b.x, b.gate), b.ids, group, Some(k), pairs)?;
            self.expert_product(g, up, (b.x, b.up), b.ids, group, Some(k), pairs)?;
        }
        let down_act = match down.packed() {
            Some(d) => Some(self.expert_act(g, d.act(), f)?),
            None => None,
        };
        match (p.glu, down_act) {
            (Glu::Silu, Some(a)) => g.swiglu_prep(b.gate, b.up, None, a, pairs, f)?,
            (Glu::Silu, None) => g.swiglu(b.gate, b.up, pairs * f)?,
            (Glu::GeluTanh, a) => {
                g.geglu_tanh(b.gate, b.up, pairs * f)?;
                if let Some(a) = a {
                    g.prepare(b.gate, a, pairs, f)?;
                }
            }
        }
        self.expert_product(g, down, (b.gate, b.y), b.ids, group, None, pairs)?;
        g.moe_combine(b.y, b.wts, (b.out, b.res), m, k, h)
    }

    /// The one prepared-activation buffer the gate and up stacks `w` read for rows of `k`, when
    /// they read exactly one kind: [`Gpu::moe_norm_route`] can prepare it in its launch.
    pub fn moe_prep_buf(&self, g: &Gpu, w: [&Mat; 2], k: usize) -> Result<Option<&ActBuf>> {
        match Self::kinds(&w).as_slice() {
            [kind] => self.act(g, *kind, k).map(Some),
            _ => Ok(None),
        }
    }

    /// The gate and up products of the per-pair path in one launch ([`Gpu::product_id`] with a
    /// second matrix) when both stacks are packed alike; false (nothing launched) otherwise.
    #[allow(clippy::too_many_arguments)]
    fn gate_up_product(
        &self,
        g: &Gpu,
        [gate, up]: [&Mat; 2],
        (yg, yu): (u64, u64),
        ids: u64,
        group: Option<(u64, u64)>,
        k: usize,
        pairs: usize,
    ) -> Result<bool> {
        let (Some(pg), Some(pu)) = (gate.packed(), up.packed()) else {
            return Ok(false);
        };
        let alike = pg.same_layout(pu)
            && gate.expert_stride() == up.expert_stride()
            && gate.experts() == up.experts();
        if group.is_some() || !alike || 2 * pairs > PAIRS_PER_LAUNCH {
            return Ok(false);
        }
        let a = self.act(g, pg.act(), gate.cols())?;
        let ids = IdArgs {
            ids,
            xdiv: k,
            n_experts: gate.experts(),
            stride: gate.expert_stride(),
        };
        g.product_id_two(pg, Some((pu, yu)), a, &ids, yg, pairs)?;
        Ok(true)
    }

    /// `y[p] = W[ids[p]] x[p / xdiv]` for `pairs` pairs: `x` is f32 for the stored layout, and
    /// already prepared for the packed one. `token_rows`: `Some(k)`: x holds the step's rows,
    /// each shared by its k pairs (xdiv = k, the step's buffer; k may be 1); `None`: x holds
    /// one row per pair (xdiv = 1, the pairs' buffer). `group`: (order, offsets) of `moe_group` for the grouped product (packed
    /// layouts only), or `None` for one product per pair.
    #[allow(clippy::too_many_arguments)]
    fn expert_product(
        &self,
        g: &Gpu,
        w: &Mat,
        (x, y): (u64, u64),
        ids: u64,
        group: Option<(u64, u64)>,
        token_rows: Option<usize>,
        pairs: usize,
    ) -> Result<()> {
        let xdiv = token_rows.unwrap_or(1);
        match w.packed() {
            Some(pm) => {
                // Not decided by xdiv: with one expert per row (k = 1) the step's rows are
                // the pairs' too, but they sit in the step's buffer (H200 session 9).
                let a = match token_rows {
                    Some(_) => self.act(g, pm.act(), w.cols())?,
                    None => self.expert_act(g, pm.act(), w.cols())?,
                };
                let ids = IdArgs {
                    ids,
                    xdiv,
                    n_experts: w.experts(),
                    stride: w.expert_stride(),
                };
                match group {
                    Some(grp) => g.product_grouped(pm, a, &ids, grp, y, pairs),
                    None => g.product_id(pm, a, &ids, y, pairs),
                }
            }
            None => {
                let (data, row_bytes) = w
                    .stored(g)
                    .ok_or_else(|| g.err("expert stack has no device layout"))?;
                let ids = IdArgs {
                    ids,
                    xdiv,
                    n_experts: w.experts(),
                    stride: w.expert_stride(),
                };
                let shape = (w.rows(), w.cols(), row_bytes);
                g.matmul_id(w.dtype(), data, shape, &ids, (x, y), pairs)
            }
        }
    }
}

/// The indirection of an expert product: ids (u32 per pair), the input row of pair p is
/// `p / xdiv`, experts `stride` bytes apart.
#[derive(Clone, Copy, Debug)]
pub struct IdArgs {
    pub ids: u64,
    pub xdiv: usize,
    pub n_experts: usize,
    pub stride: usize,
}

impl IdArgs {
    fn check(&self, g: &Gpu) -> Result<()> {
        if self.xdiv == 0 || self.n_experts == 0 {
            return Err(g.err(format!("expert product: {self:?}")));
        }
        Ok(())
    }
}

impl Gpu {
    /// Routes `m` rows of router logits (`r.logits()` each): `r.slots()` (expert, weight) pairs
    /// per row, ascending expert index, to `ids` (u32) and `wts` (f32).
    pub fn moe_route(&self, router: u64, (ids, wts): (u64, u64), m: usize, r: Route) -> Result<()> {
        r.check(self, "moe_route")?;
        if m == 0 {
            return Ok(());
        }
        let args = r.route_args(router, (ids, wts));
        self.launch(
            "moe_route",
            (self.u32_of(m, "router rows")?, 1),
            MOE_ROUTE_THREADS,
            &args,
        )
    }

    /// A decode step's MoE router in one launch (`moe_norm_route`): `h = RMSNorm(x) * norm`
    /// (rms_norm's bits), `logits = router h` (F32 weights in their stored rows, the bits of
    /// matmul_f32_rows), then the routing of every row to `ids` / `wts` as
    /// [`Gpu::moe_route`]. `m` rows of `width`, at most 8 and [`NORM_ROUTE_SMEM`] bytes;
    /// `ticket`: a u32 that is 0 (the kernel leaves it 0). With `prep`, `h` is also prepared
    /// into it ([`Gpu::prepare`]'s bits) for the expert products.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_norm_route(
        &self,
        (x, norm, eps, h): (u64, u64, f32, u64),
        (router, row_bytes): (u64, usize),
        logits: u64,
        (ticket, ids, wts): (u64, u64, u64),
        (m, width): (usize, usize),
        prep: Option<&ActBuf>,
        r: Route,
    ) -> Result<()> {
        let smem = m * width * 4;
        if m == 0 || m > 8 || smem > NORM_ROUTE_SMEM || row_bytes < width * 4 {
            return Err(self.err(format!(
                "moe_norm_route: {m} rows of {width} (at most 8 rows, {NORM_ROUTE_SMEM} bytes)"
            )));
        }
        r.check(self, "moe_norm_route")?;
        if let Some(a) = prep {
            self.check_act(a, m, width)?;
        }
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(norm),
            Arg::F32(eps),
            Arg::Ptr(h),
            Arg::Ptr(router),
            Arg::U64(row_bytes as u64),
            Arg::Ptr(logits),
            Arg::Ptr(ticket),
            Arg::Ptr(ids),
            Arg::Ptr(wts),
            Arg::Ptr(prep.map_or(0, |a| self.ptr(&a.values))),
            Arg::Ptr(prep.map_or(0, |a| self.ptr(&a.scales))),
            Arg::U32(self.u32_of(prep.map_or(0, |a| a.kp), "kp")?),
            Arg::U32(prep.is_some_and(|a| a.kind == ActKind::BF16) as u32),
            Arg::U32(m as u32),
            Arg::U32(self.u32_of(width, "hidden")?),
        ];
        let args: Vec<Arg> = args.into_iter().chain(r.args()).collect();
        let grid = (self.u32_of(r.logits(), "experts")?, 1);
        self.launch_smem(
            "moe_norm_route",
            grid,
            MOE_ROUTE_THREADS,
            smem as u32,
            &args,
        )
    }

    /// Sorts `pairs` expert ids by expert for the grouped products (`moe_group`): `order` gets
    /// the pair indices (ascending within an expert), `offs` the [`group_offsets_len`] pair and
    /// token-tile offsets. One block; integers only.
    pub fn moe_group(
        &self,
        ids: u64,
        (order, offs): (u64, u64),
        pairs: usize,
        e: usize,
    ) -> Result<()> {
        if e == 0 || e > memra_kernels::MOE_MAX_EXPERTS {
            return Err(self.err(format!("moe_group: {e} experts")));
        }
        if pairs == 0 {
            return Ok(());
        }
        let args = group_args(ids, (order, offs), self.u32_of(pairs, "pairs")?, e);
        self.launch("moe_group", (1, 1), 256, &args)
    }

    /// `out[r] = sum_j wts[r k + j] y[r k + j]` (j ascending, from +0) for `m` rows of `h`, then
    /// `res[r] += out[r]` when `res` is not 0.
    pub fn moe_combine(
        &self,
        y: u64,
        wts: u64,
        (out, res): (u64, u64),
        m: usize,
        k: usize,
        h: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(wts),
            Arg::Ptr(out),
            Arg::Ptr(res),
            Arg::U32(self.u32_of(m, "rows")?),
            Arg::U32(self.u32_of(k, "experts per row")?),
            Arg::U32(self.u32_of(h, "hidden")?),
        ];
        let grid = Self::stride_grid((m * h) as u64);
        self.launch("moe_combine", grid, 256, &args)
    }

    /// The v2 expert product: `y[p] = W[ids[p]] a[p / xdiv]` for `pairs` pairs (`a`: prepared
    /// activations; `w`: the experts' tile layouts `ids.stride` bytes apart).
    pub fn product_id(
        &self,
        w: &PMat,
        a: &ActBuf,
        ids: &IdArgs,
        y: u64,
        pairs: usize,
    ) -> Result<()> {
        self.product_id_two(w, None, a, ids, y, pairs)
    }

    /// [`Gpu::product_id`], and with `second` = (w2, y2) also `y2[p] = W2[ids[p]] a[p / xdiv]`
    /// in the same launches (`w2` of `w`'s type and shape, experts `ids.stride` apart).
    pub fn product_id_two(
        &self,
        w: &PMat,
        second: Option<(&PMat, u64)>,
        a: &ActBuf,
        ids: &IdArgs,
        y: u64,
        pairs: usize,
    ) -> Result<()> {
        ids.check(self)?;
        if let Some((w2, _)) = second.filter(|(w2, _)| !w.same_layout(w2)) {
            return Err(self.err(format!(
                "expert products in one launch: {} {} x {} with {} {} x {}",
                w.dtype, w.rows, w.cols, w2.dtype, w2.rows, w2.cols
            )));
        }
        let rows_needed = pairs.div_ceil(ids.xdiv);
        if a.kind != w.act() || a.kp != w.kp || rows_needed > a.rows {
            return Err(self.err(format!(
                "expert product: {} weights ({} x {}, kp {}) with {:?} activations of {} x {} \
                 ({rows_needed} rows needed)",
                w.dtype, w.rows, w.cols, w.kp, a.kind, a.rows, a.kp
            )));
        }
        if pairs == 0 || w.rows == 0 {
            return Ok(());
        }
        let l = ID_LAUNCH;
        let threads = 32 * w.nseg;
        if threads > l.max_threads() {
            return Err(self.err(format!("expert product: nseg {} too large", w.nseg)));
        }
        let smem = if w.nseg > 1 { w.nseg * 16 * 8 * 4 } else { 0 };
        let f = self.variant("products", &l.defines())?;
        let name = format!("mmq_id_{}", w.dtype.name());
        let func = f
            .get(&name)
            .ok_or_else(|| self.err(format!("kernel {name} missing")))?;
        let row_tiles = self.u32_of(w.rows.div_ceil(16), "row tiles")?;
        let (w2, y2, ways) = match second {
            Some((w2, y2)) => (self.ptr(&w2.data), y2, 2),
            None => (self.ptr(&w.data), y, 1),
        };
        let chunk = PAIRS_PER_LAUNCH / ways;
        for p0 in (0..pairs).step_by(chunk) {
            let n = chunk.min(pairs - p0);
            let args = product_id_args(self, w, a, ids, (y, (w2, y2)), (p0, n));
            let grid = (row_tiles, (ways * n) as u32);
            self.launch_fn(func, &name, grid, threads, smem, &args)?;
        }
        Ok(())
    }

    /// The grouped v2 expert product: the bits of [`Gpu::product_id`] (`y[p] = W[ids[p]]
    /// a[p / xdiv]`), computed per expert over its pairs (`order`, `offs`: [`Gpu::moe_group`] of
    /// the same ids) as a block of rows, [`MOE_TILE`] pairs per block.
    pub fn product_grouped(
        &self,
        w: &PMat,
        a: &ActBuf,
        ids: &IdArgs,
        (order, offs): (u64, u64),
        y: u64,
        pairs: usize,
    ) -> Result<()> {
        ids.check(self)?;
        let rows_needed = pairs.div_ceil(ids.xdiv);
        if a.kind != w.act() || a.kp != w.kp || rows_needed > a.rows {
            return Err(self.err(format!(
                "grouped expert product: {} weights ({} x {}, kp {}) with {:?} activations of \
                 {} x {} ({rows_needed} rows needed)",
                w.dtype, w.rows, w.cols, w.kp, a.kind, a.rows, a.kp
            )));
        }
        if pairs == 0 || w.rows == 0 {
            return Ok(());
        }
        let l = MOE_GROUPED_LAUNCH;
        let name = format!("mms_grouped_{}", w.dtype.name());
        let smem = self.smem_of(&l, w.dtype, &name)?;
        let f = self.variant("products", &l.defines())?;
        let func = f
            .get(&name)
            .ok_or_else(|| self.err(format!("kernel {name} missing")))?;
        let rows_per_block = l.smem_block().0;
        let blocks_x = self.u32_of(w.rows.div_ceil(rows_per_block), "row tiles")?;
        let threads = l.max_threads();
        for (b0, n) in pair_chunks(tile_bound(pairs, ids.n_experts)) {
            let args = product_grouped_args(self, w, a, ids, (order, offs), y, b0);
            self.launch_fn(func, &name, (blocks_x, n as u32), threads, smem, &args)?;
        }
        Ok(())
    }

    /// The v1 expert product over the stored layout: `y[p] = W[ids[p]] x[p / xdiv]` (f32 rows)
    /// for `pairs` pairs; `shape` = (rows, cols, bytes per row) of one expert.
    pub fn matmul_id(
        &self,
        dtype: DType,
        w: u64,
        shape: (usize, usize, usize),
        ids: &IdArgs,
        (x, y): (u64, u64),
        pairs: usize,
    ) -> Result<()> {
        ids.check(self)?;
        let (n, k, row_bytes) = shape;
        if !super::kernel_supports(dtype) {
            return Err(self.err(format!("no expert product kernel for {dtype}")));
        }
        if pairs == 0 || n == 0 {
            return Ok(());
        }
        let name = format!("matmul_id_{}", dtype.name());
        let blocks = self.u32_of(n.div_ceil(16), "matmul blocks")?;
        for (p0, cnt) in pair_chunks(pairs) {
            let args = [
                Arg::Ptr(w),
                Arg::U64(ids.stride as u64),
                Arg::Ptr(x),
                Arg::Ptr(ids.ids),
                Arg::U32(self.u32_of(ids.xdiv, "xdiv")?),
                Arg::U32(p0 as u32),
                Arg::U32(self.u32_of(ids.n_experts, "experts")?),
                Arg::Ptr(y),
                Arg::U32(self.u32_of(n, "N")?),
                Arg::U32(self.u32_of(k, "K")?),
                Arg::U64(row_bytes as u64),
            ];
            self.launch(&name, (blocks, cnt as u32), 256, &args)?;
        }
        Ok(())
    }
}

fn group_args(ids: u64, (order, offs): (u64, u64), pairs: u32, e: usize) -> [Arg; 6] {
    [
        Arg::Ptr(ids),
        Arg::Ptr(order),
        Arg::Ptr(offs),
        Arg::U32(pairs),
        Arg::U32(e as u32),
        Arg::U32(MOE_TILE as u32),
    ]
}

fn product_grouped_args(
    g: &Gpu,
    w: &PMat,
    a: &ActBuf,
    ids: &IdArgs,
    (order, offs): (u64, u64),
    y: u64,
    b0: usize,
) -> [Arg; 14] {
    [
        Arg::Ptr(g.ptr(&w.data)),
        Arg::U64(ids.stride as u64),
        Arg::Ptr(g.ptr(&a.values)),
        Arg::Ptr(g.ptr(&a.scales)),
        Arg::Ptr(order),
        Arg::Ptr(offs),
        Arg::U32(ids.xdiv as u32),
        Arg::U32(b0 as u32),
        Arg::U32(ids.n_experts as u32),
        Arg::Ptr(y),
        Arg::U32(w.rows as u32),
        Arg::U32(w.col_tiles as u32),
        Arg::U32(w.nseg),
        Arg::U32(w.kp as u32),
    ]
}

/// The arguments of `mmq_id_<type>`: pairs [p0, p0 + np) of `w` into `y`, and of the second
/// matrix (its data, its output) over the same pairs in blocks np.. (the first again for one).
fn product_id_args(
    g: &Gpu,
    w: &PMat,
    a: &ActBuf,
    ids: &IdArgs,
    (y, (w2, y2)): (u64, (u64, u64)),
    (p0, np): (usize, usize),
) -> [Arg; 16] {
    [
        Arg::Ptr(g.ptr(&w.data)),
        Arg::Ptr(w2),
        Arg::U64(ids.stride as u64),
        Arg::Ptr(g.ptr(&a.values)),
        Arg::Ptr(g.ptr(&a.scales)),
        Arg::Ptr(ids.ids),
        Arg::U32(ids.xdiv as u32),
        Arg::U32(p0 as u32),
        Arg::U32(np as u32),
        Arg::U32(ids.n_experts as u32),
        Arg::Ptr(y),
        Arg::Ptr(y2),
        Arg::U32(w.rows as u32),
        Arg::U32(w.col_tiles as u32),
        Arg::U32(w.nseg),
        Arg::U32(w.kp as u32),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::device::check_args;

    #[test]
    fn pair_chunks_cover_every_pair_once_within_the_grid() {
        for pairs in [0usize, 1, 7, 65534, 65535, 65536, 200_000] {
            let cs: Vec<_> = pair_chunks(pairs).collect();
            let mut next = 0;
            for &(p0, n) in &cs {
                assert_eq!(p0, next);
                assert!((1..=PAIRS_PER_LAUNCH).contains(&n));
                next += n;
            }
            assert_eq!(next, pairs);
        }
    }

    #[test]
    fn the_moe_kernels_take_the_launch_s_arguments() {
        for shared in [false, true] {
            let r = Route {
                e: 128,
                k: 8,
                norm: true,
                shared,
            };
            assert_eq!(check_args("moe_route", &r.route_args(1, (2, 3))), Ok(()));
        }
        let combine = [
            Arg::Ptr(1),
            Arg::Ptr(2),
            Arg::Ptr(3),
            Arg::Ptr(0),
            Arg::U32(1),
            Arg::U32(8),
            Arg::U32(64),
        ];
        assert_eq!(check_args("moe_combine", &combine), Ok(()));
        // product_id_args without a device: the same kinds in the same places.
        let id = [
            Arg::Ptr(1),
            Arg::Ptr(1),
            Arg::U64(4096),
            Arg::Ptr(2),
            Arg::Ptr(3),
            Arg::Ptr(4),
            Arg::U32(8),
            Arg::U32(0),
            Arg::U32(8),
            Arg::U32(128),
            Arg::Ptr(5),
            Arg::Ptr(6),
            Arg::U32(768),
            Arg::U32(32),
            Arg::U32(8),
            Arg::U32(2048),
        ];
        for t in memra_kernels::PRODUCT_TYPES {
            assert_eq!(check_args(&format!("mmq_id_{t}"), &id), Ok(()), "{t}");
        }
        let v1 = [
            Arg::Ptr(1),
            Arg::U64(4096),
            Arg::Ptr(2),
            Arg::Ptr(3),
            Arg::U32(8),
            Arg::U32(0),
            Arg::U32(128),
            Arg::Ptr(4),
            Arg::U32(768),
            Arg::U32(2048),
            Arg::U64(2176),
        ];
        for t in memra_kernels::WEIGHT_TYPES {
            assert_eq!(check_args(&format!("matmul_id_{t}"), &v1), Ok(()), "{t}");
        }
    }

    #[test]
    fn the_grouped_kernels_take_the_launch_s_arguments() {
        let args = group_args(1, (2, 3), 100, 128);
        assert_eq!(check_args("moe_group", &args), Ok(()));
        // product_grouped_args without a device: the same kinds in the same places.
        let grouped = [
            Arg::Ptr(1),
            Arg::U64(4096),
            Arg::Ptr(2),
            Arg::Ptr(3),
            Arg::Ptr(4),
            Arg::Ptr(5),
            Arg::U32(8),
            Arg::U32(0),
            Arg::U32(128),
            Arg::Ptr(6),
            Arg::U32(768),
            Arg::U32(32),
            Arg::U32(8),
            Arg::U32(2048),
        ];
        for t in memra_kernels::PRODUCT_TYPES {
            assert_eq!(
                check_args(&format!("mms_grouped_{t}"), &grouped),
                Ok(()),
                "{t}"
            );
        }
    }

    #[test]
    fn the_tile_bound_covers_every_distribution() {
        // Tiles of a count distribution: sum of ceil(c / MOE_TILE).
        let tiles = |c: &[usize]| c.iter().map(|&n| n.div_ceil(MOE_TILE)).sum::<usize>();
        let mut cases: Vec<(usize, Vec<usize>)> = vec![
            (1, vec![1, 0, 0]),
            (8, vec![MOE_TILE + 1; 8]),
            (128, vec![MOE_TILE - 1; 128]),
            (4, vec![5 * MOE_TILE + 3, 0, 1, 0]),
        ];
        // Every way of spreading 3 tiles + 2 pairs over 3 experts.
        let p = 3 * MOE_TILE + 2;
        for a in 0..=p {
            for b in 0..=p - a {
                cases.push((3, vec![a, b, p - a - b]));
            }
        }
        for (e, c) in cases {
            let pairs: usize = c.iter().sum();
            assert!(tiles(&c) <= tile_bound(pairs, e), "{c:?}");
        }
        assert_eq!(group_offsets_len(128), 258);
    }

    #[test]
    fn the_grouped_launch_is_compiled_at_load() {
        let p = super::super::profile::Profile::new("compute_90a", 132, 227 * 1024);
        assert!(p.all_launches().contains(&MOE_GROUPED_LAUNCH));
        const { assert!(MOE_GROUPED_LAUNCH.smem && !MOE_GROUPED_LAUNCH.wg) };
        assert_eq!(MOE_TILE, 16);
        // Two blocks an SM (mms_grouped's launch bounds) for every type it runs.
        for t in memra_kernels::PRODUCT_TYPES {
            let d: crate::quant::DType = t.parse().unwrap();
            let f = crate::quant::repack::tile_format(d).unwrap();
            assert!(
                2 * MOE_GROUPED_LAUNCH.smem_bytes(f.tile_bytes, f.kt) <= 227 * 1024,
                "{t}"
            );
        }
    }

    #[test]
    fn the_expert_launch_is_the_decode_variant_of_the_products() {
        // The variant the runner compiles before any capture (profile.launch at M <= 8).
        let p = super::super::profile::Profile::new("compute_90a", 132, 227 * 1024);
        assert_eq!(p.launch(1, DType::Q4_K, 768), ID_LAUNCH);
        assert!(ID_LAUNCH.max_threads() >= 32 * super::super::profile::MAX_NSEG);
    }
}
