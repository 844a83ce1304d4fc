//! `memra-bench concurrency`: aggregate decode throughput of the engine loop at several numbers
//! of concurrent sequences (a benchmark, not a test). Every level submits C requests at once,
//! each with its own prompt of `prompt_len` random token ids, greedy, `gen_tokens` tokens each (EOS
//! ignored), and measures the wall time until all are done.

use std::path::Path;
use std::time::Instant;

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig};
use memra_engine::error::{Error, Result};
use memra_engine::loader::load_model;
use memra_engine::models::random::splitmix;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::scheduler::SchedulerConfig;
use memra_engine::testing::text_request;

/// What to measure.
#[derive(Clone, Debug)]
pub struct ConcurrencyArgs {
    pub device: Device,
    pub levels: Vec<usize>,
    pub prompt_len: usize,
    pub gen_tokens: usize,
    /// Per-step token budget of the scheduler.
    pub max_batch_tokens: usize,
}

/// One level's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LevelResult {
    pub concurrency: usize,
    pub generated_tokens: usize,
    pub wall_s: f64,
    /// Generated tokens / wall time, prefill included.
    pub aggregate_tok_s: f64,
    /// Mean time to first token.
    pub mean_ttft_s: f64,
    /// Generated tokens after the first / time after the last first token.
    pub decode_tok_s: f64,
}

fn request(i: usize, prompt_len: usize, gen_tokens: usize, vocab: usize) -> ValidRequest {
    let prompt = (0..prompt_len as u64)
        .map(|j| (100 + splitmix(17, i as u64, j) % (vocab as u64 - 200)) as u32)
        .collect();
    ValidRequest {
        model: "bench".into(),
        tenant: format!("bench-{i}"),
        speculative: true,
        ..text_request(prompt, gen_tokens)
    }
}

/// Drains one stream; returns (generated tokens, time of the first token).
fn drain(mut s: EventStream, t0: Instant) -> Result<(usize, f64)> {
    let (mut n, mut first) = (0usize, None);
    loop {
        match s.blocking_recv() {
            Some(Event::Token(_)) => {
                n += 1;
                first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
            }
            Some(Event::Text(_)) => {}
            Some(Event::Done { usage, .. }) => {
                return Ok((usage.completion_tokens, first.unwrap_or(0.0)));
            }
            Some(Event::Error(e)) => return Err(Error::Input(format!("request failed: {e}"))),
            None => {
                return Err(Error::Input(format!(
                    "stream ended after {n} tokens without Done"
                )));
            }
        }
    }
}

/// Runs every level on one engine.
pub fn run(model: &Path, args: &ConcurrencyArgs) -> Result<Vec<LevelResult>> {
    let m = load_model(model)?;
    let vocab = m.config.vocab;
    let max = args.levels.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig {
        device: args.device,
        scheduler: SchedulerConfig {
            max_batch_tokens: args.max_batch_tokens,
            max_running: max.max(1),
            max_running_per_tenant: max.max(1),
            ..SchedulerConfig::default()
        },
        prefix_cache: false,
        spec: None,
        ..EngineConfig::default()
    };
    let limits = AdmissionLimits {
        max_in_flight_per_tenant: max * 2,
        max_queued: max * 2,
    };
    let engine = Engine::start(vec![("bench".into(), m, cfg)], limits)?;
    let mut out = Vec::new();
    for &c in &args.levels {
        let t0 = Instant::now();
        let streams = (0..c)
            .map(|i| {
                engine
                    .submit(request(i, args.prompt_len, args.gen_tokens, vocab))
                    .map_err(|e| Error::Input(format!("submit: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let handles: Vec<_> = streams
            .into_iter()
            .map(|s| std::thread::spawn(move || drain(s, t0)))
            .collect();
        let mut results = Vec::new();
        for h in handles {
            results.push(
                h.join()
                    .map_err(|_| Error::Input("a reader thread panicked".into()))??,
            );
        }
        let wall = t0.elapsed().as_secs_f64();
        let generated: usize = results.iter().map(|r| r.0).sum();
        let last_first = results.iter().map(|r| r.1).fold(0.0, f64::max);
        let mean_ttft = results.iter().map(|r| r.1).sum::<f64>() / c.max(1) as f64;
        out.push(LevelResult {
            concurrency: c,
            generated_tokens: generated,
            wall_s: wall,
            aggregate_tok_s: generated as f64 / wall.max(1e-9),
            mean_ttft_s: mean_ttft,
            decode_tok_s: generated.saturating_sub(c) as f64 / (wall - last_first).max(1e-9),
        });
    }
    engine.shutdown();
    Ok(out)
}
