//! `memra-verify graph`: the CUDA graph path gives the plain path's bits, and device token
//! selection gives the host's tokens.
//!
//! 1. For M = 1..max_m: a batch of the target row (the prompt's last row) and M - 1 random rows
//!    (random tokens, positions, want_logits) runs plainly, then the same batch runs as a graph
//!    (bucket replays with fresh inputs every time): every returned logits row and every KV block
//!    must have the same bits. Re-running a batch rewrites its KV slots with the same values, so
//!    the second run starts from the state the first one saw.
//! 2. Whole generations (greedy, and seeded sampling with top-k, top-p, min-p, penalties), graphs
//!    on and off, tokens picked on the device (`step_select`) and on the host from the logits
//!    (`keep_logits`): all four token lists must be equal.

use memra_engine::backend::Backend;
use memra_engine::backend::StepBatch;
use memra_engine::backend::StepRow;
use memra_engine::backend::cuda::CudaBackend;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::random::splitmix;
use memra_engine::sampling::SamplingParams;
use memra_engine::{Error, Result};

use crate::invariance::InvReport;

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn all_kv(b: &CudaBackend) -> Result<Vec<Vec<u8>>> {
    (0..b.kv_blocks() as u32)
        .map(|i| b.kv_block_bytes(i))
        .collect()
}

/// KV blocks [`run`] needs.
pub fn blocks_needed(prompt_len: usize, gen_tokens: usize, bs: usize) -> usize {
    // Prompt table, a filler table of 64 positions, and the generations' blocks 0.. (reused).
    let gen_blocks = (prompt_len + gen_tokens).div_ceil(bs);
    gen_blocks + prompt_len.div_ceil(bs) + 64usize.div_ceil(bs) + 1
}

/// Runs the check on `b` (graphs are switched on and off as needed).
pub fn run(
    b: &mut CudaBackend,
    seed: u64,
    prompt_len: usize,
    max_m: usize,
    gen_tokens: usize,
) -> Result<InvReport> {
    let bs = b.kv_block_size();
    let vocab = b.config().vocab as u64;
    let gen_blocks = (prompt_len + gen_tokens).div_ceil(bs);
    let nb = prompt_len.div_ceil(bs);
    let prompt_table: Vec<u32> = (gen_blocks..gen_blocks + nb).map(|v| v as u32).collect();
    let fill_start = gen_blocks + nb;
    let fill_n = 64usize.div_ceil(bs) + 1;
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
        rows,
        block_tables: vec![prompt_table.clone()],
    })?;

    let mut stream = 0u64;
    let mut rnd = |n: u64| {
        stream += 1;
        splitmix(seed, 12, stream) % n.max(1)
    };
    let fill_cap = (fill_n * bs) as u64;
    for m in 1..=max_m {
        let mut rows = vec![StepRow {
            token: prompt[prompt_len - 1],
            pos: (prompt_len - 1) as u32,
            seq: 0,
            want_logits: true,
        }];
        let mut used = Vec::new();
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
        // The target at a random place.
        let at = rnd(rows.len() as u64) as usize;
        rows.swap(0, at);
        let mut tables = vec![prompt_table.clone()];
        tables.extend(std::iter::repeat_n(fill_table.clone(), rows.len() - 1));
        let batch = StepBatch {
            rows,
            block_tables: tables,
        };
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
    Ok(rep)
}
