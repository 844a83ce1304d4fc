//! The engine: one thread per model owns that model's backend and scheduler (an actor fed by a
//! command channel); [`EngineHandle`] is the cheap, cloneable front the server holds.
//!
//! `submit` answers at once: tenant-scoped admission control (per-tenant and global limits) runs
//! on the caller's thread against the one shared [`admission`] ledger, so a refusal never waits
//! for a step. Everything admitted reaches the model's thread and ends with exactly one `Done` or
//! `Error` event (or is cancelled by dropping its stream).

mod admission;
pub(crate) mod memlimit;
pub(crate) mod output;
mod speculate;
mod worker;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use admission::Admission;
pub use admission::AdmissionLimits;
pub(crate) use worker::host_available_bytes;

use crate::backend::Device;
use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
pub use crate::kv_format::KvDtype;
use crate::loader::Model;
use crate::request::{EventStream, SubmitError, ValidRequest};
use crate::scheduler::SchedulerConfig;
use crate::tokenizer::Tokenizer;

/// How many KV blocks a model gets.
#[derive(Clone, Debug, PartialEq)]
pub enum KvBudget {
    /// Exactly this many blocks.
    Blocks(usize),
    /// From free device memory (CUDA) or available host memory (CPU) at load, after the weights
    /// and `reserve_bytes`, using at most `fraction` of the rest; capped at `max_running`
    /// full-context sequences.
    Auto { fraction: f64, reserve_bytes: usize },
}

/// Per-model engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub device: Device,
    /// CPU backend threads (0 = all cores).
    pub threads: usize,
    /// Positions per KV block.
    pub block_size: usize,
    pub kv: KvBudget,
    /// The KV cache's element format.
    pub kv_dtype: KvDtype,
    /// Scheduler limits (token budget per step, running sequences, per-tenant running cap,
    /// admission reserve).
    pub scheduler: SchedulerConfig,
    /// Share full prompt blocks between requests of the same namespace.
    pub prefix_cache: bool,
    /// Speculative decoding (`None`: plain decoding only).
    pub spec: Option<crate::spec::SpecConfig>,
    /// Pipeline stages (`--pp`, `--devices`, `--pp-split`; default: unsplit).
    pub pp: crate::pipeline::PpConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            device: Device::Auto,
            threads: 0,
            block_size: 16,
            kv: KvBudget::Auto {
                fraction: 0.9,
                reserve_bytes: 1 << 30,
            },
            kv_dtype: KvDtype::default(),
            scheduler: SchedulerConfig::default(),
            prefix_cache: true,
            spec: None,
            pp: crate::pipeline::PpConfig::default(),
        }
    }
}

/// A served model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    pub alias: String,
    /// The model's context length (prompt + completion positions).
    pub max_ctx: usize,
    /// Positions one request may really use: `max_ctx`, or fewer when the KV pool (less the
    /// admission reserve) holds fewer. Requests are checked against this.
    pub max_positions: usize,
    pub vocab: usize,
    /// Backend name (`cpu`, the GPU's name).
    pub backend: String,
    /// The backend's tuned parameters ([`crate::backend::Backend::profile`]).
    pub profile: Option<String>,
    pub kv_blocks: usize,
    pub block_size: usize,
    /// The KV cache's format and its bytes per position (K and V of every layer); the KV
    /// capacity in positions is `kv_blocks * block_size`.
    pub kv_dtype: KvDtype,
    pub kv_token_bytes: usize,
    /// The weight bytes one batch-1 decode token reads
    /// ([`crate::models::ModelWeights::decode_read_bytes`]: the routed experts of an MoE, one
    /// embedding row, the whole head); the roofline's bytes with `kv_token_bytes` x context.
    pub weight_token_bytes: usize,
    /// Speculative decoding: the drafter in use (`ngram`, `mtp+ngram`, ...) and its most
    /// drafts per step; `None` when the model decodes plainly.
    pub spec: Option<(String, usize)>,
    /// What opening the drafter noticed (an `auto` drafter that left the MTP layers out).
    pub spec_notes: Vec<String>,
    /// How the model is split over pipeline stages (crate::pipeline), one line; `None`:
    /// unsplit.
    pub pipeline: Option<String>,
    /// The width of an input embedding row (image rows must have it):
    /// `ModelConfig::embed_width`, the hidden size (times one plus the deepstack parts of a
    /// qwen3vl model).
    pub hidden: usize,
    /// Whether the model places image rows by M-RoPE (qwen2vl, qwen3vl): an image must say
    /// its token grid (`MediaSpan::grid`).
    pub mrope: bool,
    /// Whether requests may carry image rows ([`crate::backend::Backend::accepts_embeds`]).
    pub image_input: bool,
    /// The most rows of one image: a prefill chunk holds an image whole (scheduler.rs
    /// `chunk_rows`), so an image fits the step's token budget.
    pub max_image_rows: usize,
}

/// A tenant's requests in the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Admitted, not yet running (waiting for a slot or KV).
    pub queued: usize,
    pub running: usize,
}

/// One model's counters (published by its thread after every step).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStats {
    pub alias: String,
    pub waiting: usize,
    pub running: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_free: usize,
    /// Idle blocks kept by the prefix cache (counted in `kv_blocks_free`: evictable).
    pub kv_blocks_cached: usize,
    pub prefix_hit_tokens_total: u64,
    pub preemptions_total: u64,
    pub steps_total: u64,
    pub tokens_generated_total: u64,
    /// Draft tokens checked / accepted by speculative decoding.
    pub spec_drafted_total: u64,
    pub spec_accepted_total: u64,
    /// Sequence steps that checked at least one draft.
    pub spec_steps_total: u64,
    /// Decode steps of sequences that may speculate but checked no draft, by reason.
    pub spec_fallbacks: crate::spec::SpecFallbacks,
    /// The drafter (`ngram`, `mtp+ngram`, ...; empty when the model does not speculate) and
    /// the counters of each drafter it drafts with.
    pub spec_drafter: String,
    pub spec_by_drafter: Vec<(String, crate::spec::SpecCounts)>,
    /// The counters of looked-up (n-gram) drafts per length of the match that proposed them:
    /// 1, 2, 3, 4 or more tokens ([`crate::spec::MATCH_LABELS`]).
    pub spec_by_match: [crate::spec::SpecCounts; crate::spec::control::MATCH_BUCKETS],
    /// The counters of drafts from the traffic store (crate::spec::traffic: the outputs of
    /// earlier requests of the same tenant and `cache_salt`), drafted where the sequence's own
    /// context had no match of 2 or more tokens.
    pub spec_by_traffic: crate::spec::SpecCounts,
}

/// A snapshot of the whole engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Admitted requests not yet running, all models.
    pub queue_depth: usize,
    pub running: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_free: usize,
    pub prefix_hit_tokens_total: u64,
    pub requests_finished_total: u64,
    pub requests_refused_total: u64,
    pub tenants: BTreeMap<String, TenantStats>,
    pub models: Vec<ModelStats>,
    pub draining: bool,
}

/// What the handle sends to a model's thread.
pub(crate) enum Command {
    Submit(Box<worker::Submitted>),
    /// The request's stream ended it (a stop string matched, or its text failed): end the
    /// sequence.
    End(crate::scheduler::SeqId),
    Shutdown,
}

struct ModelEntry {
    info: ModelInfo,
    tokenizer: Tokenizer,
    chat: Option<ChatTemplate>,
    grammars: crate::grammar::Grammars,
    tx: Sender<Command>,
    stats: Arc<Mutex<ModelStats>>,
}

struct Inner {
    models: Vec<ModelEntry>,
    admission: Arc<Admission>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    alive: Arc<AtomicBool>,
}

/// The engine's front: clone it freely; every clone talks to the same model threads.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Opens every model's backend on its own thread and returns once all are ready (or the
    /// first error). `limits` apply across all models.
    pub fn start(
        models: Vec<(String, Model, EngineConfig)>,
        limits: AdmissionLimits,
    ) -> Result<EngineHandle> {
        if models.is_empty() {
            return Err(Error::Input("the engine needs at least one model".into()));
        }
        let admission = Arc::new(Admission::new(limits));
        let alive = Arc::new(AtomicBool::new(true));
        let mut entries = Vec::new();
        let mut threads = Vec::new();
        for (alias, model, cfg) in models {
            if entries.iter().any(|e: &ModelEntry| e.info.alias == alias) {
                return Err(Error::Input(format!(
                    "model alias `{alias}` is given twice"
                )));
            }
            let (tx, rx) = channel();
            let stats = Arc::new(Mutex::new(ModelStats {
                alias: alias.clone(),
                ..Default::default()
            }));
            let Model {
                weights,
                tokenizer,
                chat,
                ..
            } = model;
            let (ready_tx, ready_rx) = channel();
            let args = worker::WorkerArgs {
                alias: alias.clone(),
                weights,
                tokenizer: tokenizer.clone(),
                cfg: cfg.clone(),
                rx,
                stats: stats.clone(),
                admission: admission.clone(),
                alive: alive.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("memra-engine-{alias}"))
                .spawn(move || worker::run(args, ready_tx))
                .map_err(|e| Error::Input(format!("starting the engine thread: {e}")))?;
            threads.push(h);
            let info: ModelInfo = ready_rx.recv().map_err(|_| {
                Error::Input(format!(
                    "the engine thread of `{alias}` exited while loading"
                ))
            })??;
            entries.push(ModelEntry {
                info,
                grammars: crate::grammar::Grammars::new(&tokenizer),
                tokenizer,
                chat,
                tx,
                stats,
            });
        }
        Ok(EngineHandle {
            inner: Arc::new(Inner {
                models: entries,
                admission,
                threads: Mutex::new(threads),
                next_id: AtomicU64::new(1),
                alive,
            }),
        })
    }
}

impl EngineHandle {
    fn entry(&self, alias: &str) -> Option<&ModelEntry> {
        self.inner.models.iter().find(|m| m.info.alias == alias)
    }

    /// Validates and admits a request; its events arrive on the returned stream. Refusals are
    /// immediate: unknown model, context, invalid input, tenant limit (429), global overload or
    /// draining (503).
    pub fn submit(&self, req: ValidRequest) -> std::result::Result<EventStream, SubmitError> {
        let m = self
            .entry(&req.model)
            .ok_or_else(|| SubmitError::ModelNotFound(req.model.clone()))?;
        check_request(&req, m)?;
        let ticket = self
            .inner
            .admission
            .admit(&req.tenant, req.tenant_max_in_flight)?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let end = output::EndRequest {
            tx: m.tx.clone(),
            id,
        };
        let (tx, stream) = EventStream::engine(&m.tokenizer, &req, end);
        let sub = worker::Submitted {
            id,
            req,
            tx,
            ticket,
        };
        m.tx.send(Command::Submit(Box::new(sub))).map_err(|e| {
            // The thread is gone: give the slot back.
            let Command::Submit(s) = e.0 else {
                return SubmitError::Draining;
            };
            self.inner.admission.finished(&s.ticket, 0.0);
            SubmitError::Draining
        })?;
        Ok(stream)
    }

    /// The served models.
    pub fn models(&self) -> Vec<ModelInfo> {
        self.inner.models.iter().map(|m| m.info.clone()).collect()
    }

    /// A model's tokenizer (the server tokenizes; cheap to clone).
    pub fn tokenizer(&self, alias: &str) -> Option<&Tokenizer> {
        self.entry(alias).map(|m| &m.tokenizer)
    }

    /// A model's structured-output grammars (compiled once per grammar, cached).
    pub fn grammars(&self, alias: &str) -> Option<&crate::grammar::Grammars> {
        self.entry(alias).map(|m| &m.grammars)
    }

    /// A model's chat template, if it has one.
    pub fn chat_template(&self, alias: &str) -> Option<&ChatTemplate> {
        self.entry(alias).and_then(|m| m.chat.as_ref())
    }

    /// Counters of the engine and each model.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.inner.admission.snapshot();
        for m in &self.inner.models {
            let ms = m.stats.lock().map(|g| g.clone()).unwrap_or_default();
            s.running += ms.running;
            s.kv_blocks_used += ms.kv_blocks_used;
            s.kv_blocks_free += ms.kv_blocks_free;
            s.prefix_hit_tokens_total += ms.prefix_hit_tokens_total;
            s.models.push(ms);
        }
        s
    }

    /// Stops admitting (`SubmitError::Draining`); requests in flight finish.
    pub fn drain(&self) {
        self.inner.admission.set_draining();
    }

    /// Drains, waits for the requests in flight to finish, and stops the model threads.
    pub fn shutdown(&self) {
        self.drain();
        for m in &self.inner.models {
            let _ = m.tx.send(Command::Shutdown);
        }
        let threads: Vec<JoinHandle<()>> = match self.inner.threads.lock() {
            Ok(mut g) => g.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for t in threads {
            let _ = t.join();
        }
    }

    /// True while every model thread runs and the engine admits requests.
    pub fn is_ready(&self) -> bool {
        self.inner.alive.load(Ordering::Acquire) && !self.inner.admission.is_draining()
    }
}

/// The checks that need the model: lengths, sampling ranges, stop strings.
fn check_request(req: &ValidRequest, m: &ModelEntry) -> std::result::Result<(), SubmitError> {
    if req.prompt.is_empty() {
        return Err(SubmitError::Invalid("the prompt is empty".into()));
    }
    if req.max_tokens == 0 {
        return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
    }
    if let Some(bad) = req.prompt.iter().find(|&&t| t as usize >= m.info.vocab) {
        return Err(SubmitError::Invalid(format!(
            "prompt token id {bad} is out of range (vocabulary has {} tokens)",
            m.info.vocab
        )));
    }
    if let Some(n) = req.logprobs
        && n > 20
    {
        return Err(SubmitError::Invalid(format!(
            "logprobs = {n}: at most 20 alternatives"
        )));
    }
    if req.stop.iter().any(|s| s.is_empty()) {
        return Err(SubmitError::Invalid("a stop string is empty".into()));
    }
    if !req.media.is_empty() {
        if !m.info.image_input {
            return Err(SubmitError::Invalid(format!(
                "model `{}` does not take image input on {}",
                m.info.alias, m.info.backend
            )));
        }
        crate::vision::check_spans(&req.media, req.prompt.len(), m.info.hidden)
            .map_err(|e| SubmitError::Invalid(e.to_string()))?;
        if m.info.mrope && req.media.iter().any(|s| s.grid.is_none()) {
            return Err(SubmitError::Invalid(format!(
                "model `{}` places image rows by M-RoPE: every image needs its token grid",
                m.info.alias
            )));
        }
        if let Some(s) = req.media.iter().find(|s| s.rows() > m.info.max_image_rows) {
            return Err(SubmitError::Invalid(format!(
                "an image or video of {} tokens does not fit the step budget of {} tokens (its \
                 tokens are computed in one step: raise max_batch_tokens)",
                s.rows(),
                m.info.max_image_rows
            )));
        }
    }
    req.params
        .validate()
        .map_err(|e| SubmitError::Invalid(e.to_string()))?;
    let total = req.prompt.len().saturating_add(req.max_tokens);
    if total > m.info.max_positions {
        return Err(SubmitError::ContextLength {
            prompt: req.prompt.len(),
            max_tokens: req.max_tokens,
            ctx: m.info.max_positions,
        });
    }
    Ok(())
}
