//! The CPU reference backend: plain f32 Rust, deterministic, the oracle for every kernel.
//!
//! Weights stay in their stored block format and are dequantized row by row into exact f32.
//! Work is split across threads over output features (matmul) or (row, head) pairs (attention)
//! only, never over a reduction, so results are bitwise independent of the thread count, the
//! batch composition and the prefill chunking.

mod attention;
pub mod delta;
mod kv;
mod matmul;
pub mod moe;
pub mod ops;

use std::collections::HashMap;

use kv::KvStore;

use super::exec::{Exec, HeadRows};
use super::runner::Runner;
use super::state::{MAX_STATE_SLOTS, SeqPlan, StateBook};
use super::{DumpFn, StepBatch};
use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::models::ModelWeights;
use crate::ops::rope::Rope;
use crate::ops::{Act, AttnParams, DeltaParams, Glu, KvId, MoeParams, Ops, RopeId, Rows, StateId};
use crate::weights::Tensor;

/// CPU backend options.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// KV blocks to allocate.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// The KV cache's element format.
    pub kv_dtype: KvDtype,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 0,
            kv_blocks: 64,
            block_size: 16,
            kv_dtype: KvDtype::default(),
        }
    }
}

/// The CPU backend: the generic runner over the CPU ops.
pub type CpuBackend = Runner<CpuOps>;

impl Runner<CpuOps> {
    pub fn new(w: ModelWeights, opts: &CpuOptions) -> Result<CpuBackend> {
        Runner::build(CpuOps::new(opts)?, &w)
    }
}

/// One activation: `rows x width` values.
struct ActBuf {
    name: &'static str,
    width: usize,
    rows: Rows,
    data: Vec<f32>,
}

/// The op interface on the CPU.
pub struct CpuOps {
    pool: rayon::ThreadPool,
    kv: KvStore,
    acts: Vec<ActBuf>,
    /// Rows of the step and of the head.
    step_rows: usize,
    head_rows: usize,
    /// The step's rows and block tables.
    batch: StepBatch,
    ropes: Vec<Rope>,
    /// Per RoPE table, per step row: (cos, sin) at the row's position.
    rope_rows: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    dump: Option<DumpFn>,
    /// The hidden input rows of [`Ops::hidden_in`].
    hidden_in: Vec<f32>,
    /// Gated DeltaNet layers' states ([`Ops::state_layer`]), where each slot stands, and the
    /// step's plan per sequence.
    states: Vec<delta::DeltaLayer>,
    book: StateBook,
    plans: Vec<SeqPlan>,
    /// The position of each state snapshot saved in every state layer, by id
    /// ([`Exec::save_state`]).
    snaps: HashMap<u32, usize>,
}

fn err(what: String) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        what,
    }
}

impl CpuOps {
    pub fn new(opts: &CpuOptions) -> Result<CpuOps> {
        if opts.block_size == 0 || opts.kv_blocks == 0 {
            return Err(Error::Input(
                "KV block size and block count must be > 0".into(),
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| err(format!("thread pool: {e}")))?;
        Ok(CpuOps {
            pool,
            kv: KvStore::new(opts.kv_blocks, opts.block_size, opts.kv_dtype),
            acts: Vec::new(),
            step_rows: 0,
            head_rows: 0,
            batch: StepBatch::default(),
            ropes: Vec::new(),
            rope_rows: Vec::new(),
            dump: None,
            hidden_in: Vec::new(),
            states: Vec::new(),
            book: StateBook::new(0),
            plans: Vec::new(),
            snaps: HashMap::new(),
        })
    }

    /// The state layer `st`.
    fn state(&mut self, st: StateId) -> Result<&mut delta::DeltaLayer> {
        self.states
            .get_mut(st.0)
            .ok_or_else(|| err(format!("state layer {} does not exist", st.0)))
    }

    fn rows(&self, a: Act) -> usize {
        match a.rows {
            Rows::Step => self.step_rows,
            Rows::Head => self.head_rows,
        }
    }

    /// Sizes every activation of class `class` for `n` rows.
    fn set_rows(&mut self, class: Rows, n: usize) {
        match class {
            Rows::Step => self.step_rows = n,
            Rows::Head => self.head_rows = n,
        }
        for a in self.acts.iter_mut().filter(|a| a.rows == class) {
            a.data.resize(n * a.width, 0.0);
        }
    }

    /// The first `rows` rows of `a`.
    fn input(&self, a: Act, rows: usize) -> Result<&[f32]> {
        self.acts[a.id]
            .data
            .get(..rows * a.width)
            .ok_or_else(|| err(format!("{}: fewer than {rows} rows", self.acts[a.id].name)))
    }

    /// Runs `f(input rows of x, output rows of y)` over `y`'s rows; `x` may be `y` (then the
    /// input is a copy).
    fn map(
        &mut self,
        x: Act,
        y: Act,
        f: impl FnOnce(&Self, &[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let m = self.rows(y);
        let mut out = std::mem::take(&mut self.acts[y.id].data);
        let r = if x.id == y.id {
            let src = out[..m * x.width].to_vec();
            f(self, &src, &mut out[..m * y.width])
        } else {
            self.input(x, m)
                .and_then(|src| f(self, src, &mut out[..m * y.width]))
        };
        self.acts[y.id].data = out;
        r
    }

    /// Per step row: (its block, its slot) in the KV cache.
    fn kv_slot(&self, i: usize) -> (u32, usize) {
        let row = self.batch.rows[i];
        let (p, bs) = (row.pos as usize, self.kv.block_size);
        (self.batch.block_tables[row.seq][p / bs], p % bs)
    }
}

impl Ops for CpuOps {
    type Mat = Tensor;
    type Mats = Vec<Tensor>;
    type Vector = Vec<f32>;

    fn mat(&mut self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }

    fn mats(&mut self, ts: &[&Tensor]) -> Result<Vec<Tensor>> {
        Ok(ts.iter().map(|&t| t.clone()).collect())
    }

    fn experts(&mut self, t: &Tensor) -> Result<Tensor> {
        if t.shape.len() != 3 {
            return Err(err(format!(
                "experts {}: shape {:?} is not [n_experts, out, in]",
                t.name, t.shape
            )));
        }
        Ok(t.clone())
    }

    fn vector(&mut self, t: &Tensor) -> Result<Vec<f32>> {
        t.to_f32()
    }

    fn act(&mut self, name: &'static str, width: usize, rows: Rows) -> Act {
        self.acts.push(ActBuf {
            name,
            width,
            rows,
            data: Vec::new(),
        });
        Act {
            id: self.acts.len() - 1,
            width,
            rows,
        }
    }

    fn rope_table(&mut self, rope: Rope) -> Result<RopeId> {
        self.ropes.push(rope);
        Ok(RopeId(self.ropes.len() - 1))
    }

    fn kv_layer(&mut self, width: usize) -> Result<KvId> {
        self.kv.add_layer(width).map(KvId)
    }

    fn state_layer(&mut self, p: &DeltaParams) -> Result<StateId> {
        self.states.push(delta::DeltaLayer::new(*p));
        Ok(StateId(self.states.len() - 1))
    }

    fn embed(&mut self, table: &Tensor, out: Act) -> Result<()> {
        let m = self.rows(out);
        let mut data = std::mem::take(&mut self.acts[out.id].data);
        let r = self.batch.rows[..m]
            .iter()
            .zip(data.chunks_exact_mut(out.width))
            .try_for_each(|(row, xr)| {
                crate::quant::dequantize_row(table.dtype, table.row(row.token as usize), xr)
            });
        self.acts[out.id].data = data;
        r
    }

    fn hidden_in(&mut self, out: Act) -> Result<()> {
        let n = self.rows(out) * out.width;
        match self.hidden_in.get(..n) {
            Some(src) => {
                self.acts[out.id].data[..n].copy_from_slice(src);
                Ok(())
            }
            None => Err(err(format!(
                "hidden_in: {} values for {} rows of {}",
                self.hidden_in.len(),
                self.rows(out),
                out.width
            ))),
        }
    }

    fn inject(&mut self, x: Act) -> Result<()> {
        self.inject_part(x, 0, |d, s| d.copy_from_slice(s))
    }

    fn inject_add(&mut self, x: Act, part: usize, _tmp: Act) -> Result<()> {
        self.inject_part(x, part, |d, s| {
            for (a, &b) in d.iter_mut().zip(s) {
                *a += b;
            }
        })
    }

    fn matmul(&mut self, w: &Tensor, x: Act, y: Act) -> Result<()> {
        let m = self.rows(y);
        self.map(x, y, |s, src, out| matmul::matmul(&s.pool, w, src, m, out))
    }

    fn matmuls(&mut self, w: &Vec<Tensor>, x: Act, ys: &[Act]) -> Result<()> {
        if w.len() != ys.len() {
            return Err(err(format!(
                "{} matrices for {} outputs",
                w.len(),
                ys.len()
            )));
        }
        for (w, &y) in w.iter().zip(ys) {
            self.matmul(w, x, y)?;
        }
        Ok(())
    }

    fn rms_norm(&mut self, x: Act, w: &Vec<f32>, y: Act, group: usize, eps: f32) -> Result<()> {
        if group == 0 || w.len() != group || !x.width.is_multiple_of(group) || x.width != y.width {
            return Err(err(format!(
                "rms_norm: width {} -> {}, group {group}, weight {}",
                x.width,
                y.width,
                w.len()
            )));
        }
        self.map(x, y, |_, src, out| {
            for (o, r) in out.chunks_exact_mut(group).zip(src.chunks_exact(group)) {
                ops::rms_norm(r, w, eps, o);
            }
            Ok(())
        })
    }

    fn add(&mut self, x: Act, y: Act) -> Result<()> {
        let m = self.rows(x);
        let src = std::mem::take(&mut self.acts[y.id].data);
        let r = match src.get(..m * y.width) {
            Some(s) if y.width == x.width && x.id != y.id => {
                ops::add_in_place(&mut self.acts[x.id].data[..m * x.width], s);
                Ok(())
            }
            _ => Err(err(format!("add: {m} rows of {} and {}", x.width, y.width))),
        };
        self.acts[y.id].data = src;
        r
    }

    fn add_bias(&mut self, x: Act, b: &Vec<f32>) -> Result<()> {
        let m = self.rows(x);
        if b.len() != x.width {
            return Err(err(format!("bias of {} for width {}", b.len(), x.width)));
        }
        for r in self.acts[x.id].data[..m * x.width].chunks_exact_mut(x.width) {
            ops::add_in_place(r, b);
        }
        Ok(())
    }

    fn scale(&mut self, x: Act, s: f32) -> Result<()> {
        let m = self.rows(x);
        for v in &mut self.acts[x.id].data[..m * x.width] {
            *v *= s;
        }
        Ok(())
    }

    fn softcap(&mut self, x: Act, cap: f32) -> Result<()> {
        let m = self.rows(x);
        ops::softcap(&mut self.acts[x.id].data[..m * x.width], cap);
        Ok(())
    }

    fn glu(&mut self, kind: Glu, gate: Act, up: Act) -> Result<()> {
        let m = self.rows(gate);
        let u = std::mem::take(&mut self.acts[up.id].data);
        let r = match u.get(..m * up.width) {
            Some(u) if up.width == gate.width && up.id != gate.id => {
                let g = &mut self.acts[gate.id].data[..m * gate.width];
                match kind {
                    Glu::Silu => ops::swiglu(g, u),
                    Glu::GeluTanh => ops::geglu_tanh(g, u),
                }
                Ok(())
            }
            _ => Err(err(format!("glu: widths {} and {}", gate.width, up.width))),
        };
        self.acts[up.id].data = u;
        r
    }

    fn rope(&mut self, x: Act, table: RopeId, head_dim: usize) -> Result<()> {
        let m = self.rows(x);
        let rows = self
            .rope_rows
            .get(table.0)
            .ok_or_else(|| err(format!("RoPE table {} does not exist", table.0)))?;
        let data = &mut self.acts[x.id].data[..m * x.width];
        for (xr, (cos, sin)) in data.chunks_exact_mut(x.width).zip(rows) {
            ops::rope_apply(xr, head_dim, cos, sin);
        }
        Ok(())
    }

    fn kv_write(&mut self, kv: KvId, k: Act, v: Act) -> Result<()> {
        let m = self.rows(k);
        for i in 0..m {
            let (block, slot) = self.kv_slot(i);
            let kr = &self.acts[k.id].data[i * k.width..(i + 1) * k.width];
            let vr = &self.acts[v.id].data[i * v.width..(i + 1) * v.width];
            self.kv.write(kv.0, block, slot, kr, vr);
        }
        Ok(())
    }

    fn attention(&mut self, kv: KvId, q: Act, out: Act, p: &AttnParams) -> Result<()> {
        self.map(q, out, |s, q, out| {
            attention::attention(&s.pool, &s.kv, kv.0, &s.batch, q, p, out);
            Ok(())
        })
    }

    fn moe(
        &mut self,
        experts: [&Tensor; 3],
        x: Act,
        router: Act,
        out: Act,
        p: &MoeParams,
    ) -> Result<()> {
        let m = self.rows(out);
        if x.id == out.id || router.id == out.id || x.width != out.width {
            return Err(err(format!(
                "moe: x {} / router {} / out {} must be distinct, x and out of one width",
                x.width, router.width, out.width
            )));
        }
        let mut dst = std::mem::take(&mut self.acts[out.id].data);
        let r = self.input(x, m).and_then(|xs| {
            let logits = self.input(router, m)?;
            moe::moe(
                &self.pool,
                experts,
                xs,
                logits,
                m,
                p,
                &mut dst[..m * out.width],
            )
        });
        self.acts[out.id].data = dst;
        r
    }

    fn sigmoid_mul(&mut self, x: Act, g: Act) -> Result<()> {
        let m = self.rows(x);
        if g.width == 0 || !x.width.is_multiple_of(g.width) || x.id == g.id {
            return Err(err(format!(
                "sigmoid_mul: widths {} and {}",
                x.width, g.width
            )));
        }
        let gates = std::mem::take(&mut self.acts[g.id].data);
        let xs = &mut self.acts[x.id].data[..m * x.width];
        for (xr, gr) in xs
            .chunks_exact_mut(x.width)
            .zip(gates.chunks_exact(g.width))
        {
            delta::sigmoid_mul(xr, gr, x.width / g.width);
        }
        self.acts[g.id].data = gates;
        Ok(())
    }

    fn conv1d_silu(&mut self, st: StateId, w: &Vec<f32>, x: Act, out: Act) -> Result<()> {
        let m = self.rows(out);
        if x.width != out.width || x.id == out.id {
            return Err(err(format!(
                "conv1d_silu: widths {} -> {}",
                x.width, out.width
            )));
        }
        let plans = std::mem::take(&mut self.plans);
        let xs = std::mem::take(&mut self.acts[x.id].data);
        let mut dst = std::mem::take(&mut self.acts[out.id].data);
        let r = self.state(st).map(|layer| {
            layer.conv1d_silu(&plans, w, &xs[..m * x.width], &mut dst[..m * out.width])
        });
        self.acts[x.id].data = xs;
        self.acts[out.id].data = dst;
        self.plans = plans;
        r
    }

    fn gated_delta(
        &mut self,
        st: StateId,
        qkv: Act,
        ba: Act,
        [a_coef, dt]: [&Vec<f32>; 2],
        out: Act,
    ) -> Result<()> {
        let m = self.rows(out);
        let plans = std::mem::take(&mut self.plans);
        let mut dst = std::mem::take(&mut self.acts[out.id].data);
        let mut states = std::mem::take(&mut self.states);
        let r = match states.get_mut(st.0) {
            Some(layer) => self.input(qkv, m).and_then(|q| {
                let b = self.input(ba, m)?;
                layer.gated_delta(
                    &self.pool,
                    &plans,
                    (q, b),
                    (a_coef, dt),
                    &mut dst[..m * out.width],
                );
                Ok(())
            }),
            None => Err(err(format!("state layer {} does not exist", st.0))),
        };
        self.states = states;
        self.acts[out.id].data = dst;
        self.plans = plans;
        r
    }

    fn dump(&mut self, name: &str, layer: usize, x: Act) {
        let m = self.rows(x);
        if let Some(d) = self.dump.as_mut() {
            d(name, layer, m, &self.acts[x.id].data[..m * x.width]);
        }
    }
}

impl CpuOps {
    /// `f(row of x, part of its embedding)` for each of the step's given embeddings.
    fn inject_part(&mut self, x: Act, part: usize, f: impl Fn(&mut [f32], &[f32])) -> Result<()> {
        let w = x.width;
        let data = &mut self.acts[x.id].data;
        for e in &self.batch.embeds {
            let (dst, src) = (e.row * w, e.index * e.width + part * w);
            let fits = (part + 1) * w <= e.width;
            match (data.get_mut(dst..dst + w), e.values.get(src..src + w)) {
                (Some(d), Some(s)) if fits => f(d, s),
                _ => {
                    return Err(err(format!(
                        "inject: row {} / part {part} of embedding row {} (rows of {}) out of \
                         range",
                        e.row, e.index, e.width
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Exec for CpuOps {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn kv_block_size(&self) -> usize {
        self.kv.block_size
    }

    fn kv_blocks(&self) -> usize {
        self.kv.blocks
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv.dtype
    }

    fn execute(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Vec<usize>> {
        self.batch = batch.clone();
        self.set_rows(Rows::Step, batch.rows.len());
        // A table with M-RoPE sections at the rows' M-RoPE positions; the others (and every
        // table of a step without them) at the rows' positions.
        let at = |rope: &Rope, i: usize, pos: u32| match (&rope.sections, batch.mrope.get(i)) {
            (Some(_), Some(&m)) => m,
            _ => [pos; 3],
        };
        self.rope_rows = self
            .ropes
            .iter()
            .map(|rope| {
                let rows = batch.rows.iter().enumerate();
                rows.map(|(i, r)| rope.cos_sin_at(at(rope, i, r.pos)))
                    .collect()
            })
            .collect();
        if self.states.is_empty() {
            pass(self, HeadRows::Gather(want))?;
            return Ok((0..want.len()).collect());
        }
        // Slots are grown on first use on the CPU.
        let top = batch
            .state_slots
            .iter()
            .max()
            .map_or(batch.block_tables.len(), |&s| s as usize + 1);
        self.book.grow(top);
        self.plans = self.book.plan(batch)?;
        match pass(self, HeadRows::Gather(want)) {
            Ok(()) => self.book.commit(&self.plans),
            Err(e) => {
                self.book.invalidate(&self.plans);
                return Err(e);
            }
        }
        Ok((0..want.len()).collect())
    }

    fn gather(&mut self, x: Act, rows: &[usize], out: Act) -> Result<()> {
        self.set_rows(Rows::Head, rows.len());
        let mut dst = std::mem::take(&mut self.acts[out.id].data);
        let src = &self.acts[x.id].data;
        let w = x.width;
        for (d, &r) in dst.chunks_exact_mut(out.width).zip(rows) {
            d.copy_from_slice(&src[r * w..(r + 1) * w]);
        }
        self.acts[out.id].data = dst;
        Ok(())
    }

    fn read_rows(&mut self, x: Act, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
        let d = self.input(x, self.rows(x))?;
        rows.iter()
            .map(|&r| {
                d.get(r * x.width..(r + 1) * x.width)
                    .map(|s| s.to_vec())
                    .ok_or_else(|| err(format!("row {r} beyond the activation")))
            })
            .collect()
    }

    fn set_hidden_in(&mut self, rows: Vec<f32>) -> Result<()> {
        self.hidden_in = rows;
        Ok(())
    }

    fn injects_rows(&self) -> bool {
        true
    }

    fn reads_step_rows(&self) -> bool {
        true
    }

    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        if block as usize >= self.kv.blocks {
            return Err(err(format!("KV block {block} does not exist")));
        }
        Ok(self.kv.block_bytes(block))
    }

    fn set_dump(&mut self, dump: Option<DumpFn>) {
        self.dump = dump;
    }

    fn set_state_keep(&mut self, positions: usize) {
        self.book.set_keep(positions);
    }

    fn state_snapshots(&self) -> bool {
        !self.states.is_empty()
    }

    fn save_state(&mut self, slot: u32, pos: u32, snap: u32) -> Result<()> {
        if self.states.is_empty() {
            return Err(Error::Unsupported(
                "state snapshots: the model has no recurrent-state layers".into(),
            ));
        }
        let (slot, pos) = (slot as usize, pos as usize);
        // The id holds no snapshot until every layer has this one.
        self.snaps.remove(&snap);
        let committed = self.book.save_from(slot, pos)?;
        let pool = &self.pool;
        let saved = self
            .states
            .iter_mut()
            .try_for_each(|l| l.save(pool, slot, (committed, pos), snap));
        if let Err(e) = saved {
            for l in &mut self.states {
                l.drop_snapshot(snap);
            }
            return Err(err(format!("state snapshot {snap}: {e}")));
        }
        self.snaps.insert(snap, pos);
        Ok(())
    }

    fn restore_state(&mut self, slot: u32, snap: u32) -> Result<u32> {
        if self.states.is_empty() {
            return Err(Error::Unsupported(
                "state snapshots: the model has no recurrent-state layers".into(),
            ));
        }
        let slot = slot as usize;
        if slot >= MAX_STATE_SLOTS {
            return Err(Error::Input(format!(
                "state slot {slot} is beyond the {MAX_STATE_SLOTS} slots a backend holds"
            )));
        }
        let Some(&pos) = self.snaps.get(&snap) else {
            return Err(Error::Input(format!(
                "state snapshot {snap} does not exist"
            )));
        };
        // The slot's earlier state is gone from here on, whatever happens below.
        self.book.clear(slot);
        for l in &mut self.states {
            match l.restore(slot, snap) {
                Ok(p) if p == pos => {}
                Ok(p) => {
                    return Err(err(format!(
                        "state snapshot {snap}: a layer holds position {p}, not {pos}"
                    )));
                }
                Err(e) => return Err(err(format!("state snapshot {snap}: {e}"))),
            }
        }
        self.book.set(slot, pos);
        // Saved from a u32 position.
        Ok(pos as u32)
    }
}
