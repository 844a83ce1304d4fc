//! The stopgap engine's worker: loads a model and runs its requests one at a time.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use memra_engine::backend::cuda::open_backend;
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::generate::{FinishReason, top_k};
use memra_engine::loader::load_model;
use memra_engine::request::{Event, TokenEvent, Usage, ValidRequest};
use memra_engine::sampling::sample;
use memra_engine::tokenizer::StreamDecoder;
use tokio::sync::mpsc::UnboundedSender;

use super::stop::{Pushed, StopFilter};
use super::text::ModelTextImpl;
use super::{BLOCK_SIZE, Counters, LocalConfig, MAX_CONTEXT};
use crate::engine::ModelText;

/// Prompt tokens per prefill step.
const PREFILL_CHUNK: usize = 512;

/// A request and its event channel.
pub struct Job {
    pub req: ValidRequest,
    pub tx: UnboundedSender<Event>,
}

type Loaded = (Arc<dyn ModelText>, usize, String, mpsc::Sender<Job>);

/// Loads `path`, opens its backend and starts its worker thread.
pub fn load(cfg: &LocalConfig, path: &Path, counters: &Arc<Counters>) -> Result<Loaded, String> {
    let model = load_model(path).map_err(|e| e.to_string())?;
    let ctx = model.config.max_ctx.min(MAX_CONTEXT);
    let kv_blocks = ctx.div_ceil(BLOCK_SIZE);
    let text = Arc::new(ModelTextImpl {
        tokenizer: model.tokenizer,
        chat: model.chat,
    });
    let mut backend = open_backend(
        cfg.device,
        model.weights,
        kv_blocks,
        BLOCK_SIZE,
        cfg.threads,
    )
    .map_err(|e| e.to_string())?;
    let name = backend.name();
    counters.kv_total.fetch_add(kv_blocks, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel::<Job>();
    let c = counters.clone();
    let t = text.clone();
    std::thread::Builder::new()
        .name("memra-local-engine".into())
        .spawn(move || {
            for job in rx {
                c.queued.fetch_sub(1, Ordering::SeqCst);
                if job.tx.is_closed() {
                    continue;
                }
                c.running.fetch_add(1, Ordering::SeqCst);
                run_one(backend.as_mut(), &t, job, &c);
                c.kv_used.store(0, Ordering::SeqCst);
                c.running.fetch_sub(1, Ordering::SeqCst);
            }
        })
        .map_err(|e| format!("cannot start the worker thread: {e}"))?;
    let text: Arc<dyn ModelText> = text;
    Ok((text, ctx, name, tx))
}

/// Natural-log probability of `tok` and the `n` most likely tokens under `logits`.
fn logprobs(logits: &[f32], tok: u32, n: usize) -> (Option<f32>, Vec<(u32, f32)>) {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - m).exp()).sum();
    let lse = f64::from(m) + sum.ln();
    let lp = |l: f32| (f64::from(l) - lse) as f32;
    let own = logits.get(tok as usize).map(|&l| lp(l));
    let top = top_k(logits, n)
        .into_iter()
        .map(|(i, l)| (i, lp(l)))
        .collect();
    (own, top)
}

fn step_one(b: &mut dyn Backend, table: &[u32], tok: u32, pos: usize) -> Result<Vec<f32>, String> {
    let batch = StepBatch {
        rows: vec![StepRow {
            token: tok,
            pos: pos as u32,
            seq: 0,
            want_logits: true,
        }],
        block_tables: vec![table.to_vec()],
    };
    let out = b.step(&batch).map_err(|e| e.to_string())?;
    Ok(out.logits.into_iter().next().unwrap_or_default())
}

fn prefill(
    b: &mut dyn Backend,
    table: &[u32],
    prompt: &[u32],
    tx: &UnboundedSender<Event>,
) -> Result<Option<Vec<f32>>, String> {
    let n = prompt.len();
    let mut logits = Vec::new();
    for start in (0..n).step_by(PREFILL_CHUNK) {
        if tx.is_closed() {
            return Ok(None);
        }
        let end = (start + PREFILL_CHUNK).min(n);
        let batch = StepBatch {
            rows: (start..end)
                .map(|p| StepRow {
                    token: prompt[p],
                    pos: p as u32,
                    seq: 0,
                    want_logits: p + 1 == n,
                })
                .collect(),
            block_tables: vec![table.to_vec()],
        };
        let out = b.step(&batch).map_err(|e| e.to_string())?;
        if end == n {
            logits = out.logits.into_iter().next().unwrap_or_default();
        }
    }
    Ok(Some(logits))
}

fn run_one(b: &mut dyn Backend, text: &ModelTextImpl, job: Job, c: &Counters) {
    let Job { req, tx } = job;
    match generate(b, text, &req, &tx, c) {
        Ok(Some((finish_reason, usage))) => {
            let _ = tx.send(Event::Done {
                finish_reason,
                usage,
            });
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(Event::Error(e));
        }
    }
}

/// Generates `req`, sending token events; `None` when the client went away.
fn generate(
    b: &mut dyn Backend,
    text: &ModelTextImpl,
    req: &ValidRequest,
    tx: &UnboundedSender<Event>,
    c: &Counters,
) -> Result<Option<(FinishReason, Usage)>, String> {
    let n = req.prompt.len();
    let ctx = b.config().max_ctx.min(MAX_CONTEXT);
    let total = (n + req.max_tokens).min(ctx);
    let blocks = total.div_ceil(BLOCK_SIZE);
    if n == 0 || n >= ctx || blocks > b.kv_blocks() {
        return Err(format!(
            "the request needs {blocks} KV blocks for {total} positions; the engine has {}",
            b.kv_blocks()
        ));
    }
    c.kv_used.store(blocks, Ordering::SeqCst);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let Some(mut logits) = prefill(b, &table, &req.prompt, tx)? else {
        return Ok(None);
    };
    let stop_ids = text.tokenizer.stop_ids().to_vec();
    let mut history = req.prompt.clone();
    let mut dec = StreamDecoder::new(&text.tokenizer);
    let mut filter = StopFilter::new(req.stop.clone());
    let mut generated = 0;
    let mut last = 0;
    let mut reason = FinishReason::Length;
    let mut stopped_by_string = false;
    while history.len() < total {
        if tx.is_closed() {
            return Ok(None);
        }
        let pos = history.len();
        let tok = sample(&logits, &history, &req.params, pos as u64);
        if !req.ignore_eos && stop_ids.contains(&tok) {
            reason = FinishReason::Stop;
            break;
        }
        let (logprob, top) = match req.logprobs {
            Some(k) => logprobs(&logits, tok, k),
            None => (None, Vec::new()),
        };
        generated += 1;
        last = tok;
        history.push(tok);
        let piece = dec.push(tok).map_err(|e| e.to_string())?;
        let (out, stop) = match filter.push(&piece) {
            Pushed::Text(t) => (t, false),
            Pushed::Stop(t) => (t, true),
        };
        let ev = TokenEvent {
            id: tok,
            text: out,
            logprob,
            top_logprobs: top,
        };
        if tx.send(Event::Token(ev)).is_err() {
            return Ok(None);
        }
        if stop {
            reason = FinishReason::Stop;
            stopped_by_string = true;
            break;
        }
        if history.len() >= total {
            break;
        }
        logits = step_one(b, &table, tok, pos)?;
    }
    if !stopped_by_string {
        let rest = dec.finish();
        let mut tail = match filter.push(&rest) {
            Pushed::Text(t) => t,
            Pushed::Stop(t) => {
                reason = FinishReason::Stop;
                t
            }
        };
        tail.push_str(&filter.finish());
        if !tail.is_empty() {
            let ev = TokenEvent {
                id: last,
                text: tail,
                logprob: None,
                top_logprobs: Vec::new(),
            };
            let _ = tx.send(Event::Token(ev));
        }
    }
    let usage = Usage {
        prompt_tokens: n,
        completion_tokens: generated,
        cached_tokens: 0,
    };
    Ok(Some((reason, usage)))
}
