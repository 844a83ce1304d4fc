//! Structured output through the engine loop (tiny random model, real SmolLM2 tokenizer, CPU):
//! a constrained request gives the same bytes alone, batched with others (constrained and
//! not, staggered, chunked prefill, prefix-cache hits) and speculative; its output follows the
//! grammar and ends with `stop` once the grammar is complete.

use crate::common;

use std::sync::Arc;

use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::generate::FinishReason;
use memra_engine::grammar::{Grammar, GrammarSpec, Grammars};
use memra_engine::loader::Model;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::{DrafterKind, SpecConfig};
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;
use serde_json::{Value, json};

const VOCAB: usize = 49152;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&Gguf::open(&common::real_model()).unwrap()).unwrap()
}

fn start(budget: usize, spec: Option<SpecConfig>) -> EngineHandle {
    let weights = random_weights(&tiny_config(Arch::Llama, VOCAB), 5, DType::Q8_0).unwrap();
    let model = Model {
        path: "tiny".into(),
        config: weights.config.clone(),
        weights,
        tokenizer: tokenizer(),
        chat: None,
    };
    let cfg = EngineConfig {
        spec,
        ..crate::common::cpu_engine_config(256, budget)
    };
    Engine::start(
        vec![("tiny".into(), model, cfg)],
        AdmissionLimits::default(),
    )
    .unwrap()
}

/// A schema every walk finishes in a few tokens: enums, a boolean, a small array of enums.
fn schema() -> Value {
    json!({"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
        "required": ["color", "ok", "tags"], "additionalProperties": false})
}

fn request(prompt: Vec<u32>, seed: u64, grammar: Option<Arc<Grammar>>) -> ValidRequest {
    ValidRequest {
        model: "tiny".into(),
        params: SamplingParams {
            temperature: if seed == 0 { 0.0 } else { 0.9 },
            seed,
            ..Default::default()
        },
        logprobs: Some(2),
        ignore_eos: false,
        speculative: true,
        grammar,
        ..text_request(prompt, 48)
    }
}

/// Token ids, text, logprob bits and finish reason of a stream.
type Out = (Vec<u32>, String, Vec<u32>, FinishReason);

fn collect(mut s: EventStream) -> Out {
    let (mut ids, mut text, mut lps) = (Vec::new(), String::new(), Vec::new());
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => {
                ids.push(t.id);
                text.push_str(&t.text);
                lps.push(t.logprob.map_or(0, f32::to_bits));
            }
            Some(Event::Text(x)) => text.push_str(&x),
            Some(Event::Done { finish_reason, .. }) => return (ids, text, lps, finish_reason),
            Some(Event::Error(e)) => panic!("request failed: {e}"),
            None => panic!("the stream ended without Done"),
        }
    }
}

fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..21).map(|i| 200 + i * 7).collect();
    (0..6)
        .map(|k| {
            let mut p = shared.clone();
            p.extend((0..(3 + k * 5)).map(|i| 1000 + (k * 31 + i) as u32));
            p
        })
        .collect()
}

/// Requests: even ones constrained (greedy and seeded), odd ones free.
fn requests(g: &Arc<Grammar>) -> Vec<ValidRequest> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let grammar = (i % 2 == 0).then(|| g.clone());
            request(p, (i as u64 % 3) * 17, grammar)
        })
        .collect()
}

#[test]
fn constrained_output_is_the_same_alone_batched_and_speculative() {
    let grammars = Grammars::new(&tokenizer());
    let g = grammars
        .compile(&GrammarSpec::JsonSchema(schema()))
        .unwrap();
    let reqs = requests(&g);

    // Alone: one request at a time, whole prompt in one step.
    let solo_engine = start(512, None);
    let solo: Vec<Out> = reqs
        .iter()
        .map(|r| collect(solo_engine.submit(r.clone()).unwrap()))
        .collect();
    solo_engine.shutdown();
    for (i, (_, text, _, finish)) in solo.iter().enumerate().step_by(2) {
        assert_eq!(*finish, FinishReason::Stop, "request {i}: {text}");
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            ["red", "green", "blue"].contains(&v["color"].as_str().unwrap()),
            "{v}"
        );
        assert!(v["ok"].is_boolean(), "{v}");
        assert!(v["tags"].as_array().unwrap().len() <= 2, "{v}");
    }

    // Batched: all at once, a small step budget (chunked prefill), prefix hits on the shared
    // start; then speculative (n-gram drafts checked against the masked picks).
    assert_batched_as_solo(&reqs, &solo, collect);
}

/// `reqs` all at once on an engine with a 16-token step budget, then on one with n-gram drafts
/// of 4: each stream, read with `read`, equals its solo run in `solo`.
fn assert_batched_as_solo<T: PartialEq + std::fmt::Debug>(
    reqs: &[ValidRequest],
    solo: &[T],
    read: fn(EventStream) -> T,
) {
    let spec = SpecConfig::new(DrafterKind::Ngram, 4).unwrap();
    for (name, engine) in [
        ("batched", start(16, None)),
        ("speculative", start(16, Some(spec))),
    ] {
        let streams: Vec<EventStream> = reqs
            .iter()
            .map(|r| engine.submit(r.clone()).unwrap())
            .collect();
        let outs: Vec<T> = streams.into_iter().map(read).collect();
        for (i, (a, b)) in solo.iter().zip(&outs).enumerate() {
            assert_eq!(a, b, "{name}: request {i} differs from its solo run");
        }
        engine.shutdown();
    }
}

/// What a stream gave: the token ids and text before its end, and the first line of the error
/// it ended with (`None`: it finished; llguidance's state dump follows on the next lines).
fn collect_or_error(mut s: EventStream) -> (Vec<u32>, String, Option<String>) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => {
                ids.push(t.id);
                text.push_str(&t.text);
            }
            Some(Event::Text(x)) => text.push_str(&x),
            Some(Event::Done { .. }) => return (ids, text, None),
            Some(Event::Error(e)) => {
                return (ids, text, e.lines().next().map(str::to_string));
            }
            None => panic!("the stream ended without Done"),
        }
    }
}

/// A grammar whose mask cannot be computed (no token can extend it: llguidance's "no
/// extension") fails its own request with a `structured output failed` error, at the step
/// where the mask fails: at once for a grammar that rejects everything, after one token for
/// one that rejects everything after `x`. The requests batched with it (constrained and
/// not, plain and speculative) give their solo bytes. The masks are computed in the backend's
/// callback after the forward (`step_select_lazy_masks`); this is the behaviour the engine
/// had when it computed them before the step.
#[test]
fn a_grammar_that_rejects_everything_fails_only_its_request() {
    let grammars = Grammars::new(&tokenizer());
    let good = grammars
        .compile(&GrammarSpec::JsonSchema(schema()))
        .unwrap();
    let nothing = grammars
        .compile(&GrammarSpec::Lark("start: /[^\\s\\S]/\n".into()))
        .unwrap();
    let x_then_nothing = grammars
        .compile(&GrammarSpec::Lark("start: \"x\" /[^\\s\\S]/\n".into()))
        .unwrap();
    let p = prompts();
    let reqs = [
        request(p[0].clone(), 0, Some(nothing)),
        request(p[1].clone(), 17, Some(good)),
        request(p[2].clone(), 0, Some(x_then_nothing)),
        request(p[3].clone(), 34, None),
        request(p[4].clone(), 0, None),
    ];
    let solo_engine = start(512, None);
    let solo: Vec<_> = reqs
        .iter()
        .map(|r| collect_or_error(solo_engine.submit(r.clone()).unwrap()))
        .collect();
    solo_engine.shutdown();
    let failed = |o: &(Vec<u32>, String, Option<String>)| {
        o.2.as_deref()
            .is_some_and(|e| e.contains("structured output failed"))
    };
    assert!(solo[0].0.is_empty() && failed(&solo[0]), "{:?}", solo[0]);
    assert_eq!(solo[2].1, "x", "{:?}", solo[2]);
    assert!(failed(&solo[2]), "{:?}", solo[2]);
    for i in [1, 3, 4] {
        assert!(solo[i].2.is_none(), "request {i}: {:?}", solo[i]);
        assert!(!solo[i].0.is_empty(), "request {i}");
    }
    assert_batched_as_solo(&reqs, &solo, collect_or_error);
}
