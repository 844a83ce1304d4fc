//! Every flag and environment variable of memra-server, in one place (clap with env).
//! Nothing else reads the environment. docs/FLAGS.md lists each one (a test checks it).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use memra_engine::backend::KvDtype;
use memra_engine::spec::{DrafterKind, SpecConfig};

/// The default model's file name (fetched by tools/fetch-models.sh).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The alias the default model is served under.
pub const DEFAULT_MODEL_ALIAS: &str = "smollm2-135m-instruct";

#[derive(Parser, Debug)]
#[command(
    name = "memra-server",
    version,
    about = "memra's OpenAI-compatible HTTP server"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Manage the API keyring (the file named by --api-keys / MEMRA_API_KEYS).
    Keys {
        #[command(subcommand)]
        action: KeysAction,
        /// The keyring file.
        #[arg(long, env = "MEMRA_API_KEYS")]
        api_keys: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeysAction {
    /// Creates a key for TENANT, prints it once and stores only its SHA-256 hash.
    Add {
        tenant: String,
        /// Requests this tenant may have in flight at once (default: --tenant-max-in-flight).
        #[arg(long)]
        max_in_flight: Option<usize>,
    },
    /// Revokes the key whose printed prefix starts with PREFIX (e.g. `mk-1a2b3c4d`).
    Revoke { prefix: String },
    /// Lists keys (prefix, tenant, state); never the keys themselves.
    List,
}

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Models to serve: `alias=path[,alias2=path2]` (a path is a GGUF file or an HF folder; a
    /// bare path is served under its file name), each with options after the path
    /// (`+spec=auto|ngram|mtp|draft|off`, `+draft=PATH`, `+spec_k=K`, `+kv=DTYPE`; speculation is
    /// on by default). Default: the model fetched by tools/fetch-models.sh.
    #[arg(long, env = "MEMRA_MODELS")]
    pub models: Option<String>,
    /// Where tools/fetch-models.sh keeps models (default ~/.cache/memra/models).
    #[arg(long, env = "MEMRA_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "MEMRA_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    #[arg(long, env = "MEMRA_DEVICE", default_value = "auto")]
    pub device: String,
    /// CPU threads for the CPU backend (0 = all cores).
    #[arg(long, env = "MEMRA_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Pipeline stages per model (layers split by the memory plan; same output as unsplit).
    #[arg(long, env = "MEMRA_PP", default_value_t = 1)]
    pub pp: usize,
    /// One device per pipeline stage, e.g. `cuda:0,cuda:1` (default: every stage on --device).
    #[arg(long, env = "MEMRA_DEVICES")]
    pub devices: Option<String>,
    /// The first layer of each pipeline stage after the first, e.g. `40`.
    #[arg(long, env = "MEMRA_PP_SPLIT")]
    pub pp_split: Option<String>,
    /// Sequences the engine runs at once (per model).
    #[arg(long, env = "MEMRA_MAX_RUNNING", default_value_t = 64)]
    pub max_running: usize,
    /// KV cache blocks per model (0 = sized from free memory at load).
    #[arg(long, env = "MEMRA_KV_BLOCKS", default_value_t = 0)]
    pub kv_blocks: usize,
    /// The KV cache's element format: f16 (default), bf16, q8_0 or f32 (a model's `+kv=` overrides it).
    #[arg(long, env = "MEMRA_KV_DTYPE", default_value = "f16")]
    pub kv_dtype: KvDtype,
    /// Keyring file of hashed API keys; without it the server is open (tenant `default`).
    #[arg(long, env = "MEMRA_API_KEYS")]
    pub api_keys: Option<PathBuf>,
    /// How often the keyring file is checked for changes, in milliseconds.
    #[arg(long, env = "MEMRA_KEYS_POLL_MS", default_value_t = 1000)]
    pub keys_poll_ms: u64,
    /// Largest request body in bytes (413 above).
    #[arg(long, env = "MEMRA_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, env = "MEMRA_MAX_TOKENS", default_value_t = 4096)]
    pub max_tokens: usize,
    /// Requests in flight in the whole server before new ones get 503 + Retry-After.
    #[arg(long, env = "MEMRA_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,
    /// Requests waiting for the engine's scheduler before it refuses with 503.
    #[arg(long, env = "MEMRA_MAX_QUEUE", default_value_t = 128)]
    pub max_queue: usize,
    /// Requests one tenant may have in flight before new ones get 429 + Retry-After (a keyring
    /// entry can set its own).
    #[arg(long, env = "MEMRA_TENANT_MAX_IN_FLIGHT", default_value_t = 64)]
    pub tenant_max_in_flight: usize,
    /// Seconds a client may take to send a request body (408 after).
    #[arg(long, env = "MEMRA_BODY_TIMEOUT_S", default_value_t = 30)]
    pub body_timeout_s: u64,
    /// Seconds a stream may wait for the client to read before it is cancelled.
    #[arg(long, env = "MEMRA_STREAM_WRITE_TIMEOUT_S", default_value_t = 30)]
    pub stream_write_timeout_s: u64,
    /// Open client connections before new ones get 503 and are closed.
    #[arg(long, env = "MEMRA_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, env = "MEMRA_DRAIN_TIMEOUT_S", default_value_t = 30)]
    pub drain_timeout_s: u64,
    /// Largest image (or video frame) file in a request, in bytes after base64 decoding.
    #[arg(long, env = "MEMRA_MEDIA_MAX_BYTES", default_value_t = 8 << 20)]
    pub media_max_bytes: usize,
    /// Largest image width x height (checked from the header, before decoding).
    #[arg(long, env = "MEMRA_MEDIA_MAX_PIXELS", default_value_t = 4096 * 4096)]
    pub media_max_pixels: u64,
    /// Most images plus video frames in one request.
    #[arg(long, env = "MEMRA_MEDIA_MAX_IMAGES", default_value_t = 8)]
    pub media_max_images: usize,
    /// Most frames of one video after sampling.
    #[arg(long, env = "MEMRA_MEDIA_MAX_FRAMES", default_value_t = 8)]
    pub media_max_frames: usize,
    /// Frames per second a video's frames are sampled at.
    #[arg(long, env = "MEMRA_MEDIA_VIDEO_FPS", default_value_t = 1.0)]
    pub media_video_fps: f32,
    /// Hosts image URLs may name, comma-separated (empty: remote URLs refused).
    #[arg(long, env = "MEMRA_MEDIA_ALLOWED_HOSTS")]
    pub media_allowed_hosts: Option<String>,
    /// Add an `x-memra-cache-key` header to inference responses: a routing key for
    /// cache-affine gateways (docs/DEPLOY.md says what it hashes).
    #[arg(long, env = "MEMRA_CACHE_KEY_HEADER")]
    pub cache_key_header: bool,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "MEMRA_LOG", default_value = "info")]
    pub log: String,
    /// Home folder, for the default models dir.
    #[arg(long, env = "HOME", hide = true)]
    pub home: Option<PathBuf>,
}

/// One model to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub alias: String,
    pub path: PathBuf,
    /// Speculative decoding: on by default (`auto`: the model's MTP layers if it has them, a
    /// `+draft=PATH` model, n-gram lookup, picked per sequence by measured acceptance);
    /// `+spec=ngram|mtp|draft|auto`, `+spec_k=K`; `None` with `+spec=off`.
    pub spec: Option<SpecConfig>,
    /// The KV cache format for this model (`+kv=q8_0`; default `--kv-dtype`).
    pub kv_dtype: Option<KvDtype>,
    /// The model's vision tower, an mmproj GGUF file (`+mmproj=PATH`).
    pub mmproj: Option<PathBuf>,
}

/// The speculation of a model named without options: `auto` at the default depth.
pub fn default_spec() -> SpecConfig {
    SpecConfig::auto()
}

/// The per-model options of a MEMRA_MODELS entry.
struct EntryOptions {
    spec: Option<SpecConfig>,
    kv_dtype: Option<KvDtype>,
    mmproj: Option<PathBuf>,
}

/// Splits `path+spec=ngram+spec_k=4+kv=q8_0` (or `+spec=mtp|auto|draft|off`, `+draft=PATH`)
/// into the path and its options. Without `+spec`, speculation is `auto`.
fn parse_options(entry: &str) -> Result<(String, EntryOptions), String> {
    let mut parts = entry.split('+');
    let path = parts.next().unwrap_or_default().trim().to_string();
    let mut mmproj = None;
    let (mut mode, mut draft, mut k, mut kv_dtype) = (
        None::<String>,
        None::<PathBuf>,
        memra_engine::spec::DEFAULT_K,
        None,
    );
    for opt in parts {
        let (key, val) = opt.split_once('=').unwrap_or((opt, ""));
        match key.trim() {
            "spec" if ["ngram", "mtp", "auto", "draft", "off"].contains(&val.trim()) => {
                mode = Some(val.trim().to_string())
            }
            "draft" if !val.trim().is_empty() => draft = Some(PathBuf::from(val.trim())),
            "mmproj" if !val.trim().is_empty() => mmproj = Some(PathBuf::from(val.trim())),
            "kv" => {
                kv_dtype = Some(
                    KvDtype::parse(val)
                        .map_err(|e| format!("MEMRA_MODELS entry `{entry}`: {e}"))?,
                )
            }
            "spec_k" => {
                k = val.trim().parse().map_err(|_| {
                    format!("MEMRA_MODELS entry `{entry}`: spec_k `{val}` is not a number")
                })?
            }
            _ => {
                return Err(format!(
                    "MEMRA_MODELS entry `{entry}`: unknown option `+{opt}` (expected \
                     +spec=auto|ngram|mtp|draft|off, +draft=PATH, +spec_k=K, +kv=DTYPE or +mmproj=PATH)"
                ));
            }
        }
    }
    let bad = |why: &str| Err(format!("MEMRA_MODELS entry `{entry}`: {why}"));
    let drafter = match (mode.as_deref(), draft) {
        (Some("off"), None) => None,
        (Some("off"), Some(_)) => return bad("+spec=off with +draft=PATH"),
        (Some("ngram"), None) => Some(DrafterKind::Ngram),
        (Some("mtp"), None) => Some(DrafterKind::Mtp),
        (Some("ngram" | "mtp"), Some(_)) => {
            return bad("+draft=PATH goes with +spec=auto (the default) or +spec=draft");
        }
        (Some("draft"), Some(p)) => Some(DrafterKind::Model(p)),
        (Some("draft"), None) => return bad("+spec=draft needs +draft=PATH"),
        (_, p) => Some(DrafterKind::Auto(p)),
    };
    let spec = match drafter {
        Some(d) => {
            Some(SpecConfig::new(d, k).map_err(|e| format!("MEMRA_MODELS entry `{entry}`: {e}"))?)
        }
        None => None,
    };
    Ok((
        path,
        EntryOptions {
            spec,
            kv_dtype,
            mmproj,
        },
    ))
}

/// Parses `alias=path[,alias2=path2]`.
pub fn parse_models(s: &str) -> Result<Vec<ModelSpec>, String> {
    let mut out: Vec<ModelSpec> = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (alias, rest) = match entry.split_once('=') {
            Some((a, p)) if !a.contains('+') => (Some(a), p),
            _ => (None, entry),
        };
        let (path, opts) = parse_options(rest)?;
        let item = match alias {
            Some(a) => format!("{a}={path}"),
            None => path,
        };
        let item = item.as_str();
        let (alias, path) = match item.split_once('=') {
            Some((a, p)) => (a.trim().to_string(), PathBuf::from(p.trim())),
            None => {
                let p = PathBuf::from(item);
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (stem, p)
            }
        };
        if alias.is_empty() || path.as_os_str().is_empty() {
            return Err(format!(
                "MEMRA_MODELS entry `{item}` must be `alias=path` with both parts non-empty"
            ));
        }
        if out.iter().any(|m| m.alias == alias) {
            return Err(format!("MEMRA_MODELS names the alias `{alias}` twice"));
        }
        out.push(ModelSpec {
            alias,
            path,
            spec: opts.spec,
            kv_dtype: opts.kv_dtype,
            mmproj: opts.mmproj,
        });
    }
    if out.is_empty() {
        return Err("MEMRA_MODELS is set but names no model (expected `alias=path`)".into());
    }
    Ok(out)
}

impl ServeArgs {
    /// The models folder of tools/fetch-models.sh.
    pub fn models_dir(&self) -> Option<PathBuf> {
        self.models_dir.clone().or_else(|| {
            self.home
                .as_ref()
                .map(|h| h.join(".cache").join("memra").join("models"))
        })
    }

    /// The models to serve: MEMRA_MODELS, else the default model if it was fetched, else an
    /// error that says how to get one.
    pub fn model_specs(&self) -> Result<Vec<ModelSpec>, String> {
        if let Some(s) = &self.models {
            return parse_models(s);
        }
        let dir = self.models_dir();
        if let Some(path) = dir.as_ref().map(|d| d.join(DEFAULT_MODEL_FILE))
            && path.exists()
        {
            return Ok(vec![ModelSpec {
                alias: DEFAULT_MODEL_ALIAS.into(),
                path,
                spec: Some(default_spec()),
                kv_dtype: None,
                mmproj: None,
            }]);
        }
        let where_ = dir
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "~/.cache/memra/models".into());
        Err(format!(
            "no model to serve: MEMRA_MODELS is not set and the default model {DEFAULT_MODEL_FILE} \
             is not in {where_}.\n  Fetch it with `tools/fetch-models.sh`, or set \
             MEMRA_MODELS=alias=/path/to/model.gguf (or an HF folder)."
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_parse() {
        let m = parse_models("a=/x/a.gguf, b=/y/hf").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].alias, "b");
        assert_eq!(m[1].path, PathBuf::from("/y/hf"));
        let m = parse_models("/m/SmolLM2.Q4.gguf").unwrap();
        assert_eq!(m[0].alias, "SmolLM2.Q4");
        assert!(parse_models("a=/x,a=/y").unwrap_err().contains("twice"));
        assert!(parse_models("=/x").is_err());
        assert!(parse_models(" , ").is_err());
    }

    #[test]
    fn missing_default_model_says_how_to_get_it() {
        let cli =
            Cli::try_parse_from(["memra-server", "--models-dir", "/nonexistent/dir"]).unwrap();
        let mut args = cli.serve;
        args.models = None;
        let e = args.model_specs().unwrap_err();
        assert!(e.contains("tools/fetch-models.sh"), "{e}");
        assert!(e.contains("MEMRA_MODELS"), "{e}");
    }

    #[test]
    fn models_take_speculation_options() {
        let m = parse_models(
            "a=/m/t.gguf+spec=ngram+spec_k=6,b=/m/u.gguf+draft=/m/d.gguf,c=/m/v.gguf,\
             d=/m/w.gguf+spec=off,e=/m/x.gguf+spec=draft+draft=/m/d.gguf",
        )
        .unwrap();
        assert_eq!(m[0].path, PathBuf::from("/m/t.gguf"));
        assert_eq!(
            m[0].spec,
            Some(SpecConfig::new(DrafterKind::Ngram, 6).unwrap())
        );
        // A draft model joins the automatic choice; no option at all is `auto`; `off` is off.
        assert_eq!(
            m[1].spec.as_ref().map(|s| s.drafter.clone()),
            Some(DrafterKind::Auto(Some("/m/d.gguf".into())))
        );
        assert_eq!(m[2].spec, Some(default_spec()));
        assert_eq!(default_spec().drafter, DrafterKind::Auto(None));
        assert_eq!(default_spec().k, memra_engine::spec::DEFAULT_K);
        assert_eq!(m[3].spec, None);
        assert_eq!(
            m[4].spec.as_ref().map(|s| s.drafter.clone()),
            Some(DrafterKind::Model("/m/d.gguf".into()))
        );
        let mtp = parse_models("a=/m/t.gguf+spec=mtp+spec_k=2").unwrap();
        assert_eq!(
            mtp[0].spec,
            Some(SpecConfig::new(DrafterKind::Mtp, 2).unwrap())
        );
        let auto = parse_models("a=/m/t.gguf+spec=auto+spec_k=8").unwrap();
        assert_eq!(
            auto[0].spec,
            Some(SpecConfig::new(DrafterKind::Auto(None), 8).unwrap())
        );
        let bare = parse_models("/m/t.gguf+spec=ngram").unwrap();
        assert_eq!(
            (bare[0].alias.as_str(), bare[0].spec.is_some()),
            ("t", true)
        );
        for bad in [
            "a=/m/t.gguf+spec=mtp2",
            "a=/m/t.gguf+spec=ngram+spec_k=x",
            "a=/m/t.gguf+spec=ngram+spec_k=0",
            "a=/m/t.gguf+spec=off+draft=/m/d.gguf",
            "a=/m/t.gguf+spec=ngram+draft=/m/d.gguf",
            "a=/m/t.gguf+spec=draft",
            "a=/m/t.gguf+draft=",
        ] {
            let e = parse_models(bad).unwrap_err();
            assert!(e.contains("MEMRA_MODELS entry"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_default_model_speculates() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DEFAULT_MODEL_FILE), b"GGUF").unwrap();
        let d = dir.path().display().to_string();
        let cli = Cli::try_parse_from(["memra-server", "--models-dir", &d]).unwrap();
        let mut args = cli.serve;
        args.models = None;
        let m = args.model_specs().unwrap();
        assert_eq!(m[0].spec, Some(default_spec()));
    }
}
