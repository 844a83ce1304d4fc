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
use memra_engine::loader::{Model, load_model};
use memra_server::auth::{Auth, KeyringWatch};
use memra_server::config::Cli;
use memra_server::keys::KeyringFile;
use memra_server::real::{RealEngine, engine_settings};
use memra_server::state::{Limits, State};
use serde_json::{Value, json};

use crate::common;

/// A tiny random llama (context 512) with the real tokenizer and chat template.
fn tiny_model() -> Model {
    common::tiny_model(Arch::Llama)
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
    let (url, stop) = common::serve(state).await;
    Served {
        url,
        engine,
        _stop: stop,
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
    // Streams answer with their first token, so the queued ones are sent concurrently (a
    // task each, holding its response open).
    let send = |key: &str, i: usize| {
        let (url, key) = (s.url.clone(), key.to_string());
        tokio::spawn(async move {
            let r = post(&url, "/v1/completions", Some(&key), &long_stream(i)).await;
            assert_eq!(r.status(), 200, "request {i}");
            r
        })
    };
    let mut held: Vec<_> = (0..100).map(|i| send(&big, i)).collect();
    // All 100 are in the engine at once: 64 running, 36 queued.
    let e = s.engine.clone();
    wait_for("100 requests of a tenant allowed 200 in the engine", || {
        e.stats()
            .tenants
            .get("big")
            .is_some_and(|t| t.running + t.queued == 100)
    })
    .await;
    // A tenant allowed 3: the fourth gets 429.
    held.extend((0..3).map(|i| send(&small, i)));
    let e = s.engine.clone();
    wait_for("3 requests of a tenant allowed 3 in the engine", || {
        e.stats()
            .tenants
            .get("small")
            .is_some_and(|t| t.running + t.queued == 3)
    })
    .await;
    let r = post(&s.url, "/v1/completions", Some(&small), &long_stream(3)).await;
    assert_eq!(r.status(), 429);
    for h in held {
        h.abort();
    }
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
    assert_eq!(models["data"][0]["backend"], "cpu");
    assert!(models["data"][0].get("device_profile").is_none());
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

/// A chat request's messages rendered by SmolLM2's template, as a completions prompt string.
const CHINESE_CHAT: &str =
    "<|im_start|>user\nSay hello in Chinese characters<|im_end|>\n<|im_start|>assistant\n";

/// `{token: logprob}` maps with their key order kept.
struct Ordered(Vec<(String, f64)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry::<String, f64>()? {
                    v.push(e);
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(serde::Deserialize)]
struct CmplLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f64>,
    top_logprobs: Vec<Ordered>,
    text_offset: Vec<usize>,
}

/// Per streamed chunk: its text and its logprobs.
fn cmpl_chunks(events: &[String]) -> Vec<(String, Option<CmplLogprobs>)> {
    #[derive(serde::Deserialize)]
    struct Chunk {
        choices: Vec<Choice>,
    }
    #[derive(serde::Deserialize)]
    struct Choice {
        text: String,
        logprobs: Option<CmplLogprobs>,
    }
    events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Chunk>(e).ok())
        .filter_map(|c| c.choices.into_iter().next())
        .map(|c| (c.text, c.logprobs))
        .collect()
}

async fn sse(r: reqwest::Response) -> Vec<String> {
    let (events, ok) = memra_server::sse::parse_events(&r.text().await.unwrap());
    assert!(ok && events.last().map(String::as_str) == Some("[DONE]"));
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_carry_each_tokens_raw_bytes_in_probability_order() {
    let s = serve(real_model(), &["--kv-blocks", "256"], Auth::Open).await;
    // Chat: SmolLM2 answers in Chinese, one byte-level token per part of a character.
    let body = json!({"model": "m", "temperature": 0, "max_tokens": 16, "logprobs": true,
        "top_logprobs": 3, "messages": [{"role": "user", "content": "Say hello in Chinese characters"}]});
    let v: Value = post(&s.url, "/v1/chat/completions", None, &body)
        .await
        .json()
        .await
        .unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        entries.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let bytes_of = |e: &Value| -> Vec<u8> {
        e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect()
    };
    let all: Vec<u8> = entries.iter().flat_map(bytes_of).collect();
    assert_eq!(String::from_utf8_lossy(&all), content);
    assert!(
        entries
            .iter()
            .any(|e| std::str::from_utf8(&bytes_of(e)).is_err()),
        "expected tokens holding parts of characters: {content:?}"
    );
    for e in entries {
        assert_eq!(e["token"], String::from_utf8_lossy(&bytes_of(e)).as_ref());
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the token is the most likely; alternatives descend and are distinct.
        assert_eq!(bytes_of(&top[0]), bytes_of(e));
        assert!(
            top.windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64())
        );
        assert!(bytes_of(&top[0]) != bytes_of(&top[1]) && bytes_of(&top[1]) != bytes_of(&top[2]));
        for t in top {
            assert_eq!(t["token"], String::from_utf8_lossy(&bytes_of(t)).as_ref());
        }
    }
    // Streamed: the same entries.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events = sse(post(&s.url, "/v1/chat/completions", None, &sb).await).await;
    let streamed: Vec<Value> = events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, entries);

    // Completions: every top_logprobs map has 3 keys, most likely first; a token holding part of
    // a character is named by its bytes; text_offset counts characters of the text before it.
    let body = json!({"model": "m", "temperature": 0, "max_tokens": 12, "logprobs": 3,
                      "prompt": CHINESE_CHAT});
    let r = post(&s.url, "/v1/completions", None, &body).await;
    let raw = r.text().await.unwrap();
    #[derive(serde::Deserialize)]
    struct Resp {
        choices: Vec<Choice>,
    }
    #[derive(serde::Deserialize)]
    struct Choice {
        text: String,
        logprobs: CmplLogprobs,
    }
    let resp: Resp = serde_json::from_str(&raw).unwrap();
    let Choice { text, logprobs: lp } = &resp.choices[0];
    assert!(text.chars().any(|c| c.len_utf8() > 1), "{text:?}");
    assert!(
        lp.tokens.iter().any(|t| t.starts_with("bytes:\\x")),
        "{raw}"
    );
    for (i, top) in lp.top_logprobs.iter().enumerate() {
        assert_eq!(top.0.len(), 3, "{raw}");
        assert_eq!(top.0[0].0, lp.tokens[i]);
        assert_eq!(top.0[0].1, lp.token_logprobs[i]);
        assert!(top.0.windows(2).all(|w| w[0].1 >= w[1].1), "{raw}");
    }
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = cmpl_chunks(&sse(post(&s.url, "/v1/completions", None, &sb).await).await);
    let mut chars = 0;
    let mut offsets = Vec::new();
    let mut streamed = String::new();
    for (t, l) in &chunks {
        if let Some(l) = l {
            offsets.push(l.text_offset[0]);
            assert_eq!(l.text_offset[0], chars, "offset of {:?}", l.tokens);
        }
        chars += t.chars().count();
        streamed.push_str(t);
    }
    assert_eq!(&streamed, text);
    assert_eq!(offsets, lp.text_offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_back_text_at_eos_adds_no_logprob_entry() {
    let s = serve(real_model(), &["--kv-blocks", "256"], Auth::Open).await;
    let body = json!({"model": "m", "temperature": 0, "max_tokens": 64, "logprobs": true,
        "messages": [{"role": "user", "content": "Say hello"}]});
    let plain: Value = post(&s.url, "/v1/chat/completions", None, &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    let content = plain["choices"][0]["message"]["content"].as_str().unwrap();
    let n = plain["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(
        plain["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .len(),
        n
    );
    // A stop string starting with the reply's last character, never matching (the ".X").
    let last = content.chars().last().unwrap();
    let mut held = body.clone();
    held["stop"] = json!(format!("{last}X\u{1}"));
    let v: Value = post(&s.url, "/v1/chat/completions", None, &held)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0], plain["choices"][0]);
    assert_eq!(
        v["usage"]["completion_tokens"],
        plain["usage"]["completion_tokens"]
    );
    // Streamed: the same text, one logprob entry per completion token.
    held["stream"] = json!(true);
    held["stream_options"] = json!({"include_usage": true});
    let events = sse(post(&s.url, "/v1/chat/completions", None, &held).await).await;
    let (mut text, mut entries, mut usage) = (String::new(), 0, Value::Null);
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        entries += c["choices"][0]["logprobs"]["content"]
            .as_array()
            .map_or(0, Vec::len);
        if !c["usage"].is_null() {
            usage = c["usage"].clone();
        }
    }
    assert_eq!(text, content);
    assert_eq!(entries, n);
    assert_eq!(usage["completion_tokens"], n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_byte_stop_strings_through_the_real_tokenizer() {
    let s = serve(real_model(), &["--kv-blocks", "256"], Auth::Open).await;
    let body = json!({"model": "m", "temperature": 0, "max_tokens": 12, "prompt": CHINESE_CHAT});
    let plain: Value = post(&s.url, "/v1/completions", None, &body)
        .await
        .json()
        .await
        .unwrap();
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    // The second and third characters: multi-byte, each spread over several byte-level tokens.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 3 && chars[1].len_utf8() > 1, "{text:?}");
    let stop: String = chars[1..3].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut stopped = body.clone();
    stopped["stop"] = json!(["never", stop]);
    let v: Value = post(&s.url, "/v1/completions", None, &stopped)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    stopped["stream"] = json!(true);
    let chunks = cmpl_chunks(&sse(post(&s.url, "/v1/completions", None, &stopped).await).await);
    let streamed: String = chunks.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(streamed, cut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_client_that_disconnects_cancels_its_request() {
    use tokio::io::AsyncWriteExt;
    let s = serve(tiny_model(), &["--kv-blocks", "256"], Auth::Open).await;
    let body = json!({"model": "m", "prompt": [5, 6, 7, 8], "max_tokens": 500, "temperature": 0})
        .to_string();
    let addr = s.url.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let e = s.engine.clone();
    wait_for("the request to run", || e.stats().running == 1).await;
    drop(sock);
    let e = s.engine.clone();
    wait_for("the request to end", || {
        let st = e.stats();
        st.running == 0 && st.queue_depth == 0 && st.kv_blocks_used == 0
    })
    .await;
    let st = s.engine.stats();
    assert_eq!(st.requests_finished_total, 1);
    let generated = st.models[0].tokens_generated_total;
    assert!(generated < 500, "the request ran to its end: {st:?}");
    // Left alone, the same request does run to 500 tokens.
    let full: Value = post(
        &s.url,
        "/v1/completions",
        None,
        &serde_json::from_str(&body).unwrap(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(full["usage"]["completion_tokens"], 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_under_a_small_kv_pool_changes_no_output() {
    // 24 blocks of 16: one request (20 + 300 positions, 20 blocks) fits alone; four do not.
    let s = serve(tiny_model(), &["--kv-blocks", "24"], Auth::Open).await;
    let body = |i: u32| {
        let mut b = json!({"model": "m", "max_tokens": 300,
            "prompt": (0..20).map(|j| 300 + 37 * i + j).collect::<Vec<u32>>()});
        if i % 2 == 1 {
            b["temperature"] = json!(0.9);
            b["seed"] = json!(i);
        } else {
            b["temperature"] = json!(0);
        }
        b
    };
    let run = |i: u32| {
        let url = s.url.clone();
        async move {
            let v: Value = post(&url, "/v1/completions", None, &body(i))
                .await
                .json()
                .await
                .unwrap();
            v["choices"][0].clone()
        }
    };
    let mut solo = Vec::new();
    for i in 0..4 {
        solo.push(run(i).await);
    }
    assert_eq!(s.engine.stats().models[0].preemptions_total, 0);
    let together: Vec<_> = (0..4).map(|i| tokio::spawn(run(i))).collect();
    for (i, t) in together.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), solo[i], "request {i} under preemption");
    }
    assert!(s.engine.stats().models[0].preemptions_total > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_temperature_is_greedy_on_both_endpoints() {
    let s = serve(tiny_model(), &["--kv-blocks", "64"], Auth::Open).await;
    for (path, prompt) in [
        ("/v1/completions", json!({"prompt": [9, 8, 7]})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        let mut texts = Vec::new();
        for t in [0.0, 1e-38, 1e-30, 1e-6] {
            let mut b = prompt.clone();
            b["model"] = json!("m");
            b["max_tokens"] = json!(8);
            b["temperature"] = json!(t);
            let v: Value = post(&s.url, path, None, &b).await.json().await.unwrap();
            texts.push(v["choices"][0].clone());
        }
        assert!(texts.iter().all(|t| *t == texts[0]), "{path}: {texts:?}");
    }
}
