//! Gated DeltaNet on the device (kernels/cu/delta.cu): per layer, every slot's recurrent state,
//! its convolution inputs and its kept delta-rule inputs in fixed buffers; per step, the plan
//! of each sequence (crate::backend::state: where its slot's state stands, what to replay and
//! where to commit) as one u32 array the kernels read: `PLAN_W` words per sequence, then the
//! row lists. Plain steps upload it; CUDA graphs copy it into a fixed buffer of
//! [`plan_words_cap`] words (a bucket's sequences, every entry beyond the step's inert).

use cudarc::driver::CudaSlice;

use super::CudaOps;
use super::device::{Arg, Gpu};
use crate::backend::StepBatch;
use crate::backend::state::{CONV_RING, RING, SeqPlan, StateBook};
use crate::error::Result;
use crate::ops::{Act, DeltaParams, StateId};

/// u32 words of one sequence's plan entry (kernels/cu/delta.cu `PLAN_W`).
const PLAN_W: usize = 6;

/// Key head sizes the delta kernel is built for (`gated_delta_k<HK>`).
pub const HEAD_K: [usize; 4] = [16, 32, 64, 128];

/// One layer's state buffers over every slot.
pub(super) struct StateLayer {
    p: DeltaParams,
    /// `[slot][n_v_heads][head_k][head_v]`.
    s: CudaSlice<f32>,
    /// `[slot][CONV_RING][conv_dim]`.
    conv: CudaSlice<f32>,
    /// `[slot][RING][conv_dim + 2 n_v_heads]`.
    inputs: CudaSlice<f32>,
}

/// The recurrent state of a model's DeltaNet layers and the current step's plan.
pub(super) struct States {
    pub layers: Vec<StateLayer>,
    pub book: StateBook,
    pub plans: Vec<SeqPlan>,
    /// The step's plan on the device and its sequence count (entries), set by the step.
    pub dev: (u64, usize),
}

impl States {
    pub fn new(slots: usize) -> States {
        States {
            layers: Vec::new(),
            book: StateBook::new(slots),
            plans: Vec::new(),
            dev: (0, 0),
        }
    }
}

/// Bytes of one slot's state in one layer (the memory plan, plan.rs).
pub fn slot_bytes(p: &DeltaParams) -> usize {
    let s = p.n_v_heads * p.head_k * p.head_v;
    let conv = CONV_RING * p.conv_dim();
    let inputs = RING * (p.conv_dim() + 2 * p.n_v_heads);
    4 * (s + conv + inputs)
}

/// Words of the plan buffer of a graph over at most `seqs` sequences and `rows` rows.
pub(super) fn plan_words_cap(seqs: usize, rows: usize) -> usize {
    seqs * PLAN_W + rows
}

/// The plan words of `plans` for `n_seqs` entries (the ones past `plans` inert).
pub fn plan_words(plans: &[SeqPlan], n_seqs: usize) -> Result<Vec<u32>> {
    let w = |v: usize| super::step::u32_of(v, "state plan value");
    let mut head = vec![0u32; n_seqs * PLAN_W];
    let mut rows = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        let e = &mut head[i * PLAN_W..(i + 1) * PLAN_W];
        e.copy_from_slice(&[
            w(p.slot)?,
            w(p.first)?,
            w(p.replay_from)?,
            w(p.commit_to)?,
            w(p.rows.len())?,
            w(rows.len())?,
        ]);
        for &r in &p.rows {
            rows.push(w(r)?);
        }
    }
    head.extend(rows);
    Ok(head)
}

impl CudaOps {
    /// Declares a DeltaNet layer: zeroed state buffers for every slot.
    pub(super) fn new_state_layer(&mut self, p: &DeltaParams) -> Result<StateId> {
        if !HEAD_K.contains(&p.head_k) {
            return Err(self.gpu.err(format!(
                "gated DeltaNet key head size {} (the GPU kernels are built for {HEAD_K:?})",
                p.head_k
            )));
        }
        let slots = self.states.book.slots();
        let g = &self.gpu;
        let layer = StateLayer {
            p: *p,
            s: g.zeros(slots * p.n_v_heads * p.head_k * p.head_v)?,
            conv: g.zeros(slots * CONV_RING * p.conv_dim())?,
            inputs: g.zeros(slots * RING * (p.conv_dim() + 2 * p.n_v_heads))?,
        };
        self.states.layers.push(layer);
        Ok(StateId(self.states.layers.len() - 1))
    }

    /// Plans `batch` over the slots (a model with DeltaNet layers); the plans stay for the step.
    pub(super) fn plan_states(&mut self, batch: &StepBatch) -> Result<()> {
        self.states.plans = match self.states.layers.is_empty() {
            true => Vec::new(),
            false => self.states.book.plan(batch)?,
        };
        Ok(())
    }

    /// Records the step's plans as run (`ok`) or forgets their slots' states.
    pub(super) fn finish_states(&mut self, ok: bool) {
        let s = &mut self.states;
        match ok {
            true => s.book.commit(&s.plans),
            false => s.book.invalidate(&s.plans),
        }
        s.plans.clear();
    }

    fn state(&self, st: StateId) -> Result<&StateLayer> {
        self.states
            .layers
            .get(st.0)
            .ok_or_else(|| self.gpu.err(format!("state layer {} does not exist", st.0)))
    }

    /// `out = silu(conv(x))` with the slot's earlier inputs (kernels/cu/delta.cu conv1d_silu).
    pub(super) fn conv1d_silu_launch(
        &self,
        st: StateId,
        w: &CudaSlice<f32>,
        (x, out): (Act, Act),
    ) -> Result<()> {
        let l = self.state(st)?;
        let (cd, g) = (l.p.conv_dim(), &self.gpu);
        if x.width != cd || out.width != cd || w.len() != cd * l.p.conv_kernel {
            return Err(g.err(format!(
                "conv1d_silu: widths {} -> {}, {} weights for {cd} channels of {}",
                x.width,
                out.width,
                w.len(),
                l.p.conv_kernel
            )));
        }
        let (plan, n_seqs) = self.states.dev;
        if n_seqs == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(self.ptr(x)?),
            Arg::Ptr(self.ptr(out)?),
            Arg::Ptr(g.ptr(w)),
            Arg::Ptr(g.ptr(&l.conv)),
            Arg::Ptr(plan),
            Arg::U32(g.u32_of(n_seqs, "sequences")?),
            Arg::U32(g.u32_of(cd, "conv channels")?),
            Arg::U32(g.u32_of(l.p.conv_kernel, "conv kernel")?),
        ];
        let grid = (g.u32_of(cd.div_ceil(128), "conv blocks")?, n_seqs as u32);
        g.launch("conv1d_silu", grid, 128, &args)
    }

    /// The gated delta rule of every row into `out`, then the step's inputs kept.
    pub(super) fn gated_delta_launch(
        &self,
        st: StateId,
        (qkv, ba): (Act, Act),
        [a, dt]: [&CudaSlice<f32>; 2],
        out: Act,
    ) -> Result<()> {
        let l = self.state(st)?;
        let (p, g) = (l.p, &self.gpu);
        let ok = qkv.width == p.conv_dim()
            && ba.width == 2 * p.n_v_heads
            && out.width == p.value_dim()
            && a.len() == p.n_v_heads
            && dt.len() == p.n_v_heads;
        if !ok {
            return Err(g.err(format!(
                "gated_delta: qkv {} / ba {} / out {} wide, {} / {} coefficients for {p:?}",
                qkv.width,
                ba.width,
                out.width,
                a.len(),
                dt.len()
            )));
        }
        let (plan, n_seqs) = self.states.dev;
        if n_seqs == 0 {
            return Ok(());
        }
        let (pq, pb) = (self.ptr(qkv)?, self.ptr(ba)?);
        let u = |v: usize, what| g.u32_of(v, what);
        let args = [
            Arg::Ptr(pq),
            Arg::Ptr(pb),
            Arg::Ptr(g.ptr(a)),
            Arg::Ptr(g.ptr(dt)),
            Arg::Ptr(self.ptr(out)?),
            Arg::Ptr(g.ptr(&l.s)),
            Arg::Ptr(g.ptr(&l.inputs)),
            Arg::Ptr(plan),
            Arg::U32(u(n_seqs, "sequences")?),
            Arg::U32(u(p.n_k_heads, "key heads")?),
            Arg::U32(u(p.n_v_heads, "value heads")?),
            Arg::U32(u(p.head_v, "value head size")?),
        ];
        let tiles = p.head_v.div_ceil(32) * p.n_v_heads;
        let kernel = format!("gated_delta_k{}", p.head_k);
        g.launch(
            &kernel,
            (u(tiles, "delta blocks")?, n_seqs as u32),
            32,
            &args,
        )?;
        let keep = [
            Arg::Ptr(pq),
            Arg::Ptr(pb),
            Arg::Ptr(g.ptr(&l.inputs)),
            Arg::Ptr(plan),
            Arg::U32(u(n_seqs, "sequences")?),
            Arg::U32(u(p.conv_dim(), "conv channels")?),
            Arg::U32(u(p.n_v_heads, "value heads")?),
        ];
        let per_seq = (RING * (p.conv_dim() + 2 * p.n_v_heads)).div_ceil(256);
        g.launch(
            "keep_inputs",
            (u(per_seq, "keep blocks")?, n_seqs as u32),
            256,
            &keep,
        )
    }
}

impl Gpu {
    /// `x[r][c] *= sigmoid(g[r][c / (width / gwidth)])` for `rows` rows of `width`.
    pub fn sigmoid_mul(
        &self,
        x: u64,
        gates: u64,
        rows: usize,
        width: usize,
        gwidth: usize,
    ) -> Result<()> {
        if gwidth == 0 || !width.is_multiple_of(gwidth) {
            return Err(self.err(format!("sigmoid_mul: widths {width} and {gwidth}")));
        }
        let n = (rows * width) as u64;
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(gates),
            Arg::U64(n),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::U32(self.u32_of(gwidth, "gate width")?),
        ];
        self.launch("sigmoid_mul", Self::stride_grid(n), 256, &args)
    }
}
