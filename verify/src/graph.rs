//! `memra-verify graph`: the CUDA graph path gives the plain path's bits, and device token
//! selection gives the host's tokens.
//!
//! 1. For M = 1..max_m: a batch of the target row (the prompt's last row) and M - 1 random rows
//!    (random tokens, positions, want_logits) runs plainly, then the same batch runs as a graph
//!    (bucket replays with fresh inputs every time): every returned logits row and every KV block
//!    must have the same bits. Re-running a batch rewrites its KV slots with the same values, so
//!    the second run starts from the state the first one saw. A model with a recurrent state
//!    per sequence (qwen3next) gets random rows that start their sequences (position 0, a
//!    KV block each): a row deeper in a sequence needs that sequence's state.
//! 2. Whole generations (greedy, and seeded sampling with top-k, top-p, min-p, penalties), graphs
//!    on and off, tokens picked on the device (`step_select`) and on the host from the logits
//!    (`keep_logits`): all four token lists must be equal.
//! 3. Grammar masks given late (`step_select_lazy_masks`: the engine's structured-output path,
//!    the masks computed while the device runs the forward) against the same step with the
//!    masks in `select` from the start (`step_select_logprobs`), graphs off and on, on batches
//!    of the step-1 kind and on the whole prompt with random rows (past the largest bucket with
//!    the default sizes: plain even with graphs on): the same tokens, logprob bits, logits bits
//!    and KV bytes. Rows mix masked and unmasked, greedy, top-k 40 (device) and no top-k
//!    (host-planned) sampling, logprobs and logits rows; masks are dense, sparse, one token or
//!    none. It also counts the lazy steps whose forward was still running on the device when
//!    the masks were asked for (the overlap; reported, not gated: a small step may be done by
//!    then).

use memra_engine::backend::cuda::{CudaBackend, CudaOps};
use memra_engine::backend::{Backend, SelectParams, Selected, StepBatch, StepMasks, StepRow};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::random::splitmix;
use memra_engine::sampling::SamplingParams;
use memra_engine::{Error, Result};

use crate::case::same_bits;
use crate::invariance::InvReport;

/// A CUDA backend whose steps may run as CUDA graphs: one model, or a model split over
/// pipeline stages (`memra-verify graph --pp 2`: each stage captures its own graphs).
pub trait GraphBackend: Backend {
    fn set_graphs(&mut self, on: bool);
    /// (captures, replays) so far.
    fn graph_counts(&self) -> (u64, u64);
    /// Whether the device still runs queued work (the last stage's stream).
    fn busy_probe(&self) -> Box<dyn Fn() -> Result<bool>>;
}

impl GraphBackend for CudaBackend {
    fn set_graphs(&mut self, on: bool) {
        CudaBackend::set_graphs(self, on)
    }
    fn graph_counts(&self) -> (u64, u64) {
        CudaBackend::graph_counts(self)
    }
    fn busy_probe(&self) -> Box<dyn Fn() -> Result<bool>> {
        Box::new(self.gpu().busy_probe())
    }
}

impl GraphBackend for memra_engine::pipeline::Pipeline<CudaOps> {
    fn set_graphs(&mut self, on: bool) {
        self.stages_mut().iter_mut().for_each(|s| s.set_graphs(on));
    }
    fn graph_counts(&self) -> (u64, u64) {
        self.stages()
            .iter()
            .map(|s| s.graph_counts())
            .fold((0, 0), |(c, r), (a, b)| (c + a, r + b))
    }
    fn busy_probe(&self) -> Box<dyn Fn() -> Result<bool>> {
        let last = &self.stages()[self.stages().len() - 1];
        Box::new(last.gpu().busy_probe())
    }
}

fn all_kv(b: &dyn Backend) -> Result<Vec<Vec<u8>>> {
    (0..b.kv_blocks() as u32)
        .map(|i| b.kv_block_bytes(i))
        .collect()
}

/// KV blocks of the random rows: a table of 64 positions, or one block per row (up to 64)
/// for a recurrent-state model.
fn filler_blocks(bs: usize, recurrent: bool) -> usize {
    match recurrent {
        true => 64,
        false => 64usize.div_ceil(bs) + 1,
    }
}

/// KV blocks [`run`] needs (`recurrent`: a recurrent-state model's random rows).
pub fn blocks_needed(prompt_len: usize, gen_tokens: usize, bs: usize, recurrent: bool) -> usize {
    // Prompt table, the random rows' blocks, and the generations' blocks 0.. (reused).
    let gen_blocks = (prompt_len + gen_tokens).div_ceil(bs);
    gen_blocks + prompt_len.div_ceil(bs) + filler_blocks(bs, recurrent)
}

/// What [`run`] found.
#[derive(Debug, Default)]
pub struct GraphReport {
    pub inv: InvReport,
    /// Of the lazy-mask steps (check 3), how many found the forward still running on the
    /// device when they asked for the masks, and how many there were.
    pub overlapped: (usize, usize),
}

/// Runs the check on `b` (graphs are switched on and off as needed).
pub fn run(
    b: &mut dyn GraphBackend,
    seed: u64,
    prompt_len: usize,
    max_m: usize,
    gen_tokens: usize,
) -> Result<GraphReport> {
    let bs = b.kv_block_size();
    let vocab = b.config().vocab as u64;
    let gen_blocks = (prompt_len + gen_tokens).div_ceil(bs);
    let nb = prompt_len.div_ceil(bs);
    let prompt_table: Vec<u32> = (gen_blocks..gen_blocks + nb).map(|v| v as u32).collect();
    let fill_start = gen_blocks + nb;
    let recurrent = b.config().arch.is_recurrent();
    let fill_n = filler_blocks(bs, recurrent);
    if fill_start + fill_n > b.kv_blocks() {
        return Err(Error::Input(format!(
            "graph check needs {} KV blocks, the backend has {}",
            fill_start + fill_n,
            b.kv_blocks()
        )));
    }
    let fill_table: Vec<u32> = (fill_start..fill_start + fill_n)
        .map(|v| v as u32)
        .collect();
    let prompt: Vec<u32> = (0..prompt_len as u64)
        .map(|i| (splitmix(seed, 11, i) % vocab) as u32)
        .collect();
    let mut rep = InvReport::default();

    // The prompt, plainly (whole, so more than one bucket's rows when long).
    b.set_graphs(false);
    let rows: Vec<StepRow> = prompt
        .iter()
        .enumerate()
        .map(|(p, &t)| StepRow {
            token: t,
            pos: p as u32,
            seq: 0,
            want_logits: false,
        })
        .collect();
    b.step(&StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![prompt_table.clone()],
        state_slots: Vec::new(),
    })?;

    let mut stream = 0u64;
    let mut rnd = |n: u64| {
        stream += 1;
        splitmix(seed, 12, stream) % n.max(1)
    };
    let fill_cap = (fill_n * bs) as u64;
    // M rows: the target row (the prompt's last, wants logits) at a random place and M - 1
    // random rows, each its own sequence over the filler table at a distinct position.
    let mut random_batch = |m: usize| {
        let mut rows = vec![StepRow {
            token: prompt[prompt_len - 1],
            pos: (prompt_len - 1) as u32,
            seq: 0,
            want_logits: true,
        }];
        let mut used = Vec::new();
        while rows.len() < m && recurrent {
            rows.push(StepRow {
                token: rnd(vocab) as u32,
                pos: 0,
                seq: rows.len(),
                want_logits: rnd(2) == 0,
            });
        }
        while rows.len() < m && (used.len() as u64) < fill_cap {
            let pos = rnd(fill_cap) as u32;
            if used.contains(&pos) {
                continue;
            }
            used.push(pos);
            rows.push(StepRow {
                token: rnd(vocab) as u32,
                pos,
                seq: rows.len(),
                want_logits: rnd(2) == 0,
            });
        }
        let at = rnd(rows.len() as u64) as usize;
        rows.swap(0, at);
        let mut tables = vec![prompt_table.clone()];
        match recurrent {
            true => tables.extend(fill_table[..rows.len() - 1].iter().map(|&b| vec![b])),
            false => tables.extend(std::iter::repeat_n(fill_table.clone(), rows.len() - 1)),
        }
        StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows,
            block_tables: tables,
            state_slots: Vec::new(),
        }
    };
    for m in 1..=max_m {
        let batch = random_batch(m);
        b.set_graphs(false);
        let plain = b.step(&batch)?;
        let plain_kv = all_kv(b)?;
        b.set_graphs(true);
        let graph = b.step(&batch)?;
        let graph_kv = all_kv(b)?;
        rep.checks += 2;
        let same = plain.logits.len() == graph.logits.len()
            && plain
                .logits
                .iter()
                .zip(&graph.logits)
                .all(|(a, g)| same_bits(a, g));
        if !same {
            rep.failures
                .push(format!("M={m}: graph logits differ from the plain step's"));
        }
        if plain_kv != graph_kv {
            rep.failures
                .push(format!("M={m}: KV bytes after the graph step differ"));
        }
    }
    // 3. Lazy masks: step-1 batches, and the prompt again with random rows (past the largest
    // bucket with the default sizes: plain even with graphs on).
    let mut overlapped = (0, 0);
    let mut sizes: Vec<usize> = [1, 2, 7, 16, 33, 64]
        .into_iter()
        .filter(|&m| m <= max_m)
        .collect();
    sizes.push(max_m);
    sizes.dedup();
    let mut batches: Vec<StepBatch> = sizes.into_iter().map(&mut random_batch).collect();
    // The random rows of a max_m batch, then the whole prompt (sequence 0, in position
    // order), every row picking.
    let mut big = random_batch(max_m);
    big.rows.retain(|r| r.seq != 0);
    big.rows
        .extend(prompt.iter().enumerate().map(|(p, &t)| StepRow {
            token: t,
            pos: p as u32,
            seq: 0,
            want_logits: true,
        }));
    batches.push(big);
    for (i, batch) in batches.iter().enumerate() {
        let (o, n) = lazy_masks(b, seed ^ ((i as u64) << 8), batch, &mut rep)?;
        overlapped.0 += o;
        overlapped.1 += n;
    }

    let (captures, replays) = b.graph_counts();
    rep.checks += 1;
    if max_m > 0 && (replays < max_m as u64 || captures == 0) {
        rep.failures.push(format!(
            "graphs were not used: {captures} captures, {replays} replays for {max_m} steps"
        ));
    }

    // Whole generations.
    let configs = [
        ("greedy", SamplingParams::default()),
        (
            "greedy + penalties",
            SamplingParams {
                repetition_penalty: 1.3,
                frequency_penalty: 0.2,
                ..Default::default()
            },
        ),
        (
            "T=0.8 top-k 40 top-p 0.9",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.9,
                seed: seed ^ 0x5eed,
                ..Default::default()
            },
        ),
        (
            "T=1.2 top-k 200 min-p 0.02 penalties",
            SamplingParams {
                temperature: 1.2,
                top_k: 200,
                min_p: 0.02,
                repetition_penalty: 1.1,
                presence_penalty: 0.3,
                seed: seed ^ 0xbeef,
                ..Default::default()
            },
        ),
        (
            "T=1.0 no top-k (host-planned for large vocabularies)",
            SamplingParams {
                temperature: 1.0,
                top_p: 0.95,
                seed: seed ^ 0xfeed,
                ..Default::default()
            },
        ),
    ];
    for (name, params) in configs {
        let mut runs = Vec::new();
        for graphs in [false, true] {
            for keep_logits in [true, false] {
                b.set_graphs(graphs);
                let req = GenRequest {
                    params: params.clone(),
                    keep_logits,
                    ..GenRequest::greedy(prompt.clone(), gen_tokens)
                };
                let out = generate(b, &req, &mut |_| Ok(()))?;
                runs.push((graphs, keep_logits, out.tokens));
            }
        }
        rep.checks += 1;
        if let Some((_, _, first)) = runs.first()
            && let Some((g, k, t)) = runs.iter().find(|r| &r.2 != first)
        {
            let at = t.iter().zip(first).position(|(a, b)| a != b).unwrap_or(0);
            rep.failures.push(format!(
                "generation `{name}`: graphs {g}, {} differs from plain host selection at \
                 token {at}",
                if *k {
                    "host selection"
                } else {
                    "device selection"
                }
            ));
        }
    }
    Ok(GraphReport {
        inv: rep,
        overlapped,
    })
}

/// A step's selection results as bits (per picking row: a tag, then the token, logprob and
/// alternatives, or the logits) and the KV bytes after it.
pub type StepBits = (Vec<(u8, Vec<u32>)>, Vec<Vec<u8>>);

/// One lazy-vs-eager comparison ([`lazy_and_eager`]).
#[derive(Debug)]
pub struct LazyCheck {
    /// `step_select_logprobs` with the masks in `select`: the results as bits, the KV bytes.
    pub eager: StepBits,
    /// `step_select_lazy_masks` with the same masks from its callback.
    pub lazy: StepBits,
    /// Whether `busy` said the device was still running when the masks were asked for.
    pub overlapped: bool,
    /// Rows that had a mask.
    pub masked: usize,
}

/// Check 3's step on `batch` (see the module comment), on any backend: the same picking rows
/// (random parameters, histories and masks from `seed`) with the masks up front, then from the
/// callback of `step_select_lazy_masks`, which asks `busy` first.
pub fn lazy_and_eager(
    b: &mut dyn Backend,
    seed: u64,
    batch: &StepBatch,
    busy: &dyn Fn() -> Result<bool>,
) -> Result<LazyCheck> {
    let vocab = b.config().vocab;
    let words = vocab.div_ceil(32);
    let params = [
        SamplingParams::default(),
        SamplingParams {
            repetition_penalty: 1.2,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            presence_penalty: 0.3,
            seed: seed ^ 0x1a2,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            seed: seed ^ 0x3b4,
            ..Default::default()
        },
    ];
    let want = batch.rows.iter().filter(|r| r.want_logits).count();
    let r = |i: usize, k: u64| splitmix(seed, 20 + k, i as u64);
    let histories: Vec<Vec<u32>> = (0..want)
        .map(|i| {
            (0..r(i, 0) % 30)
                .map(|j| (splitmix(seed, 30 + i as u64, j) % vocab as u64) as u32)
                .collect()
        })
        .collect();
    // Every seventh row returns its logits (no mask); every third wants logprobs.
    let logits_row = |i: usize| i % 7 == 6;
    let masks: StepMasks = (0..want)
        .map(|i| {
            let word = |w: usize| splitmix(seed, 40 + i as u64, w as u64) as u32;
            match r(i, 1) % 6 {
                _ if logits_row(i) => None,
                // Dense, sparse (about 1 in 8 allowed), one token, none.
                0 => Some((0..words).map(word).collect()),
                1 => Some(
                    (0..words)
                        .map(|w| word(w) & word(w + words) & word(w + 2 * words))
                        .collect(),
                ),
                2 => {
                    let t = (r(i, 2) % vocab as u64) as usize;
                    let mut m = vec![0u32; words];
                    m[t / 32] |= 1 << (t % 32);
                    Some(m)
                }
                3 => Some(vec![0u32; words]),
                _ => None,
            }
        })
        .collect();
    let logprobs: Vec<Option<usize>> = (0..want)
        .map(|i| (i % 3 == 1 && !logits_row(i)).then_some(1 + i % 4))
        .collect();
    let select = |with_masks: bool| -> Vec<Option<SelectParams>> {
        (0..want)
            .map(|i| {
                (!logits_row(i)).then(|| SelectParams {
                    params: &params[(r(i, 3) % 4) as usize],
                    history: &histories[i],
                    pos: histories[i].len() as u64,
                    mask: masks[i].as_deref().filter(|_| with_masks),
                })
            })
            .collect()
    };
    let eager = b.step_select_logprobs(batch, &select(true), &logprobs)?;
    let eager = (
        eager.rows.iter().map(Selected::bits).collect::<Vec<_>>(),
        all_kv(b)?,
    );
    let mut overlapped = false;
    let mut cb = || {
        overlapped = busy()?;
        Ok(masks.clone())
    };
    let lazy = b.step_select_lazy_masks(batch, &select(false), &logprobs, &mut cb)?;
    let lazy = (
        lazy.rows.iter().map(Selected::bits).collect::<Vec<_>>(),
        all_kv(b)?,
    );
    Ok(LazyCheck {
        eager,
        lazy,
        overlapped,
        masked: masks.iter().filter(|m| m.is_some()).count(),
    })
}

/// Check 3 on one batch, graphs off and on: the four results the same bits. Returns (lazy
/// steps whose forward was still running when the masks were asked for, lazy steps).
fn lazy_masks(
    b: &mut dyn GraphBackend,
    seed: u64,
    batch: &StepBatch,
    rep: &mut InvReport,
) -> Result<(usize, usize)> {
    let busy = b.busy_probe();
    let mut runs = Vec::new();
    let mut overlapped = 0;
    for graphs in [false, true] {
        b.set_graphs(graphs);
        let c = lazy_and_eager(b, seed, batch, &busy)?;
        overlapped += usize::from(c.overlapped);
        runs.push((graphs, "masks up front", c.eager));
        runs.push((graphs, "lazy masks", c.lazy));
    }
    rep.checks += 1;
    let m = batch.rows.len();
    let (_, _, (first, first_kv)) = &runs[0];
    for (graphs, how, (got, kv)) in &runs[1..] {
        if got != first {
            let at = got.iter().zip(first).position(|(a, b)| a != b).unwrap_or(0);
            rep.failures.push(format!(
                "lazy masks, M={m}: graphs {graphs}, {how}: picking row {at} differs from the \
                 plain step with the masks up front"
            ));
        }
        if kv != first_kv {
            rep.failures.push(format!(
                "lazy masks, M={m}: graphs {graphs}, {how}: KV bytes differ"
            ));
        }
    }
    Ok((overlapped, 2))
}
