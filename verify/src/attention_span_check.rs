//! Image spans (Gemma 3's bidirectional attention within an image, engine/src/backend/spans.rs)
//! against the CPU backend's formula: a row of an image sees `attn_range(pos, window, image)`,
//! the union of its causal (windowed) positions and its whole image; a text row sees its causal
//! ones. One prefill-shaped launch of one sequence, rows at positions 100..=160 (across the
//! 64-position split at 128) with two images: 90..112 (starting before the launch's first row,
//! as after a prefix-cache hit ending inside an image) and 120..150 (across the split), per KV
//! format, head dims 256 (4 heads over 1 KV head, Gemma 3 270M) and 64 (4 over 2), no window
//! and windows 5 and 512. The KV below every row's range and past the launch's last row is
//! poisoned (NaN; 1e4 in Q8_0) and the partials pre-filled with NaN, so a read shows.
//!
//! Bitwise: every row alone (a launch per row sized for its own range), every tile size and
//! both modes of the tensor-core kernel, and a launch sized for 8,192 positions give the
//! launch's bits; the text rows give the bits of the same launch without spans (the null
//! `spans` of every text-only step), and a launch whose every row has the one-position span
//! `(pos, pos + 1)` gives the bits of the launch without spans.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::{Gpu, attn_mma_kernel};
use memra_engine::backend::spans::attn_range;
use memra_engine::models::random::unit;

use crate::attention_check::{Shape, mma_tol, reference, store};
use crate::attention_rig::{Launch, Rig, poison};
use crate::attention_window_check::WINDOW_SHAPES;
use crate::case::same_bits;
use crate::case::{Case, compare};

/// The launch's rows (positions of sequence 0) and images.
const FIRST: usize = 100;
const LAST: usize = 160;
const IMAGES: [(usize, usize); 2] = [(90, 112), (120, 150)];
/// Positions in the cache (the poisoned ones past LAST included).
const SEQ_LEN: usize = 192;

/// Per row, its image or `(pos, pos + 1)`.
fn spans_of(pos: usize) -> (usize, usize) {
    IMAGES
        .iter()
        .copied()
        .find(|&(a, b)| (a..b).contains(&pos))
        .unwrap_or((pos, pos + 1))
}

fn is_image(pos: usize) -> bool {
    IMAGES.iter().any(|&(a, b)| (a..b).contains(&pos))
}

/// How a launch is run.
#[derive(Clone, Copy)]
struct How {
    ctx: usize,
    tile_tokens: usize,
    fold: Option<bool>,
    /// Pass the rows' span pairs (else a null `spans`).
    spans: bool,
    /// Every row's pair `(pos, pos + 1)` instead of its image.
    one_each: bool,
}

/// Rows at `pos` (sequence 0) with queries `q` in one launch under `window`.
fn run(
    rig: &Rig<'_>,
    pos: &[usize],
    q: &[f32],
    window: Option<usize>,
    how: How,
) -> Result<Vec<f32>> {
    let p32: Vec<u32> = pos.iter().map(|&p| p as u32).collect();
    let sp: Vec<u32> = pos
        .iter()
        .flat_map(|&p| {
            let (a, b) = if how.one_each {
                (p, p + 1)
            } else {
                spans_of(p)
            };
            [a as u32, b as u32]
        })
        .collect();
    let seq = vec![0u32; pos.len()];
    rig.launch(&Launch {
        seq: &seq,
        pos: &p32,
        q,
        ctx: how.ctx,
        window,
        tile_tokens: how.tile_tokens,
        fold: how.fold,
        spans: how.spans.then_some(&sp[..]),
    })
}

pub fn span_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for kv in KvDtype::ALL {
        for (si, s) in WINDOW_SHAPES.iter().enumerate() {
            for (wi, w) in [None, Some(5), Some(512)].into_iter().enumerate() {
                let st = 8000 + 100 * si as u64 + 10 * wi as u64;
                out.push(case(g, seed, kv, s, w, st)?);
            }
        }
    }
    Ok(())
}

fn case(g: &Gpu, seed: u64, kv: KvDtype, s: &Shape, w: Option<usize>, st: u64) -> Result<Case> {
    let width = s.n_kv_heads * s.head_dim;
    let pos: Vec<usize> = (FIRST..=LAST).collect();
    let lowest = pos
        .iter()
        .map(|&p| attn_range(p, w, Some(&(spans_of(p).0..spans_of(p).1))).start)
        .min()
        .unwrap_or(0);
    // One sequence over permuted blocks; positions below every row's range and past LAST poisoned.
    let blocks = SEQ_LEN / s.block_size;
    let table: Vec<u32> = (0..blocks as u32)
        .map(|b| (b * 7 + 3) % blocks as u32)
        .collect();
    let n = blocks * s.block_size * width;
    let mut k32: Vec<f32> = (0..n as u64).map(|i| unit(seed, st, i)).collect();
    let mut v32: Vec<f32> = (0..n as u64).map(|i| unit(seed, st + 1, i)).collect();
    let poisoned = (0..lowest).chain(LAST + 1..SEQ_LEN);
    poison(s, kv, &table, width, (&mut k32, &mut v32), poisoned);
    let ((kb, kc), (vb, vc)) = (store(kv, &k32, width), store(kv, &v32, width));
    let qd = s.n_heads * s.head_dim;
    let q: Vec<f32> = (0..(pos.len() * qd) as u64)
        .map(|i| unit(seed, st + 3, i))
        .collect();
    // The CPU: each row over its range.
    let mut want = vec![0f32; q.len()];
    for (r, &p) in pos.iter().enumerate() {
        let (a, b) = spans_of(p);
        let range = attn_range(p, w, Some(&(a..b)));
        for h in 0..s.n_heads {
            let o = (r * s.n_heads + h) * s.head_dim;
            let (qh, oh) = (&q[o..o + s.head_dim], &mut want[o..o + s.head_dim]);
            reference(s, &kc, &vc, &table, (range.start, range.end - 1), qh, h, oh);
        }
    }
    let (dk, dv) = (g.upload(&kb)?, g.upload(&vb)?);
    let (doff, dtab) = (g.upload(&[0u32])?, g.upload(&table)?);
    let rig = Rig {
        g,
        s,
        kv,
        dk: g.ptr(&dk),
        dv: g.ptr(&dv),
        doff: g.ptr(&doff),
        dtab: g.ptr(&dtab),
    };
    let how = How {
        ctx: LAST + 1,
        tile_tokens: 0,
        fold: None,
        spans: true,
        one_each: false,
    };
    let got = run(&rig, &pos, &q, w, how)?;
    let group = s.n_heads / s.n_kv_heads;
    let mma = g.uses_attn_mma(s.head_dim, group, w, kv);
    let shape = format!(
        "kv={kv} rows={FIRST}..={LAST} images {IMAGES:?} heads={}/{} hd={} window={w:?}",
        s.n_heads, s.n_kv_heads, s.head_dim
    );
    let mut case = compare("attention (image)", shape, &got, &want, mma_tol(mma, kv));
    let mut bits = |what: &str, other: &[f32], rows: &dyn Fn(usize) -> bool| {
        let differs = pos
            .iter()
            .enumerate()
            .filter(|&(_, &p)| rows(p))
            .any(|(r, _)| !same_bits(&got[r * qd..(r + 1) * qd], &other[r * qd..(r + 1) * qd]));
        if differs && case.problem.is_none() {
            case.problem = Some(format!("rows differ between one launch and {what}"));
        }
    };
    // Each row alone, its launch sized for its own range.
    let mut alone = Vec::with_capacity(q.len());
    for (r, &p) in pos.iter().enumerate() {
        let ctx = spans_of(p).1.max(p + 1);
        let one = How { ctx, ..how };
        alone.extend(run(&rig, &[p], &q[r * qd..(r + 1) * qd], w, one)?);
    }
    bits("one launch per row", &alone, &|_| true);
    let long = How { ctx: 8192, ..how };
    bits(
        "a launch for ctx 8192",
        &run(&rig, &pos, &q, w, long)?,
        &|_| true,
    );
    // Fold mode where the launch has a fold kernel (none for head_dim 256).
    let folds: &[bool] = match mma && attn_mma_kernel(s.head_dim, kv, true).is_some() {
        true => &[false, true],
        false => &[false],
    };
    for tpt in 1..=(16 / group).max(1) {
        for &fold in folds {
            let t = How {
                tile_tokens: tpt,
                fold: Some(fold),
                ..how
            };
            let what = format!("{tpt} tokens per tile (folded {fold})");
            bits(&what, &run(&rig, &pos, &q, w, t)?, &|_| true);
        }
    }
    // The text rows without spans (a null pointer: the text-only path).
    let plain = How {
        spans: false,
        ..how
    };
    let none = run(&rig, &pos, &q, w, plain)?;
    bits("the launch without spans (text rows)", &none, &|p| {
        !is_image(p)
    });
    // One-position spans everywhere: the launch without spans, every row.
    let one_each = How {
        one_each: true,
        ..how
    };
    let ones = run(&rig, &pos, &q, w, one_each)?;
    if !same_bits(&ones, &none) && case.problem.is_none() {
        case.problem = Some("one-position spans differ from no spans".into());
    }
    Ok(case)
}
