//! `memra-bench decode|prefill|ttft`: batch-1 speed through the engine API, as measurement rows.
//!
//! Correctness first: an untimed reference run (which is also the warm-up) gives the token ids;
//! every timed run must give the same ids, else the row is reported invalid and carries no value.
//! Then the median of the timed runs with min and max. Decode rows carry the weight bytes a token
//! reads (`weight_bytes_per_token`) and the achieved weight and KV GB/s; on a GPU the run also
//! records the device copy bandwidth (the roofline).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig};
use memra_engine::error::{Error, Result};
use memra_engine::grammar::{Grammar, GrammarSpec, Grammars};
use memra_engine::loader::load_model;
use memra_engine::models::random::splitmix;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::testing::text_request;

use crate::record::{self, DeviceRef, ModelRef, Row, Workload};

/// Which measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Decode tok/s after a `prompt`-token prompt, `gen` tokens.
    Decode,
    /// Prefill tok/s: `prompt` tokens, one generated.
    Prefill,
    /// TTFT cold (fresh cache salt) and cached (the same prompt again, its prefix cached; with
    /// `turn`, a new turn of that many tokens after the cached prompt).
    Ttft,
}

#[derive(Clone, Debug)]
pub struct SpeedArgs {
    pub kind: Kind,
    pub device: Device,
    /// Prompt lengths (one row set each).
    pub prompts: Vec<usize>,
    /// Decode only: context depths, one more decode row each (the context of D tokens is the
    /// prompt; `depth` = D on the row, as llama-bench `-d D -n GEN`).
    pub depths: Vec<usize>,
    /// Decode only: prefill rows of these prompt lengths too, after the decode rows, from the
    /// same loaded engine (one load of a large file instead of two processes' loads).
    pub prefill_prompts: Vec<usize>,
    /// Ttft only: the cached row's new turn in tokens (0: the same prompt again). Each timed run
    /// sends the cached prompt plus fresh turn tokens; its tokens must equal an untimed run of
    /// the same ids under a fresh salt. The row's `prompt` is the whole prompt, `depth` the
    /// cached part.
    pub turn: usize,
    pub gen_tokens: usize,
    /// Timed runs (after the untimed reference run).
    pub runs: usize,
    /// The row's run id.
    pub run: String,
    /// Show a progress bar.
    pub progress: bool,
    /// The shape and dtype labels for the rows (`llama3-8b`, `Q4_K_M`).
    pub shape: Option<String>,
    pub dtype: Option<String>,
    /// The KV cache's element format.
    pub kv_dtype: memra_engine::engine::KvDtype,
    /// Decode only: a JSON Schema file; the timed requests are constrained by it (structured
    /// output, as the server's `response_format: json_schema`).
    pub schema: Option<PathBuf>,
}

/// One request's outcome.
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    ttft_s: f64,
    /// From the first to the last token.
    decode_s: f64,
}

/// The deterministic prompt of `len` token ids for a vocabulary of `vocab` (shared with
/// [`crate::serve_ttft`], so engine and server runs send the same tokens).
pub fn prompt_ids(len: usize, vocab: usize) -> Vec<u32> {
    turn_ids(0, len, vocab)
}

/// `len` deterministic token ids of stream `stream` (0: the prompt; 1, 2, ...: new turns).
pub fn turn_ids(stream: u64, len: usize, vocab: usize) -> Vec<u32> {
    let span = (vocab as u64).saturating_sub(200).max(1);
    (0..len as u64)
        .map(|j| (100 + splitmix(23, stream, j) % span) as u32)
        .collect()
}

/// The grammar of the JSON Schema in `path`, compiled as the server compiles
/// `response_format: json_schema`. Every error names the file.
pub fn schema_grammar(
    path: &Path,
    tok: &memra_engine::tokenizer::Tokenizer,
) -> Result<Arc<Grammar>> {
    let name = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::Input(format!("--schema {name}: {e}")))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Input(format!("--schema {name} is not JSON: {e}")))?;
    if !schema.is_object() {
        return Err(Error::Input(format!(
            "--schema {name}: a JSON Schema must be a JSON object"
        )));
    }
    Grammars::new(tok)
        .compile(&GrammarSpec::JsonSchema(schema))
        .map_err(|e| Error::Input(format!("--schema {name}: {e}")))
}

fn request(
    prompt: Vec<u32>,
    n_gen: usize,
    salt: String,
    grammar: Option<&Arc<Grammar>>,
) -> ValidRequest {
    ValidRequest {
        model: "bench".into(),
        tenant: "bench".into(),
        cache_salt: Some(salt),
        speculative: true,
        grammar: grammar.cloned(),
        ..text_request(prompt, n_gen)
    }
}

fn drain(mut s: EventStream, t0: Instant) -> Result<Outcome> {
    let (mut tokens, mut text, mut first, mut last) = (Vec::new(), String::new(), None, 0.0);
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => {
                let now = t0.elapsed().as_secs_f64();
                first.get_or_insert(now);
                last = now;
                tokens.push(t.id);
                text.push_str(&t.text);
            }
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done { .. }) => {
                let ttft_s = first.unwrap_or(0.0);
                return Ok(Outcome {
                    tokens,
                    text,
                    ttft_s,
                    decode_s: last - ttft_s,
                });
            }
            Some(Event::Error(e)) => return Err(Error::Input(format!("request failed: {e}"))),
            None => return Err(Error::Input("stream ended without Done".into())),
        }
    }
}

fn once(engine: &memra_engine::engine::EngineHandle, req: ValidRequest) -> Result<Outcome> {
    let t0 = Instant::now();
    let s = engine
        .submit(req)
        .map_err(|e| Error::Input(format!("submit: {e}")))?;
    drain(s, t0)
}

/// The device the engine ran on (`cpu` or `cuda:N`), and the GPU's copy bandwidth (GB/s) when
/// it is one.
pub fn device_ref(backend: &str) -> Result<(DeviceRef, Option<f64>)> {
    let Some(ordinal) = backend
        .strip_prefix("cuda:")
        .and_then(|n| n.parse::<usize>().ok())
    else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d = DeviceRef {
            name: format!("CPU ({cores} cores)"),
            driver: None,
            sms: None,
        };
        return Ok((d, None));
    };
    let gpu = memra_engine::backend::cuda::Gpu::open(ordinal)?;
    let name = gpu.ctx.name().unwrap_or_else(|_| backend.to_string());
    let driver = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=driver_version", "--format=csv,noheader"])
        .arg(format!("--id={ordinal}"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty());
    let bw = crate::kernels::copy_bandwidth(&gpu)?;
    let d = DeviceRef {
        name,
        driver,
        sms: Some(gpu.sms),
    };
    Ok((d, Some(bw)))
}

/// Runs the measurement on `model`; returns the rows (one per prompt length and workload).
pub fn run(model: &Path, a: &SpeedArgs) -> Result<Vec<Row>> {
    if a.runs == 0 {
        return Err(Error::Input("--runs must be at least 1".into()));
    }
    if a.gen_tokens == 0 || (a.kind == Kind::Decode && a.gen_tokens < 2) {
        return Err(Error::Input(
            "--gen must be at least 2 for decode (1 for prefill and ttft)".into(),
        ));
    }
    if a.schema.is_some() && a.kind != Kind::Decode {
        return Err(Error::Input("--schema applies to decode only".into()));
    }
    if !a.prefill_prompts.is_empty() && a.kind != Kind::Decode {
        return Err(Error::Input("--prefill applies to decode only".into()));
    }
    // The file's hash (tens of seconds for a large file the first time) beside the load.
    let hashing = std::thread::spawn({
        let p = model.to_path_buf();
        move || record::model_ref(&p)
    });
    let t_load = Instant::now();
    let m = load_model(model)?;
    let vocab = m.config.vocab;
    let grammar = a
        .schema
        .as_deref()
        .map(|p| schema_grammar(p, &m.tokenizer))
        .transpose()?;
    let g = grammar.as_ref();
    let mut cfg = EngineConfig {
        device: a.device,
        prefix_cache: true,
        kv_dtype: a.kv_dtype,
        ..EngineConfig::default()
    };
    // The bench runs one request at a time (at most 4 admitted): the KV pool sized from free
    // memory is capped at max_running contexts, so 4, not the server's 64 (on the CPU a 64-context
    // pool of SmolLM2 took 11.8 GB of RAM, and a parallel test run was OOM-killed).
    let limits = AdmissionLimits {
        max_in_flight_per_tenant: 4,
        max_queued: 4,
    };
    cfg.scheduler.max_running = limits.max_in_flight_per_tenant;
    let t_start = Instant::now();
    let read_s = (t_start - t_load).as_secs_f64();
    let engine = Engine::start(vec![("bench".into(), m, cfg)], limits)?;
    let start_s = t_start.elapsed().as_secs_f64();
    let mref: ModelRef = hashing
        .join()
        .map_err(|_| Error::Input("hashing the model file failed".into()))??;
    // Where a load's time went (stderr, with --quiet too: the lease logs keep it).
    {
        let l = memra_engine::backend::cuda::load_stats::load_stats();
        let cuda = if l.upload_bytes > 0 {
            format!(
                " (repacking {:.1} s, host to device {:.1} s for {:.1} GB)",
                l.repack_s,
                l.upload_s,
                l.upload_bytes as f64 / 1e9
            )
        } else {
            String::new()
        };
        eprintln!(
            "model: read {read_s:.1} s, engine start {start_s:.1} s{cuda}, the file's hash \
             ready {:.1} s after the read began",
            t_load.elapsed().as_secs_f64()
        );
    }
    let info = engine
        .models()
        .into_iter()
        .next()
        .ok_or_else(|| Error::Input("the engine serves no model".into()))?;
    let (device, copy_bw) = device_ref(&info.backend)?;
    let gen_of = |k: Kind| match k {
        Kind::Decode => a.gen_tokens,
        Kind::Prefill | Kind::Ttft => 1,
    };
    let per_prompt = if a.kind == Kind::Ttft { 2 } else { 1 };
    let bar = if a.progress {
        let n = a.prompts.len() + a.depths.len() + a.prefill_prompts.len();
        let b = ProgressBar::new((n * per_prompt * (a.runs + 1)) as u64);
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} runs")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let base = Row {
        commit: record::commit(),
        model: Some(mref.clone()),
        shape: a.shape.clone(),
        dtype: a.dtype.clone(),
        batch: Some(1),
        generated: Some(gen_of(a.kind) as u64),
        depth: Some(0),
        kv_dtype: Some(info.kv_dtype.to_string()),
        constraint: grammar.as_ref().map(|_| "json_schema".to_string()),
        schema: a.schema.as_deref().map(|p| {
            p.file_name()
                .unwrap_or(p.as_os_str())
                .to_string_lossy()
                .into_owned()
        }),
        runs: a.runs as u64,
        ..Row::new(a.run.clone(), device, "memra", Workload::Decode, "tok/s")
    };
    let mut rows = Vec::new();
    if let Some(bw) = copy_bw {
        rows.push(Row {
            model: None,
            shape: None,
            dtype: None,
            workload: Workload::CopyBandwidth,
            batch: None,
            generated: None,
            depth: None,
            value: Some(bw),
            unit: "GB/s".into(),
            runs: 5,
            ..base.clone()
        });
    }
    let mut salt = 0u64;
    let mut fresh = || {
        salt += 1;
        format!("bench-{}-{salt}", a.run)
    };
    if a.kind != Kind::Decode && !a.depths.is_empty() {
        return Err(Error::Input("--depth applies to decode only".into()));
    }
    if a.kind != Kind::Ttft && a.turn > 0 {
        return Err(Error::Input("--turn applies to ttft only".into()));
    }
    // (kind, prompt, depth): the prompt rows at depth 0, then one decode row per depth, then
    // the prefill rows a decode run was asked for.
    let items = a
        .prompts
        .iter()
        .map(|&p| (a.kind, p, 0))
        .chain(a.depths.iter().map(|&d| (Kind::Decode, d.max(1), d)))
        .chain(a.prefill_prompts.iter().map(|&p| (Kind::Prefill, p, 0)));
    for (kind, p, depth) in items {
        let n_gen = gen_of(kind);
        // A prefill row of a decode run: its own rows' constraint-free requests.
        let g = if kind == a.kind { g } else { None };
        if p == 0 || p + a.turn + n_gen > info.max_positions {
            return Err(Error::Input(format!(
                "prompt {p} + turn {} + {n_gen} generated tokens does not fit the model's {} \
                 positions",
                a.turn, info.max_positions
            )));
        }
        let ids = prompt_ids(p, vocab);
        bar.set_message(format!("{kind:?} prompt {p}"));
        let reference = once(&engine, request(ids.clone(), n_gen, fresh(), g))?;
        bar.inc(1);
        if g.is_some() {
            // The grammar's output, for the record (a JSON string: one line).
            bar.suspend(|| {
                eprintln!(
                    "schema output, prompt {p}, {} tokens: {}",
                    reference.tokens.len(),
                    serde_json::to_string(&reference.text).unwrap_or_default()
                )
            });
        }
        let mut timed = Vec::new();
        let mut valid = true;
        for _ in 0..a.runs {
            let o = once(&engine, request(ids.clone(), n_gen, fresh(), g))?;
            valid &= o.tokens == reference.tokens;
            timed.push(o);
            bar.inc(1);
        }
        let row = |w: Workload, unit: &str, vals: Vec<f64>, valid: bool| {
            let mmm = record::median_min_max(&vals).filter(|_| valid);
            Row {
                workload: w,
                prompt: Some(p as u64),
                depth: Some(depth as u64),
                unit: unit.into(),
                value: mmm.map(|x| x.0),
                min: mmm.map(|x| x.1),
                max: mmm.map(|x| x.2),
                valid,
                generated: Some(n_gen as u64),
                constraint: g.and(base.constraint.clone()),
                schema: g.and(base.schema.clone()),
                ..base.clone()
            }
        };
        match kind {
            Kind::Decode => {
                // A grammar may end the output before `n_gen` tokens: the row counts the tokens
                // generated (every timed run gave the reference's, or the row is invalid).
                let got = reference.tokens.len();
                if got < 2 {
                    return Err(Error::Input(format!(
                        "prompt {p}: the output ended after {got} token(s); decode needs at least 2"
                    )));
                }
                let v = timed
                    .iter()
                    .map(|o| (got - 1) as f64 / o.decode_s.max(1e-9))
                    .collect();
                let mut r = row(Workload::Decode, "tok/s", v, valid);
                r.generated = Some(got as u64);
                // The weights a token reads (the routed experts of an MoE, not the file).
                r.weight_bytes_per_token = Some(info.weight_token_bytes as u64);
                r.weight_gb_s = r.value.map(|v| info.weight_token_bytes as f64 * v / 1e9);
                // Generated token i (0-based) reads the KV of the p + i positions before it.
                let mean_ctx = p as f64 + (got - 1) as f64 / 2.0;
                r.kv_gb_s = r
                    .value
                    .map(|v| info.kv_token_bytes as f64 * mean_ctx * v / 1e9);
                rows.push(r);
            }
            Kind::Prefill => {
                let v = timed
                    .iter()
                    .map(|o| p as f64 / o.ttft_s.max(1e-9))
                    .collect();
                rows.push(row(Workload::Prefill, "tok/s", v, valid));
            }
            Kind::Ttft => {
                let v = timed.iter().map(|o| o.ttft_s * 1e3).collect();
                rows.push(row(Workload::TtftCold, "ms", v, valid));
                // The same prompt under one salt: the first request fills the prefix cache.
                let warm = fresh();
                let first = once(&engine, request(ids.clone(), n_gen, warm.clone(), None))?;
                bar.inc(1);
                let mut cached = Vec::new();
                let mut ok = first.tokens == reference.tokens;
                for run in 0..a.runs {
                    let (turn_prompt, want) = if a.turn == 0 {
                        (ids.clone(), reference.tokens.clone())
                    } else {
                        // A new turn after the cached prompt; its untimed cold run under a
                        // fresh salt gives the tokens the cached run must give.
                        let mut t = ids.clone();
                        t.extend(turn_ids(1 + run as u64, a.turn, vocab));
                        let cold = once(&engine, request(t.clone(), n_gen, fresh(), None))?;
                        (t, cold.tokens)
                    };
                    let o = once(&engine, request(turn_prompt, n_gen, warm.clone(), None))?;
                    ok &= o.tokens == want;
                    cached.push(o.ttft_s * 1e3);
                    bar.inc(1);
                }
                let mut r = row(Workload::TtftCached, "ms", cached, ok);
                if a.turn > 0 {
                    r.prompt = Some((p + a.turn) as u64);
                    r.depth = Some(p as u64);
                }
                rows.push(r);
            }
        }
    }
    bar.finish_and_clear();
    engine.shutdown();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_deterministic_and_in_range() {
        let a = prompt_ids(300, 1000);
        assert_eq!(a, prompt_ids(300, 1000));
        assert!(a.iter().all(|&t| (100..900).contains(&t)));
    }
}
