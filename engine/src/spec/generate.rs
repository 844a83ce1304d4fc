//! One sequence, decoded speculatively: [`crate::generate::generate`]'s output exactly, with
//! K drafts checked per step in one step of K+1 rows.

use std::collections::VecDeque;
use std::time::Instant;

use super::control::{MatchRates, SpecControl, StepCost};
use super::{DraftReq, Drafter, SpecCounts, accept};
use crate::backend::{Backend, SelectParams, Selected, StepBatch, StepRow};
use crate::error::{Error, Result};
use crate::generate::{
    FinishReason, GenOutput, GenRequest, check_gen, prefill, select_for, take_pick,
};
use crate::sampling::sample;

/// How to speculate.
#[derive(Clone, Copy, Debug)]
pub struct SpecOptions {
    /// Most drafts per step.
    pub k: usize,
    /// Let [`SpecControl`] shorten K or switch off, and cut a looked-up draft to the depth its
    /// match length earns ([`MatchRates`], one table for the generation, from the priors)
    /// (false: always ask for `k`).
    pub adaptive: bool,
}

/// [`crate::generate::generate`] with speculation: the same tokens, finish reason and kept
/// logits, plus the speculation counters.
pub fn generate_spec(
    backend: &mut dyn Backend,
    drafter: &mut dyn Drafter,
    req: &GenRequest,
    opts: SpecOptions,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<(GenOutput, SpecCounts)> {
    generate_spec_timed(backend, drafter, req, opts, on_token).map(|(o, c, _)| (o, c))
}

/// Where a speculative generation's decode time went (wall clock, seconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct SpecTiming {
    /// Drafting (the drafter's calls).
    pub draft_secs: f64,
    /// Steps that checked at least one draft, and their count.
    pub verify_secs: f64,
    pub verify_steps: u64,
    /// Steps without drafts (one row, as plain decoding), and their count.
    pub plain_secs: f64,
    pub plain_steps: u64,
}

/// [`generate_spec`] with the time spent drafting, in verify steps and in plain steps.
pub fn generate_spec_timed(
    backend: &mut dyn Backend,
    drafter: &mut dyn Drafter,
    req: &GenRequest,
    opts: SpecOptions,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<(GenOutput, SpecCounts, SpecTiming)> {
    let hidden = drafter.wants_hidden();
    if hidden {
        backend.keep_hidden(true)?;
    }
    let r = run_spec(backend, drafter, req, opts, on_token);
    if hidden {
        backend.keep_hidden(false)?;
    }
    r
}

/// Hands the hidden states of the last step(s) to a drafter that reads them.
fn observe(backend: &mut dyn Backend, drafter: &mut dyn Drafter) {
    if drafter.wants_hidden() {
        drafter.observe(0, &backend.take_hidden());
    }
}

fn run_spec(
    backend: &mut dyn Backend,
    drafter: &mut dyn Drafter,
    req: &GenRequest,
    opts: SpecOptions,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<(GenOutput, SpecCounts, SpecTiming)> {
    let (total, blocks) = check_gen(backend, req)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let t0 = Instant::now();
    let want_logits = req.logits_top > 0 || req.keep_logits;
    let mut history = req.prompt.clone();
    let first = prefill(backend, req, &table, want_logits)?;
    observe(backend, drafter);
    let mut out = GenOutput {
        tokens: Vec::new(),
        finish_reason: FinishReason::Length,
        logits_top: Vec::new(),
        logits: Vec::new(),
        prompt_secs: t0.elapsed().as_secs_f64(),
        decode_secs: 0.0,
    };
    let t1 = Instant::now();
    let mut counts = SpecCounts::default();
    let mut control = SpecControl::new(opts.k);
    let mut matched = MatchRates::new(!req.params.is_greedy());
    let matches = opts.adaptive && drafter.matches();
    let mut cost = StepCost::default();
    let mut timing = SpecTiming::default();
    // Picks for positions history.len(), history.len() + 1, ...; all but the last have their
    // KV computed already (they were accepted drafts).
    let mut pending: VecDeque<Selected> = VecDeque::from([first]);
    while history.len() < total {
        let Some(next) = pending.pop_front() else {
            break;
        };
        let tok = take_pick(next, &history, req, &mut out);
        if req.stop_ids.contains(&tok) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        out.tokens.push(tok);
        history.push(tok);
        on_token(tok)?;
        if history.len() >= total || !pending.is_empty() {
            continue;
        }
        // Drafts may reach position total - 1 at most (plain decoding's last pick).
        let room = total - history.len() - 1;
        let k = if matches {
            if control.backing_off() { 0 } else { opts.k }
        } else if opts.adaptive {
            control.depth(cost.row_cost())
        } else {
            opts.k
        }
        .min(room);
        let td = Instant::now();
        let mut match_len = None;
        let drafts = if k == 0 {
            Vec::new()
        } else {
            let r = DraftReq {
                id: 0,
                tokens: &history,
                k,
                params: &req.params,
            };
            let (mut d, m) = drafter.draft_matched(&[r])?.pop().unwrap_or_default();
            match m.filter(|_| matches) {
                Some(m) => {
                    d.truncate(matched.depth(m, cost.row_cost(), k));
                    match_len = Some(m);
                }
                None => d.truncate(k),
            }
            d
        };
        let ts = Instant::now();
        timing.draft_secs += (ts - td).as_secs_f64();
        let picks = verify(backend, req, &table, &history, &drafts, want_logits)?;
        observe(backend, drafter);
        let step = ts.elapsed().as_secs_f64();
        cost.record(drafts.len() + 1, step);
        if drafts.is_empty() {
            timing.plain_secs += step;
            timing.plain_steps += 1;
        } else {
            timing.verify_secs += step;
            timing.verify_steps += 1;
        }
        let tokens = pick_tokens(&picks, &history, &drafts, req);
        let a = accept(&drafts, &tokens);
        counts.add(drafts.len(), a);
        control.verified(drafts.len(), a, cost.row_cost());
        if let Some(m) = match_len {
            matched.verified(m, drafts.len(), a);
        }
        if !drafts.is_empty() {
            drafter.verified(0, drafts.len(), a);
        }
        pending.extend(picks.into_iter().take(a + 1));
    }
    drafter.forget(0);
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok((out, counts, timing))
}

/// The token each pick stands for: the backend's, or (logits rows) what `sample` picks with the
/// row's own history, as plain decoding would.
fn pick_tokens(picks: &[Selected], history: &[u32], drafts: &[u32], req: &GenRequest) -> Vec<u32> {
    let mut ext = history.to_vec();
    ext.extend_from_slice(drafts);
    let n = history.len();
    picks
        .iter()
        .enumerate()
        .map(|(j, s)| match s {
            Selected::Token(t) | Selected::Scored { token: t, .. } => *t,
            Selected::Logits(l) => sample(l, &ext[..n + j], &req.params, (n + j) as u64),
        })
        .collect()
}

/// One step of the last token plus `drafts`: row `j` picks the token of position
/// `history.len() + j` exactly as plain decoding would after `drafts[..j]` (or returns its
/// logits with `want_logits`).
fn verify(
    backend: &mut dyn Backend,
    req: &GenRequest,
    table: &[u32],
    history: &[u32],
    drafts: &[u32],
    want_logits: bool,
) -> Result<Vec<Selected>> {
    let last = history.len() - 1;
    let mut ext = history.to_vec();
    ext.extend_from_slice(drafts);
    let rows: Vec<StepRow> = (0..=drafts.len())
        .map(|j| StepRow {
            token: ext[last + j],
            pos: (last + j) as u32,
            seq: 0,
            want_logits: true,
        })
        .collect();
    let batch = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![table.to_vec()],
        state_slots: vec![0],
    };
    let n = history.len();
    let select: Vec<Option<SelectParams>> = (0..=drafts.len())
        .flat_map(|j| select_for(true, want_logits, &req.params, &ext[..n + j]))
        .collect();
    let out = backend.step_select(&batch, &select)?;
    if out.rows.len() != drafts.len() + 1 {
        return Err(Error::Backend {
            backend: backend.name(),
            what: format!(
                "{} picks for a verify step of {} rows",
                out.rows.len(),
                drafts.len() + 1
            ),
        });
    }
    Ok(out.rows)
}
