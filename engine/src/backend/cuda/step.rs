//! One step on the device: upload the rows' metadata, run the layers, read back the logits.
//! The same sequence of kernels as the CPU backend's `layer` (backend/cpu/mod.rs).

use cudarc::driver::CudaSlice;

use super::products::ActKind;
use super::{AttnArgs, CudaBackend, Mat};
use crate::backend::{StepBatch, StepOutput};
use crate::error::{Error, Result};

/// Scratch buffers, by index: per-row widths are given by `widths`.
pub(super) const X: usize = 0;
const H: usize = 1;
const Q: usize = 2;
const K: usize = 3;
const V: usize = 4;
const ATT: usize = 5;
const O: usize = 6;
const G: usize = 7;
const U: usize = 8;

/// Bound on the attention score scratch of one launch (floats); launches are split by rows.
pub(super) const SCORE_FLOATS: usize = 64 << 20;

/// Row metadata on the device (addresses of u32 arrays).
pub(super) struct Meta {
    pub tokens: u64,
    pub pos: u64,
    pub row_seq: u64,
    pub slot: u64,
    pub table_off: u64,
    pub tables: u64,
    /// Floats of attention scores per (row, head): at least the largest `pos + 1`.
    pub ctx: usize,
}

/// Owned metadata buffers of a plain (non-graph) step.
struct MetaBufs {
    bufs: Vec<CudaSlice<u32>>,
    ctx: usize,
}

impl MetaBufs {
    fn meta(&self, g: &super::Gpu) -> Meta {
        let p = |i: usize| self.bufs.get(i).map(|b| g.ptr(b)).unwrap_or(0);
        Meta {
            tokens: p(0),
            pos: p(1),
            row_seq: p(2),
            slot: p(3),
            table_off: p(4),
            tables: p(5),
            ctx: self.ctx,
        }
    }
}

/// Logits a forward pass left on the device: `rows[i]` is the buffer row of the i-th row that
/// wanted logits; the buffer is `owned`, or the graph state's when `None`.
#[derive(Default)]
pub(super) struct Fwd {
    pub owned: Option<CudaSlice<f32>>,
    pub rows: Vec<usize>,
}

pub(super) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Input(format!("{what} {v} exceeds u32")))
}

impl CudaBackend {
    pub(super) fn widths(&self) -> [usize; 9] {
        let c = &self.config;
        let (qd, kvd) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        [c.hidden, c.hidden, qd, kvd, kvd, qd, c.hidden, c.ffn, c.ffn]
    }

    pub(super) fn ensure_scratch(&mut self, rows: usize) -> Result<()> {
        if rows <= self.scratch.rows {
            return Ok(());
        }
        let cap = rows.next_power_of_two();
        self.scratch.bufs.clear();
        self.scratch.acts.clear();
        self.gpu.sync()?;
        for w in self.widths() {
            let b = self.gpu.zeros::<f32>(cap * w)?;
            self.scratch.bufs.push(b);
        }
        // Prepared activations for every (kind, K) a packed matrix reads.
        let mut need: Vec<(ActKind, usize, usize)> = Vec::new();
        for m in self.mats() {
            if let Some(p) = &m.packed {
                let key = (p.act(), m.cols, p.kp);
                if !need.contains(&key) {
                    need.push(key);
                }
            }
        }
        for (kind, k, kp) in need {
            let a = self.gpu.act_buf(kind, cap, kp)?;
            self.scratch.acts.push((kind, k, a));
        }
        self.scratch.rows = cap;
        self.layout_epoch += 1;
        Ok(())
    }

    fn check_batch(&self, batch: &StepBatch) -> Result<()> {
        let c = &self.config;
        for (i, r) in batch.rows.iter().enumerate() {
            if r.token as usize >= c.vocab {
                return Err(Error::Input(format!(
                    "token id {} is outside the vocabulary (size {})",
                    r.token, c.vocab
                )));
            }
            let table = batch.block_tables.get(r.seq).ok_or_else(|| {
                self.gpu
                    .err(format!("row {i}: sequence {} has no block table", r.seq))
            })?;
            let need = r.pos as usize / self.block_size;
            let used = table.get(..=need).ok_or_else(|| {
                self.gpu.err(format!(
                    "row {i}: position {} is beyond its block table",
                    r.pos
                ))
            })?;
            if let Some(b) = used.iter().find(|&&b| b as usize >= self.kv_blocks) {
                return Err(self
                    .gpu
                    .err(format!("row {i}: KV block {b} does not exist")));
            }
        }
        Ok(())
    }

    fn upload_meta(&self, batch: &StepBatch) -> Result<MetaBufs> {
        let bs = self.block_size;
        let mut tokens = Vec::with_capacity(batch.rows.len());
        let mut pos = Vec::with_capacity(batch.rows.len());
        let mut row_seq = Vec::with_capacity(batch.rows.len());
        let mut slot = Vec::with_capacity(batch.rows.len());
        let mut ctx = 0usize;
        for r in &batch.rows {
            let p = r.pos as usize;
            // check_batch ran: the table and block exist.
            let block = batch.block_tables[r.seq][p / bs] as usize;
            tokens.push(r.token);
            pos.push(r.pos);
            row_seq.push(u32_of(r.seq, "sequence index")?);
            slot.push(u32_of(block * bs + p % bs, "KV position index")?);
            ctx = ctx.max(p + 1);
        }
        let mut table_off = Vec::with_capacity(batch.block_tables.len());
        let mut tables = Vec::new();
        for t in &batch.block_tables {
            table_off.push(u32_of(tables.len(), "block table offset")?);
            tables.extend_from_slice(t);
        }
        let g = &self.gpu;
        if tables.is_empty() {
            tables.push(0);
        }
        let mut bufs = Vec::with_capacity(6);
        for v in [&tokens, &pos, &row_seq, &slot, &table_off, &tables] {
            bufs.push(g.upload(v)?);
        }
        Ok(MetaBufs { bufs, ctx })
    }

    /// Marks the end of op `label` for the op profile (plain steps only).
    fn tick(&self, label: &'static str) {
        if let Some(p) = self.prof.as_ref().filter(|_| !self.graphs_on) {
            p.tick(&self.gpu, label);
        }
    }

    /// Every weight matrix of the model.
    fn mats(&self) -> Vec<&Mat> {
        let mut v: Vec<&Mat> = vec![&self.embed];
        v.extend(self.output.as_ref());
        for l in &self.layers {
            v.extend([&l.q, &l.k, &l.v, &l.attn_out, &l.gate, &l.up, &l.down]);
            v.extend(l.qkv.iter().chain(l.gateup.iter()));
        }
        v
    }

    /// Prepares `m` rows of `k` f32 values at `x` for every packed matrix of `ws` (once per
    /// activation kind).
    pub(super) fn prep(&self, x: u64, k: usize, m: usize, ws: &[&Mat]) -> Result<()> {
        let mut done: Vec<ActKind> = Vec::new();
        for w in ws {
            let Some(p) = &w.packed else { continue };
            let kind = p.act();
            if done.contains(&kind) {
                continue;
            }
            let a = self.act(kind, k)?;
            self.gpu.prepare(x, a, m, k)?;
            done.push(kind);
        }
        Ok(())
    }

    /// RMSNorm of `m` rows of `x` into `y` (f32), prepared for the packed matrices of `ws` in
    /// the same pass when there are any.
    #[allow(clippy::too_many_arguments)]
    fn norm_for(&self, x: u64, w: u64, y: u64, m: usize, ws: &[&Mat]) -> Result<()> {
        let c = &self.config;
        let g = &self.gpu;
        let kinds = Self::kinds(ws);
        let Some(&first) = kinds.first() else {
            return g.rms_norm(x, w, y, m, c.hidden, c.rms_eps);
        };
        g.norm_prep(
            x,
            w,
            Some(y),
            self.act(first, c.hidden)?,
            m,
            c.hidden,
            c.rms_eps,
        )?;
        for &k in &kinds[1..] {
            g.prepare(y, self.act(k, c.hidden)?, m, c.hidden)?;
        }
        Ok(())
    }

    /// SwiGLU of `m` rows in place in `gate` (`up`), prepared for the packed matrices of `ws`.
    fn swiglu_for(&self, gate: u64, up: u64, m: usize, ws: &[&Mat]) -> Result<()> {
        let ffn = self.config.ffn;
        let g = &self.gpu;
        let kinds = Self::kinds(ws);
        let Some(&first) = kinds.first() else {
            return g.swiglu(gate, up, m * ffn);
        };
        g.swiglu_prep(gate, up, Some(gate), self.act(first, ffn)?, m, ffn)?;
        for &k in &kinds[1..] {
            g.prepare(gate, self.act(k, ffn)?, m, ffn)?;
        }
        Ok(())
    }

    /// The distinct activation kinds the packed matrices of `ws` read.
    fn kinds(ws: &[&Mat]) -> Vec<ActKind> {
        let mut v = Vec::new();
        for w in ws {
            if let Some(p) = &w.packed
                && !v.contains(&p.act())
            {
                v.push(p.act());
            }
        }
        v
    }

    fn act(&self, kind: ActKind, k: usize) -> Result<&super::products::ActBuf> {
        self.scratch
            .acts
            .iter()
            .find(|(kk, kc, _)| *kk == kind && *kc == k)
            .map(|(_, _, a)| a)
            .ok_or_else(|| {
                self.gpu
                    .err(format!("no {kind:?} activation buffer for K = {k}"))
            })
    }

    /// `y = W x` for `m` rows (`x`: f32 rows of `w.cols`, already prepared by [`Self::prep`]
    /// for a packed `w`); with `res`, `res += W x` instead (`y` is then scratch for the v1
    /// path).
    pub(super) fn mm(&self, w: &Mat, x: u64, y: u64, res: Option<u64>, m: usize) -> Result<()> {
        let g = &self.gpu;
        if let Some(p) = &w.packed {
            let a = self.act(p.act(), w.cols)?;
            let launch = self.profile.launch(m, w.dtype);
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

    fn layer(&self, l: usize, m: usize, meta: &Meta, scores: &CudaSlice<f32>) -> Result<()> {
        self.attn_block(l, m, meta, scores)?;
        self.ffn_block(l, m)
    }

    /// `y = W x` into column ranges of several buffers (a fused matrix; packed only).
    fn mm_split(&self, w: &Mat, outs: &[(u64, usize)], m: usize) -> Result<()> {
        let g = &self.gpu;
        let p = w
            .packed
            .as_ref()
            .ok_or_else(|| g.err("fused weight matrix is not packed"))?;
        let a = self.act(p.act(), w.cols)?;
        g.product_to(p, a, outs, None, m, self.profile.launch(m, w.dtype))
    }

    /// Norm, Q/K/V, RoPE and the KV write, attention and the output projection (residual added).
    fn attn_block(&self, l: usize, m: usize, meta: &Meta, scores: &CudaSlice<f32>) -> Result<()> {
        let c = &self.config;
        let g = &self.gpu;
        let lw = &self.layers[l];
        let p: Vec<u64> = self.scratch.bufs.iter().map(|b| g.ptr(b)).collect();
        let (hd, eps) = (c.head_dim, c.rms_eps);
        let (qd, kvd) = (c.n_heads * hd, c.n_kv_heads * hd);
        let qkv: Vec<&Mat> = match &lw.qkv {
            Some(f) => vec![f],
            None => vec![&lw.q, &lw.k, &lw.v],
        };
        self.norm_for(p[X], g.ptr(&lw.attn_norm), p[H], m, &qkv)?;
        self.tick("norm");
        match &lw.qkv {
            Some(f) => self.mm_split(f, &[(p[Q], qd), (p[K], kvd), (p[V], kvd)], m)?,
            None => {
                self.mm(&lw.q, p[H], p[Q], None, m)?;
                self.mm(&lw.k, p[H], p[K], None, m)?;
                self.mm(&lw.v, p[H], p[V], None, m)?;
            }
        }
        self.tick("qkv");
        for (bias, buf, width) in [
            (&lw.q_bias, p[Q], qd),
            (&lw.k_bias, p[K], kvd),
            (&lw.v_bias, p[V], kvd),
        ] {
            if let Some(b) = bias {
                g.add_bias(buf, g.ptr(b), m, width)?;
            }
        }
        if let Some(w) = &lw.q_norm {
            g.rms_norm(p[Q], g.ptr(w), p[Q], m * c.n_heads, hd, eps)?;
        }
        if let Some(w) = &lw.k_norm {
            g.rms_norm(p[K], g.ptr(w), p[K], m * c.n_kv_heads, hd, eps)?;
        }
        let (cos, sin) = match (&self.rope_cos, &self.rope_sin) {
            (Some(cs), Some(sn)) => (g.ptr(cs), g.ptr(sn)),
            _ => return Err(g.err("RoPE tables missing")),
        };
        let (kc, vc) = (g.ptr(&lw.k_cache), g.ptr(&lw.v_cache));
        g.rope_kv(&super::RopeKvArgs {
            q: p[Q],
            k: p[K],
            v: p[V],
            pos: meta.pos,
            cos,
            sin,
            k_cache: kc,
            v_cache: vc,
            slot: meta.slot,
            rows: m,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
        })?;
        self.tick("rope/kv");
        // The output projection's preparation fused into attention when it can be.
        let prep = match &lw.attn_out.packed {
            Some(pm) if hd.is_multiple_of(32) => Some(self.act(pm.act(), qd)?),
            _ => None,
        };
        // Attention, split into launches of `chunk` rows to bound the score scratch.
        let per_row = c.n_heads * super::attn_part_floats(meta.ctx, hd);
        let chunk = (scores.len() / per_row.max(1)).clamp(1, m);
        let mut r0 = 0;
        while r0 < m {
            let rows = chunk.min(m - r0);
            let a = AttnArgs {
                q: p[Q] + (r0 * qd * 4) as u64,
                out: p[ATT] + (r0 * qd * 4) as u64,
                k_cache: kc,
                v_cache: vc,
                pos: meta.pos + (r0 * 4) as u64,
                row_seq: meta.row_seq + (r0 * 4) as u64,
                table_off: meta.table_off,
                tables: meta.tables,
                scores: g.ptr(scores),
                ctx: meta.ctx,
                rows,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                block_size: self.block_size,
                scale: 1.0 / (hd as f32).sqrt(),
                prep: prep.map(|a| super::AttnPrep {
                    values: g.ptr(&a.values) + (r0 * a.kp * 2) as u64,
                    sums: g.ptr(&a.scales) + (r0 * (a.kp / 32) * 4) as u64,
                    kp: a.kp,
                    bf16: a.kind == ActKind::BF16,
                }),
            };
            g.attention(&a)?;
            r0 += rows;
        }
        if prep.is_none() {
            self.prep(p[ATT], qd, m, &[&lw.attn_out])?;
        }
        self.tick("attention");
        self.mm(&lw.attn_out, p[ATT], p[O], Some(p[X]), m)?;
        self.tick("o");
        Ok(())
    }

    /// Norm, gate/up, SwiGLU and the down projection (residual added).
    fn ffn_block(&self, l: usize, m: usize) -> Result<()> {
        let c = &self.config;
        let g = &self.gpu;
        let lw = &self.layers[l];
        let p: Vec<u64> = self.scratch.bufs.iter().map(|b| g.ptr(b)).collect();
        let gu: Vec<&Mat> = match &lw.gateup {
            Some(f) => vec![f],
            None => vec![&lw.gate, &lw.up],
        };
        self.norm_for(p[X], g.ptr(&lw.ffn_norm), p[H], m, &gu)?;
        self.tick("norm");
        match &lw.gateup {
            Some(f) => self.mm_split(f, &[(p[G], c.ffn), (p[U], c.ffn)], m)?,
            None => {
                self.mm(&lw.gate, p[H], p[G], None, m)?;
                self.mm(&lw.up, p[H], p[U], None, m)?;
            }
        }
        self.tick("gate/up");
        self.swiglu_for(p[G], p[U], m, &[&lw.down])?;
        self.tick("swiglu");
        self.mm(&lw.down, p[G], p[O], Some(p[X]), m)?;
        self.tick("down");
        Ok(())
    }

    /// Embedding and every layer for `m` rows; the residual stream ends in scratch `X`.
    pub(super) fn body(&self, m: usize, meta: &Meta, scores: &CudaSlice<f32>) -> Result<()> {
        let c = &self.config;
        let g = &self.gpu;
        self.tick("start");
        let table = self
            .embed
            .data
            .as_ref()
            .ok_or_else(|| g.err("embedding table missing"))?;
        g.embed(
            self.embed.dtype,
            g.ptr(table),
            self.embed.row_bytes,
            meta.tokens,
            g.ptr(&self.scratch.bufs[X]),
            m,
            c.hidden,
        )?;
        self.tick("embed");
        for l in 0..c.n_layers {
            self.layer(l, m, meta, scores)?;
        }
        Ok(())
    }

    /// The final norm and output projection of `n` rows at `x` into `logits` (`hn`: `n` rows of
    /// hidden scratch, may equal `x`).
    pub(super) fn head(&self, x: u64, hn: u64, logits: u64, n: usize) -> Result<()> {
        let g = &self.gpu;
        let out = self.output.as_ref().unwrap_or(&self.embed);
        self.norm_for(x, g.ptr(&self.out_norm), hn, n, &[out])?;
        self.mm(out, hn, logits, None, n)?;
        self.tick("head");
        Ok(())
    }

    /// Runs the step's kernels (as a CUDA graph when enabled and the batch fits a bucket);
    /// the logits stay on the device.
    pub(super) fn forward(&mut self, batch: &StepBatch) -> Result<Fwd> {
        self.check_batch(batch)?;
        let m = batch.rows.len();
        if m == 0 {
            return Ok(Fwd::default());
        }
        if self.graphs_on
            && let Some(f) = self.forward_graph(batch)?
        {
            return Ok(f);
        }
        self.forward_plain(batch)
    }

    fn forward_plain(&mut self, batch: &StepBatch) -> Result<Fwd> {
        let m = batch.rows.len();
        let bufs = self.upload_meta(batch)?;
        self.ensure_scratch(m)?;
        self.ensure_rope(bufs.ctx - 1)?;
        let meta = bufs.meta(&self.gpu);
        let c = self.config.clone();
        let g = &self.gpu;
        let per_row = c.n_heads * super::attn_part_floats(meta.ctx, c.head_dim);
        let score_rows = (SCORE_FLOATS / per_row.max(1)).clamp(1, m);
        let scores = g.zeros::<f32>(score_rows * per_row)?;
        self.body(m, &meta, &scores)?;
        let want: Vec<u32> = (0..m)
            .filter(|&i| batch.rows[i].want_logits)
            .map(|i| i as u32)
            .collect();
        if want.is_empty() {
            return Ok(Fwd::default());
        }
        let n = want.len();
        let idx = g.upload(&want)?;
        let sel = g.zeros::<f32>(n * c.hidden)?;
        let x = g.ptr(&self.scratch.bufs[X]);
        g.gather_rows(g.ptr(&sel), x, g.ptr(&idx), n, c.hidden)?;
        let logits = g.zeros::<f32>(n * c.vocab)?;
        self.head(g.ptr(&sel), g.ptr(&sel), g.ptr(&logits), n)?;
        if let Some(p) = &self.prof {
            p.finish_step(m);
        }
        Ok(Fwd {
            owned: Some(logits),
            rows: (0..n).collect(),
        })
    }

    /// The device buffer holding `f`'s logits.
    pub(super) fn logits_buf<'a>(&'a self, f: &'a Fwd) -> Result<&'a CudaSlice<f32>> {
        match (&f.owned, &self.graph) {
            (Some(b), _) => Ok(b),
            (None, Some(gs)) => Ok(&gs.logits),
            (None, None) => Err(self.gpu.err("logits buffer missing")),
        }
    }

    /// Copies back the logits of `f`'s rows `which` (indices into `f.rows`).
    pub(super) fn download_logits(&self, f: &Fwd, which: &[usize]) -> Result<Vec<Vec<f32>>> {
        let rows: Vec<usize> = which
            .iter()
            .filter_map(|&i| f.rows.get(i).copied())
            .collect();
        let Some(&last) = rows.iter().max() else {
            return Ok(Vec::new());
        };
        let v = self.config.vocab;
        let buf = self.logits_buf(f)?;
        let host = self.gpu.download_range(buf, 0, (last + 1) * v)?;
        rows.iter()
            .map(|&r| {
                host.get(r * v..(r + 1) * v)
                    .map(|s| s.to_vec())
                    .ok_or_else(|| self.gpu.err("logits row beyond the buffer"))
            })
            .collect()
    }

    pub(super) fn run_step(&mut self, batch: &StepBatch) -> Result<StepOutput> {
        let f = self.forward(batch)?;
        let all: Vec<usize> = (0..f.rows.len()).collect();
        let logits = self.download_logits(&f, &all)?;
        self.gpu.sync()?;
        Ok(StepOutput { logits })
    }
}
