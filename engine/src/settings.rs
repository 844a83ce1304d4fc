//! Every setting memra's programs read, in ONE table ([`SETTINGS`]): the flags of run-gen and
//! memra-server (each with its environment variable where it has one), the variables the engine
//! library reads in every program, and those that only tests and tools read. docs/FLAGS.md is
//! generated from it (`memra-bench flags`); tests hold it to the code: the clap flags of run-gen
//! and memra-server, every `MEMRA_*` name in the sources, and who may read the environment.
//!
//! The engine library reads environment variables here only ([`var`], [`var_os`] and the typed
//! accessors below); a binary's flags and their environment fallbacks are declared by its clap
//! arguments (server/src/config.rs, run-gen, memra-verify, memra-bench); the kernels crate,
//! below this one, reads its two cache variables in kernels/src/lib.rs.
//!
//! Tuning of the CUDA kernels is not a setting: the device profile (backend/cuda/profile.rs)
//! chooses it from the device, and the alternatives a gate or a microbenchmark exercises are
//! arguments of `memra-verify kernels` and `memra-bench kernels`.

use std::ffi::OsString;
use std::path::PathBuf;

/// Who reads a setting: the section of docs/FLAGS.md it is listed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// A flag of run-gen.
    RunGen,
    /// A flag of memra-server, also a key of its config file (`--config`), with an environment
    /// variable where a deployment sets it per container.
    Server,
    /// An environment variable the engine library reads in every program that opens a model.
    Engine,
    /// A flag of memra-verify or memra-bench that has an environment variable.
    Tools,
    /// Read only by tests, tools/*.sh and measurement scripts.
    Tests,
}

impl Program {
    /// Whether a setting of this program is a product setting (a user may set it to run memra)
    /// rather than a test or tool variable.
    pub fn product(self) -> bool {
        matches!(self, Program::RunGen | Program::Server | Program::Engine)
    }
}

/// One setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub program: Program,
    /// The flag (`--max-tokens`, or `MODEL` for a positional argument); "" when none.
    pub flag: &'static str,
    /// The environment variable; "" when none.
    pub env: &'static str,
    /// The default, as docs/FLAGS.md shows it (where clap has a default, exactly clap's).
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn flag(
    program: Program,
    flag: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Setting {
    Setting {
        program,
        flag,
        env: "",
        default,
        meaning,
    }
}

const fn both(
    program: Program,
    flag: &'static str,
    env: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Setting {
    Setting {
        program,
        flag,
        env,
        default,
        meaning,
    }
}

const fn env(
    program: Program,
    env: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Setting {
    Setting {
        program,
        flag: "",
        env,
        default,
        meaning,
    }
}

use Program::{Engine, RunGen, Server, Tests, Tools};

/// The table.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    // run-gen
    flag(RunGen, "MODEL", "—", "GGUF file (or first part of a split GGUF) or HF safetensors folder"),
    flag(RunGen, "--prompt", "—", "prompt text (tokenized with the model's tokenizer; BOS per the model)"),
    flag(RunGen, "--prompt-ids", "—", "prompt as comma-separated token ids"),
    flag(RunGen, "--chat", "off", "render the prompt as one user message with the model's chat template + generation prompt"),
    flag(RunGen, "--system", "—", "system message (with `--chat`)"),
    flag(RunGen, "--max-tokens", "128", "tokens to generate at most"),
    flag(RunGen, "--temperature", "0", "below 1e-5 (0 included) = greedy"),
    flag(RunGen, "--top-k", "0", "0 = off"),
    flag(RunGen, "--top-p", "1", "1 = off"),
    flag(RunGen, "--min-p", "0", "0 = off"),
    flag(RunGen, "--repetition-penalty", "1", "1 = off"),
    flag(RunGen, "--presence-penalty", "0", "0 = off"),
    flag(RunGen, "--frequency-penalty", "0", "0 = off"),
    flag(RunGen, "--seed", "0", "sampling seed (randomness keyed by seed and position)"),
    flag(RunGen, "--device", "auto", "`auto`, `cpu`, `cuda` or `cuda:N`: auto = the GPU when CUDA is available, else the CPU; cuda without a GPU is a clear error"),
    flag(RunGen, "--pp", "1", "pipeline stages: the model's layers split over N stages by the memory plan (weights, KV cache, recurrent state per stage), the split printed at start; same tokens and logits as unsplit (docs/SERVING.md)"),
    flag(RunGen, "--devices", "—", "one device per pipeline stage, comma-separated (`cuda:0,cuda:1`, `cpu,cpu`); given without `--pp`, its count is the stage count; default: every stage on `--device`"),
    flag(RunGen, "--pp-split", "—", "the first layer of each stage after the first, comma-separated (e.g. `12`); default: the balanced split of the memory plan"),
    flag(RunGen, "--pp-micro", "2", "with `--pp` 2 or more: a step of several sequences cut into up to N micro-batches of whole sequences, so stages on two GPUs work at once (1: off; one GPU gains nothing); same tokens and logits"),
    flag(RunGen, "--pp-link", "auto", "the hand-over between stages on two GPUs: `nccl` (NCCL send/recv; refused when libnccl does not load), `peer` (cuMemcpyPeerAsync), `auto` (NCCL when it loads, else the peer copy); one GPU: a device copy"),
    flag(RunGen, "--threads", "0", "CPU threads (0 = all cores); results are identical for any N"),
    flag(RunGen, "--kv-dtype", "f16", "the KV cache's element format: `f16`, `bf16`, `q8_0` or `f32` (docs/KV_CACHE.md); both backends store it"),
    flag(RunGen, "--prefill-chunk", "0", "prefill chunk size (0 = whole prompt); results are identical for any N"),
    flag(RunGen, "--ignore-eos", "off", "do not stop at EOS / end-of-turn (benchmarks always generate `--max-tokens`)"),
    flag(RunGen, "--json", "off", "print one JSON object at the end: prompt_ids, tokens, text, finish_reason, prompt_tok_per_s, decode_tok_per_s, logits_top"),
    flag(RunGen, "--logits-top", "0", "include the top K (id, logit) pairs of every generated position"),
    flag(RunGen, "--no-cuda-graph", "off", "CUDA: run every step plainly instead of as a CUDA graph (as `MEMRA_CUDA_GRAPHS=0`); tokens are identical either way"),
    flag(RunGen, "--spec", "off", "speculative decoding: `ngram` (prompt lookup, no weights), `mtp` (the model's own multi-token-prediction layer, for checkpoints with `nextn` layers, on the CPU or CUDA, see docs/SERVING.md), `draft:PATH` (a draft model with the same tokenizer), `auto` (its MTP layers if it has them, with n-gram lookup, picked per step by measured acceptance) or `auto+draft:PATH`; K drafts are checked in one step of K+1 rows and a draft is kept iff it equals plain decoding's pick (greedy or seeded), so the tokens are identical; the JSON gains `spec` (drafted, accepted, verify_steps, mean_accepted_length)"),
    flag(RunGen, "--spec-k", "8", "most drafts per step (1..16); shortened or switched off per sequence when acceptance does not pay for the extra rows, probed again later; an n-gram draft is cut to the depth its match length earns"),
    // memra-server: every flag is also a key of the config file; a variable only where a
    // deployment sets it per container
    both(Server, "--config", "MEMRA_CONFIG", "—", "a TOML file of settings whose keys are these flags without their dashes (`max-in-flight = 512`, `models = \"chat=/m/a.gguf\"`, a list flag also as an array of strings, a switch as `true`/`false`); precedence: command line > environment variable > config file > default; an unreadable file, bad TOML, an unknown key or a value the flag does not take is an error naming the file and the key, before anything starts; `memra-server config` prints the settings in effect and where each came from (docs/memra-server.example.toml)"),
    both(Server, "--models", "MEMRA_MODELS", "the fetched default", "`alias=path[,alias2=path2]`; per model options after the path: `+spec=auto` (the default: the model's MTP layers if it has them, a `+draft=PATH` model if given, n-gram lookup, picked per sequence by measured acceptance), `+spec=ngram`, `+spec=mtp`, `+spec=draft` with `+draft=PATH`, or `+spec=off` (speculative decoding never changes the output; docs/SERVING.md), `+spec_k=K` (default 8), `+kv=DTYPE` (this model's KV cache format, else `--kv-dtype`), `+mmproj=PATH` (an mmproj GGUF: the model's vision tower, image input; docs/SERVING.md), e.g. `chat=/m/t.gguf+spec=ngram+spec_k=6+kv=q8_0`; a path is a GGUF file or an HF folder; a bare path is served under its file name. Unset: `~/.cache/memra/models/SmolLM2-135M-Instruct.Q4_1.gguf` as `smollm2-135m-instruct` if tools/fetch-models.sh fetched it, else the server says how to get a model and exits"),
    both(Server, "--models-dir", "MEMRA_MODELS_DIR", "`~/.cache/memra/models`", "where the default model is looked for"),
    both(Server, "--addr", "MEMRA_ADDR", "127.0.0.1:8080", "listen address"),
    both(Server, "--device", "MEMRA_DEVICE", "auto", "`auto`, `cpu`, `cuda`, `cuda:N`"),
    both(Server, "--threads", "MEMRA_THREADS", "0", "CPU backend threads (0 = all cores)"),
    both(Server, "--pp", "MEMRA_PP", "1", "pipeline stages per model: layers split over N stages by the memory plan (weights, KV cache, recurrent state per stage), each on its `--devices` entry; the split is in the startup log and `/v1/models` (`pipeline`); outputs are identical to the unsplit model's (docs/SERVING.md)"),
    both(Server, "--devices", "MEMRA_DEVICES", "—", "one device per pipeline stage, comma-separated (`cuda:0,cuda:1`, or `cuda:0,cuda:0` for two stages on one GPU, `cpu,cpu`); given without `--pp`, its count is the stage count; default: every stage on `--device`"),
    flag(Server, "--pp-split", "—", "the first layer of each stage after the first, comma-separated (e.g. `40`); default: the balanced split of the memory plan; a stage that does not fit its device is refused naming it and the bytes missing"),
    flag(Server, "--pp-micro", "2", "with `--pp` 2 or more: each step of several sequences cut into up to N micro-batches of whole sequences, so stages on two GPUs work at once (1: off; one GPU gains nothing); in the startup log and `/v1/models` (`pipeline`); outputs unchanged (docs/SERVING.md)"),
    flag(Server, "--pp-link", "auto", "the hand-over between stages on two GPUs: `nccl` (NCCL send/recv; refused at start when libnccl does not load), `peer` (cuMemcpyPeerAsync), `auto` (NCCL when it loads, else the peer copy, the reason in the split summary); one GPU: a device copy"),
    both(Server, "--max-running", "MEMRA_MAX_RUNNING", "64", "sequences the engine runs at once per model (more wait in its queue); also the most one tenant may run: there is no separate per-tenant running cap, the scheduler admits the waiting tenant with the fewest running sequences first"),
    both(Server, "--kv-blocks", "MEMRA_KV_BLOCKS", "0", "KV cache blocks per model (0 = sized from free device / host memory at load, after the weights and, on CUDA, the working space; on CUDA a count that does not fit is refused before anything is allocated, naming the count that would fit)"),
    both(Server, "--kv-dtype", "MEMRA_KV_DTYPE", "f16", "the KV cache's element format: `f16`, `bf16`, `q8_0` (about half the bytes of f16) or `f32` (docs/KV_CACHE.md); a model's `+kv=DTYPE` in `--models` overrides it; the format, bytes per position and capacity in positions are in the startup log and `/v1/models` (`kv_cache`)"),
    both(Server, "--api-keys", "MEMRA_API_KEYS", "none (open server)", "keyring file (SHA-256 key hashes -> tenants, per-tenant limits); reloaded when it changes"),
    flag(Server, "--keys-poll-ms", "1000", "how often the keyring file is checked for changes"),
    flag(Server, "--max-body-bytes", "4194304", "largest request body (413 above)"),
    flag(Server, "--max-tokens", "4096", "largest `max_tokens` a request may ask (400 above); also caps the default"),
    flag(Server, "--max-in-flight", "256", "inference requests in flight server-wide (503 + `Retry-After` above)"),
    flag(Server, "--max-queue", "128", "requests waiting in the engine's queue, all tenants and models (the engine answers 503 + `Retry-After` above)"),
    flag(Server, "--tenant-max-in-flight", "64", "requests one tenant may have in flight (429 + `Retry-After` above); a keyring entry may set its own. The limit that applies (the entry's, else this flag) travels with each request, so the server and the engine's queue enforce the same number"),
    flag(Server, "--body-timeout-s", "30", "how long a client may take to send a request body (408 after); the body is read before the request takes an in-flight slot, so a slow sender holds none"),
    flag(Server, "--stream-write-timeout-s", "30", "how long a stream may wait for the client to read (its buffer full) before the server cancels the request and frees its slot and KV"),
    flag(Server, "--max-connections", "1024", "open client connections; above it a new connection gets 503 + `Retry-After` and is closed. At start the server raises its soft open-file limit to the hard limit and lowers this cap to fit under it (with a warning)"),
    flag(Server, "--drain-timeout-s", "30", "on SIGTERM/SIGINT, how long requests that have their first token may take to finish (requests still waiting for it get 503 `draining` at once)"),
    flag(Server, "--media-max-bytes", "8388608", "largest image or video frame in a request, in bytes after base64 decoding (400 above; raise `--max-body-bytes` too for large images)"),
    flag(Server, "--media-max-pixels", "16777216", "largest image width x height, read from the image header before anything is decoded (400 above: decoding bombs); decoders also run under allocation limits"),
    flag(Server, "--media-max-images", "8", "most images plus video frames (after sampling) in one request (400 above)"),
    flag(Server, "--media-max-frames", "8", "most frames of one video after sampling (400 above)"),
    flag(Server, "--media-video-fps", "1", "the rate a video's frames are sampled at: a video sent with `fps` F keeps every (F / this)-th frame, evenly; each kept frame is an image (Gemma 3), or the kept frames are the model's own video (the Qwen ViT)"),
    flag(Server, "--media-allowed-hosts", "none", "hosts image URLs may name, comma-separated; empty: remote URLs get 400. An allowed host's `http://` URL is fetched (one GET, no redirects, 10 s, `--media-max-bytes`, its `Content-Type` checked against the data); `https://` needs TLS, which this build does not include (400)"),
    flag(Server, "--cache-key-header", "off", "inference responses carry `x-memra-cache-key`, a routing key for cache-affine gateways (docs/DEPLOY.md)"),
    both(Server, "--log", "MEMRA_LOG", "info", "log filter (tracing EnvFilter syntax), logs go to stderr"),
    // The engine library, in every program that opens a model
    env(Engine, "MEMRA_CUDA_GRAPHS", "on", "`0`: run every CUDA step plainly instead of as a CUDA graph (run-gen: `--no-cuda-graph`); tokens are identical either way"),
    env(Engine, "MEMRA_KERNEL_CACHE", "`~/.cache/memra/kernels`", "compiled-kernel cache folder: PTX compiled by NVRTC on first use, and precompiled cubins (`memra-bench kernel-cache`) loaded as they are (to ignore them, point it at an empty folder)"),
    // memra-verify and memra-bench flags with a variable
    both(Tools, "memra-verify --kv-dtype", "MEMRA_KV_DTYPE", "f16", "the KV cache format a gate runs with"),
    both(Tools, "memra-bench synth --models-dir", "MEMRA_MODELS_DIR", "`~/.cache/memra/models`", "where the default tokenizer source (the fetched SmolLM2) is looked for"),
    // Tests, tools and measurement scripts
    env(Tests, "MEMRA_TEST_MODEL", "`$MEMRA_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf`", "tests: the SmolLM2-135M-Instruct GGUF (tools/test.sh sets it)"),
    env(Tests, "MEMRA_GEMMA3_MODEL", "`$MEMRA_MODELS_DIR/gemma-3-270m-q4_k_m.gguf`", "tests: the Gemma 3 270M GGUF (its tests skip without it)"),
    env(Tests, "MEMRA_PYTHON", "`python3`", "tests: a Python with numpy + gguf (the quant fixture, the server's OpenAI-client test)"),
    env(Tests, "MEMRA_TEST_URL", "—", "set by the server's OpenAI-client test for its Python client: the server's URL"),
    env(Tests, "MEMRA_TEST_KEY", "—", "set by the server's OpenAI-client test for its Python client: the API key"),
    env(Tests, "MEMRA_TEST_ALIAS", "—", "set by the server's OpenAI-client test for its Python client: the model alias"),
    env(Tests, "MEMRA_COMMIT", "`git rev-parse --short HEAD`", "memra-bench rows and memra-verify golden records: the commit to record (the device has no git checkout)"),
    env(Tests, "MEMRA_KERNEL_DIR", "—", "memra-bench kernels, memra-bench kernel-cache and the engine: a folder whose `.cu`/`.cuh` files replace the built-in kernel sources of the same name (kernel variants on the GPU machine without a Rust rebuild)"),
    env(Tests, "MEMRA_PROFILE_OPS", "off", "`1`: the CUDA backend's per-op device times of plain (non-graph) steps, printed at exit (stderr); use with `--no-cuda-graph`"),
    env(Tests, "MEMRA_INSTALL_DIR", "`~/.local/bin`", "tools/install.sh: where the binaries go"),
    env(Tests, "PYTHON", "`python3`", "tools/*.sh: the Python used to pip-install and unpack wheels"),
];

/// The row of environment variable `name`, if the table has one (the first, for a variable
/// that several programs read).
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.env == name)
}

/// Environment variable `name`, which must be in [`SETTINGS`] (a debug build panics otherwise:
/// a new variable is a new row). `None` when unset or not UTF-8.
pub fn var(name: &str) -> Option<String> {
    var_os(name).and_then(|v| v.into_string().ok())
}

/// [`var`] as the OS string.
pub fn var_os(name: &str) -> Option<OsString> {
    debug_assert!(
        setting(name).is_some(),
        "{name} is read but is not in memra_engine::settings::SETTINGS"
    );
    std::env::var_os(name)
}

/// The home folder (`HOME`), for the default cache and model folders.
pub fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// The program search path (`PATH`), for tools that look for an external program.
pub fn search_path() -> Option<OsString> {
    std::env::var_os("PATH")
}

/// Whether CUDA steps of up to 64 rows run as CUDA graphs: yes, unless `MEMRA_CUDA_GRAPHS=0`.
pub fn cuda_graphs() -> bool {
    var("MEMRA_CUDA_GRAPHS").is_none_or(|v| v != "0")
}

/// Whether the CUDA backend times the ops of plain steps (`MEMRA_PROFILE_OPS=1`).
pub fn profile_ops() -> bool {
    var("MEMRA_PROFILE_OPS").is_some_and(|v| v == "1")
}

/// The commit to record in measurement rows and golden records (`MEMRA_COMMIT`), if set.
pub fn commit() -> Option<String> {
    var("MEMRA_COMMIT")
}

/// The folder tools/fetch-models.sh keeps models in: `MEMRA_MODELS_DIR`, else
/// `~/.cache/memra/models`.
pub fn models_dir() -> PathBuf {
    var_os("MEMRA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().unwrap_or_default().join(".cache/memra/models"))
}

/// The environment variables a user may set to run memra (product settings), each once.
pub fn product_vars() -> Vec<&'static str> {
    let mut v: Vec<&str> = SETTINGS
        .iter()
        .filter(|s| s.program.product() && !s.env.is_empty())
        .map(|s| s.env)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The most product environment variables there may be (issue 39: a newcomer's house has few
/// doors). memra-server's other settings are flags and keys of its config file (`--config`).
pub const MAX_PRODUCT_VARS: usize = 15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_product_variables() {
        let vars = product_vars();
        assert!(
            vars.len() <= MAX_PRODUCT_VARS,
            "{} product environment variables (at most {MAX_PRODUCT_VARS}): {vars:?}; make the \
             new setting a flag (memra-server: also a key of its config file) instead",
            vars.len()
        );
        // Each is a variable of memra-server or of the engine (run-gen has flags only).
        for s in SETTINGS.iter().filter(|s| s.program == Program::RunGen) {
            assert!(s.env.is_empty(), "run-gen {} has a variable", s.flag);
        }
    }

    #[test]
    fn rows_are_unique_and_complete() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(!s.flag.is_empty() || !s.env.is_empty(), "row {i}");
            assert!(!s.meaning.is_empty() && !s.default.is_empty(), "row {i}");
            assert!(
                s.env.is_empty() || s.env == "PYTHON" || s.env.starts_with("MEMRA_"),
                "{}",
                s.env
            );
            for t in &SETTINGS[i + 1..] {
                assert!(
                    t.program != s.program || (t.flag, t.env) != (s.flag, s.env),
                    "{s:?} twice"
                );
                // One variable, one meaning of its value: a second row only for a second
                // program reading it.
                if !s.env.is_empty() && s.env == t.env {
                    assert_ne!(s.program, t.program, "{}", s.env);
                }
            }
        }
    }
}
