//! A model's engine thread: it owns the backend and the scheduler. Each step is
//! schedule -> execute -> update: the backend picks the tokens (on the device where it can; only
//! the asked-for logprobs come back), and the thread sends each request its token ids. The
//! structured-output masks are computed in a callback the backend calls once the step's forward
//! pass is launched (`Backend::step_select_lazy_masks`), so on a GPU they overlap it. Text,
//! stop strings and logprob formatting happen on each request's reader ([`super::output`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::admission::{Admission, Ticket};
use super::output::{Msg, RawToken};
use super::speculate::{DraftCandidate, Speculation};
use super::{Command, EngineConfig, KvBudget, ModelInfo, ModelStats};
use crate::backend::cuda::{cuda_available, device_memory, graphs_default};
use crate::backend::{Backend, Device, OpenOptions, SelectParams, Selected};
use crate::error::{Error, Result};
use crate::generate::FinishReason;
use crate::grammar::{Constraint, Mask};
use crate::kv::{KvManager, blocks_for, kv_block_bytes, kv_blocks_from_memory};
use crate::models::ModelWeights;
use crate::prefix_cache::namespace;
use crate::request::{Event, Usage, ValidRequest};
use crate::sampling::SamplingParams;
use crate::scheduler::{NewSeq, ScheduledSeq, Scheduler, SchedulerOutput, SeqId, StateOp};
use crate::spec::{SpecCounts, accept, open_drafter};
use crate::tokenizer::Tokenizer;

/// A sequence that failed outside the step (a state snapshot), with why.
type Failed = (SeqId, String);

/// A request on its way to the model's thread.
pub(crate) struct Submitted {
    pub(crate) id: SeqId,
    pub(crate) req: ValidRequest,
    pub(crate) tx: UnboundedSender<Msg>,
    pub(crate) ticket: Ticket,
}

pub(crate) struct WorkerArgs {
    pub(crate) alias: String,
    pub(crate) weights: ModelWeights,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) cfg: EngineConfig,
    pub(crate) rx: Receiver<Command>,
    pub(crate) stats: Arc<Mutex<ModelStats>>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) alive: Arc<AtomicBool>,
}

/// A request the thread is serving.
struct Active {
    req: ValidRequest,
    tx: UnboundedSender<Msg>,
    ticket: Ticket,
    generated: usize,
    since: Instant,
    spec: SpecCounts,
    /// Structured output: where the request is in its grammar.
    constraint: Option<Constraint>,
    /// A grammar failure met while computing a mask; the request ends with it.
    failed: Option<String>,
    /// Its scope in the traffic store (spec/traffic.rs): its prefix-cache namespace.
    scope: Arc<[u8]>,
    /// The last token, emitted but not appended to the sequence (the request ended by length
    /// or a complete grammar): the traffic store gets it with the others.
    tail: Option<u32>,
}

struct Worker {
    backend: Box<dyn Backend>,
    sched: Scheduler,
    active: HashMap<SeqId, Active>,
    rx: Receiver<Command>,
    /// EOS and end-of-turn ids.
    stop_ids: Vec<u32>,
    max_ctx: usize,
    /// The mask a request whose grammar failed picks under: only `stop_ids` (grammar masks
    /// cover the tokenizer's vocabulary).
    stop_mask: Mask,
    stats: Arc<Mutex<ModelStats>>,
    admission: Arc<Admission>,
    shutting_down: bool,
    steps: u64,
    generated_total: u64,
    spec: Option<Speculation>,
}

/// KV blocks for a model under `cfg`.
fn kv_blocks(weights: &ModelWeights, cfg: &EngineConfig) -> Result<usize> {
    let c = &weights.config;
    let (fraction, reserve) = match cfg.kv {
        KvBudget::Blocks(n) => return Ok(n),
        KvBudget::Auto {
            fraction,
            reserve_bytes,
        } => (fraction, reserve_bytes),
    };
    let cap = cfg.scheduler.max_running.max(1) * blocks_for(c.max_ctx, cfg.block_size);
    if cfg.pp.is_split() && cfg.pp.stage_devices(cfg.device)?[0] != Device::Cpu {
        // Each stage's device holds its layers' part of every block.
        let o = OpenOptions {
            kv_blocks: cap,
            block_size: cfg.block_size,
            threads: cfg.threads,
            graphs: graphs_default(),
            kv_dtype: cfg.kv_dtype,
            state_slots: cfg.scheduler.max_running,
        };
        let n = crate::pipeline::auto_kv_blocks(
            weights,
            cfg.device,
            &cfg.pp,
            &o,
            (reserve, fraction, cap),
        )?;
        if n < 2 {
            return Err(Error::Input(format!(
                "no memory left for the KV cache on the pipeline's devices ({}); use more \
                 stages, another split (--pp-split) or a smaller quantization",
                cfg.pp
                    .stage_devices(cfg.device)?
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        return Ok(n);
    }
    let cuda = match cfg.device {
        Device::Cpu => None,
        Device::Auto if !cuda_available() => None,
        Device::Auto => Some(0),
        Device::Cuda(n) => Some(n),
    };
    // What the model takes besides the pool: on the device the weights as uploaded (repacked,
    // tied tables twice) and the working space (cuda/plan.rs); on the host the weights.
    let (free, fixed) = match cuda {
        Some(n) => (
            device_memory(n)?.0,
            crate::backend::cuda::plan::fixed_bytes(weights)?.saturating_add(
                crate::backend::cuda::plan::state_bytes(c, cfg.scheduler.max_running),
            ),
        ),
        None => (host_available_bytes()?, weights.nbytes()),
    };
    let n = kv_blocks_from_memory(
        free.saturating_sub(fixed),
        reserve,
        fraction,
        kv_block_bytes(c, cfg.block_size, cfg.kv_dtype),
        cap,
    );
    if n < 2 {
        return Err(Error::Input(format!(
            "no memory left for the KV cache: {} MiB free, weights{} {} MiB, reserve {} MiB; \
             use a smaller quantization or a smaller model",
            free >> 20,
            if cuda.is_some() {
                " and working space"
            } else {
                ""
            },
            fixed >> 20,
            reserve >> 20
        )));
    }
    Ok(n)
}

/// Bytes this process may still allocate: `MemAvailable` of /proc/meminfo, lowered to what is
/// left under the address-space limit (`ulimit -v`) and the cgroup's memory limit.
pub(crate) fn host_available_bytes() -> Result<usize> {
    let p = std::path::Path::new("/proc/meminfo");
    let s = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
    let avail = meminfo_kb(&s, "MemAvailable:")
        .map(|kb| kb * 1024)
        .ok_or_else(|| Error::Input("/proc/meminfo has no MemAvailable line".into()))?;
    Ok(crate::engine::memlimit::headroom(avail))
}

/// A `kB` field of /proc/meminfo-style text.
fn meminfo_kb(s: &str, key: &str) -> Option<usize> {
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
}

fn open(a: &mut Option<WorkerArgs>) -> Result<(Worker, ModelInfo)> {
    let WorkerArgs {
        alias,
        weights,
        tokenizer,
        cfg,
        rx,
        stats,
        admission,
        alive: _,
    } = a
        .take()
        .ok_or_else(|| Error::Input("engine thread started twice".into()))?;
    // The drafter first: what it takes (a draft model, the MTP layer's copy of the head) is
    // then no longer free when the KV pool is sized from free memory.
    let (spec, spec_notes) = match &cfg.spec {
        Some(sc) => {
            let o = open_drafter(sc, cfg.device, cfg.threads, &weights, Some(&tokenizer)).map_err(
                |e| {
                    Error::Input(format!(
                        "model `{alias}`: speculative drafter `{}`: {}",
                        sc.drafter.label(),
                        crate::spec::bare(&e)
                    ))
                },
            )?;
            let vocab = weights.config.vocab;
            (
                Some(Speculation::new(sc.clone(), o.drafter, vocab)),
                o.notes,
            )
        }
        None => (None, Vec::new()),
    };
    let blocks = kv_blocks(&weights, &cfg)?;
    let max_ctx = weights.config.max_ctx;
    let vocab = weights.config.vocab;
    let kv_token_bytes =
        kv_block_bytes(&weights.config, cfg.block_size, cfg.kv_dtype) / cfg.block_size;
    let weight_token_bytes = weights.decode_read_bytes();
    let opts = OpenOptions {
        kv_blocks: blocks,
        block_size: cfg.block_size,
        threads: cfg.threads,
        graphs: graphs_default(),
        kv_dtype: cfg.kv_dtype,
        state_slots: cfg.scheduler.max_running,
    };
    let recurrent = weights.config.arch.is_recurrent();
    let mut backend = crate::pipeline::open_any(cfg.device, weights, &opts, &cfg.pp)?;
    if let Some(s) = &spec {
        backend.keep_hidden(s.wants_hidden())?;
    }
    let mut scfg = cfg.scheduler.clone();
    scfg.recurrent = recurrent;
    // A recurrent model's prefix hits need state snapshots; without them it takes none.
    if recurrent && !backend.state_snapshots() {
        scfg.state_snapshots = Some(0);
    }
    if let Some(cap) = backend.state_snapshot_capacity() {
        let want = scfg.state_snapshots.unwrap_or(2 * scfg.max_running.max(1));
        scfg.state_snapshots = Some(want.min(cap));
    }
    let reserve = scfg.admit_reserve_blocks;
    let sched = Scheduler::new(
        scfg,
        KvManager::new(blocks, cfg.block_size, cfg.prefix_cache),
    );
    let max_positions = max_ctx.min(blocks.saturating_sub(reserve) * cfg.block_size);
    let info = ModelInfo {
        alias,
        max_ctx,
        max_positions,
        vocab,
        backend: backend.name(),
        profile: backend.profile(),
        kv_blocks: blocks,
        block_size: cfg.block_size,
        kv_dtype: cfg.kv_dtype,
        kv_token_bytes,
        weight_token_bytes,
        spec: spec.as_ref().map(|s| (s.name(), s.cfg.k)),
        spec_notes,
        pipeline: backend.pipeline(),
        hidden: backend.config().embed_width(),
        mrope: backend.config().vl.is_some(),
        image_input: backend.accepts_embeds(),
        max_image_rows: cfg.scheduler.max_batch_tokens.max(1),
    };
    let w = Worker {
        backend,
        sched,
        active: HashMap::new(),
        rx,
        stop_ids: tokenizer.stop_ids().to_vec(),
        max_ctx,
        stop_mask: stop_only(tokenizer.vocab_size(), tokenizer.stop_ids()),
        stats,
        admission,
        shutting_down: false,
        steps: 0,
        generated_total: 0,
        spec,
    };
    Ok((w, info))
}

/// The thread body: open the backend, report, then serve until shut down.
pub(crate) fn run(args: WorkerArgs, ready: Sender<Result<ModelInfo>>) {
    let alive = args.alive.clone();
    let mut args = Some(args);
    let mut w = match open(&mut args) {
        Ok((w, r)) => {
            // Stats first: a reader right after the start sees the model as it runs.
            w.publish_stats();
            let _ = ready.send(Ok(r));
            w
        }
        Err(e) => {
            alive.store(false, Ordering::Release);
            let _ = ready.send(Err(e));
            return;
        }
    };
    w.publish_stats();
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        while w.receive() {
            w.step();
            w.publish_stats();
        }
    }));
    alive.store(false, Ordering::Release);
    if let Err(p) = served {
        w.fail_all(&panic_message(p.as_ref()));
    }
}

/// The text of a panic payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The grammar masks of a step's picking rows ([`crate::backend::StepMasks`]): per sequence of
/// `sampled`, one entry per row it picks at (its drafts' rows included), `Some` when its
/// request is constrained, each a function of the request's own generated tokens only. A
/// grammar failure ends that request (`Active::failed`; its rows get `stop_mask` and may then
/// only end the sequence).
fn grammar_masks(
    active: &mut HashMap<SeqId, Active>,
    sampled: &[&ScheduledSeq],
    stop_mask: &Mask,
) -> Vec<Option<Mask>> {
    let mut out = Vec::with_capacity(sampled.len());
    for p in sampled {
        let rows = p.drafts.len() + 1;
        let walked = active.get_mut(&p.id).and_then(|a| {
            let m = a.constraint.as_mut()?.masks_along(&p.drafts);
            Some((a, m))
        });
        match walked {
            None => out.extend(std::iter::repeat_n(None, rows)),
            Some((_, Ok(m))) => out.extend(m.into_iter().map(Some)),
            Some((a, Err(e))) => {
                a.failed = Some(format!("structured output failed: {e}"));
                out.extend(std::iter::repeat_n(Some(stop_mask.clone()), rows));
            }
        }
    }
    out
}

/// The mask that allows only `stop_ids` over `vocab` tokens.
fn stop_only(vocab: usize, stop_ids: &[u32]) -> Mask {
    let mut m = vec![0u32; vocab.div_ceil(32)];
    for &t in stop_ids {
        if let Some(w) = m.get_mut(t as usize / 32) {
            *w |= 1 << (t % 32);
        }
    }
    m
}

impl Worker {
    /// After a panic in the serving loop: every open and queued request ends with an Error
    /// event (nothing admitted is dropped silently); the engine reports itself not ready.
    fn fail_all(&mut self, why: &str) {
        let msg = format!("the engine thread failed: {why}");
        for (_, a) in self.active.drain() {
            let _ = a.tx.send(Msg::Event(Event::Error(msg.clone())));
        }
        while let Ok(c) = self.rx.try_recv() {
            if let Command::Submit(s) = c {
                let _ = s.tx.send(Msg::Event(Event::Error(msg.clone())));
            }
        }
    }

    /// Takes commands: blocks while idle. `false` when the thread should exit.
    fn receive(&mut self) -> bool {
        if !self.sched.has_work() {
            if self.shutting_down {
                return false;
            }
            match self.rx.recv() {
                Ok(c) => self.command(c),
                Err(_) => return false,
            }
        }
        while let Ok(c) = self.rx.try_recv() {
            self.command(c);
        }
        true
    }

    fn command(&mut self, c: Command) {
        let s = match c {
            Command::Shutdown => {
                self.shutting_down = true;
                return;
            }
            Command::End(id) => {
                self.end(id);
                return;
            }
            Command::Submit(s) => *s,
        };
        let ns = namespace(&s.req.tenant, s.req.cache_salt.as_deref());
        let scope = Arc::from(ns.as_slice());
        self.sched.add(NewSeq {
            id: s.id,
            tenant: s.req.tenant.clone(),
            namespace: ns,
            prompt: s.req.prompt.clone(),
            media: s.req.media.clone(),
        });
        let constraint = s.req.grammar.as_ref().map(|g| g.start());
        let a = Active {
            req: s.req,
            tx: s.tx,
            ticket: s.ticket,
            generated: 0,
            since: Instant::now(),
            spec: SpecCounts::default(),
            constraint,
            failed: None,
            scope,
            tail: None,
        };
        self.active.insert(s.id, a);
    }

    /// One engine step.
    fn step(&mut self) {
        self.reap_cancelled();
        self.draft();
        let mut plan = self.sched.schedule();
        for p in &plan.seqs {
            if let Some(a) = self.active.get_mut(&p.id) {
                self.admission.started(&mut a.ticket);
            }
        }
        if plan.is_empty() {
            // Work that cannot run yet: wait briefly for a command instead of spinning.
            match self.rx.recv_timeout(Duration::from_millis(2)) {
                Ok(c) => self.command(c),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
            return;
        }
        if let Some(s) = self.spec.as_mut() {
            s.planned(&plan);
        }
        self.restore_states(&mut plan);
        if plan.is_empty() {
            return;
        }
        match self.execute(&plan) {
            Ok((rows, failed)) => {
                for (id, why) in failed {
                    self.send(id, Msg::Event(Event::Error(why)));
                }
                self.update(&plan, rows)
            }
            Err(e) => {
                for p in &plan.seqs {
                    let why = format!("the model failed: {e}");
                    self.send(p.id, Msg::Event(Event::Error(why)));
                }
            }
        }
        self.steps += 1;
    }

    /// Loads the planned prefix hits' state snapshots into their sequences' state slots
    /// (recurrent models). A sequence whose restore fails ends with an error and leaves the
    /// plan (the snapshot is dropped); the others run.
    fn restore_states(&mut self, plan: &mut SchedulerOutput) {
        let ops: Vec<(SeqId, StateOp)> = plan
            .seqs
            .iter()
            .filter_map(|p| p.restore.map(|r| (p.id, r)))
            .collect();
        for (id, r) in ops {
            let why = match self.backend.restore_state(r.slot, r.snap) {
                Ok(pos) if pos as usize == r.pos => continue,
                Ok(pos) => format!("it holds position {pos}, not {}", r.pos),
                Err(e) => e.to_string(),
            };
            self.sched.drop_snapshot(r.snap);
            plan.remove_seq(id);
            let why = format!("restoring the cached prefix's recurrent state failed: {why}");
            self.send(id, Msg::Event(Event::Error(why)));
        }
    }

    /// Saves the state snapshots a step's plan asks for (recurrent models), after the step
    /// ran; returns the sequences whose save failed, with why.
    fn save_states(&mut self, plan: &SchedulerOutput) -> Vec<(SeqId, StateOp, String)> {
        let mut failed = Vec::new();
        for p in &plan.seqs {
            let Some(v) = p.save else { continue };
            let saved = u32::try_from(v.pos)
                .map_err(|_| Error::Input(format!("position {} beyond u32", v.pos)))
                .and_then(|pos| self.backend.save_state(v.slot, pos, v.snap));
            if let Err(e) = saved {
                let why = format!("saving the prompt's recurrent state failed: {e}");
                failed.push((p.id, v, why));
            }
        }
        failed
    }

    /// Runs the planned rows on the backend, which picks the token of every sequence that
    /// reached its end (with the logprobs its request asked for), then saves the planned state
    /// snapshots. Returns the picks and the sequences whose snapshot failed (to end with an
    /// error).
    fn execute(&mut self, plan: &SchedulerOutput) -> Result<(Vec<Selected>, Vec<Failed>)> {
        let sampled: Vec<&ScheduledSeq> = plan.seqs.iter().filter(|p| p.sample).collect();
        // A sequence checking drafts picks at each of its rows, row j with the drafts before it
        // as history: exactly plain decoding's pick at that position.
        let exts: Vec<Option<Vec<u32>>> = sampled
            .iter()
            .map(|p| {
                (!p.drafts.is_empty()).then(|| {
                    let mut e = self.sched.tokens(p.id).unwrap_or_default().to_vec();
                    e.extend_from_slice(&p.drafts);
                    e
                })
            })
            .collect();
        // The sampling parameters are copied: the mask callback below walks the grammars in
        // `self.active` while `select` is borrowed.
        let params: Vec<SamplingParams> = sampled
            .iter()
            .map(|p| {
                self.active
                    .get(&p.id)
                    .map_or_else(SamplingParams::default, |a| a.req.params.clone())
            })
            .collect();
        let mut select = Vec::with_capacity(sampled.len());
        let mut logprobs = Vec::with_capacity(sampled.len());
        for ((p, ext), params) in sampled.iter().zip(&exts).zip(&params) {
            let tokens = self.sched.tokens(p.id).unwrap_or_default();
            let n = tokens.len();
            let want = self.active.get(&p.id).and_then(|a| a.req.logprobs);
            for j in 0..=p.drafts.len() {
                let history = ext.as_deref().map_or(tokens, |e| &e[..n + j]);
                select.push(Some(SelectParams {
                    params,
                    history,
                    pos: history.len() as u64,
                    mask: None,
                }));
                logprobs.push(want);
            }
        }
        // The grammar masks are computed once the backend has launched the forward pass (on a
        // GPU, while it runs): a row's forward does not depend on its mask, only its pick.
        let (active, stop_mask) = (&mut self.active, &self.stop_mask);
        let mut masks = || Ok(grammar_masks(active, &sampled, stop_mask));
        let t = Instant::now();
        let out =
            self.backend
                .step_select_lazy_masks(&plan.batch, &select, &logprobs, &mut masks)?;
        let picks = select.len();
        drop(select);
        if let Some(s) = self.spec.as_mut() {
            let sampled = params.iter().any(|p| !p.is_greedy());
            s.step_ran(plan.batch.rows.len(), t.elapsed().as_secs_f64(), sampled);
            if s.wants_hidden() {
                let ids: Vec<SeqId> = plan.seqs.iter().map(|p| p.id).collect();
                s.observe(&ids, self.backend.take_hidden());
            }
        }
        let failed = self.save_states(plan);
        self.sched.complete(plan);
        for (_, v, _) in &failed {
            self.sched.drop_snapshot(v.snap);
        }
        if out.rows.len() != picks {
            return Err(Error::Backend {
                backend: self.backend.name(),
                what: format!("{} selected rows for {} picks", out.rows.len(), picks),
            });
        }
        let failed = failed.into_iter().map(|(id, _, why)| (id, why)).collect();
        Ok((out.rows, failed))
    }

    /// Asks the drafter for drafts for the decoding sequences that speculate.
    fn draft(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        let cands: Vec<DraftCandidate> = self
            .sched
            .decoding()
            .into_iter()
            .filter_map(|id| {
                let a = self.active.get(&id).filter(|a| a.req.speculative)?;
                let len = self.sched.tokens(id)?.len();
                let by_max = a.req.max_tokens.saturating_sub(a.generated + 1);
                let by_ctx = self.max_ctx.saturating_sub(len + 1);
                Some(DraftCandidate {
                    id,
                    room: by_max.min(by_ctx),
                    params: a.req.params.clone(),
                    scope: a.scope.clone(),
                })
            })
            .collect();
        // A drafter failure costs speed, never output: decode plainly this step.
        let _ = spec.draft(&mut self.sched, &cands);
    }

    /// Records each picked token and tells its request.
    fn update(&mut self, plan: &SchedulerOutput, rows: Vec<Selected>) {
        let mut rows = rows.into_iter();
        for p in plan.seqs.iter().filter(|p| p.sample) {
            let mut picks = Vec::with_capacity(p.drafts.len() + 1);
            for row in rows.by_ref().take(p.drafts.len() + 1) {
                match row {
                    Selected::Token(t) => picks.push((t, None, Vec::new())),
                    Selected::Scored {
                        token,
                        logprob,
                        top,
                    } => picks.push((token, Some(logprob), top)),
                    Selected::Logits(_) => {}
                }
            }
            if picks.len() != p.drafts.len() + 1 {
                let why = "the backend returned logits instead of a token".to_string();
                self.send(p.id, Msg::Event(Event::Error(why)));
                continue;
            }
            let tokens: Vec<u32> = picks.iter().map(|t| t.0).collect();
            let accepted = accept(&p.drafts, &tokens);
            if let Some(a) = self.active.get_mut(&p.id) {
                a.spec.add(p.drafts.len(), accepted);
            }
            if let Some(s) = self.spec.as_mut() {
                s.checked(p.id, p.drafts.len(), accepted);
            }
            // The accepted drafts and the pick after them, each exactly as plain decoding
            // handles its token (EOS, max_tokens, context end stop the run).
            for (token, logprob, top) in picks.into_iter().take(accepted + 1) {
                if !self.next_token(p.id, token, logprob, top) {
                    break;
                }
            }
            if accepted > 0 {
                self.sched.accept_drafts(p.id, accepted);
            }
        }
    }

    /// One picked token: the end of sequence, or a token (the last one at the length limit).
    /// `true` while the sequence goes on.
    fn next_token(
        &mut self,
        id: SeqId,
        tok: u32,
        logprob: Option<f32>,
        top: Vec<(u32, f32)>,
    ) -> bool {
        let (Some(a), Some(pos)) = (
            self.active.get_mut(&id),
            self.sched.tokens(id).map(<[u32]>::len),
        ) else {
            return false;
        };
        let spec = (a.spec.drafted as usize, a.spec.accepted as usize);
        let cached_tokens = self.sched.cached_tokens(id);
        if let Some(why) = a.failed.take() {
            self.send(id, Msg::Event(Event::Error(why)));
            return false;
        }
        let usage = |generated| Usage {
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: generated,
            cached_tokens,
            drafted_tokens: spec.0,
            accepted_tokens: spec.1,
        };
        // A constrained request ends at EOS even with ignore_eos: its grammar allowed EOS only
        // where the output is complete.
        let eos_ends = !a.req.ignore_eos || a.constraint.is_some();
        if eos_ends && self.stop_ids.contains(&tok) {
            // End of sequence: not part of the output.
            let m = Msg::End {
                finish_reason: FinishReason::Stop,
                usage: usage(a.generated),
            };
            self.send(id, m);
            return false;
        }
        if let Some(c) = a.constraint.as_mut()
            && let Err(e) = c.commit(tok)
        {
            let why = format!("structured output failed: {e}");
            self.send(id, Msg::Event(Event::Error(why)));
            return false;
        }
        // A complete grammar allows only the end of sequence: stop here, without a step for it.
        let complete = a.constraint.as_ref().is_some_and(Constraint::is_done);
        a.generated += 1;
        let by_length = a.generated >= a.req.max_tokens || pos + 1 >= self.max_ctx;
        let last = by_length || complete;
        let end = last.then(|| Msg::End {
            finish_reason: if complete {
                FinishReason::Stop
            } else {
                FinishReason::Length
            },
            usage: usage(a.generated),
        });
        self.generated_total += 1;
        if last {
            a.tail = Some(tok);
        } else {
            self.sched.append_token(id, tok);
        }
        let t = RawToken {
            id: tok,
            logprob,
            top_logprobs: top,
            last,
            cached_tokens,
            spec,
        };
        self.send(id, Msg::Token(t));
        if let Some(m) = end {
            self.send(id, m);
        }
        self.active.contains_key(&id)
    }

    /// Sends a request a message; its `End` (or error), or a closed stream, ends it.
    fn send(&mut self, id: SeqId, m: Msg) {
        let last = matches!(
            m,
            Msg::End { .. } | Msg::Event(Event::Done { .. } | Event::Error(_))
        );
        let sent = self.active.get(&id).is_some_and(|a| a.tx.send(m).is_ok());
        if last || !sent {
            self.end(id);
        }
    }

    /// Removes a request everywhere and frees its KV blocks. A request that may speculate
    /// leaves its output in its scope of the traffic store (spec/traffic.rs).
    fn end(&mut self, id: SeqId) {
        if let (Some(s), Some(a), Some(tokens)) = (
            self.spec.as_mut(),
            self.active.get(&id),
            self.sched.tokens(id),
        ) && a.req.speculative
        {
            let mut output = tokens[a.req.prompt.len().min(tokens.len())..].to_vec();
            output.extend(a.tail);
            s.finished(&a.scope, &output);
        }
        self.sched.finish(id);
        if let Some(s) = self.spec.as_mut() {
            s.forget(id);
        }
        if let Some(a) = self.active.remove(&id) {
            self.admission
                .finished(&a.ticket, a.since.elapsed().as_secs_f64());
        }
    }

    /// Ends the requests whose client dropped the stream.
    fn reap_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .active
            .iter()
            .filter(|(_, a)| a.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.end(id);
        }
    }

    fn publish_stats(&self) {
        let kv = self.sched.kv();
        if let Ok(mut s) = self.stats.lock() {
            s.waiting = self.sched.waiting_len();
            s.running = self.sched.running_len();
            s.kv_blocks_total = kv.total();
            s.kv_blocks_used = kv.used();
            s.kv_blocks_free = kv.available();
            s.kv_blocks_cached = kv.cached_idle();
            s.prefix_hit_tokens_total = self.sched.prefix_hit_tokens();
            s.preemptions_total = self.sched.preemptions();
            s.steps_total = self.steps;
            s.tokens_generated_total = self.generated_total;
            if let Some(sp) = &self.spec {
                s.spec_drafted_total = sp.counts.drafted;
                s.spec_accepted_total = sp.counts.accepted;
                s.spec_steps_total = sp.counts.steps;
                s.spec_fallbacks = sp.fallbacks;
                if s.spec_drafter.is_empty() {
                    s.spec_drafter = sp.name();
                }
                s.spec_by_drafter = sp.by_drafter();
                s.spec_by_match = sp.by_match;
                s.spec_by_traffic = sp.by_traffic;
            }
        }
    }
}
