//! Sliding-window attention (Gemma 3's local layers) against the CPU backend's formula: a row at
//! `pos` sees positions `pos + 1 - window ..= pos`. A windowed launch runs attn_mma where it has
//! a kernel (head_dim 256 over f16 / bf16 caches too; the tensor-core tolerance then), else or
//! with `memra-verify kernels --attn-split` the CUDA-core split kernel, computes only the 64-position splits
//! the window touches and folds them from the first (attn_combine). Checked per KV format, head dims
//! 256 (Gemma 3 270M: 4 heads over 1 KV head) and 64, windows smaller and larger than the context:
//!
//! - decode-shaped launches: rows at positions around the window and split boundaries, each
//!   over its own sequence whose KV below the row's window is poisoned (NaN; 1e4 in a Q8_0
//!   cache, which cannot hold NaN) so a read of it shows;
//! - a prefill-shaped launch: consecutive positions of one sequence across split and window
//!   boundaries, poisoned below the lowest window;
//! - bitwise: one launch per row, the whole launch, the rows reversed (another batch) and a launch
//!   sized for a longer context (another grid and partial stride) give the same bits; a window
//!   covering every row's positions gives the bits of the unwindowed split kernel.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::{Gpu, attn_window_start};
use memra_engine::models::random::{splitmix, unit};

use crate::attention_check::{Shape, mma_tol, reference, store};
use crate::attention_rig::{Launch, Rig, poison};
use crate::case::same_bits;
use crate::case::{Case, compare};

/// The tolerance against the CPU of a windowed launch of shape `s` over `kv`: the split kernels'
/// (f32 throughout: FMA and another summation order only) or the tensor-core kernel's
/// (docs/VERIFY.md).
fn tol(g: &Gpu, s: &Shape, kv: KvDtype) -> f64 {
    let group = s.n_heads / s.n_kv_heads;
    mma_tol(g.uses_attn_mma(s.head_dim, group, Some(1), kv), kv)
}

const WINDOWS: [usize; 5] = [1, 5, 64, 100, 512];

/// Positions of the decode-shaped rows (those within the cache).
const DECODE_POS: [usize; 14] = [0, 1, 4, 5, 6, 63, 64, 65, 99, 100, 127, 128, 200, 319];

/// Positions per sequence in the caches.
const SEQ_LEN: usize = 320;

/// One sequence's KV as stored bytes, the values the CPU reads back, and its block table.
struct Kv {
    kb: Vec<u8>,
    vb: Vec<u8>,
    kc: Vec<f32>,
    vc: Vec<f32>,
    tables: Vec<Vec<u32>>,
}

/// One sequence of [`SEQ_LEN`] positions over permuted blocks per entry of `below`; sequence
/// i's positions below `below[i]` hold NaN (1e4 in Q8_0: it would read NaN back as 0).
fn caches(s: &Shape, kv: KvDtype, seed: u64, st: u64, below: &[usize]) -> Kv {
    let width = s.n_kv_heads * s.head_dim;
    let per_seq = SEQ_LEN / s.block_size;
    let blocks = per_seq * below.len();
    let mut perm: Vec<u32> = (0..blocks as u32).collect();
    for i in (1..perm.len()).rev() {
        let j = (splitmix(seed, st + 2, i as u64) % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    let tables: Vec<Vec<u32>> = perm.chunks(per_seq).map(|c| c.to_vec()).collect();
    let n = blocks * s.block_size * width;
    let mut k32: Vec<f32> = (0..n as u64).map(|i| unit(seed, st, i)).collect();
    let mut v32: Vec<f32> = (0..n as u64).map(|i| unit(seed, st + 1, i)).collect();
    for (table, &below) in tables.iter().zip(below) {
        poison(s, kv, table, width, (&mut k32, &mut v32), 0..below);
    }
    let ((kb, kc), (vb, vc)) = (store(kv, &k32, width), store(kv, &v32, width));
    Kv {
        kb,
        vb,
        kc,
        vc,
        tables,
    }
}

/// Rows `(sequence, pos)` with queries `q` in one launch sized for `ctx`, under `window`: the
/// output rows in the order of `rows` (every value written: the output starts as NaN).
fn run(
    rig: &Rig<'_>,
    rows: &[(u32, u32)],
    q: &[f32],
    ctx: usize,
    window: Option<usize>,
) -> Result<Vec<f32>> {
    let seq: Vec<u32> = rows.iter().map(|r| r.0).collect();
    let pos: Vec<u32> = rows.iter().map(|r| r.1).collect();
    rig.launch(&Launch {
        seq: &seq,
        pos: &pos,
        q,
        ctx,
        window,
        tile_tokens: 0,
        fold: None,
        spans: None,
    })
}

/// Each row alone (a launch per row, ctx = its own pos + 1).
fn alone(rig: &Rig<'_>, rows: &[(u32, u32)], q: &[f32], window: Option<usize>) -> Result<Vec<f32>> {
    let qd = rig.s.n_heads * rig.s.head_dim;
    let mut out = Vec::with_capacity(q.len());
    for (r, &row) in rows.iter().enumerate() {
        let ctx = row.1 as usize + 1;
        out.extend(run(rig, &[row], &q[r * qd..(r + 1) * qd], ctx, window)?);
    }
    Ok(out)
}

/// The CPU's output of `rows` under `window`.
fn want(s: &Shape, kv: &Kv, rows: &[(u32, u32)], q: &[f32], window: Option<usize>) -> Vec<f32> {
    let hd = s.head_dim;
    let mut out = vec![0f32; q.len()];
    for (r, &(seq, pos)) in rows.iter().enumerate() {
        let pos = pos as usize;
        let lo = attn_window_start(pos, window);
        for h in 0..s.n_heads {
            let o = (r * s.n_heads + h) * hd;
            let (qh, oh) = (&q[o..o + hd], &mut out[o..o + hd]);
            let table = &kv.tables[seq as usize];
            reference(s, &kv.kc, &kv.vc, table, (lo, pos), qh, h, oh);
        }
    }
    out
}

/// The heads of the windowed and image-span attention cases: Gemma 3's 256-wide heads with one
/// KV head, and 64-wide heads in groups of two.
pub(crate) const WINDOW_SHAPES: [Shape; 2] = [
    Shape {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        block_size: 16,
    },
    Shape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
    },
];

pub fn window_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for kv in KvDtype::ALL {
        for (si, s) in WINDOW_SHAPES.iter().enumerate() {
            for (wi, &w) in WINDOWS.iter().enumerate() {
                let st = 7000 + 100 * si as u64 + 10 * wi as u64;
                decode_case(g, seed, kv, s, w, st, out)?;
                prefill_case(g, seed, kv, s, w, st + 5, out)?;
            }
        }
    }
    Ok(())
}

/// Runs `f` over `kv`'s caches and tables uploaded (kept alive for the call).
fn with_rig<T>(
    g: &Gpu,
    s: &Shape,
    kvd: KvDtype,
    kv: &Kv,
    f: impl FnOnce(&Rig<'_>) -> Result<T>,
) -> Result<T> {
    let mut offs = Vec::with_capacity(kv.tables.len());
    let mut at = 0u32;
    for t in &kv.tables {
        offs.push(at);
        at += t.len() as u32;
    }
    let flat = kv.tables.concat();
    let (dk, dv) = (g.upload(&kv.kb)?, g.upload(&kv.vb)?);
    let (doff, dtab) = (g.upload(&offs)?, g.upload(&flat)?);
    f(&Rig {
        g,
        s,
        kv: kvd,
        dk: g.ptr(&dk),
        dv: g.ptr(&dv),
        doff: g.ptr(&doff),
        dtab: g.ptr(&dtab),
    })
}

fn queries(s: &Shape, rows: usize, seed: u64, st: u64) -> Vec<f32> {
    let qd = s.n_heads * s.head_dim;
    (0..(rows * qd) as u64).map(|i| unit(seed, st, i)).collect()
}

/// Rows at [`DECODE_POS`], each over its own sequence poisoned below its window.
fn decode_case(
    g: &Gpu,
    seed: u64,
    kvd: KvDtype,
    s: &Shape,
    w: usize,
    st: u64,
    out: &mut Vec<Case>,
) -> Result<()> {
    let rows: Vec<(u32, u32)> = DECODE_POS
        .iter()
        .enumerate()
        .map(|(i, &p)| (i as u32, p as u32))
        .collect();
    let below: Vec<usize> = rows
        .iter()
        .map(|r| attn_window_start(r.1 as usize, Some(w)))
        .collect();
    let kv = caches(s, kvd, seed, st, &below);
    let q = queries(s, rows.len(), seed, st + 3);
    let case = with_rig(g, s, kvd, &kv, |rig| decode_checks(rig, &kv, &rows, &q, w))?;
    out.push(case);
    Ok(())
}

/// The decode-shaped launches of [`decode_case`] and their checks.
fn decode_checks(rig: &Rig<'_>, kv: &Kv, rows: &[(u32, u32)], q: &[f32], w: usize) -> Result<Case> {
    let (g, s, kvd) = (rig.g, rig.s, rig.kv);
    let ctx = SEQ_LEN;
    let got = run(rig, rows, q, ctx, Some(w))?;
    let shape = format!(
        "kv={kvd} decode rows={} heads={}/{} hd={} window={w} ctx={ctx}",
        rows.len(),
        s.n_heads,
        s.n_kv_heads,
        s.head_dim
    );
    let mut case = compare(
        "attention (window)",
        shape,
        &got,
        &want(s, kv, rows, q, Some(w)),
        tol(g, s, kvd),
    );
    let mut bits = |what: &str, other: &[f32]| {
        if !same_bits(&got, other) && case.problem.is_none() {
            case.problem = Some(format!("rows differ between one launch and {what}"));
        }
    };
    bits("one launch per row", &alone(rig, rows, q, Some(w))?);
    // The rows reversed: another batch around each row.
    let qd = s.n_heads * s.head_dim;
    let rev_rows: Vec<(u32, u32)> = rows.iter().rev().copied().collect();
    let rev_q: Vec<f32> = q.chunks(qd).rev().flatten().copied().collect();
    let rev = run(rig, &rev_rows, &rev_q, ctx, Some(w))?;
    let unrev: Vec<f32> = rev.chunks(qd).rev().flatten().copied().collect();
    bits("the rows reversed", &unrev);
    // A launch sized for a longer context: more grid blocks, another partial stride.
    bits("a launch for ctx 8192", &run(rig, rows, q, 8192, Some(w))?);
    // A window over every row's whole past is the unwindowed kernel (when the launch without a
    // window runs the same family: both the split kernel, or both attn_mma).
    let group = s.n_heads / s.n_kv_heads;
    let same = g.uses_attn_mma(s.head_dim, group, Some(w), kvd)
        == g.uses_attn_mma(s.head_dim, group, None, kvd);
    if w >= ctx && same {
        bits("no window", &run(rig, rows, q, ctx, None)?);
    }
    Ok(case)
}

/// 21 consecutive positions of one sequence across the split boundary at 128 (and, for small
/// windows, their windows' starts across it too), poisoned below the lowest window.
fn prefill_case(
    g: &Gpu,
    seed: u64,
    kvd: KvDtype,
    s: &Shape,
    w: usize,
    st: u64,
    out: &mut Vec<Case>,
) -> Result<()> {
    let rows: Vec<(u32, u32)> = (120u32..=140).map(|p| (0, p)).collect();
    let below = attn_window_start(120, Some(w));
    let kv = caches(s, kvd, seed, st, &[below]);
    let q = queries(s, rows.len(), seed, st + 3);
    let (got, alone) = with_rig(g, s, kvd, &kv, |rig| {
        Ok((
            run(rig, &rows, &q, 141, Some(w))?,
            alone(rig, &rows, &q, Some(w))?,
        ))
    })?;
    let shape = format!(
        "kv={kvd} prefill rows=120..=140 heads={}/{} hd={} window={w}",
        s.n_heads, s.n_kv_heads, s.head_dim
    );
    let mut case = compare(
        "attention (window)",
        shape,
        &got,
        &want(s, &kv, &rows, &q, Some(w)),
        tol(g, s, kvd),
    );
    if !same_bits(&got, &alone) {
        case.problem = Some("rows differ between one launch and one launch per row".into());
    }
    out.push(case);
    Ok(())
}
