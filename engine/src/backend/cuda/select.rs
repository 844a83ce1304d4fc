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
