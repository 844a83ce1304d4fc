//! The HTTP server in process on the real engine loop, configured from flags exactly as the
//! binary is (`real::engine_settings`, `Limits::from_args`): limits flowing from flags and the
//! keyring to the engine, KV-bounded context, logprob bytes, held-back text at EOS, multi-byte
//! stop strings, a non-streaming client disconnecting, and preemption. Models: a tiny random one
//! (2 layers, the real SmolLM2 tokenizer; fast) or the real SmolLM2-135M, both on the CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use memra_engine::config::Arch;
use memra_engine::engine::{Engine, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::{Model, load_model};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::tokenizer::Tokenizer;
use memra_server::auth::{Auth, KeyringWatch};
use memra_server::config::Cli;
use memra_server::keys::KeyringFile;
use memra_server::real::{RealEngine, engine_settings};
use memra_server::state::{Limits, State};
use serde_json::{Value, json};

/// A tiny random model (context 512) with the real tokenizer and chat template.
fn tiny_model() -> Model {
    let g = Gguf::open(&memra_engine::testing::real_model()).expect("open SmolLM2");
    let tokenizer = Tokenizer::from_gguf(&g).expect("tokenizer");
    let chat = memra_engine::chat::ChatTemplate::from_gguf(&g, &tokenizer).expect("template");
    let mut config = tiny_config(Arch::Llama, tokenizer.vocab_size());
    config.max_ctx = 512;
    let weights = random_weights(&config, 3, DType::Q8_0).expect("weights");
    Model {
        path: "tiny".into(),
        config,
        weights,
        tokenizer,
        chat,
    }
}

fn real_model() -> Model {
    load_model(&memra_engine::testing::real_model()).expect("load SmolLM2")
}

struct Served {
    url: String,
    engine: EngineHandle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves `model` as `m` with the binary's flags `flags` (plus `--device cpu --threads 2`).
async fn serve(model: Model, flags: &[&str], auth: Auth) -> Served {
    let mut argv = vec!["memra-server", "--device", "cpu", "--threads", "2"];
    argv.extend_from_slice(flags);
    let args = Cli::try_parse_from(argv).expect("flags").serve;
    let (cfg, limits) = engine_settings(&args).expect("settings");
    let engine = Engine::start(vec![("m".into(), model, cfg)], limits).expect("engine");
    let real = Arc::new(RealEngine::from_handle(engine.clone()));
    let state = Arc::new(State::new(real, auth, Limits::from_args(&args)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        memra_server::serve(listener, state, async {
            let _ = rx.await;
        })
        .await
    });
    Served {
        url,
        engine,
        _stop: tx,
    }
}

async fn post(url: &str, path: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.expect("request")
}

/// Waits until `cond` holds; panics with `what` after 60 s (a deadline, not a measurement).
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A long streaming completion from token ids (it runs until the client goes away).
fn long_stream(i: usize) -> Value {
    json!({"model": "m", "prompt": [100 + i as u32, 7, 8, 9], "max_tokens": 400, "stream": true,
           "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_runs_more_than_32_sequences() {
    // Default flags: --max-running 64, --tenant-max-in-flight 64.
    let s = serve(tiny_model(), &["--kv-blocks", "2048"], Auth::Open).await;
    let mut held = Vec::new();
    for i in 0..40 {
        let r = post(&s.url, "/v1/completions", None, &long_stream(i)).await;
        assert_eq!(r.status(), 200, "request {i}");
        held.push(r);
    }
    let e = s.engine.clone();
    wait_for("40 running sequences of one tenant", || {
        let st = e.stats();
        st.running == 40 && st.queue_depth == 0
    })
    .await;
    assert_eq!(s.engine.stats().tenants["default"].running, 40);
    drop(held);
    let e = s.engine.clone();
    wait_for("the cancelled streams to free their KV", || {
        let st = e.stats();
        st.running == 0 && st.kv_blocks_used == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyring_tenants_limit_reaches_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.json");
    let mut ring = KeyringFile::default();
    let big = ring.add("big", Some(200)).unwrap();
    let small = ring.add("small", Some(3)).unwrap();
    ring.save(&path).unwrap();
    let auth = Auth::Keyring(Arc::new(KeyringWatch::open(path).unwrap()));
    // Default flags: 64 running, 64 in flight per tenant unless the keyring says otherwise.
    let s = serve(tiny_model(), &["--kv-blocks", "2048"], auth).await;
    let mut held = Vec::new();
    for i in 0..100 {
        let r = post(&s.url, "/v1/completions", Some(&big), &long_stream(i)).await;
        assert_eq!(r.status(), 200, "request {i} of a tenant allowed 200");
        held.push(r);
    }
    // All 100 are in the engine at once: 64 running, 36 queued.
    let t = s.engine.stats().tenants["big"];
    assert_eq!(t.running + t.queued, 100, "{t:?}");
    // A tenant allowed 3: the fourth gets 429.
    for i in 0..3 {
        let r = post(&s.url, "/v1/completions", Some(&small), &long_stream(i)).await;
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let r = post(&s.url, "/v1/completions", Some(&small), &long_stream(3)).await;
    assert_eq!(r.status(), 429);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_pool_smaller_than_the_context_bounds_every_request() {
    // 20 blocks of 16 less the 1-block admission reserve: 304 positions (the context is 512).
    let s = serve(tiny_model(), &["--kv-blocks", "20"], Auth::Open).await;
    let models: Value = reqwest::get(format!("{}/v1/models", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 304);
    // Without max_tokens: everything that fits.
    let body = json!({"model": "m", "prompt": [1, 2, 3], "temperature": 0});
    let r = post(&s.url, "/v1/completions", None, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 301);
    // Over it: the error says the real bound and names the prompt parameter of the route.
    let body = json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 302});
    let r = post(&s.url, "/v1/completions", None, &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "context_length_exceeded");
    assert_eq!(e["error"]["param"], "prompt");
    assert!(
        e["error"]["message"].as_str().unwrap().contains(" 304 "),
        "{e}"
    );
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 300});
    let r = post(&s.url, "/v1/chat/completions", None, &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "messages");
    let prompt: Vec<u32> = (0..304).map(|i| 100 + i).collect();
    let r = post(
        &s.url,
        "/v1/completions",
        None,
        &json!({"model": "m", "prompt": prompt}),
    )
    .await;
    assert_eq!(r.status(), 400, "a prompt that fills every position");
}
