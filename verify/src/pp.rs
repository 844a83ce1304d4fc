//! `memra-verify pp`: a model split over pipeline stages (engine/src/pipeline) gives the
//! unsplit model's bits. For each split (every layer boundary of a small model, several
//! spread ones of a large one, and the memory plan's own), the same workload runs on the
//! unsplit backend and on the split one: greedy generations at prefill chunkings 1, 7 and
//! whole (tokens and every position's logits bits), a seeded sampled generation (tokens:
//! the last stage picks them, on the device for CUDA), then steps of M = 1..max_m rows over
//! up to four fresh sequences and a decode step of each (every row's logits bits, or its
//! pick: greedy, seeded sampled with logprobs, or the logits), and finally the KV bytes of
//! every block written. Each split runs without micro-batches and with each count of
//! `--micro` (`--pp-micro`: a step's sequences cut into micro-batches, engine/src/pipeline/
//! micro.rs). Any difference fails the split.

use memra_engine::backend::{Backend, Device, OpenOptions, SelectParams, StepBatch, StepRow};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::ModelWeights;
use memra_engine::models::random::splitmix;
use memra_engine::pipeline::{self, PpConfig};
use memra_engine::sampling::SamplingParams;
use memra_engine::{Error, Result};

/// The workload's sizes.
#[derive(Clone, Debug)]
pub struct Options {
    pub prompt_len: usize,
    /// Rows of the largest batch step.
    pub max_m: usize,
    /// Tokens per generation.
    pub gen_tokens: usize,
    pub seed: u64,
    pub threads: usize,
    pub kv_dtype: memra_engine::backend::KvDtype,
    /// Stages of each split.
    pub stages: usize,
    /// One device per stage (empty: every stage on the gate's device).
    pub devices: Vec<Device>,
    /// The splits to check (each the first layers of stages 1..); `None`: chosen here.
    pub splits: Option<Vec<Vec<usize>>>,
    /// The micro-batch counts each split runs with (`--pp-micro`; 1: none).
    pub micro: Vec<usize>,
    /// The hand-over between stages on two GPUs (`--pp-link`).
    pub link: pipeline::LinkChoice,
}

/// What one backend produced: labelled token lists, logits bits and KV block bytes.
#[derive(Debug, Default, PartialEq)]
pub struct Trace {
    pub tokens: Vec<(String, Vec<u32>)>,
    pub logits: Vec<(String, Vec<u32>)>,
    pub kv: Vec<Vec<u8>>,
}

/// Outcome of the gate.
#[derive(Debug, Default)]
pub struct PpReport {
    pub checks: usize,
    /// Per split checked: its summary line (devices, layers, bytes).
    pub splits: Vec<String>,
    pub failures: Vec<String>,
}

const CHUNKS: [usize; 3] = [1, 7, 0];
const SEQS: usize = 4;
const BS: usize = 16;

/// Row counts of the batch steps: 1, 2, 3, 5, 8, ... up to `max_m` (and `max_m`).
fn shapes(max_m: usize) -> Vec<usize> {
    let (mut v, mut a, mut b) = (Vec::new(), 1, 2);
    while a < max_m {
        v.push(a);
        (a, b) = (b, a + b);
    }
    v.push(max_m.max(1));
    v
}

/// KV blocks the workload writes.
pub fn blocks_needed(o: &Options) -> usize {
    let gen_blocks = (o.prompt_len + o.gen_tokens).div_ceil(BS);
    let batch: usize = shapes(o.max_m)
        .iter()
        .map(|&m| SEQS.min(m) * (m + 1).div_ceil(BS))
        .sum();
    gen_blocks + batch
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn tokens(seed: u64, stream: u64, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (splitmix(seed, stream, i) % vocab as u64) as u32)
        .collect()
}

/// Runs the workload on `b`.
pub fn trace(b: &mut dyn Backend, o: &Options) -> Result<Trace> {
    let vocab = b.config().vocab;
    let mut t = Trace::default();
    let prompt = tokens(o.seed, 1, o.prompt_len, vocab);
    for chunk in CHUNKS {
        let mut req = GenRequest::greedy(prompt.clone(), o.gen_tokens);
        req.prefill_chunk = chunk;
        req.keep_logits = true;
        let out = generate(b, &req, &mut |_| Ok(()))?;
        for (i, l) in out.logits.iter().enumerate() {
            t.logits
                .push((format!("greedy chunk {chunk} token {i}"), bits(l)));
        }
        t.tokens.push((format!("greedy chunk {chunk}"), out.tokens));
    }
    let mut sampled = GenRequest::greedy(prompt, o.gen_tokens);
    sampled.params = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 40,
        seed: o.seed,
        ..SamplingParams::default()
    };
    sampled.prefill_chunk = 7;
    let out = generate(b, &sampled, &mut |_| Ok(()))?;
    t.tokens.push(("sampled".into(), out.tokens));
    let mut next_block = (o.prompt_len + o.gen_tokens).div_ceil(BS) as u32;
    for (si, m) in shapes(o.max_m).into_iter().enumerate() {
        let k = SEQS.min(m);
        // Sequence j prefills len[j] rows from position 0; the lengths sum to m.
        let lens: Vec<usize> = (0..k).map(|j| m / k + usize::from(j < m % k)).collect();
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&len| {
                let n = (len + 1).div_ceil(BS) as u32;
                let table = (next_block..next_block + n).collect();
                next_block += n;
                table
            })
            .collect();
        let seq_tokens: Vec<Vec<u32>> = lens
            .iter()
            .enumerate()
            .map(|(j, &len)| tokens(o.seed, 100 + (si * SEQS + j) as u64, len + 1, vocab))
            .collect();
        let step = |rows: Vec<StepRow>| StepBatch {
            rows,
            block_tables: tables.clone(),
            state_slots: (1..=k as u32).collect(),
            embeds: Vec::new(),
            mrope: Vec::new(),
        };
        let mut rows = Vec::new();
        for (j, (len, toks)) in lens.iter().zip(&seq_tokens).enumerate() {
            for (p, &token) in toks.iter().take(*len).enumerate() {
                rows.push(StepRow {
                    token,
                    pos: p as u32,
                    seq: j,
                    want_logits: true,
                });
            }
        }
        let out = b.step(&step(rows))?;
        for (r, l) in out.logits.iter().enumerate() {
            t.logits.push((format!("M={m} row {r}"), bits(l)));
        }
        let decode = (0..k)
            .map(|j| StepRow {
                token: seq_tokens[j][lens[j]],
                pos: lens[j] as u32,
                seq: j,
                want_logits: true,
            })
            .collect();
        // Sequence j's pick: its logits (j % 3 == 0), greedy (1), or seeded sampled with
        // its four most likely alternatives (2).
        let sampled = SamplingParams {
            temperature: 0.9,
            top_k: 20,
            seed: o.seed + si as u64,
            ..SamplingParams::default()
        };
        let greedy = SamplingParams::default();
        let select: Vec<Option<SelectParams>> = (0..k)
            .map(|j| {
                let params = match j % 3 {
                    0 => return None,
                    1 => &greedy,
                    _ => &sampled,
                };
                Some(SelectParams {
                    params,
                    history: &seq_tokens[j][..=lens[j]],
                    pos: lens[j] as u64,
                    mask: None,
                })
            })
            .collect();
        let logprobs: Vec<Option<usize>> = (0..k).map(|j| (j % 3 == 2).then_some(4)).collect();
        let out = b.step_select_logprobs(&step(decode), &select, &logprobs)?;
        for (j, s) in out.rows.iter().enumerate() {
            let (kind, mut v) = s.bits();
            v.insert(0, kind.into());
            t.logits
                .push((format!("M={m} decode of sequence {j} (pick)"), v));
        }
    }
    for blk in 0..next_block {
        t.kv.push(b.kv_block_bytes(blk)?);
    }
    Ok(t)
}

/// The differences of `got` from `base`, each a line naming the split and the first
/// position that differs; and the number of values compared.
pub fn compare(base: &Trace, got: &Trace, label: &str) -> (usize, Vec<String>) {
    let mut fails = Vec::new();
    let pairs =
        |a: &[(String, Vec<u32>)], b: &[(String, Vec<u32>)], what: &str, f: &mut Vec<String>| {
            if a.len() != b.len() {
                f.push(format!(
                    "{label}: {} {what} entries vs {} unsplit",
                    b.len(),
                    a.len()
                ));
            }
            for ((name, x), (_, y)) in a.iter().zip(b) {
                if x != y {
                    f.push(format!(
                        "{label}: {what} of {name} differ from the unsplit model's"
                    ));
                }
            }
        };
    pairs(&base.tokens, &got.tokens, "tokens", &mut fails);
    pairs(&base.logits, &got.logits, "logits bits", &mut fails);
    if base.kv.len() != got.kv.len() {
        fails.push(format!(
            "{label}: {} KV blocks vs {} unsplit",
            got.kv.len(),
            base.kv.len()
        ));
    }
    for (i, (x, y)) in base.kv.iter().zip(&got.kv).enumerate() {
        if x != y {
            fails.push(format!(
                "{label}: KV block {i} bytes differ from the unsplit model's"
            ));
        }
    }
    (base.tokens.len() + base.logits.len() + base.kv.len(), fails)
}

/// The splits to check for `stages` stages of `n` layers: every boundary set of a model of
/// at most 8 layers (two stages) or evenly spread ones, plus `None` (the memory plan's).
pub fn default_splits(n: usize, stages: usize) -> Vec<Option<Vec<usize>>> {
    let mut out: Vec<Option<Vec<usize>>> = vec![None];
    if stages == 2 {
        let cand: Vec<usize> = if n <= 8 {
            (1..n).collect()
        } else {
            vec![1, n / 4, n / 2, 3 * n / 4, n - 1]
        };
        let mut seen = Vec::new();
        for c in cand.into_iter().filter(|&c| c > 0 && c < n) {
            if !seen.contains(&c) {
                seen.push(c);
                out.push(Some(vec![c]));
            }
        }
    } else if stages > 2 && stages <= n {
        // Even spacing, and the first stages of one layer each.
        out.push(Some((1..stages).map(|i| i * n / stages).collect()));
        out.push(Some((1..stages).collect()));
    }
    out
}

/// Runs the gate: the unsplit model on `device`, then each split.
pub fn run(w: &ModelWeights, device: Device, o: &Options) -> Result<PpReport> {
    if o.stages < 2 {
        return Err(Error::Input("pp: --pp must be at least 2".into()));
    }
    if o.prompt_len == 0 || o.max_m == 0 || o.gen_tokens == 0 {
        return Err(Error::Input(
            "pp: --prompt-len, --max-m and --gen-tokens must be > 0".into(),
        ));
    }
    let opts = OpenOptions {
        kv_blocks: blocks_needed(o),
        block_size: BS,
        threads: o.threads,
        graphs: memra_engine::backend::cuda::graphs_default(),
        kv_dtype: o.kv_dtype,
        state_slots: SEQS + 1,
    };
    let base = {
        let mut b = memra_engine::backend::open_backend_opts(device, w.clone(), &opts)?;
        trace(b.as_mut(), o)?
    };
    let splits: Vec<Option<Vec<usize>>> = match &o.splits {
        Some(s) => s.iter().cloned().map(Some).collect(),
        None => default_splits(w.config.n_layers, o.stages),
    };
    let mut rep = PpReport::default();
    let micro = match o.micro.is_empty() {
        true => vec![1],
        false => o.micro.clone(),
    };
    for split in splits {
        for &mb in &micro {
            let pp = PpConfig {
                stages: o.stages,
                devices: o.devices.clone(),
                split: split.clone(),
                micro: mb,
                link: o.link,
            };
            let mut b = pipeline::open(device, w.clone(), &opts, &pp)?;
            let summary = b.pipeline().unwrap_or_default();
            let label = match &split {
                Some(s) => format!("split at {s:?}, micro-batches {mb}"),
                None => format!("planned split, micro-batches {mb}"),
            };
            let got = trace(b.as_mut(), o)?;
            let (n, fails) = compare(&base, &got, &label);
            rep.checks += n;
            rep.failures.extend(fails);
            rep.splits.push(format!("{label}: {summary}"));
        }
    }
    Ok(rep)
}
