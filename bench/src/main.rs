//! `memra-bench`: synthetic models and format conversion. Every flag and environment variable
//! of the binary is declared here.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use memra_bench::convert::{ConvertArgs, convert_gguf_to_hf};
use memra_bench::plan::SynthDType;
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, default_tokenizer_path, synth};
use memra_bench::to_gguf::{ToGgufArgs, convert_hf_to_gguf};
use memra_engine::error::{Error, Result};
use memra_engine::quant::DType;

#[derive(Parser)]
#[command(
    name = "memra-bench",
    about = "memra benchmarks, synthetic models and conversions"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The flags of `decode`, `prefill` and `ttft`.
#[derive(Args)]
struct SpeedFlags {
    /// A GGUF file or HF folder.
    model: PathBuf,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Prompt lengths in tokens (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    prompt: Vec<usize>,
    /// Generated tokens (decode).
    #[arg(long = "gen", default_value_t = 128)]
    gen_tokens: usize,
    /// decode only: context depths (comma-separated), one more decode row each, measured
    /// after a context of that many tokens (llama-bench -d)
    #[arg(long, value_delimiter = ',')]
    depth: Vec<usize>,
    /// decode only: prefill rows of these prompt lengths too (comma-separated), measured after
    /// the decode rows by the same loaded engine (one load of a large file, not two)
    #[arg(long, value_delimiter = ',')]
    prefill: Vec<usize>,
    /// ttft only: the cached row measures a new turn of N tokens after the cached prompt (a
    /// conversation's next user message) instead of the same prompt again.
    #[arg(long, default_value_t = 0)]
    turn: usize,
    /// decode only: constrain the timed requests by this JSON Schema file (structured output,
    /// as `response_format: json_schema`); the rows say `"constraint": "json_schema"`.
    #[arg(long)]
    schema: Option<PathBuf>,
    /// The KV cache's element format: f16 (default), bf16, q8_0 or f32.
    #[arg(long, default_value = "f16")]
    kv_dtype: memra_engine::engine::KvDtype,
    /// Timed runs after the untimed reference run; the row is their median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The model's shape label for the rows (llama3-8b, smollm2-135m).
    #[arg(long)]
    shape: Option<String>,
    /// The weight type label for the rows (Q4_K_M, Q8_0, F16, Q4_1).
    #[arg(long)]
    dtype: Option<String>,
    /// Run id shared with the peer's rows of the same invocation (default: time and pid).
    #[arg(long)]
    run: Option<String>,
    /// Append the rows to this JSONL file (reports/data/NAME.jsonl).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the rows as JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Measure a running OpenAI-compatible server at host:port (memra-server or llama-server)
    /// instead of the engine; MODEL is the file it serves (for the rows).
    #[arg(long)]
    server: Option<String>,
    /// The model name the server serves.
    #[arg(long, default_value = "m")]
    served_model: String,
    /// Bearer key for the server.
    #[arg(long)]
    api_key: Option<String>,
    /// The rows' engine label for --server (memra, llama.cpp).
    #[arg(long, default_value = "memra")]
    engine: String,
    /// The rows' engine version for --server (e.g. the peer's source).
    #[arg(long)]
    engine_version: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Batch-1 decode tok/s after a prompt, through the engine (median of --runs, checked
    /// against an untimed reference run).
    Decode(SpeedFlags),
    /// Prefill tok/s of each --prompt length.
    Prefill(SpeedFlags),
    /// Time to first token: cold (fresh cache salt) and cached (prefix in the cache).
    Ttft(SpeedFlags),
    /// The vision tower's images/s (images of its size encoded back to back after a warm-up,
    /// each a fresh content) and the TTFT of a one-image chat request through the engine
    /// (median of --runs, a fresh image and cache salt each): `vision_encode` and
    /// `vision_ttft` rows. --images-dir writes the images as PNG for llama.cpp
    /// (tools/device/mtmd_bench.sh, `peer mtmd`). docs/BENCH.md.
    Vision(VisionFlags),
    /// The peer, llama.cpp: `peer fetch` its source, `peer build` it, `peer llama.cpp MODEL`
    /// runs its llama-bench on the same file (docs/BENCH.md).
    Peer {
        #[command(subcommand)]
        cmd: PeerCmd,
    },
    /// docs/FLAGS.md from the one table of settings (engine/src/settings.rs): printed, or
    /// written to --out.
    Flags {
        /// Write it here (docs/FLAGS.md) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Tables, SVG figures and the README's performance section from reports/data/*.jsonl.
    Report {
        /// The folder of measurement rows.
        #[arg(long, default_value = "reports/data")]
        data: PathBuf,
        /// Where reports/README.md and figures/ go.
        #[arg(long, default_value = "reports")]
        out: PathBuf,
        /// The README whose marked section is rewritten ("none": leave it).
        #[arg(long, default_value = "README.md")]
        readme: String,
    },
    /// Device microbenchmark of the v2 products: correctness, bitwise invariance across M and
    /// launch geometries, then time, GB/s and TFLOP/s per (type, N x K, M).
    Kernels {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Weight types (comma-separated).
        #[arg(long, default_value = "q4_k,q6_k,q8_0,f16")]
        dtypes: String,
        /// N x K shapes (comma-separated); the llama3-8b products and LM head by default.
        #[arg(
            long,
            default_value = "4096x4096,1024x4096,14336x4096,4096x14336,49152x4096"
        )]
        shapes: String,
        /// Row counts M.
        #[arg(long, default_value = "1,2,4,8,16,32,64,512")]
        m: String,
        /// Extra launch geometries `nt,rpb,KIND;...` to check and time: KIND s (split K), n
        /// (register-tiled), m (shared-memory), w (warpgroup), x / x3 (warp-specialized with two /
        /// three computing warpgroups), e.g. `16,1,w` for 128-token warpgroup blocks.
        #[arg(long, default_value = "")]
        launches: String,
        /// Timed repetitions per case.
        #[arg(long, default_value_t = 20)]
        reps: usize,
        /// Write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Precompile every kernel the engine can load on --arch to SASS (cubin files), here,
    /// without a GPU; a device whose MEMRA_KERNEL_CACHE holds them skips NVRTC and the driver's
    /// JIT (docs/DEVICE.md). Needs NVRTC (libnvrtc.so on LD_LIBRARY_PATH).
    KernelCache {
        /// sm_90a (H100/H200) or sm_120a (RTX 5090 / RTX PRO 6000).
        #[arg(long, default_value = "sm_90a")]
        arch: String,
        /// Output folder (default: the kernel cache, MEMRA_KERNEL_CACHE or ~/.cache/memra/kernels).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write a random vision tower as an mmproj GGUF (llama.cpp's layout), to pair with a text
    /// model of width --text-hidden (memra-server `+mmproj=PATH`): Gemma 3's (a gemma3 text
    /// model) or the Qwen ViT's (a qwen2vl / qwen3vl text model: `synth --shape
    /// tiny-qwen2vl|tiny-qwen3vl`; a plain qwen2 / qwen3 takes them at consecutive positions).
    SynthMmproj {
        /// tiny (Gemma 3, 64x64 images, 16 tokens), tiny-long (Gemma 3, 60x60 at 2x2 patches:
        /// 225 tokens, near the real tower's image span, from a cheap tower), gemma3 (SigLIP so400m at
        /// 896x896, 256 tokens), tiny-qwen2vl, tiny-qwen25vl, tiny-qwen3vl (48x48: 36 tokens),
        /// qwen25vl-7b (Qwen2.5-VL-7B's tower), qwen3vl-8b (Qwen3-VL-8B's).
        #[arg(long, default_value = "tiny")]
        shape: String,
        /// The text model's hidden size (tiny-gemma3: 64, gemma3-270m: 640).
        #[arg(long, default_value_t = 64)]
        text_hidden: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// f32 or f16.
        #[arg(long, default_value = "f32")]
        dtype: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a deterministic synthetic model of a real shape (random weights, real tokenizer).
    Synth {
        /// smollm2-135m, llama3-8b, qwen3-8b, tiny-llama, tiny-qwen2, tiny-qwen3, tiny-qwen2vl,
        /// tiny-qwen3vl (the Qwen-VL text models: M-RoPE; pair with `synth-mmproj --shape
        /// tiny-qwen25vl|tiny-qwen3vl`), ... (every shape of shapes.rs).
        #[arg(long)]
        shape: String,
        /// f32, f16, bf16, q8_0, q4_0, q4_k_m (llama.cpp's mix); fp8, nvfp4 (HF checkpoints, --format hf).
        #[arg(long, default_value = "f16")]
        dtype: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output GGUF file or HF folder.
        #[arg(long)]
        out: PathBuf,
        /// gguf or hf.
        #[arg(long, default_value = "gguf")]
        format: String,
        /// Override the number of layers.
        #[arg(long)]
        layers: Option<usize>,
        /// Add N multi-token-prediction (`nextn`) layers after the decoder layers (llama,
        /// qwen2, qwen3 shapes), for `--spec mtp`.
        #[arg(long, default_value_t = 0)]
        mtp: usize,
        /// Wire the model as the engine's MTP oracle (output projections zero, tied embeddings,
        /// the first MTP layer drafting the model's own picks: nearly every draft accepted);
        /// llama, qwen2, qwen3 and qwen3next shapes; implies --mtp 1 when --mtp is 0.
        #[arg(long)]
        mtp_oracle: bool,
        /// Gemma 3 shapes: the local layers' sliding window (default: the shape's).
        #[arg(long)]
        sliding_window: Option<usize>,
        /// GGUF whose tokenizer is copied ("none": no tokenizer, see --vocab).
        #[arg(long)]
        tokenizer_from: Option<String>,
        /// Vocabulary size when --tokenizer-from none.
        #[arg(long, default_value_t = 49152)]
        vocab: usize,
        /// Worker threads (default: one per core). The output does not depend on it.
        #[arg(long)]
        threads: Option<usize>,
        /// HF shard size limit in bytes.
        #[arg(long, default_value_t = 5_000_000_000)]
        shard_bytes: u64,
        /// Directory of the fetched models (tools/fetch-models.sh).
        #[arg(long, env = "MEMRA_MODELS_DIR")]
        models_dir: Option<PathBuf>,
        /// GGUF: store llama3 RoPE scaling as llama.cpp does (rope_freqs.weight, no
        /// rope.scaling.* keys) so llama.cpp can load the file.
        #[arg(long)]
        llamacpp_rope: bool,
        /// Quantize Q4_K/Q6_K from the f32 weights with the reference quantizer (minutes for an
        /// 8B model) instead of drawing random valid blocks.
        #[arg(long)]
        exact_kquants: bool,
        /// The context length the file declares (default: the shape's, 8,192 for llama3-8b).
        #[arg(long)]
        ctx: Option<usize>,
        #[arg(long)]
        quiet: bool,
    },
    /// Aggregate decode tok/s of the engine loop at several concurrency levels (a benchmark).
    Concurrency {
        /// A GGUF file or HF folder.
        model: PathBuf,
        /// auto, cpu, cuda or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
        /// Concurrent sequences per level, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        levels: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        prompt_len: usize,
        /// Tokens generated per request (EOS ignored).
        #[arg(long = "gen", default_value_t = 128)]
        gen_tokens: usize,
        /// Scheduler token budget per step.
        #[arg(long, default_value_t = 2048)]
        max_batch_tokens: usize,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Speculative decoding on real request kinds through memra-server: a workload file (code
    /// edit, RAG quote, JSON extraction, summarization, chat, multi-turn) sent to a model that
    /// speculates and to one that does not (`MEMRA_MODELS=on=FILE,off=FILE+spec=off`), greedy and
    /// sampled with the same seeds: tok/s, TTFT, acceptance, fallbacks and whether every output
    /// is the same bytes (the command fails when one is not). docs/BENCH.md.
    Spec {
        /// The workload (JSON lines).
        #[arg(long, default_value = "bench/workloads/spec.jsonl")]
        workload: PathBuf,
        /// host:port of the server with the model that speculates.
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: String,
        /// host:port of the server with the model that does not (default: --addr).
        #[arg(long)]
        addr_off: Option<String>,
        /// The alias of the model that speculates.
        #[arg(long, default_value = "on")]
        model: String,
        /// The alias of the model that does not (the same alias as --model on the same server:
        /// one copy of the weights, its plain requests sending `"speculative": false`).
        #[arg(long, default_value = "off")]
        model_off: String,
        /// Comma-separated: greedy, sampled.
        #[arg(long, default_value = "greedy,sampled")]
        sampling: String,
        /// The sampled configuration.
        #[arg(long, default_value_t = 0.8)]
        temperature: f32,
        #[arg(long, default_value_t = 0.9)]
        top_p: f32,
        #[arg(long, default_value_t = 40)]
        top_k: usize,
        /// Request i's seed is SEED + i, the same for both models.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Concurrent clients per mode (1: the two models alternate request by request, and
        /// /metrics is read around each request).
        #[arg(long, default_value_t = 1)]
        clients: usize,
        /// Times each request is sent per mode and sampling.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Cap on every request's max_tokens (0: the workload's).
        #[arg(long, default_value_t = 0)]
        max_tokens: usize,
        /// Only these kinds (comma-separated).
        #[arg(long, value_delimiter = ',')]
        kinds: Vec<String>,
        #[arg(long)]
        api_key: Option<String>,
        /// Append the rows (JSON lines) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write the markdown table here (it is printed either way).
        #[arg(long)]
        table: Option<PathBuf>,
        /// The rows' run id.
        #[arg(long)]
        run: Option<String>,
        /// The model file the servers loaded (for the rows).
        #[arg(long)]
        model_file: Option<PathBuf>,
        #[arg(long)]
        shape: Option<String>,
        #[arg(long)]
        dtype: Option<String>,
        /// The servers' device, for the rows (cpu or cuda:N).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// The engine the servers run, for the rows: memra, or llama.cpp (llama-server with
        /// its speculation on at --addr and off at --addr-off; it has no memra /metrics, so
        /// the verify steps and fallbacks columns stay empty).
        #[arg(long, default_value = "memra")]
        engine: String,
    },
    /// Loopback load test of a running OpenAI-compatible server: concurrent streaming chat
    /// clients; errors, sheds (429/503), cancellations, tok/s, TTFT and inter-token percentiles.
    Load {
        /// host:port of the server.
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: String,
        #[arg(long)]
        model: String,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Requests per client, one after another.
        #[arg(long, default_value_t = 4)]
        requests: usize,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Bearer key, if the server has a keyring.
        #[arg(long)]
        api_key: Option<String>,
        /// Append the result as a `load` row to this JSONL file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The row's run id (shared with the other rows of a comparison).
        #[arg(long)]
        run: Option<String>,
        /// The server measured: memra or llama.cpp (llama-server).
        #[arg(long, default_value = "memra")]
        engine: String,
        /// The model file the server loaded (for the row's model fields).
        #[arg(long)]
        model_file: Option<PathBuf>,
        #[arg(long)]
        shape: Option<String>,
        #[arg(long)]
        dtype: Option<String>,
        /// The server's device, for the row (cpu or cuda:N).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Filler words per prompt, cycled over the requests (comma-separated; a prompt-length
        /// mix). Default: the short prompt only.
        #[arg(long, value_delimiter = ',')]
        prompt_words: Vec<usize>,
        /// Fraction of requests that begin with one long shared system prompt (0..1).
        #[arg(long, default_value_t = 0.0)]
        shared_prefix: f64,
        /// Fraction of requests that hang up after their first tokens (0..1).
        #[arg(long, default_value_t = 0.0)]
        cancel: f64,
        /// Stop issuing new requests after this many seconds (0: no bound).
        #[arg(long, default_value_t = 0.0)]
        duration_s: f64,
        /// Each client's requests are conversations of this many turns (each turn resends the
        /// history with the replies), reported with the share of prompt tokens served from the
        /// prefix cache.
        #[arg(long, default_value_t = 1)]
        turns: usize,
        /// Send the conversation id (`conv-N`) in this request header, for a load balancer's
        /// consistent hash (docs/DEPLOY.md), e.g. x-memra-cache-key.
        #[arg(long)]
        affinity_header: Option<String>,
        /// Retry a request answered 429/503 after its Retry-After (at most 10 s), this many
        /// times.
        #[arg(long, default_value_t = 0)]
        retries: usize,
        /// Soak for this many minutes instead: clients cycle streaming and whole chat and
        /// completion requests (`--cancel`: the share of streams that hang up) while the
        /// server's RSS, open fds and KV blocks are sampled; ends with a flat/growing verdict.
        #[arg(long, value_name = "MINUTES")]
        soak: Option<f64>,
        /// Soak: the server's pid (default: the process listening on the port of --addr).
        #[arg(long)]
        pid: Option<u32>,
        /// Soak: seconds between samples.
        #[arg(long, default_value_t = 10.0)]
        sample_s: f64,
        /// Soak: samples before this many seconds are left out of the trends (default: a
        /// sixth of the soak, at most 300).
        #[arg(long)]
        warmup_s: Option<f64>,
        /// Soak: write the samples here (JSONL, one per line).
        #[arg(long)]
        samples: Option<PathBuf>,
        /// Soak: write the summary here (JSON).
        #[arg(long)]
        summary: Option<PathBuf>,
        /// Soak: plot RSS, fds and KV blocks in use against time here (SVG).
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Convert a GGUF file to an HF folder (config.json, model.safetensors, tokenizer files),
    /// or with `--to gguf` an HF folder to a GGUF file.
    Convert {
        input: PathBuf,
        out: PathBuf,
        /// hf (GGUF file -> HF folder) or gguf (HF folder -> GGUF file).
        #[arg(long, default_value = "hf")]
        to: String,
        /// --to gguf: copy the tokenizer metadata from this GGUF.
        #[arg(long)]
        tokenizer_from: Option<PathBuf>,
        /// f32, f16 or bf16 for every tensor (default: keep float tensors, quantized -> f32); fp8
        /// or nvfp4: an HF fp8 (128 x 128 blocks) / ModelOpt NVFP4 checkpoint of the matrices.
        #[arg(long)]
        dtype: Option<String>,
        /// Shard size limit in bytes.
        #[arg(long, default_value_t = 5_000_000_000)]
        shard_bytes: u64,
        #[arg(long)]
        quiet: bool,
    },
}

/// The flags of `vision`.
#[derive(Args)]
struct VisionFlags {
    /// The text model (a gemma3 GGUF of the tower's output width).
    model: PathBuf,
    /// The vision tower (mmproj GGUF; Gemma 3's).
    #[arg(long)]
    mmproj: PathBuf,
    /// auto, cpu, cuda or cuda:N (the engine and the tower).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Timed encodes (vision_encode).
    #[arg(long, default_value_t = 16)]
    images: usize,
    /// Timed one-image requests (vision_ttft).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Write the images here as PNG (img-000.png the warm-up, then the timed ones).
    #[arg(long)]
    images_dir: Option<PathBuf>,
    /// The text model's shape label for the rows (gemma3-270m).
    #[arg(long)]
    shape: Option<String>,
    /// Its weight type label (Q4_K_M).
    #[arg(long)]
    dtype: Option<String>,
    /// Run id shared with the peer's rows (default: time and pid).
    #[arg(long)]
    run: Option<String>,
    /// Append the rows to this JSONL file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No table, the rows as JSON lines.
    #[arg(long)]
    json: bool,
    /// Accepted for the lease queue (lib.sh's `mb`); nothing is drawn either way.
    #[arg(long)]
    quiet: bool,
}

/// The flags of `peer mtmd`.
#[derive(Args)]
struct PeerMtmdFlags {
    /// llama-mtmd-cli logs (stdout and stderr), one per image, in run order (the first is the
    /// warm-up, dropped when there are more).
    #[arg(required = true)]
    logs: Vec<PathBuf>,
    /// The text GGUF llama.cpp ran (the same file as memra's rows).
    #[arg(long)]
    model: PathBuf,
    /// The mmproj it ran (named in the rows' source).
    #[arg(long)]
    mmproj: PathBuf,
    /// The CUDA device (for the rows' device fields).
    #[arg(long, default_value = "cuda:0")]
    device: String,
    #[arg(long)]
    shape: Option<String>,
    #[arg(long)]
    dtype: Option<String>,
    /// The peer's version in the rows.
    #[arg(long = "version", default_value = memra_bench::peer_import::DEFAULT_VERSION)]
    peer_version: String,
    /// The run id of memra's rows of this comparison.
    #[arg(long)]
    run: String,
    /// Append the rows to this JSONL file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `ttft|prefill|decode --server`: the server's rows.
/// `memra-bench peer ...`.
#[derive(Subcommand)]
enum PeerCmd {
    /// Download the llama-cpp-python 0.3.36 sdist with pip (network needed), trim its vendored
    /// llama.cpp and pack it for the GPU machine.
    Fetch {
        /// The tarball written.
        #[arg(long, default_value = memra_bench::peer_build::DEFAULT_TARBALL)]
        out: PathBuf,
    },
    /// Build llama-bench and llama-server with CUDA into DIR/build/bin (once: an existing
    /// build is kept); prints that folder.
    Build {
        /// An existing llama.cpp source tree (default: DIR if it holds one, else --tarball).
        #[arg(long, conflicts_with = "tarball")]
        src: Option<PathBuf>,
        /// A tarball from `peer fetch`, unpacked into DIR (default: .stage/llama.tgz when DIR
        /// holds no source).
        #[arg(long)]
        tarball: Option<PathBuf>,
        /// CMAKE_CUDA_ARCHITECTURES (default: from nvidia-smi's compute capability, 9.0 -> 90a).
        #[arg(long)]
        arch: Option<String>,
        /// Where the source and build/ go (default: $HOME/llama.cpp).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Compile jobs (default: the cores less two).
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// Run llama-bench (-ngl 99 -fa 1) on MODEL at the same prompt sizes and record its rows
    /// under the same --run as memra's.
    #[command(name = "llama.cpp")]
    LlamaCpp(PeerBenchFlags),
    /// Turn llama-bench JSON lines saved by hand (`llama-bench ... -o jsonl > F.jsonl`) into the
    /// rows `peer llama.cpp` records, appended to --out under memra's --run. What the lines do
    /// not say comes from the flags, else from memra's rows of the same run in --out (model
    /// file, sha256, size, shape, dtype, driver, SMs, commit). All or nothing.
    Import(PeerImportFlags),
    /// llama-mtmd-cli logs (tools/device/mtmd_bench.sh: one run per image file memra's
    /// `vision --images-dir` wrote, `-n 1`) into `vision_encode` and `vision_ttft` rows under
    /// memra's --run.
    Mtmd(PeerMtmdFlags),
}

/// The flags of `peer import`.
#[derive(Args)]
struct PeerImportFlags {
    /// llama-bench `-o jsonl` output files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The run id of memra's rows of this comparison.
    #[arg(long)]
    run: String,
    /// The rows file to append to (reports/data/NAME.jsonl).
    #[arg(long)]
    out: PathBuf,
    /// The GGUF llama-bench measured, when it is here (name, size and sha256 read from it).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The model's file name in the rows (default: --model's, else llama-bench's model_filename).
    #[arg(long)]
    model_file: Option<String>,
    /// The GGUF's sha256 prefix (12 hex digits) when the file is not here.
    #[arg(long, conflicts_with = "model")]
    model_sha256: Option<String>,
    /// The GGUF's size in bytes when the file is not here.
    #[arg(long, conflicts_with = "model")]
    model_bytes: Option<u64>,
    /// The model's shape label (llama3-8b).
    #[arg(long)]
    shape: Option<String>,
    /// The weight type label (Q4_K_M).
    #[arg(long)]
    dtype: Option<String>,
    /// The KV type every line must show (type_k); the rows' kv_dtype where a line has none.
    #[arg(long)]
    kv_dtype: Option<String>,
    /// The device name where a line has no gpu_info.
    #[arg(long)]
    device_name: Option<String>,
    /// The NVIDIA driver version.
    #[arg(long)]
    driver: Option<String>,
    /// The GPU's streaming multiprocessors.
    #[arg(long)]
    sms: Option<u32>,
    /// memra's commit.
    #[arg(long)]
    commit: Option<String>,
    /// The time of rows whose line has no test_time (RFC 3339 UTC).
    #[arg(long)]
    time: Option<String>,
    /// The peer's version in the rows.
    #[arg(long = "version", default_value = memra_bench::peer_import::DEFAULT_VERSION)]
    peer_version: String,
    /// The rows' source remark [default: "llama-bench -ngl 99 -fa 1 JSON, same lease as
    /// memra", and then every line must show -ngl 99 and flash attention on].
    #[arg(long)]
    source: Option<String>,
    /// Replace the rows of --out that measure the same tests instead of refusing them.
    #[arg(long)]
    replace: bool,
    /// Print the rows, write nothing.
    #[arg(long)]
    dry_run: bool,
}

/// The flags of `peer llama.cpp`.
#[derive(Args)]
struct PeerBenchFlags {
    /// The GGUF file (the same one memra measured).
    model: PathBuf,
    /// The folder holding llama-bench (default: $HOME/llama.cpp/build/bin, from `peer build`).
    #[arg(long)]
    llama_bin: Option<PathBuf>,
    /// The CUDA device the peer uses (for the device fields of the rows).
    #[arg(long, default_value = "cuda:0")]
    device: String,
    #[arg(long, value_delimiter = ',', default_value = "512")]
    prompt: Vec<usize>,
    #[arg(long = "gen", default_value_t = 128)]
    gen_tokens: usize,
    /// Context depths (llama-bench -d).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    depth: Vec<usize>,
    /// Repetitions (llama-bench -r).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// The KV cache type for llama-bench (`-ctk T -ctv T`): f16 (llama.cpp's default), bf16,
    /// q8_0 or f32, as memra's `--kv-dtype` of the rows it is compared with.
    #[arg(long)]
    kv_dtype: Option<memra_engine::engine::KvDtype>,
    /// Where the peer's source came from, named in the rows' version.
    #[arg(long, default_value = "llama-cpp-python 0.3.36 (vendored llama.cpp)")]
    peer_source: String,
    #[arg(long)]
    shape: Option<String>,
    #[arg(long)]
    dtype: Option<String>,
    /// The run id of memra's rows of this comparison.
    #[arg(long)]
    run: String,
    /// Append the rows to this JSONL file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `peer fetch | build | llama.cpp`.
fn peer(cmd: PeerCmd) -> Result<()> {
    use memra_bench::peer_build as pb;
    let home = memra_engine::settings::home();
    match cmd {
        PeerCmd::Fetch { out } => {
            let bytes = pb::fetch(&out)?;
            eprintln!("wrote {} ({:.1} MB)", out.display(), bytes as f64 / 1e6);
            Ok(())
        }
        PeerCmd::Build {
            src,
            tarball,
            arch,
            dir,
            jobs,
        } => {
            let dir = match dir {
                Some(d) => d,
                None => pb::default_dir(home.as_deref())?,
            };
            let args = pb::BuildArgs {
                dir,
                src,
                tarball,
                arch,
                jobs,
            };
            let (bin, cached) = pb::build(&args)?;
            if cached {
                eprintln!("llama-bench already built (cached): {}", bin.display());
            }
            println!("{}", bin.display());
            Ok(())
        }
        PeerCmd::LlamaCpp(f) => {
            let bin = match &f.llama_bin {
                Some(b) => pb::resolve_llama_bin(Some(b), Path::new(""))?,
                None => pb::resolve_llama_bin(None, &pb::default_dir(home.as_deref())?)?,
            };
            let (device, _) = memra_bench::speed::device_ref(&f.device)?;
            let p = memra_bench::peer::PeerRun {
                run: f.run,
                time: memra_bench::record::now(),
                device,
                commit: memra_bench::record::commit(),
                model: memra_bench::record::model_ref(&f.model)?,
                shape: f.shape,
                dtype: f.dtype,
                kv_dtype: None,
                version: f.peer_source,
                source: memra_bench::peer::LLAMA_BENCH_SOURCE.into(),
            };
            let kv = f.kv_dtype.map(|k| k.to_string());
            let plan = memra_bench::peer::BenchPlan {
                prompt: &f.prompt,
                gen_tokens: f.gen_tokens,
                depth: &f.depth,
                reps: f.reps,
                kv: kv.as_deref(),
            };
            let text = memra_bench::peer::llama_bench(&bin, &f.model, &plan)?;
            let rows = memra_bench::peer::rows_from_jsonl(&text, &p)?;
            for r in &rows {
                println!("{}", serde_json::to_string(r).unwrap_or_default());
            }
            if let Some(o) = f.out {
                memra_bench::record::append(&o, &rows)?;
            }
            Ok(())
        }
        PeerCmd::Mtmd(f) => {
            use memra_bench::peer_mtmd as pm;
            let mut logs = Vec::with_capacity(f.logs.len());
            for p in &f.logs {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| Error::Input(format!("{}: {e}", p.display())))?;
                logs.push((p.display().to_string(), pm::parse(&text)));
            }
            let run = pm::MtmdRun {
                run: f.run,
                device: memra_bench::serve_ttft::device_of(&f.device),
                commit: memra_bench::record::commit(),
                model: memra_bench::record::model_ref(&f.model)?,
                shape: f.shape,
                dtype: f.dtype,
                version: f.peer_version,
                mmproj: f
                    .mmproj
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            };
            let rows = pm::rows(&logs, &run)?;
            print_vision(&rows);
            if let Some(o) = f.out {
                memra_bench::record::append(&o, &rows)?;
            }
            Ok(())
        }
        PeerCmd::Import(f) => {
            let a = memra_bench::peer_import::ImportArgs {
                model: f.model,
                model_file: f.model_file,
                model_sha256: f.model_sha256,
                model_bytes: f.model_bytes,
                shape: f.shape,
                dtype: f.dtype,
                kv_dtype: f.kv_dtype,
                device_name: f.device_name,
                driver: f.driver,
                sms: f.sms,
                commit: f.commit,
                time: f.time,
                version: f.peer_version,
                source: f.source,
                replace: f.replace,
                dry_run: f.dry_run,
                ..memra_bench::peer_import::ImportArgs::new(f.files, &f.run, &f.out)
            };
            let r = memra_bench::peer_import::import(&a)?;
            for n in &r.notes {
                eprintln!("note: {n}");
            }
            for row in &r.rows {
                println!("{}", serde_json::to_string(row).unwrap_or_default());
            }
            let verb = if a.dry_run { "would write" } else { "wrote" };
            eprintln!(
                "{verb} {} rows to {} ({} replaced)",
                r.rows.len(),
                a.out.display(),
                r.replaced
            );
            Ok(())
        }
    }
}

fn server_speed(
    kind: memra_bench::speed::Kind,
    addr: String,
    f: &SpeedFlags,
) -> Result<Vec<memra_bench::record::Row>> {
    use memra_bench::serve_ttft::{Speed, run, run_speed};
    use memra_bench::speed::Kind;
    let m = memra_engine::loader::load_model(&f.model)?;
    let vocab = m.config.vocab;
    drop(m);
    let prompts: Vec<(usize, Vec<u32>)> = f
        .prompt
        .iter()
        .map(|&p| (p, memra_bench::speed::prompt_ids(p, vocab)))
        .collect();
    let a = memra_bench::serve_ttft::ServerTtft {
        addr,
        model: f.served_model.clone(),
        api_key: f.api_key.clone(),
        engine: f.engine.clone(),
        version: f.engine_version.clone(),
        device: memra_bench::serve_ttft::device_of(&f.device),
        run: f
            .run
            .clone()
            .unwrap_or_else(memra_bench::record::new_run_id),
        runs: f.runs,
        shape: f.shape.clone(),
        dtype: f.dtype.clone(),
    };
    let mref = memra_bench::record::model_ref(&f.model)?;
    match kind {
        Kind::Ttft => run(&a, &mref, &prompts, (f.turn, vocab)),
        Kind::Prefill => run_speed(&a, &mref, &prompts, Speed::Prefill),
        Kind::Decode => run_speed(&a, &mref, &prompts, Speed::Decode(f.gen_tokens)),
    }
}

fn speed(kind: memra_bench::speed::Kind, f: SpeedFlags) -> Result<()> {
    if let Some(addr) = f.server.clone() {
        if !f.depth.is_empty() || f.schema.is_some() || !f.prefill.is_empty() {
            return Err(Error::Input(
                "--depth, --schema and --prefill are not supported with --server".into(),
            ));
        }
        if f.turn > 0 && kind != memra_bench::speed::Kind::Ttft {
            return Err(Error::Input("--turn applies to ttft only".into()));
        }
        let rows = server_speed(kind, addr, &f)?;
        return print_rows(&f, &rows);
    }
    let args = memra_bench::speed::SpeedArgs {
        kind,
        device: f.device.parse()?,
        prompts: f.prompt.clone(),
        depths: f.depth.clone(),
        prefill_prompts: f.prefill.clone(),
        turn: f.turn,
        gen_tokens: f.gen_tokens,
        runs: f.runs,
        run: f
            .run
            .clone()
            .unwrap_or_else(memra_bench::record::new_run_id),
        progress: !f.quiet && !f.json,
        shape: f.shape.clone(),
        dtype: f.dtype.clone(),
        kv_dtype: f.kv_dtype,
        schema: f.schema.clone(),
    };
    let rows = memra_bench::speed::run(&f.model, &args)?;
    print_rows(&f, &rows)
}

/// Prints (table or JSON lines) and appends the rows; an invalid row is an error.
fn print_rows(f: &SpeedFlags, rows: &[memra_bench::record::Row]) -> Result<()> {
    for r in rows {
        if f.json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            let v = r
                .value
                .map_or("invalid".into(), memra_bench::report::fmt_value);
            let range = match (r.min, r.max) {
                (Some(a), Some(b)) => format!(
                    " ({}-{})",
                    memra_bench::report::fmt_value(a),
                    memra_bench::report::fmt_value(b)
                ),
                _ => String::new(),
            };
            println!(
                "{} prompt {}{}: {v}{range} {} over {} runs{}{}",
                r.workload.name(),
                r.prompt.unwrap_or(0),
                match r.depth {
                    Some(d) if d > 0 => format!(" depth {d}"),
                    _ => String::new(),
                },
                r.unit,
                r.runs,
                match (&r.constraint, &r.schema) {
                    (Some(c), s) => format!(
                        " ({c} {}, {} tokens)",
                        s.as_deref().unwrap_or(""),
                        r.generated.unwrap_or(0)
                    ),
                    _ => String::new(),
                },
                if r.valid {
                    ""
                } else {
                    " (INVALID: tokens differ from the reference run)"
                }
            );
        }
    }
    if let Some(p) = &f.out {
        memra_bench::record::append(p, rows)?;
    }
    if rows.iter().any(|r| !r.valid) {
        return Err(Error::Input(
            "a timed run's tokens differed from the reference run".into(),
        ));
    }
    Ok(())
}

/// One line per vision row: workload, value, range, unit.
fn print_vision(rows: &[memra_bench::record::Row]) {
    use memra_bench::report::fmt_value;
    for r in rows {
        println!(
            "{} {}: {} ({}-{}) {} over {} runs",
            r.engine,
            r.workload.name(),
            r.value.map_or("invalid".into(), fmt_value),
            r.min.map_or("?".into(), fmt_value),
            r.max.map_or("?".into(), fmt_value),
            r.unit,
            r.runs
        );
    }
}

fn vision(f: VisionFlags) -> Result<()> {
    let _ = f.quiet;
    let a = memra_bench::vision::VisionArgs {
        model: f.model,
        mmproj: f.mmproj,
        device: f.device.parse()?,
        images: f.images,
        runs: f.runs,
        run: f.run.unwrap_or_else(memra_bench::record::new_run_id),
        shape: f.shape,
        dtype: f.dtype,
        images_dir: f.images_dir,
    };
    let rows = memra_bench::vision::run(&a)?;
    if f.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
    } else {
        print_vision(&rows);
    }
    if let Some(o) = f.out {
        memra_bench::record::append(&o, &rows)?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    use memra_bench::speed::Kind;
    match cli.cmd {
        Cmd::Decode(f) => speed(Kind::Decode, f),
        Cmd::Prefill(f) => speed(Kind::Prefill, f),
        Cmd::Ttft(f) => speed(Kind::Ttft, f),
        Cmd::Vision(f) => vision(f),
        Cmd::Peer { cmd } => peer(cmd),
        Cmd::Flags { out } => {
            let md = memra_bench::flags::markdown();
            match out {
                Some(p) => std::fs::write(&p, md)
                    .map_err(|e| Error::Input(format!("writing {}: {e}", p.display())))?,
                None => print!("{md}"),
            }
            Ok(())
        }
        Cmd::Report { data, out, readme } => {
            let args = memra_bench::report::ReportArgs {
                data,
                out,
                readme: (readme != "none").then(|| PathBuf::from(readme)),
            };
            for p in memra_bench::report::run(&args)? {
                eprintln!("wrote {}", p.display());
            }
            Ok(())
        }
        Cmd::SynthMmproj {
            shape,
            text_hidden,
            seed,
            dtype,
            out,
        } => {
            let a = memra_bench::synth_mmproj::SynthMmproj {
                shape,
                text_hidden,
                seed,
                dtype,
                out,
            };
            let what = memra_bench::synth_mmproj::synth_mmproj(&a)?;
            eprintln!("wrote {} ({what})", a.out.display());
            Ok(())
        }
        Cmd::Synth {
            shape,
            dtype,
            seed,
            out,
            format,
            layers,
            tokenizer_from,
            vocab,
            threads,
            shard_bytes,
            models_dir,
            llamacpp_rope,
            exact_kquants,
            ctx,
            mtp,
            mtp_oracle,
            sliding_window,
            quiet,
        } => {
            let home = memra_engine::settings::home();
            let tokenizer = match tokenizer_from.as_deref() {
                Some("none") => TokenizerSource::None { vocab },
                Some(p) => TokenizerSource::Gguf(PathBuf::from(p)),
                None => TokenizerSource::Gguf(default_tokenizer_path(
                    models_dir.as_deref(),
                    home.as_deref(),
                )),
            };
            let args = SynthArgs {
                shape: shape.parse::<Shape>()?,
                dtype: dtype.parse::<SynthDType>()?,
                seed,
                out,
                format: format.parse::<Format>()?,
                layers,
                tokenizer,
                threads,
                shard_bytes,
                progress: !quiet,
                llamacpp_rope,
                exact_kquants,
                ctx,
                mtp,
                mtp_oracle,
                sliding_window,
            };
            synth(&args).map(|_| ())
        }
        Cmd::Concurrency {
            model,
            device,
            levels,
            prompt_len,
            gen_tokens,
            max_batch_tokens,
            json,
        } => {
            let args = memra_bench::concurrency::ConcurrencyArgs {
                device: device.parse()?,
                levels,
                prompt_len,
                gen_tokens,
                max_batch_tokens,
            };
            let res = memra_bench::concurrency::run(&model, &args)?;
            for r in res {
                if json {
                    println!("{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    println!(
                        "concurrency {:>3}: {:>6} tokens in {:>7.2} s = {:>8.1} tok/s aggregate, decode {:>8.1} tok/s, mean TTFT {:.3} s",
                        r.concurrency,
                        r.generated_tokens,
                        r.wall_s,
                        r.aggregate_tok_s,
                        r.decode_tok_s,
                        r.mean_ttft_s
                    );
                }
            }
            Ok(())
        }
        Cmd::KernelCache { arch, out } => {
            let out = out.unwrap_or_else(memra_kernels::default_cache_dir);
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let t0 = std::time::Instant::now();
            let written = memra_bench::kernel_cache::write_all(&arch, &out, threads)?;
            for w in &written {
                println!("{:>10} bytes {:>6.1} s  {}", w.bytes, w.secs, w.file);
            }
            let bytes: u64 = written.iter().map(|w| w.bytes).sum();
            println!(
                "{} cubins for {arch}, {:.1} MB, in {:.1} s -> {}",
                written.len(),
                bytes as f64 / 1e6,
                t0.elapsed().as_secs_f64(),
                out.display()
            );
            Ok(())
        }
        Cmd::Kernels {
            device,
            dtypes,
            shapes,
            m,
            launches,
            reps,
            json,
        } => {
            let list = |s: &str| -> Vec<String> {
                s.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            };
            let dtypes = list(&dtypes)
                .iter()
                .map(|d| d.parse::<DType>())
                .collect::<Result<Vec<_>>>()?;
            let shapes = list(&shapes)
                .iter()
                .map(|s| {
                    let bad = || Error::Input(format!("--shapes: `{s}` is not NxK"));
                    let (n, k) = s.split_once('x').ok_or_else(bad)?;
                    Ok((n.parse().map_err(|_| bad())?, k.parse().map_err(|_| bad())?))
                })
                .collect::<Result<Vec<(usize, usize)>>>()?;
            let ms = list(&m)
                .iter()
                .map(|x| {
                    x.parse::<usize>()
                        .ok()
                        .filter(|&v| v > 0)
                        .ok_or_else(|| Error::Input(format!("--m: `{x}` is not a row count")))
                })
                .collect::<Result<Vec<_>>>()?;
            let args = memra_bench::kernels::KernelArgs {
                device,
                dtypes,
                shapes,
                ms,
                launches: memra_bench::kernels::parse_launches(&launches)?,
                reps: reps.max(1),
                rotate_bytes: 512 << 20,
            };
            let (rep, table) = memra_bench::kernels::run(&args)?;
            println!("{table}");
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rep).unwrap_or_default())
                    .map_err(|e| Error::Input(format!("{}: {e}", p.display())))?;
            }
            if !rep.mismatches.is_empty() {
                return Err(Error::Input(format!(
                    "bitwise mismatches across M/geometry: {}",
                    rep.mismatches.join("; ")
                )));
            }
            Ok(())
        }
        Cmd::Load {
            addr,
            model,
            clients,
            requests,
            max_tokens,
            api_key,
            out,
            run,
            engine,
            model_file,
            shape,
            dtype,
            device,
            prompt_words,
            shared_prefix,
            cancel,
            duration_s,
            turns,
            affinity_header,
            retries,
            soak,
            pid,
            sample_s,
            warmup_s,
            samples,
            summary,
            plot,
        } => {
            if let Some(minutes) = soak {
                let args = memra_bench::soak::SoakArgs {
                    addr,
                    model,
                    api_key,
                    clients,
                    max_tokens,
                    prompt_words,
                    cancel,
                    minutes,
                    sample_s,
                    warmup_s: warmup_s.unwrap_or((minutes * 10.0).min(300.0)),
                    pid,
                    samples_out: samples,
                    summary_out: summary,
                    plot_out: plot,
                };
                return soak_cmd(&args);
            }
            let args = memra_bench::load::LoadArgs {
                api_key,
                prompt_words,
                shared_prefix,
                cancel,
                duration_s,
                turns,
                affinity_header,
                retries,
                ..memra_bench::load::LoadArgs::plain(addr, model, clients, requests, max_tokens)
            };
            let rep = memra_bench::load::run(&args)?;
            println!("{}", serde_json::to_string(&rep).unwrap_or_default());
            if let Some(o) = out {
                let (device, _) = memra_bench::speed::device_ref(&device)?;
                let model = model_file
                    .as_deref()
                    .map(memra_bench::record::model_ref)
                    .transpose()?;
                let ok = rep.errors + rep.malformed == 0;
                let row = memra_bench::record::Row {
                    version: (engine != "memra").then(|| "llama-server".to_string()),
                    commit: memra_bench::record::commit(),
                    model,
                    shape,
                    dtype,
                    batch: Some(clients as u64),
                    generated: Some(max_tokens as u64),
                    value: ok.then_some(rep.aggregate_tok_s),
                    runs: 1,
                    valid: ok,
                    source: Some(format!(
                        "memra-bench load: {clients} clients x {requests} requests x {max_tokens} tokens, {} errors, {} shed, {} cancelled{}",
                        rep.errors + rep.malformed,
                        rep.shed,
                        rep.cancelled,
                        rep.ttft_ms
                            .as_ref()
                            .map(|p| format!(", TTFT p50/p99 {:.0}/{:.0} ms", p.p50, p.p99))
                            .unwrap_or_default()
                    )),
                    ..memra_bench::record::Row::new(
                        run.unwrap_or_else(memra_bench::record::new_run_id),
                        device,
                        engine,
                        memra_bench::record::Workload::Load,
                        "tok/s",
                    )
                };
                memra_bench::record::append(&o, &[row])?;
            }
            if rep.errors + rep.malformed > 0 {
                return Err(Error::Input(format!(
                    "{} errors, {} malformed streams (first: {})",
                    rep.errors,
                    rep.malformed,
                    rep.first_error.unwrap_or_default()
                )));
            }
            Ok(())
        }
        Cmd::Spec {
            workload,
            addr,
            addr_off,
            model,
            model_off,
            sampling,
            temperature,
            top_p,
            top_k,
            seed,
            clients,
            repeat,
            max_tokens,
            kinds,
            api_key,
            out,
            table,
            run,
            model_file,
            shape,
            dtype,
            device,
            engine,
        } => {
            use memra_bench::spec as sb;
            let mut items = sb::load_workload(&workload)?;
            if !kinds.is_empty() {
                items.retain(|i| kinds.contains(&i.kind));
            }
            let mut samplings = Vec::new();
            for s in sampling.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                samplings.push(match s {
                    "greedy" => sb::Sampling::greedy(),
                    "sampled" => sb::Sampling::sampled(temperature, top_p, top_k),
                    _ => {
                        return Err(Error::Input(format!(
                            "--sampling `{s}`: expected greedy or sampled"
                        )));
                    }
                });
            }
            let args = sb::SpecArgs {
                items,
                off: sb::Target {
                    addr: addr_off.unwrap_or_else(|| addr.clone()),
                    model: model_off,
                },
                on: sb::Target { addr, model },
                samplings,
                seed,
                clients,
                repeat,
                max_tokens,
                api_key,
            };
            let outcome = sb::run(&args)?;
            let (device, _) = memra_bench::speed::device_ref(&device)?;
            let meta = sb::RowMeta {
                run: run.unwrap_or_else(memra_bench::record::new_run_id),
                engine,
                time: memra_bench::record::now(),
                device,
                commit: memra_bench::record::commit(),
                model: model_file
                    .as_deref()
                    .map(memra_bench::record::model_ref)
                    .transpose()?,
                shape,
                dtype,
            };
            let rows = sb::rows(&args, &outcome, &meta);
            let md = sb::table(&rows);
            print!("{md}");
            if let Some(t) = table {
                std::fs::write(&t, &md)
                    .map_err(|e| Error::Input(format!("{}: {e}", t.display())))?;
            }
            if let Some(o) = out {
                let mut text = String::new();
                for r in &rows {
                    text.push_str(
                        &serde_json::to_string(r).map_err(|e| Error::Input(e.to_string()))?,
                    );
                    text.push('\n');
                }
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&o)
                    .and_then(|mut f| f.write_all(text.as_bytes()))
                    .map_err(|e| Error::Input(format!("{}: {e}", o.display())))?;
            }
            let bad: Vec<&sb::SpecRow> = rows
                .iter()
                .filter(|r| r.kind == "all" && r.mode == "on" && !r.valid)
                .collect();
            if let Some(r) = bad.first() {
                let first_error = outcome
                    .on
                    .iter()
                    .chain(&outcome.off)
                    .find_map(|s| s.error.clone());
                return Err(Error::Input(format!(
                    "{} of {} outputs differ between on and off ({}), {} errors{}",
                    r.compared - r.identical,
                    r.compared,
                    r.differ.join(", "),
                    r.errors,
                    first_error
                        .map(|e| format!(" (first: {e})"))
                        .unwrap_or_default()
                )));
            }
            Ok(())
        }
        Cmd::Convert {
            input,
            out,
            to,
            tokenizer_from,
            dtype,
            shard_bytes,
            quiet,
        } => {
            let r = match to.as_str() {
                "hf" => None,
                "gguf" => {
                    if dtype.is_some() {
                        return Err(Error::Input("--dtype applies to --to hf only".into()));
                    }
                    let a = ToGgufArgs {
                        input: input.clone(),
                        out: out.clone(),
                        tokenizer_from: tokenizer_from.clone(),
                        progress: !quiet,
                    };
                    Some(convert_hf_to_gguf(&a)?)
                }
                other => return Err(Error::Input(format!("unknown --to `{other}` (hf or gguf)"))),
            };
            if let Some(r) = r {
                if !quiet {
                    eprintln!(
                        "converted {} tensors ({:.2} GB) in {:.1} s",
                        r.tensors,
                        r.bytes as f64 / 1e9,
                        r.seconds
                    );
                }
                return Ok(());
            }
            let dtype = dtype
                .map(|d| d.parse::<DType>())
                .transpose()
                .map_err(|e| Error::Input(format!("--dtype: {e}")))?;
            let args = ConvertArgs {
                input,
                out,
                dtype,
                shard_bytes,
                progress: !quiet,
            };
            let r = convert_gguf_to_hf(&args)?;
            if !quiet {
                eprintln!(
                    "converted {} tensors ({:.2} GB) in {:.1} s",
                    r.tensors,
                    r.bytes as f64 / 1e9,
                    r.seconds
                );
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memra-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `load --soak`: runs it, prints the summary (JSON, then the markdown table) and fails on
/// request errors or a growing trend.
fn soak_cmd(args: &memra_bench::soak::SoakArgs) -> Result<()> {
    let s = memra_bench::soak::run(args)?;
    println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
    println!("{}", memra_bench::soak::markdown(&s));
    if s.outcomes.errors > 0 {
        return Err(Error::Input(format!(
            "{} request errors (first: {})",
            s.outcomes.errors,
            s.outcomes.first_error.clone().unwrap_or_default()
        )));
    }
    if s.verdict == memra_bench::soak::trend::Verdict::Growing {
        return Err(Error::Input(
            "a sampled quantity grows (see the trends)".into(),
        ));
    }
    Ok(())
}
