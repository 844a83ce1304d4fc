//! The HTTP server on the REAL engine loop with a tiny synthetic model (2 layers, random weights,
//! the real SmolLM2 tokenizer and chat template) on the CPU: every inference endpoint, streaming
//! and not, greedy stream == non-stream text, seeded sampling reproducible, token-id prompts,
//! usage, metrics, and typed errors coming from the engine.

use std::sync::Arc;

use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, KvBudget};
use memra_server::auth::Auth;
use memra_server::real::RealEngine;
use memra_server::state::{Limits, State};
use serde_json::{Value, json};

use crate::common;

pub(crate) async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
    start_pp(1).await
}

/// The server over the tiny model split into `pp` pipeline stages (1: unsplit).
async fn start_pp(pp: usize) -> (String, tokio::sync::oneshot::Sender<()>) {
    let cfg = EngineConfig {
        device: Device::Cpu,
        threads: 2,
        kv: KvBudget::Blocks(128),
        pp: memra_engine::pipeline::PpConfig {
            stages: pp,
            ..Default::default()
        },
        ..EngineConfig::default()
    };
    let handle = Engine::start(
        vec![("tiny".into(), common::tiny_model(Arch::Llama), cfg)],
        AdmissionLimits::default(),
    )
    .expect("engine");
    let engine = Arc::new(RealEngine::from_handle(handle));
    common::serve(Arc::new(State::new(engine, Auth::Open, Limits::default()))).await
}

pub(crate) async fn post(url: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .expect("request")
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
pub(crate) async fn sse(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.expect("body");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn streamed_text(events: &[String], field: &str) -> (String, Value, usize) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let (mut usage, mut finishes) = (Value::Null, 0);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("chunk JSON");
        if let Some(c) = v["choices"].get(0) {
            if let Some(s) = c.pointer(field).and_then(Value::as_str) {
                text.push_str(s);
            }
            if c["finish_reason"].is_string() {
                finishes += 1;
            }
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (text, usage, finishes)
}

/// `--pp 2`: /v1/models reports the split, and a greedy and a seeded sampled completion give
/// the unsplit server's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_model_serves_the_unsplit_text_and_reports_its_split() {
    let (whole, _a) = start_pp(1).await;
    let (split, _b) = start_pp(2).await;
    let models = |url: String| async move {
        let v: Value = reqwest::get(format!("{url}/v1/models"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["data"][0].clone()
    };
    let m = models(split.clone()).await;
    let p = m["pipeline"].as_str().expect("pipeline field").to_string();
    assert!(p.starts_with("pp 2: stage 0 cpu layers 0..1"), "{p}");
    assert!(
        p.contains("stage 1 cpu layers 1..2") && p.contains("host copy"),
        "{p}"
    );
    assert_eq!(m["backend"], "cpu,cpu");
    assert!(models(whole.clone()).await.get("pipeline").is_none());
    for params in [
        json!({"temperature": 0}),
        json!({"temperature": 0.9, "seed": 7}),
    ] {
        let mut body = json!({"model": "tiny", "max_tokens": 16,
                             "messages": [{"role": "user", "content": "Split me"}]});
        body.as_object_mut()
            .unwrap()
            .extend(params.as_object().unwrap().clone());
        let text = |url: String, body: Value| async move {
            let v: Value = post(&url, "/v1/chat/completions", &body)
                .await
                .json()
                .await
                .unwrap();
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let a = text(whole.clone(), body.clone()).await;
        let b = text(split.clone(), body.clone()).await;
        assert!(!a.is_empty());
        assert_eq!(a, b, "{params}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_on_the_real_engine_with_a_tiny_model() {
    let (url, _stop) = start().await;
    let models: Value = reqwest::get(format!("{url}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(
        reqwest::get(format!("{url}/ready")).await.unwrap().status(),
        200
    );

    // Chat, greedy: the streamed text equals the non-streamed text.
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}],
                      "max_tokens": 12, "temperature": 0});
    let r = post(&url, "/v1/chat/completions", &chat).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    let v: Value = r.json().await.unwrap();
    let whole = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let mut s = chat.clone();
    s["stream"] = json!(true);
    s["stream_options"] = json!({"include_usage": true});
    let events = sse(post(&url, "/v1/chat/completions", &s).await).await;
    let (text, usage, finishes) = streamed_text(&events, "/delta/content");
    assert_eq!(text, whole);
    assert_eq!(finishes, 1);
    assert_eq!(usage["completion_tokens"], 12);
    // The same prompt again hits the prefix cache only for whole blocks before the last token.
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());

    // Seeded sampling: same seed, same text.
    let seeded = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 10,
                        "temperature": 0.9, "seed": 42});
    let a: Value = post(&url, "/v1/completions", &seeded)
        .await
        .json()
        .await
        .unwrap();
    let b: Value = post(&url, "/v1/completions", &seeded)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // Token-id prompt, streamed completion with logprobs.
    let ids = json!({"model": "tiny", "prompt": [504, 3575, 282], "max_tokens": 5, "stream": true,
                     "logprobs": 2});
    let events = sse(post(&url, "/v1/completions", &ids).await).await;
    let (_, _, finishes) = streamed_text(&events, "/text");
    assert_eq!(finishes, 1);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert!(first["choices"][0]["logprobs"].is_object(), "{first}");

    // Engine-side refusal mapped once: prompt + max_tokens over the context.
    let long = json!({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 100000});
    let r = post(&url, "/v1/completions", &long).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].is_string());

    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("memra_"), "{metrics}");
}
