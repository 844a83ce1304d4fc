//! Token selection on the device, picking exactly the token `sampling::sample` picks.
//!
//! - Greedy: the penalties (`penalize_row`, the host's f32 operations) then `argmax_rows`; only
//!   the id comes back.
//! - Sampled with an effective top-k of at most [`TOPK_MAX`] (`top_k`, or the whole vocabulary
//!   when it is that small): penalties, then `topk_row` finds the first k candidates of the
//!   host's order (scaled logit by `f32::total_cmp` descending, id ascending; NaN excluded) and
//!   only those k (id, penalized logit) pairs come back. The host then runs `sampling::sample`
//!   itself on those k logits, in that order, with the penalties off: the same candidates in the
//!   same order give the same f64 softmax, top-p, min-p and Philox draw, bit for bit.
//! - Anything else (sampled with top-k 0 or above [`TOPK_MAX`] over a large vocabulary) is
//!   [`SelectPlan::Host`]: the caller copies the logits back and samples on the host.
//! - Grammar-constrained rows (`SelectParams::mask`) take the same plans: `mask_rows` first sets
//!   the logits of the tokens the mask does not allow to -inf (the host's `apply_mask`, before
//!   the penalties, as `sample_masked` does) and records whether an allowed token has a logit
//!   that is neither NaN nor -inf; when none has, the token is the lowest allowed id
//!   (`sample_masked`'s rule) without looking further. A sampled masked row's effective top-k is
//!   also bounded by the number of tokens its mask allows (the others are -inf and can never be
//!   candidates), so a mask allowing at most [`TOPK_MAX`] tokens is picked on the device whatever
//!   its top-k. All masked rows of a call share one upload ([`pack_masks`]) and one launch.

use std::collections::BTreeMap;

use super::Gpu;
pub use super::device::TOPK_MAX;
pub use super::device::topk_desc;
use crate::backend::SelectParams;
use crate::error::Result;
use crate::sampling::{SamplingParams, first_allowed, sample};

/// How one row's token is picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectPlan {
    Greedy,
    /// The first k candidates come from the device.
    TopK(usize),
    /// The logits go to the host.
    Host,
}

/// The plan for `p` over `width` logits.
pub fn plan(p: &SamplingParams, width: usize) -> SelectPlan {
    if p.is_greedy() {
        return SelectPlan::Greedy;
    }
    let k = if p.top_k == 0 || p.top_k >= width {
        width
    } else {
        p.top_k
    };
    if k <= TOPK_MAX {
        SelectPlan::TopK(k)
    } else {
        SelectPlan::Host
    }
}

/// The plan for one row: [`plan`], with a masked row's effective top-k bounded by the number of
/// tokens its mask allows (at least 1).
pub fn plan_row(s: &SelectParams, width: usize) -> SelectPlan {
    let base = plan(s.params, width);
    let Some(m) = s.mask else {
        return base;
    };
    if s.params.is_greedy() {
        return SelectPlan::Greedy;
    }
    let k = if s.params.top_k == 0 || s.params.top_k >= width {
        width
    } else {
        s.params.top_k
    };
    let k = k.min(allowed_count(m, width).max(1));
    if k <= TOPK_MAX {
        SelectPlan::TopK(k)
    } else {
        SelectPlan::Host
    }
}

/// How many of the first `width` tokens `mask` allows (bits past `width` do not count, as in
/// `sampling::apply_mask`).
pub fn allowed_count(mask: &[u32], width: usize) -> usize {
    let full = width / 32;
    let mut n: usize = mask
        .iter()
        .take(full)
        .map(|w| w.count_ones() as usize)
        .sum();
    if !width.is_multiple_of(32)
        && let Some(w) = mask.get(full)
    {
        n += (w & ((1u32 << (width % 32)) - 1)).count_ones() as usize;
    }
    n
}

/// The words of one packed mask for `width` logits.
pub fn mask_words(width: usize) -> usize {
    width.div_ceil(32)
}

/// The device layout of `masks` (each `(row of the logits, mask)`) for `mask_rows`: the `n` row
/// indices, then `n` masks of [`mask_words`]`(width)` u32 each, in the order given. A mask
/// shorter than that is padded with zero words (tokens past its end are not allowed, as in
/// `sampling::apply_mask`); a longer one is cut, and the bits of the last word past `width` are
/// cleared. Rows without a mask have no entry: `mask_rows` does not touch them.
pub fn pack_masks(masks: &[(usize, &[u32])], width: usize) -> Result<Vec<u32>> {
    let words = mask_words(width);
    let mut out = Vec::with_capacity(masks.len() * (1 + words));
    for (r, _) in masks {
        out.push(u32::try_from(*r).map_err(|_| {
            crate::error::Error::Input(format!("mask_rows: logits row {r} beyond u32"))
        })?);
    }
    for (_, m) in masks {
        let start = out.len();
        out.extend(m.iter().take(words));
        out.resize(start + words, 0);
        if !width.is_multiple_of(32)
            && let Some(last) = out.last_mut()
        {
            *last &= (1u32 << (width % 32)) - 1;
        }
    }
    Ok(out)
}

fn has_penalties(p: &SamplingParams) -> bool {
    !(p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0)
}

/// Picks tokens for `rows`, each `(row index in the logits at `logits`, params)` with `width`
/// floats per row (each row at most once). Applies the penalties of device-planned rows in place.
/// Returns, per entry, the token, or `None` for [`SelectPlan::Host`] rows (whose logits are left
/// untouched).
///
/// Launches: `mask_rows` once for the masked rows, `penalize_row` per row with penalties, then
/// one `argmax_at` for every greedy row and one `topk_rows` for every top-k row, each block
/// running the single-row kernel's code (`argmax_rows`, `topk_row`) on its row; one copy back.
/// The top-k rows of a step (a verify step's K + 1 rows, the sequences of a batch) thus run side
/// by side on the SMs: a step with n sampled rows costs about one row's selection time, not n
/// (one `topk_row` is one block of 1024 threads reading the row ten times: ~0.2 ms for a
/// 49,152-token vocabulary and ~0.8 ms for 262,144 on an H100).
pub fn select_rows(
    g: &Gpu,
    logits: u64,
    width: usize,
    rows: &[(usize, SelectParams)],
) -> Result<Vec<Option<u32>>> {
    let plans: Vec<SelectPlan> = rows.iter().map(|(_, s)| plan_row(s, width)).collect();
    if plans.iter().all(|p| *p == SelectPlan::Host) {
        return Ok(vec![None; rows.len()]);
    }
    let mut seen = std::collections::HashSet::with_capacity(rows.len());
    if let Some((r, _)) = rows.iter().find(|(r, _)| !seen.insert(*r)) {
        return Err(crate::error::Error::Input(format!(
            "select_rows: logits row {r} selected twice"
        )));
    }
    let kmax = plans
        .iter()
        .map(|p| match p {
            SelectPlan::TopK(k) => *k,
            _ => 1,
        })
        .max()
        .unwrap_or(1);
    let stride = 1 + 2 * kmax;
    let layout = Layout::new(&plans, stride);
    // Masked rows planned on the device: (entry, row of the logits, mask); their `live` flags
    // follow the greedy tokens in `out`.
    let masked: Vec<(usize, usize, &[u32])> = rows
        .iter()
        .zip(&plans)
        .enumerate()
        .filter(|(_, (_, p))| **p != SelectPlan::Host)
        .filter_map(|(i, ((r, s), _))| s.mask.map(|m| (i, *r, m)))
        .collect();
    let out = g.zeros::<u32>(layout.live + masked.len())?;
    let out_ptr = g.ptr(&out);
    let mut keep = Vec::new();
    if !masked.is_empty() {
        let list: Vec<(usize, &[u32])> = masked.iter().map(|&(_, r, m)| (r, m)).collect();
        let packed = g.upload(&pack_masks(&list, width)?)?;
        g.mask_rows(
            logits,
            g.ptr(&packed),
            masked.len(),
            width,
            mask_words(width),
            out_ptr + (layout.live * 4) as u64,
        )?;
        keep.push(packed);
    }
    // One upload: the greedy rows' indices, then the top-k rows' descriptors.
    let mut greedy_rows: Vec<u32> = Vec::new();
    let mut topk: Vec<(usize, usize, f32)> = Vec::new();
    for ((r, s), plan) in rows.iter().zip(&plans) {
        if *plan == SelectPlan::Host {
            continue;
        }
        let row = logits + (r * width * 4) as u64;
        if has_penalties(s.params) && !s.history.is_empty() {
            let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
            for &t in s.history {
                *counts.entry(t).or_default() += 1;
            }
            let toks: Vec<u32> = counts.keys().copied().collect();
            let cnts: Vec<u32> = counts.values().copied().collect();
            let (dt, dc) = (g.upload(&toks)?, g.upload(&cnts)?);
            g.penalize_row(row, g.ptr(&dt), g.ptr(&dc), toks.len(), width, s.params)?;
            keep.extend([dt, dc]);
        }
        match plan {
            SelectPlan::Greedy => greedy_rows.push(u32::try_from(*r).map_err(|_| {
                crate::error::Error::Input(format!("argmax_at: logits row {r} beyond u32"))
            })?),
            SelectPlan::TopK(k) => topk.push((*r, *k, s.params.temperature)),
            SelectPlan::Host => {}
        }
    }
    let n_greedy = greedy_rows.len();
    let mut meta = greedy_rows;
    meta.extend(topk_desc(&topk, kmax)?);
    let meta = g.upload(&meta)?;
    let meta_ptr = g.ptr(&meta);
    g.argmax_at(
        logits,
        meta_ptr,
        n_greedy,
        width,
        1,
        out_ptr + (layout.greedy * 4) as u64,
    )?;
    g.topk_rows(
        logits,
        meta_ptr + (n_greedy * 4) as u64,
        topk.len(),
        width,
        kmax,
        out_ptr,
    )?;
    let host = g.download(&out)?;
    drop(keep);
    drop(meta);
    let mut masked_iter = masked.iter().enumerate().peekable();
    let (mut gi, mut ti) = (0usize, 0usize);
    let mut picked = Vec::with_capacity(rows.len());
    for (i, ((_, s), plan)) in rows.iter().zip(&plans).enumerate() {
        let at = |j: usize| host.get(j).copied().unwrap_or(0);
        // The entry's slot in its kernel's output (taken whatever the mask says).
        let slot = match plan {
            SelectPlan::Greedy => {
                gi += 1;
                layout.greedy + gi - 1
            }
            SelectPlan::TopK(_) => {
                ti += 1;
                (ti - 1) * stride
            }
            SelectPlan::Host => 0,
        };
        if let Some((j, &(_, _, m))) = masked_iter.next_if(|(_, e)| e.0 == i)
            && at(layout.live + j) == 0
        {
            // sample_masked: no allowed token has a usable logit.
            picked.push(Some(first_allowed(m)));
            continue;
        }
        picked.push(match plan {
            SelectPlan::Host => None,
            SelectPlan::Greedy => Some(at(slot)),
            SelectPlan::TopK(_) => {
                let n = (at(slot) as usize).min(kmax);
                let ids: Vec<u32> = (0..n).map(|j| at(slot + 1 + j)).collect();
                let vals: Vec<f32> = (0..n)
                    .map(|j| f32::from_bits(at(slot + 1 + kmax + j)))
                    .collect();
                Some(finish_on_host(&ids, &vals, s))
            }
        });
    }
    Ok(picked)
}

/// Where [`select_rows`]' kernels write in its one output buffer: the top-k entries' lists
/// (`stride` u32 each, in entry order) from 0, then one token per greedy entry from `greedy`,
/// then the masked entries' live flags from `live`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    greedy: usize,
    live: usize,
}

impl Layout {
    fn new(plans: &[SelectPlan], stride: usize) -> Layout {
        let count = |want: fn(&SelectPlan) -> bool| plans.iter().filter(|p| want(p)).count();
        let greedy = count(|p| matches!(p, SelectPlan::TopK(_))) * stride;
        Layout {
            greedy,
            live: greedy + count(|p| *p == SelectPlan::Greedy),
        }
    }
}

/// `sampling::sample` over the device's first candidates: `vals` are the penalized logits of
/// `ids`, in the host's candidate order; penalties are already applied. When none of them is a
/// candidate (all -inf: the device never returns NaN ones), no token of the row is one, and
/// `sample` gives the greedy answer over a row of NaN and -inf: token 0.
pub fn finish_on_host(ids: &[u32], vals: &[f32], s: &SelectParams) -> u32 {
    if vals.iter().all(|v| v.is_nan() || *v == f32::NEG_INFINITY) {
        return 0;
    }
    let p = SamplingParams {
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        ..s.params.clone()
    };
    let j = sample(vals, &[], &p, s.pos) as usize;
    ids.get(j).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::random::{splitmix, unit};
    use crate::sampling::{apply_penalties, first_allowed};

    /// What `topk_row` returns, computed on the host: the first k (id, penalized logit) of the
    /// sampler's order (logit / temperature by total order descending, id ascending, no NaN).
    fn candidates(l: &[f32], t: f32, k: usize) -> (Vec<u32>, Vec<f32>) {
        let mut c: Vec<(u32, f32, f32)> = l
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v / t, v))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        c.truncate(k);
        (
            c.iter().map(|x| x.0).collect(),
            c.iter().map(|x| x.2).collect(),
        )
    }

    /// Case `case`'s row: width, logits on a quarter grid with a NaN, a -inf and both zeros
    /// planted, and a penalty history.
    fn random_row(case: u64) -> (usize, Vec<f32>, Vec<u32>) {
        let width = [5usize, 97, 1000, 3000][(case % 4) as usize];
        let mut l: Vec<f32> = (0..width as u64)
            .map(|i| (unit(case, 1, i) * 40.0).round() / 4.0)
            .collect();
        for (j, x) in [f32::NAN, f32::NEG_INFINITY, -0.0, 0.0]
            .into_iter()
            .enumerate()
        {
            let i = (splitmix(case, 2, j as u64) % width as u64) as usize;
            l[i] = x;
        }
        let history: Vec<u32> = (0..20)
            .map(|i| (splitmix(case, 3, i) % 30) as u32)
            .collect();
        (width, l, history)
    }

    #[test]
    fn first_k_candidates_give_the_full_samplers_token() {
        let mut checked = 0;
        for case in 0..400u64 {
            let (width, l, history) = random_row(case);
            let p = SamplingParams {
                temperature: [0.5f32, 1.0, 1.7][(case % 3) as usize],
                top_k: [0usize, 1, 3, 40, 1024, 5000][(case % 6) as usize],
                top_p: [1.0f32, 0.9, 0.4][(case / 3 % 3) as usize],
                min_p: [0.0f32, 0.05][(case / 2 % 2) as usize],
                repetition_penalty: if case % 5 == 0 { 1.3 } else { 1.0 },
                presence_penalty: if case % 7 == 0 { 0.4 } else { 0.0 },
                frequency_penalty: if case % 11 == 0 { 0.2 } else { 0.0 },
                seed: case * 31,
            };
            let SelectPlan::TopK(k) = plan(&p, width) else {
                assert!(
                    p.top_k > TOPK_MAX && width > TOPK_MAX,
                    "{p:?} width {width}"
                );
                continue;
            };
            let mut pen = l.clone();
            apply_penalties(&mut pen, &history, &p);
            let (ids, vals) = candidates(&pen, p.temperature, k);
            for pos in [0u64, 7, 12_345] {
                let s = SelectParams {
                    params: &p,
                    history: &history,
                    pos,
                    mask: None,
                };
                assert_eq!(
                    finish_on_host(&ids, &vals, &s),
                    sample(&l, &history, &p, pos),
                    "case {case} pos {pos} {p:?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 900, "{checked}");
    }

    /// `mask_rows` run on the host from the packed layout: (masked rows, live flags).
    fn mask_rows_on_host(logits: &mut [f32], packed: &[u32], n: usize, width: usize) -> Vec<u32> {
        let words = mask_words(width);
        assert_eq!(packed.len(), n * (1 + words));
        let mut live = vec![0u32; n];
        for j in 0..n {
            let r = packed[j] as usize;
            let m = &packed[n + j * words..n + (j + 1) * words];
            for (i, x) in logits[r * width..(r + 1) * width].iter_mut().enumerate() {
                if m[i >> 5] >> (i & 31) & 1 == 1 {
                    if !x.is_nan() && *x != f32::NEG_INFINITY {
                        live[j] = 1;
                    }
                } else {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        live
    }

    #[test]
    fn packed_masks_follow_the_host_convention() {
        use crate::sampling::apply_mask;
        // Bit order: bit t % 32 of word t / 32; a width that is not a multiple of 32; masks
        // shorter (missing words: not allowed) and longer (bits past the width) than needed;
        // rows without a mask are left alone.
        for width in [1usize, 31, 32, 33, 97, 1000] {
            let words = mask_words(width);
            let rows = 5;
            let base: Vec<f32> = (0..rows * width)
                .map(|i| (unit(width as u64, 9, i as u64) * 8.0).round() - 4.0)
                .collect();
            let masks: Vec<Vec<u32>> = vec![
                (0..words + 2)
                    .map(|w| splitmix(width as u64, 10, w as u64) as u32)
                    .collect(),
                vec![0b1010_0001],
                vec![0; words],
                vec![u32::MAX; words],
            ];
            // Rows 0, 2, 3, 4 masked (not in row order); row 1 has no mask.
            let list: Vec<(usize, &[u32])> = vec![
                (3, &masks[0]),
                (0, &masks[1]),
                (4, &masks[2]),
                (2, &masks[3]),
            ];
            let packed = pack_masks(&list, width).unwrap();
            assert_eq!(&packed[..4], &[3, 0, 4, 2]);
            let mut got = base.clone();
            let live = mask_rows_on_host(&mut got, &packed, list.len(), width);
            let mut want = base.clone();
            for (j, (r, m)) in list.iter().enumerate() {
                apply_mask(&mut want[r * width..(r + 1) * width], m);
                let any = want[r * width..(r + 1) * width]
                    .iter()
                    .any(|v| !v.is_nan() && *v != f32::NEG_INFINITY);
                assert_eq!(live[j], any as u32, "width {width} entry {j}");
                assert_eq!(
                    allowed_count(m, width),
                    (0..width)
                        .filter(|&t| m.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1))
                        .count()
                );
                // No bit past the width survives packing.
                let last = packed[list.len() + j * words + words - 1];
                if width % 32 != 0 {
                    assert_eq!(last >> (width % 32), 0);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "width {width}");
            assert_eq!(bits(&got[width..2 * width]), bits(&base[width..2 * width]));
        }
    }

    /// The device road for masked rows, run on the host (mask, penalties, the first k
    /// candidates, `finish_on_host`; the lowest allowed id when nothing allowed is live)
    /// against `sample_masked`.
    #[test]
    fn masked_rows_give_sample_masked_s_token() {
        use crate::sampling::sample_masked;
        let mut checked = 0;
        for case in 0..600u64 {
            let (width, l, history) = random_row(case);
            let words = mask_words(width);
            let mask: Vec<u32> = match case % 6 {
                // Random, dense.
                0 => (0..words)
                    .map(|w| splitmix(case, 4, w as u64) as u32)
                    .collect(),
                // Random, sparse.
                1 => (0..words)
                    .map(|w| {
                        let a = splitmix(case, 4, w as u64) as u32;
                        a & (a >> 7) & (a >> 13)
                    })
                    .collect(),
                // One token.
                2 => {
                    let t = (splitmix(case, 5, 0) % width as u64) as usize;
                    let mut m = vec![0u32; words];
                    m[t / 32] |= 1 << (t % 32);
                    m
                }
                // Only tokens past the unmasked top-40.
                3 => {
                    let (ids, _) = candidates(&l, 1.0, 40);
                    let mut m = vec![u32::MAX; words];
                    for t in ids {
                        m[t as usize / 32] &= !(1 << (t % 32));
                    }
                    m
                }
                // Only tokens whose logits are -inf or NaN, and one short mask.
                4 => {
                    let mut m = vec![0u32; words];
                    for (t, v) in l.iter().enumerate() {
                        if v.is_nan() || *v == f32::NEG_INFINITY {
                            m[t / 32] |= 1 << (t % 32);
                        }
                    }
                    m
                }
                _ => vec![0xf0f0_f0f0; words / 2],
            };
            let p = SamplingParams {
                temperature: [0.0f32, 0.5, 1.0, 1.7][(case / 6 % 4) as usize],
                top_k: [0usize, 1, 3, 40, 1024, 5000][(case / 2 % 6) as usize],
                top_p: [1.0f32, 0.9, 0.4][(case / 3 % 3) as usize],
                min_p: [0.0f32, 0.05][(case / 5 % 2) as usize],
                repetition_penalty: if case % 5 == 0 { 1.3 } else { 1.0 },
                presence_penalty: if case % 7 == 0 { 0.4 } else { 0.0 },
                frequency_penalty: if case % 11 == 0 { 0.2 } else { 0.0 },
                seed: case * 31,
            };
            for pos in [0u64, 7, 12_345] {
                let s = SelectParams {
                    params: &p,
                    history: &history,
                    pos,
                    mask: Some(&mask),
                };
                let want = sample_masked(&l, &history, &p, pos, &mask);
                let mut x = l.clone();
                let packed = pack_masks(&[(0, &mask)], width).unwrap();
                let live = mask_rows_on_host(&mut x, &packed, 1, width);
                apply_penalties(&mut x, &history, &p);
                let got = if live[0] == 0 {
                    first_allowed(&mask)
                } else {
                    match plan_row(&s, width) {
                        SelectPlan::Greedy => crate::sampling::argmax(&x),
                        SelectPlan::TopK(k) => {
                            let (ids, vals) = candidates(&x, p.temperature, k);
                            finish_on_host(&ids, &vals, &s)
                        }
                        SelectPlan::Host => continue,
                    }
                };
                assert_eq!(got, want, "case {case} pos {pos} {p:?}");
                checked += 1;
            }
        }
        assert!(checked > 1500, "{checked}");
    }

    /// `topk_row`'s algorithm (kernels/cu/sample.cu `topk_block`) run on the host: radix passes
    /// over the 64-bit keys that stop once the k-th key ends its digit's bin, the keys at or
    /// above the threshold gathered, a bitonic sort of the first power of two >= k slots.
    /// Returns the ids and the number of passes.
    fn radix_model(l: &[f32], t: f32, k: usize) -> (Vec<u32>, usize) {
        let key = |i: usize| {
            let b = (l[i] / t).to_bits();
            let ord = if b & 0x8000_0000 != 0 {
                !b
            } else {
                b | 0x8000_0000
            };
            (u64::from(ord) << 32) | u64::from(u32::MAX - i as u32)
        };
        let live: Vec<usize> = (0..l.len()).filter(|&i| !l[i].is_nan()).collect();
        let want = k.min(live.len());
        let (mut prefix, mut mask, mut remaining, mut passes) = (0u64, 0u64, want, 0);
        for shift in (0..8).rev().map(|d| d * 8) {
            if want == 0 {
                break;
            }
            passes += 1;
            let mut hist = [0usize; 256];
            for &i in &live {
                if key(i) & mask == prefix {
                    hist[(key(i) >> shift) as usize & 255] += 1;
                }
            }
            let (mut acc, mut done) = (0, false);
            for d in (0..256).rev() {
                if acc + hist[d] >= remaining {
                    prefix |= (d as u64) << shift;
                    done = acc + hist[d] == remaining;
                    remaining -= acc;
                    break;
                }
                acc += hist[d];
            }
            mask |= 255 << shift;
            if done {
                break;
            }
        }
        let mut keys: Vec<u64> = live
            .iter()
            .map(|&i| key(i))
            .filter(|&x| x >= prefix)
            .collect();
        assert_eq!(keys.len(), want, "the threshold admits exactly k keys");
        let n = want.next_power_of_two().max(2);
        keys.resize(n, 0);
        let mut size = 2;
        while size <= n {
            let mut stride = size / 2;
            while stride > 0 {
                for i in 0..n {
                    let o = i ^ stride;
                    let desc = i & size == 0;
                    if o > i
                        && (if desc {
                            keys[i] < keys[o]
                        } else {
                            keys[i] > keys[o]
                        })
                    {
                        keys.swap(i, o);
                    }
                }
                stride /= 2;
            }
            size *= 2;
        }
        let ids = keys[..want].iter().map(|&x| u32::MAX - x as u32).collect();
        (ids, passes)
    }

    #[test]
    fn topk_row_s_early_stop_and_short_sort_keep_the_candidates() {
        let (mut cases, mut passes) = (0, 0);
        for case in 0..300u64 {
            let (width, l, _) = random_row(case);
            let t = [0.5f32, 0.8, 1.0, 1.7][(case % 4) as usize];
            let k = [1usize, 2, 3, 40, 64, 1024][(case / 4 % 6) as usize].min(width);
            let (ids, p) = radix_model(&l, t, k);
            assert_eq!(
                ids,
                candidates(&l, t, k).0,
                "case {case} width {width} k {k} t {t}"
            );
            cases += 1;
            passes += p;
        }
        // The passes stop early on most rows (8 without the stop).
        assert!(passes < cases * 5, "{passes} passes for {cases} rows");
    }

    #[test]
    fn one_buffer_holds_every_kernels_output() {
        use SelectPlan::*;
        // Entries in any order: the top-k lists first (stride each), then a token per greedy
        // entry, then the live flags.
        let plans = [Greedy, TopK(40), Host, TopK(3), Greedy, Greedy];
        assert_eq!(
            Layout::new(&plans, 81),
            Layout {
                greedy: 162,
                live: 165
            }
        );
        assert_eq!(Layout::new(&[Greedy], 3), Layout { greedy: 0, live: 1 });
        let d = topk_desc(&[(7, 40, 0.8), (0, 3, 1.5)], 40).unwrap();
        assert_eq!(d, vec![7, 40, 0.8f32.to_bits(), 0, 3, 1.5f32.to_bits()]);
        assert!(topk_desc(&[(1, 41, 1.0)], 40).is_err());
        assert!(topk_desc(&[(1, 4, 1.0)], TOPK_MAX + 1).is_err());
    }

    #[test]
    fn masked_plans() {
        let t = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let few = vec![0b1011u32; 4748];
        let one = [0u32, 0, 4];
        let s = |m: Option<&[u32]>| {
            plan_row(
                &SelectParams {
                    params: &t,
                    history: &[],
                    pos: 0,
                    mask: m,
                },
                151_936,
            )
        };
        // 3 allowed tokens per 32: 14,244 allowed, more than TOPK_MAX.
        assert_eq!(s(Some(&few)), SelectPlan::Host);
        assert_eq!(s(Some(&one)), SelectPlan::TopK(1));
        assert_eq!(s(Some(&[])), SelectPlan::TopK(1));
        assert_eq!(s(Some(&few[..8])), SelectPlan::TopK(24));
        assert_eq!(s(None), SelectPlan::Host);
    }

    #[test]
    fn plans() {
        let g = SamplingParams::default();
        assert_eq!(plan(&g, 150_000), SelectPlan::Greedy);
        let t = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        assert_eq!(plan(&t, 97), SelectPlan::TopK(97));
        assert_eq!(plan(&t, 150_000), SelectPlan::Host);
        let k = SamplingParams { top_k: 50, ..t };
        assert_eq!(plan(&k, 150_000), SelectPlan::TopK(50));
    }
}
