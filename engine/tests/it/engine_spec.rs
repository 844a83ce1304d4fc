//! The engine loop with speculation: batched requests, speculative and plain mixed in one step,
//! greedy and seeded sampling, logprobs: every stream equals the plain engine's, byte for byte,
//! with the n-gram drafter and with the MTP drafter (the model's own MTP layer, fed each step's
//! hidden states).

use crate::common;

use memra_engine::config::Arch;
use memra_engine::config::ModelConfig;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::Model;
use memra_engine::models::ModelWeights;
use memra_engine::models::random::{oracle_mtp_weights, random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::{DrafterKind, SpecConfig};
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;

// A small vocabulary: the random model's output repeats, so n-gram drafts get accepted.
const VOCAB: usize = 48;

fn start(spec: Option<SpecConfig>) -> EngineHandle {
    let weights = random_weights(&tiny_config(Arch::Llama, VOCAB), 3, DType::Q8_0).unwrap();
    start_with(weights, spec)
}

/// A CPU engine serving `weights` as model `tiny` (SmolLM2's tokenizer), speculating with `spec`.
pub(crate) fn start_with(weights: ModelWeights, spec: Option<SpecConfig>) -> EngineHandle {
    let tokenizer = Tokenizer::from_gguf(&Gguf::open(&common::real_model()).unwrap()).unwrap();
    let model = Model {
        path: "tiny".into(),
        config: weights.config.clone(),
        weights,
        tokenizer,
        chat: None,
    };
    let cfg = EngineConfig {
        spec,
        ..common::cpu_engine_config(96, 24)
    };
    Engine::start(
        vec![("tiny".into(), model, cfg)],
        AdmissionLimits::default(),
    )
    .unwrap()
}

fn request(i: usize) -> ValidRequest {
    let prompt: Vec<u32> = (0..5 + i * 3)
        .map(|j| ((j * 7 + i) % 20) as u32 + 8)
        .collect();
    let params = if i.is_multiple_of(2) {
        SamplingParams::default()
    } else {
        SamplingParams {
            temperature: 0.8,
            top_k: 10,
            repetition_penalty: 1.05,
            seed: 77 + i as u64,
            ..Default::default()
        }
    };
    ValidRequest {
        model: "tiny".into(),
        params,
        logprobs: i.is_multiple_of(3).then_some(2),
        ignore_eos: i % 4 != 1,
        // Every third request opts out: plain and speculative sequences share steps.
        speculative: i % 3 != 2,
        ..text_request(prompt, 20 + i)
    }
}

/// `spec` with a fixed cost of a draft row: whether a sequence drafts must not hang on this
/// machine's step times (on a slow, busy CPU the measured fit backed the sampled requests off
/// and the tests that count their accepted drafts failed).
fn fixed_cost(spec: SpecConfig) -> SpecConfig {
    SpecConfig {
        row_cost_permille: Some(100),
        ..spec
    }
}

/// Per token: id, logprob bits, top alternatives' bits.
pub(crate) type Tokens = Vec<(u32, Option<u32>, Vec<(u32, u32)>)>;

/// Tokens, the finish reason and the accepted drafts of a stream.
pub(crate) fn collect(mut s: EventStream) -> (Tokens, String, usize) {
    let mut v = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => v.push((
                t.id,
                t.logprob.map(f32::to_bits),
                t.top_logprobs
                    .iter()
                    .map(|(i, l)| (*i, l.to_bits()))
                    .collect(),
            )),
            Some(Event::Text(_)) => {}
            Some(Event::Done {
                finish_reason,
                usage,
            }) => return (v, finish_reason.as_str().into(), usage.accepted_tokens),
            Some(Event::Error(e)) => panic!("request failed: {e}"),
            None => panic!("stream ended without Done"),
        }
    }
}

fn run_all(e: &EngineHandle, n: usize) -> Vec<(Tokens, String, usize)> {
    let streams: Vec<EventStream> = (0..n).map(|i| e.submit(request(i)).unwrap()).collect();
    streams.into_iter().map(collect).collect()
}

/// The streams of [`run_all`] with drafts of `k` tokens (`got`) equal the plain engine's
/// (`want`), and a request that opted out accepted no draft.
fn assert_same_streams(
    got: &[(Tokens, String, usize)],
    want: &[(Tokens, String, usize)],
    k: usize,
) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.0, w.0, "request {i} k={k}: tokens/logprobs differ");
        assert_eq!(g.1, w.1, "request {i} k={k}: finish");
        if !request(i).speculative {
            assert_eq!(g.2, 0, "request {i} opted out but accepted drafts");
        }
    }
}

#[test]
fn speculative_engine_streams_equal_plain_under_batching() {
    let n = 8;
    let plain = start(None);
    let want = run_all(&plain, n);
    plain.shutdown();
    for k in [1, 3, 8] {
        let e = start(Some(fixed_cost(
            SpecConfig::new(DrafterKind::Ngram, k).unwrap(),
        )));
        let got = run_all(&e, n);
        assert_same_streams(&got, &want, k);
        let stats = e.stats();
        let m = &stats.models[0];
        assert!(m.spec_drafted_total > 0, "k={k}: nothing was drafted");
        assert!(
            m.spec_accepted_total > 0,
            "k={k}: no draft accepted: the test proves nothing"
        );
        // Sampled requests accepted drafts too: their picks from verify rows past the first
        // reached the streams compared above.
        let sampled: usize = (0..n)
            .filter(|&i| request(i).params.temperature > 0.0 && request(i).speculative)
            .map(|i| got[i].2)
            .sum();
        assert!(sampled > 0, "k={k}: no sampled request accepted a draft");
        // Every n-gram draft has a match length or came from the traffic store (the outputs
        // of the requests that finished before it, all of tenant `t`): the buckets add up to
        // the model's totals.
        let by = |f: fn(&memra_engine::spec::SpecCounts) -> u64| -> u64 {
            m.spec_by_match.iter().map(f).sum::<u64>() + f(&m.spec_by_traffic)
        };
        assert_eq!(by(|c| c.drafted), m.spec_drafted_total, "k={k}");
        assert_eq!(by(|c| c.accepted), m.spec_accepted_total, "k={k}");
        e.shutdown();
    }
}

/// The engine's streams with `spec` on `weights` equal its streams without; returns the
/// model's (drafted, accepted) totals.
fn check_against_plain(weights: &ModelWeights, spec: SpecConfig, n: usize) -> (u64, u64) {
    let plain = start_with(weights.clone(), None);
    let want = run_all(&plain, n);
    plain.shutdown();
    let k = spec.k;
    let e = start_with(weights.clone(), Some(spec));
    let got = run_all(&e, n);
    assert_same_streams(&got, &want, k);
    let stats = e.stats();
    let m = &stats.models[0];
    let counts = (m.spec_drafted_total, m.spec_accepted_total);
    // Usage: the accepted drafts of each stream add up to the model's total.
    let usage: u64 = got.iter().map(|g| g.2 as u64).sum();
    assert_eq!(usage, counts.1, "k={k}: usage vs model counters");
    e.shutdown();
    counts
}

#[test]
fn mtp_speculation_in_the_engine_loop_equals_plain() {
    let cfg = ModelConfig {
        mtp_layers: 1,
        ..tiny_config(Arch::Llama, VOCAB)
    };
    // A random MTP layer: drafts mostly rejected (the drafter's KV rolls back every step).
    let random = random_weights(&cfg, 3, DType::Q8_0).unwrap();
    let (d, _) = check_against_plain(&random, SpecConfig::new(DrafterKind::Mtp, 3).unwrap(), 6);
    assert!(d > 0, "random MTP layer: nothing drafted");
    // A layer wired to draft the model's own picks: most greedy drafts accepted.
    let oracle = oracle_mtp_weights(&cfg, 3).unwrap();
    for k in [1, 4] {
        let (d, a) = check_against_plain(&oracle, SpecConfig::new(DrafterKind::Mtp, k).unwrap(), 6);
        eprintln!("oracle MTP layer k={k}: {a} of {d} drafts accepted");
        assert!(
            d > 0 && a * 4 >= d * 3,
            "oracle MTP k={k}: {a} of {d} accepted"
        );
    }
}

#[test]
fn sampled_requests_speculate_in_the_engine() {
    // Sampled requests (temperature, top-k, a repetition penalty, a seed) check drafts and
    // accept some; their streams are plain decoding's (checked by the tests above).
    let e = start(Some(fixed_cost(
        SpecConfig::new(DrafterKind::Ngram, 4).unwrap(),
    )));
    let n = 8;
    let got = run_all(&e, n);
    let sampled: usize = (0..n)
        .filter(|&i| request(i).params.temperature > 0.0 && request(i).speculative)
        .map(|i| got[i].2)
        .sum();
    e.shutdown();
    assert!(sampled > 0, "no sampled request accepted a draft");
}

#[test]
fn auto_speculation_equals_plain_and_reports_its_drafters() {
    // Without MTP layers `auto` is n-gram lookup alone.
    let plain_model = random_weights(&tiny_config(Arch::Llama, VOCAB), 3, DType::Q8_0).unwrap();
    let (d, a) = check_against_plain(
        &plain_model,
        SpecConfig::new(DrafterKind::Auto(None), 4).unwrap(),
        8,
    );
    assert!(d > 0 && a > 0, "auto (ngram): {a} of {d}");
    let e = start_with(
        plain_model,
        Some(SpecConfig::new(DrafterKind::Auto(None), 4).unwrap()),
    );
    assert_eq!(e.models()[0].spec, Some(("ngram".to_string(), 4)));
    e.shutdown();
    // With an MTP layer: the layer and n-gram lookup, picked per sequence.
    let cfg = ModelConfig {
        mtp_layers: 1,
        ..tiny_config(Arch::Llama, VOCAB)
    };
    let oracle = oracle_mtp_weights(&cfg, 3).unwrap();
    let spec = SpecConfig::new(DrafterKind::Auto(None), 4).unwrap();
    let (d, a) = check_against_plain(&oracle, spec.clone(), 6);
    assert!(d > 0 && a * 2 >= d, "auto (mtp+ngram): {a} of {d}");
    let e = start_with(oracle, Some(spec));
    assert_eq!(e.models()[0].spec, Some(("mtp+ngram".to_string(), 4)));
    let _ = run_all(&e, 6);
    let stats = e.stats();
    let m = &stats.models[0];
    assert_eq!(m.spec_drafter, "mtp+ngram");
    let names: Vec<&str> = m.spec_by_drafter.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["mtp", "ngram"]);
    let by: u64 = m.spec_by_drafter.iter().map(|p| p.1.drafted).sum();
    assert_eq!(
        by, m.spec_drafted_total,
        "the parts add up to the model's drafts"
    );
    assert!(
        m.spec_by_drafter[0].1.drafted > 0,
        "the MTP layer never drafted"
    );
    assert!(m.spec_steps_total > 0);
    e.shutdown();
}

#[test]
fn fallbacks_are_counted_by_reason() {
    // max_batch 1: every decode step of a batch of several is at the load cut-off.
    let spec = SpecConfig {
        max_batch: 1,
        ..SpecConfig::new(DrafterKind::Ngram, 4).unwrap()
    };
    let e = start(Some(spec));
    let _ = run_all(&e, 6);
    let t0 = std::time::Instant::now();
    while e.stats().models[0].spec_fallbacks.load == 0 && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = e.stats();
    let f = stats.models[0].spec_fallbacks;
    assert!(f.load > 0, "{f:?}");
    e.shutdown();
    // One request at a time: no load cut-off. A request of 2 tokens has no room to draft at
    // its one decode step (the prefill picked the first token).
    let e = start(Some(SpecConfig::new(DrafterKind::Ngram, 4).unwrap()));
    for i in 0..3 {
        let _ = collect(e.submit(request(i)).unwrap());
    }
    let short = ValidRequest {
        max_tokens: 2,
        ..request(0)
    };
    let (toks, _, _) = collect(e.submit(short).unwrap());
    assert_eq!(toks.len(), 2);
    // The worker publishes its counters after it has sent the step's tokens: wait for them.
    let t0 = std::time::Instant::now();
    while e.stats().models[0].spec_fallbacks.no_room == 0 && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = e.stats();
    let f = stats.models[0].spec_fallbacks;
    assert_eq!(f.load, 0, "{f:?}");
    assert!(f.no_room > 0, "{f:?}");
    assert_eq!(f.error, 0, "{f:?}");
    e.shutdown();
}
