//! A scripted engine for tests: a byte tokenizer, a plain chat template and a fixed reply,
//! with behaviours picked by markers in the prompt text:
//!
//! - `[overload]` / `[tenant-limit]` / `[draining]`: refused at submission;
//! - `[fail]`: two tokens, then an error event;
//! - `[slow]`: 20 ms between tokens (disconnect and drain tests);
//! - `[queued]`: waits 2 s in the (simulated) queue before its first token (drain tests); the
//!   stats count it in its tenant's `queued` meanwhile;
//! - `[slow-tokenize]` in a chat message: tokenizing takes 400 ms (slot-holding tests).
//!
//! Sampling with temperature > 0 rotates the reply by the seed, so equal seeds give equal text.
//! Stop strings, `max_tokens` and `ignore_eos` behave as the seam describes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memra_engine::Result;
use memra_engine::chat::ChatMessage;
use memra_engine::engine::{EngineStats, ModelStats, TenantStats};
use memra_engine::generate::FinishReason;
use memra_engine::request::{Event, EventStream, SubmitError, TokenEvent, Usage, ValidRequest};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{Generate, ModelText, ServedModel};

/// The fake model's alias.
pub const FAKE_MODEL: &str = "tiny";
/// What the fake model says.
pub const REPLY: &str = "The quick brown fox jumps over the lazy dog.";
/// The fake model's context length.
pub const FAKE_CONTEXT: usize = 512;
const BOS: u32 = 1;
const BYTE_BASE: u32 = 3;
const KV_BLOCKS: usize = 128;

/// Byte-level tokenizer: token `b + 3` is byte `b`; BOS is 1.
pub struct ByteText;

impl ModelText for ByteText {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = vec![BOS];
        ids.extend(text.bytes().map(|b| u32::from(b) + BYTE_BASE));
        Ok(ids)
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        if messages
            .iter()
            .any(|m| m.content.contains("[slow-tokenize]"))
        {
            std::thread::sleep(Duration::from_millis(400));
        }
        let mut s = String::new();
        for m in messages {
            s.push_str(&format!("<|{}|>\n{}\n", m.role, m.content));
        }
        s.push_str("<|assistant|>\n");
        self.encode(&s)
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        match id.checked_sub(BYTE_BASE).and_then(|b| u8::try_from(b).ok()) {
            Some(b) => vec![b],
            None => Vec::new(),
        }
    }

    fn vocab_size(&self) -> usize {
        256 + BYTE_BASE as usize
    }
}

fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids
        .iter()
        .filter_map(|&i| i.checked_sub(BYTE_BASE).and_then(|b| u8::try_from(b).ok()))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// (tenant, cache_salt, prompt) of a simulated prefix-cache entry.
type CacheKey = (String, Option<String>, Vec<u32>);

/// The scripted engine. Counters are public for tests.
pub struct FakeEngine {
    ready: AtomicBool,
    draining: AtomicBool,
    /// Requests whose generation task is still running.
    pub live: Arc<AtomicUsize>,
    /// Requests that ended because the client went away.
    pub cancelled: Arc<AtomicUsize>,
    /// Every request submitted, in order.
    pub submitted: Mutex<Vec<ValidRequest>>,
    /// Live requests per tenant, queued or running.
    tenants: Ledger,
    seen_prompts: Mutex<HashSet<CacheKey>>,
    created: u64,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeEngine {
    pub fn new() -> FakeEngine {
        FakeEngine {
            ready: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            live: Arc::new(AtomicUsize::new(0)),
            cancelled: Arc::new(AtomicUsize::new(0)),
            submitted: Mutex::new(Vec::new()),
            tenants: Ledger::default(),
            seen_prompts: Mutex::new(HashSet::new()),
            created: 1_700_000_000,
        }
    }

    /// Marks the models loaded or not (`/ready`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The reply text for a request, before stop strings.
    fn script(req: &ValidRequest) -> String {
        let rot = if req.params.temperature > 0.0 {
            (req.params.seed % REPLY.len() as u64) as usize
        } else {
            0
        };
        let base: String = REPLY.chars().cycle().skip(rot).take(REPLY.len()).collect();
        if req.ignore_eos {
            base.chars().cycle().take(req.max_tokens).collect()
        } else {
            base
        }
    }
}

type Ledger = Arc<Mutex<HashMap<String, TenantStats>>>;

/// Decrements the live count and the tenant's ledger when the generation task ends, however
/// it ends.
struct LiveGuard {
    live: Arc<AtomicUsize>,
    tenants: Ledger,
    tenant: String,
    running: bool,
}

impl LiveGuard {
    fn update(&self, f: impl FnOnce(&mut TenantStats)) {
        if let Ok(mut t) = self.tenants.lock() {
            let e = t.entry(self.tenant.clone()).or_default();
            f(e);
            if *e == TenantStats::default() {
                t.remove(&self.tenant);
            }
        }
    }

    /// The request leaves the queue and runs.
    fn start(&mut self) {
        if !self.running {
            self.running = true;
            self.update(|e| {
                e.queued = e.queued.saturating_sub(1);
                e.running += 1;
            });
        }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        let running = self.running;
        self.update(|e| {
            if running {
                e.running = e.running.saturating_sub(1);
            } else {
                e.queued = e.queued.saturating_sub(1);
            }
        });
    }
}

struct Job {
    tx: UnboundedSender<Event>,
    text: String,
    reason: FinishReason,
    usage: Usage,
    logprobs: Option<usize>,
    fail: bool,
    delay: Duration,
    /// Time in the queue before the first token.
    hold: Duration,
    cancelled: Arc<AtomicUsize>,
    live: LiveGuard,
}

async fn run_job(mut job: Job) {
    if !job.hold.is_zero() {
        tokio::select! {
            _ = job.tx.closed() => {
                job.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ = tokio::time::sleep(job.hold) => {}
        }
    }
    job.live.start();
    let mut sent = 0;
    for (i, b) in job.text.bytes().enumerate() {
        if job.fail && i == 2 {
            let _ = job.tx.send(Event::Error("fake engine failure".into()));
            return;
        }
        let id = u32::from(b) + BYTE_BASE;
        let top = job
            .logprobs
            .map(|n| (0..n as u32).map(|k| (id + k, -0.5 - k as f32)).collect())
            .unwrap_or_default();
        let ev = Event::Token(TokenEvent {
            id,
            text: String::from_utf8_lossy(&[b]).into_owned(),
            logprob: job.logprobs.map(|_| -0.5),
            top_logprobs: top,
        });
        if job.tx.send(ev).is_err() {
            job.cancelled.fetch_add(1, Ordering::SeqCst);
            return;
        }
        sent += 1;
        tokio::select! {
            _ = job.tx.closed() => {
                job.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ = tokio::time::sleep(job.delay) => {}
        }
    }
    let usage = Usage {
        completion_tokens: sent,
        ..job.usage
    };
    let _ = job.tx.send(Event::Done {
        finish_reason: job.reason,
        usage,
    });
}

impl Generate for FakeEngine {
    fn submit(&self, req: ValidRequest) -> std::result::Result<EventStream, SubmitError> {
        if let Ok(mut s) = self.submitted.lock() {
            s.push(req.clone());
        }
        if req.model != FAKE_MODEL {
            return Err(SubmitError::ModelNotFound(req.model));
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::Draining);
        }
        let prompt_text = decode(&req.prompt);
        if prompt_text.contains("[overload]") {
            return Err(SubmitError::Overloaded { retry_after_s: 2 });
        }
        if prompt_text.contains("[tenant-limit]") {
            return Err(SubmitError::TenantLimit {
                tenant: req.tenant.clone(),
                retry_after_s: 3,
            });
        }
        if prompt_text.contains("[draining]") {
            return Err(SubmitError::Draining);
        }
        if req.prompt.len() + req.max_tokens > FAKE_CONTEXT {
            return Err(SubmitError::ContextLength {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                ctx: FAKE_CONTEXT,
            });
        }
        let mut text = Self::script(&req);
        let mut reason = FinishReason::Stop;
        if text.len() > req.max_tokens {
            text.truncate(req.max_tokens);
            reason = FinishReason::Length;
        }
        let cut = req.stop.iter().filter_map(|s| text.find(s.as_str())).min();
        if let Some(cut) = cut {
            text.truncate(cut);
            reason = FinishReason::Stop;
        }
        let key = (
            req.tenant.clone(),
            req.cache_salt.clone(),
            req.prompt.clone(),
        );
        let seen = match self.seen_prompts.lock() {
            Ok(mut s) => !s.insert(key),
            Err(_) => false,
        };
        let (tx, stream) = EventStream::channel();
        self.live.fetch_add(1, Ordering::SeqCst);
        let hold = if prompt_text.contains("[queued]") {
            Duration::from_secs(2)
        } else {
            Duration::ZERO
        };
        let live = LiveGuard {
            live: self.live.clone(),
            tenants: self.tenants.clone(),
            tenant: req.tenant.clone(),
            running: false,
        };
        live.update(|e| e.queued += 1);
        let job = Job {
            tx,
            text,
            reason,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                completion_tokens: 0,
                cached_tokens: if seen { req.prompt.len() / 16 * 16 } else { 0 },
                ..Default::default()
            },
            logprobs: req.logprobs,
            fail: prompt_text.contains("[fail]"),
            delay: Duration::from_millis(if prompt_text.contains("[slow]") {
                20
            } else {
                0
            }),
            hold,
            cancelled: self.cancelled.clone(),
            live,
        };
        tokio::spawn(run_job(job));
        Ok(stream)
    }

    fn models(&self) -> Vec<ServedModel> {
        if !self.ready.load(Ordering::SeqCst) {
            return Vec::new();
        }
        vec![ServedModel {
            alias: FAKE_MODEL.into(),
            context_len: FAKE_CONTEXT,
            created: self.created,
            backend: "fake".into(),
            profile: None,
            pipeline: None,
            kv_cache: None,
            text: Arc::new(ByteText),
            vision: None,
        }]
    }

    fn stats(&self) -> EngineStats {
        let running = self.live.load(Ordering::SeqCst);
        let used = (running * 2).min(KV_BLOCKS);
        let tenants = self.tenants.lock().map(|t| t.clone()).unwrap_or_default();
        EngineStats {
            queue_depth: tenants.values().map(|t| t.queued).sum(),
            running,
            kv_blocks_used: used,
            kv_blocks_free: KV_BLOCKS - used,
            tenants: tenants.into_iter().collect(),
            models: vec![ModelStats {
                alias: FAKE_MODEL.into(),
                kv_blocks_total: KV_BLOCKS,
                kv_blocks_used: used,
                kv_blocks_free: KV_BLOCKS - used,
                ..ModelStats::default()
            }],
            ..EngineStats::default()
        }
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    fn device(&self) -> String {
        "fake".into()
    }
}
