//! The engine end to end on the CPU backend with a tiny random model and the real SmolLM2
//! tokenizer: exact under load (vs `generate` alone, staggered arrivals, chunked prefill, a small
//! KV pool, prefix-cache hits), stop strings, cancellation, admission refusals, namespaces.

use crate::common;

use std::time::{Duration, Instant};

use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::generate::FinishReason;
use memra_engine::loader::Model;
use memra_engine::models::ModelWeights;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, SubmitError, Usage, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;

const VOCAB: usize = 49152;

fn weights() -> ModelWeights {
    random_weights(&tiny_config(Arch::Llama, VOCAB), 11, DType::Q8_0).unwrap()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&Gguf::open(&common::real_model()).unwrap()).unwrap()
}

fn model() -> Model {
    let weights = weights();
    Model {
        path: "tiny".into(),
        config: weights.config.clone(),
        weights,
        tokenizer: tokenizer(),
        chat: None,
    }
}

fn start(kv_blocks: usize, budget: usize, limits: AdmissionLimits) -> EngineHandle {
    Engine::start(
        vec![(
            "tiny".into(),
            model(),
            common::cpu_engine_config(kv_blocks, budget),
        )],
        limits,
    )
    .unwrap()
}

fn request(prompt: Vec<u32>, max_tokens: usize, params: SamplingParams) -> ValidRequest {
    ValidRequest {
        model: "tiny".into(),
        params,
        logprobs: Some(3),
        speculative: true,
        ..text_request(prompt, max_tokens)
    }
}

/// Everything a stream carried.
#[derive(Debug, Default, PartialEq)]
struct Collected {
    tokens: Vec<u32>,
    text: String,
    /// Logprob bits and top alternatives' bits, per token.
    logprobs: Vec<(u32, Vec<(u32, u32)>)>,
    finish: Option<FinishReason>,
    usage: Usage,
    /// `Text` events (text of no token).
    texts: usize,
}

fn next(s: &mut EventStream, c: &mut Collected) -> bool {
    match s.blocking_recv() {
        Some(Event::Token(t)) => {
            c.tokens.push(t.id);
            c.text.push_str(&t.text);
            let top = t
                .top_logprobs
                .iter()
                .map(|(i, l)| (*i, l.to_bits()))
                .collect();
            c.logprobs.push((t.logprob.map_or(0, f32::to_bits), top));
            true
        }
        Some(Event::Text(s)) => {
            c.text.push_str(&s);
            c.texts += 1;
            true
        }
        Some(Event::Done {
            finish_reason,
            usage,
        }) => {
            c.finish = Some(finish_reason);
            c.usage = usage;
            false
        }
        Some(Event::Error(e)) => panic!("request failed: {e}"),
        None => false,
    }
}

fn collect(mut s: EventStream) -> Collected {
    let mut c = Collected::default();
    while next(&mut s, &mut c) {}
    assert!(c.finish.is_some(), "the stream ended without Done");
    c
}

fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..37).map(|i| 100 + i * 13).collect();
    let mut v = vec![
        vec![5, 9, 12],
        (0..61).map(|i| 7 + i * 31).collect(),
        (0..16).map(|i| 900 + i).collect(),
    ];
    for tail in [vec![1u32, 2, 3], vec![4, 5, 6, 7, 8, 9, 10], vec![11]] {
        let mut p = shared.clone();
        p.extend(tail);
        v.push(p);
    }
    v
}

fn params(i: usize) -> SamplingParams {
    if i.is_multiple_of(2) {
        SamplingParams::default()
    } else {
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            repetition_penalty: 1.1,
            frequency_penalty: 0.2,
            seed: 1000 + i as u64,
            ..Default::default()
        }
    }
}

#[test]
fn exact_alone_under_load_and_with_prefix_hits() {
    let prompts = prompts();
    let max_tokens = 12;
    // The reference: generate() alone on a fresh backend.
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| common::generate_alone(weights(), p, max_tokens, params(i)))
        .collect();
    // A small pool (a 73-position request takes 19 of 48 blocks) and a 7-token step budget:
    // chunked prefill, and preemption when the batch grows.
    let engine = start(48, 7, AdmissionLimits::default());
    let alone: Vec<Collected> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            collect(
                engine
                    .submit(request(p.clone(), max_tokens, params(i)))
                    .unwrap(),
            )
        })
        .collect();
    for (i, (a, r)) in alone.iter().zip(&reference).enumerate() {
        assert_eq!(&a.tokens, r, "prompt {i}: engine alone vs generate()");
        assert_eq!(a.finish, Some(FinishReason::Length));
        assert_eq!(a.usage.completion_tokens, max_tokens);
        assert_eq!(a.usage.prompt_tokens, prompts[i].len());
    }
    // Together, staggered: half first; the rest once the first has produced two tokens.
    let mut first = engine
        .submit(request(prompts[0].clone(), max_tokens, params(0)))
        .unwrap();
    let mut c0 = Collected::default();
    let mut streams: Vec<EventStream> = (1..3)
        .map(|i| {
            engine
                .submit(request(prompts[i].clone(), max_tokens, params(i)))
                .unwrap()
        })
        .collect();
    next(&mut first, &mut c0);
    next(&mut first, &mut c0);
    streams.extend((3..prompts.len()).map(|i| {
        engine
            .submit(request(prompts[i].clone(), max_tokens, params(i)))
            .unwrap()
    }));
    while next(&mut first, &mut c0) {}
    let mut together = vec![c0];
    together.extend(streams.into_iter().map(collect));
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(t.tokens, a.tokens, "prompt {i}: tokens under load");
        assert_eq!(t.text, a.text, "prompt {i}: text under load");
        assert_eq!(
            t.logprobs, a.logprobs,
            "prompt {i}: logprob bytes under load"
        );
    }
    // The shared prefix was served from the cache for the later requests.
    let warm: Vec<Collected> = (0..prompts.len())
        .map(|i| {
            engine
                .submit(request(prompts[i].clone(), max_tokens, params(i)))
                .unwrap()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(collect)
        .collect();
    for (i, (w, a)) in warm.iter().zip(&alone).enumerate() {
        assert_eq!(
            (&w.tokens, &w.logprobs),
            (&a.tokens, &a.logprobs),
            "prompt {i} warm"
        );
    }
    assert!(warm[4].usage.cached_tokens >= 36, "{:?}", warm[4].usage);
    let s = engine.stats();
    eprintln!("engine stats: {s:?}");
    assert!(s.prefix_hit_tokens_total > 0);
    engine.shutdown();
    let s = engine.stats();
    assert_eq!((s.running, s.queue_depth, s.kv_blocks_used), (0, 0, 0));
    assert!(!engine.is_ready());
}

#[test]
fn stop_strings_end_the_text_before_the_match() {
    let engine = start(64, 64, AdmissionLimits::default());
    let prompt: Vec<u32> = (0..10).map(|i| 300 + i * 7).collect();
    let full = collect(
        engine
            .submit(request(prompt.clone(), 16, params(0)))
            .unwrap(),
    );
    assert_eq!(full.finish, Some(FinishReason::Length));
    // A stop string taken from the middle of the full text, spanning token boundaries.
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() > 8, "text too short: {:?}", full.text);
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let mut req = request(prompt.clone(), 16, params(0));
    req.stop = vec!["never-appears-xyz".into(), stop.clone()];
    let cut = collect(engine.submit(req).unwrap());
    let at = full.text.find(&stop).unwrap();
    assert_eq!(cut.text, full.text[..at]);
    assert!(!cut.text.contains(&stop));
    assert_eq!(cut.finish, Some(FinishReason::Stop));
    assert!(cut.tokens.len() < full.tokens.len());
    assert_eq!(cut.tokens[..], full.tokens[..cut.tokens.len()]);
    assert_eq!(cut.usage.completion_tokens, cut.tokens.len());
    assert_eq!(cut.logprobs.len(), cut.tokens.len());
    // The stream ended the request on its side; `Done` came once the engine had let it go
    // (its admission slot is free); the engine frees its KV.
    assert_eq!(
        engine.stats().requests_finished_total,
        2,
        "{:?}",
        engine.stats()
    );
    assert!(wait_idle(&engine), "{:?}", engine.stats());
    engine.shutdown();
}

fn wait_idle(engine: &EngineHandle) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let s = engine.stats();
        if s.running == 0 && s.queue_depth == 0 && s.kv_blocks_used == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn dropping_the_stream_cancels_and_frees_kv() {
    let engine = start(64, 64, AdmissionLimits::default());
    let prompt: Vec<u32> = (0..30).collect();
    let mut s = engine
        .submit(request(prompt.clone(), 200, params(0)))
        .unwrap();
    let mut c = Collected::default();
    assert!(next(&mut s, &mut c));
    drop(s);
    // A queued one, never read.
    drop(engine.submit(request(prompt, 200, params(1))).unwrap());
    assert!(
        wait_idle(&engine),
        "stats after cancel: {:?}",
        engine.stats()
    );
    let s = engine.stats();
    assert_eq!(s.requests_finished_total, 2);
    assert!(s.models[0].tokens_generated_total < 400);
    engine.shutdown();
}

#[test]
fn refusals_are_immediate_and_typed() {
    let engine = start(16, 64, AdmissionLimits::default());
    let ok = request(vec![1, 2, 3], 4, params(0));
    let mut r = ok.clone();
    r.model = "nope".into();
    assert_eq!(
        engine.submit(r).err(),
        Some(SubmitError::ModelNotFound("nope".into()))
    );
    let mut r = ok.clone();
    r.prompt.clear();
    assert!(matches!(engine.submit(r), Err(SubmitError::Invalid(_))));
    let mut r = ok.clone();
    r.prompt = vec![VOCAB as u32];
    assert!(matches!(engine.submit(r), Err(SubmitError::Invalid(m)) if m.contains("49152")));
    // 16 blocks of 4 less the 1-block reserve: 60 positions.
    let r = request((0..50).collect(), 11, params(0));
    assert_eq!(
        engine.submit(r).err(),
        Some(SubmitError::ContextLength {
            prompt: 50,
            max_tokens: 11,
            ctx: 60
        })
    );
    assert_eq!(engine.models()[0].max_ctx, 256);
    assert_eq!(engine.models()[0].max_positions, 60);
    assert!(engine.tokenizer("tiny").is_some() && engine.chat_template("tiny").is_none());
    assert!(engine.is_ready());
    collect(engine.submit(ok.clone()).unwrap());
    engine.drain();
    assert_eq!(engine.submit(ok).err(), Some(SubmitError::Draining));
    assert!(!engine.is_ready());
    engine.shutdown();

    let tenant0 = AdmissionLimits {
        max_in_flight_per_tenant: 0,
        max_queued: 10,
    };
    let engine = start(16, 64, tenant0);
    let err = engine.submit(request(vec![1], 1, params(0))).err();
    assert!(
        matches!(&err, Some(SubmitError::TenantLimit { tenant, retry_after_s }) if tenant == "t" && *retry_after_s >= 1),
        "{err:?}"
    );
    engine.shutdown();
    let global0 = AdmissionLimits {
        max_queued: 0,
        ..Default::default()
    };
    let engine = start(16, 64, global0);
    let err = engine.submit(request(vec![1], 1, params(0))).err();
    assert!(
        matches!(err, Some(SubmitError::Overloaded { .. })),
        "{err:?}"
    );
    assert_eq!(engine.stats().requests_refused_total, 1);
    engine.shutdown();
}

#[test]
fn tenants_and_salts_never_share_the_prefix_cache() {
    let engine = start(64, 64, AdmissionLimits::default());
    let prompt: Vec<u32> = (0..21).map(|i| 40 + i).collect();
    let first = collect(
        engine
            .submit(request(prompt.clone(), 2, params(0)))
            .unwrap(),
    );
    assert_eq!(first.usage.cached_tokens, 0);
    let mut other = request(prompt.clone(), 2, params(0));
    other.tenant = "u".into();
    let b = collect(engine.submit(other).unwrap());
    let mut salted = request(prompt.clone(), 2, params(0));
    salted.cache_salt = Some("s".into());
    let c = collect(engine.submit(salted).unwrap());
    let same = collect(
        engine
            .submit(request(prompt.clone(), 2, params(0)))
            .unwrap(),
    );
    assert_eq!(b.usage.cached_tokens, 0);
    assert_eq!(c.usage.cached_tokens, 0);
    assert_eq!(same.usage.cached_tokens, 20);
    // Same output whatever the cache did.
    assert_eq!(b.tokens, first.tokens);
    assert_eq!(same.tokens, first.tokens);
    engine.shutdown();
}

/// The real SmolLM2 on the CPU (it ends its replies with `<|im_end|>`).
fn start_real() -> (EngineHandle, Tokenizer, memra_engine::chat::ChatTemplate) {
    let mut m = memra_engine::loader::load_model(&common::real_model()).unwrap();
    let (tok, chat) = (m.tokenizer.clone(), m.chat.take().unwrap());
    let mut cfg = common::cpu_engine_config(256, 64);
    cfg.block_size = 16;
    let engine = Engine::start(vec![("tiny".into(), m, cfg)], AdmissionLimits::default()).unwrap();
    (engine, tok, chat)
}

fn chat_prompt(tok: &Tokenizer, chat: &memra_engine::chat::ChatTemplate, say: &str) -> Vec<u32> {
    let msgs = [memra_engine::chat::ChatMessage::new("user", say)];
    tok.encode(&chat.render(&msgs, true).unwrap(), false)
        .unwrap()
}

#[test]
fn end_of_sequence_sends_held_back_text_without_a_token() {
    let (engine, tok, chat) = start_real();
    let mut req = request(chat_prompt(&tok, &chat, "Say hello"), 64, params(0));
    req.ignore_eos = false;
    let plain = collect(engine.submit(req.clone()).unwrap());
    assert_eq!(plain.finish, Some(FinishReason::Stop), "{plain:?}");
    assert_eq!(plain.tokens.len(), plain.usage.completion_tokens);
    assert_eq!(plain.logprobs.len(), plain.usage.completion_tokens);
    assert_eq!(plain.texts, 0);
    assert!(plain.tokens.iter().all(|t| !tok.stop_ids().contains(t)));
    // A stop string that starts with the reply's last character and never matches: that
    // character is held back until the end of sequence, then sent as text only.
    let last = plain.text.chars().last().unwrap();
    req.stop = vec![format!("{last}\u{1}never")];
    let held = collect(engine.submit(req).unwrap());
    assert_eq!(held.texts, 1);
    assert_eq!(held.text, plain.text);
    assert_eq!(held.tokens, plain.tokens);
    assert_eq!(held.logprobs, plain.logprobs);
    assert_eq!(held.usage.completion_tokens, plain.usage.completion_tokens);
    assert_eq!(held.finish, Some(FinishReason::Stop));
    engine.shutdown();
}
