//! A model's engine thread: it owns the backend and the scheduler. Each step is
//! schedule -> execute -> update -> emit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::admission::{Admission, Ticket};
use super::output::{RequestText, logprobs};
use super::{Command, EngineConfig, KvBudget, ModelInfo, ModelStats};
use crate::backend::cuda::{Gpu, cuda_available, open_backend};
use crate::backend::{Backend, Device};
use crate::error::{Error, Result};
use crate::generate::FinishReason;
use crate::kv::{KvManager, blocks_for, kv_block_bytes, kv_blocks_from_memory};
use crate::models::ModelWeights;
use crate::prefix_cache::namespace;
use crate::request::{Event, TokenEvent, Usage, ValidRequest};
use crate::sampling::sample;
use crate::scheduler::{NewSeq, Scheduler, SchedulerOutput, SeqId};
use crate::tokenizer::Tokenizer;

/// A request on its way to the model's thread.
pub(crate) struct Submitted {
    pub(crate) id: SeqId,
    pub(crate) req: ValidRequest,
    pub(crate) tx: UnboundedSender<Event>,
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
    tx: UnboundedSender<Event>,
    ticket: Ticket,
    text: RequestText,
    generated: usize,
    since: Instant,
}

struct Worker {
    backend: Box<dyn Backend>,
    sched: Scheduler,
    active: HashMap<SeqId, Active>,
    rx: Receiver<Command>,
    tokenizer: Tokenizer,
    max_ctx: usize,
    stats: Arc<Mutex<ModelStats>>,
    admission: Arc<Admission>,
    shutting_down: bool,
    steps: u64,
    generated_total: u64,
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
    let cuda = match cfg.device {
        Device::Cpu => None,
        Device::Auto if !cuda_available() => None,
        Device::Auto => Some(0),
        Device::Cuda(n) => Some(n),
    };
    let free = match cuda {
        Some(n) => Gpu::open(n)?.mem_info()?.0,
        None => host_available_bytes()?,
    };
    let n = kv_blocks_from_memory(
        free.saturating_sub(weights.nbytes()),
        reserve,
        fraction,
        kv_block_bytes(c, cfg.block_size),
        cap,
    );
    if n < 2 {
        return Err(Error::Input(format!(
            "no memory left for the KV cache: {} MiB free, weights {} MiB, reserve {} MiB",
            free >> 20,
            weights.nbytes() >> 20,
            reserve >> 20
        )));
    }
    Ok(n)
}

/// `MemAvailable` of /proc/meminfo.
fn host_available_bytes() -> Result<usize> {
    let p = std::path::Path::new("/proc/meminfo");
    let s = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
    s.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| Error::Input("/proc/meminfo has no MemAvailable line".into()))
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
    let blocks = kv_blocks(&weights, &cfg)?;
    let max_ctx = weights.config.max_ctx;
    let vocab = weights.config.vocab;
    let backend = open_backend(cfg.device, weights, blocks, cfg.block_size, cfg.threads)?;
    let scfg = cfg.scheduler.clone();
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
        kv_blocks: blocks,
        block_size: cfg.block_size,
    };
    let w = Worker {
        backend,
        sched,
        active: HashMap::new(),
        rx,
        tokenizer,
        max_ctx,
        stats,
        admission,
        shutting_down: false,
        steps: 0,
        generated_total: 0,
    };
    Ok((w, info))
}

/// The thread body: open the backend, report, then serve until shut down.
pub(crate) fn run(args: WorkerArgs, ready: Sender<Result<ModelInfo>>) {
    let alive = args.alive.clone();
    let mut args = Some(args);
    let mut w = match open(&mut args) {
        Ok((w, r)) => {
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

impl Worker {
    /// After a panic in the serving loop: every open and queued request ends with an Error
    /// event (nothing admitted is dropped silently); the engine reports itself not ready.
    fn fail_all(&mut self, why: &str) {
        let msg = format!("the engine thread failed: {why}");
        for (_, a) in self.active.drain() {
            let _ = a.tx.send(Event::Error(msg.clone()));
        }
        while let Ok(c) = self.rx.try_recv() {
            if let Command::Submit(s) = c {
                let _ = s.tx.send(Event::Error(msg.clone()));
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
            Command::Submit(s) => *s,
        };
        let ns = namespace(&s.req.tenant, s.req.cache_salt.as_deref());
        self.sched.add(NewSeq {
            id: s.id,
            tenant: s.req.tenant.clone(),
            namespace: ns,
            prompt: s.req.prompt.clone(),
        });
        let a = Active {
            text: RequestText::new(&self.tokenizer, s.req.stop.clone()),
            req: s.req,
            tx: s.tx,
            ticket: s.ticket,
            generated: 0,
            since: Instant::now(),
        };
        self.active.insert(s.id, a);
    }

    /// One engine step.
    fn step(&mut self) {
        self.reap_cancelled();
        let plan = self.sched.schedule();
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
        let events = match self.execute(&plan) {
            Ok(logits) => self.update(&plan, logits),
            Err(e) => plan
                .seqs
                .iter()
                .map(|p| (p.id, Event::Error(format!("the model failed: {e}"))))
                .collect(),
        };
        self.emit(events);
        self.steps += 1;
    }

    /// Runs the planned rows on the backend.
    fn execute(&mut self, plan: &SchedulerOutput) -> Result<Vec<Vec<f32>>> {
        let out = self.backend.step(&plan.batch)?;
        self.sched.complete(plan);
        let want = plan.seqs.iter().filter(|p| p.sample).count();
        if out.logits.len() != want {
            return Err(Error::Backend {
                backend: self.backend.name(),
                what: format!("{} logit rows for {want} requests", out.logits.len()),
            });
        }
        Ok(out.logits)
    }

    /// Samples the next token of every sequence that reached its end and decides which finish.
    fn update(&mut self, plan: &SchedulerOutput, logits: Vec<Vec<f32>>) -> Vec<(SeqId, Event)> {
        let mut events = Vec::new();
        let sampled = plan.seqs.iter().filter(|p| p.sample);
        for (p, l) in sampled.zip(logits) {
            match self.next_token(p.id, &l) {
                Ok(evs) => events.extend(evs.into_iter().map(|e| (p.id, e))),
                Err(e) => events.push((p.id, Event::Error(e.to_string()))),
            }
        }
        events
    }

    /// The events of one sampled position (a token, and `Done` when it is the last).
    fn next_token(&mut self, id: SeqId, logits: &[f32]) -> Result<Vec<Event>> {
        let (Some(a), Some(history)) = (self.active.get_mut(&id), self.sched.tokens(id)) else {
            return Ok(Vec::new());
        };
        let pos = history.len();
        let tok = sample(logits, history, &a.req.params, pos as u64);
        let lp = a
            .req
            .logprobs
            .map(|n| logprobs(logits, history, &a.req.params, tok, n));
        let token = |text: String| {
            let (logprob, top_logprobs) = match &lp {
                Some((l, t)) => (Some(*l), t.clone()),
                None => (None, Vec::new()),
            };
            Event::Token(TokenEvent {
                id: tok,
                text,
                logprob,
                top_logprobs,
            })
        };
        let usage = |generated| Usage {
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: generated,
            cached_tokens: self.sched.cached_tokens(id),
        };
        if !a.req.ignore_eos && self.tokenizer.stop_ids().contains(&tok) {
            // End of sequence: not part of the output (no token event, no logprob); the text
            // held back goes out as text only.
            let tail = a.text.end_of_sequence();
            let mut evs = Vec::new();
            if !tail.is_empty() {
                evs.push(Event::Text(tail));
            }
            evs.push(Event::Done {
                finish_reason: FinishReason::Stop,
                usage: usage(a.generated),
            });
            return Ok(evs);
        }
        a.generated += 1;
        let end = a.generated >= a.req.max_tokens || pos + 1 >= self.max_ctx;
        let (text, stopped) = a.text.token(tok, end)?;
        let mut evs = vec![token(text)];
        if stopped || end {
            let finish_reason = if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            evs.push(Event::Done {
                finish_reason,
                usage: usage(a.generated),
            });
        } else {
            self.sched.append_token(id, tok);
        }
        self.generated_total += 1;
        Ok(evs)
    }

    /// Sends the events; a request ends with its `Done` or `Error` (or a closed stream).
    fn emit(&mut self, events: Vec<(SeqId, Event)>) {
        for (id, ev) in events {
            let last = matches!(ev, Event::Done { .. } | Event::Error(_));
            let sent = self.active.get(&id).is_some_and(|a| a.tx.send(ev).is_ok());
            if last || !sent {
                self.end(id);
            }
        }
    }

    /// Removes a request everywhere and frees its KV blocks.
    fn end(&mut self, id: SeqId) {
        self.sched.finish(id);
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
        }
    }
}
