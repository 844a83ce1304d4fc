//! `memra-bench synth`: deterministic synthetic models (GGUF or HF folder) of real shapes.
//!
//! Tensors are generated one after another, each in parallel row chunks (rayon), and handed
//! to a writer thread through a one-slot channel, so at most about three tensors are in memory.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use memra_engine::config::ModelConfig;
use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::{Gguf, MetaValue};
use memra_engine::formats::safetensors::HfFolderSpec;
use memra_engine::models::random::oracle_config;

use crate::generate::tensor_bytes;
use memra_engine::quant::DType;

use crate::plan::{SynthDType, TensorPlan, oracle_plan, plan};
use crate::rope::{ROPE_FREQS, llama3_rope_factors};
use crate::shapes::Shape;
use crate::sink::{GgufDecl, TensorSink, gguf_sink, hf_decls, hf_sink, split_sink};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    Hf,
}

impl std::str::FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Format> {
        match s {
            "gguf" => Ok(Format::Gguf),
            "hf" => Ok(Format::Hf),
            _ => Err(Error::Input(format!("unknown --format `{s}` (gguf or hf)"))),
        }
    }
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerSource {
    /// Copy tokenizer.* metadata (and the chat template) from this GGUF.
    Gguf(PathBuf),
    /// No tokenizer; the vocabulary size is given.
    None { vocab: usize },
}

/// Everything `synth` needs.
#[derive(Clone, Debug)]
pub struct SynthArgs {
    pub shape: Shape,
    pub dtype: SynthDType,
    pub seed: u64,
    pub out: PathBuf,
    pub format: Format,
    pub layers: Option<usize>,
    pub tokenizer: TokenizerSource,
    /// Worker threads (None: rayon's default, one per core).
    pub threads: Option<usize>,
    /// HF shard size limit.
    pub shard_bytes: u64,
    /// Print progress to stderr.
    pub progress: bool,
    /// GGUF: store llama3 RoPE scaling as llama.cpp does (a `rope_freqs.weight` tensor and no
    /// `rope.scaling.*` keys, which llama.cpp rejects) so llama.cpp can load the file.
    pub llamacpp_rope: bool,
    /// Quantize Q4_K/Q6_K tensors from their f32 values with the reference quantizer (slow)
    /// instead of drawing random valid blocks.
    pub exact_kquants: bool,
    /// The context length the file declares instead of the shape's (e.g. 131072 for the Llama
    /// 3.1 context over llama3-8b's RoPE scaling): long-context runs need positions past 8,192.
    pub ctx: Option<usize>,
    /// Multi-token-prediction layers to add after the decoder layers (llama-family shapes;
    /// random weights: their drafts are noise, see models/mtp.rs).
    pub mtp: usize,
    /// Wire the model as the engine's MTP oracle (`models::random::oracle_fill`: output
    /// projections zero, tied embeddings, the first MTP layer drafting the model's own greedy
    /// picks), for speculation that accepts nearly every draft at a real shape. Llama-family
    /// and qwen3next shapes; `mtp` 0 becomes 1.
    pub mtp_oracle: bool,
    /// Gemma 3 shapes: the local layers' sliding window instead of the shape's (e.g. one wider
    /// than an image's rows, where llama.cpp and HF attend alike within the image:
    /// docs/VERIFY.md "Against llama.cpp mtmd").
    pub sliding_window: Option<usize>,
}

impl SynthArgs {
    /// `shape` as `dtype` into the GGUF file `out` with `tokenizer`: seed 0, the shape's layers,
    /// window and context, no MTP layers, random valid k-quant blocks, 1 GiB HF shards, quiet.
    pub fn new(shape: Shape, dtype: SynthDType, out: PathBuf, tokenizer: TokenizerSource) -> Self {
        SynthArgs {
            shape,
            dtype,
            seed: 0,
            out,
            format: Format::Gguf,
            layers: None,
            tokenizer,
            threads: None,
            shard_bytes: 1 << 30,
            progress: false,
            llamacpp_rope: false,
            exact_kquants: false,
            ctx: None,
            mtp: 0,
            mtp_oracle: false,
            sliding_window: None,
        }
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthReport {
    pub config: ModelConfig,
    pub tensors: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// The tokenizer of a synthetic model: GGUF metadata entries and, for HF output, files.
pub struct TokenizerParts {
    pub vocab: usize,
    pub gguf_meta: Vec<(String, MetaValue)>,
    pub source: Option<Gguf>,
}

/// Reads the tokenizer source.
pub fn load_tokenizer(src: &TokenizerSource) -> Result<TokenizerParts> {
    match src {
        TokenizerSource::None { vocab } => Ok(TokenizerParts {
            vocab: *vocab,
            gguf_meta: Vec::new(),
            source: None,
        }),
        TokenizerSource::Gguf(p) => {
            if !p.is_file() {
                return Err(Error::Input(format!(
                    "tokenizer source {} not found: run tools/fetch-models.sh (or pass --tokenizer-from)",
                    p.display()
                )));
            }
            let g = Gguf::open(p)?;
            let gguf_meta: Vec<(String, MetaValue)> = g
                .metadata()
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .cloned()
                .collect();
            let vocab = g
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or_else(|| {
                    Error::Tokenizer(format!("{} has no tokenizer.ggml.tokens", p.display()))
                })?;
            Ok(TokenizerParts {
                vocab,
                gguf_meta,
                source: Some(g),
            })
        }
    }
}

/// The config of the model `args` describes.
pub fn synth_config(args: &SynthArgs, vocab: usize) -> Result<ModelConfig> {
    let mut cfg = args.shape.config(vocab);
    if let Some(l) = args.layers {
        cfg.n_layers = l;
    }
    if let Some(c) = args.ctx {
        cfg.max_ctx = c;
    }
    cfg.mtp_layers = args.mtp;
    if args.mtp_oracle {
        cfg = oracle_config(&cfg).map_err(|e| {
            Error::Input(format!(
                "--mtp-oracle: shape {} ({}) has no MTP oracle ({e}); use a llama, qwen2, \
                 qwen3 or qwen3next shape",
                args.shape.name(),
                cfg.arch.gguf_name()
            ))
        })?;
    }
    if let Some(w) = args.sliding_window {
        match cfg.gemma3.as_mut() {
            Some(g) => g.sliding_window = w,
            None => {
                return Err(Error::Input(format!(
                    "--sliding-window applies to gemma3 shapes, not {}",
                    args.shape.name()
                )));
            }
        }
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The tensors of the model `args` describes with config `cfg` ([`synth_config`]'s): [`plan`]'s,
/// wired as the MTP oracle with `--mtp-oracle`.
pub fn synth_plan(args: &SynthArgs, cfg: &ModelConfig) -> Result<Vec<TensorPlan>> {
    let mut tensors = plan(cfg, args.dtype);
    if args.mtp_oracle {
        oracle_plan(cfg, &mut tensors)?;
    }
    Ok(tensors)
}

/// GGUF metadata for `cfg`: every key `ModelConfig::from_gguf` reads, plus llama.cpp's usual ones.
/// With `llamacpp_rope`, llama3 RoPE scaling keys are left out (see [`SynthArgs::llamacpp_rope`]).
pub fn gguf_metadata(
    cfg: &ModelConfig,
    name: &str,
    dtype: SynthDType,
    llamacpp_rope: bool,
) -> Vec<(String, MetaValue)> {
    let a = cfg.arch.gguf_name();
    let u = |v: usize| MetaValue::U32(v as u32);
    let mut m = vec![
        ("general.architecture".to_string(), MetaValue::Str(a.into())),
        ("general.name".to_string(), MetaValue::Str(name.into())),
        (
            "general.file_type".to_string(),
            MetaValue::U32(dtype.gguf_file_type()),
        ),
        (format!("{a}.vocab_size"), u(cfg.vocab)),
        (format!("{a}.context_length"), u(cfg.max_ctx)),
        (format!("{a}.embedding_length"), u(cfg.hidden)),
        // llama.cpp counts the MTP (`nextn`) layers in the block count.
        (format!("{a}.block_count"), u(cfg.n_layers + cfg.mtp_layers)),
        (format!("{a}.feed_forward_length"), u(cfg.ffn)),
        (format!("{a}.attention.head_count"), u(cfg.n_heads)),
        (format!("{a}.attention.head_count_kv"), u(cfg.n_kv_heads)),
        (format!("{a}.attention.key_length"), u(cfg.head_dim)),
        (format!("{a}.attention.value_length"), u(cfg.head_dim)),
        // Partial RoPE (qwen3next) writes its own count with its keys below.
        (
            format!("{a}.rope.dimension_count"),
            u(cfg.hybrid.map_or(cfg.head_dim, |p| p.rope_dim)),
        ),
        (
            format!("{a}.rope.freq_base"),
            MetaValue::F32(cfg.rope_theta),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(cfg.rms_eps),
        ),
    ];
    if cfg.mtp_layers > 0 {
        m.push((format!("{a}.nextn_predict_layers"), u(cfg.mtp_layers)));
    }
    if let Some(p) = &cfg.gemma3 {
        m.extend(memra_engine::models::gemma3::gguf_keys(p));
    }
    if let Some(p) = &cfg.moe {
        m.extend(memra_engine::models::qwen3_moe::gguf_keys(cfg.arch, p));
    }
    if let Some(p) = &cfg.vl {
        m.extend(memra_engine::models::qwen2vl::gguf_keys(cfg.arch, p));
    }
    if let Some(p) = &cfg.hybrid {
        let keys = memra_engine::models::qwen3next::gguf_keys(p);
        m.extend(
            keys.into_iter()
                .filter(|(k, _)| !k.ends_with("rope.dimension_count")),
        );
    }
    if let Some(rs) = cfg.rope_scaling.filter(|_| !llamacpp_rope) {
        m.push((
            format!("{a}.rope.scaling.type"),
            MetaValue::Str("llama3".into()),
        ));
        m.push((
            format!("{a}.rope.scaling.factor"),
            MetaValue::F32(rs.factor),
        ));
        m.push((
            format!("{a}.rope.scaling.low_freq_factor"),
            MetaValue::F32(rs.low_freq_factor),
        ));
        m.push((
            format!("{a}.rope.scaling.high_freq_factor"),
            MetaValue::F32(rs.high_freq_factor),
        ));
        m.push((
            format!("{a}.rope.scaling.original_context_length"),
            MetaValue::U32(rs.original_max_position_embeddings),
        ));
    }
    m
}

/// Streams `tensors` through `produce` (parallel inside) to `sink` on a writer thread.
/// `produce(i)` returns tensor i's bytes; progress lines go to stderr.
pub fn stream_tensors(
    names: &[String],
    produce: &(dyn Fn(usize) -> Result<Vec<u8>> + Sync),
    sink: Box<dyn TensorSink>,
    progress: bool,
) -> Result<u64> {
    let start = Instant::now();
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(1);
    let writer = std::thread::spawn(move || -> Result<u64> {
        let mut sink = sink;
        let mut total = 0u64;
        for bytes in rx {
            sink.write_tensor(&bytes)?;
            total += bytes.len() as u64;
        }
        sink.finish()?;
        Ok(total)
    });
    let mut produced = Ok(());
    let mut bytes_made = 0u64;
    for (i, name) in names.iter().enumerate() {
        match produce(i) {
            Ok(b) => {
                bytes_made += b.len() as u64;
                if progress {
                    eprintln!(
                        "[{:>4}/{}] {name:<44} {:>9.1} MB  {:>6.1} s",
                        i + 1,
                        names.len(),
                        bytes_made as f64 / 1e6,
                        start.elapsed().as_secs_f64()
                    );
                }
                if tx.send(b).is_err() {
                    break; // the writer failed; its error is reported below
                }
            }
            Err(e) => {
                produced = Err(e);
                break;
            }
        }
    }
    drop(tx);
    let written = writer
        .join()
        .map_err(|_| Error::Input("the writer thread panicked".into()))?;
    produced?;
    let total = written?;
    if total != bytes_made {
        return Err(Error::Input(format!("wrote {total} bytes of {bytes_made}")));
    }
    Ok(total)
}

/// Writes the synthetic model `args` describes.
pub fn synth(args: &SynthArgs) -> Result<SynthReport> {
    let start = Instant::now();
    let tok = load_tokenizer(&args.tokenizer)?;
    let cfg = synth_config(args, tok.vocab)?;
    if args.format == Format::Hf && cfg.arch == memra_engine::config::Arch::Qwen3Next {
        return hybrid_hf(args, &tok, start);
    }
    if args.format == Format::Gguf && args.dtype.checkpoint_type().is_some() {
        return Err(Error::Input(format!(
            "--dtype {} writes HF checkpoints only: use --format hf",
            args.dtype.name()
        )));
    }
    let tensors = synth_plan(args, &cfg)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.unwrap_or(0))
        .build()
        .map_err(|e| Error::Input(format!("thread pool: {e}")))?;
    let gguf_order = args.format == Format::Gguf;
    // llama.cpp-style llama3 RoPE factors, written after the weights.
    let rope_factors = match cfg.rope_scaling {
        Some(rs) if gguf_order && args.llamacpp_rope => {
            Some(llama3_rope_factors(cfg.rope_theta, cfg.head_dim, &rs))
        }
        _ => None,
    };
    let mut names: Vec<String> = tensors
        .iter()
        .map(|t| {
            if gguf_order {
                t.gguf_name()
            } else {
                t.hf_name()
            }
        })
        .collect();
    let sink = match args.format {
        Format::Gguf => {
            let name = format!("memra-synth {}", args.shape);
            let mut meta = gguf_metadata(&cfg, &name, args.dtype, args.llamacpp_rope);
            meta.extend(tok.gguf_meta.iter().cloned());
            let mut decls: Vec<GgufDecl> = tensors
                .iter()
                .map(|t| GgufDecl {
                    name: t.gguf_name(),
                    dtype: t.dtype,
                    dims: t.gguf_dims(),
                })
                .collect();
            if let Some(f) = &rope_factors {
                decls.push(GgufDecl {
                    name: ROPE_FREQS.into(),
                    dtype: DType::F32,
                    dims: vec![f.len() as u64],
                });
                names.push(ROPE_FREQS.into());
            }
            gguf_sink(&args.out, meta, &decls)?
        }
        Format::Hf => hf_folder_sink(args, &cfg, &tensors, &tok)?,
    };
    let seed = args.seed;
    let produce = |i: usize| -> Result<Vec<u8>> {
        match (tensors.get(i), &rope_factors) {
            (Some(t), _) => {
                pool.install(|| tensor_bytes(seed, t, &cfg, gguf_order, !args.exact_kquants))
            }
            (None, Some(f)) => Ok(f.iter().flat_map(|v| v.to_le_bytes()).collect()),
            (None, None) => Err(Error::Input(format!("tensor {i} out of range"))),
        }
    };
    let bytes = stream_tensors(&names, &produce, sink, args.progress)?;
    let seconds = start.elapsed().as_secs_f64();
    if args.progress {
        eprintln!(
            "wrote {} ({} tensors, {:.2} GB) in {seconds:.1} s",
            args.out.display(),
            names.len(),
            bytes as f64 / 1e9
        );
    }
    Ok(SynthReport {
        config: cfg,
        tensors: names.len(),
        bytes,
        seconds,
    })
}

/// A qwen3next HF folder: its HF tensors are not one per internal tensor (`in_proj_qkvz` holds
/// two, `A_log` is a transform), so the GGUF is written first (beside `--out`), loaded, and
/// mapped by the engine's own `qwen3next::hf_tensors`, in memory (fine for test shapes; the
/// 80B shape is a GGUF one).
fn hybrid_hf(args: &SynthArgs, tok: &TokenizerParts, start: Instant) -> Result<SynthReport> {
    let tmp = args.out.with_extension("gguf.tmp");
    let gguf = SynthArgs {
        format: Format::Gguf,
        out: tmp.clone(),
        ..args.clone()
    };
    float_only(args, false)?;
    let made = synth(&gguf);
    let tensors = made.and_then(|_| {
        let w = memra_engine::loader::load_weights(&tmp)?;
        memra_engine::models::qwen3next::hf_tensors(&w).map(|t| (w.config, t))
    });
    let _ = std::fs::remove_file(&tmp);
    let (cfg, tensors) = tensors?;
    let spec = hf_spec(args, &cfg, tok)?;
    memra_engine::formats::safetensors::write_hf_folder(&args.out, &spec, &tensors)?;
    let bytes = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
    Ok(SynthReport {
        config: cfg,
        tensors: tensors.len(),
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Refuses a `--dtype` an HF folder cannot hold (the GGUF block types); `checkpoints`: whether
/// the HF checkpoint types (fp8, nvfp4) are allowed.
fn float_only(args: &SynthArgs, checkpoints: bool) -> Result<()> {
    let ckpt = checkpoints && args.dtype.checkpoint_type().is_some();
    match args.dtype.float_type() {
        Some(_) => Ok(()),
        None if ckpt => Ok(()),
        None => Err(Error::Input(format!(
            "--format hf holds f32/f16/bf16 tensors (and fp8 / nvfp4 checkpoints of the dense \
             architectures) only, not {}",
            args.dtype.name()
        ))),
    }
}

fn hf_folder_sink(
    args: &SynthArgs,
    cfg: &ModelConfig,
    tensors: &[TensorPlan],
    tok: &TokenizerParts,
) -> Result<Box<dyn TensorSink>> {
    float_only(args, true)?;
    let spec = hf_spec(args, cfg, tok)?;
    let (decls, parts) = hf_decls(
        tensors
            .iter()
            .map(|t| (t.role, t.arch, t.dtype, t.shape.clone())),
    )?;
    Ok(split_sink(hf_sink(&args.out, &spec, decls)?, parts))
}

/// The config and tokenizer files of an HF folder of `cfg`.
fn hf_spec(args: &SynthArgs, cfg: &ModelConfig, tok: &TokenizerParts) -> Result<HfFolderSpec> {
    let (tokenizer_json, tokenizer_config_json, bos, eos) = match &tok.source {
        Some(g) => {
            let (tj, tc) = crate::tok::hf_tokenizer_files(g)?;
            let id = |k: &str| g.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
            (
                Some(tj),
                Some(tc),
                id("tokenizer.ggml.bos_token_id"),
                id("tokenizer.ggml.eos_token_id"),
            )
        }
        None => (None, None, None, None),
    };
    let mut config_json = cfg.to_hf_json(bos, eos);
    if let (Some(q), Some(obj)) = (
        args.dtype.quantization_config(),
        config_json.as_object_mut(),
    ) {
        obj.insert("quantization_config".into(), q);
    }
    Ok(HfFolderSpec {
        config_json,
        tokenizer_json,
        tokenizer_config_json,
        max_shard_bytes: args.shard_bytes,
    })
}

/// The default tokenizer source: `$MEMRA_MODELS_DIR` (or `~/.cache/memra/models`) /
/// SmolLM2-135M-Instruct.Q4_1.gguf.
pub fn default_tokenizer_path(models_dir: Option<&Path>, home: Option<&Path>) -> PathBuf {
    let dir = match (models_dir, home) {
        (Some(d), _) => d.to_path_buf(),
        (None, Some(h)) => h.join(".cache/memra/models"),
        (None, None) => PathBuf::from(".cache/memra/models"),
    };
    dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(shape: Shape, sliding_window: Option<usize>) -> SynthArgs {
        let tokenizer = TokenizerSource::None { vocab: 512 };
        SynthArgs {
            sliding_window,
            ..SynthArgs::new(shape, SynthDType::F32, "unused.gguf".into(), tokenizer)
        }
    }

    #[test]
    fn sliding_window_overrides_gemma3_only() {
        let window =
            |a: &SynthArgs| synth_config(a, 512).map(|c| c.gemma3.map(|g| g.sliding_window));
        let shape = window(&args(Shape::TinyGemma3, None)).unwrap();
        assert_ne!(shape, Some(64));
        assert_eq!(
            window(&args(Shape::TinyGemma3, Some(64))).unwrap(),
            Some(64)
        );
        assert!(window(&args(Shape::TinyLlama, Some(64))).is_err());
        assert!(window(&args(Shape::TinyGemma3, Some(0))).is_err());
    }
}
