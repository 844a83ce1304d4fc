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

use std::collections::BTreeMap;

use super::Gpu;
pub use super::device::TOPK_MAX;
use crate::backend::SelectParams;
use crate::error::Result;
use crate::sampling::{SamplingParams, sample};

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

fn has_penalties(p: &SamplingParams) -> bool {
    !(p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0)
}

/// Picks tokens for `rows`, each `(row index in the logits at `logits`, params)` with `width`
/// floats per row. Applies the penalties of device-planned rows in place. Returns, per entry, the
/// token, or `None` for [`SelectPlan::Host`] rows (whose logits are left untouched).
pub fn select_rows(
    g: &Gpu,
    logits: u64,
    width: usize,
    rows: &[(usize, SelectParams)],
) -> Result<Vec<Option<u32>>> {
    let plans: Vec<SelectPlan> = rows.iter().map(|(_, s)| plan(s.params, width)).collect();
    if plans.iter().all(|p| *p == SelectPlan::Host) {
        return Ok(vec![None; rows.len()]);
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
    let out = g.zeros::<u32>(rows.len() * stride)?;
    let out_ptr = g.ptr(&out);
    let mut keep = Vec::new();
    for (i, ((r, s), plan)) in rows.iter().zip(&plans).enumerate() {
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
            keep.push((dt, dc));
        }
        let o = out_ptr + (i * stride * 4) as u64;
        match plan {
            SelectPlan::Greedy => g.argmax_rows(row, o + 4, 1, width)?,
            SelectPlan::TopK(k) => g.topk_row(row, width, s.params.temperature, *k, kmax, o)?,
            SelectPlan::Host => {}
        }
    }
    let host = g.download(&out)?;
    drop(keep);
    let mut picked = Vec::with_capacity(rows.len());
    for (i, ((_, s), plan)) in rows.iter().zip(&plans).enumerate() {
        let at = |j: usize| host.get(i * stride + j).copied().unwrap_or(0);
        picked.push(match plan {
            SelectPlan::Host => None,
            SelectPlan::Greedy => Some(at(1)),
            SelectPlan::TopK(_) => {
                let n = (at(0) as usize).min(kmax);
                let ids: Vec<u32> = (0..n).map(|j| at(1 + j)).collect();
                let vals: Vec<f32> = (0..n).map(|j| f32::from_bits(at(1 + kmax + j))).collect();
                Some(finish_on_host(&ids, &vals, s))
            }
        });
    }
    Ok(picked)
}

/// `sampling::sample` over the device's first candidates: `vals` are the penalized logits of
/// `ids`, in the host's candidate order; penalties are already applied.
pub fn finish_on_host(ids: &[u32], vals: &[f32], s: &SelectParams) -> u32 {
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
    use crate::sampling::apply_penalties;

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

    #[test]
    fn first_k_candidates_give_the_full_samplers_token() {
        let mut checked = 0;
        for case in 0..400u64 {
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
