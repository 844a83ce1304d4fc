//! `memra-verify kernels`, token selection: `argmax_rows` edge cases, `penalize_row` bits,
//! `topk_row` candidate lists, `topk_rows` / `argmax_at` (many rows in one launch) against the
//! single-row kernels word for word, and `select_rows` (the backend's device selection) against
//! `sampling::sample` for many (seed, position, parameters) on random logits with ties, NaN,
//! infinities and signed zeros; `mask_rows` against `apply_mask` and `select_rows` on
//! grammar-constrained rows against `sampling::sample_masked` (random, one-token, past-the-top-k
//! and nothing-usable masks). A token that differs is a failure (tolerance 0).

use memra_engine::Result;
use memra_engine::backend::SelectParams;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::select::{
    SelectPlan, mask_words, pack_masks, plan, plan_row, select_rows,
};
use memra_engine::models::random::{splitmix, unit};
use memra_engine::sampling::{
    SamplingParams, apply_mask, apply_penalties, argmax, sample, sample_masked,
};

use crate::case::{Case, compare};

/// Random logits of `width`: coarse values (many exact ties), with NaN, +-inf and +-0 planted
/// when `specials`.
fn logits(seed: u64, s: u64, width: usize, specials: bool) -> Vec<f32> {
    let mut v: Vec<f32> = (0..width as u64)
        .map(|i| (unit(seed, s, i) * 40.0).round() / 4.0)
        .collect();
    if specials {
        for (j, x) in [
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            0.0,
            -0.0,
            0.0,
            -0.0,
        ]
        .into_iter()
        .enumerate()
        {
            let i = (splitmix(seed, s + 1, j as u64) % width as u64) as usize;
            if let Some(slot) = v.get_mut(i) {
                *slot = x;
            }
        }
    }
    v
}

fn history(seed: u64, s: u64, width: usize, n: usize) -> Vec<u32> {
    // Few distinct ids so counts exceed 1; one id beyond the vocabulary (ignored by both).
    let mut h: Vec<u32> = (0..n as u64)
        .map(|i| (splitmix(seed, s, i) % (width as u64).min(50)) as u32)
        .collect();
    h.push(width as u32 + 3);
    h
}

fn argmax_edges(g: &Gpu, out: &mut Vec<Case>) -> Result<()> {
    let rows: Vec<Vec<f32>> = vec![
        vec![f32::NAN, f32::NEG_INFINITY, 1.0],
        vec![f32::NAN, f32::NEG_INFINITY],
        vec![f32::NEG_INFINITY; 300],
        vec![f32::NAN; 300],
        vec![0.0, -0.0, -1.0],
        vec![-0.0, 0.0, -1.0],
        vec![1.0, f32::INFINITY, f32::NAN, f32::INFINITY],
    ];
    for r in rows {
        let want = argmax(&r) as f32;
        let (dx, di) = (g.upload(&r)?, g.zeros::<u32>(1)?);
        g.argmax_rows(g.ptr(&dx), g.ptr(&di), 1, r.len())?;
        let got = g
            .download(&di)?
            .first()
            .map(|&v| v as f32)
            .unwrap_or(f32::NAN);
        out.push(compare(
            "argmax_rows (edges)",
            format!("{r:?}").chars().take(60).collect(),
            &[got],
            &[want],
            0.0,
        ));
    }
    Ok(())
}

fn penalize_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, width) in [97usize, 49_152].into_iter().enumerate() {
        let x = logits(seed, 2000 + i as u64, width, true);
        let h = history(seed, 2100 + i as u64, width, 200);
        let p = SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            frequency_penalty: 0.15,
            ..Default::default()
        };
        let mut want = x.clone();
        apply_penalties(&mut want, &h, &p);
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for &t in &h {
            *counts.entry(t).or_default() += 1;
        }
        let toks: Vec<u32> = counts.keys().copied().collect();
        let cnts: Vec<u32> = counts.values().copied().collect();
        let (dx, dt, dc) = (g.upload(&x)?, g.upload(&toks)?, g.upload(&cnts)?);
        g.penalize_row(g.ptr(&dx), g.ptr(&dt), g.ptr(&dc), toks.len(), width, &p)?;
        let got = g.download(&dx)?;
        let mut c = compare("penalize_row", format!("width={width}"), &got, &want, 0.0);
        let bits_same = got
            .iter()
            .zip(&want)
            // NaN payloads may differ between the host and the device; NaN never wins a selection.
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        if !bits_same && c.problem.is_none() {
            c.problem = Some("bits differ from apply_penalties".into());
        }
        out.push(c);
    }
    Ok(())
}

/// The host's candidate order: (id, logit) by logit/temperature (total order) descending, id
/// ascending, NaN excluded, first k.
fn host_candidates(x: &[f32], t: f32, k: usize) -> Vec<(u32, f32)> {
    let mut c: Vec<(u32, f32, f32)> = x
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v / t, v))
        .collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    c.truncate(k);
    c.into_iter().map(|(i, _, v)| (i, v)).collect()
}

fn topk_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let shapes = [
        (97, 97, 0.7f32),
        (1000, 5, 1.0),
        (49_152, 40, 0.8),
        (151_936, 1024, 1.3),
    ];
    for (i, (width, k, t)) in shapes.into_iter().enumerate() {
        let x = logits(seed, 2200 + i as u64, width, true);
        let want = host_candidates(&x, t, k);
        let kmax = k.max(1);
        let dx = g.upload(&x)?;
        let dout = g.zeros::<u32>(1 + 2 * kmax)?;
        g.topk_row(g.ptr(&dx), width, t, k, kmax, g.ptr(&dout))?;
        let o = g.download(&dout)?;
        let n = o.first().copied().unwrap_or(0) as usize;
        let got_ids: Vec<f32> = (0..n)
            .map(|j| o.get(1 + j).copied().unwrap_or(0) as f32)
            .collect();
        let want_ids: Vec<f32> = want.iter().map(|c| c.0 as f32).collect();
        let mut c = compare(
            "topk_row",
            format!("width={width} k={k} T={t}"),
            &got_ids,
            &want_ids,
            0.0,
        );
        let vals_ok = want
            .iter()
            .enumerate()
            .all(|(j, w)| o.get(1 + kmax + j).copied() == Some(w.1.to_bits()));
        if c.problem.is_none() && !vals_ok {
            c.problem = Some("candidate logits differ".into());
        }
        out.push(c);
    }
    Ok(())
}

/// `topk_rows` and `argmax_at` (a step's rows in one launch, one block each) against
/// `topk_row` and `argmax_rows` run row by row: the same words, bit for bit, for rows taken out
/// of order with different k and temperatures (a verify step's K + 1 rows, or a batch's).
fn batched_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (wi, width) in [97usize, 49_152, 151_936].into_iter().enumerate() {
        let n = 9;
        let flat: Vec<f32> = (0..n)
            .flat_map(|r| logits(seed, 2400 + (wi * 16 + r) as u64, width, r % 3 == 0))
            .collect();
        let dx = g.upload(&flat)?;
        let at = |r: usize| g.ptr(&dx) + (r * width * 4) as u64;
        // Entries: rows in a scrambled order, k from 1 to 64, four temperatures.
        let entries: Vec<(usize, usize, f32)> = (0..n)
            .map(|j| {
                let r = (j * 4 + 3) % n;
                let k = [1usize, 40, 7, 64, 40, 2, 40, 13, 40][j];
                (r, k.min(width), [0.8f32, 1.0, 0.3, 1.7][j % 4])
            })
            .collect();
        let kmax = entries.iter().map(|e| e.1).max().unwrap_or(1);
        let stride = 1 + 2 * kmax;
        let desc = g.upload(&memra_engine::backend::cuda::select::topk_desc(
            &entries, kmax,
        )?)?;
        let dout = g.zeros::<u32>(n * stride)?;
        g.topk_rows(g.ptr(&dx), g.ptr(&desc), n, width, kmax, g.ptr(&dout))?;
        let got = g.download(&dout)?;
        let mut want = vec![0u32; n * stride];
        for (j, &(r, k, t)) in entries.iter().enumerate() {
            let one = g.zeros::<u32>(stride)?;
            g.topk_row(at(r), width, t, k, kmax, g.ptr(&one))?;
            want[j * stride..(j + 1) * stride].copy_from_slice(&g.download(&one)?);
        }
        out.push(words_case("topk_rows", width, &got, &want));
        // Greedy: the same rows scrambled, every other entry's token two slots apart.
        let rows: Vec<u32> = entries.iter().map(|e| e.0 as u32).collect();
        let drows = g.upload(&rows)?;
        let dout = g.zeros::<u32>(2 * n)?;
        g.argmax_at(g.ptr(&dx), g.ptr(&drows), n, width, 2, g.ptr(&dout))?;
        let got = g.download(&dout)?;
        let mut want = vec![0u32; 2 * n];
        for (j, &r) in rows.iter().enumerate() {
            let one = g.zeros::<u32>(1)?;
            g.argmax_rows(at(r as usize), g.ptr(&one), 1, width)?;
            want[2 * j] = g.download(&one)?.first().copied().unwrap_or(u32::MAX);
        }
        out.push(words_case("argmax_at", width, &got, &want));
    }
    Ok(())
}

/// A case comparing two lists of u32 words exactly.
fn words_case(name: &str, width: usize, got: &[u32], want: &[u32]) -> Case {
    let f = |v: &[u32]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let mut c = compare(name, format!("width={width}"), &f(got), &f(want), 0.0);
    if c.problem.is_none() && got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        c.problem = Some(format!(
            "word {i}: {:#x}, single-row kernel {:#x}",
            got[i], want[i]
        ));
    }
    c
}

/// The parameter grid of the selection check.
fn param_grid(seed: u64) -> Vec<SamplingParams> {
    let mut v = Vec::new();
    let mut n = 0u64;
    for temperature in [0.0f32, 0.7, 1.0, 1.6] {
        for top_k in [0usize, 1, 7, 40, 1024, 2000] {
            for (top_p, min_p) in [(1.0f32, 0.0f32), (0.9, 0.0), (0.5, 0.05), (1.0, 0.1)] {
                for pen in [false, true] {
                    n += 1;
                    v.push(SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        repetition_penalty: if pen { 1.2 } else { 1.0 },
                        presence_penalty: if pen { 0.3 } else { 0.0 },
                        frequency_penalty: if pen { 0.1 } else { 0.0 },
                        seed: splitmix(seed, 2300, n),
                    });
                }
            }
        }
    }
    v
}

/// One launch's rows: parameters, histories and (optional) masks by row, positions from
/// (seed, s).
fn launch_rows<'a>(
    chunk: &'a [SamplingParams],
    hs: &'a [Vec<u32>],
    seed: u64,
    s: u64,
    masks: Option<&'a [Option<Vec<u32>>]>,
) -> Vec<(usize, SelectParams<'a>)> {
    chunk
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let params = SelectParams {
                params: p,
                history: &hs[r],
                pos: splitmix(seed, s, r as u64) % 100_000,
                mask: masks.and_then(|m| m[r].as_deref()),
            };
            (r, params)
        })
        .collect()
}

fn select_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let grid = param_grid(seed);
    for (wi, width) in [97usize, 1000, 49_152, 151_936].into_iter().enumerate() {
        // Rows of one launch share a buffer: 4 rows, each a different parameter set.
        let n_rows = 4;
        let (mut dev_greedy, mut dev_topk, mut host_plan) = (0usize, 0usize, 0usize);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (ci, chunk) in grid.chunks(n_rows).enumerate() {
            let s = 3000 + (wi * 1000 + ci) as u64;
            let xs: Vec<Vec<f32>> = (0..chunk.len())
                .map(|r| logits(seed, s * 8 + r as u64, width, r % 2 == 0))
                .collect();
            let hs: Vec<Vec<u32>> = (0..chunk.len())
                .map(|r| history(seed, s * 8 + 4 + r as u64, width, 30))
                .collect();
            let flat: Vec<f32> = xs.iter().flatten().copied().collect();
            let dx = g.upload(&flat)?;
            let rows = launch_rows(chunk, &hs, seed, s, None);
            let picked = select_rows(g, g.ptr(&dx), width, &rows)?;
            for (r, p) in chunk.iter().enumerate() {
                match plan(p, width) {
                    SelectPlan::Greedy => dev_greedy += 1,
                    SelectPlan::TopK(_) => dev_topk += 1,
                    SelectPlan::Host => {
                        host_plan += 1;
                        continue;
                    }
                }
                let w = sample(&xs[r], &hs[r], p, rows[r].1.pos);
                want.push(w as f32);
                got.push(picked.get(r).copied().flatten().map_or(-1.0, |t| t as f32));
            }
        }
        out.push(compare(
            "select_rows",
            format!(
                "width={width}: {dev_greedy} greedy + {dev_topk} top-k on device, {host_plan} host-planned"
            ),
            &got,
            &want,
            0.0,
        ));
    }
    Ok(())
}

/// A grammar mask of kind `kind` for `x` (`width` logits): 0 random dense, 1 random sparse
/// (about 1 in 8 allowed), 2 one token, 3 only tokens past the unmasked top-`k` (for the
/// temperature `t`), 4 only tokens whose logits are NaN or -inf (plus none when there are none:
/// `sample_masked`'s lowest-allowed-id rule), 5 a short mask (the last words missing) with
/// bits set past the vocabulary in a longer one.
fn mask_of(kind: usize, seed: u64, s: u64, x: &[f32], t: f32, k: usize) -> Vec<u32> {
    let width = x.len();
    let words = width.div_ceil(32);
    let rnd = |w: usize| splitmix(seed, s, w as u64) as u32;
    match kind {
        0 => (0..words).map(rnd).collect(),
        1 => (0..words)
            .map(|w| rnd(w) & (rnd(w) >> 11) & (rnd(w) >> 22))
            .collect(),
        2 => {
            let i = (splitmix(seed, s, 1 << 40) % width as u64) as usize;
            let mut m = vec![0u32; words];
            m[i / 32] |= 1 << (i % 32);
            m
        }
        3 => {
            let mut m = vec![u32::MAX; words + 1];
            for (i, _) in host_candidates(x, t.max(1e-3), k.max(40)) {
                m[i as usize / 32] &= !(1 << (i % 32));
            }
            m
        }
        4 => {
            let mut m = vec![0u32; words];
            for (i, v) in x.iter().enumerate() {
                if v.is_nan() || *v == f32::NEG_INFINITY {
                    m[i / 32] |= 1 << (i % 32);
                }
            }
            m
        }
        _ => (0..words / 2).map(|w| rnd(w) | 1).collect(),
    }
}

/// `select_rows` on grammar-constrained rows (`mask_rows` before the penalties, then the same
/// argmax / top-k kernels) against the host's `sample_masked`: every mask kind of [`mask_of`],
/// greedy and seeded sampling with and without penalties, masked and unmasked rows in one call.
fn masked_select_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let grid: Vec<SamplingParams> = param_grid(seed).into_iter().step_by(3).collect();
    for (wi, width) in [97usize, 1000, 49_152, 151_936].into_iter().enumerate() {
        let n_rows = 6;
        let (mut on_device, mut host_plan) = (0usize, 0usize);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (ci, chunk) in grid.chunks(n_rows).enumerate() {
            let s = 7000 + (wi * 1000 + ci) as u64;
            let xs: Vec<Vec<f32>> = (0..chunk.len())
                .map(|r| logits(seed, s * 8 + r as u64, width, r % 2 == 0))
                .collect();
            let hs: Vec<Vec<u32>> = (0..chunk.len())
                .map(|r| history(seed, s * 8 + 4 + r as u64, width, 30))
                .collect();
            // Row r of the chunk gets mask kind (ci + r) % 6; every 7th row none.
            let masks: Vec<Option<Vec<u32>>> = chunk
                .iter()
                .enumerate()
                .map(|(r, p)| {
                    ((ci * n_rows + r) % 7 != 6).then(|| {
                        mask_of(
                            (ci + r) % 6,
                            seed,
                            s * 16 + r as u64,
                            &xs[r],
                            p.temperature,
                            p.top_k,
                        )
                    })
                })
                .collect();
            let flat: Vec<f32> = xs.iter().flatten().copied().collect();
            let dx = g.upload(&flat)?;
            let rows = launch_rows(chunk, &hs, seed, s, Some(&masks));
            let picked = select_rows(g, g.ptr(&dx), width, &rows)?;
            for (r, (_, sp)) in rows.iter().enumerate() {
                if plan_row(sp, width) == SelectPlan::Host {
                    host_plan += 1;
                    continue;
                }
                on_device += 1;
                let w = match &masks[r] {
                    Some(m) => sample_masked(&xs[r], &hs[r], &chunk[r], rows[r].1.pos, m),
                    None => sample(&xs[r], &hs[r], &chunk[r], rows[r].1.pos),
                };
                want.push(w as f32);
                got.push(picked.get(r).copied().flatten().map_or(-1.0, |t| t as f32));
            }
        }
        out.push(compare(
            "select_rows (grammar masks)",
            format!("width={width}: {on_device} on device, {host_plan} host-planned"),
            &got,
            &want,
            0.0,
        ));
    }
    Ok(())
}

/// `mask_rows` alone against `apply_mask`: the masked rows' bits, the rows without a mask
/// untouched, the live flags.
fn mask_rows_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (wi, width) in [33usize, 1000, 151_936].into_iter().enumerate() {
        let rows = 7;
        let xs: Vec<Vec<f32>> = (0..rows)
            .map(|r| logits(seed, 8000 + (wi * 10 + r) as u64, width, true))
            .collect();
        let masks: Vec<Vec<u32>> = (0..6)
            .map(|k| mask_of(k, seed, 8100 + (wi * 10 + k) as u64, &xs[k], 1.0, 40))
            .collect();
        // Rows 0..6 masked in reverse order; row 6 has no mask.
        let list: Vec<(usize, &[u32])> = (0..6).rev().map(|r| (r, masks[r].as_slice())).collect();
        let packed = pack_masks(&list, width)?;
        let flat: Vec<f32> = xs.iter().flatten().copied().collect();
        let (dx, dp, dl) = (g.upload(&flat)?, g.upload(&packed)?, g.zeros::<u32>(6)?);
        let words = mask_words(width);
        g.mask_rows(g.ptr(&dx), g.ptr(&dp), 6, width, words, g.ptr(&dl))?;
        let got = g.download(&dx)?;
        let live = g.download(&dl)?;
        let mut want = flat.clone();
        let mut want_live = Vec::new();
        for (r, m) in &list {
            let row = &mut want[r * width..(r + 1) * width];
            apply_mask(row, m);
            want_live.push(row.iter().any(|v| !v.is_nan() && *v != f32::NEG_INFINITY) as u32);
        }
        let mut c = compare("mask_rows", format!("width={width}"), &got, &want, 0.0);
        let bits_same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        if c.problem.is_none() && !bits_same {
            c.problem = Some("bits differ from apply_mask".into());
        }
        if c.problem.is_none() && live != want_live {
            c.problem = Some(format!("live flags {live:?}, want {want_live:?}"));
        }
        out.push(c);
    }
    Ok(())
}

/// Every selection check.
pub fn select_kernel_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    argmax_edges(g, out)?;
    penalize_cases(g, seed, out)?;
    topk_cases(g, seed, out)?;
    batched_cases(g, seed, out)?;
    select_cases(g, seed, out)?;
    mask_rows_cases(g, seed, out)?;
    masked_select_cases(g, seed, out)
}
