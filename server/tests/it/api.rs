//! Every endpoint over a real loopback server with the scripted engine: response shapes
//! (insta snapshots, ids and timestamps redacted), streaming, logprobs, stop strings, seeds,
//! each error class, 413, metrics.

use crate::common;

use crate::common::{TestServer, chat_body, expect_error, open, read_until};
use memra_engine::request::ValidRequest;
use memra_server::fake::REPLY;
use serde_json::{Value, json};

fn last_submitted(s: &TestServer) -> ValidRequest {
    s.engine.submitted.lock().unwrap().last().cloned().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_non_streaming_shape() {
    let s = open().await;
    let r = s
        .post("/v1/chat/completions", &json!({"model": "tiny", "max_tokens": 9,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}))
        .await;
    assert_eq!(r.status(), 200);
    let rid = r.headers()["x-request-id"].to_str().unwrap().to_string();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], format!("chatcmpl-{rid}"));
    let _sorted = sorted_snapshots();
    insta::assert_json_snapshot!(v, {".id" => "[id]", ".created" => "[created]"});
    let req = last_submitted(&s);
    assert_eq!(req.max_tokens, 9);
    assert_eq!(req.tenant, "default");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_streaming_shape_with_usage() {
    let s = open().await;
    let mut b = chat_body("hi");
    b["stream"] = json!(true);
    b["max_tokens"] = json!(3);
    b["stream_options"] = json!({"include_usage": true});
    let events = TestServer::sse(s.post("/v1/chat/completions", &b).await).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, &REPLY[..3]);
    let _sorted = sorted_snapshots();
    insta::assert_json_snapshot!(chunks, {"[].id" => "[id]", "[].created" => "[created]"});
}

#[tokio::test(flavor = "multi_thread")]
async fn completions_shapes_and_prompts() {
    let s = open().await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "Say", "max_tokens": 4, "logprobs": 2}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let _sorted = sorted_snapshots();
    insta::assert_json_snapshot!("completion", v, {".id" => "[id]", ".created" => "[created]"});
    // Token ids go to the engine as given.
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": [1, 70, 71], "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(last_submitted(&s).prompt, vec![1, 70, 71]);
    assert!(!last_submitted(&s).ignore_eos);
    // `ignore_eos` reaches the engine; a non-boolean names the field.
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": [1], "max_tokens": 2, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(last_submitted(&s).ignore_eos);
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": [1], "ignore_eos": "yes"}),
        )
        .await;
    let v = expect_error(r, 400, None).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ignore_eos"),
        "{v}"
    );
    // A token id outside the vocabulary names the parameter.
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": [1, 99999]}),
        )
        .await;
    let v = expect_error(r, 400, Some("invalid_value")).await;
    assert_eq!(v["error"]["param"], "prompt");
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": ["a", "b"]}),
        )
        .await;
    expect_error(r, 400, None).await;
    // Streaming completions.
    let b = json!({"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": true});
    let events = TestServer::sse(s.post("/v1/completions", &b).await).await;
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let _sorted = sorted_snapshots();
    insta::assert_json_snapshot!("completion_stream", chunks, {"[].id" => "[id]", "[].created" => "[created]"});
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_logprobs_stop_and_seed() {
    let s = open().await;
    let mut b = chat_body("hi");
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(2);
    b["max_tokens"] = json!(2);
    let v: Value = s
        .post("/v1/chat/completions", &b)
        .await
        .json()
        .await
        .unwrap();
    let lp = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(lp.as_array().unwrap().len(), 2);
    assert_eq!(lp[0]["token"], "T");
    assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(last_submitted(&s).logprobs, Some(2));

    let mut b = chat_body("hi");
    b["stop"] = json!(["brown", "zzz"]);
    let v: Value = s
        .post("/v1/chat/completions", &b)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "The quick ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        last_submitted(&s).stop,
        vec!["brown".to_string(), "zzz".to_string()]
    );

    let mut texts = Vec::new();
    for seed in [7, 7, 8] {
        let mut b = chat_body("hi");
        b["temperature"] = json!(0.8);
        b["seed"] = json!(seed);
        let v: Value = s
            .post("/v1/chat/completions", &b)
            .await
            .json()
            .await
            .unwrap();
        texts.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(texts[0], texts[1]);
    assert_ne!(texts[0], texts[2]);
    let p = last_submitted(&s).params;
    assert_eq!((p.temperature, p.seed), (0.8, 8));
}

#[tokio::test(flavor = "multi_thread")]
async fn models_and_probes() {
    let s = open().await;
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    let _sorted = sorted_snapshots();
    insta::assert_json_snapshot!("models", v);
    let r = s.get("/health").await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.get("/ready").await.status(), 200);
    s.engine.set_ready(false);
    assert_eq!(s.get("/ready").await.status(), 503);
    let r = s.post("/v1/chat/completions", &chat_body("hi")).await;
    assert_eq!(r.headers()["retry-after"], "5");
    expect_error(r, 503, Some("loading")).await;
    assert_eq!(s.get("/health").await.status(), 200);
    s.engine.set_ready(true);
    assert_eq!(s.get("/ready").await.status(), 200);
    s.state.start_draining();
    assert_eq!(s.get("/ready").await.status(), 503);
    let r = s.post("/v1/chat/completions", &chat_body("hi")).await;
    assert_eq!(r.headers()["retry-after"], "1");
    expect_error(r, 503, Some("draining")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_error_class() {
    let s = open().await;
    let c = TestServer::client();
    let url = format!("{}/v1/chat/completions", s.url);
    // Not JSON; wrong content type; unknown model; n != 1; context too long.
    let r = c
        .post(&url)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, None).await;
    let r = c
        .post(&url)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, None).await;
    let mut b = chat_body("hi");
    b["model"] = json!("nope");
    expect_error(
        s.post("/v1/chat/completions", &b).await,
        400,
        Some("model_not_found"),
    )
    .await;
    let mut b = chat_body("hi");
    b["n"] = json!(17);
    let v = expect_error(s.post("/v1/chat/completions", &b).await, 400, None).await;
    assert_eq!(v["error"]["param"], "n");
    let long = "x".repeat(600);
    let v = expect_error(
        s.post("/v1/chat/completions", &chat_body(&long)).await,
        400,
        Some("context_length_exceeded"),
    )
    .await;
    assert!(!v["error"]["message"].as_str().unwrap().contains("xxxx"));
    let mut b = chat_body("hi");
    b["max_tokens"] = json!(500);
    expect_error(
        s.post("/v1/chat/completions", &b).await,
        400,
        Some("context_length_exceeded"),
    )
    .await;
    // Engine refusals: 503 overload and 429 tenant limit, both with Retry-After.
    let r = s
        .post("/v1/chat/completions", &chat_body("[overload]"))
        .await;
    assert_eq!(r.headers()["retry-after"], "2");
    expect_error(r, 503, Some("overloaded")).await;
    let r = s
        .post("/v1/chat/completions", &chat_body("[tenant-limit]"))
        .await;
    assert_eq!(r.headers()["retry-after"], "3");
    expect_error(r, 429, Some("tenant_limit_exceeded")).await;
    // An engine failure: 500, or a final error chunk mid-stream.
    expect_error(
        s.post("/v1/chat/completions", &chat_body("[fail]")).await,
        500,
        Some("engine_error"),
    )
    .await;
    let mut b = chat_body("[fail]");
    b["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &b).await;
    assert_eq!(r.status(), 200);
    let events = TestServer::sse(r).await;
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "engine_error");
    assert_eq!(events.len(), 4, "role, 2 tokens, error: {events:?}");
    // Routes and methods.
    expect_error(s.get("/v1/nothing").await, 404, None).await;
    expect_error(s.get("/v1/chat/completions").await, 405, None).await;
    // The server is still up.
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn body_over_limit_is_413_without_echo() {
    let limits = memra_server::Limits {
        max_body_bytes: 1000,
        ..Default::default()
    };
    let s = common::start(memra_server::auth::Auth::Open, limits).await;
    let big = chat_body(&"SECRET".repeat(1000));
    let r = s.post("/v1/chat/completions", &big).await;
    let v = expect_error(r, 413, Some("body_too_large")).await;
    assert!(!v.to_string().contains("SECRET"));
    // Chunked: no Content-Length, the limit is counted as bytes arrive.
    let chunk = "S".repeat(600);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    let mut sock = s.raw(req.as_bytes()).await;
    let head = read_until(&mut sock, "\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let rest = read_until(&mut sock, "}}").await;
    assert!(!rest.contains("SSSS"));
    // A small body still works.
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn request_id_is_echoed_or_made() {
    let s = open().await;
    let r = TestServer::client()
        .get(format!("{}/health", s.url))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "abc-123");
    let r = TestServer::client()
        .get(format!("{}/health", s.url))
        .header("x-request-id", "bad id with spaces")
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 24);
}

/// `name{labels} value` lines of an OpenMetrics text.
fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name_and_labels} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_and_count() {
    let s = open().await;
    for n in [3, 5] {
        let mut b = chat_body("hi");
        b["max_tokens"] = json!(n);
        assert_eq!(s.post("/v1/chat/completions", &b).await.status(), 200);
    }
    let mut b = chat_body("hi");
    b["n"] = json!(0);
    assert_eq!(s.post("/v1/chat/completions", &b).await.status(), 400);
    let r = s.get("/metrics").await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics")
    );
    let t = r.text().await.unwrap();
    assert!(t.trim_end().ends_with("# EOF"));
    for l in t.lines().filter(|l| !l.starts_with('#')) {
        let (_, v) = l.rsplit_once(' ').unwrap();
        assert!(v.parse::<f64>().is_ok(), "bad sample line {l}");
    }
    let ok = r#"memra_requests_total{route="chat",status="200",tenant="default"}"#;
    assert_eq!(metric(&t, ok), 2.0);
    let bad = r#"memra_requests_total{route="chat",status="400",tenant="default"}"#;
    assert_eq!(metric(&t, bad), 1.0);
    assert_eq!(metric(&t, "memra_generation_tokens_total"), 8.0);
    let prompt = memra_server::fake::ByteText;
    let n = memra_server::ModelText::encode_chat(
        &prompt,
        &[memra_engine::chat::ChatMessage::new("user", "hi")],
    )
    .unwrap()
    .len();
    assert_eq!(metric(&t, "memra_prompt_tokens_total"), 2.0 * n as f64);
    assert_eq!(metric(&t, "memra_time_to_first_token_seconds_count"), 2.0);
    assert_eq!(metric(&t, "memra_inter_token_latency_seconds_count"), 6.0);
    assert_eq!(metric(&t, "memra_running_sequences"), 0.0);
    assert_eq!(metric(&t, "memra_kv_blocks_free"), 128.0);
    assert_eq!(metric(&t, "memra_kv_blocks_used"), 0.0);
    assert_eq!(metric(&t, "memra_queue_depth"), 0.0);
    // The second identical prompt hit the (simulated) prefix cache.
    assert!(metric(&t, "memra_prefix_cache_hit_tokens_total") > 0.0);
}

/// Snapshots list object keys sorted: the recorded form does not depend on whether serde_json
/// keeps insertion order (llguidance turns on its `preserve_order` for the whole workspace).
fn sorted_snapshots() -> insta::internals::SettingsBindDropGuard {
    let mut s = insta::Settings::clone_current();
    s.set_sort_maps(true);
    s.bind_to_scope()
}
