//! Gated DeltaNet on the device (kernels/cu/delta.cu): per layer, every slot's recurrent state,
//! its convolution inputs and its kept delta-rule inputs in fixed buffers; per step, the plan
//! of each sequence (crate::backend::state: where its slot's state stands, what to replay and
//! where to commit) as one u32 array the kernels read: `PLAN_W` words per sequence, then the
//! row lists. Plain steps upload it; CUDA graphs copy it into a fixed buffer of
//! [`plan_words_cap`] words (a bucket's sequences, every entry beyond the step's inert).
//!
//! Snapshots (prefix-cache hits of a recurrent model, [`crate::backend::Backend::save_state`]):
//! [`snapshot_capacity`] of them per layer, allocated with the layer: the state at a position
//! (the delta kernel replaying the slot's kept inputs into the snapshot) and the slot's
//! convolution ring (its entries are by position, so the restored slot reads the right taps).

use std::collections::HashMap;

use cudarc::driver::CudaSlice;

use super::CudaOps;
use super::device::{Arg, Gpu};
use crate::backend::StepBatch;
use crate::backend::state::{CONV_RING, RING, SeqPlan, StateBook};
use crate::error::{Error, Result};
use crate::ops::{Act, DeltaParams, StateId};

/// u32 words of one sequence's plan entry (kernels/cu/delta.cu `PLAN_W`).
const PLAN_W: usize = 6;

/// Key head sizes the delta kernel is built for (`gated_delta_k<HK>`).
pub const HEAD_K: [usize; 4] = [16, 32, 64, 128];

/// conv1d_silu's launch over `conv_dim` channels (kernels/cu/delta.cu `CONV_CH` channels a block,
/// `CONV_GROUPS` row groups): (blocks a sequence, threads a block).
pub const fn conv1d_dims(conv_dim: usize) -> (usize, u32) {
    (conv_dim.div_ceil(32), 32 * 8)
}

/// Warps of a `gated_delta_k<HK>` block (kernels/cu/delta.cu `DELTA_NW`): each owns
/// `HK / warps` rows of the block's 32 state columns.
pub const fn delta_warps(head_k: usize) -> u32 {
    if head_k >= 64 {
        (head_k / 32) as u32
    } else {
        1
    }
}

/// One layer's state buffers over every slot.
pub(super) struct StateLayer {
    p: DeltaParams,
    /// `[slot][n_v_heads][head_k][head_v]`.
    s: CudaSlice<f32>,
    /// `[slot][CONV_RING][conv_dim]`.
    conv: CudaSlice<f32>,
    /// `[slot][RING][conv_dim + 2 n_v_heads]`.
    inputs: CudaSlice<f32>,
    /// Snapshots: `[snap][n_v_heads][head_k][head_v]` and `[snap][CONV_RING][conv_dim]`.
    snap_s: CudaSlice<f32>,
    snap_conv: CudaSlice<f32>,
    /// The device addresses of the layer's `[a_coef, dt]` (the model's vectors), learnt at its
    /// first step: a snapshot replays with them.
    coef: Option<(u64, u64)>,
}

/// The recurrent state of a model's DeltaNet layers and the current step's plan.
pub(super) struct States {
    pub layers: Vec<StateLayer>,
    pub book: StateBook,
    pub plans: Vec<SeqPlan>,
    /// The step's plan on the device and its sequence count (entries), set by the step.
    pub dev: (u64, usize),
    /// Saved snapshots: id -> position.
    pub snaps: HashMap<u32, usize>,
}

impl States {
    pub fn new(slots: usize) -> States {
        States {
            layers: Vec::new(),
            book: StateBook::new(slots),
            plans: Vec::new(),
            dev: (0, 0),
            snaps: HashMap::new(),
        }
    }
}

/// Snapshots a backend of `slots` state slots holds per layer (ids `0..`): half a slot each.
pub fn snapshot_capacity(slots: usize) -> usize {
    (slots / 2).max(1)
}

/// Bytes of one layer's state buffers for `slots` slots and their snapshots (the memory
/// plan, plan.rs).
pub fn layer_bytes(p: &DeltaParams, slots: usize) -> usize {
    let s = p.n_v_heads * p.head_k * p.head_v;
    let conv = CONV_RING * p.conv_dim();
    let inputs = RING * (p.conv_dim() + 2 * p.n_v_heads);
    let snaps = snapshot_capacity(slots) * (s + conv);
    4 * (slots * (s + conv + inputs) + snaps)
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
        let snaps = snapshot_capacity(slots);
        let g = &self.gpu;
        let s = p.n_v_heads * p.head_k * p.head_v;
        let layer = StateLayer {
            p: *p,
            s: g.zeros(slots * s)?,
            conv: g.zeros(slots * CONV_RING * p.conv_dim())?,
            inputs: g.zeros(slots * RING * (p.conv_dim() + 2 * p.n_v_heads))?,
            snap_s: g.zeros(snaps * s)?,
            snap_conv: g.zeros(snaps * CONV_RING * p.conv_dim())?,
            coef: None,
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
        let (px, pout) = (self.ptr(x)?, self.ptr(out)?);
        if px == pout {
            return Err(g.err("conv1d_silu: the output is the input (not in place)"));
        }
        let (plan, n_seqs) = self.states.dev;
        if n_seqs == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(px),
            Arg::Ptr(pout),
            Arg::Ptr(g.ptr(w)),
            Arg::Ptr(g.ptr(&l.conv)),
            Arg::Ptr(plan),
            Arg::U32(g.u32_of(n_seqs, "sequences")?),
            Arg::U32(g.u32_of(cd, "conv channels")?),
            Arg::U32(g.u32_of(l.p.conv_kernel, "conv kernel")?),
        ];
        let (blocks, threads) = conv1d_dims(cd);
        let grid = (g.u32_of(blocks, "conv blocks")?, n_seqs as u32);
        g.launch("conv1d_silu", grid, threads, &args)
    }

    /// The gated delta rule of every row into `out`, then the step's inputs kept. With `conv`
    /// (the conv weights and inputs; steps of at most [`RING`] rows) the step's rows are
    /// convolved in the same launch (gated_delta_conv_k<HK>: conv1d_silu's bits into `qkv`).
    pub(super) fn gated_delta_launch(
        &mut self,
        st: StateId,
        (qkv, ba): (Act, Act),
        [a, dt]: [&CudaSlice<f32>; 2],
        out: Act,
        conv: Option<(&CudaSlice<f32>, Act)>,
    ) -> Result<()> {
        let l = self.state(st)?;
        let (p, g) = (l.p, &self.gpu);
        if let Some((w, x)) = conv {
            let cd = p.conv_dim();
            if x.width != cd || w.len() != cd * p.conv_kernel || self.n(x) > RING {
                return Err(g.err(format!(
                    "gated_delta_conv: input {} wide, {} weights for {cd} channels of {}, {} rows (at most {RING})",
                    x.width,
                    w.len(),
                    p.conv_kernel,
                    self.n(x)
                )));
            }
        }
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
        let coef = (self.gpu.ptr(a), self.gpu.ptr(dt));
        if let Some(l) = self.states.layers.get_mut(st.0) {
            l.coef = Some(coef);
        }
        let (l, g) = (self.state(st)?, &self.gpu);
        let (plan, n_seqs) = self.states.dev;
        if n_seqs == 0 {
            return Ok(());
        }
        let (pq, pb) = (self.ptr(qkv)?, self.ptr(ba)?);
        let u = |v: usize, what| g.u32_of(v, what);
        let dst = (g.ptr(&l.s), true);
        let rows = (pq, pb, self.ptr(out)?);
        let conv = match conv {
            Some((w, x)) => Some((self.ptr(x)?, g.ptr(w), g.ptr(&l.conv))),
            None => None,
        };
        delta_launch(g, l, rows, [g.ptr(a), g.ptr(dt)], dst, (plan, n_seqs), conv)?;
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

impl CudaOps {
    /// Saves `slot`'s state as of `pos` (its book's `C <= pos <= W`) as snapshot `snap` of
    /// every layer: the delta kernel replays the kept inputs `C..pos` into the snapshot, and
    /// the slot's conv ring is copied.
    pub(super) fn save_snapshot(&mut self, slot: usize, pos: usize, snap: u32) -> Result<()> {
        let s = &mut self.states;
        s.snaps.remove(&snap);
        let cap = snapshot_capacity(s.book.slots());
        if snap as usize >= cap {
            return Err(Error::Input(format!(
                "state snapshot {snap} is beyond the {cap} this device holds"
            )));
        }
        let committed = s.book.save_from(slot, pos)?;
        let plan = SeqPlan {
            slot,
            rows: Vec::new(),
            first: pos,
            replay_from: committed,
            commit_to: pos,
        };
        let g = &self.gpu;
        let words = g.upload(&plan_words(std::slice::from_ref(&plan), 1)?)?;
        for l in &mut self.states.layers {
            let (a, dt) = l
                .coef
                .ok_or_else(|| g.err("state snapshot before any step"))?;
            let per = l.p.n_v_heads * l.p.head_k * l.p.head_v;
            let dst = g.ptr(&l.snap_s) + (snap as usize * per * 4) as u64;
            delta_launch(
                g,
                l,
                (0, 0, 0),
                [a, dt],
                (dst, false),
                (g.ptr(&words), 1),
                None,
            )?;
            let ring = CONV_RING * l.p.conv_dim();
            copy(
                g,
                &l.conv,
                slot * ring,
                &mut l.snap_conv,
                snap as usize * ring,
                ring,
            )?;
        }
        // The plan buffer must outlive the launches.
        g.sync()?;
        self.states.snaps.insert(snap, pos);
        Ok(())
    }

    /// Loads snapshot `snap` into `slot`; returns its position.
    pub(super) fn restore_snapshot(&mut self, slot: usize, snap: u32) -> Result<usize> {
        let s = &mut self.states;
        let Some(&pos) = s.snaps.get(&snap) else {
            return Err(Error::Input(format!(
                "state snapshot {snap} does not exist"
            )));
        };
        if slot >= s.book.slots() {
            return Err(Error::Input(format!(
                "state slot {slot} is beyond the {} this device holds",
                s.book.slots()
            )));
        }
        s.book.clear(slot);
        let g = &self.gpu;
        for l in &mut s.layers {
            let per = l.p.n_v_heads * l.p.head_k * l.p.head_v;
            copy(g, &l.snap_s, snap as usize * per, &mut l.s, slot * per, per)?;
            let ring = CONV_RING * l.p.conv_dim();
            copy(
                g,
                &l.snap_conv,
                snap as usize * ring,
                &mut l.conv,
                slot * ring,
                ring,
            )?;
        }
        s.book.set(slot, pos);
        Ok(pos)
    }
}

/// The delta kernel of layer `l` over `plan` (its address, entries): `(qkv, ba, out)` rows,
/// `[a_coef, dt]`, the commit target (`D` and whether it is per slot); with `conv` = (conv
/// inputs, weights, ring) the kernel that convolves the step's rows first.
fn delta_launch(
    g: &Gpu,
    l: &StateLayer,
    (qkv, ba, out): (u64, u64, u64),
    [a, dt]: [u64; 2],
    (dst, per_slot): (u64, bool),
    (plan, n_seqs): (u64, usize),
    conv: Option<(u64, u64, u64)>,
) -> Result<()> {
    let p = &l.p;
    let u = |v: usize, what| g.u32_of(v, what);
    let args = [
        Arg::Ptr(qkv),
        Arg::Ptr(ba),
        Arg::Ptr(a),
        Arg::Ptr(dt),
        Arg::Ptr(out),
        Arg::Ptr(g.ptr(&l.s)),
        Arg::Ptr(dst),
        Arg::U32(u32::from(per_slot)),
        Arg::Ptr(g.ptr(&l.inputs)),
        Arg::Ptr(plan),
        Arg::U32(u(n_seqs, "sequences")?),
        Arg::U32(u(p.n_k_heads, "key heads")?),
        Arg::U32(u(p.n_v_heads, "value heads")?),
        Arg::U32(u(p.head_v, "value head size")?),
    ];
    let tiles = p.head_v.div_ceil(32) * p.n_v_heads;
    let grid = (u(tiles, "delta blocks")?, n_seqs as u32);
    let block = 32 * delta_warps(p.head_k);
    match conv {
        None => g.launch(&format!("gated_delta_k{}", p.head_k), grid, block, &args),
        Some((x, w, ring)) => {
            let conv = [
                Arg::Ptr(x),
                Arg::Ptr(w),
                Arg::Ptr(ring),
                Arg::U32(u(p.conv_kernel, "conv kernel")?),
            ];
            let args = [&args[..], &conv].concat();
            g.launch(
                &format!("gated_delta_conv_k{}", p.head_k),
                grid,
                block,
                &args,
            )
        }
    }
}

/// `n` values of `src` from `from` into `dst` at `to` (stream-ordered).
fn copy(
    g: &Gpu,
    src: &CudaSlice<f32>,
    from: usize,
    dst: &mut CudaSlice<f32>,
    to: usize,
    n: usize,
) -> Result<()> {
    let s = src
        .try_slice(from..from + n)
        .ok_or_else(|| g.err(format!("state copy: {from}+{n} beyond its source")))?;
    let mut d = dst
        .try_slice_mut(to..to + n)
        .ok_or_else(|| g.err(format!("state copy: {to}+{n} beyond its target")))?;
    g.stream
        .memcpy_dtod(&s, &mut d)
        .map_err(|e| g.err(format!("state copy: {e:?}")))
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
        self.launch_gated("sigmoid_mul", &[x, gates], rows, width, gwidth)
    }

    /// `o[r][c] += s[r][c] * sigmoid(g[r][c / (width / gwidth)])`, then `x[r][c] += o[r][c]`,
    /// for `rows` rows of `width` (the bits of `sigmoid_mul` on `s`, then two `add_in_place`;
    /// `s` is left as it was). One launch.
    pub fn gated_add(
        &self,
        (x, o): (u64, u64),
        (s, gates): (u64, u64),
        rows: usize,
        width: usize,
        gwidth: usize,
    ) -> Result<()> {
        self.launch_gated("gated_add", &[x, o, s, gates], rows, width, gwidth)
    }

    /// Launches an elementwise gating kernel `name` (elementwise.cu `gate_of`) over `rows` rows
    /// of `width` values with `gwidth` gates a row: its buffers, then n, width and gwidth.
    fn launch_gated(
        &self,
        name: &str,
        bufs: &[u64],
        rows: usize,
        width: usize,
        gwidth: usize,
    ) -> Result<()> {
        if gwidth == 0 || !width.is_multiple_of(gwidth) {
            return Err(self.err(format!("{name}: widths {width} and {gwidth}")));
        }
        let n = (rows * width) as u64;
        let mut args: Vec<Arg> = bufs.iter().map(|&b| Arg::Ptr(b)).collect();
        args.extend([
            Arg::U64(n),
            Arg::U32(self.u32_of(width, "width")?),
            Arg::U32(self.u32_of(gwidth, "gate width")?),
        ]);
        self.launch(name, Self::stride_grid(n), 256, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::device::check_args;

    #[test]
    fn the_delta_kernels_take_the_launch_s_arguments() {
        // delta_launch: qkv, ba, a, dt, out, S, D, per slot, inputs, plan, sequences, key heads,
        // value heads, value head size; the conv kernel then the conv inputs, weights, ring, taps.
        let mut args = vec![Arg::Ptr(1); 7];
        args.extend([Arg::U32(1), Arg::Ptr(1), Arg::Ptr(1)]);
        args.extend([Arg::U32(1), Arg::U32(16), Arg::U32(32), Arg::U32(128)]);
        let conv = [Arg::Ptr(1), Arg::Ptr(1), Arg::Ptr(1), Arg::U32(4)];
        for hk in HEAD_K {
            assert_eq!(check_args(&format!("gated_delta_k{hk}"), &args), Ok(()));
            let with_conv = [&args[..], &conv].concat();
            let name = format!("gated_delta_conv_k{hk}");
            assert_eq!(check_args(&name, &with_conv), Ok(()), "{name}");
        }
    }
}
