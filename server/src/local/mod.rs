//! STOPGAP until the engine loop (`EngineHandle`, branch `eng`) lands: a serial engine that runs
//! one request at a time per model on a worker thread, using the engine's public Backend step,
//! sampler and stream decoder. It honours the seam fully (events, stop strings, logprobs,
//! cancellation on drop, context checks) but does not batch or cache prefixes
//! (`cached_tokens` is always 0). Replace with `impl Generate for EngineHandle`.

mod stop;
pub mod text;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use memra_engine::backend::Device;
use memra_engine::request::{EventStream, SubmitError, ValidRequest};

use crate::engine::{EngineStats, Generate, ModelInfo};
pub use worker::Job;

/// KV block size of the stopgap engine.
pub const BLOCK_SIZE: usize = 16;
/// Longest context the stopgap engine allocates KV for.
pub const MAX_CONTEXT: usize = 8192;

/// What to load.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    pub models: Vec<(String, PathBuf)>,
    pub device: Device,
    pub threads: usize,
    /// Requests waiting per model before `Overloaded`.
    pub max_queue: usize,
}

struct Served {
    info: ModelInfo,
    tx: Mutex<mpsc::Sender<Job>>,
}

/// Counters shared with the workers.
#[derive(Default)]
pub struct Counters {
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_used: AtomicUsize,
    pub kv_total: AtomicUsize,
}

pub struct LocalEngine {
    served: RwLock<Vec<Arc<Served>>>,
    expected: usize,
    draining: AtomicBool,
    counters: Arc<Counters>,
    max_queue: usize,
    device: Mutex<String>,
}

impl LocalEngine {
    /// Loads the models on a background thread (showing a progress bar); `on_error` is called
    /// if one fails. `/ready` turns 200 once all are loaded.
    pub fn start(cfg: LocalConfig, on_error: Box<dyn FnOnce(String) + Send>) -> Arc<LocalEngine> {
        let engine = Arc::new(LocalEngine {
            served: RwLock::new(Vec::new()),
            expected: cfg.models.len(),
            draining: AtomicBool::new(false),
            counters: Arc::new(Counters::default()),
            max_queue: cfg.max_queue,
            device: Mutex::new(String::from("loading")),
        });
        let e = engine.clone();
        std::thread::spawn(move || {
            for (alias, path) in &cfg.models {
                if let Err(msg) = e.load_one(&cfg, alias, path) {
                    on_error(msg);
                    return;
                }
            }
        });
        engine
    }

    fn load_one(&self, cfg: &LocalConfig, alias: &str, path: &Path) -> Result<(), String> {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("loading {alias} from {}", path.display()));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        let loaded = worker::load(cfg, path, &self.counters);
        bar.finish_and_clear();
        let (text, ctx, backend_name, tx) =
            loaded.map_err(|e| format!("loading {alias} ({}): {e}", path.display()))?;
        tracing::info!("loaded {alias} on {backend_name} (context {ctx})");
        if let Ok(mut d) = self.device.lock() {
            *d = backend_name;
        }
        let info = ModelInfo {
            alias: alias.to_string(),
            context_len: ctx,
            created: crate::routes::shape::now_secs(),
            text,
        };
        if let Ok(mut s) = self.served.write() {
            s.push(Arc::new(Served {
                info,
                tx: Mutex::new(tx),
            }));
        }
        Ok(())
    }

    fn find(&self, alias: &str) -> Option<Arc<Served>> {
        self.served
            .read()
            .ok()?
            .iter()
            .find(|s| s.info.alias == alias)
            .cloned()
    }
}

impl Generate for LocalEngine {
    fn submit(&self, req: ValidRequest) -> Result<EventStream, SubmitError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::Draining);
        }
        let served = self
            .find(&req.model)
            .ok_or_else(|| SubmitError::ModelNotFound(req.model.clone()))?;
        let ctx = served.info.context_len;
        if req.prompt.len() + req.max_tokens > ctx {
            return Err(SubmitError::ContextLength {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                ctx,
            });
        }
        if self.counters.queued.load(Ordering::SeqCst) >= self.max_queue {
            return Err(SubmitError::Overloaded { retry_after_s: 1 });
        }
        let (tx, stream) = EventStream::channel();
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        let sent = served
            .tx
            .lock()
            .map_err(|_| SubmitError::Invalid("engine worker lock poisoned".into()))?
            .send(Job { req, tx });
        if sent.is_err() {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Invalid(
                "the model's worker has stopped".into(),
            ));
        }
        Ok(stream)
    }

    fn models(&self) -> Vec<ModelInfo> {
        match self.served.read() {
            Ok(s) => s.iter().map(|s| s.info.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn stats(&self) -> EngineStats {
        let c = &self.counters;
        let used = c.kv_used.load(Ordering::SeqCst);
        EngineStats {
            queue_depth: c.queued.load(Ordering::SeqCst),
            running: c.running.load(Ordering::SeqCst),
            kv_blocks_used: used,
            kv_blocks_free: c.kv_total.load(Ordering::SeqCst).saturating_sub(used),
        }
    }

    fn ready(&self) -> bool {
        self.served.read().map(|s| s.len()).unwrap_or(0) == self.expected
    }

    fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    fn device(&self) -> String {
        self.device.lock().map(|d| d.clone()).unwrap_or_default()
    }
}
