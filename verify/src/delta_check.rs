//! The gated DeltaNet kernels (kernels/cu/delta.cu) and their neighbours against the CPU:
//!
//! - `conv1d_silu` and `gated_delta_k<HK>` (+ `keep_inputs`) over a sequence of steps of two
//!   sequences planned by the same `StateBook` on both sides (a prompt, a verify step, a
//!   rejected draft resumed, a step longer than the kept ring): every step's outputs within
//!   [`DELTA_TOL`] of the CPU's `DeltaLayer`, every output element written (NaN-poisoned).
//! - Row invariance on the GPU, bitwise: the first sequence computed again one position per
//!   step (the conv inside the delta kernel, `gated_delta_conv_k<HK>`) gives every position's
//!   outputs the bits the multi-row steps gave; a second state running every step of at most
//!   RING rows with that kernel gives the three kernels' bits step by step.
//! - `sigmoid_mul` (one gate per value, per row, per group) and partial RoPE (`rope` and
//!   `rope_kv` rotating fewer pairs than head_dim / 2) against the CPU.

use memra_engine::Result;
use memra_engine::backend::cpu::delta::{DeltaLayer, sigmoid_mul};
use memra_engine::backend::cpu::ops;
use memra_engine::backend::cuda::delta::{conv1d_dims, delta_warps, plan_words};
use memra_engine::backend::cuda::{Arg, Gpu, RopeKvArgs};
use memra_engine::backend::state::{CONV_RING, RING, SeqPlan, StateBook};
use memra_engine::backend::{KvDtype, StepBatch, StepRow};
use memra_engine::ops::DeltaParams;
use memra_engine::ops::rope::Rope;

use crate::case::{Case, compare, rand_vec};

/// The delta rule against the CPU: `expf` / `log1pf` / `sqrtf` and the L2 norms' summation
/// order differ, then the state carries the differences through every later position.
pub const DELTA_TOL: f64 = 1e-4;

/// The steps: per step, (sequence, first position, rows).
const STEPS: [&[(usize, usize, usize)]; 4] = [
    &[(0, 0, 20), (1, 0, 5)],
    &[(0, 20, 3), (1, 5, 1)],
    &[(0, 21, 1), (1, 6, 4)],
    &[(0, 22, 19)],
];
/// Each sequence's slot.
const SLOTS: [u32; 2] = [2, 0];
/// The slot of the one-position-per-step rerun.
const RERUN_SLOT: u32 = 5;
const N_SLOTS: usize = 6;

/// The conv input and `[b a]` of (sequence, position): the same values in every step.
fn row_inputs(seed: u64, p: &DeltaParams, seq: usize, pos: usize) -> (Vec<f32>, Vec<f32>) {
    let s = 4000 + 1000 * seq as u64 + pos as u64;
    (
        rand_vec(seed, s, p.conv_dim(), 1.0),
        rand_vec(seed, s + 500, 2 * p.n_v_heads, 2.0),
    )
}

/// Device addresses of one layer's weights and state (the buffers live in the caller).
struct Dev {
    w: u64,
    a: u64,
    dt: u64,
    s: u64,
    conv: u64,
    inputs: u64,
}

/// Outputs of one step: conv output and delta output rows, in row order.
type StepOut = (Vec<f32>, Vec<f32>);

/// Runs one step on the GPU: the three kernels as the backend launches them, or with `fused`
/// the conv inside the delta kernel (gated_delta_conv_k<HK>, steps of at most RING rows).
fn gpu_step(
    g: &Gpu,
    p: &DeltaParams,
    d: &Dev,
    plans: &[SeqPlan],
    (x, ba): (&[f32], &[f32]),
    fused: bool,
) -> Result<StepOut> {
    let (cd, nv) = (p.conv_dim(), p.n_v_heads);
    let m = x.len() / cd;
    let words = plan_words(plans, plans.len())?;
    let (dx, dba, dplan) = (g.upload(x)?, g.upload(ba)?, g.upload(&words)?);
    let dy = g.upload(&vec![f32::NAN; m * cd])?;
    let dout = g.upload(&vec![f32::NAN; m * p.value_dim()])?;
    let n = plans.len() as u32;
    let conv = [
        Arg::Ptr(g.ptr(&dx)),
        Arg::Ptr(g.ptr(&dy)),
        Arg::Ptr(d.w),
        Arg::Ptr(d.conv),
        Arg::Ptr(g.ptr(&dplan)),
        Arg::U32(n),
        Arg::U32(cd as u32),
        Arg::U32(p.conv_kernel as u32),
    ];
    if !fused {
        let (blocks, threads) = conv1d_dims(cd);
        g.launch("conv1d_silu", (blocks as u32, n), threads, &conv)?;
    }
    let delta = [
        Arg::Ptr(g.ptr(&dy)),
        Arg::Ptr(g.ptr(&dba)),
        Arg::Ptr(d.a),
        Arg::Ptr(d.dt),
        Arg::Ptr(g.ptr(&dout)),
        Arg::Ptr(d.s),
        // The state is written back into its slot.
        Arg::Ptr(d.s),
        Arg::U32(1),
        Arg::Ptr(d.inputs),
        Arg::Ptr(g.ptr(&dplan)),
        Arg::U32(n),
        Arg::U32(p.n_k_heads as u32),
        Arg::U32(nv as u32),
        Arg::U32(p.head_v as u32),
    ];
    let tiles = (p.head_v.div_ceil(32) * nv) as u32;
    let threads = 32 * delta_warps(p.head_k);
    if fused {
        let with_conv = [&delta[..], &[conv[0], conv[2], conv[3], conv[7]]].concat();
        let name = format!("gated_delta_conv_k{}", p.head_k);
        g.launch(&name, (tiles, n), threads, &with_conv)?;
    } else {
        let name = format!("gated_delta_k{}", p.head_k);
        g.launch(&name, (tiles, n), threads, &delta)?;
    }
    let keep = [
        Arg::Ptr(g.ptr(&dy)),
        Arg::Ptr(g.ptr(&dba)),
        Arg::Ptr(d.inputs),
        Arg::Ptr(g.ptr(&dplan)),
        Arg::U32(n),
        Arg::U32(cd as u32),
        Arg::U32(nv as u32),
    ];
    let per = (RING * (cd + 2 * nv)).div_ceil(256) as u32;
    g.launch("keep_inputs", (per, n), 256, &keep)?;
    Ok((g.download(&dy)?, g.download(&dout)?))
}

/// The batch of `rows` (sequence, position) over one block table per sequence.
fn batch(rows: &[(usize, usize)], slots: &[u32]) -> StepBatch {
    StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: rows
            .iter()
            .map(|&(seq, pos)| StepRow {
                token: 0,
                pos: pos as u32,
                seq,
                want_logits: false,
            })
            .collect(),
        block_tables: vec![vec![0]; slots.len()],
        state_slots: slots.to_vec(),
    }
}

fn delta_shape(g: &Gpu, seed: u64, p: DeltaParams, out: &mut Vec<Case>) -> Result<()> {
    let (cd, nv) = (p.conv_dim(), p.n_v_heads);
    let shape = format!(
        "k-heads={} v-heads={} hk={} hv={} kernel={}",
        p.n_k_heads, nv, p.head_k, p.head_v, p.conv_kernel
    );
    let w = rand_vec(seed, 3000, cd * p.conv_kernel, 0.5);
    let a: Vec<f32> = rand_vec(seed, 3001, nv, 0.5)
        .iter()
        .map(|v| -1.0 - v)
        .collect();
    let dt = rand_vec(seed, 3002, nv, 0.5);
    let slot_floats = |per: usize| N_SLOTS * per;
    let bufs = [
        g.upload(&w)?,
        g.upload(&a)?,
        g.upload(&dt)?,
        g.zeros(slot_floats(nv * p.head_k * p.head_v))?,
        g.zeros(slot_floats(CONV_RING * cd))?,
        g.zeros(slot_floats(RING * (cd + 2 * nv)))?,
    ];
    let d = Dev {
        w: g.ptr(&bufs[0]),
        a: g.ptr(&bufs[1]),
        dt: g.ptr(&bufs[2]),
        s: g.ptr(&bufs[3]),
        conv: g.ptr(&bufs[4]),
        inputs: g.ptr(&bufs[5]),
    };
    // A second state (the same plans) whose steps of at most RING rows run the conv inside the
    // delta kernel: every step's outputs the bits of the three kernels.
    let fused_state = [
        g.zeros::<f32>(slot_floats(nv * p.head_k * p.head_v))?,
        g.zeros(slot_floats(CONV_RING * cd))?,
        g.zeros(slot_floats(RING * (cd + 2 * nv)))?,
    ];
    let df = Dev {
        s: g.ptr(&fused_state[0]),
        conv: g.ptr(&fused_state[1]),
        inputs: g.ptr(&fused_state[2]),
        ..d
    };
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let mut fused_differ = None;
    let mut cpu = DeltaLayer::new(p);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
    let pool = pool.map_err(|e| memra_engine::Error::Input(format!("thread pool: {e}")))?;
    let (mut book_g, mut book_c) = (StateBook::new(N_SLOTS), StateBook::new(N_SLOTS));
    // The GPU's output of every (sequence 0) position, last computation wins.
    let mut seq0: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; 64];
    let (mut worst_y, mut worst_o, mut problem) = (Vec::new(), Vec::new(), None);
    for (si, step) in STEPS.iter().enumerate() {
        // Rows interleaved across the sequences.
        let mut rows = Vec::new();
        let longest = step.iter().map(|s| s.2).max().unwrap_or(0);
        for i in 0..longest {
            for &(seq, first, n) in step.iter() {
                if i < n {
                    rows.push((seq, first + i));
                }
            }
        }
        let b = batch(&rows, &SLOTS);
        let (pg, pc) = (book_g.plan(&b)?, book_c.plan(&b)?);
        let (mut x, mut ba) = (Vec::new(), Vec::new());
        for &(seq, pos) in &rows {
            let (xr, br) = row_inputs(seed, &p, seq, pos);
            x.extend(xr);
            ba.extend(br);
        }
        let (gy, go) = gpu_step(g, &p, &d, &pg, (&x, &ba), false)?;
        let (fy, fo) = gpu_step(g, &p, &df, &pg, (&x, &ba), rows.len() <= RING)?;
        if !same(&fy, &gy) || !same(&fo, &go) {
            fused_differ.get_or_insert(si);
        }
        let mut cy = vec![0f32; x.len()];
        cpu.conv1d_silu(&pc, &w, &x, &mut cy);
        let mut co = vec![0f32; rows.len() * p.value_dim()];
        cpu.gated_delta(&pool, &pc, (&cy, &ba), (&a, &dt), &mut co);
        book_g.commit(&pg);
        book_c.commit(&pc);
        worst_y.push(compare("conv1d_silu", shape.clone(), &gy, &cy, DELTA_TOL));
        worst_o.push(compare("gated_delta", shape.clone(), &go, &co, DELTA_TOL));
        for (i, &(seq, pos)) in rows.iter().enumerate() {
            if seq == 0 {
                let y = gy[i * cd..(i + 1) * cd].to_vec();
                let o = go[i * p.value_dim()..(i + 1) * p.value_dim()].to_vec();
                seq0[pos] = Some((y, o));
            }
        }
        if pg != pc {
            problem.get_or_insert(format!("step {si}: the plans differ"));
        }
    }
    // Sequence 0 again, one position per step, in its own slot.
    let mut bits_differ = None;
    for (pos, want) in seq0.iter().enumerate() {
        let Some((wy, wo)) = want else { break };
        let b = batch(&[(0, pos)], &[RERUN_SLOT]);
        let pg = book_g.plan(&b)?;
        let (x, ba) = row_inputs(seed, &p, 0, pos);
        // One row a step: the conv inside the delta kernel.
        let (gy, go) = gpu_step(g, &p, &d, &pg, (&x, &ba), true)?;
        book_g.commit(&pg);
        if !same(&gy, wy) || !same(&go, wo) {
            bits_differ.get_or_insert(pos);
        }
    }
    out.extend(worst_y);
    out.extend(worst_o);
    out.push(Case {
        kernel: "delta invariance".into(),
        shape,
        rel_err: 0.0,
        tol: 0.0,
        problem: bits_differ
            .map(|p| format!("position {p}: one row per step gives other bits"))
            .or(fused_differ
                .map(|s| format!("step {s}: the conv inside the delta kernel gives other bits")))
            .or(problem),
    });
    Ok(())
}

fn sigmoid_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let (rows, width) = (5usize, 64usize);
    for gw in [1usize, 8, 64] {
        let x = rand_vec(seed, 3100, rows * width, 3.0);
        let gates = rand_vec(seed, 3101, rows * gw, 4.0);
        let (dx, dg) = (g.upload(&x)?, g.upload(&gates)?);
        g.sigmoid_mul(g.ptr(&dx), g.ptr(&dg), rows, width, gw)?;
        let mut want = x.clone();
        for (r, xr) in want.chunks_exact_mut(width).enumerate() {
            sigmoid_mul(xr, &gates[r * gw..(r + 1) * gw], width / gw);
        }
        let shape = format!("rows={rows} width={width} gates={gw}");
        out.push(compare(
            "sigmoid_mul",
            shape,
            &g.download(&dx)?,
            &want,
            1e-6,
        ));
    }
    Ok(())
}

/// RoPE over the first `2 * rot` values of each head (rope and rope_kv with an f32 cache).
fn partial_rope_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let (rows, heads, kv_heads, hd, rot) = (3usize, 4usize, 2usize, 64usize, 16usize);
    let rope = Rope::new(2 * rot, 1.0e6, None, None);
    let len = 64u32;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..len {
        let (c, s) = rope.cos_sin(p);
        cos.extend(c);
        sin.extend(s);
    }
    let pos: Vec<u32> = vec![0, 17, 63];
    let q = rand_vec(seed, 3200, rows * heads * hd, 1.0);
    let k = rand_vec(seed, 3201, rows * kv_heads * hd, 1.0);
    let v = rand_vec(seed, 3202, rows * kv_heads * hd, 1.0);
    let rotated = |x: &[f32], w: usize| {
        let mut y = x.to_vec();
        for (r, row) in y.chunks_exact_mut(w).enumerate() {
            let (c, s) = rope.cos_sin(pos[r]);
            ops::rope_apply(row, hd, &c, &s);
        }
        y
    };
    let (wq, wk) = (rotated(&q, heads * hd), rotated(&k, kv_heads * hd));
    let (dq, dp, dc, ds) = (
        g.upload(&q)?,
        g.upload(&pos)?,
        g.upload(&cos)?,
        g.upload(&sin)?,
    );
    let tables = (g.ptr(&dc), g.ptr(&ds), rot);
    g.rope(g.ptr(&dq), g.ptr(&dp), tables, rows, heads, hd)?;
    let shape = format!("rows={rows} heads={heads} hd={hd} rotated={}", 2 * rot);
    out.push(compare(
        "rope (partial)",
        shape.clone(),
        &g.download(&dq)?,
        &wq,
        1e-6,
    ));
    let width = kv_heads * hd;
    let (dq, dk, dv) = (g.upload(&q)?, g.upload(&k)?, g.upload(&v)?);
    let slot: Vec<u32> = vec![4, 0, 2];
    let ds2 = g.upload(&slot)?;
    let kv = KvDtype::F32;
    let rb = kv.row_bytes(width);
    let (kc, vc) = (g.zeros::<u8>(5 * rb)?, g.zeros::<u8>(5 * rb)?);
    g.rope_kv(&RopeKvArgs {
        q: g.ptr(&dq),
        k: g.ptr(&dk),
        v: g.ptr(&dv),
        pos: g.ptr(&dp).into(),
        cos: tables.0,
        sin: tables.1,
        k_cache: g.ptr(&kc),
        v_cache: g.ptr(&vc),
        slot: g.ptr(&ds2),
        rows,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        rot,
        kv,
        norm: None,
    })?;
    out.push(compare(
        "rope_kv (partial)",
        shape.clone(),
        &g.download(&dq)?,
        &wq,
        1e-6,
    ));
    let cache_f32 = |c: Vec<u8>| -> Vec<f32> {
        let mut rows_out = Vec::new();
        for &s in &slot {
            let row = &c[s as usize * rb..(s as usize + 1) * rb];
            rows_out.extend(
                row.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
        rows_out
    };
    let kshape = format!("{shape} K and V cached");
    let mut got = cache_f32(g.download(&kc)?);
    got.extend(cache_f32(g.download(&vc)?));
    let mut want = wk.clone();
    want.extend_from_slice(&v);
    out.push(compare("rope_kv (partial)", kshape, &got, &want, 1e-6));
    Ok(())
}

/// The `delta` group of `memra-verify kernels`.
pub fn delta_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    sigmoid_cases(g, seed, out)?;
    partial_rope_cases(g, seed, out)?;
    let tiny = DeltaParams {
        n_k_heads: 2,
        n_v_heads: 4,
        head_k: 16,
        head_v: 16,
        conv_kernel: 4,
    };
    // Qwen3-Next's head sizes, fewer heads; value heads wider than one warp's tile.
    let next = DeltaParams {
        n_k_heads: 2,
        n_v_heads: 4,
        head_k: 128,
        head_v: 96,
        conv_kernel: 4,
    };
    delta_shape(g, seed, tiny, out)?;
    delta_shape(g, seed, next, out)
}
