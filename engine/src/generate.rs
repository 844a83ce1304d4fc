//! Single-sequence generation on a backend: prefill (optionally in chunks), then decode until a
//! stop token, `max_tokens` or the context length. Used by `run-gen` and the exactness tests; the
//! multi-request engine loop builds on the same Backend step.

use std::time::Instant;

use crate::backend::{Backend, SelectParams, Selected, StepBatch, StepRow};
use crate::error::{Error, Result};
use crate::sampling::{SamplingParams, sample};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Token ids that end generation (not included in the output).
    pub stop_ids: Vec<u32>,
    /// Prefill chunk size in tokens (0 = the whole prompt in one step).
    pub prefill_chunk: usize,
    /// Keep the top-K logits of every generated position (0 = none).
    pub logits_top: usize,
    /// Keep every generated position's full logits (tests).
    pub keep_logits: bool,
}

impl GenRequest {
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            max_tokens,
            params: SamplingParams::default(),
            stop_ids: Vec::new(),
            prefill_chunk: 0,
            logits_top: 0,
            keep_logits: false,
        }
    }
}

/// The result of a generation.
#[derive(Clone, Debug)]
pub struct GenOutput {
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Per generated position, the top-K `(id, logit)` pairs, descending.
    pub logits_top: Vec<Vec<(u32, f32)>>,
    /// Per generated position, all logits (with `keep_logits`).
    pub logits: Vec<Vec<f32>>,
    pub prompt_secs: f64,
    pub decode_secs: f64,
}

/// The top `k` `(id, logit)` pairs, descending by logit (`total_cmp`), lowest id first on ties.
/// One pass over the logits keeps a buffer of candidates: when it fills, it is cut to its first
/// `k`, and from then on a logit not above the k-th (by `total_cmp`; an equal one has a larger id
/// than every kept one, so it ranks after the k-th) is passed over. A total order: selecting the
/// first k then sorting them equals sorting everything.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let cap = (4 * k).max(64);
    let mut v: Vec<(u32, f32)> = Vec::with_capacity(cap.min(logits.len()));
    let mut floor: Option<f32> = None;
    for (i, &l) in logits.iter().enumerate() {
        if floor.is_some_and(|f| l.total_cmp(&f).is_le()) {
            continue;
        }
        v.push((i as u32, l));
        if v.len() == cap {
            v.select_nth_unstable_by(k - 1, order);
            v.truncate(k);
            floor = Some(v[k - 1].1);
        }
    }
    if k < v.len() {
        v.select_nth_unstable_by(k - 1, order);
        v.truncate(k);
    }
    v.sort_by(order);
    v
}

/// Runs one request alone on `backend`, using KV blocks `0..n` as its block table.
/// `on_token` sees each generated token as it is produced.
pub fn generate(
    backend: &mut dyn Backend,
    req: &GenRequest,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<GenOutput> {
    let (total, blocks) = check_gen(backend, req)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let t0 = Instant::now();
    // Without logits_top / keep_logits the backend picks the token itself (on the device for
    // CUDA), so the logits need not come back.
    let want_logits = req.logits_top > 0 || req.keep_logits;
    let mut history = req.prompt.clone();
    let mut next = prefill(backend, req, &table, want_logits)?;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut out = GenOutput {
        tokens: Vec::new(),
        finish_reason: FinishReason::Length,
        logits_top: Vec::new(),
        logits: Vec::new(),
        prompt_secs,
        decode_secs: 0.0,
    };
    while history.len() < total {
        let pos = history.len();
        let tok = take_pick(next, &history, req, &mut out);
        if req.stop_ids.contains(&tok) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        out.tokens.push(tok);
        history.push(tok);
        on_token(tok)?;
        if history.len() >= total {
            break;
        }
        let batch = StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: vec![StepRow {
                token: tok,
                pos: pos as u32,
                seq: 0,
                want_logits: true,
            }],
            block_tables: vec![table.clone()],
            state_slots: vec![0],
        };
        let select = select_for(true, want_logits, &req.params, &history);
        next = backend
            .step_select(&batch, &select)?
            .rows
            .into_iter()
            .next()
            .unwrap_or(Selected::Logits(Vec::new()));
    }
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// The token of a pick for position `history.len()`: the backend's, or sampled here from the
/// logits (which `out` keeps as `req` asks).
pub(crate) fn take_pick(
    next: Selected,
    history: &[u32],
    req: &GenRequest,
    out: &mut GenOutput,
) -> u32 {
    match next {
        Selected::Token(t) | Selected::Scored { token: t, .. } => t,
        Selected::Logits(logits) => {
            let tok = sample(&logits, history, &req.params, history.len() as u64);
            if req.logits_top > 0 {
                out.logits_top.push(top_k(&logits, req.logits_top));
            }
            if req.keep_logits {
                out.logits.push(logits);
            }
            tok
        }
    }
}

/// Checks a request against the backend: `(positions in all, KV blocks they need)`.
pub(crate) fn check_gen(backend: &dyn Backend, req: &GenRequest) -> Result<(usize, usize)> {
    req.params.validate()?;
    let ctx = backend.config().max_ctx;
    let n_prompt = req.prompt.len();
    if n_prompt == 0 {
        return Err(Error::Input("the prompt is empty".into()));
    }
    if n_prompt >= ctx {
        return Err(Error::Input(format!(
            "the prompt has {n_prompt} tokens; the model's context is {ctx}"
        )));
    }
    let total = (n_prompt + req.max_tokens).min(ctx);
    let bs = backend.kv_block_size();
    let blocks = total.div_ceil(bs);
    if blocks > backend.kv_blocks() {
        return Err(Error::Input(format!(
            "{total} positions need {blocks} KV blocks; the backend has {}",
            backend.kv_blocks()
        )));
    }
    Ok((total, blocks))
}

/// Runs the prompt (in chunks of `req.prefill_chunk`) on blocks `table`; returns the pick (or
/// the logits) for the first generated position.
pub(crate) fn prefill(
    backend: &mut dyn Backend,
    req: &GenRequest,
    table: &[u32],
    want_logits: bool,
) -> Result<Selected> {
    let n_prompt = req.prompt.len();
    let chunk = if req.prefill_chunk == 0 {
        n_prompt
    } else {
        req.prefill_chunk
    };
    let mut next = Selected::Logits(Vec::new());
    for start in (0..n_prompt).step_by(chunk) {
        let end = (start + chunk).min(n_prompt);
        let batch = StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: (start..end)
                .map(|p| StepRow {
                    token: req.prompt[p],
                    pos: p as u32,
                    seq: 0,
                    want_logits: p + 1 == n_prompt,
                })
                .collect(),
            block_tables: vec![table.to_vec()],
            state_slots: vec![0],
        };
        let select = select_for(end == n_prompt, want_logits, &req.params, &req.prompt);
        let out = backend.step_select(&batch, &select)?;
        if end == n_prompt {
            next = out
                .rows
                .into_iter()
                .next()
                .unwrap_or(Selected::Logits(Vec::new()));
        }
    }
    Ok(next)
}

/// The select entries of a single-sequence step: none when its last row wants no logits, else one
/// (`None` when the caller keeps logits).
pub(crate) fn select_for<'a>(
    last: bool,
    want_logits: bool,
    params: &'a SamplingParams,
    history: &'a [u32],
) -> Vec<Option<SelectParams<'a>>> {
    match (last, want_logits) {
        (false, _) => Vec::new(),
        (true, true) => vec![None],
        (true, false) => vec![Some(SelectParams {
            params,
            history,
            pos: history.len() as u64,
            mask: None,
        })],
    }
}
