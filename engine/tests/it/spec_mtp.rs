//! The MTP drafter (spec/mtp.rs, models/mtp.rs): speculative decoding with it equals plain
//! decoding (tokens and logits bytes) for K = 1..4, greedy and seeded; a wired "oracle" MTP
//! layer drafts well; GGUF and HF copies load the same MTP tensors; malformed MTP checkpoints
//! are refused naming the tensor; rejected drafts leave nothing in the drafter's KV.

use memra_engine::backend::{Backend, Device};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;
use memra_engine::models::random::{oracle_mtp_weights, random_weights, tiny_config};
use memra_engine::models::{ModelWeights, Role, def};
use memra_engine::quant::DType;
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::generate::{SpecOptions, generate_spec};
use memra_engine::spec::mtp::MtpDrafter;
use memra_engine::spec::{DraftReq, Drafter};
use memra_engine::testing::small_cpu;
use memra_engine::testing::tiny_gguf::gguf_meta;
use memra_engine::weights::Tensor;

use super::qwen3_moe::{hf_tensors, write_gguf_with, write_hf_model};

use super::spec_generate::{bits, same};

const VOCAB: usize = 48;

fn mtp_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        mtp_layers: 1,
        ..tiny_config(arch, VOCAB)
    }
}

fn tiny_mtp(arch: Arch, seed: u64) -> ModelWeights {
    random_weights(&mtp_config(arch), seed, DType::Q8_0).unwrap()
}

/// A model with an MTP layer wired to draft the model's own picks (`oracle_mtp_weights`).
fn oracle(seed: u64) -> ModelWeights {
    oracle_mtp_weights(&mtp_config(Arch::Llama), seed).unwrap()
}

fn request(prompt: Vec<u32>, params: SamplingParams) -> GenRequest {
    GenRequest {
        params,
        keep_logits: true,
        stop_ids: vec![7],
        ..GenRequest::greedy(prompt, 32)
    }
}

fn params() -> Vec<(&'static str, SamplingParams)> {
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        seed: 1234,
        ..Default::default()
    };
    vec![("greedy", SamplingParams::default()), ("sampled", sampled)]
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3, 4, 5, 1, 2, 3],
        (0..23).map(|i| (i * 5 % 40) as u32 + 8).collect(),
    ]
}

/// Speculative decoding with the MTP drafter of `w` equals plain decoding for K = 1..4;
/// returns (drafted, accepted) of the greedy runs.
fn check_exact(w: ModelWeights, what: &str) -> (u64, u64) {
    let mut b = small_cpu(w.clone());
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts() {
        for (pname, p) in params() {
            let req = request(prompt.clone(), p);
            let plain = generate(&mut b, &req, &mut |_| Ok(())).unwrap();
            for k in 1..=4 {
                let mut d = MtpDrafter::new(&w, Device::Cpu, 1).unwrap();
                let o = SpecOptions { k, adaptive: false };
                let (s, c) = generate_spec(&mut b, &mut d, &req, o, &mut |_| Ok(())).unwrap();
                let at = format!("{what} {pname} k={k}");
                same(&plain, &s, &at);
                assert!(c.drafted > 0, "{at}: nothing drafted");
                if pname == "greedy" {
                    drafted += c.drafted;
                    accepted += c.accepted;
                }
            }
        }
    }
    (drafted, accepted)
}

#[test]
fn mtp_speculation_equals_plain_decoding() {
    for arch in [Arch::Llama, Arch::Qwen3] {
        let (d, a) = check_exact(tiny_mtp(arch, 3), arch.gguf_name());
        eprintln!("random {arch:?} MTP layer: {a} of {d} greedy drafts accepted");
    }
}

#[test]
fn a_wired_mtp_layer_drafts_the_models_own_picks() {
    let (d, a) = check_exact(oracle(5), "oracle");
    eprintln!("oracle MTP layer: {a} of {d} greedy drafts accepted");
    assert!(a * 10 >= d * 9, "oracle MTP: only {a} of {d} accepted");
}

#[test]
fn a_model_without_mtp_layers_is_refused_naming_them() {
    let w = random_weights(&tiny_config(Arch::Llama, VOCAB), 1, DType::Q8_0).unwrap();
    let e = MtpDrafter::new(&w, Device::Cpu, 1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no MTP layers"), "{e}");
    assert!(e.contains("blk.2.nextn.eh_proj.weight"), "{e}");
    assert!(e.contains("model.layers.2.eh_proj.weight"), "{e}");
    // On CUDA the MTP layer opens on the device beside the target; without one, a clear error.
    if !memra_engine::backend::cuda::cuda_available() {
        let e = MtpDrafter::new(&tiny_mtp(Arch::Llama, 1), Device::Cuda(0), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("cuda:0") && e.contains("CUDA is not available"),
            "{e}"
        );
    }
}

/// The target's hidden states of `tokens` (one step), as the drafter is handed them.
fn hidden_rows(
    w: &ModelWeights,
    tokens: &[u32],
) -> Vec<(memra_engine::backend::StepRow, Vec<f32>)> {
    let mut b = small_cpu(w.clone());
    b.keep_hidden(true).unwrap();
    let rows = tokens
        .iter()
        .enumerate()
        .map(|(p, &t)| memra_engine::backend::StepRow {
            token: t,
            pos: p as u32,
            seq: 0,
            want_logits: p + 1 == tokens.len(),
        })
        .collect();
    let batch = memra_engine::backend::StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![(0..16).collect()],
        state_slots: Vec::new(),
    };
    b.step(&batch).unwrap();
    b.take_hidden()
}

fn req(tokens: &[u32], k: usize) -> DraftReq<'_> {
    DraftReq {
        id: 1,
        tokens,
        k,
        params: &SamplingParams::GREEDY,
    }
}

#[test]
fn rejected_drafts_leave_nothing_behind() {
    let w = tiny_mtp(Arch::Llama, 7);
    let history: Vec<u32> = vec![3, 9, 4, 12, 5, 30, 2];
    // A fresh drafter that sees the committed history once.
    let mut fresh = MtpDrafter::new(&w, Device::Cpu, 1).unwrap();
    let full = hidden_rows(&w, &history);
    fresh.observe(1, &full[..history.len() - 1]);
    let want = fresh.draft(&[req(&history, 4)]).unwrap();
    assert_eq!(fresh.done(1), history.len() - 1);
    // One that drafted from a shorter history, was "verified" with wrong tokens in the
    // positions after it, then sees the true history.
    let mut d = MtpDrafter::new(&w, Device::Cpu, 1).unwrap();
    let short = &history[..4];
    d.observe(1, &full[..3]);
    let first = d.draft(&[req(short, 4)]).unwrap();
    assert_eq!(first[0].len(), 4);
    let mut wrong = short.to_vec();
    wrong.extend([40, 41, 42]);
    let bad = hidden_rows(&w, &wrong);
    d.observe(1, &bad[3..]);
    d.observe(1, &full[3..history.len() - 1]);
    assert_eq!(d.draft(&[req(&history, 4)]).unwrap(), want);
    // Drafting again from the same tokens gives the same drafts (the chained KV is rewritten).
    assert_eq!(d.draft(&[req(&history, 4)]).unwrap(), want);
    // Without the target's states of the history, no draft (plain decoding).
    let mut blind = MtpDrafter::new(&w, Device::Cpu, 1).unwrap();
    assert_eq!(
        blind.draft(&[req(&history, 4)]).unwrap(),
        vec![Vec::<u32>::new()]
    );
    d.forget(1);
    assert_eq!(d.done(1), 0);
}

fn logits_bits(w: ModelWeights) -> Vec<Vec<u32>> {
    let req = request(vec![1, 2, 3, 4, 5], SamplingParams::default());
    let mut b = small_cpu(w.clone());
    let mut d = MtpDrafter::new(&w, Device::Cpu, 1).unwrap();
    let o = SpecOptions {
        k: 3,
        adaptive: false,
    };
    let (s, c) = generate_spec(&mut b, &mut d, &req, o, &mut |_| Ok(())).unwrap();
    let mut out = bits(&s);
    out.push(vec![c.drafted as u32, c.accepted as u32]);
    out
}

#[test]
fn gguf_and_hf_copies_load_the_mtp_layer_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    // qwen3: its GGUF keeps HF q/k row order, so the writer here need not permute.
    let w = random_weights(&mtp_config(Arch::Qwen3), 9, DType::F32).unwrap();
    let gguf = dir.path().join("m.gguf");
    write_gguf_with(&w, &gguf_meta(&w.config), &gguf, &|_, _, _| {});
    let g = load_weights(&gguf).unwrap();
    assert_eq!(g.config.n_layers, 2);
    assert_eq!(g.config.mtp_layers, 1);
    assert!(g.opt(Role::MtpEhProj(2)).is_some());
    let hf = write_hf_model(
        &dir.path().join("hf"),
        w.config.to_hf_json(None, None),
        &hf_tensors(&w),
    );
    let h = load_weights(&hf).unwrap();
    assert_eq!(h.config, g.config);
    let want = logits_bits(w);
    assert!(logits_bits(g) == want, "GGUF copy differs");
    assert!(logits_bits(h) == want, "HF copy differs");
    // The plain model ignores the MTP layer: the same bits as without it.
    let plain_cfg = tiny_config(Arch::Llama, VOCAB);
    let spec = (def(Arch::Llama).tensors)(&plain_cfg);
    assert!(spec.iter().all(|s| s.role.layer().is_none_or(|l| l < 2)));
}

#[test]
fn malformed_mtp_checkpoints_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_mtp(Arch::Llama, 2);
    let meta = gguf_meta(&w.config);
    // Missing eh_proj.
    let e = {
        let mut src = |role: Role| -> memra_engine::Result<Option<Tensor>> {
            Ok(if role == Role::MtpEhProj(2) {
                None
            } else {
                w.opt(role).cloned()
            })
        };
        ModelWeights::build(&w.config, &mut src)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(e.contains("blk.2.nextn.eh_proj.weight"), "{e}");
    // Wrong shape in a GGUF file: eh_proj as [hidden, hidden].
    let bad = dir.path().join("bad_shape.gguf");
    write_gguf_with(&w, &meta, &bad, &|name, dims, data| {
        if name == "blk.2.nextn.eh_proj.weight" {
            dims[0] /= 2;
            let n = data.len() / 2;
            data.truncate(n);
        }
    });
    let e = load_weights(&bad).err().unwrap().to_string();
    assert!(e.contains("blk.2.nextn.eh_proj.weight"), "{e}");
    // More MTP layers declared than blocks.
    let mut meta2 = meta.clone();
    for (k, v) in meta2.iter_mut() {
        if k == "llama.nextn_predict_layers" {
            *v = memra_engine::formats::gguf::MetaValue::U32(9);
        }
    }
    let over = dir.path().join("over.gguf");
    write_gguf_with(&w, &meta2, &over, &|_, _, _| {});
    let e = load_weights(&over).err().unwrap().to_string();
    assert!(e.contains("nextn_predict_layers"), "{e}");
}
