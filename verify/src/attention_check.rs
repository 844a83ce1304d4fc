//! The attention kernel against the CPU backend's formula (backend/cpu/attention.rs) on a random
//! paged cache in every KV format (the CPU reads the same stored values back): permuted block
//! tables, GQA, several sequences and depths in one launch.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::{AttnArgs, Gpu, attn_mma_kernel, attn_part_floats};
use memra_engine::models::random::{splitmix, unit};

use memra_engine::quant::dot_f32 as dot;

use crate::case::{Case, compare, same_bits};

pub(crate) struct Shape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

/// The CPU's attention for one (row, head) over positions `lo..=pos` (`lo` > 0: a sliding
/// window's start): scores, max, exp-sum, weighted V sum, in order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reference(
    s: &Shape,
    kc: &[f32],
    vc: &[f32],
    table: &[u32],
    (lo, pos): (usize, usize),
    q: &[f32],
    h: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let width = s.n_kv_heads * hd;
    let kvh = h / (s.n_heads / s.n_kv_heads);
    let scale = 1.0 / (hd as f32).sqrt();
    let at = |p: usize| {
        (table[p / s.block_size] as usize * s.block_size + p % s.block_size) * width + kvh * hd
    };
    let mut scores: Vec<f32> = (lo..=pos)
        .map(|p| dot(q, &kc[at(p)..at(p) + hd]) * scale)
        .collect();
    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        sum += *sc;
    }
    out.fill(0.0);
    for (p, &w) in (lo..=pos).zip(&scores) {
        for (o, &v) in out.iter_mut().zip(&vc[at(p)..at(p) + hd]) {
            *o += w * v;
        }
    }
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Error bound of the tensor-core kernel (Q, K, V and the softmax weights enter the mma as f16,
/// or bf16 over a bf16 cache; docs/VERIFY.md) and of the f32 split kernel (`--attn-split`,
/// other head dims), against the CPU reading the same cache.
fn tol_for(g: &Gpu, head_dim: usize, kv: KvDtype) -> f64 {
    mma_tol(uses_mma(g, head_dim), kv)
}

/// [`tol_for`] of a launch that runs the tensor-core kernel (`mma`) or not.
pub(crate) fn mma_tol(mma: bool, kv: KvDtype) -> f64 {
    if !mma {
        1e-5
    } else if kv == KvDtype::Bf16 {
        1.6e-2
    } else {
        4e-3
    }
}

pub(crate) fn uses_mma(g: &Gpu, head_dim: usize) -> bool {
    g.attn_kernel() == "attn_mma" && attn_mma_kernel(head_dim, KvDtype::F32, false).is_some()
}

/// A cache of rows of `width` values stored in format `kv`: its bytes and the values it reads
/// back as.
pub(crate) fn store(kv: KvDtype, vals: &[f32], width: usize) -> (Vec<u8>, Vec<f32>) {
    let rb = kv.row_bytes(width);
    let mut bytes = vec![0u8; vals.len() / width * rb];
    let mut back = vec![0f32; vals.len()];
    for ((row, b), o) in vals
        .chunks(width)
        .zip(bytes.chunks_mut(rb))
        .zip(back.chunks_mut(width))
    {
        kv.encode(row, b);
        kv.decode(b, width, 0..width, o);
    }
    (bytes, back)
}

/// One attention launch over rows of the uploaded arrays, into the output buffer of `base`.
struct Launch<'a> {
    g: &'a Gpu,
    base: AttnArgs,
    /// Floats per row of Q and of the output.
    qd: usize,
}

impl Launch<'_> {
    /// Rows `r0..r0 + rows` in one launch with `tile_tokens` tokens per tile (0: default), in
    /// mode `fold` (None: the default for the launch), with `pipe` = (staged K/V buffers,
    /// split-mode blocks in y) (0: the device's choice).
    fn run(
        &self,
        r0: usize,
        rows: usize,
        tile_tokens: usize,
        fold: Option<bool>,
        pipe: (usize, usize),
    ) -> Result<()> {
        let a = AttnArgs {
            q: self.base.q + (r0 * self.qd * 4) as u64,
            out: self.base.out + (r0 * self.qd * 4) as u64,
            pos: self.base.pos + (r0 * 4) as u64,
            row_seq: self.base.row_seq + (r0 * 4) as u64,
            rows,
            tile_tokens,
            fold,
            stages: pipe.0,
            grid_y: pipe.1,
            ..self.base
        };
        self.g.attention(&a)
    }
}

/// The whole launch at every tile size, in both modes of the tensor-core kernel (a partial per
/// split, or the splits folded in the kernel), with one and two staged K/V buffers and several
/// split-mode grids (each block a different range of splits), against `alone` (one launch per
/// row): bitwise.
fn tilings(
    l: &Launch<'_>,
    download: &dyn Fn() -> Result<Vec<f32>>,
    s: &Shape,
    rows: usize,
    alone: &[f32],
    case: &mut Case,
) -> Result<()> {
    let group = s.n_heads / s.n_kv_heads;
    let folds: &[bool] = if uses_mma(l.g, s.head_dim) {
        &[false, true]
    } else {
        &[false]
    };
    // (stages, grid y): the device's choice, then forced ones.
    let pipes = [(0, 0), (1, 0), (2, 1), (2, 3), (1, 7)];
    for tpt in 1..=(16 / group).max(1) {
        for &fold in folds {
            for (stages, grid_y) in pipes {
                if fold && grid_y > 0 {
                    continue; // fold mode has one block in y
                }
                l.g.fill(l.base.out, f32::NAN, rows * l.qd)?;
                l.run(0, rows, tpt, Some(fold), (stages, grid_y))?;
                let got = download()?;
                if !same_bits(alone, &got) && case.problem.is_none() {
                    let mode = if fold { "folded" } else { "split" };
                    case.problem = Some(format!(
                        "rows differ between one launch per row and {tpt} tokens per tile \
                         ({mode}, {stages} stages, grid y {grid_y})"
                    ));
                }
            }
        }
    }
    Ok(())
}

pub fn attention_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for kv in KvDtype::ALL {
        format_cases(g, seed, kv, out)?;
    }
    crate::attention_window_check::window_cases(g, seed, out)?;
    crate::attention_span_check::span_cases(g, seed, out)
}

fn format_cases(g: &Gpu, seed: u64, kv: KvDtype, out: &mut Vec<Case>) -> Result<()> {
    let shapes = [
        Shape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            block_size: 16,
        },
        Shape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            block_size: 16,
        },
        Shape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 128,
            block_size: 32,
        },
        Shape {
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 40,
            block_size: 8,
        },
    ];
    for (si, s) in shapes.iter().enumerate() {
        let width = s.n_kv_heads * s.head_dim;
        if kv.check_width(width).is_err() {
            continue;
        }
        let st = 2000 + 100 * si as u64;
        let blocks = 40usize;
        let cache = blocks * s.block_size * width;
        let k32: Vec<f32> = (0..cache as u64).map(|i| unit(seed, st, i)).collect();
        let v32: Vec<f32> = (0..cache as u64).map(|i| unit(seed, st + 1, i)).collect();
        let ((kb, kc), (vb, vc)) = (store(kv, &k32, width), store(kv, &v32, width));
        // Three sequences, each a permutation slice of the blocks.
        let mut perm: Vec<u32> = (0..blocks as u32).collect();
        for i in (1..perm.len()).rev() {
            let j = (splitmix(seed, st + 2, i as u64) % (i as u64 + 1)) as usize;
            perm.swap(i, j);
        }
        let per_seq = blocks / 3;
        let tables: Vec<Vec<u32>> = (0..3)
            .map(|i| perm[i * per_seq..(i + 1) * per_seq].to_vec())
            .collect();
        let max_pos = per_seq * s.block_size - 1;
        let rows = 11usize;
        let row_seq: Vec<u32> = (0..rows as u64)
            .map(|r| (splitmix(seed, st + 3, r) % 3) as u32)
            .collect();
        let mut pos: Vec<u32> = (0..rows as u64)
            .map(|r| (splitmix(seed, st + 4, r) % (max_pos as u64 + 1)) as u32)
            .collect();
        pos[0] = 0;
        pos[1] = max_pos as u32;
        let qd = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..(rows * qd) as u64)
            .map(|i| unit(seed, st + 5, i))
            .collect();
        let mut want = vec![0f32; rows * qd];
        for r in 0..rows {
            for h in 0..s.n_heads {
                let o = (r * s.n_heads + h) * s.head_dim;
                let table = &tables[row_seq[r] as usize];
                let (qh, oh) = (&q[o..o + s.head_dim], &mut want[o..o + s.head_dim]);
                reference(s, &kc, &vc, table, (0, pos[r] as usize), qh, h, oh);
            }
        }
        let flat: Vec<u32> = tables.concat();
        let offs: Vec<u32> = (0..3).map(|i| (i * per_seq) as u32).collect();
        let ctx = *pos.iter().max().unwrap_or(&0) as usize + 1;
        let (dq, dk, dv) = (g.upload(&q)?, g.upload(&kb)?, g.upload(&vb)?);
        let (dpos, dseq, doff, dtab) = (
            g.upload(&pos)?,
            g.upload(&row_seq)?,
            g.upload(&offs)?,
            g.upload(&flat)?,
        );
        let dout = g.zeros::<f32>(rows * qd)?;
        let dsc = g.zeros::<f32>(rows * s.n_heads * attn_part_floats(ctx, s.head_dim))?;
        g.fill(g.ptr(&dout), f32::NAN, rows * qd)?;
        let a = AttnArgs {
            q: g.ptr(&dq),
            out: g.ptr(&dout),
            k_cache: g.ptr(&dk),
            v_cache: g.ptr(&dv),
            kv,
            pos: g.ptr(&dpos),
            row_seq: g.ptr(&dseq),
            table_off: g.ptr(&doff),
            tables: g.ptr(&dtab),
            scores: g.ptr(&dsc),
            ctx,
            rows,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            block_size: s.block_size,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            prep: None,
            tile_tokens: 0,
            fold: None,
            stages: 0,
            grid_y: 0,
            window: None,
            spans: 0,
        };
        let launch = Launch { g, base: a, qd };
        launch.run(0, rows, 0, None, (0, 0))?;
        let got = g.download(&dout)?;
        let shape = format!(
            "kv={kv} rows={rows} heads={}/{} hd={} bs={} ctx={ctx}",
            s.n_heads, s.n_kv_heads, s.head_dim, s.block_size
        );
        let mut case = compare("attention", shape, &got, &want, tol_for(g, s.head_dim, kv));
        // Row invariance: every row alone, then every tiling of the whole launch.
        for r in 0..rows {
            launch.run(r, 1, 1, None, (0, 0))?;
        }
        let alone = g.download(&dout)?;
        if !same_bits(&alone, &got) {
            case.problem = Some("rows differ between one launch and one launch per row".into());
        }
        tilings(&launch, &|| g.download(&dout), s, rows, &alone, &mut case)?;
        if kv == KvDtype::F16 && uses_mma(g, s.head_dim) && case.problem.is_none() {
            // The tensor-core kernel rounds an f32 cache to f16 itself: the f16 cache of the
            // same values gives the same bits.
            let (fk, fv) = (
                g.upload(&store(KvDtype::F32, &k32, width).0)?,
                g.upload(&store(KvDtype::F32, &v32, width).0)?,
            );
            let f32_launch = Launch {
                g,
                base: AttnArgs {
                    k_cache: g.ptr(&fk),
                    v_cache: g.ptr(&fv),
                    kv: KvDtype::F32,
                    ..a
                },
                qd,
            };
            f32_launch.run(0, rows, 0, None, (0, 0))?;
            if !same_bits(&g.download(&dout)?, &got) {
                case.problem =
                    Some("an f16 cache and the f32 cache of the same values differ".into());
            }
        }
        out.push(case);
        prefill_case(g, &launch, &kc, &vc, &tables[0], s, max_pos, out)?;
    }
    Ok(())
}

/// A prefill-shaped launch: consecutive positions of one sequence (a tile's tokens share their
/// KV and differ in causal limits), against the CPU and bitwise against one launch per row.
#[allow(clippy::too_many_arguments)]
fn prefill_case(
    g: &Gpu,
    launch: &Launch<'_>,
    kc: &[f32],
    vc: &[f32],
    table: &[u32],
    s: &Shape,
    max_pos: usize,
    out: &mut Vec<Case>,
) -> Result<()> {
    let rows = 21usize;
    let start = max_pos + 1 - rows;
    let qd = launch.qd;
    let pos: Vec<u32> = (start..=max_pos).map(|p| p as u32).collect();
    let seq = vec![0u32; rows];
    let q: Vec<f32> = (0..(rows * qd) as u64)
        .map(|i| unit(7, 9000 + s.head_dim as u64, i))
        .collect();
    let mut want = vec![0f32; rows * qd];
    for (r, &p) in pos.iter().enumerate() {
        for h in 0..s.n_heads {
            let o = (r * s.n_heads + h) * s.head_dim;
            let (qh, oh) = (&q[o..o + s.head_dim], &mut want[o..o + s.head_dim]);
            reference(s, kc, vc, table, (0, p as usize), qh, h, oh);
        }
    }
    let (dq, dpos, dseq) = (g.upload(&q)?, g.upload(&pos)?, g.upload(&seq)?);
    let dout = g.zeros::<f32>(rows * qd)?;
    let per_row = s.n_heads * attn_part_floats(launch.base.ctx, s.head_dim);
    let dsc = g.zeros::<f32>(rows * per_row)?;
    let l = Launch {
        g,
        base: AttnArgs {
            q: g.ptr(&dq),
            out: g.ptr(&dout),
            pos: g.ptr(&dpos),
            row_seq: g.ptr(&dseq),
            scores: g.ptr(&dsc),
            ..launch.base
        },
        qd,
    };
    for r in 0..rows {
        l.run(r, 1, 1, None, (0, 0))?;
    }
    let alone = g.download(&dout)?;
    let kv = launch.base.kv;
    let shape = format!(
        "kv={kv} prefill rows={rows} at {start}.. heads={}/{} hd={}",
        s.n_heads, s.n_kv_heads, s.head_dim
    );
    let mut case = compare(
        "attention",
        shape,
        &alone,
        &want,
        tol_for(g, s.head_dim, kv),
    );
    tilings(&l, &|| g.download(&dout), s, rows, &alone, &mut case)?;
    out.push(case);
    Ok(())
}
