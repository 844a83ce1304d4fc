//! qwen3next (models/qwen3next.rs) on the CPU: gated DeltaNet layers with a recurrent state
//! give the same logit bits for every split of a sequence into steps (chunks of 1, 7, 16, 17,
//! the whole prompt), inside batches with other sequences, and after rejected speculative
//! drafts; GGUF and HF copies agree; malformed hybrid files are refused naming the problem.

use memra_engine::backend::cpu::CpuBackend;
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::formats::gguf::MetaValue;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;
use memra_engine::models::random::random_weights;
use memra_engine::models::{ModelWeights, qwen3next};
use memra_engine::quant::DType;
use memra_engine::testing::tiny_gguf::gguf_meta;

use crate::common::{self, bits};
use crate::qwen3_moe::{cpu, write_gguf_model, write_gguf_tensors, write_hf_model};

const VOCAB: usize = 300;

/// Four layers: DeltaNet, attention, DeltaNet, attention.
fn config() -> ModelConfig {
    common::four_layers(Arch::Qwen3Next, VOCAB)
}

fn tiny(seed: u64, dtype: DType) -> ModelWeights {
    random_weights(&config(), seed, dtype).expect("weights")
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    common::tokens(seed, n, VOCAB)
}

/// The step of rows `(token, pos, seq)` over `tables` / `slots`, every row wanting logits.
fn batch(rows: &[(u32, usize, usize)], tables: &[Vec<u32>], slots: &[u32]) -> StepBatch {
    StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: rows
            .iter()
            .map(|&(token, pos, seq)| StepRow {
                token,
                pos: pos as u32,
                seq,
                want_logits: true,
            })
            .collect(),
        block_tables: tables.to_vec(),
        state_slots: slots.to_vec(),
    }
}

/// Runs one step of rows `(token, pos, seq)` over `tables` / `slots`; the logit bits per row.
fn step(
    b: &mut CpuBackend,
    rows: &[(u32, usize, usize)],
    tables: &[Vec<u32>],
    slots: &[u32],
) -> Vec<Vec<u32>> {
    let batch = batch(rows, tables, slots);
    let out = b.step(&batch).expect("step");
    out.logits.iter().map(|l| bits(l)).collect()
}

/// Every position's logit bits of `toks` computed in steps of `chunk` rows (sequence 0, slot
/// `slot`, blocks `0..`).
fn chunked(b: &mut CpuBackend, toks: &[u32], chunk: usize, slot: u32) -> Vec<Vec<u32>> {
    let table: Vec<u32> = (0..toks.len().div_ceil(16) as u32).collect();
    let mut out = Vec::new();
    for start in (0..toks.len()).step_by(chunk) {
        let end = (start + chunk).min(toks.len());
        let rows: Vec<_> = (start..end).map(|p| (toks[p], p, 0)).collect();
        out.extend(step(b, &rows, std::slice::from_ref(&table), &[slot]));
    }
    out
}

#[test]
fn every_chunking_gives_the_same_bits() {
    let w = tiny(3, DType::Q8_0);
    let toks = tokens(1, 40);
    let whole = chunked(&mut cpu(w.clone()), &toks, 40, 0);
    assert_eq!(whole.len(), 40);
    for chunk in [1, 7, 16, 17] {
        // A fresh backend, and a reused one whose slot held another sequence first.
        let mut b = cpu(w.clone());
        chunked(&mut b, &tokens(2, 23), 5, 3);
        let got = chunked(&mut b, &toks, chunk, 3);
        assert_eq!(got, whole, "chunks of {chunk}");
    }
}

#[test]
fn a_sequence_does_not_depend_on_its_batch() {
    let w = tiny(4, DType::F16);
    let (a, c) = (tokens(3, 30), tokens(4, 21));
    let alone_a = chunked(&mut cpu(w.clone()), &a, 30, 0);
    let alone_c = chunked(&mut cpu(w.clone()), &c, 21, 0);
    // Both in every step, in chunks of 7 and 4, in slots 5 and 2, rows interleaved.
    let mut b = cpu(w);
    let tables = vec![vec![0, 1], vec![2, 3]];
    let (mut got_a, mut got_c) = (Vec::new(), Vec::new());
    let (mut pa, mut pc) = (0, 0);
    while pa < a.len() || pc < c.len() {
        let ea = (pa + 7).min(a.len());
        let ec = (pc + 4).min(c.len());
        let mut rows = Vec::new();
        let (mut i, mut j) = (pa, pc);
        while i < ea || j < ec {
            if j < ec {
                rows.push((c[j], j, 1));
                j += 1;
            }
            if i < ea {
                rows.push((a[i], i, 0));
                i += 1;
            }
        }
        let out = step(&mut b, &rows, &tables, &[5, 2]);
        for (r, l) in rows.iter().zip(out) {
            match r.2 {
                0 => got_a.push(l),
                _ => got_c.push(l),
            }
        }
        (pa, pc) = (ea, ec);
    }
    assert_eq!(got_a, alone_a);
    assert_eq!(got_c, alone_c);
}

/// A verify step whose drafts are rejected part-way, then decoding resumes after the last
/// accepted one: every committed position's bits equal plain decoding's.
#[test]
fn rejected_drafts_roll_the_state_back() {
    let w = tiny(5, DType::Q8_0);
    let toks = tokens(5, 34);
    let plain = chunked(&mut cpu(w.clone()), &toks, 1, 0);
    let mut b = cpu(w);
    let table = vec![vec![0, 1, 2]];
    let run = |b: &mut CpuBackend, from: usize, to: usize, wrong_from: usize| {
        let rows: Vec<_> = (from..to)
            .map(|p| match p >= wrong_from {
                true => ((toks[p] + 1) % VOCAB as u32, p, 0),
                false => (toks[p], p, 0),
            })
            .collect();
        step(b, &rows, &table, &[0])
    };
    let mut got = run(&mut b, 0, 10, usize::MAX);
    // Drafts 10..=15, wrong from 12: rows 10 and 11 are committed.
    got.extend(run(&mut b, 10, 16, 12).into_iter().take(2));
    // Resume at 12; a verify step of 12 rows (past the ring's span) all accepted.
    got.extend(run(&mut b, 12, 24, usize::MAX));
    // Drafts 24..=31 wrong from 25: only 24 kept; then decode the rest one by one.
    got.extend(run(&mut b, 24, 32, 25).into_iter().take(1));
    for p in 25..34 {
        got.extend(run(&mut b, p, p + 1, usize::MAX));
    }
    assert_eq!(got.len(), plain.len());
    for (p, (g, e)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g, e, "position {p}");
    }
    // Resuming before the committed position (at most RING - 1 back) is refused, not
    // computed wrongly.
    let e = b.step(&batch(&[(toks[5], 5, 0)], &table, &[0]));
    let e = e.unwrap_err().to_string();
    assert!(e.contains("can resume at positions"), "{e}");
}

#[test]
fn gguf_and_hf_copies_agree() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny(6, DType::F32);
    let gguf = dir.path().join("next.gguf");
    write_gguf_model(&w, &gguf);
    let hf = dir.path().join("next-hf");
    let tensors = qwen3next::hf_tensors(&w).expect("hf tensors");
    assert!(
        tensors
            .iter()
            .any(|(n, _)| n.ends_with("in_proj_qkvz.weight"))
    );
    assert!(tensors.iter().any(|(n, _)| n.ends_with("A_log")));
    write_hf_model(&hf, w.config.to_hf_json(None, None), &tensors);
    let (g, h) = (load_weights(&gguf).unwrap(), load_weights(&hf).unwrap());
    assert_eq!(g.config, w.config);
    assert_eq!(h.config, w.config);
    let run = |w: ModelWeights| {
        let mut req = GenRequest::greedy(tokens(7, 12), 8);
        req.keep_logits = true;
        req.prefill_chunk = 5;
        generate(&mut cpu(w), &req, &mut |_| Ok(())).expect("generate")
    };
    let (a, b, c) = (run(g), run(h), run(w));
    // GGUF holds the internal values: bit for bit.
    assert_eq!(a.tokens, c.tokens);
    assert_eq!(a.logits, c.logits);
    // HF holds A_log and norms minus one: the round trip may move the last bits only.
    assert_eq!(a.tokens, b.tokens);
    for (x, y) in a.logits.iter().zip(&b.logits) {
        for (u, v) in x.iter().zip(y) {
            assert!((u - v).abs() <= 1e-4 * (1.0 + u.abs()), "{u} vs {v}");
        }
    }
}

/// With an MTP module: GGUF (`blk.4.nextn.*` and the layer under `blk.4`) and HF (`mtp.fc`,
/// `mtp.pre_fc_norm_*`, `mtp.norm`, `mtp.layers.0.*`) hold the same weights.
#[test]
fn mtp_tensors_load_from_gguf_and_hf() {
    let dir = tempfile::tempdir().unwrap();
    let c = ModelConfig {
        mtp_layers: 1,
        tie_embeddings: true,
        ..config()
    };
    let w = random_weights(&c, 12, DType::F32).expect("weights");
    let gguf = dir.path().join("mtp.gguf");
    write_gguf_model(&w, &gguf);
    let hf = dir.path().join("mtp-hf");
    let tensors = qwen3next::hf_tensors(&w).expect("hf tensors");
    for n in [
        "mtp.fc.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
    ] {
        assert!(tensors.iter().any(|(x, _)| x == n), "{n} missing");
    }
    assert!(
        tensors
            .iter()
            .any(|(x, _)| x.starts_with("mtp.layers.0.mlp.experts.3."))
    );
    write_hf_model(&hf, w.config.to_hf_json(None, None), &tensors);
    let (g, h) = (load_weights(&gguf).unwrap(), load_weights(&hf).unwrap());
    assert_eq!(g.config.mtp_layers, 1);
    assert_eq!(h.config, g.config);
    for (role, t) in g.iter() {
        let u = h.get(role).unwrap();
        let (a, b) = (t.to_f32().unwrap(), u.to_f32().unwrap());
        // Norms and A_log go through `- 1` / `ln` and back in HF.
        let close = a
            .iter()
            .zip(&b)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + x.abs()));
        assert!(close, "{}", role.gguf_name());
    }
}

#[test]
fn malformed_hybrid_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny(8, DType::F32);
    let meta = gguf_meta(&w.config);
    // (case, metadata, tensor dropped or `resize:` widened, words the error must hold)
    type Meta = Vec<(String, MetaValue)>;
    let cases: Vec<(&str, Meta, &str, &str)> = vec![
        (
            "no-conv",
            meta.clone(),
            "blk.0.ssm_conv1d.weight",
            "ssm_conv1d",
        ),
        ("no-a", meta.clone(), "blk.2.ssm_a", "ssm_a"),
        (
            "wide-conv",
            meta.clone(),
            "resize:blk.2.ssm_conv1d.weight",
            "ssm_conv1d",
        ),
        (
            "kernel-9",
            meta.iter()
                .map(|(k, v)| match k.as_str() {
                    "qwen3next.ssm.conv_kernel" => (k.clone(), MetaValue::U32(9)),
                    _ => (k.clone(), v.clone()),
                })
                .collect(),
            "",
            "conv kernel 9",
        ),
        (
            "no-state-size",
            meta.iter()
                .filter(|(k, _)| k != "qwen3next.ssm.state_size")
                .cloned()
                .collect(),
            "",
            "qwen3next.ssm.state_size",
        ),
    ];
    for (name, meta, tensor, want) in cases {
        let path = dir.path().join(format!("{name}.gguf"));
        let kept = w.iter().filter(|(r, _)| r.gguf_name() != tensor);
        let widen = tensor.strip_prefix("resize:");
        write_gguf_tensors(kept, &meta, &path, &|name, dims, data| {
            if Some(name) == widen {
                // [conv_dim, 4] -> [conv_dim, 5]: one more F32 tap per channel.
                let rows = dims[1] as usize;
                dims[0] += 1;
                data.extend(std::iter::repeat_n(0u8, rows * 4));
            }
        });
        let e = match load_weights(&path) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{name}: {e}");
    }
}
