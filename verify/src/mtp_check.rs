//! `memra-verify spec` with the `mtp` drafter on a GPU: the MTP drafter's hand-over on the
//! device against the CPU's. The spec gate proves the output exact whatever the drafter
//! proposes, so a broken hand-over would only show as a low acceptance rate; this check looks
//! at the values themselves, per prompt (one prefill step of its tokens):
//!
//! - `target hidden`: the target's final hidden states as `Backend::keep_hidden` hands them over
//!   (every row of the step);
//! - `mtp logits` / `mtp hidden out`: the MTP layer (`HiddenStep::step_hidden`, rows
//!   `0..n - 1` with the next token and the REFERENCE's hidden state of their position) against
//!   the reference's on the same inputs.
//!
//! Relative error (max |device - cpu| / max |cpu|) within [`MTP_TOL`]: the device keeps its own
//! arithmetic (EXACTNESS.md), through a few layers; a hand-over that mixes up, drops or zeroes
//! rows is off by the order of the values themselves.

use memra_engine::Result;
use memra_engine::backend::runner::HiddenStep;
use memra_engine::backend::{Backend, StepBatch, StepRow};

use crate::case::{Case, compare};
use crate::spec::Prompt;

/// Relative error allowed between the device and the CPU.
pub const MTP_TOL: f64 = 5e-2;

/// A target backend and an MTP layer on one device.
pub struct Side<'a> {
    pub target: &'a mut dyn Backend,
    pub mtp: &'a mut dyn HiddenStep,
}

/// One step of `ids` at positions `0..` of sequence 0 over blocks `0..`.
fn batch(ids: &[u32], block_size: usize) -> StepBatch {
    let rows = ids
        .iter()
        .enumerate()
        .map(|(p, &token)| StepRow {
            token,
            pos: p as u32,
            seq: 0,
            want_logits: p + 1 == ids.len(),
        })
        .collect();
    StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![(0..ids.len().div_ceil(block_size) as u32).collect()],
        state_slots: Vec::new(),
    }
}

/// The final hidden state of every row of one step of `ids`.
fn hidden_of(b: &mut dyn Backend, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    b.keep_hidden(true)?;
    let r = b.step(&batch(ids, b.kv_block_size()));
    let rows = b.take_hidden();
    b.keep_hidden(false)?;
    r?;
    Ok(rows.into_iter().map(|(_, h)| h).collect())
}

/// Each row's relative error (max |got - want| / max |want| of the row), for a failing case:
/// a hand-over that mixes up or drops rows is off in most rows, one expert chosen differently
/// (a near tie of the router on the two backends) in one row and the rows after it.
fn row_errors(got: &[Vec<f32>], want: &[Vec<f32>]) -> String {
    let errs: Vec<String> = got
        .iter()
        .zip(want)
        .map(|(g, w)| {
            let m = w.iter().fold(1e-6f64, |m, &x| m.max(x.abs() as f64));
            let d = g
                .iter()
                .zip(w)
                .fold(0f64, |d, (&a, &b)| d.max((a as f64 - b as f64).abs()));
            format!("{:.1e}", d / m)
        })
        .collect();
    errs.join(" ")
}

/// The MTP layer over `ids` from `hidden` (MTP position `p`: token `ids[p + 1]`, state
/// `hidden[p]`): (logits, output state) of every row.
fn mtp_of(
    m: &mut dyn HiddenStep,
    ids: &[u32],
    hidden: &[Vec<f32>],
) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    let mut b = batch(&ids[1..], m.kv_block_size());
    for r in &mut b.rows {
        r.want_logits = true;
    }
    m.step_hidden(&b, hidden[..ids.len() - 1].concat())
}

/// Compares `device` with `reference` over `prompts` (each of at least 2 tokens, within both
/// targets' KV); `label` names the device's configuration in the cases.
pub fn run(
    reference: &mut Side,
    device: &mut Side,
    prompts: &[Prompt],
    label: &str,
) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    for p in prompts.iter().filter(|p| p.ids.len() >= 2) {
        let ids = &p.ids;
        let shape = format!("{} ({} rows, {label})", p.name, ids.len());
        let want = hidden_of(reference.target, ids)?;
        // Twice on the device: with graphs on, the second step replays the graph the first
        // captured (session 9: a replay handed over no rows).
        for run in ["", ", again"] {
            let got = hidden_of(device.target, ids)?;
            let mut case = compare(
                "target hidden",
                format!("{shape}{run}"),
                &got.concat(),
                &want.concat(),
                MTP_TOL,
            );
            if !case.ok() {
                case.shape
                    .push_str(&format!("; rows: {}", row_errors(&got, &want)));
            }
            cases.push(case);
        }
        // Both MTP layers read the reference's states: only the layer itself differs.
        let mtp_want = mtp_of(reference.mtp, ids, &want)?;
        let part = |v: &[(Vec<f32>, Vec<f32>)], logits: bool| -> Vec<f32> {
            v.iter()
                .flat_map(|(l, h)| if logits { l.clone() } else { h.clone() })
                .collect()
        };
        for run in ["", ", again"] {
            let got = mtp_of(device.mtp, ids, &want)?;
            for (kernel, logits) in [("mtp logits", true), ("mtp hidden out", false)] {
                cases.push(compare(
                    kernel,
                    format!("{shape}{run}"),
                    &part(&got, logits),
                    &part(&mtp_want, logits),
                    MTP_TOL,
                ));
            }
        }
    }
    Ok(cases)
}
