//! Row invariance of the CPU reference backend (EXACTNESS.md): the same rows give the same bits
//! whatever the thread count, the prefill chunking, or the other rows in the batch.

use crate::common;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::config::Arch;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;

fn backend(arch: Arch, threads: usize, dtype: DType) -> CpuBackend {
    let cfg = tiny_config(arch, 300);
    let w = random_weights(&cfg, 7, dtype).expect("weights");
    let opts = CpuOptions {
        threads,
        kv_blocks: 32,
        block_size: 16,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 300).collect()
}

fn run(b: &mut CpuBackend, chunk: usize) -> (Vec<u32>, Vec<Vec<u32>>, Vec<Vec<u8>>) {
    let mut req = GenRequest::greedy(prompt(45), 12);
    req.prefill_chunk = chunk;
    req.keep_logits = true;
    let out = generate(b, &req, &mut |_| Ok(())).expect("generate");
    let bits = common::logit_bits(&out.logits);
    let kv = (0..4)
        .map(|blk| b.kv_block_bytes(blk).expect("kv"))
        .collect();
    (out.tokens, bits, kv)
}

#[test]
fn thread_count_does_not_change_bits() {
    for arch in [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Qwen3Moe,
    ] {
        let base = run(&mut backend(arch, 1, DType::F32), 0);
        for threads in [2, 3, 5] {
            let other = run(&mut backend(arch, threads, DType::F32), 0);
            assert_eq!(base, other, "{arch:?} with {threads} threads");
        }
    }
}

#[test]
fn prefill_chunking_does_not_change_bits() {
    for arch in [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Qwen3Moe,
    ] {
        let whole = run(&mut backend(arch, 2, DType::F32), 0);
        for chunk in [1, 7, 16] {
            let chunked = run(&mut backend(arch, 2, DType::F32), chunk);
            assert_eq!(whole, chunked, "{arch:?} chunk {chunk}");
        }
        assert_eq!(whole.0.len(), 12);
    }
}

/// Two sequences at different depths in one step give the rows they give alone.
#[test]
fn batch_neighbours_do_not_change_bits() {
    let mut solo = backend(Arch::Qwen3, 2, DType::F32);
    let mut pair = backend(Arch::Qwen3, 2, DType::F32);
    let a = prompt(20);
    let b: Vec<u32> = prompt(33).into_iter().rev().collect();
    let row = |t: u32, p: usize, seq: usize| StepRow {
        token: t,
        pos: p as u32,
        seq,
        want_logits: true,
    };
    // Alone: a in blocks 0..2, then b in blocks 4..7.
    let ta: Vec<u32> = vec![0, 1];
    let tb: Vec<u32> = vec![4, 5, 6];
    let solo_a = solo
        .step(&StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: a.iter().enumerate().map(|(p, &t)| row(t, p, 0)).collect(),
            block_tables: vec![ta.clone()],
            state_slots: Vec::new(),
        })
        .expect("step a");
    let solo_b = solo
        .step(&StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: b.iter().enumerate().map(|(p, &t)| row(t, p, 0)).collect(),
            block_tables: vec![tb.clone()],
            state_slots: Vec::new(),
        })
        .expect("step b");
    // Together, interleaved in one step.
    let mut rows = Vec::new();
    for i in 0..b.len() {
        if i < a.len() {
            rows.push(row(a[i], i, 0));
        }
        rows.push(row(b[i], i, 1));
    }
    let both = pair
        .step(&StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: rows.clone(),
            block_tables: vec![ta, tb],
            state_slots: Vec::new(),
        })
        .expect("step both");
    let (mut ia, mut ib) = (0, 0);
    for (r, l) in rows.iter().zip(&both.logits) {
        let want = if r.seq == 0 {
            ia += 1;
            &solo_a.logits[ia - 1]
        } else {
            ib += 1;
            &solo_b.logits[ib - 1]
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(l), bits(want), "row {r:?}");
    }
    for blk in [0, 1, 4, 5, 6] {
        assert_eq!(
            solo.kv_block_bytes(blk).unwrap(),
            pair.kv_block_bytes(blk).unwrap()
        );
    }
}

#[test]
fn bad_rows_are_clean_errors() {
    let mut b = backend(Arch::Llama, 1, DType::F32);
    let bad_token = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: vec![StepRow {
            token: 999,
            pos: 0,
            seq: 0,
            want_logits: true,
        }],
        block_tables: vec![vec![0]],
        state_slots: Vec::new(),
    };
    assert!(
        b.step(&bad_token)
            .unwrap_err()
            .to_string()
            .contains("vocabulary")
    );
    let beyond = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: vec![StepRow {
            token: 1,
            pos: 40,
            seq: 0,
            want_logits: true,
        }],
        block_tables: vec![vec![0]],
        state_slots: Vec::new(),
    };
    assert!(
        b.step(&beyond)
            .unwrap_err()
            .to_string()
            .contains("block table")
    );
}

/// `step_select_logprobs`' default: the same tokens and logprob values as `step` followed by
/// `sampling::sample` and `sampling::logprobs` on the host, row by row; rows without logprobs
/// come back as bare tokens.
#[test]
fn step_select_logprobs_matches_the_host_definition() {
    use memra_engine::backend::{SelectParams, Selected};
    use memra_engine::sampling::{SamplingParams, logprobs, sample};
    let batch = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: (0..3)
            .flat_map(|s| {
                prompt(5 + s)
                    .into_iter()
                    .enumerate()
                    .map(move |(p, token)| StepRow {
                        token,
                        pos: p as u32,
                        seq: s,
                        want_logits: p == 4 + s,
                    })
            })
            .collect(),
        block_tables: vec![vec![0], vec![1], vec![2]],
        state_slots: Vec::new(),
    };
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        seed: 9,
        ..Default::default()
    };
    let histories: Vec<Vec<u32>> = (0..3).map(|s| prompt(5 + s)).collect();
    let params = [&greedy, &sampled, &sampled];
    let select: Vec<Option<SelectParams>> = (0..3)
        .map(|s| {
            Some(SelectParams {
                params: params[s],
                history: &histories[s],
                pos: histories[s].len() as u64,
                mask: None,
            })
        })
        .collect();
    let want = [None, Some(5), Some(0)];
    let mut a = backend(Arch::Llama, 2, DType::Q8_0);
    let got = a.step_select_logprobs(&batch, &select, &want).unwrap().rows;
    let mut b = backend(Arch::Llama, 2, DType::Q8_0);
    let logits = b.step(&batch).unwrap().logits;
    for s in 0..3 {
        let sel = select[s].unwrap();
        let token = sample(&logits[s], sel.history, sel.params, sel.pos);
        let expect = match want[s] {
            None => Selected::Token(token),
            Some(n) => {
                let (logprob, top) = logprobs(&logits[s], sel.history, sel.params, token, n);
                assert_eq!(top.len(), n);
                Selected::Scored {
                    token,
                    logprob,
                    top,
                }
            }
        };
        assert_eq!(got[s], expect, "row {s}");
    }
}
