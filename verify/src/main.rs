//! `memra-verify`: run an exactness gate; prints a table and `ALL GREEN`, or exits non-zero.
//!
//! - `memra-verify kernels [--device cuda:N] [--seed S]`
//! - `memra-verify invariance [--device D] (MODEL | --tiny ARCH) [--max-m 64] [--prompt-len 40]`
//! - `memra-verify tokens [--device D] MODEL --fixture verify/fixtures/smollm2-135m-reference.json`
//! - `memra-verify serve-invariance MODEL [--device D] [--requests N] [--max-tokens T]`
//! - `memra-verify pp [--device D] (MODEL | --tiny ARCH) [--pp 2] [--devices D0,D1] [--splits 1;2]`:
//!   the model split over pipeline stages vs unsplit (invariance, graph and serve-invariance
//!   take `--pp N [--devices ...] [--pp-split L]` too)
//! - `memra-verify graph [--device cuda:N] (MODEL | --tiny ARCH) [--max-m 64] [--gen-tokens 24]`
//! - `memra-verify spec [--device D] (MODEL | --tiny ARCH[+mtp|+mtp-oracle]) [--max-tokens 32] [--k-max 8]
//!   [--drafters ngram,mtp,self,random,auto,pick]`
//! - `memra-verify vision [MODEL] [--device D] [--mmproj FILE] [--reference numpy|f64|both|none] [--images 4] [--prompts 8] [--tolerance 1e-4] [--cuda-tolerance 2e-3]`
//! - `memra-verify peer-vision MODEL --mmproj FILE --peer OUT.json [--device D] [--tolerance 2e-3]`:
//!   image embeddings and greedy image prompts vs llama.cpp mtmd (tools/peer/mtmd.py)
//! - `memra-verify golden [--device D] (MODEL | --tiny ARCH) [--dir verify/golden]
//!   [--record --reason TEXT]`: plain decoding's logits bytes vs those recorded for the device class
//! - `memra-verify all [--device D] MODEL [--fixture FILE]`: every gate for the device, then a
//!   summary table
//! - `memra-verify inspect MODEL [--scan]`: the file validated as the engine loads it; exit 0
//!   valid, 2 invalid

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use memra_engine::backend::cpu::{CpuBackend, CpuOps, CpuOptions};
use memra_engine::backend::cuda::{CudaBackend, CudaOptions};
use memra_engine::backend::{Backend, Device, KvDtype, OpenOptions};
use memra_engine::config::Arch;
use memra_engine::models::random::{oracle_mtp_weights, random_weights, tiny_config};
use memra_engine::models::{ModelWeights, mtp};
use memra_engine::pipeline::{self, PpConfig};
use memra_engine::quant::DType;
use memra_engine::spec::Drafter;
use memra_engine::spec::draft_model::DraftModelDrafter;
use memra_engine::spec::mtp::MtpDrafter;
use memra_engine::spec::ngram::NgramDrafter;
use memra_engine::{Error, Result};
use memra_verify::{
    case, golden, graph, invariance, kernels, mtp_check, peer_logits, peer_vision, pp,
    serve_invariance, spec, tokens,
};

#[derive(Parser)]
#[command(name = "memra-verify", about = "memra exactness gates")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The KV cache's element format for every backend a gate opens: f16 (default), bf16, q8_0 or f32.
    #[arg(long, global = true, env = "MEMRA_KV_DTYPE", default_value = "f16")]
    kv_dtype: KvDtype,
}

/// The KV format of this run (`--kv-dtype`).
static KV_DTYPE: std::sync::OnceLock<KvDtype> = std::sync::OnceLock::new();

fn kv_dtype() -> KvDtype {
    KV_DTYPE.get().copied().unwrap_or_default()
}

/// A backend for a gate: `blocks` KV blocks of `bs` positions in this run's KV format.
fn open_backend(
    device: Device,
    w: ModelWeights,
    blocks: usize,
    bs: usize,
    threads: usize,
) -> Result<Box<dyn Backend>> {
    memra_engine::backend::open_backend(device, w, (blocks, bs, kv_dtype()), threads)
}

/// The pipeline split a gate runs on (`--pp 2`: two stages; see `memra-verify pp`).
#[derive(clap::Args, Clone, Debug, Default)]
struct PpArgs {
    /// Pipeline stages (1: unsplit).
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// One device per stage, comma-separated (`cpu,cpu`, `cuda:0,cuda:0`, `cuda:0,cuda:1`);
    /// default: every stage on --device.
    #[arg(long)]
    devices: Option<String>,
    /// The first layer of each stage after the first (default: the memory plan's split).
    #[arg(long)]
    pp_split: Option<String>,
    /// Micro-batches per step (1: off).
    #[arg(long, default_value_t = 2)]
    pp_micro: usize,
    /// The hand-over between stages on two GPUs: auto, nccl or peer.
    #[arg(long, default_value = "auto")]
    pp_link: String,
}

impl PpArgs {
    fn config(&self) -> Result<PpConfig> {
        PpConfig::from_flags(self.pp, self.devices.as_deref(), self.pp_split.as_deref())?
            .with_micro_link(Some(self.pp_micro), Some(&self.pp_link))
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Every CUDA kernel against the CPU reference on random inputs.
    Kernels {
        #[arg(long, default_value = "cuda:0")]
        device: Device,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only these case groups (comma-separated: matmul, embed, norm, rope, elementwise,
        /// argmax, select, attention, kv_write, products, product_geom, moe, glu, delta); all by
        /// default.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Every attention launch on the CUDA-core split kernel (`attn_split`), also the shapes
        /// the tensor-core kernels take by default: checks the split kernel on every shape and
        /// window (run the `attention` group both ways).
        #[arg(long)]
        attn_split: bool,
    },
    /// Logits and KV bytes bitwise equal under any batch composition and prefill chunking.
    Invariance {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL (`ARCH+fp8`,
        /// `ARCH+nvfp4`: matrices in those types).
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "auto")]
        device: Device,
        #[arg(long, default_value_t = 64)]
        max_m: usize,
        #[arg(long, default_value_t = 40)]
        prompt_len: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        pp: PpArgs,
    },
    /// A model split over pipeline stages vs the unsplit model: tokens, logits bits and KV
    /// bytes, at several splits (every layer boundary of a small model), over prefill
    /// chunkings, batches of M = 1..max_m rows and decode steps.
    Pp {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL (4 layers).
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "auto")]
        device: Device,
        /// Stages of each split (at least 2).
        #[arg(long, default_value_t = 2)]
        pp: usize,
        /// One device per stage (default: every stage on --device; `cuda:0,cuda:1` checks
        /// the peer copy between two GPUs).
        #[arg(long)]
        devices: Option<String>,
        /// The splits to check, `;`-separated, each the first layers of stages 1.. (e.g.
        /// `1;2;3`); default: every boundary of a model of up to 8 layers, else five spread
        /// ones, and the memory plan's own.
        #[arg(long)]
        splits: Option<String>,
        /// The micro-batch counts each split runs with, comma-separated (1: none).
        #[arg(long, default_value = "1,2")]
        micro: String,
        /// The hand-over between stages on two GPUs: auto, nccl or peer.
        #[arg(long, default_value = "auto")]
        pp_link: String,
        #[arg(long, default_value_t = 16)]
        max_m: usize,
        #[arg(long, default_value_t = 40)]
        prompt_len: usize,
        #[arg(long, default_value_t = 12)]
        gen_tokens: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// CPU threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
    },
    /// CUDA graph steps bitwise equal to plain steps; device token selection equal to the host's.
    Graph {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL (`ARCH+fp8`,
        /// `ARCH+nvfp4`: matrices in those types).
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "cuda:0")]
        device: Device,
        #[arg(long, default_value_t = 64)]
        max_m: usize,
        #[arg(long, default_value_t = 40)]
        prompt_len: usize,
        /// Tokens per whole-generation check.
        #[arg(long, default_value_t = 24)]
        gen_tokens: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        pp: PpArgs,
    },
    /// Greedy tokens of the fixture prompts vs the fixture.
    Tokens {
        model: PathBuf,
        #[arg(long)]
        fixture: PathBuf,
        #[arg(long, default_value = "auto")]
        device: Device,
    },
    /// memra's logits vs another engine's on the same GGUF (llama.cpp through
    /// tools/peer/logits.py): top-1 agreement and the largest logit difference over the peer's
    /// greedy continuations.
    PeerLogits {
        model: PathBuf,
        /// The peer's JSON (tools/peer/logits.py), its logits file beside it.
        #[arg(long)]
        peer: PathBuf,
        #[arg(long, default_value = "auto")]
        device: Device,
        /// The least share of positions whose top-1 token must agree.
        #[arg(long, default_value_t = 0.99)]
        min_agreement: f64,
        /// The largest absolute logit difference allowed, relative to the largest |logit|.
        #[arg(long, default_value_t = peer_logits::PEER_TOL)]
        tol: f64,
    },
    /// Image input vs llama.cpp's mtmd on the same text model, mmproj and images (the peer's
    /// side from tools/peer/mtmd.py): embeddings per image within a tolerance, greedy image
    /// prompts equal, teacher-forced top-1 agreement.
    PeerVision {
        /// The text model (a gemma3 GGUF; the file the peer ran).
        model: PathBuf,
        /// The mmproj GGUF the peer ran.
        #[arg(long)]
        mmproj: PathBuf,
        /// The peer's JSON (tools/peer/mtmd.py), its binary files beside it.
        #[arg(long)]
        peer: PathBuf,
        /// Where the engine and the tower run (a CUDA device: the CUDA tower, checked against
        /// the CPU tower).
        #[arg(long, default_value = "cpu")]
        device: Device,
        /// Largest max |memra - mtmd| / max |mtmd| of one image's embeddings.
        #[arg(long, default_value_t = peer_vision::EMBED_TOL)]
        tolerance: f32,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The same prompts served alone, together (staggered), and with the prefix cache warm.
    ServeInvariance {
        model: PathBuf,
        #[arg(long, default_value = "auto")]
        device: Device,
        #[arg(long, default_value_t = 8)]
        requests: usize,
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        /// Tokens of a long shared context before the shared prompts (long prompts, and a
        /// prefix-cache hit of that many tokens in the warm phase); 0: none.
        #[arg(long, default_value_t = 0)]
        context: usize,
        /// A vision tower (mmproj GGUF) the model takes rows of: one request in three carries
        /// an image, encoded by the tower on --device.
        #[arg(long)]
        mmproj: Option<PathBuf>,
        #[command(flatten)]
        pp: PpArgs,
    },
    /// Speculative decoding vs plain decoding: tokens, finish reason, logits bytes.
    Spec {
        /// A GGUF file or HF folder (its tokenizer encodes the prompts).
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL (`ARCH+mtp`: with a
        /// random MTP layer; `ARCH+mtp-oracle`: with one wired to draft the model's own picks).
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "auto")]
        device: Device,
        /// Tokens generated per run.
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// Depths checked: K = 1..=k-max.
        #[arg(long, default_value_t = 8)]
        k_max: usize,
        /// Seed of the sampled configuration.
        #[arg(long, default_value_t = 1234)]
        seed: u64,
        /// Comma-separated: ngram, mtp (the model's own MTP layer: a model with one, e.g.
        /// `--tiny llama+mtp`), self (the target as its own draft model), random (a tiny
        /// random model with the target's vocabulary), auto (memra-server's default: the MTP
        /// layer if the model has one, with n-gram lookup, picked per step), pick (self and
        /// n-gram lookup, picked per step), draft:PATH.
        #[arg(long, default_value = "ngram,self,random")]
        drafters: String,
        /// CPU threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Comma-separated: logits (full logits kept and compared bytewise, host sampling),
        /// select (the backend picks the tokens: tokens and finish compared).
        #[arg(long, default_value = "logits,select")]
        paths: String,
    },
    /// Validates a model file or folder (header, every tensor's bounds and shape, config,
    /// tokenizer, chat template) and prints a summary: exit 0 valid, 2 invalid with the reason.
    Inspect {
        /// A GGUF file or HF folder.
        model: PathBuf,
        /// Also decode every tensor and count non-finite values (slow on large files).
        #[arg(long)]
        scan: bool,
    },
    /// Plain greedy decoding's logits (hash of every position's bytes, top values) on fixed
    /// prompts vs those recorded for this device class under --dir.
    Golden {
        /// A GGUF file or HF folder.
        model: Option<PathBuf>,
        /// Use a tiny random model of this architecture instead of MODEL (`ARCH+fp8`,
        /// `ARCH+nvfp4`: matrices in those types).
        #[arg(long, conflicts_with = "model")]
        tiny: Option<String>,
        #[arg(long, default_value = "auto")]
        device: Device,
        #[arg(long, default_value = "verify/golden")]
        dir: PathBuf,
        /// Tokens generated per prompt.
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        /// Record (or re-record) the values instead of checking them.
        #[arg(long, requires = "reason")]
        record: bool,
        /// Why the values are recorded (kept in the file).
        #[arg(long, requires = "record")]
        reason: Option<String>,
    },
    /// Image input: the vision tower vs the numpy reference (on a CUDA device also the CUDA
    /// tower vs the CPU tower, and its bits run to run), greedy tokens with memra's vs the
    /// reference's embeddings, image requests mixed into text load, prefix-cache hits on the
    /// same image (docs/VERIFY.md).
    Vision {
        /// A GGUF file or HF folder: a gemma3 for Gemma 3's tower, a qwen2 or qwen3 for the
        /// Qwen ViT (default: a tiny random one of `--family` with SmolLM2's tokenizer).
        model: Option<PathBuf>,
        /// The tower, an mmproj GGUF (default: a tiny random one of `--family`).
        #[arg(long)]
        mmproj: Option<PathBuf>,
        /// The synthetic tower's family (without --mmproj) and the default text model's:
        /// gemma3 (SigLIP), qwen2vl, qwen25vl (window attention), qwen3vl (deepstack).
        #[arg(long, value_enum, default_value = "gemma3")]
        family: memra_verify::vision::Family,
        /// Where the engine and the tower run (a CUDA device: the CUDA tower, checked against
        /// the CPU tower).
        #[arg(long, default_value = "cpu")]
        device: Device,
        /// Python with numpy and gguf (verify/reference/requirements.txt), for `--reference
        /// numpy|both`.
        #[arg(long, default_value = "python3")]
        python: String,
        /// The float64 references of the tower: numpy (python), f64 (Rust, in this binary: no
        /// python needed), both, or none (a real-size tower: on a CUDA device the CPU tower is
        /// the reference).
        #[arg(long, value_enum, default_value = "numpy")]
        reference: memra_verify::vision::RefChoice,
        #[arg(long, default_value_t = 4)]
        images: usize,
        #[arg(long, default_value_t = 8)]
        prompts: usize,
        #[arg(long, default_value_t = 16)]
        max_tokens: usize,
        /// Largest max |memra - ref| / max |ref| of one image's embeddings.
        #[arg(long, default_value_t = 1e-4)]
        tolerance: f32,
        /// Largest max |cuda - cpu| / max |cpu| of the CUDA tower against the CPU tower (f16
        /// inputs to its products and attention: docs/VERIFY.md "The CUDA tower").
        #[arg(long, default_value_t = memra_verify::vision::CUDA_TOLERANCE)]
        cuda_tolerance: f32,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Every gate that applies to the device, then a summary table.
    All {
        model: PathBuf,
        /// The tokens gate's fixture (skipped without).
        #[arg(long)]
        fixture: Option<PathBuf>,
        #[arg(long, default_value = "auto")]
        device: Device,
        /// The golden gate's folder (skipped when it holds no values for the model and class).
        #[arg(long, default_value = "verify/golden")]
        golden_dir: PathBuf,
    },
}

fn gate_vision(a: &memra_verify::vision::VisionArgs, json: Option<&Path>) -> Result<usize> {
    let r = memra_verify::vision::check(a)?;
    for (what, errs) in [
        ("numpy", &r.rel_errors),
        ("Rust float64", &r.rel_errors_f64),
    ] {
        if errs.is_empty() {
            continue;
        }
        let worst = errs.iter().fold(0f32, |m, &e| m.max(e));
        let mut sizes: Vec<String> = r
            .image_sizes
            .iter()
            .zip(&r.image_tokens)
            .map(|((w, h), t)| format!("{w}x{h} -> {t}"))
            .collect();
        sizes.dedup();
        println!(
            "vision: tower {} (images {} tokens) on {}; {} images vs the {what} reference: \
             largest error {worst:.2e} of the largest value (tolerance {:.0e}); encode {:.1} ms \
             per image (CPU)",
            r.projector,
            sizes.join(", "),
            r.tower,
            errs.len(),
            a.tolerance,
            r.encode_ms_per_image
        );
    }
    if let (Some(same), Some(ms)) = (r.cuda_repeat_equal, r.cuda_encode_ms_per_image) {
        let worst = r.cuda_vs_cpu.iter().fold(0f32, |m, &e| m.max(e));
        println!(
            "vision: CUDA tower on {}: {} images vs the CPU tower: largest error {worst:.2e} of \
             the largest value (tolerance {:.0e}); a second encoding {}; encode {ms:.1} ms per \
             image (CPU {:.1} ms)",
            r.tower,
            r.cuda_vs_cpu.len(),
            a.cuda_tolerance,
            if same { "bit-identical" } else { "DIFFERENT" },
            r.encode_ms_per_image
        );
    }
    if let (Some(all), Some(first)) = (r.cpu_tokens_equal, r.cpu_first_tokens_equal) {
        println!(
            "vision: {:?} vs a CPU engine (informative): greedy tokens equal on {all}/{} image \
             prompts, the first token on {first}/{}",
            a.device, r.prompts, r.prompts
        );
    }
    if let Some(d) = r.f64_vs_numpy {
        println!("vision: the Rust float64 reference vs numpy's: {d:.2e} of the largest value");
    }
    if let Some(t) = &r.text {
        println!(
            "vision: the M-RoPE text model ({}) vs the numpy text reference: positions {} HF's \
             get_rope_index on {} prompts of text and two images; logits {:.2e} of the largest \
             value apart (tolerance {:.0e})",
            a.family.text_arch().gguf_name(),
            if t.positions_equal {
                "equal to"
            } else {
                "DIFFERENT from"
            },
            t.prompts,
            t.rel_error,
            a.tolerance
        );
    }
    if let Some(v) = &r.video {
        println!("{}", v.summary());
    }
    println!(
        "vision: greedy tokens equal on {}/{} image prompts (memra's vs the reference's rows)",
        r.tokens_equal, r.prompts
    );
    println!(
        "vision: serve: {} differences under mixed image + text load; same image again {} \
         prompt tokens from the cache, another image {}, a hit ending inside an image {}",
        r.serve_differences,
        r.cached_tokens_same_image,
        r.cached_tokens_other_image,
        r.cached_tokens_inside_image
    );
    for f in &r.failures {
        println!("FAIL {f}");
    }
    if let Some(p) = json {
        let s = serde_json::to_string_pretty(&r).map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(p, s).map_err(|e| Error::io(p, e))?;
    }
    Ok(r.failures.len())
}

/// The tiny random model of `ARCH`, of `ARCH+mtp` with one random MTP layer (its drafts are
/// mostly rejected, which exercises the rollback), or of `ARCH+mtp-oracle` with one MTP layer
/// wired to draft the model's own picks (`oracle_mtp_weights`: nearly every draft is accepted
/// when the drafter runs it right). `ARCH+fp8` / `ARCH+nvfp4`: matrices in those checkpoint
/// types (memra's row blocks, quant/fp8.rs) instead of Q8_0.
fn tiny(arch: &str) -> Result<ModelWeights> {
    let (arch, wtype) = match (arch.strip_suffix("+fp8"), arch.strip_suffix("+nvfp4")) {
        (Some(a), _) => (a, DType::FP8),
        (_, Some(a)) => (a, DType::NVFP4),
        _ => (arch, DType::Q8_0),
    };
    let (arch, mtp) = match (arch.strip_suffix("+mtp"), arch.strip_suffix("+mtp-oracle")) {
        (Some(a), _) => (a, Some(false)),
        (_, Some(a)) => (a, Some(true)),
        _ => (arch, None),
    };
    let arch = Arch::from_gguf_name(arch)?;
    let cfg = memra_engine::config::ModelConfig {
        mtp_layers: usize::from(mtp.is_some()),
        ..tiny_config(arch, 97)
    };
    cfg.validate()?;
    match mtp {
        Some(true) => oracle_mtp_weights(&cfg, 5),
        _ => random_weights(&cfg, 5, wtype),
    }
}

/// [`tiny`] with `layers` decoder layers (the pp gate splits them).
fn tiny_layers(arch: &str, layers: usize) -> Result<ModelWeights> {
    let w = tiny(arch)?;
    let cfg = memra_engine::config::ModelConfig {
        n_layers: layers,
        ..w.config.clone()
    };
    match cfg.mtp_layers {
        0 => random_weights(&cfg, 5, DType::Q8_0),
        _ => Err(Error::Input("pp: --tiny ARCH without +mtp".into())),
    }
}

fn open_options(kv_blocks: usize, block_size: usize, threads: usize) -> OpenOptions {
    OpenOptions {
        kv_blocks,
        block_size,
        threads,
        graphs: memra_engine::backend::cuda::graphs_default(),
        kv_dtype: kv_dtype(),
        state_slots: memra_engine::backend::DEFAULT_STATE_SLOTS,
    }
}

fn gate_pp(w: &ModelWeights, device: Device, o: &pp::Options) -> Result<usize> {
    let rep = pp::run(w, device, o)?;
    for s in &rep.splits {
        println!("{s}");
    }
    println!(
        "pp on {device:?}: {} runs of {} stages (splits x micro-batches {:?}) vs unsplit, {} \
         checks (greedy at chunkings 1/7/whole, seeded sampling, M = 1..{} over 4 sequences + \
         decode picks, KV bytes), {} failed",
        rep.splits.len(),
        o.stages,
        o.micro,
        rep.checks,
        o.max_m,
        rep.failures.len()
    );
    Ok(print_failures(&rep.failures))
}

/// MODEL or --tiny ARCH, as one gate names them.
fn weights(gate: &str, model: Option<&Path>, t: Option<&str>) -> Result<ModelWeights> {
    match (model, t) {
        (_, Some(a)) => tiny(a),
        (Some(p), None) => memra_engine::loader::load_weights(p),
        (None, None) => Err(Error::Input(format!("{gate}: give MODEL or --tiny ARCH"))),
    }
}

fn cuda_index(gate: &str, device: Device) -> Result<usize> {
    match device {
        Device::Cuda(n) => Ok(n),
        _ => Err(Error::Input(format!(
            "{gate}: --device must be cuda or cuda:N"
        ))),
    }
}

/// Every gate returns its number of failures (0: green).
fn gate_kernels(device: Device, seed: u64, only: &[String], attn_split: bool) -> Result<usize> {
    let n = cuda_index("kernels", device)?;
    if !only.is_empty() {
        println!(
            "kernel groups: {} (of {})",
            only.join(", "),
            kernels::GROUPS.len()
        );
    }
    if attn_split {
        println!("attention: the CUDA-core split kernel for every launch (--attn-split)");
    }
    let cases = kernels::run(n, seed, only, attn_split)?;
    print!("{}", kernels::report(&cases));
    Ok(cases.iter().filter(|c| !c.ok()).count())
}

fn gate_invariance(
    w: ModelWeights,
    device: Device,
    (max_m, prompt_len, seed): (usize, usize, u64),
    pp: &PpConfig,
) -> Result<usize> {
    if prompt_len == 0 || max_m == 0 {
        return Err(Error::Input("--prompt-len and --max-m must be > 0".into()));
    }
    let bs = 16;
    let blocks = invariance::blocks_needed(prompt_len, bs, w.config.arch.is_recurrent());
    let mut b = match pp.is_split() {
        true => pipeline::open(device, w, &open_options(blocks, bs, 0), pp)?,
        false => open_backend(device, w, blocks, bs, 0)?,
    };
    if let Some(s) = b.pipeline() {
        println!("{s}");
    }
    let rep = invariance::run(b.as_mut(), seed, prompt_len, max_m)?;
    println!(
        "invariance on {}: {} checks (prefill chunkings 1/7/64/whole, alone and with random rows; M = 1..{max_m}), {} failed",
        b.name(),
        rep.checks,
        rep.failures.len()
    );
    Ok(print_failures(&rep.failures))
}

/// Prints each failure of a gate; returns their count (the gate's result).
fn print_failures(failures: &[String]) -> usize {
    for f in failures {
        println!("FAIL {f}");
    }
    failures.len()
}

fn gate_graph(
    w: ModelWeights,
    device: Device,
    (max_m, prompt_len, gen_tokens, seed): (usize, usize, usize, u64),
    pp: &PpConfig,
) -> Result<usize> {
    let n = cuda_index("graph", device)?;
    if prompt_len == 0 || max_m == 0 || max_m > 64 {
        return Err(Error::Input(
            "--prompt-len must be > 0 and --max-m 1..64".into(),
        ));
    }
    let bs = 16;
    let opts = CudaOptions {
        device: n,
        kv_blocks: graph::blocks_needed(prompt_len, gen_tokens, bs, w.config.arch.is_recurrent()),
        block_size: bs,
        graphs: true,
        kv_dtype: kv_dtype(),
        state_slots: memra_engine::backend::DEFAULT_STATE_SLOTS,
    };
    let mut b: Box<dyn graph::GraphBackend> = match pp.is_split() {
        true => {
            let o = OpenOptions {
                graphs: true,
                state_slots: opts.state_slots,
                ..open_options(opts.kv_blocks, bs, 0)
            };
            let p = pipeline::open_cuda(device, &w, &o, pp)?;
            println!("{}", p.pipeline().unwrap_or_default());
            Box::new(p)
        }
        false => Box::new(CudaBackend::new(w, &opts)?),
    };
    let graph::GraphReport {
        inv: rep,
        overlapped,
    } = graph::run(b.as_mut(), seed, prompt_len, max_m, gen_tokens)?;
    let (captures, replays) = b.graph_counts();
    println!(
        "graph on {}: {} checks (M = 1..{max_m} graph vs plain logits and KV bits; 5 \
         sampling configs x graphs on/off x device/host selection; lazy vs up-front grammar \
         masks), {captures} captures, {replays} replays, {} failed; masks asked while the \
         forward ran on the device: {} of {} lazy steps",
        b.name(),
        rep.checks,
        rep.failures.len(),
        overlapped.0,
        overlapped.1
    );
    Ok(print_failures(&rep.failures))
}

fn gate_peer_logits(
    model: &Path,
    peer: &Path,
    device: Device,
    (min, tol): (f64, f64),
) -> Result<usize> {
    let weights = memra_engine::loader::load_weights(model)?;
    let mut b = open_backend(device, weights, 64, 16, 0)?;
    let r = peer_logits::run(b.as_mut(), peer)?;
    let rel = r.max_abs as f64 / (r.max_logit as f64).max(1.0);
    println!(
        "peer-logits on {} vs {}: {} positions, top-1 agreement {:.2}% ({} differ), max |logit \
         diff| {:.3e} ({:.3e} of the largest |logit| {:.3})",
        b.name(),
        r.peer,
        r.steps,
        100.0 * r.agreement(),
        r.disagreements.len(),
        r.max_abs,
        rel,
        r.max_logit
    );
    for (c, s, margin) in &r.disagreements {
        println!("  prompt {c} step {s}: top-1 differs (the peer's top-2 margin {margin:.4})");
    }
    Ok(usize::from(r.agreement() < min) + usize::from(rel > tol))
}

fn gate_peer_vision(
    model: &Path,
    mmproj: &Path,
    peer: &Path,
    device: Device,
    tol: f32,
    json: Option<&Path>,
) -> Result<usize> {
    let weights = memra_engine::loader::load_weights(model)?;
    let mut b = open_backend(device, weights, 64, 16, 0)?;
    let r = peer_vision::check(b.as_mut(), model, mmproj, peer, device, tol)?;
    let worst = r.embeds.iter().fold(0f32, |m, d| m.max(d.rel));
    let worst_abs = r.embeds.iter().fold(0f32, |m, d| m.max(d.max_abs));
    println!(
        "peer-vision vs {}: tower {}x{} -> {} rows of {}; {} images: max |memra - mtmd| {:.2e}, \
         {:.2e} of the largest value (tolerance {:.0e})",
        r.peer,
        r.image_size,
        r.image_size,
        r.tokens_per_image,
        r.width,
        r.embeds.len(),
        worst_abs,
        worst,
        r.tolerance
    );
    println!(
        "peer-vision: greedy tokens equal on {}/{} image prompts ({} steps); teacher-forced \
         top-1 agreement {}/{} positions, max |logit diff| {:.3e} (largest |logit| {:.3})",
        r.sequences_equal,
        r.prompts,
        r.steps,
        r.forced_agree,
        r.forced_positions,
        r.max_logit_diff,
        r.max_logit
    );
    for (c, s, margin) in &r.forced_disagreements {
        println!("  prompt {c} step {s}: top-1 differs (llama.cpp's top-2 margin {margin:.4})");
    }
    if let Some(n) = &r.window_note {
        println!("note: {n}");
    }
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&r).map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(p, text).map_err(|e| Error::io(p, e))?;
    }
    Ok(print_failures(&r.failures))
}

fn gate_tokens(model: &Path, fixture: &Path, device: Device) -> Result<usize> {
    let weights = memra_engine::loader::load_weights(model)?;
    let mut b = open_backend(device, weights, 64, 16, 0)?;
    let res = tokens::run(b.as_mut(), fixture)?;
    let mut bad = 0;
    println!("{:<28} {:>7}  result", "prompt", "tokens");
    for r in &res {
        let verdict = match r.divergence {
            None => "identical".to_string(),
            Some((i, want, got, margin)) => {
                let tie = margin < tokens::NEAR_TIE;
                bad += usize::from(!tie);
                format!(
                    "{} at step {i}: expected {want}, got {got} (fixture margin {margin:.4})",
                    if tie {
                        "near-tie divergence"
                    } else {
                        "DIVERGES"
                    }
                )
            }
        };
        println!("{:<28} {:>7}  {verdict}", r.name, r.n_tokens);
    }
    println!("on {}", b.name());
    Ok(bad)
}

fn gate_serve(
    model: &Path,
    device: Device,
    (requests, max_tokens, context): (usize, usize, usize),
    pp: &PpConfig,
    mmproj: Option<PathBuf>,
) -> Result<usize> {
    let opts = serve_invariance::Options {
        device,
        requests,
        max_tokens,
        context,
        kv_dtype: kv_dtype(),
        pp: pp.clone(),
        mmproj,
    };
    let rep = serve_invariance::run(model, &opts)?;
    print!("{}", serve_invariance::summary(&rep));
    Ok(rep.failures.len())
}

/// The spec gate's own arguments.
struct SpecArgs<'a> {
    model: Option<&'a Path>,
    tiny: Option<&'a str>,
    device: Device,
    max_tokens: usize,
    k_max: usize,
    seed: u64,
    drafters: &'a str,
    threads: usize,
    paths: &'a str,
}

fn gate_spec(a: &SpecArgs) -> Result<usize> {
    let (mut logits_path, mut select_path) = (false, false);
    for p in a.paths.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p {
            "logits" => logits_path = true,
            "select" => select_path = true,
            _ => {
                return Err(Error::Input(format!(
                    "spec: path `{p}`: expected logits or select"
                )));
            }
        }
    }
    // The target, its prompts and stop tokens.
    let text_prompts = a.model.is_some() && a.tiny.is_none();
    let (w, prompts, stop_ids) = match (a.model, a.tiny) {
        (_, Some(arch)) => {
            let w = tiny(arch)?;
            let p = spec::synthetic_prompts(w.config.vocab);
            (w, p, vec![7])
        }
        (Some(path), None) => {
            let m = memra_engine::loader::load_model(path)?;
            let p = spec::text_prompts(&m.tokenizer)?;
            (m.weights, p, m.tokenizer.stop_ids().to_vec())
        }
        (None, None) => return Err(Error::Input("spec: give MODEL or --tiny ARCH".into())),
    };
    let vocab = w.config.vocab;
    let ctx = w.config.max_ctx;
    let mut drafters: Vec<Box<dyn Drafter>> = Vec::new();
    for d in a
        .drafters
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        drafters.push(match d {
            "ngram" => Box::new(NgramDrafter::default()),
            "mtp" => Box::new(MtpDrafter::new(&w, a.device, a.threads)?),
            "self" => Box::new(DraftModelDrafter::from_weights(
                w.clone(),
                "self",
                a.device,
                a.threads,
                vocab,
            )?),
            "random" => {
                let dw = random_weights(&tiny_config(Arch::Llama, vocab), 11, DType::Q8_0)?;
                Box::new(DraftModelDrafter::from_weights(
                    dw,
                    "random-tiny",
                    a.device,
                    a.threads,
                    vocab,
                )?)
            }
            // memra-server's default: the MTP layers (if any) and n-gram lookup, picked per step.
            "auto" => {
                let cfg = memra_engine::spec::SpecConfig::auto();
                memra_engine::spec::open_drafter(&cfg, a.device, a.threads, &w, None)?.drafter
            }
            // The target as a draft model and n-gram lookup, picked per step.
            "pick" => Box::new(memra_engine::spec::pick::PickDrafter::new(vec![Box::new(
                DraftModelDrafter::from_weights(w.clone(), "self", a.device, a.threads, vocab)?,
            )])),
            _ => match d.strip_prefix("draft:") {
                Some(p) if !p.is_empty() => Box::new(DraftModelDrafter::open(
                    Path::new(p),
                    a.device,
                    a.threads,
                    vocab,
                )?),
                _ => {
                    return Err(Error::Input(format!(
                        "spec: drafter `{d}`: expected ngram, mtp, self, random, auto, pick or \
                         draft:PATH"
                    )));
                }
            },
        });
    }
    if drafters.is_empty() {
        return Err(Error::Input(format!(
            "spec: --drafters `{}` names no drafter",
            a.drafters
        )));
    }
    let longest = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
    if longest >= ctx {
        return Err(Error::Input(format!(
            "spec: a prompt has {longest} tokens, the model's context is {ctx}"
        )));
    }
    let bs = 16;
    let blocks = (longest + a.max_tokens).min(ctx).div_ceil(bs);
    let opts = spec::Options {
        max_tokens: a.max_tokens,
        k_max: a.k_max,
        seed: a.seed,
        stop_ids,
        logits_path,
        select_path,
    };
    // The MTP drafter on a GPU: its hand-over is also checked against the CPU's.
    let mtp_check = match resolve(a.device) {
        Device::Cuda(n) if drafters.iter().any(|d| d.name() == "mtp") => Some((n, w.clone())),
        _ => None,
    };
    let mut b = open_backend(a.device, w, blocks, bs, a.threads)?;
    let mut rows = spec::run(b.as_mut(), &mut drafters, &prompts, &opts)?;
    if a.tiny.is_some_and(|t| t.ends_with("+mtp-oracle")) {
        spec::require_oracle_acceptance(&mut rows, "mtp", false);
    }
    spec::require_oracle_acceptance(&mut rows, "draft:self", true);
    if text_prompts {
        spec::require_sampled_depth(&mut rows, "ngram");
    }
    print!("{}", spec::report(&rows));
    println!(
        "spec on {}: prompts {} x K = 1..{} x greedy/seeded, {} tokens each, paths: {}",
        b.name(),
        prompts
            .iter()
            .map(|p| format!("{} ({} tokens)", p.name, p.ids.len()))
            .collect::<Vec<_>>()
            .join(", "),
        a.k_max,
        a.max_tokens,
        a.paths
    );
    let mut bad = spec::failures(&rows);
    if let Some((n, w)) = mtp_check {
        drop(drafters);
        bad += gate_mtp_check(&w, n, b.as_mut(), &prompts, (blocks, a.threads))?;
    }
    Ok(bad)
}

/// The MTP drafter's hand-over on CUDA device `n` against the CPU's (verify/src/mtp_check.rs):
/// the target's hidden states as `target` hands them over, the MTP layer as CUDA graphs and
/// plainly. Returns the failed cases.
fn gate_mtp_check(
    w: &ModelWeights,
    n: usize,
    target: &mut dyn Backend,
    prompts: &[spec::Prompt],
    (blocks, threads): (usize, usize),
) -> Result<usize> {
    let bs = target.kv_block_size();
    let mut cpu_target = open_backend(Device::Cpu, w.clone(), blocks, bs, threads)?;
    let cpu_opts = CpuOptions {
        threads,
        kv_blocks: blocks,
        block_size: bs,
        kv_dtype: kv_dtype(),
    };
    let mut cpu_mtp = CpuBackend::build_with(CpuOps::new(&cpu_opts)?, w, mtp::build)?;
    let cuda_opts = CudaOptions {
        device: n,
        kv_blocks: blocks,
        block_size: bs,
        graphs: true,
        kv_dtype: kv_dtype(),
        state_slots: memra_engine::backend::DEFAULT_STATE_SLOTS,
    };
    let mut dev_mtp = CudaBackend::new_with(w, &cuda_opts, mtp::build)?;
    let mut cases = Vec::new();
    for graphs in [true, false] {
        dev_mtp.set_graphs(graphs);
        let mut reference = mtp_check::Side {
            target: cpu_target.as_mut(),
            mtp: &mut cpu_mtp,
        };
        let mut device = mtp_check::Side {
            target: &mut *target,
            mtp: &mut dev_mtp,
        };
        let label = if graphs { "mtp graphs" } else { "mtp plain" };
        cases.extend(mtp_check::run(&mut reference, &mut device, prompts, label)?);
    }
    let (captures, _) = dev_mtp.graph_counts();
    print!("{}", case::report(&cases));
    let bad = cases.iter().filter(|c| !c.ok()).count();
    println!(
        "mtp hand-over on {} vs cpu: {} cases (target hidden states, MTP logits and output \
         states; MTP layer as CUDA graphs ({captures} captured) and plainly), tolerance {:.0e}, \
         {bad} failed",
        Backend::name(target),
        cases.len(),
        mtp_check::MTP_TOL
    );
    Ok(bad)
}

/// The golden gate's own arguments.
struct GoldenArgs<'a> {
    model: Option<&'a Path>,
    tiny: Option<&'a str>,
    device: Device,
    dir: &'a Path,
    max_tokens: usize,
    /// Some(reason): record.
    record: Option<&'a str>,
    /// A missing golden file is a skip, not a failure (`all`).
    optional: bool,
}

fn gate_golden(a: &GoldenArgs) -> Result<usize> {
    if a.max_tokens == 0 {
        return Err(Error::Input("golden: --max-tokens must be > 0".into()));
    }
    if a.record.is_some_and(|r| r.trim().is_empty()) {
        return Err(Error::Input("golden: --reason must say why".into()));
    }
    let (w, prompts, name, id) = match (a.model, a.tiny) {
        (_, Some(arch)) => {
            let w = tiny(arch)?;
            let p = spec::synthetic_prompts(w.config.vocab);
            let name = format!("tiny-{arch}");
            (w, p, name.clone(), name)
        }
        (Some(path), None) => {
            let id = golden::model_id(path)?;
            let m = memra_engine::loader::load_model(path)?;
            let p = spec::text_prompts(&m.tokenizer)?;
            (m.weights, p, path.display().to_string(), id)
        }
        (None, None) => return Err(Error::Input("golden: give MODEL or --tiny ARCH".into())),
    };
    let longest = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
    let bs = 16;
    let blocks = (longest + a.max_tokens).div_ceil(bs);
    let mut b = open_backend(a.device, w, blocks, bs, 0)?;
    let class = golden::device_class(b.as_ref());
    let file = golden::golden_path(a.dir, Path::new(&name), &class);
    if let Some(reason) = a.record {
        let values = golden::generate_all(b.as_mut(), &prompts, a.max_tokens)?;
        let g = golden::Golden {
            model: Path::new(&name)
                .file_name()
                .map_or(name.clone(), |n| n.to_string_lossy().into_owned()),
            model_id: id,
            class,
            profile: b.profile(),
            recorded: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            commit: golden::commit(),
            reason: reason.trim().to_string(),
            max_tokens: a.max_tokens,
            prompts: values,
        };
        golden::write(&file, &g)?;
        println!(
            "golden on {}: recorded {} prompts x {} tokens into {}",
            b.name(),
            g.prompts.len(),
            a.max_tokens,
            file.display()
        );
        return Ok(0);
    }
    if !file.exists() {
        if a.optional {
            println!(
                "golden: skipped, no values for class {class} ({})",
                file.display()
            );
            return Ok(0);
        }
        return Err(Error::Input(format!(
            "golden: no values for class {class}: {} does not exist (record them with --record --reason TEXT)",
            file.display()
        )));
    }
    let want = golden::read(&file)?;
    if want.model_id != id {
        return Err(Error::Input(format!(
            "golden: {} was recorded on another model file (id {}, this one {id})",
            file.display(),
            want.model_id
        )));
    }
    let got = golden::generate_all(b.as_mut(), &prompts, want.max_tokens)?;
    let rows = golden::compare(&want.prompts, &got);
    print!("{}", golden::report(&rows));
    let bad = rows.iter().filter(|r| r.difference.is_some()).count();
    println!(
        "golden on {} (class {class}) vs {} (recorded at commit {}: {}): {bad} differ",
        b.name(),
        file.display(),
        want.commit.as_deref().unwrap_or("?"),
        want.reason
    );
    Ok(bad)
}

/// The device `auto` stands for.
fn resolve(device: Device) -> Device {
    match device {
        Device::Auto if memra_engine::backend::cuda::cuda_available() => Device::Cuda(0),
        Device::Auto => Device::Cpu,
        d => d,
    }
}

fn gate_all(
    model: &Path,
    fixture: Option<&Path>,
    device: Device,
    golden_dir: &Path,
) -> Result<usize> {
    if !model.exists() {
        return Err(Error::Input(format!(
            "all: model {} does not exist",
            model.display()
        )));
    }
    if let Some(f) = fixture.filter(|f| !f.exists()) {
        return Err(Error::Input(format!(
            "all: fixture {} does not exist",
            f.display()
        )));
    }
    // A model that does not load fails here, once, not in every gate.
    memra_engine::loader::load_weights(model)?;
    let device = resolve(device);
    let cuda = matches!(device, Device::Cuda(_));
    let load = || memra_engine::loader::load_weights(model);
    let spec_args = SpecArgs {
        model: Some(model),
        tiny: None,
        device,
        // The CPU keeps `all` to a few minutes on 2 cores: 16 tokens, the logits path only.
        max_tokens: if cuda { 32 } else { 16 },
        k_max: 8,
        seed: 1234,
        drafters: if cuda {
            "ngram,self,random"
        } else {
            "ngram,self"
        },
        threads: 0,
        paths: if cuda { "logits,select" } else { "logits" },
    };
    let golden_args = GoldenArgs {
        model: Some(model),
        tiny: None,
        device,
        dir: golden_dir,
        max_tokens: 16,
        record: None,
        optional: true,
    };
    type Gate<'a> = (&'static str, Box<dyn Fn() -> Result<usize> + 'a>);
    let mut gates: Vec<Gate> = Vec::new();
    if cuda {
        gates.push(("kernels", Box::new(|| gate_kernels(device, 1, &[], false))));
    }
    gates.push((
        "invariance",
        Box::new(|| {
            let sizes = (if cuda { 64 } else { 16 }, 40, 1);
            gate_invariance(load()?, device, sizes, &PpConfig::default())
        }),
    ));
    if cuda {
        gates.push((
            "graph",
            Box::new(|| gate_graph(load()?, device, (64, 40, 24, 1), &PpConfig::default())),
        ));
    }
    gates.push(("spec", Box::new(|| gate_spec(&spec_args))));
    if let Some(f) = fixture {
        gates.push(("tokens", Box::new(move || gate_tokens(model, f, device))));
    }
    gates.push(("golden", Box::new(|| gate_golden(&golden_args))));
    gates.push((
        "serve-invariance",
        Box::new(|| {
            let sizes = (if cuda { 32 } else { 6 }, 12, 0);
            gate_serve(model, device, sizes, &PpConfig::default(), None)
        }),
    ));
    let mut summary = Vec::new();
    for (name, g) in &gates {
        println!("== {name}");
        let t = Instant::now();
        let verdict = match g() {
            Ok(0) => "ALL GREEN".to_string(),
            Ok(n) => format!("FAIL ({n})"),
            Err(e) => {
                println!("error: {e}");
                format!("FAIL (error: {e})")
            }
        };
        println!("{name}: {verdict}\n");
        summary.push((name, verdict, t.elapsed().as_secs_f64()));
    }
    println!("{:<18} {:>9}  result", "gate", "seconds");
    for (name, verdict, secs) in &summary {
        println!("{name:<18} {secs:>9.1}  {verdict}");
    }
    let total: f64 = summary.iter().map(|s| s.2).sum();
    println!("{:<18} {total:>9.1}", "total");
    Ok(summary.iter().filter(|s| s.1 != "ALL GREEN").count())
}

fn run(cli: Cli) -> Result<usize> {
    match cli.cmd {
        Cmd::Kernels {
            device,
            seed,
            only,
            attn_split,
        } => gate_kernels(device, seed, &only, attn_split),
        Cmd::Invariance {
            model,
            tiny: t,
            device,
            max_m,
            prompt_len,
            seed,
            pp,
        } => gate_invariance(
            weights("invariance", model.as_deref(), t.as_deref())?,
            device,
            (max_m, prompt_len, seed),
            &pp.config()?,
        ),
        Cmd::Graph {
            model,
            tiny: t,
            device,
            max_m,
            prompt_len,
            gen_tokens,
            seed,
            pp,
        } => {
            cuda_index("graph", device)?;
            gate_graph(
                weights("graph", model.as_deref(), t.as_deref())?,
                device,
                (max_m, prompt_len, gen_tokens, seed),
                &pp.config()?,
            )
        }
        Cmd::Tokens {
            model,
            fixture,
            device,
        } => gate_tokens(&model, &fixture, device),
        Cmd::Vision {
            model,
            mmproj,
            family,
            device,
            python,
            reference,
            images,
            prompts,
            max_tokens,
            tolerance,
            cuda_tolerance,
            json,
        } => gate_vision(
            &memra_verify::vision::VisionArgs {
                device,
                mmproj,
                family,
                model,
                python,
                reference,
                images: images.max(1),
                prompts,
                max_tokens,
                tolerance,
                cuda_tolerance,
            },
            json.as_deref(),
        ),
        Cmd::ServeInvariance {
            model,
            device,
            requests,
            max_tokens,
            context,
            mmproj,
            pp,
        } => gate_serve(
            &model,
            device,
            (requests, max_tokens, context),
            &pp.config()?,
            mmproj,
        ),
        Cmd::Pp {
            model,
            tiny: t,
            device,
            pp,
            devices,
            splits,
            micro,
            pp_link,
            max_m,
            prompt_len,
            gen_tokens,
            seed,
            threads,
        } => {
            let w = match (model.as_deref(), t.as_deref()) {
                (None, Some(a)) => tiny_layers(a, 4)?,
                (m, t) => weights("pp", m, t)?,
            };
            let o = pp::Options {
                prompt_len,
                max_m,
                gen_tokens,
                seed,
                threads,
                kv_dtype: kv_dtype(),
                stages: pp,
                devices: devices
                    .as_deref()
                    .map(pipeline::parse_devices)
                    .transpose()?
                    .unwrap_or_default(),
                splits: splits
                    .as_deref()
                    .map(|s| {
                        s.split(';')
                            .map(pipeline::parse_split)
                            .collect::<Result<Vec<_>>>()
                    })
                    .transpose()?,
                micro: micro
                    .split(',')
                    .map(|p| {
                        p.trim().parse::<usize>().map_err(|_| {
                            Error::Input(format!(
                                "--micro `{micro}`: expected counts separated by commas"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?,
                link: pp_link.parse()?,
            };
            gate_pp(&w, device, &o)
        }
        Cmd::Spec {
            model,
            tiny: t,
            device,
            max_tokens,
            k_max,
            seed,
            drafters,
            threads,
            paths,
        } => gate_spec(&SpecArgs {
            model: model.as_deref(),
            tiny: t.as_deref(),
            device,
            max_tokens,
            k_max,
            seed,
            drafters: &drafters,
            threads,
            paths: &paths,
        }),
        Cmd::All {
            model,
            fixture,
            device,
            golden_dir,
        } => gate_all(&model, fixture.as_deref(), device, &golden_dir),
        Cmd::Golden {
            model,
            tiny: t,
            device,
            dir,
            max_tokens,
            record,
            reason,
        } => gate_golden(&GoldenArgs {
            model: model.as_deref(),
            tiny: t.as_deref(),
            device,
            dir: &dir,
            max_tokens,
            record: if record { reason.as_deref() } else { None },
            optional: false,
        }),
        Cmd::PeerLogits {
            model,
            peer,
            device,
            min_agreement,
            tol,
        } => gate_peer_logits(&model, &peer, device, (min_agreement, tol)),
        Cmd::PeerVision {
            model,
            mmproj,
            peer,
            device,
            tolerance,
            json,
        } => gate_peer_vision(&model, &mmproj, &peer, device, tolerance, json.as_deref()),
        Cmd::Inspect { .. } => Err(Error::Input("inspect runs before the gates".into())),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = KV_DTYPE.set(cli.kv_dtype);
    if let Cmd::Inspect { model, scan } = &cli.cmd {
        return match memra_verify::inspect::inspect(model, *scan) {
            Ok(s) => {
                print!("{}: valid\n{s}", model.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("{}: invalid: {e}", model.display());
                ExitCode::from(2)
            }
        };
    }
    match run(cli) {
        Ok(0) => {
            println!("ALL GREEN");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            println!("FAIL ({n})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("memra-verify: error: {e}");
            ExitCode::FAILURE
        }
    }
}
