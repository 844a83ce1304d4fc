//! Pipeline stages on the CPU (engine/src/pipeline): a model split at every layer boundary
//! gives the same tokens, logit bits and KV bytes as the unsplit model (chunked prefill,
//! decode, a batch of sequences at different depths), per architecture (sliding windows,
//! tied output, recurrent state); a split that cannot fit names the stage and the bytes
//! missing.

use crate::common;

use memra_engine::backend::{Backend, Device, OpenOptions, StepBatch, StepRow};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::random::random_weights;
use memra_engine::pipeline::{self, PpConfig, StageDevice, plan};
use memra_engine::quant::DType;

const VOCAB: usize = 300;

fn config(arch: Arch) -> ModelConfig {
    common::four_layers(arch, VOCAB)
}

fn opts() -> OpenOptions {
    common::pp_opts(32)
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    common::tokens(seed, n, VOCAB)
}

/// Tokens and logit bits of a chunked generation, then a batch of two sequences at other
/// depths (one prefilling, one decoding), then the KV bytes of the blocks written.
fn run(b: &mut dyn Backend) -> (Vec<u32>, Vec<Vec<u32>>, Vec<Vec<u8>>) {
    let mut req = GenRequest::greedy(prompt(1, 21), 6);
    req.prefill_chunk = 7;
    req.keep_logits = true;
    let out = generate(b, &req, &mut |_| Ok(())).expect("generate");
    let mut bits = common::logit_bits(&out.logits);
    // Sequence 0 in blocks 4..6 (5 prompt tokens), sequence 1 in 6..8 (one token at 0).
    let mut rows: Vec<StepRow> = prompt(2, 5)
        .into_iter()
        .enumerate()
        .map(|(p, token)| StepRow {
            token,
            pos: p as u32,
            seq: 0,
            want_logits: p == 4,
        })
        .collect();
    rows.push(StepRow {
        token: 9,
        pos: 0,
        seq: 1,
        want_logits: true,
    });
    let batch = StepBatch {
        rows,
        block_tables: vec![vec![4, 5], vec![6, 7]],
        state_slots: vec![1, 2],
        embeds: Vec::new(),
        mrope: Vec::new(),
    };
    let step = b.step(&batch).expect("step");
    bits.extend(common::logit_bits(&step.logits));
    let kv = (0..8)
        .map(|blk| b.kv_block_bytes(blk).expect("kv"))
        .collect();
    (out.tokens, bits, kv)
}

#[test]
fn every_split_gives_the_unsplit_bits() {
    for arch in [
        Arch::Llama,
        Arch::Qwen3,
        Arch::LlamaPostNorm,
        Arch::Gemma3,
        Arch::Qwen3Moe,
        Arch::Qwen3Next,
    ] {
        let w = random_weights(&config(arch), 5, DType::Q8_0).expect("weights");
        let base = run(common::open_cpu(w.clone(), &[], 0, &opts()).as_mut());
        assert_eq!(base.1[0].len(), VOCAB);
        for starts in [vec![1], vec![2], vec![3], vec![1, 3]] {
            let mut b = common::open_cpu(w.clone(), &starts, 1, &opts());
            assert!(b.pipeline().is_some());
            let got = run(b.as_mut());
            assert_eq!(got.0, base.0, "{arch:?} split at {starts:?}: tokens");
            assert!(got.1 == base.1, "{arch:?} split at {starts:?}: logit bits");
            assert!(got.2 == base.2, "{arch:?} split at {starts:?}: KV bytes");
        }
    }
}

#[test]
fn the_plan_balances_and_reports_the_split() {
    let w = random_weights(&config(Arch::Qwen3), 5, DType::F32).expect("weights");
    let pp = PpConfig {
        stages: 2,
        ..Default::default()
    };
    let b = pipeline::open(Device::Cpu, w, &opts(), &pp).expect("pipeline");
    let s = b.pipeline().expect("a split");
    // Four equal layers: two a stage (the embedding and head weigh the same here).
    assert!(s.starts_with("pp 2: stage 0 cpu layers 0..2"), "{s}");
    assert!(s.contains("stage 1 cpu layers 2..4"), "{s}");
    assert!(s.contains("hand-over: host copy"), "{s}");
    assert_eq!(b.name(), "cpu,cpu");
}

#[test]
fn a_stage_that_does_not_fit_is_named_with_the_bytes_missing() {
    let w = random_weights(&config(Arch::Llama), 5, DType::F32).expect("weights");
    let devs = [Device::Cpu, Device::Cpu];
    let costs = pipeline::costs(&w, &devs, &opts()).expect("costs");
    let ranges = plan::ranges(&costs, 2, Some(&[2])).expect("ranges");
    let need0 = costs.stage(0, 2, &ranges[0], 32).total();
    let need1 = costs.stage(1, 2, &ranges[1], 32).total();
    let dev = |name: &str, free| StageDevice {
        name: name.into(),
        free: Some(free),
    };
    // Two devices: stage 1 is 1000 bytes short.
    let e = plan::check(
        &costs,
        &ranges,
        &[dev("cuda:0", need0), dev("cuda:1", need1 - 1000)],
        32,
    )
    .expect_err("too small")
    .to_string();
    assert!(
        e.contains("stage 1 (cuda:1, layers 2..4) does not fit"),
        "{e}"
    );
    assert!(e.contains("(1000 bytes) missing"), "{e}");
    // One shared device: the second stage is short by what the first took.
    let e = plan::check(
        &costs,
        &ranges,
        &[dev("cuda:0", need1), dev("cuda:0", need1)],
        32,
    )
    .expect_err("shared")
    .to_string();
    assert!(e.contains("stage 1 (cuda:0"), "{e}");
    assert!(e.contains(&format!("({need0} bytes) missing")), "{e}");
    assert!(
        plan::check(
            &costs,
            &ranges,
            &[dev("cuda:0", need0 + need1), dev("cuda:0", need0 + need1)],
            32
        )
        .is_ok()
    );
    // Bad splits are refused, never a panic.
    for bad in [vec![0], vec![4], vec![2, 2], vec![3, 1]] {
        let n = bad.len() + 1;
        assert!(plan::ranges(&costs, n, Some(&bad)).is_err(), "{bad:?}");
    }
    assert!(plan::ranges(&costs, 5, None).is_err());
    let pp = PpConfig {
        stages: 2,
        devices: vec![Device::Cpu, Device::Cuda(0)],
        ..Default::default()
    };
    assert!(pp.stage_devices(Device::Cpu).is_err());
}

#[test]
fn the_flags_give_the_split() {
    let f = PpConfig::from_flags;
    let pp = f(2, None, Some("12")).expect("pp 2");
    assert_eq!((pp.stages, pp.split), (2, Some(vec![12])));
    // --devices alone sets the stage count.
    let pp = f(1, Some("cuda:0,cuda:1"), None).expect("devices");
    assert_eq!(pp.stages, 2);
    assert_eq!(pp.devices, vec![Device::Cuda(0), Device::Cuda(1)]);
    assert!(!f(1, None, None).expect("unsplit").is_split());
    for (pp, d, s) in [
        (3, Some("cpu,cpu"), None),
        (1, None, Some("4")),
        (2, None, Some("4;x")),
        (2, Some("gpu,cpu"), None),
    ] {
        let e = f(pp, d, s).expect_err("refused").to_string();
        assert!(e.contains("invalid input"), "{e}");
    }
}
