//! Prefix-cache hits for a recurrent-state model (qwen3next): a state snapshot saved at a
//! position and restored into another slot continues with exactly the bits the sequence's own
//! steps give (backend level), and the engine serves the same prompts cold and warm (from
//! snapshots at their last full block) byte for byte, reporting the cached tokens.

use crate::common;

use memra_engine::backend::Backend;
use memra_engine::backend::cpu::CpuBackend;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::Model;
use memra_engine::models::ModelWeights;
use memra_engine::models::random::random_weights;
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;

use crate::qwen3_moe::cpu;

// ---- Backend level ----

const VOCAB: usize = 300;

fn tiny(arch: Arch, vocab: usize, seed: u64) -> ModelWeights {
    random_weights(&common::four_layers(arch, vocab), seed, DType::Q8_0).expect("weights")
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    common::tokens(seed, n, VOCAB)
}

/// Runs positions `from..to` of `toks` as one step of one sequence (blocks `table`, state slot
/// `slot`); the logit bits per row.
fn run(
    b: &mut CpuBackend,
    toks: &[u32],
    (from, to): (usize, usize),
    table: &[u32],
    slot: u32,
) -> memra_engine::Result<Vec<Vec<u32>>> {
    let batch = common::seq_step(toks, from..to, table, vec![slot]);
    Ok(common::logit_bits(&b.step(&batch)?.logits))
}

/// Positions `from..to` in steps of `chunk` rows.
fn chunked(
    b: &mut CpuBackend,
    toks: &[u32],
    (from, to): (usize, usize),
    chunk: usize,
    table: &[u32],
    slot: u32,
) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for s in (from..to).step_by(chunk) {
        out.extend(run(b, toks, (s, (s + chunk).min(to)), table, slot).expect("step"));
    }
    out
}

#[test]
fn a_restored_snapshot_continues_with_the_same_bits() {
    let w = tiny(Arch::Qwen3Next, VOCAB, 21);
    let toks = tokens(3, 40);
    // The reference: the whole prompt in one step on a fresh backend.
    let whole = chunked(&mut cpu(w.clone()), &toks, (0, 40), 40, &[0, 1, 2], 0);
    let mut b = cpu(w);
    assert!(b.state_snapshots());
    // Sequence X in slot 1: 0..20, then 20..32 (committed at 20, written to 32).
    chunked(&mut b, &toks, (0, 32), 20, &[0, 1, 2], 1);
    // Snapshots at the written position, inside the ring and at the committed position.
    b.save_state(1, 32, 7).unwrap();
    b.save_state(1, 24, 8).unwrap();
    b.save_state(1, 20, 9).unwrap();
    // X goes on with other tokens: its slot moves on (committed at 32, written to 40), the
    // snapshots do not.
    let mut other = toks.clone();
    other[32..].copy_from_slice(&tokens(9, 8));
    chunked(&mut b, &other, (32, 40), 8, &[0, 1, 2], 1);
    let e = b.save_state(1, 24, 10).unwrap_err().to_string();
    assert!(e.contains("can be saved at positions 32..=40"), "{e}");
    assert!(b.save_state(1, 41, 10).is_err());
    let e = b.save_state(6, 8, 10).unwrap_err().to_string();
    assert!(e.contains("holds no state"), "{e}");
    let e = b.restore_state(3, 10).unwrap_err().to_string();
    assert!(e.contains("snapshot 10 does not exist"), "{e}");
    assert!(b.restore_state(u32::MAX, 7).is_err());
    // Y, Z, V: each snapshot restored into a fresh slot, then the rest of the prompt in
    // chunks of 3 (the blocks before the snapshot are X's; rows rewritten there get the same
    // values): every position's logits have the whole prompt's bits.
    for (snap, pos, slot, last) in [(7u32, 32usize, 3u32, 3u32), (8, 24, 4, 4), (9, 20, 5, 5)] {
        assert_eq!(b.restore_state(slot, snap).unwrap(), pos as u32);
        // The next step starts at the snapshot's position and nowhere else.
        let e = run(&mut b, &toks, (pos + 1, pos + 2), &[0, 1, last], slot)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("resume at positions {pos}..={pos}")),
            "{e}"
        );
        let got = chunked(&mut b, &toks, (pos, 40), 3, &[0, 1, last], slot);
        assert_eq!(got, whole[pos..], "snapshot {snap} at {pos}");
    }
    // A snapshot restored twice (into a slot that held another sequence) gives the same again.
    assert_eq!(b.restore_state(1, 8).unwrap(), 24);
    let got = chunked(&mut b, &toks, (24, 40), 16, &[0, 1, 6], 1);
    assert_eq!(got, whole[24..]);
}

#[test]
fn models_without_recurrent_state_have_no_snapshots() {
    let mut b = cpu(tiny(Arch::Llama, VOCAB, 22));
    assert!(!b.state_snapshots());
    run(&mut b, &tokens(1, 8), (0, 8), &[0], 0).unwrap();
    assert!(b.save_state(0, 4, 0).is_err());
    assert!(b.restore_state(0, 0).is_err());
}

// ---- Engine level ----

/// The SmolLM2 tokenizer's vocabulary (text and stop ids only).
const ENGINE_VOCAB: usize = 49152;

fn model() -> Model {
    let weights = tiny(Arch::Qwen3Next, ENGINE_VOCAB, 23);
    Model {
        path: "tiny-qwen3next".into(),
        config: weights.config.clone(),
        weights,
        tokenizer: Tokenizer::from_gguf(&Gguf::open(&common::real_model()).unwrap()).unwrap(),
        chat: None,
    }
}

fn start(kv_blocks: usize, budget: usize) -> EngineHandle {
    let cfg = crate::common::cpu_engine_config(kv_blocks, budget);
    Engine::start(vec![("m".into(), model(), cfg)], AdmissionLimits::default()).unwrap()
}

fn params(i: usize) -> SamplingParams {
    match i % 2 {
        0 => SamplingParams::default(),
        _ => SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            repetition_penalty: 1.1,
            seed: 500 + i as u64,
            ..Default::default()
        },
    }
}

fn request(prompt: &[u32], i: usize, max_tokens: usize) -> ValidRequest {
    ValidRequest {
        params: params(i),
        logprobs: Some(2),
        ..text_request(prompt.to_vec(), max_tokens)
    }
}

/// Tokens, logprob bits, text; and the cached tokens reported.
type Served = ((Vec<u32>, Vec<(u32, Vec<(u32, u32)>)>, String), usize);

fn collect(mut s: EventStream) -> Served {
    let (mut toks, mut lps, mut text) = (Vec::new(), Vec::new(), String::new());
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => {
                toks.push(t.id);
                text.push_str(&t.text);
                let top = t.top_logprobs.iter().map(|(i, l)| (*i, l.to_bits()));
                lps.push((t.logprob.map_or(0, f32::to_bits), top.collect()));
            }
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done { usage, .. }) => return ((toks, lps, text), usage.cached_tokens),
            Some(Event::Error(e)) => panic!("request failed: {e}"),
            None => panic!("the stream ended without Done"),
        }
    }
}

fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..21).map(|i| 100 + i * 13).collect();
    let with = |head: &[u32], tail: &[u32]| [head, tail].concat();
    vec![
        // 21 tokens: a snapshot at 20.
        shared.clone(),
        // Through the first one's five blocks: a hit at 20, which is also its own P.
        with(&shared, &[1, 2, 3]),
        // 9 tokens: blocks cached by the first, no snapshot there: a snapshot of its own at 8.
        shared[..9].to_vec(),
        // Shorter than a block.
        vec![5, 9, 12],
        // 45 tokens: a snapshot at 44.
        (0..45).map(|i| 7 + i * 31).collect(),
        // A hit at 8 (the third prompt's), a snapshot at 12.
        with(&shared[..9], &[77, 78, 79, 80, 81, 82, 83]),
    ]
}

#[test]
fn served_warm_from_snapshots_byte_for_byte() {
    let prompts = prompts();
    let max_tokens = 10;
    // The reference: generate() alone on a fresh backend.
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| common::generate_alone(model().weights, p, max_tokens, params(i)))
        .collect();
    // Room for everything: no eviction, so each warm request hits at its last full block.
    let e = start(128, 64);
    let cold: Vec<Served> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| collect(e.submit(request(p, i, max_tokens)).unwrap()))
        .collect();
    for (i, (c, r)) in cold.iter().zip(&reference).enumerate() {
        assert_eq!(&c.0.0, r, "prompt {i}: cold engine vs generate()");
    }
    let cached: Vec<usize> = cold.iter().map(|c| c.1).collect();
    assert_eq!(
        cached,
        vec![0, 20, 0, 0, 0, 8],
        "cold hits on earlier prompts' snapshots"
    );
    // Warm, all at once.
    let streams: Vec<EventStream> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| e.submit(request(p, i, max_tokens)).unwrap())
        .collect();
    let warm: Vec<Served> = streams.into_iter().map(collect).collect();
    for (i, (w, c)) in warm.iter().zip(&cold).enumerate() {
        assert_eq!(w.0, c.0, "prompt {i}: warm vs cold");
    }
    let cached: Vec<usize> = warm.iter().map(|w| w.1).collect();
    assert_eq!(cached, vec![20, 20, 8, 0, 44, 12]);
    let hits: u64 = e
        .stats()
        .models
        .iter()
        .map(|m| m.prefix_hit_tokens_total)
        .sum();
    assert_eq!(hits, 28 + 104);
    e.shutdown();
    // Under load: a 5-row step budget (prefill chunks stop at the snapshots) and a pool small
    // enough to evict and preempt, every prompt twice at once.
    let e = start(24, 5);
    let streams: Vec<(usize, EventStream)> = (0..2)
        .flat_map(|_| prompts.iter().enumerate())
        .map(|(i, p)| (i, e.submit(request(p, i, max_tokens)).unwrap()))
        .collect();
    let mut hit = 0;
    for (i, s) in streams {
        let got = collect(s);
        assert_eq!(got.0, cold[i].0, "prompt {i} under load");
        hit += got.1;
    }
    assert!(hit > 0, "no prefix hit under load");
    e.shutdown();
}
