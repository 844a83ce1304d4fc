//! [`Generate`] for the engine loop's [`EngineHandle`]: models load on a background thread
//! (progress bars on stderr) while the server already answers `/health` (and `/ready` 503).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use memra_engine::Result;
use memra_engine::backend::Device;
use memra_engine::chat::ChatMessage;
use memra_engine::engine::{
    AdmissionLimits, Engine, EngineConfig, EngineHandle, EngineStats, KvBudget,
};
use memra_engine::loader::load_model;
use memra_engine::request::{EventStream, SubmitError, ValidRequest};
use memra_engine::scheduler::SchedulerConfig;
use memra_engine::spec::DrafterKind;
use memra_engine::vision::{ImageTokens, VisionTower};
use std::collections::HashMap;

use crate::media::Vision;

use crate::config::ServeArgs;
use crate::engine::{Generate, KvCacheJson, ModelText, ServedModel};
use crate::tools::ToolStyle;
use memra_engine::grammar::{Grammar, GrammarSpec};
use serde_json::Value;

/// The tokenizer and chat template of one of the handle's models.
struct HandleText {
    handle: EngineHandle,
    alias: String,
}

impl HandleText {
    fn render_media(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        marker: &str,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        let (rendered, contents) = self.render(messages, tools)?;
        self.tokenizer()?
            .encode_chat_media(&rendered, &contents, marker)
    }

    /// The chat template's text for `messages` and each message's content, in order.
    fn render<'m>(
        &self,
        messages: &'m [ChatMessage],
        tools: Option<&Value>,
    ) -> Result<(String, Vec<&'m str>)> {
        let tmpl = self.handle.chat_template(&self.alias).ok_or_else(|| {
            memra_engine::Error::Template(
                "this model has no chat template; use /v1/completions".into(),
            )
        })?;
        let rendered = tmpl.render_with_tools(messages, tools, true)?;
        let contents = messages.iter().map(|m| m.content.as_str()).collect();
        Ok((rendered, contents))
    }

    fn render_and_encode(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
    ) -> Result<Vec<u32>> {
        let (rendered, contents) = self.render(messages, tools)?;
        self.tokenizer()?.encode_chat(&rendered, &contents)
    }

    fn tokenizer(&self) -> Result<&memra_engine::tokenizer::Tokenizer> {
        self.handle.tokenizer(&self.alias).ok_or_else(|| {
            memra_engine::Error::Input(format!("model `{}` has no tokenizer", self.alias))
        })
    }
}

impl ModelText for HandleText {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let t = self.tokenizer()?;
        t.encode(text, t.add_bos_default())
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.render_and_encode(messages, None)
    }

    fn encode_chat_tools(&self, messages: &[ChatMessage], tools: &Value) -> Result<Vec<u32>> {
        self.render_and_encode(messages, Some(tools))
    }

    fn encode_chat_media(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        marker: &str,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        self.render_media(messages, tools, marker)
    }

    fn tool_style(&self) -> ToolStyle {
        self.handle
            .chat_template(&self.alias)
            .map(|t| ToolStyle {
                hermes: t.source().contains("<tool_call>"),
                takes_tools: t.takes_tools(),
            })
            .unwrap_or_default()
    }

    fn grammar(&self, spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        self.handle
            .grammars(&self.alias)
            .ok_or_else(|| {
                memra_engine::Error::Input(format!("model `{}` is not loaded", self.alias))
            })?
            .compile(spec)
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer()
            .ok()
            .and_then(|t| t.token_bytes(id))
            .unwrap_or_default()
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer().map(|t| t.vocab_size()).unwrap_or(0)
    }
}

struct Loaded {
    handle: EngineHandle,
    models: Vec<ServedModel>,
}

/// One model to start: alias, path, speculative decoding settings, KV format (default: the
/// engine's) and vision tower (an mmproj file).
pub type ModelStart = (
    String,
    PathBuf,
    Option<memra_engine::spec::SpecConfig>,
    Option<memra_engine::backend::KvDtype>,
    Option<PathBuf>,
);

/// What to start.
#[derive(Clone, Debug)]
pub struct StartConfig {
    /// Alias, path, speculative decoding settings and KV format (default: the engine's) of each
    /// model.
    pub models: Vec<ModelStart>,
    pub engine: EngineConfig,
    pub limits: AdmissionLimits,
}

impl StartConfig {
    /// What the binary starts for `specs` (MEMRA_MODELS) under the flags `args`.
    pub fn from_args(
        specs: &[crate::config::ModelSpec],
        args: &ServeArgs,
    ) -> std::result::Result<StartConfig, String> {
        let (engine, limits) = engine_settings(args)?;
        Ok(StartConfig {
            models: specs
                .iter()
                .map(|s| {
                    (
                        s.alias.clone(),
                        s.path.clone(),
                        s.spec.clone(),
                        s.kv_dtype,
                        s.mmproj.clone(),
                    )
                })
                .collect(),
            engine,
            limits,
        })
    }
}

/// The engine, once loaded.
pub struct RealEngine {
    loaded: OnceLock<Loaded>,
}

fn spinner(msg: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(msg);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

impl RealEngine {
    /// Starts loading on a background thread; `on_error` gets the message if loading fails.
    pub fn start(cfg: StartConfig, on_error: Box<dyn FnOnce(String) + Send>) -> Arc<RealEngine> {
        let engine = Arc::new(RealEngine {
            loaded: OnceLock::new(),
        });
        let e = engine.clone();
        std::thread::spawn(move || match load(cfg) {
            Ok(l) => {
                let _ = e.loaded.set(l);
            }
            Err(msg) => on_error(msg),
        });
        engine
    }

    /// A started engine (tests).
    pub fn from_handle(handle: EngineHandle) -> RealEngine {
        Self::from_handle_with_vision(handle, Visions::new())
    }

    /// A started engine whose models (by alias) have these vision towers (tests).
    pub fn from_handle_with_vision(handle: EngineHandle, visions: Visions) -> RealEngine {
        let e = RealEngine {
            loaded: OnceLock::new(),
        };
        let _ = e.loaded.set(wrap(handle, visions));
        e
    }
}

/// Vision towers by model alias.
pub type Visions = HashMap<String, Arc<Vision>>;

/// Loads `path` (an mmproj GGUF) as `alias`'s vision tower, with the image tokens of the
/// model's vocabulary, placed where the model runs (`device`: a CUDA device gets the CUDA
/// tower; a tower shape its kernels do not cover stays on the CPU, with a warning).
pub fn load_vision(
    alias: &str,
    path: &std::path::Path,
    tok: &memra_engine::tokenizer::Tokenizer,
    hidden: usize,
    device: Device,
) -> std::result::Result<Arc<Vision>, String> {
    let fail = |e: memra_engine::Error| format!("model `{alias}`: +mmproj={}: {e}", path.display());
    let mut tower = VisionTower::open(path).map_err(fail)?;
    // A Qwen3-VL tower's rows carry its deepstack mergers' values too: a qwen3vl text model
    // with as many deepstack layers takes them (`ModelConfig::embed_width`).
    if tower.out_width() != hidden {
        let deepstack = tower.qwen_params().map_or(0, |q| q.deepstack.len());
        let why = match deepstack {
            0 => String::new(),
            n => format!(
                " (the tower has {n} deepstack mergers, Qwen3-VL: its text model is a qwen3vl \
                 with `qwen3vl.n_deepstack_layers` = {n})"
            ),
        };
        return Err(format!(
            "model `{alias}`: +mmproj={}: the tower's rows have {} values, the model's \
             embeddings {hidden}{why}",
            path.display(),
            tower.out_width()
        ));
    }
    match tower.place(device) {
        Ok(()) => {}
        Err(e @ memra_engine::Error::Unsupported(_)) => {
            tracing::warn!("{alias}: the vision tower runs on the CPU: {e}");
        }
        Err(e) => return Err(fail(e)),
    }
    Ok(Arc::new(Vision::new(
        tower,
        ImageTokens::from_tokenizer(tok),
    )))
}

/// The device a model's vision tower runs on: its first pipeline stage's, else `--device`'s.
pub fn vision_device(engine: &EngineConfig) -> Device {
    engine.pp.devices.first().copied().unwrap_or(engine.device)
}

fn wrap(handle: EngineHandle, mut visions: Visions) -> Loaded {
    let created = crate::routes::shape::now_secs();
    let models = handle
        .models()
        .into_iter()
        .map(|m| ServedModel {
            vision: visions.remove(&m.alias),
            text: Arc::new(HandleText {
                handle: handle.clone(),
                alias: m.alias.clone(),
            }),
            alias: m.alias,
            context_len: m.max_positions,
            created,
            backend: m.backend,
            profile: m.profile,
            pipeline: m.pipeline,
            kv_cache: Some(KvCacheJson {
                dtype: m.kv_dtype.to_string(),
                bytes_per_token: m.kv_token_bytes,
                capacity_tokens: m.kv_blocks * m.block_size,
                block_size: m.block_size,
            }),
        })
        .collect();
    Loaded { handle, models }
}

/// Refuses a model whose draft model is missing or unreadable before any model loads (the
/// vocabulary and tokenizer are checked against the target's once it has loaded).
pub fn check_draft_paths(cfg: &StartConfig) -> std::result::Result<(), String> {
    for (alias, _, spec, _, _) in &cfg.models {
        let draft = match spec.as_ref().map(|s| &s.drafter) {
            Some(DrafterKind::Model(p) | DrafterKind::Auto(Some(p))) => p,
            _ => continue,
        };
        memra_engine::spec::check_draft_path(draft).map_err(|e| {
            format!(
                "model `{alias}`: draft model +draft={}: {}",
                draft.display(),
                memra_engine::spec::bare(&e)
            )
        })?;
    }
    Ok(())
}

fn load(cfg: StartConfig) -> std::result::Result<Loaded, String> {
    check_draft_paths(&cfg)?;
    let mut models = Vec::new();
    let mut visions = Visions::new();
    for (alias, path, spec, kv_dtype, mmproj) in cfg.models {
        let bar = spinner(format!("loading {alias} from {}", path.display()));
        let m = load_model(&path);
        bar.finish_and_clear();
        let m = m.map_err(|e| format!("loading {alias} ({}): {e}", path.display()))?;
        tracing::info!("loaded {alias} ({})", path.display());
        if let Some(p) = mmproj {
            let device = vision_device(&cfg.engine);
            let v = load_vision(&alias, &p, &m.tokenizer, m.config.embed_width(), device)?;
            let sizes = match v.tower.qwen_params() {
                None => format!(
                    "{0}x{0} images, {1} tokens each",
                    v.tower.image_size(),
                    v.tower.tokens_per_image()
                ),
                Some(q) => format!(
                    "{}: images resized to multiples of {} pixels, {}..{} tokens each",
                    q.kind.projector(),
                    q.factor(),
                    q.min_pixels / (q.factor() * q.factor()),
                    q.max_pixels / (q.factor() * q.factor())
                ),
            };
            tracing::info!(
                "{alias}: vision tower {} ({sizes}; on {})",
                p.display(),
                v.tower.runs_on()
            );
            visions.insert(alias.clone(), v);
        }
        let engine = EngineConfig {
            spec,
            kv_dtype: kv_dtype.unwrap_or(cfg.engine.kv_dtype),
            ..cfg.engine.clone()
        };
        models.push((alias, m, engine));
    }
    let bar = spinner("starting the engine (backend, KV cache)".into());
    let handle = Engine::start(models, cfg.limits);
    bar.finish_and_clear();
    let handle =
        handle.map_err(|e| format!("starting the engine: {}", memra_engine::spec::bare(&e)))?;
    for m in handle.models() {
        tracing::info!(
            "serving {} on {} (context {}, {} positions per request; KV cache {}: {} bytes per \
             position, {} blocks of {} = {} positions)",
            m.alias,
            m.backend,
            m.max_ctx,
            m.max_positions,
            m.kv_dtype,
            m.kv_token_bytes,
            m.kv_blocks,
            m.block_size,
            m.kv_blocks * m.block_size
        );
        if let Some(p) = &m.profile {
            tracing::info!("{}: device {p}", m.alias);
        }
        if let Some(p) = &m.pipeline {
            tracing::info!("{}: pipeline {p}", m.alias);
        }
        match &m.spec {
            Some((drafter, k)) => tracing::info!(
                "{}: speculative decoding with {drafter}, at most {k} drafts per step (output \
                 unchanged; `+spec=off` turns it off)",
                m.alias
            ),
            None => tracing::info!("{}: plain decoding (+spec=off)", m.alias),
        }
        for n in &m.spec_notes {
            tracing::warn!("{}: {n}", m.alias);
        }
    }
    Ok(wrap(handle, visions))
}

/// The engine settings the flags give: device, threads, KV budget, scheduler and admission
/// limits. Each limit has one source:
/// - `--max-running`: sequences running at once per model, and also the most one tenant may run
///   (the scheduler admits the waiting tenant with the fewest running sequences first);
/// - `--tenant-max-in-flight` (or the tenant's keyring entry, carried with each request): a
///   tenant's requests in flight;
/// - `--max-queue`: requests waiting in the engine, all tenants and models.
pub fn engine_settings(
    args: &ServeArgs,
) -> std::result::Result<(EngineConfig, AdmissionLimits), String> {
    let device: Device = args
        .device
        .parse()
        .map_err(|e| format!("MEMRA_DEVICE `{}`: {e}", args.device))?;
    let pp = memra_engine::pipeline::PpConfig::from_flags(
        args.pp,
        args.devices.as_deref(),
        args.pp_split.as_deref(),
    )
    .and_then(|pp| pp.with_micro_link(Some(args.pp_micro), Some(&args.pp_link)))
    .map_err(|e| {
        format!(
            "--pp / --devices / --pp-split / --pp-micro / --pp-link: {}",
            memra_engine::spec::bare(&e)
        )
    })?;
    let engine = EngineConfig {
        device,
        pp,
        threads: args.threads,
        kv: kv_budget(args.kv_blocks),
        kv_dtype: args.kv_dtype,
        scheduler: SchedulerConfig {
            max_running: args.max_running,
            max_running_per_tenant: args.max_running,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let limits = AdmissionLimits {
        max_in_flight_per_tenant: args.tenant_max_in_flight,
        max_queued: args.max_queue,
    };
    Ok((engine, limits))
}

/// KV budget from `MEMRA_KV_BLOCKS` (0 = sized from free memory).
pub fn kv_budget(blocks: usize) -> KvBudget {
    if blocks == 0 {
        EngineConfig::default().kv
    } else {
        KvBudget::Blocks(blocks)
    }
}

impl Generate for RealEngine {
    fn submit(&self, req: ValidRequest) -> std::result::Result<EventStream, SubmitError> {
        match self.loaded.get() {
            Some(l) => l.handle.submit(req),
            None => Err(SubmitError::Overloaded { retry_after_s: 5 }),
        }
    }

    fn models(&self) -> Vec<ServedModel> {
        self.loaded
            .get()
            .map(|l| l.models.clone())
            .unwrap_or_default()
    }

    fn stats(&self) -> EngineStats {
        let Some(l) = self.loaded.get() else {
            return EngineStats::default();
        };
        l.handle.stats()
    }

    fn ready(&self) -> bool {
        self.loaded.get().is_some_and(|l| l.handle.is_ready())
    }

    fn drain(&self) {
        if let Some(l) = self.loaded.get() {
            l.handle.drain();
        }
    }

    fn device(&self) -> String {
        self.loaded
            .get()
            .and_then(|l| l.handle.models().first().map(|m| m.backend.clone()))
            .unwrap_or_else(|| "loading".into())
            .replace(' ', "-")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Cli;

    fn settings(flags: &[&str]) -> (EngineConfig, AdmissionLimits) {
        let mut argv = vec!["memra-server"];
        argv.extend_from_slice(flags);
        engine_settings(&Cli::try_parse_from(argv).unwrap().serve).unwrap()
    }

    #[test]
    fn every_engine_limit_comes_from_a_flag() {
        // Defaults: a tenant may run as many sequences as the model runs (no hidden cap).
        let (e, l) = settings(&[]);
        assert_eq!(e.scheduler.max_running, 64);
        assert_eq!(e.scheduler.max_running_per_tenant, 64);
        assert_eq!(l.max_in_flight_per_tenant, 64);
        assert_eq!(l.max_queued, 128);
        let (e, l) = settings(&[
            "--max-running",
            "200",
            "--tenant-max-in-flight",
            "300",
            "--max-queue",
            "7",
            "--kv-blocks",
            "80",
            "--device",
            "cpu",
        ]);
        assert_eq!(e.scheduler.max_running, 200);
        assert_eq!(e.scheduler.max_running_per_tenant, 200);
        assert_eq!(l.max_in_flight_per_tenant, 300);
        assert_eq!(l.max_queued, 7);
        assert_eq!(e.kv, KvBudget::Blocks(80));
        assert_eq!(e.device, Device::Cpu);
    }
}
