//! Micro-batches of a pipeline step (`--pp-micro`, engine/src/pipeline/micro.rs) on the CPU:
//! the model split into stages with steps cut into 2 or 3 micro-batches of whole sequences
//! gives the unsplit model's bits, and the split model's without micro-batches, per
//! architecture (sliding windows, tied output, MoE, recurrent state): logits, tokens picked
//! greedy and seeded sampled (penalties on), logprobs, lazily given grammar masks, speculative
//! verify rows (several logit rows of one sequence), the hidden rows kept for MTP (with the
//! step's own rows), a prefix hit (shared KV block, recurrent state restored from a
//! snapshot), and every KV block's bytes.

use memra_engine::backend::{
    Backend, Device, OpenOptions, SelectParams, StepBatch, StepMasks, StepRow,
};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::models::ModelWeights;
use memra_engine::models::random::random_weights;
use memra_engine::pipeline::{self, PpConfig};
use memra_engine::quant::DType;
use memra_engine::sampling::SamplingParams;

use crate::common::{self, bits};

const VOCAB: usize = 300;
const BLOCKS: usize = 24;

fn config(arch: Arch) -> ModelConfig {
    common::four_layers(arch, VOCAB)
}

fn opts() -> OpenOptions {
    common::pp_opts(BLOCKS)
}

/// `micro` 0: the unsplit model; else split at `starts` with up to `micro` micro-batches.
fn open(w: &ModelWeights, starts: &[usize], micro: usize) -> Box<dyn Backend> {
    common::open_cpu(w.clone(), starts, micro, &opts())
}

fn tok(seq: usize, pos: usize) -> u32 {
    ((seq * 131 + pos * 37 + 7) % VOCAB) as u32
}

/// Sequence `s` at positions `from..to` (`want`: which of them want logits).
fn rows(s: usize, from: usize, to: usize, want: impl Fn(usize) -> bool) -> Vec<StepRow> {
    (from..to)
        .map(|p| StepRow {
            token: tok(s, p),
            pos: p as u32,
            seq: s,
            want_logits: want(p),
        })
        .collect()
}

/// Four sequences (blocks 2s, 2s + 1; state slot s + 1) plus a fifth, a prefix hit on
/// sequence 0's first block (blocks 0, 9; slot 6).
fn step(rows: Vec<StepRow>) -> StepBatch {
    StepBatch {
        rows,
        block_tables: vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7], vec![0, 9]],
        state_slots: vec![1, 2, 3, 4, 6],
        ..Default::default()
    }
}

type Trace = Vec<(String, Vec<u32>)>;

fn picks(out: &memra_engine::backend::StepSelected, what: &str, t: &mut Trace) {
    for (i, s) in out.rows.iter().enumerate() {
        let (kind, mut v) = s.bits();
        v.insert(0, kind.into());
        t.push((format!("{what} row {i}"), v));
    }
}

/// One select entry per row that wants logits: logits, greedy, sampled (with penalties),
/// round robin from `shift`.
fn selection<'a>(
    batch: &StepBatch,
    p: &'a [SamplingParams; 2],
    hist: &'a [u32],
    shift: usize,
) -> Vec<Option<SelectParams<'a>>> {
    let want = batch.rows.iter().filter(|r| r.want_logits);
    want.enumerate()
        .map(|(i, r)| {
            let params = match (i + shift) % 3 {
                0 => return None,
                1 => &p[0],
                _ => &p[1],
            };
            Some(SelectParams {
                params,
                history: hist,
                pos: r.pos as u64 + 1,
                mask: None,
            })
        })
        .collect()
}

fn workload(b: &mut dyn Backend) -> Trace {
    let mut t = Trace::new();
    let params = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.9,
            top_k: 30,
            repetition_penalty: 1.2,
            seed: 5,
            ..SamplingParams::default()
        },
    ];
    let hist: Vec<u32> = (0..12).map(|p| tok(9, p)).collect();
    // A: prefills of four sequences (sequence 0 a whole block; sequence 1 all rows).
    let mut r = rows(0, 0, 16, |p| p == 15);
    r.extend(rows(1, 0, 3, |_| true));
    r.extend(rows(2, 0, 1, |_| true));
    r.extend(rows(3, 0, 5, |p| p == 4));
    let out = b.step(&step(r)).expect("step A");
    t.extend(
        out.logits
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("A {i}"), bits(l))),
    );
    let snap = b.state_snapshots();
    if snap {
        b.save_state(1, 16, 0).expect("save");
    }
    // B: a decode, a verify step (drafts: every row wants logits), a short chunk, a decode;
    // picks greedy and sampled, logits.
    let mut r = rows(0, 16, 17, |_| true);
    r.extend(rows(1, 3, 6, |_| true));
    r.extend(rows(2, 1, 3, |p| p == 2));
    r.extend(rows(3, 5, 6, |_| true));
    let batch = step(r);
    let sel = selection(&batch, &params, &hist, 1);
    picks(&b.step_select(&batch, &sel).expect("B"), "B", &mut t);
    // C: logprobs.
    let mut r = rows(0, 17, 18, |_| true);
    r.extend(rows(1, 6, 8, |_| true));
    r.extend(rows(3, 6, 9, |_| true));
    let batch = step(r);
    let sel = selection(&batch, &params, &hist, 2);
    let lp: Vec<Option<usize>> = sel.iter().map(|s| s.map(|_| 3)).collect();
    let out = b.step_select_logprobs(&batch, &sel, &lp).expect("C");
    picks(&out, "C", &mut t);
    // D: grammar masks given late (some rows allowed a few tokens), logprobs on some.
    let mut r = rows(2, 3, 4, |_| true);
    r.extend(rows(0, 18, 20, |_| true));
    r.extend(rows(1, 8, 9, |_| true));
    r.extend(rows(3, 9, 10, |_| true));
    let batch = step(r);
    let sel = selection(&batch, &params, &hist, 1);
    let lp: Vec<Option<usize>> = (0..sel.len()).map(|i| (i % 2 == 0).then_some(2)).collect();
    let lp: Vec<Option<usize>> = lp.iter().zip(&sel).map(|(l, s)| s.and(*l)).collect();
    let words = VOCAB.div_ceil(32);
    let n = sel.len();
    let sel_none: Vec<bool> = sel.iter().map(Option::is_none).collect();
    let mut calls = 0;
    let mut masks = || -> memra_engine::Result<StepMasks> {
        calls += 1;
        Ok((0..n)
            .map(|i| {
                (!sel_none[i] && i % 2 == 1).then(|| {
                    let mut m = vec![0u32; words];
                    for tkn in [3 + i, 50 + 7 * i, 299] {
                        m[tkn / 32] |= 1 << (tkn % 32);
                    }
                    m
                })
            })
            .collect())
    };
    let out = b
        .step_select_lazy_masks(&batch, &sel, &lp, &mut masks)
        .expect("D");
    assert_eq!(calls, 1, "the masks are computed once a step");
    picks(&out, "D", &mut t);
    // E: hidden rows kept (MTP), with the step's own rows.
    b.keep_hidden(true).expect("keep hidden");
    let mut r = rows(3, 10, 12, |p| p == 11);
    r.extend(rows(1, 9, 10, |_| true));
    let batch = step(r);
    let out = b.step(&batch).expect("E");
    t.extend(
        out.logits
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("E {i}"), bits(l))),
    );
    let kept = b.take_hidden();
    assert_eq!(kept.len(), batch.rows.len());
    for (i, (row, h)) in kept.iter().enumerate() {
        assert_eq!(*row, batch.rows[i], "kept hidden row {i}");
        t.push((format!("E hidden {i}"), bits(h)));
    }
    b.keep_hidden(false).expect("keep hidden off");
    // F: a prefix hit: sequence 4 shares sequence 0's first block (its state restored from
    // the snapshot at 16), beside a decode of sequence 2.
    if snap {
        assert_eq!(b.restore_state(6, 0).expect("restore"), 16);
    }
    let mut r = rows(2, 4, 5, |_| true);
    r.extend(rows(4, 16, 19, |_| true));
    let out = b.step(&step(r)).expect("F");
    t.extend(
        out.logits
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("F {i}"), bits(l))),
    );
    for blk in 0..10 {
        t.push((format!("KV {blk}"), {
            let v = b.kv_block_bytes(blk).expect("kv");
            v.chunks(4)
                .map(|c| c.iter().fold(0u32, |a, &x| a << 8 | x as u32))
                .collect()
        }));
    }
    t
}

#[test]
fn micro_batches_give_the_unsplit_bits() {
    for arch in [
        Arch::Llama,
        Arch::Gemma3,
        Arch::Qwen3Moe,
        Arch::Qwen3Next,
        Arch::LlamaPostNorm,
    ] {
        let w = random_weights(&config(arch), 7, DType::Q8_0).expect("weights");
        let base = workload(open(&w, &[], 0).as_mut());
        for starts in [vec![1], vec![2], vec![1, 3]] {
            for micro in [1, 2, 3] {
                let mut b = open(&w, &starts, micro);
                let summary = b.pipeline().expect("split");
                let got = workload(b.as_mut());
                assert_eq!(got.len(), base.len(), "{arch:?} {starts:?} x{micro}");
                for ((name, x), (_, y)) in base.iter().zip(&got) {
                    assert!(
                        x == y,
                        "{arch:?} split at {starts:?}, micro-batches {micro} ({summary}): {name} \
                         differs from the unsplit model"
                    );
                }
            }
        }
    }
}

#[test]
fn the_setting_and_the_summary() {
    let f = |m, l| PpConfig::from_flags(2, None, None).and_then(|p| p.with_micro_link(m, l));
    assert_eq!(f(None, None).expect("default").micro_batches(), 2);
    assert_eq!(f(Some(1), None).expect("off").micro_batches(), 1);
    assert_eq!(
        f(None, Some("nccl")).expect("nccl").link,
        pipeline::LinkChoice::Nccl
    );
    assert!(f(Some(0), None).is_err());
    let e = f(None, Some("nvlink")).expect_err("bad link").to_string();
    assert!(e.contains("--pp-link"), "{e}");
    let w = random_weights(&config(Arch::Llama), 7, DType::F32).expect("weights");
    let s = open(&w, &[2], 2).pipeline().expect("split");
    assert!(
        s.contains("hand-over: host copy; micro-batches: up to 2 a step"),
        "{s}"
    );
    let s = open(&w, &[2], 1).pipeline().expect("split");
    assert!(s.contains("micro-batches: off"), "{s}");
}

/// On a machine without CUDA or NCCL, asking for the NCCL link is an error that names what is
/// missing, never a panic.
#[test]
fn the_nccl_link_without_nccl_is_a_clear_error() {
    use memra_engine::backend::cuda::link::{NcclLink, nccl_available};
    use pipeline::{LinkChoice as C, LinkKind as K, link_kind};
    let e = NcclLink::check(0, 0).expect_err("one device").to_string();
    assert!(e.contains("two different GPUs"), "{e}");
    // The choice: one device a device copy; two, NCCL where it loads (auto falls back).
    for nccl in [false, true] {
        assert_eq!(link_kind(C::Auto, true, nccl).expect("auto"), K::Device);
        assert_eq!(link_kind(C::Peer, true, nccl).expect("peer"), K::Device);
        assert!(link_kind(C::Nccl, true, nccl).is_err());
        assert_eq!(link_kind(C::Peer, false, nccl).expect("peer"), K::Peer);
    }
    assert_eq!(link_kind(C::Auto, false, false).expect("auto"), K::Peer);
    assert_eq!(link_kind(C::Auto, false, true).expect("auto"), K::Nccl);
    assert_eq!(link_kind(C::Nccl, false, true).expect("nccl"), K::Nccl);
    let e = link_kind(C::Nccl, false, false)
        .expect_err("no nccl")
        .to_string();
    assert!(e.contains("libnccl"), "{e}");
    if !nccl_available() {
        let e = NcclLink::check(0, 1).expect_err("no nccl").to_string();
        assert!(e.contains("libnccl"), "{e}");
    }
    if !memra_engine::backend::cuda::cuda_available() {
        let w = random_weights(&config(Arch::Llama), 7, DType::F32).expect("weights");
        let pp = PpConfig::from_flags(2, Some("cuda:0,cuda:1"), None)
            .and_then(|p| p.with_micro_link(None, Some("nccl")))
            .expect("flags");
        let r = pipeline::open(Device::Cpu, w, &opts(), &pp);
        assert!(r.is_err());
    }
}

/// The schedule: every stage but the last runs every micro-batch first, then the last stage
/// runs them in order (on two devices, stage 0's micro-batch j + 1 then overlaps the last
/// stage's micro-batch j). Seen through the layer outputs' dump (`l_out`, per layer, in the
/// order the CPU computes them).
#[test]
fn the_first_stage_runs_every_micro_batch_before_the_last_stage() {
    use std::sync::{Arc, Mutex};
    let w = random_weights(&config(Arch::Llama), 7, DType::F32).expect("weights");
    let mut b = open(&w, &[2], 2);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    b.set_dump(Some(Box::new(move |name, layer, rows, _| {
        if name == "l_out" {
            sink.lock().expect("sink").push((layer, rows));
        }
    })));
    let mut r = rows(0, 0, 3, |p| p == 2);
    r.extend(rows(1, 0, 2, |p| p == 1));
    b.step(&step(r)).expect("step");
    let got = seen.lock().expect("seen").clone();
    let want = [
        (0, 3),
        (1, 3),
        (0, 2),
        (1, 2),
        (2, 3),
        (3, 3),
        (2, 2),
        (3, 2),
    ];
    assert_eq!(got, want);
}
