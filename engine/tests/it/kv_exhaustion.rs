//! KV exhaustion on the engine (CPU, tiny model): more requests than the KV pool holds. What
//! the scheduler does, asserted: each request that fits the pool alone is admitted when a block
//! is free beyond its prompt; when the running sequences outgrow the pool the youngest is
//! preempted (its KV freed) and recomputed later. Every request completes (no hang), with the
//! same tokens and logprob bytes as when it ran alone; the pool is empty afterwards. A request
//! that could never fit is refused at submission (`refusals_are_immediate_and_typed`).

use std::sync::mpsc;
use std::time::Duration;

use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle, KvBudget};
use memra_engine::loader::Model;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::scheduler::SchedulerConfig;
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;

use crate::tiny_files::{VOCAB, tokenizer_meta};

fn model() -> Model {
    let weights = random_weights(&tiny_config(Arch::Llama, VOCAB), 5, DType::Q8_0).expect("w");
    let meta = tokenizer_meta();
    let tokenizer =
        Tokenizer::from_gguf_metadata(|k| meta.iter().find(|(m, _)| m == k).map(|p| &p.1))
            .expect("tokenizer");
    Model {
        path: "tiny".into(),
        config: weights.config.clone(),
        weights,
        tokenizer,
        chat: None,
    }
}

/// An engine with `blocks` KV blocks of 4 positions.
fn engine(blocks: usize) -> EngineHandle {
    let cfg = EngineConfig {
        pp: Default::default(),
        device: Device::Cpu,
        threads: 1,
        block_size: 4,
        kv: KvBudget::Blocks(blocks),
        kv_dtype: Default::default(),
        scheduler: SchedulerConfig {
            max_batch_tokens: 16,
            max_running: 8,
            max_running_per_tenant: 8,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        },
        prefix_cache: false,
        spec: None,
    };
    Engine::start(
        vec![("tiny".into(), model(), cfg)],
        AdmissionLimits::default(),
    )
    .expect("engine")
}

fn request(i: usize) -> ValidRequest {
    let prompt = (0..10).map(|j| ((i * 31 + j * 7) % 250) as u32).collect();
    ValidRequest {
        model: "tiny".into(),
        tenant: format!("t{}", i % 3),
        params: if i.is_multiple_of(2) {
            SamplingParams::default()
        } else {
            SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                seed: 40 + i as u64,
                ..SamplingParams::default()
            }
        },
        logprobs: Some(2),
        ..text_request(prompt, 26)
    }
}

/// Token ids and logprob bits of a finished stream; panics on an error event.
type Output = Vec<(u32, u32)>;

fn collect(mut s: EventStream) -> Output {
    let mut out = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => out.push((t.id, t.logprob.map_or(0, f32::to_bits))),
            Some(Event::Text(_)) => {}
            Some(Event::Done { .. }) | None => return out,
            Some(Event::Error(e)) => panic!("request failed: {e}"),
        }
    }
}

/// Runs `f` on a thread; fails the test if it takes over `secs` (a hang).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the engine hung (or the thread panicked)")
}

#[test]
fn more_requests_than_the_kv_holds_are_preempted_and_stay_exact() {
    const N: usize = 6;
    // Alone: a pool that holds every request whole.
    let alone: Vec<Output> = within(120, || {
        let e = engine(64);
        let v = (0..N)
            .map(|i| collect(e.submit(request(i)).expect("submit")))
            .collect();
        let s = e.stats();
        assert_eq!(s.models[0].preemptions_total, 0, "no preemption alone");
        e.shutdown();
        v
    });
    // Together: 14 blocks of 4 (a request needs 9 blocks whole; six need 54).
    let (together, stats) = within(120, || {
        let e = engine(14);
        assert_eq!(e.models()[0].max_positions, 52);
        let streams: Vec<EventStream> = (0..N)
            .map(|i| {
                e.submit(request(i))
                    .expect("each request fits the pool alone")
            })
            .collect();
        let v: Vec<Output> = streams.into_iter().map(collect).collect();
        // The model thread publishes its counters after each step: wait for the last one.
        let mut s = e.stats();
        for _ in 0..500 {
            if s.models[0].running == 0 && s.models[0].kv_blocks_used == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            s = e.stats();
        }
        e.shutdown();
        (v, s)
    });
    let m = &stats.models[0];
    assert!(
        m.preemptions_total > 0,
        "the pool was exhausted but nothing was preempted: {m:?}"
    );
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(t.len(), 26, "request {i} finished short");
        assert_eq!(t, a, "request {i}: tokens/logprobs differ after preemption");
    }
    assert_eq!((m.running, m.waiting, m.kv_blocks_used), (0, 0, 0), "{m:?}");
    assert_eq!(stats.requests_finished_total, N as u64);
}
