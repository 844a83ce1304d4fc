//! The op interface on the device: each op is one kernel launch (or a few) on the one stream,
//! over the rows of the current step. The composite ops are overridden with the fused kernels:
//! RMSNorm / SwiGLU / attention also prepare the next product's activations, RoPE and the KV
//! write are one launch, and residual adds happen in the product.

use cudarc::driver::CudaSlice;

use super::mat::{Mat, Mats, Use};
use super::{AttnArgs, AttnPrep, CudaOps, DevAct, KvLayer, RopeKvArgs, RopePos, RopeTable, class};
use crate::backend::state::RING;
use crate::error::Result;
use crate::ops::rope::Rope;
use crate::ops::{
    Act, AttnParams, DeltaParams, Feature, Glu, KvId, MoeParams, Ops, Residual, RopeId, Rows,
    StateId,
};
use crate::quant::DType;
use crate::weights::Tensor;

impl CudaOps {
    /// The MoE FFN of [`Ops::moe`], added into `res` when given ([`Ops::moe_add`]).
    fn moe_into(
        &mut self,
        w: [&Mat; 3],
        (x, router): (Act, Act),
        out: Act,
        (res, routed, prepared, shared): (Option<Act>, bool, bool, bool),
        p: &MoeParams,
    ) -> Result<()> {
        let s = self
            .moe_acts
            .ok_or_else(|| self.gpu.err("moe: no expert stacks were uploaded"))?;
        let h = w[2].rows();
        // The scratch holds the largest call's pairs (a folded shared expert's layers take one
        // more a row than the others): ids, weights and order are blocks of `m s.k` values.
        let shapes_ok = s.k >= p.n_used
            && x.width == h
            && out.width == h
            && router.width == p.n_experts
            && s.gate.width >= p.n_used * w[0].rows()
            && s.y.width >= p.n_used * h;
        if !shapes_ok {
            return Err(self.gpu.err(format!(
                "moe: x {} / router {} / out {} wide, {} of {} experts, scratch for {} experts                  of {} / {}",
                x.width,
                router.width,
                out.width,
                p.n_used,
                p.n_experts,
                s.k,
                s.gate.width,
                s.y.width
            )));
        }
        let m = self.n(out);
        let route = self.ptr(s.route)?;
        let offs = self
            .moe_offs
            .as_ref()
            .map(|o| self.gpu.ptr(o))
            .ok_or_else(|| self.gpu.err("moe: no expert stacks were uploaded"))?;
        let bufs = super::moe::MoeBufs {
            x: self.ptr(x)?,
            router: self.ptr(router)?,
            out: self.ptr(out)?,
            ids: route,
            wts: route + (m * s.k * 4) as u64,
            gate: self.ptr(s.gate)?,
            up: self.ptr(s.up)?,
            y: self.ptr(s.y)?,
            order: route + (2 * m * s.k * 4) as u64,
            offs,
            res: res.map(|r| self.ptr(r)).transpose()?.unwrap_or(0),
            routed,
            prepared,
            shared,
        };
        self.products.moe(&self.gpu, w, &bufs, m, p)?;
        self.tick("moe");
        Ok(())
    }

    /// Uploads an expert stack of `e` experts for calls of `k` pairs a row, with the MoE
    /// scratch (grouped offsets and ticket, pair buffers) sized for the largest such call.
    fn experts_for(&mut self, parts: &[&Tensor], e: usize, k: usize) -> Result<Mat> {
        let (p, hidden) = self.moe_cfg.ok_or_else(|| {
            self.gpu
                .err("expert weights for a model without expert parameters")
        })?;
        let f = p.expert_ffn;
        let n = super::moe::moe_scratch_len(e);
        if self.moe_offs.as_ref().is_none_or(|o| o.len() < n) {
            self.moe_offs = Some(self.gpu.zeros::<u32>(n)?);
        }
        if self.moe_acts.is_none_or(|a| a.k < k) {
            let step = Rows::Step;
            self.moe_acts = Some(super::MoeActs {
                k,
                route: self.act("moe_route", 3 * k, step),
                gate: self.act("moe_gate", k * f, step),
                up: self.act("moe_up", k * f, step),
                y: self.act("moe_y", k * hidden, step),
            });
        }
        // The down stack ([E, hidden, f]) reads the (row, slot) pairs; gate and up the rows.
        let first = parts
            .first()
            .ok_or_else(|| self.gpu.err("an expert stack of no parts"))?;
        let pairs = (first.shape[1..] == [hidden, f]).then_some(k);
        self.products.upload_expert_parts(&self.gpu, parts, pairs)
    }

    /// [`Ops::norm_moe`]; with `shared`, the stacks' last expert and `p`'s last slot are a
    /// folded shared expert ([`Ops::norm_moe_shared`]: the routing gives every row that expert
    /// as its last slot, weighted by the sigmoid of the router's last logit).
    #[allow(clippy::too_many_arguments)]
    fn norm_moe_with(
        &mut self,
        (x, norm, eps, h): (Act, &CudaSlice<f32>, f32, Act),
        (router, logits): (&Mat, Act),
        w: [&Mat; 3],
        out: Act,
        (add, shared): (bool, bool),
        p: &MoeParams,
    ) -> Result<()> {
        let m = self.n(h);
        let stored = router
            .stored(&self.gpu)
            .filter(|_| router.dtype() == DType::F32);
        let fits = m <= 8 && m * x.width * 4 <= super::moe::NORM_ROUTE_SMEM;
        let (Some(rw), true, Some(offs)) = (stored, fits, self.moe_offs.as_ref()) else {
            self.norm_matmul(x, norm, eps, h, router, logits)?;
            if add {
                self.check_residual("norm_moe", x, out)?;
            }
            let res = add.then_some(x);
            return self.moe_into(w, (h, logits), out, (res, false, false, shared), p);
        };
        let s = self
            .moe_acts
            .ok_or_else(|| self.gpu.err("moe: no expert stacks were uploaded"))?;
        let shapes_ok = router.rows() == p.n_experts
            && router.cols() == x.width
            && h.width == x.width
            && logits.width == p.n_experts;
        if !shapes_ok {
            return Err(self.gpu.err(format!(
                "norm_moe: router {} x {} for {} experts over rows of {}",
                router.rows(),
                router.cols(),
                p.n_experts,
                x.width
            )));
        }
        if add {
            self.check_residual("norm_moe", x, out)?;
        }
        let g = &self.gpu;
        let ticket = g.ptr(offs) + (super::moe::group_offsets_len(p.n_experts) * 4) as u64;
        let route = self.ptr(s.route)?;
        let xnh = (self.ptr(x)?, g.ptr(norm), eps, self.ptr(h)?);
        let idw = (ticket, route, route + (m * s.k * 4) as u64);
        let prep = self.products.moe_prep_buf(g, [w[0], w[1]], x.width)?;
        let r = super::moe::Route::of(p, shared);
        g.moe_norm_route(xnh, rw, self.ptr(logits)?, idw, (m, x.width), prep, r)?;
        self.tick("norm/router");
        let prepared = prep.is_some();
        let res = add.then_some(x);
        self.moe_into(w, (h, logits), out, (res, true, prepared, shared), p)
    }

    /// That the residual `x` the MoE output `out` is added into has its rows and width (`op`
    /// names the op in the error).
    fn check_residual(&self, op: &str, x: Act, out: Act) -> Result<()> {
        if x.width != out.width || self.n(x) != self.n(out) {
            return Err(self.gpu.err(format!(
                "{op}: residual {} wide for an output of {}",
                x.width, out.width
            )));
        }
        Ok(())
    }

    /// RoPE and the KV write of [`Ops::rope_kv_write`], after the per-head q/k RMSNorms
    /// (q weights, k weights, eps) when `norm` is given, in one launch.
    fn rope_kv_into(
        &mut self,
        (q, k, v): (Act, Act, Act),
        norm: Option<(u64, u64, f32)>,
        table: RopeId,
        head_dim: usize,
        kv: KvId,
    ) -> Result<()> {
        let (cos, sin, rot) = self.rope_ptrs(table)?;
        let pos = self.rope_pos(table);
        let l = self.kv(kv)?;
        let g = &self.gpu;
        g.rope_kv(&RopeKvArgs {
            q: self.ptr(q)?,
            k: self.ptr(k)?,
            v: self.ptr(v)?,
            pos,
            cos,
            sin,
            k_cache: g.ptr(&l.k),
            v_cache: g.ptr(&l.v),
            slot: self.meta.slot,
            rows: self.n(q),
            n_heads: q.width / head_dim.max(1),
            n_kv_heads: k.width / head_dim.max(1),
            head_dim,
            rot,
            kv: self.kv_dtype,
            norm,
        })?;
        self.tick("rope/kv");
        Ok(())
    }

    /// The device address of `a`'s buffer.
    pub(super) fn ptr(&self, a: Act) -> Result<u64> {
        let d = &self.acts[a.id];
        d.buf.as_ref().map(|b| self.gpu.ptr(b)).ok_or_else(|| {
            self.gpu
                .err(format!("activation {} is not allocated", d.name))
        })
    }

    /// Rows of the current step in `a`'s class.
    pub(super) fn n(&self, a: Act) -> usize {
        self.rows[class(a.rows)]
    }

    fn kv(&self, kv: KvId) -> Result<&KvLayer> {
        self.kv
            .get(kv.0)
            .ok_or_else(|| self.gpu.err(format!("KV layer {} does not exist", kv.0)))
    }

    /// The cos and sin tables of `table` and its frequency count (pairs rotated per head).
    fn rope_ptrs(&self, table: RopeId) -> Result<(u64, u64, usize)> {
        let g = &self.gpu;
        let t = self
            .ropes
            .get(table.0)
            .ok_or_else(|| g.err(format!("RoPE table {} does not exist", table.0)))?;
        match (&t.cos, &t.sin) {
            (Some(c), Some(s)) => Ok((g.ptr(c), g.ptr(s), t.rope.half())),
            _ => Err(g.err("RoPE tables missing")),
        }
    }

    /// Where `table`'s launches read the rows' positions: a table with M-RoPE sections in a
    /// step with M-RoPE positions reads those (`*_mrope` kernels); otherwise every row's one
    /// position (a step without them: each row's three are its position, the same angles).
    fn rope_pos(&self, table: RopeId) -> RopePos {
        let sections = self.ropes.get(table.0).and_then(|t| t.rope.sections);
        match (sections, self.meta.pos3) {
            (Some(s), pos3) if pos3 != 0 => RopePos::M {
                pos3,
                sections: s.words(),
            },
            _ => RopePos::Plain(self.meta.pos),
        }
    }

    /// (buffer, columns) of each output.
    fn outs(&self, ys: &[Act]) -> Result<Vec<(u64, usize)>> {
        ys.iter().map(|&y| Ok((self.ptr(y)?, y.width))).collect()
    }

    /// Attention of `q` into `att` (prepared for `w` in the same launch when it can), then the
    /// product `W att` into `y`, or added into `res` (`y` then scratch for the v1 path).
    fn attention_product(
        &mut self,
        kv: KvId,
        (q, att): (Act, Act),
        p: &AttnParams,
        w: &Mat,
        (y, res): (u64, Option<u64>),
    ) -> Result<()> {
        let prepared = self.attention_with(kv, (q, att), p, Some(w))?;
        let (g, m, patt) = (&self.gpu, self.n(att), self.ptr(att)?);
        if !prepared {
            self.products.prep(g, patt, att.width, m, &[w])?;
        }
        self.tick("attention");
        self.products.matmul(g, w, (patt, y), res, m)?;
        self.tick("o");
        Ok(())
    }

    /// The gated activation of `gate`, `up` prepared for `down` (written back to `gate` where
    /// a reader needs the f32 values); returns `gate`'s buffer.
    fn glu_for(&mut self, kind: Glu, gate: Act, up: Act, down: &Mat) -> Result<u64> {
        if gate.width != up.width || gate.id == up.id {
            return Err(self
                .gpu
                .err(format!("glu: widths {} and {}", gate.width, up.width)));
        }
        let (g, m) = (&self.gpu, self.n(gate));
        let (pg, pu) = (self.ptr(gate)?, self.ptr(up)?);
        self.products
            .glu_for(kind, g, (pg, pu), m, gate.width, &[down])?;
        self.tick(if kind == Glu::Silu { "swiglu" } else { "geglu" });
        Ok(pg)
    }

    /// The rows of `o` and `x` when both are rows of the same width.
    fn same_rows(&self, o: Act, x: Act) -> Result<usize> {
        if o.width != x.width || o.id == x.id {
            return Err(self.gpu.err(format!(
                "post-norm add: {} values into a residual of {}",
                o.width, x.width
            )));
        }
        Ok(self.n(x))
    }

    /// The op profile's label of a fused product into `ys`.
    fn label(&self, ys: &[Act]) -> &'static str {
        match ys.first().map(|y| self.acts[y.id].name) {
            Some("q") => "qkv",
            Some("gate") => "gate/up",
            Some(n) => n,
            None => "products",
        }
    }

    /// Attention of `q` into `out`, preparing `out` for the product `w` in the same launch when
    /// it can; returns whether it did.
    fn attention_with(
        &self,
        kv: KvId,
        (q, out): (Act, Act),
        p: &AttnParams,
        w: Option<&Mat>,
    ) -> Result<bool> {
        let l = self.kv(kv)?;
        let g = &self.gpu;
        let (kc, vc) = (g.ptr(&l.k), g.ptr(&l.v));
        let (pq, po) = (self.ptr(q)?, self.ptr(out)?);
        let (m, qd, meta) = (self.n(out), q.width, &self.meta);
        let prep = match w {
            Some(w) => self.products.attn_prep(g, w, qd, p.head_dim)?,
            None => None,
        };
        // Split into launches of `chunk` rows to bound the score scratch (one partial per row
        // and head when the launch folds its splits in the kernel, else one per split; a
        // windowed launch never folds: it runs the split kernels, Gpu::attention).
        let fold = g.attn_folds(m, p.n_heads, p.n_kv_heads, p.head_dim, p.window);
        let part = if fold {
            super::attn_folded_floats(p.head_dim)
        } else {
            super::attn_part_floats(meta.ctx, p.head_dim)
        };
        let per_row = p.n_heads * part;
        let chunk = (self.scores.1 / per_row.max(1)).clamp(1, m.max(1));
        let mut r0 = 0;
        while r0 < m {
            let rows = chunk.min(m - r0);
            let a = AttnArgs {
                q: pq + (r0 * qd * 4) as u64,
                out: po + (r0 * qd * 4) as u64,
                k_cache: kc,
                v_cache: vc,
                kv: self.kv_dtype,
                pos: meta.pos + (r0 * 4) as u64,
                row_seq: meta.row_seq + (r0 * 4) as u64,
                table_off: meta.table_off,
                tables: meta.tables,
                scores: self.scores.0,
                ctx: meta.ctx,
                rows,
                n_heads: p.n_heads,
                n_kv_heads: p.n_kv_heads,
                head_dim: p.head_dim,
                block_size: self.block_size,
                scale: p.scale,
                prep: prep.map(|a| AttnPrep {
                    values: g.ptr(&a.values) + (r0 * a.kp * 2) as u64,
                    sums: g.ptr(&a.scales) + (r0 * (a.kp / 32) * 4) as u64,
                    kp: a.kp,
                    bf16: a.kind == super::products::ActKind::BF16,
                }),
                tile_tokens: 0,
                fold: Some(fold),
                stages: 0,
                grid_y: 0,
                window: p.window,
                spans: match (p.spans, meta.spans) {
                    (true, s) if s != 0 => s + (r0 * 8) as u64,
                    _ => 0,
                },
            };
            g.attention(&a)?;
            r0 += rows;
        }
        Ok(prep.is_some())
    }
}

impl Ops for CudaOps {
    type Mat = Mat;
    type Mats = Mats;
    type Vector = CudaSlice<f32>;

    fn mat(&mut self, t: &Tensor) -> Result<Mat> {
        self.products.upload_mat(&self.gpu, t, Use::Product)
    }

    fn mats(&mut self, ts: &[&Tensor]) -> Result<Mats> {
        self.products.upload_mats(&self.gpu, ts)
    }

    fn glu_mats(&mut self, gate: &Tensor, up: &Tensor) -> Result<Mats> {
        self.products.upload_glu(&self.gpu, gate, up)
    }

    fn table(&mut self, t: &Tensor, head: bool) -> Result<Mat> {
        let usage = if head { Use::Both } else { Use::Lookup };
        self.products.upload_mat(&self.gpu, t, usage)
    }

    fn experts(&mut self, t: &Tensor) -> Result<Mat> {
        let (p, _) = self.moe_cfg.ok_or_else(|| {
            self.gpu
                .err("expert weights for a model without expert parameters")
        })?;
        self.experts_for(&[t], p.n_experts, p.n_used)
    }

    fn fold_shared_expert(
        &mut self,
        router: &Tensor,
        stacks: [&Tensor; 3],
        shared: [&Tensor; 3],
        gate: &Tensor,
        p: &MoeParams,
    ) -> Result<Option<[Mat; 4]>> {
        let alike = stacks
            .iter()
            .zip(&shared)
            .all(|(s, e)| s.dtype == e.dtype && s.shape.len() == 3 && s.shape[1..] == e.shape[..]);
        let (e, k) = (p.n_experts + 1, p.n_used + 1);
        let fits = e <= memra_kernels::MOE_MAX_EXPERTS && k <= memra_kernels::MOE_MAX_USED;
        let hidden = router.shape.last().copied().unwrap_or(0);
        if !alike || !fits || router.shape != [p.n_experts, hidden] || gate.numel() != hidden {
            return Ok(None);
        }
        // The router in f32 (the fused decode router reads f32 rows), the gate as row E.
        let mut rows = router.to_f32()?;
        rows.extend(gate.to_f32()?);
        let r = Tensor::from_f32(router.name.clone(), vec![e, hidden], &rows)?;
        let router = self.mat(&r)?;
        // The shared expert after the routed ones, in the same device buffer.
        Ok(Some([
            router,
            self.experts_for(&[stacks[0], shared[0]], e, k)?,
            self.experts_for(&[stacks[1], shared[1]], e, k)?,
            self.experts_for(&[stacks[2], shared[2]], e, k)?,
        ]))
    }

    fn vector(&mut self, t: &Tensor) -> Result<CudaSlice<f32>> {
        self.gpu.upload(&t.to_f32()?)
    }

    fn act(&mut self, name: &'static str, width: usize, rows: Rows) -> Act {
        self.acts.push(DevAct {
            name,
            width,
            rows,
            buf: None,
        });
        // New activations are allocated by the next `reserve` of their class.
        self.cap[class(rows)] = 0;
        Act {
            id: self.acts.len() - 1,
            width,
            rows,
        }
    }

    fn rope_table(&mut self, rope: Rope) -> Result<RopeId> {
        self.ropes.push(RopeTable {
            rope,
            cos: None,
            sin: None,
        });
        self.rope_len = 0;
        Ok(RopeId(self.ropes.len() - 1))
    }

    fn kv_layer(&mut self, width: usize) -> Result<KvId> {
        self.kv_dtype.check_width(width)?;
        let row = self.kv_dtype.row_bytes(width);
        let len = (self.kv_blocks + 1) * self.block_size * row;
        let k = self.gpu.zeros(len)?;
        let v = self.gpu.zeros(len)?;
        self.kv.push(KvLayer { k, v, width, row });
        Ok(KvId(self.kv.len() - 1))
    }

    fn embed(&mut self, table: &Mat, out: Act) -> Result<()> {
        self.tick("start");
        let (tokens, y) = (self.meta.tokens, self.ptr(out)?);
        self.products
            .embed(&self.gpu, table, tokens, y, self.n(out))?;
        self.tick("embed");
        Ok(())
    }

    fn hidden_in(&mut self, out: Act) -> Result<()> {
        self.copy_hidden_in(out)
    }

    fn inject(&mut self, x: Act) -> Result<()> {
        self.inject_rows(x, 0)
    }

    fn inject_add(&mut self, x: Act, part: usize, tmp: Act) -> Result<()> {
        self.inject_add_rows(x, part, tmp)
    }

    fn matmul(&mut self, w: &Mat, x: Act, y: Act) -> Result<()> {
        let (g, m) = (&self.gpu, self.n(y));
        let (px, py) = (self.ptr(x)?, self.ptr(y)?);
        self.products.prep(g, px, x.width, m, &[w])?;
        self.products.matmul(g, w, (px, py), None, m)
    }

    fn matmuls(&mut self, w: &Mats, x: Act, ys: &[Act]) -> Result<()> {
        let m = ys.first().map_or(0, |&y| self.n(y));
        let (g, px, outs) = (&self.gpu, self.ptr(x)?, self.outs(ys)?);
        self.products.prep_mats(g, px, x.width, m, w)?;
        self.products.matmuls(g, w, px, &outs, m)
    }

    fn rms_norm(
        &mut self,
        x: Act,
        w: &CudaSlice<f32>,
        y: Act,
        group: usize,
        eps: f32,
    ) -> Result<()> {
        if group == 0 || !x.width.is_multiple_of(group) || x.width != y.width {
            return Err(self.gpu.err(format!(
                "rms_norm: width {} -> {}, group {group}",
                x.width, y.width
            )));
        }
        let g = &self.gpu;
        let rows = self.n(y) * (x.width / group);
        g.rms_norm(self.ptr(x)?, g.ptr(w), self.ptr(y)?, rows, group, eps)
    }

    fn add(&mut self, x: Act, y: Act) -> Result<()> {
        let n = self.n(x) * x.width;
        self.gpu.add_in_place(self.ptr(x)?, self.ptr(y)?, n)
    }

    fn require(&self, arch: &str, needs: &[Feature]) -> Result<()> {
        match needs.iter().find(|f| !gpu_has(**f)) {
            Some(f) => Err(self
                .gpu
                .err(format!("{arch} is not yet supported on the GPU: {f}"))),
            None => Ok(()),
        }
    }

    fn scale(&mut self, x: Act, s: f32) -> Result<()> {
        let n = self.n(x) * x.width;
        self.gpu.scale(self.ptr(x)?, s, n)
    }

    fn softcap(&mut self, x: Act, cap: f32) -> Result<()> {
        let n = self.n(x) * x.width;
        self.gpu.softcap(self.ptr(x)?, cap, n)
    }

    fn moe(&mut self, w: [&Mat; 3], x: Act, router: Act, out: Act, p: &MoeParams) -> Result<()> {
        self.moe_into(w, (x, router), out, (None, false, false, false), p)
    }

    fn moe_add(
        &mut self,
        w: [&Mat; 3],
        (h, router): (Act, Act),
        out: Act,
        x: Act,
        p: &MoeParams,
    ) -> Result<()> {
        self.check_residual("moe_add", x, out)?;
        self.moe_into(w, (h, router), out, (Some(x), false, false, false), p)
    }

    fn norm_moe(
        &mut self,
        xn: (Act, &CudaSlice<f32>, f32, Act),
        router: (&Mat, Act),
        w: [&Mat; 3],
        out: Act,
        add: bool,
        p: &MoeParams,
    ) -> Result<()> {
        self.norm_moe_with(xn, router, w, out, (add, false), p)
    }

    fn norm_moe_shared(
        &mut self,
        xn: (Act, &CudaSlice<f32>, f32, Act),
        [router, g, u, d]: &[Mat; 4],
        logits: Act,
        out: Act,
        p: &MoeParams,
    ) -> Result<()> {
        let folded = MoeParams {
            n_experts: p.n_experts + 1,
            n_used: p.n_used + 1,
            ..*p
        };
        self.norm_moe_with(xn, (router, logits), [g, u, d], out, (true, true), &folded)
    }

    fn qk_norm_rope_kv_write(
        &mut self,
        (q, k, v): (Act, Act, Act),
        [qn, kn]: [&CudaSlice<f32>; 2],
        eps: f32,
        table: RopeId,
        head_dim: usize,
        kv: KvId,
    ) -> Result<()> {
        let norm = (self.gpu.ptr(qn), self.gpu.ptr(kn), eps);
        self.rope_kv_into((q, k, v), Some(norm), table, head_dim, kv)
    }

    fn add_bias(&mut self, x: Act, b: &CudaSlice<f32>) -> Result<()> {
        let g = &self.gpu;
        g.add_bias(self.ptr(x)?, g.ptr(b), self.n(x), x.width)
    }

    fn glu(&mut self, kind: Glu, gate: Act, up: Act) -> Result<()> {
        if gate.width != up.width || gate.id == up.id {
            return Err(self
                .gpu
                .err(format!("glu: widths {} and {}", gate.width, up.width)));
        }
        let n = self.n(gate) * gate.width;
        let (pg, pu) = (self.ptr(gate)?, self.ptr(up)?);
        match kind {
            Glu::Silu => self.gpu.swiglu(pg, pu, n),
            Glu::GeluTanh => self.gpu.geglu_tanh(pg, pu, n),
        }
    }

    fn rope(&mut self, x: Act, table: RopeId, head_dim: usize) -> Result<()> {
        let (cos, sin, half) = self.rope_ptrs(table)?;
        let heads = x.width / head_dim.max(1);
        let (g, pos) = (&self.gpu, self.rope_pos(table));
        g.rope(
            self.ptr(x)?,
            pos,
            (cos, sin, half),
            self.n(x),
            heads,
            head_dim,
        )
    }

    fn kv_write(&mut self, kv: KvId, k: Act, v: Act) -> Result<()> {
        let l = self.kv(kv)?;
        let g = &self.gpu;
        let (kc, vc) = (g.ptr(&l.k), g.ptr(&l.v));
        let (pk, pv) = (self.ptr(k)?, self.ptr(v)?);
        let (slot, rows) = (self.meta.slot, self.n(k));
        g.kv_write(self.kv_dtype, (kc, vc), (pk, pv), slot, rows, l.width)
    }

    fn attention(&mut self, kv: KvId, q: Act, out: Act, p: &AttnParams) -> Result<()> {
        self.attention_with(kv, (q, out), p, None).map(|_| ())
    }

    fn state_layer(&mut self, p: &DeltaParams) -> Result<StateId> {
        self.new_state_layer(p)
    }

    fn sigmoid_mul(&mut self, x: Act, g: Act) -> Result<()> {
        let (px, pg) = (self.ptr(x)?, self.ptr(g)?);
        self.gpu.sigmoid_mul(px, pg, self.n(x), x.width, g.width)
    }

    fn conv1d_silu(&mut self, st: StateId, w: &CudaSlice<f32>, x: Act, out: Act) -> Result<()> {
        self.conv1d_silu_launch(st, w, (x, out))?;
        self.tick("conv1d");
        Ok(())
    }

    fn gated_delta(
        &mut self,
        st: StateId,
        qkv: Act,
        ba: Act,
        coef: [&CudaSlice<f32>; 2],
        out: Act,
    ) -> Result<()> {
        self.gated_delta_launch(st, (qkv, ba), coef, out, None)?;
        self.tick("gated_delta");
        Ok(())
    }

    /// Steps of at most [`RING`] rows (decode and verify): the conv inside the
    /// delta kernel (one launch fewer a layer, the same bits); longer steps: the two ops.
    fn conv_gated_delta(
        &mut self,
        st: StateId,
        (w, x, qkv): (&CudaSlice<f32>, Act, Act),
        ba: Act,
        coef: [&CudaSlice<f32>; 2],
        out: Act,
    ) -> Result<()> {
        if self.n(x) > RING {
            self.conv1d_silu(st, w, x, qkv)?;
            return self.gated_delta(st, qkv, ba, coef, out);
        }
        self.gated_delta_launch(st, (qkv, ba), coef, out, Some((w, x)))?;
        self.tick("conv+delta");
        Ok(())
    }

    // ---- fused composites ----

    fn norm_matmuls(
        &mut self,
        x: Act,
        norm: &CudaSlice<f32>,
        eps: f32,
        h: Act,
        w: &Mats,
        ys: &[Act],
    ) -> Result<()> {
        let m = self.n(h);
        let g = &self.gpu;
        let xwy = (self.ptr(x)?, g.ptr(norm), self.ptr(h)?);
        self.products.norm_for_mats(g, xwy, m, x.width, eps, w)?;
        self.tick("norm");
        let outs = self.outs(ys)?;
        self.products.matmuls(g, w, xwy.2, &outs, m)?;
        self.tick(self.label(ys));
        Ok(())
    }

    fn norm_matmul(
        &mut self,
        x: Act,
        norm: &CudaSlice<f32>,
        eps: f32,
        h: Act,
        w: &Mat,
        y: Act,
    ) -> Result<()> {
        let m = self.n(h);
        let g = &self.gpu;
        let xwy = (self.ptr(x)?, g.ptr(norm), self.ptr(h)?);
        self.products.norm_for(g, xwy, m, x.width, eps, &[w])?;
        self.products.matmul(g, w, (xwy.2, self.ptr(y)?), None, m)?;
        self.tick("head");
        Ok(())
    }

    fn matmul_add(&mut self, w: &Mat, x: Act, r: Residual) -> Result<()> {
        let (g, m) = (&self.gpu, self.n(r.res));
        let px = self.ptr(x)?;
        self.products.prep(g, px, x.width, m, &[w])?;
        let (tmp, res) = (self.ptr(r.tmp)?, self.ptr(r.res)?);
        self.products.matmul(g, w, (px, tmp), Some(res), m)
    }

    fn rope_kv_write(
        &mut self,
        q: Act,
        k: Act,
        v: Act,
        table: RopeId,
        head_dim: usize,
        kv: KvId,
    ) -> Result<()> {
        self.rope_kv_into((q, k, v), None, table, head_dim, kv)
    }

    fn attention_matmul_add(
        &mut self,
        kv: KvId,
        q: Act,
        att: Act,
        p: &AttnParams,
        w: &Mat,
        r: Residual,
    ) -> Result<()> {
        let out = (self.ptr(r.tmp)?, Some(self.ptr(r.res)?));
        self.attention_product(kv, (q, att), p, w, out)
    }

    fn norm_glu_ffn(
        &mut self,
        (x, norm, eps, h): (Act, &CudaSlice<f32>, f32, Act),
        gate_up: &Mats,
        kind: Glu,
        (gate, up): (Act, Act),
        down: &Mat,
        r: Residual,
    ) -> Result<()> {
        let m = self.n(h);
        if kind != Glu::Silu || !self.products.glu_fuses(gate_up, down, m) {
            self.norm_matmuls(x, norm, eps, h, gate_up, &[gate, up])?;
            return self.glu_matmul_add(kind, gate, up, down, r);
        }
        // SwiGLU in the gate/up product's epilogue, prepared for down (same bits).
        let g = &self.gpu;
        let xwy = (self.ptr(x)?, g.ptr(norm), self.ptr(h)?);
        self.products
            .norm_for_mats(g, xwy, m, x.width, eps, gate_up)?;
        self.tick("norm");
        self.products.glu_product(g, gate_up, down, m)?;
        self.tick("gate/up+swiglu");
        let (tmp, res) = (self.ptr(r.tmp)?, self.ptr(r.res)?);
        self.products
            .matmul(g, down, (self.ptr(gate)?, tmp), Some(res), m)?;
        self.tick("down");
        Ok(())
    }

    fn glu_matmul_add(
        &mut self,
        kind: Glu,
        gate: Act,
        up: Act,
        down: &Mat,
        r: Residual,
    ) -> Result<()> {
        let pg = self.glu_for(kind, gate, up, down)?;
        let (g, m) = (&self.gpu, self.n(gate));
        let (tmp, res) = (self.ptr(r.tmp)?, self.ptr(r.res)?);
        self.products.matmul(g, down, (pg, tmp), Some(res), m)?;
        self.tick("down");
        Ok(())
    }

    fn norm_gate_matmul_add(
        &mut self,
        (c, norm, group, eps): (Act, &CudaSlice<f32>, usize, f32),
        gate: Act,
        w: &Mat,
        r: Residual,
    ) -> Result<()> {
        let width = c.width;
        if gate.width != width || gate.id == c.id || group == 0 || !width.is_multiple_of(group) {
            return Err(self.gpu.err(format!(
                "gated norm: widths {width} and {}, group {group}",
                gate.width
            )));
        }
        let (g, m) = (&self.gpu, self.n(gate));
        let (pc, pz) = (self.ptr(c)?, self.ptr(gate)?);
        self.products
            .norm_gate_for(g, (pc, g.ptr(norm), pz), m, width, group, eps, w)?;
        self.tick("gated norm");
        let (tmp, res) = (self.ptr(r.tmp)?, self.ptr(r.res)?);
        self.products.matmul(g, w, (pz, tmp), Some(res), m)?;
        self.tick("out");
        Ok(())
    }

    fn gated_add(&mut self, (s, gates): (Act, Act), o: Act, x: Act) -> Result<()> {
        let m = self.same_rows(o, x)?;
        if s.width != x.width || self.n(s) != m || self.n(gates) != m {
            return Err(self.gpu.err(format!(
                "gated add: {} values into a residual of {}",
                s.width, x.width
            )));
        }
        let (px, po) = (self.ptr(x)?, self.ptr(o)?);
        let (ps, pg) = (self.ptr(s)?, self.ptr(gates)?);
        self.gpu
            .gated_add((px, po), (ps, pg), m, x.width, gates.width)
    }

    fn glu_matmul(&mut self, kind: Glu, gate: Act, up: Act, down: &Mat, y: Act) -> Result<()> {
        let pg = self.glu_for(kind, gate, up, down)?;
        let (g, m) = (&self.gpu, self.n(gate));
        self.products.matmul(g, down, (pg, self.ptr(y)?), None, m)?;
        self.tick("down");
        Ok(())
    }

    fn attention_matmul(
        &mut self,
        kv: KvId,
        q: Act,
        att: Act,
        p: &AttnParams,
        w: &Mat,
        y: Act,
    ) -> Result<()> {
        let out = (self.ptr(y)?, None);
        self.attention_product(kv, (q, att), p, w, out)
    }

    fn post_norm_add(&mut self, o: Act, post: &CudaSlice<f32>, eps: f32, x: Act) -> Result<()> {
        let m = self.same_rows(o, x)?;
        let g = &self.gpu;
        let post = (self.ptr(o)?, g.ptr(post), eps);
        self.products
            .add_norm_for(g, post, self.ptr(x)?, None, m, x.width)?;
        self.tick("post-norm");
        Ok(())
    }

    fn post_norm_add_norm_matmuls(
        &mut self,
        (o, post, post_eps): (Act, &CudaSlice<f32>, f32),
        x: Act,
        (norm, eps, h): (&CudaSlice<f32>, f32, Act),
        w: &Mats,
        ys: &[Act],
    ) -> Result<()> {
        let m = self.same_rows(o, x)?;
        if h.width != x.width {
            return Err(self
                .gpu
                .err(format!("norm of {} values into {}", x.width, h.width)));
        }
        let g = &self.gpu;
        let post = (self.ptr(o)?, g.ptr(post), post_eps);
        let list = w.list();
        let next = (g.ptr(norm), eps, self.ptr(h)?, &list[..]);
        self.products
            .add_norm_for(g, post, self.ptr(x)?, Some(next), m, x.width)?;
        self.tick("norm");
        let outs = self.outs(ys)?;
        self.products.matmuls(g, w, self.ptr(h)?, &outs, m)?;
        self.tick(self.label(ys));
        Ok(())
    }
}

/// Whether the CUDA backend has `f`'s kernels: every feature (the mixture-of-experts FFN runs
/// on the device, moe.rs; the MTP forward's hidden input, hidden.rs; gated DeltaNet, delta.rs). Sliding windows run on the
/// tensor-core attention where it has a kernel, else the CUDA-core split one
/// (`attn_mma_eligible`).
fn gpu_has(f: Feature) -> bool {
    match f {
        Feature::GeluTanh
        | Feature::SlidingWindow
        | Feature::Scale
        | Feature::Softcap
        | Feature::Moe
        | Feature::Mtp
        | Feature::Recurrent => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_has_every_feature() {
        let all = [
            Feature::GeluTanh,
            Feature::SlidingWindow,
            Feature::Scale,
            Feature::Softcap,
            Feature::Moe,
            Feature::Mtp,
            Feature::Recurrent,
        ];
        assert!(all.iter().all(|&f| gpu_has(f)));
    }
}
