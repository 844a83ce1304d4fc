//! run-gen: generate text with a model on the CPU reference backend (or the GPU when built in).
//!
//! `run-gen MODEL (--prompt TEXT | --prompt-ids 1,2,3) [--chat] [--system TEXT] [--max-tokens N]
//!  [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--device auto|cpu|cuda[:N]]
//!  [--pp N] [--devices D0,D1] [--pp-split L] [--pp-micro N] [--pp-link auto|nccl|peer] [--threads N] [--json] [--logits-top K] [--no-cuda-graph]
//!  [--spec ngram|mtp|draft:PATH|auto|auto+draft:PATH] [--spec-k K]`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use memra_engine::backend::cuda::graphs_default;
use memra_engine::backend::{Device, KvDtype, OpenOptions};
use memra_engine::chat::ChatMessage;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_model;
use memra_engine::pipeline::{self, PpConfig};
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::generate::{SpecOptions, generate_spec_timed};
use memra_engine::spec::{DrafterKind, SpecConfig, open_drafter};
use memra_engine::tokenizer::StreamDecoder;
use memra_engine::{Error, Result};

/// Every flag of run-gen (docs/FLAGS.md lists them).
#[derive(Parser, Debug)]
#[command(
    name = "run-gen",
    version,
    about = "Generate text with a GGUF file or HF safetensors folder"
)]
struct Args {
    /// A GGUF file (or the first part of a split GGUF) or an HF safetensors folder.
    model: PathBuf,
    /// The prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Render the prompt as one user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: Device,
    /// Pipeline stages: the layers split over N stages (same output as unsplit).
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// One device per pipeline stage, e.g. `cuda:0,cuda:1` or `cpu,cpu`.
    #[arg(long)]
    devices: Option<String>,
    /// The first layer of each stage after the first, e.g. `12`.
    #[arg(long)]
    pp_split: Option<String>,
    /// Micro-batches per step with --pp (1: off).
    #[arg(long, default_value_t = 2)]
    pp_micro: usize,
    /// The hand-over between stages on two GPUs: auto, nccl or peer.
    #[arg(long, default_value = "auto")]
    pp_link: String,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The KV cache's element format: f16 (default), bf16, q8_0 or f32.
    #[arg(long, default_value = "f16")]
    kv_dtype: KvDtype,
    /// Prefill chunk size in tokens (0 = whole prompt).
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// Do not stop at EOS / end-of-turn tokens (benchmarks: always generate --max-tokens).
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Include the top K logits of every generated position in the JSON.
    #[arg(long, default_value_t = 0)]
    logits_top: usize,
    /// Run every CUDA step plainly, without CUDA graphs (also: MEMRA_CUDA_GRAPHS=0).
    #[arg(long)]
    no_cuda_graph: bool,
    /// Speculative decoding: `ngram` (prompt lookup), `draft:PATH` (a smaller model with the
    /// same tokenizer), `mtp` (the model's own MTP layer, on the same device as the model),
    /// `auto` (its MTP layers if it has them, with n-gram lookup, picked per step by measured
    /// acceptance) or `auto+draft:PATH`. The output is the same as without it.
    #[arg(long)]
    spec: Option<String>,
    /// Most draft tokens checked per step (with --spec; adapted down or off when it does not
    /// pay).
    #[arg(long, default_value_t = memra_engine::spec::DEFAULT_K)]
    spec_k: usize,
}

fn prompt_ids(args: &Args, model: &memra_engine::loader::Model) -> Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_ids {
        return Ok(ids.clone());
    }
    let text = args.prompt.clone().unwrap_or_default();
    if !args.chat {
        return model
            .tokenizer
            .encode(&text, model.tokenizer.add_bos_default());
    }
    let tmpl = model.chat.as_ref().ok_or_else(|| {
        Error::Input(format!(
            "--chat: {} has no chat template",
            args.model.display()
        ))
    })?;
    let mut msgs = Vec::new();
    if let Some(s) = &args.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    msgs.push(ChatMessage::new("user", text));
    let rendered = tmpl.render(&msgs, true)?;
    model.tokenizer.encode(&rendered, false)
}

fn run(args: Args) -> Result<()> {
    let model = load_model(&args.model)?;
    let ids = prompt_ids(&args, &model)?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
    };
    params.validate()?;
    let total = (ids.len() + args.max_tokens).min(model.config.max_ctx);
    let tokenizer = model.tokenizer.clone();
    let graphs = graphs_default() && !args.no_cuda_graph;
    let opts = OpenOptions {
        kv_blocks: total.div_ceil(16).max(1),
        block_size: 16,
        threads: args.threads,
        graphs,
        kv_dtype: args.kv_dtype,
        state_slots: 1,
    };
    let spec = match &args.spec {
        Some(kind) => {
            let cfg = SpecConfig::new(kind.parse::<DrafterKind>()?, args.spec_k)?;
            let o = open_drafter(
                &cfg,
                args.device,
                args.threads,
                &model.weights,
                Some(&tokenizer),
            )?;
            for n in &o.notes {
                eprintln!("run-gen: {n}");
            }
            Some((cfg, o.drafter))
        }
        None => None,
    };
    let pp = PpConfig::from_flags(args.pp, args.devices.as_deref(), args.pp_split.as_deref())?
        .with_micro_link(Some(args.pp_micro), Some(&args.pp_link))?;
    let mut backend = pipeline::open_any(args.device, model.weights, &opts, &pp)?;
    if let Some(s) = backend.pipeline() {
        eprintln!("run-gen: {s}");
    }
    let req = GenRequest {
        prompt: ids.clone(),
        max_tokens: args.max_tokens,
        params,
        stop_ids: if args.ignore_eos {
            Vec::new()
        } else {
            tokenizer.stop_ids().to_vec()
        },
        prefill_chunk: args.prefill_chunk,
        logits_top: args.logits_top,
        keep_logits: false,
    };
    let mut dec = StreamDecoder::new(&tokenizer);
    let mut stdout = std::io::stdout().lock();
    let json = args.json;
    let mut on_token = |t: u32| -> Result<()> {
        if !json {
            let piece = dec.push(t)?;
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        Ok(())
    };
    let (out, counts) = match spec {
        None => (generate(backend.as_mut(), &req, &mut on_token)?, None),
        Some((cfg, mut drafter)) => {
            let o = SpecOptions {
                k: cfg.k,
                adaptive: true,
            };
            let (out, c, t) =
                generate_spec_timed(backend.as_mut(), drafter.as_mut(), &req, o, &mut on_token)?;
            (out, Some((c, t)))
        }
    };
    if !json {
        let rest = dec.finish();
        let _ = writeln!(stdout, "{rest}");
        return Ok(());
    }
    let mut v = serde_json::json!({
        "prompt_ids": ids,
        "tokens": out.tokens,
        "text": tokenizer.decode(&out.tokens)?,
        "finish_reason": out.finish_reason.as_str(),
        "prompt_tok_per_s": ids.len() as f64 / out.prompt_secs.max(1e-9),
        "decode_tok_per_s": out.tokens.len().saturating_sub(1) as f64 / out.decode_secs.max(1e-9),
        "backend": backend.name(),
        "cuda_graphs": graphs && backend.name().starts_with("cuda"),
    });
    if let Some((c, t)) = counts {
        let ms = |secs: f64, n: u64| (n > 0).then(|| secs * 1e3 / n as f64);
        v["spec"] = serde_json::json!({
            "drafted": c.drafted,
            "accepted": c.accepted,
            "verify_steps": c.steps,
            "mean_accepted_length": (c.accepted + c.steps) as f64 / c.steps.max(1) as f64,
            // Where the decode time went: per verify step (drafting apart), per plain step.
            "draft_ms_per_verify_step": ms(t.draft_secs, t.verify_steps),
            "verify_step_ms": ms(t.verify_secs, t.verify_steps),
            "plain_steps": t.plain_steps,
            "plain_step_ms": ms(t.plain_secs, t.plain_steps),
        });
    }
    if args.logits_top > 0 {
        v["logits_top"] = serde_json::json!(out.logits_top);
    }
    let _ = writeln!(stdout, "{v}");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("run-gen: error: {e}");
            ExitCode::FAILURE
        }
    }
}
