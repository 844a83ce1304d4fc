//! Every setting of memra-server, in one place: its flags (clap), the environment variables a
//! deployment sets per container (clap `env`), and the config file (`--config` / MEMRA_CONFIG, a
//! TOML file whose keys are the flags without their dashes). Precedence: command line >
//! environment variable > config file > default. Nothing else reads the environment.
//! docs/FLAGS.md lists each one (a test checks it).

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{
    ArgAction, ArgMatches, Args, ColorChoice, CommandFactory, FromArgMatches, Parser, Subcommand,
};
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
        /// The keyring file (default: the server's --api-keys, also from the config file).
        #[arg(long, env = "MEMRA_API_KEYS")]
        api_keys: Option<PathBuf>,
    },
    /// Prints the settings the server would run with, as a config file: every flag's value and
    /// where it came from (command line, environment, config file or default).
    Config,
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
    /// A TOML file of settings: keys are the flags without their dashes (`max-in-flight = 512`);
    /// the command line and the environment override it (docs/memra-server.example.toml).
    #[arg(long, env = "MEMRA_CONFIG")]
    pub config: Option<PathBuf>,
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
    #[arg(long)]
    pub pp_split: Option<String>,
    /// Micro-batches per step with --pp (1: off; stages on two GPUs then work at once).
    #[arg(long, default_value_t = 2)]
    pub pp_micro: usize,
    /// The hand-over between stages on two GPUs: auto (NCCL when it loads, else peer), nccl,
    /// peer.
    #[arg(long, default_value = "auto")]
    pub pp_link: String,
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
    #[arg(long, default_value_t = 1000)]
    pub keys_poll_ms: u64,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Requests in flight in the whole server before new ones get 503 + Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// Requests waiting for the engine's scheduler before it refuses with 503.
    #[arg(long, default_value_t = 128)]
    pub max_queue: usize,
    /// Requests one tenant may have in flight before new ones get 429 + Retry-After (a keyring
    /// entry can set its own).
    #[arg(long, default_value_t = 64)]
    pub tenant_max_in_flight: usize,
    /// Seconds a client may take to send a request body (408 after).
    #[arg(long, default_value_t = 30)]
    pub body_timeout_s: u64,
    /// Seconds a stream may wait for the client to read before it is cancelled.
    #[arg(long, default_value_t = 30)]
    pub stream_write_timeout_s: u64,
    /// Open client connections before new ones get 503 and are closed.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_s: u64,
    /// Largest image (or video frame) file in a request, in bytes after base64 decoding.
    #[arg(long, default_value_t = 8 << 20)]
    pub media_max_bytes: usize,
    /// Largest image width x height (checked from the header, before decoding).
    #[arg(long, default_value_t = 4096 * 4096)]
    pub media_max_pixels: u64,
    /// Most images plus video frames in one request.
    #[arg(long, default_value_t = 8)]
    pub media_max_images: usize,
    /// Most frames of one video after sampling.
    #[arg(long, default_value_t = 8)]
    pub media_max_frames: usize,
    /// Frames per second a video's frames are sampled at.
    #[arg(long, default_value_t = 1.0)]
    pub media_video_fps: f32,
    /// Hosts image URLs may name, comma-separated (empty: remote URLs refused).
    #[arg(long)]
    pub media_allowed_hosts: Option<String>,
    /// Add an `x-memra-cache-key` header to inference responses: a routing key for
    /// cache-affine gateways (docs/DEPLOY.md says what it hashes).
    #[arg(long)]
    pub cache_key_header: bool,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "MEMRA_LOG", default_value = "info")]
    pub log: String,
    /// Home folder, for the default models dir.
    #[arg(long, env = "HOME", hide = true)]
    pub home: Option<PathBuf>,
}

/// Why [`Cli::load_from`] failed.
#[derive(Debug)]
pub enum LoadError {
    /// The command line or an environment variable does not parse, or it asks for `--help` or
    /// `--version`: [`clap::Error::exit`] prints it and exits.
    Args(clap::Error),
    /// The config file cannot be read or parsed, or it sets an unknown key or a wrong value.
    Config(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Args(e) => write!(f, "{e}"),
            LoadError::Config(e) => f.write_str(e),
        }
    }
}

/// The settings of a config file: (argument id, value as the command line would give it).
struct FileSettings {
    path: PathBuf,
    values: Vec<(String, String)>,
}

/// The arguments a config file may set: memra-server's visible flags but `--config`.
fn file_keys(cmd: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    cmd.get_arguments().filter(|a| {
        !a.is_hide_set()
            && a.get_long()
                .is_some_and(|l| !["help", "version", "config"].contains(&l))
    })
}

/// `value` as the command line would give flag `arg`, checked by the flag's own parser.
fn file_value(arg: &clap::Arg, value: &toml::Value) -> Result<String, String> {
    use toml::Value as V;
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    let text = match value {
        V::Boolean(b) if switch => return Ok(b.to_string()),
        _ if switch => {
            return Err(format!(
                "expected true or false, found {}",
                value.type_str()
            ));
        }
        V::String(s) => s.clone(),
        V::Integer(i) => i.to_string(),
        V::Float(x) => x.to_string(),
        // A list flag (`models`, `devices`, `media-allowed-hosts`...) as an array.
        V::Array(items) => items
            .iter()
            .map(|i| match i {
                V::String(s) => Ok(s.clone()),
                V::Integer(n) => Ok(n.to_string()),
                other => Err(format!(
                    "expected an array of strings or numbers, found one holding a {}",
                    other.type_str()
                )),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        other => {
            return Err(format!(
                "expected a string or a number, found {}",
                other.type_str()
            ));
        }
    };
    let long = arg.get_long().unwrap_or_default();
    clap::Command::new("memra-server")
        .color(ColorChoice::Never)
        .arg(arg.clone())
        .try_get_matches_from(["memra-server".to_string(), format!("--{long}={text}")])
        .map_err(|e| {
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        })?;
    Ok(text)
}

/// Reads config file `path` against the flags of `cmd`.
fn read_file(cmd: &clap::Command, path: &Path) -> Result<FileSettings, String> {
    let at = |why: String| format!("config file {}: {why}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| at(format!("cannot read it: {e}")))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| at(e.to_string().trim_end().to_string()))?;
    let mut values = Vec::new();
    for (key, value) in &table {
        if key == "config" {
            return Err(at(
                "`config` names a config file; a config file cannot name another".into(),
            ));
        }
        let Some(arg) = file_keys(cmd).find(|a| a.get_long() == Some(key.as_str())) else {
            let keys: Vec<&str> = file_keys(cmd).filter_map(|a| a.get_long()).collect();
            return Err(at(format!(
                "unknown key `{key}` (a key is a memra-server flag without its dashes: {})",
                keys.join(", ")
            )));
        };
        let v = file_value(arg, value).map_err(|why| at(format!("key `{key}`: {why}")))?;
        values.push((arg.get_id().as_str().to_string(), v));
    }
    Ok(FileSettings {
        path: path.to_path_buf(),
        values,
    })
}

/// Parses `args` with the environment and the config file: clap's command with the file's
/// values as the defaults of their flags, so a flag given on the command line wins, then its
/// environment variable, then the file, then the built-in default.
fn parse(args: &[OsString]) -> Result<(Cli, ArgMatches, Option<FileSettings>), LoadError> {
    let mut cmd = Cli::command();
    // The file's name first (`--config`, else MEMRA_CONFIG), leniently: whatever else is
    // wrong with the command line, the real parse below says.
    let path = cmd
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok()
        .and_then(|m| m.try_get_one::<PathBuf>("config").ok().flatten().cloned());
    let file = match path {
        Some(p) => Some(read_file(&cmd, &p).map_err(LoadError::Config)?),
        None => None,
    };
    for (id, v) in file.iter().flat_map(|f| &f.values) {
        cmd = cmd.mut_arg(id, |a| a.default_value(v.clone()));
    }
    let matches = cmd.try_get_matches_from(args).map_err(LoadError::Args)?;
    let cli = Cli::from_arg_matches(&matches).map_err(LoadError::Args)?;
    Ok((cli, matches, file))
}

impl Cli {
    /// [`Cli::load_from`] this process's arguments.
    pub fn load() -> Result<Cli, LoadError> {
        Self::load_from(std::env::args_os())
    }

    /// Parses memra-server's arguments, its environment variables and its config file
    /// (`--config`, else MEMRA_CONFIG). Precedence: command line > environment variable >
    /// config file > default. A config file that cannot be read, is not TOML, or has an unknown
    /// key or a value its flag does not take is an error naming the file and the key.
    pub fn load_from<I, T>(args: I) -> Result<Cli, LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        parse(&args).map(|(cli, _, _)| cli)
    }
}

/// `memra-server config`: the settings `args` give, as a config file, each flag with the place
/// its value came from (command line, environment variable, config file or default).
pub fn effective<I, T>(args: I) -> Result<String, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let (_, m, file) = parse(&args)?;
    let cmd = Cli::command();
    let mut out = String::from(
        "# memra-server's settings: command line > environment variable > config file > default\n",
    );
    if let Some(f) = &file {
        out.push_str(&format!("# config file: {}\n", f.path.display()));
    }
    for arg in file_keys(&cmd) {
        let id = arg.get_id().as_str();
        let key = arg.get_long().unwrap_or_default();
        let from_file = file.iter().any(|f| f.values.iter().any(|(i, _)| i == id));
        let origin = match m.value_source(id) {
            Some(ValueSource::CommandLine) => "command line".to_string(),
            Some(ValueSource::EnvVariable) => format!(
                "environment ({})",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            Some(_) if from_file => "config file".into(),
            _ => "default".into(),
        };
        let Some(raw) = m.get_raw(id) else {
            out.push_str(&format!("# {key}: unset\n"));
            continue;
        };
        let raw: Vec<String> = raw.map(|r| r.to_string_lossy().into_owned()).collect();
        let raw = raw.join(",");
        let number = raw.parse::<i64>().is_ok()
            || raw
                .parse::<f64>()
                .is_ok_and(|x| x.is_finite() && raw.contains('.'));
        let value = if number || matches!(arg.get_action(), ArgAction::SetTrue) {
            raw
        } else {
            toml::Value::String(raw).to_string()
        };
        out.push_str(&format!("{key} = {value}  # {origin}\n"));
    }
    Ok(out)
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
            "no model to serve: no --models (MEMRA_MODELS, or `models` in the config file) and the \
             default model {DEFAULT_MODEL_FILE} is not in {where_}.\n  Fetch it with \
             `tools/fetch-models.sh`, or set MEMRA_MODELS=alias=/path/to/model.gguf (or an HF \
             folder)."
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

    /// A config file holding `text`, and the `--config PATH` arguments naming it.
    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("memra.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p.display().to_string())
    }

    fn load(args: &[&str]) -> Result<Cli, LoadError> {
        Cli::load_from(std::iter::once("memra-server").chain(args.iter().copied()))
    }

    fn config_error(args: &[&str]) -> String {
        match load(args) {
            Err(LoadError::Config(e)) => e,
            Err(LoadError::Args(e)) => panic!("a clap error, not a config error: {e}"),
            Ok(cli) => panic!("parsed: {cli:?}"),
        }
    }

    #[test]
    fn the_config_file_sets_flags_and_the_command_line_wins() {
        // Flags without a variable, so the test's environment cannot change the outcome.
        let (_d, p) = file(
            "max-in-flight = 512\n\
             drain-timeout-s = 45\n\
             media-allowed-hosts = [\"a.example\", \"b.example\"]\n\
             media-video-fps = 2.5\n\
             cache-key-header = true\n",
        );
        let cli = load(&["--config", &p]).unwrap();
        let s = &cli.serve;
        assert_eq!(s.max_in_flight, 512);
        assert_eq!(s.drain_timeout_s, 45);
        assert_eq!(
            s.media_allowed_hosts.as_deref(),
            Some("a.example,b.example")
        );
        assert_eq!(s.media_video_fps, 2.5);
        assert!(s.cache_key_header);
        // Not in the file: the default.
        assert_eq!(s.max_queue, 128);
        assert_eq!(s.tenant_max_in_flight, 64);
        // The command line over the file.
        let cli = load(&[
            "--max-in-flight",
            "7",
            "--config",
            &p,
            "--drain-timeout-s=3",
        ])
        .unwrap();
        assert_eq!((cli.serve.max_in_flight, cli.serve.drain_timeout_s), (7, 3));
        assert_eq!(cli.serve.media_video_fps, 2.5);
        // Without a file: the defaults.
        let cli = load(&["--config", &file("").1]).unwrap();
        assert_eq!(cli.serve.max_in_flight, 256);
        assert!(!cli.serve.cache_key_header);
        // A switch set to false in the file stays off; numbers may be written as strings.
        let (_e, q) = file("cache-key-header = false\nmax-tokens = \"100\"\n");
        let cli = load(&["--config", &q]).unwrap();
        assert!(!cli.serve.cache_key_header);
        assert_eq!(cli.serve.max_tokens, 100);
        // The keyring of `keys` falls back to the server's (the file's) --api-keys.
        let (_f, k) = file("api-keys = \"/etc/memra/keys.json\"\n");
        let cli = load(&["--config", &k, "keys", "list"]).unwrap();
        assert_eq!(
            cli.serve.api_keys,
            Some(PathBuf::from("/etc/memra/keys.json"))
        );
    }

    #[test]
    fn config_file_errors_name_the_file_and_the_key() {
        let (_d, p) = file("max-in-flght = 3\n");
        let e = config_error(&["--config", &p]);
        assert!(
            e.contains(&p) && e.contains("unknown key `max-in-flght`"),
            "{e}"
        );
        assert!(e.contains("max-in-flight"), "the keys are listed: {e}");
        for (text, key, why) in [
            (
                "max-in-flight = \"many\"\n",
                "max-in-flight",
                "invalid value 'many'",
            ),
            (
                "max-in-flight = -1\n",
                "max-in-flight",
                "invalid value '-1'",
            ),
            (
                "max-in-flight = 1.5\n",
                "max-in-flight",
                "invalid value '1.5'",
            ),
            ("max-in-flight = true\n", "max-in-flight", "found boolean"),
            (
                "cache-key-header = 1\n",
                "cache-key-header",
                "expected true or false",
            ),
            ("addr = \"nowhere\"\n", "addr", "invalid value 'nowhere'"),
            ("kv-dtype = \"f12\"\n", "kv-dtype", "invalid value 'f12'"),
            ("models = [1.5]\n", "models", "found one holding a float"),
            ("[server]\naddr = \"0.0.0.0:80\"\n", "server", "unknown key"),
            ("log = { level = \"info\" }\n", "log", "found table"),
            (
                "config = \"/etc/other.toml\"\n",
                "config",
                "cannot name another",
            ),
        ] {
            let (_d, p) = file(text);
            let e = config_error(&["--config", &p]);
            assert!(e.starts_with(&format!("config file {p}: ")), "{text}: {e}");
            assert!(
                e.contains(&format!("`{key}`")) && e.contains(why),
                "{text}: {e}"
            );
        }
        // Wrong even where the command line overrides it: the file is checked whole.
        let (_d, p) = file("max-in-flight = \"many\"\n");
        let e = config_error(&["--config", &p, "--max-in-flight", "3"]);
        assert!(e.contains("max-in-flight"), "{e}");
        // Not TOML; no such file.
        let (_d, p) = file("max-in-flight = \n");
        let e = config_error(&["--config", &p]);
        assert!(e.contains(&p) && e.contains("line 1"), "{e}");
        let e = config_error(&["--config", "/nonexistent/memra.toml"]);
        assert!(
            e.contains("/nonexistent/memra.toml") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn the_example_config_file_parses_and_names_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/memra-server.example.toml");
        let p = path.display().to_string();
        let cli = load(&["--config", &p]).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(cli.serve.model_specs().is_ok());
        let text = std::fs::read_to_string(&path).unwrap();
        let cmd = Cli::command();
        for key in file_keys(&cmd).filter_map(|a| a.get_long()) {
            assert!(
                text.lines().any(|l| {
                    let l = l.trim_start_matches(['#', ' ']);
                    l.strip_prefix(key)
                        .is_some_and(|r| r.trim_start().starts_with('='))
                }),
                "{p} does not show `{key} = ...` (set or commented out)"
            );
        }
    }
}
