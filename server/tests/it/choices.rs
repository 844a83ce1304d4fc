//! `n` > 1 on the real engine loop (the tiny model of tiny_engine.rs): choice i is byte for byte
//! the same request with seed `seed + i` alone, whole and streamed; the usage counts the prompt
//! once and every choice's tokens; greedy choices are equal.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::tiny_engine::{post, sse, start};

async fn json_of(url: &str, path: &str, body: &Value) -> Value {
    let r = post(url, path, body).await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("JSON")
}

/// Per choice index: the streamed text (`field` of each chunk's choice) and finish reasons;
/// the usage chunk's usage; asserts one `[DONE]`, last.
fn streamed_choices(events: &[String], field: &str) -> (BTreeMap<u64, (String, usize)>, Value) {
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let (mut by, mut usage) = (BTreeMap::new(), Value::Null);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("chunk JSON");
        for c in v["choices"].as_array().expect("choices") {
            let (text, finishes) = by
                .entry(c["index"].as_u64().expect("index"))
                .or_insert((String::new(), 0));
            if let Some(s) = c.pointer(field).and_then(Value::as_str) {
                text.push_str(s);
            }
            if c["finish_reason"].is_string() {
                *finishes += 1;
            }
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (by, usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_choice_is_its_seeded_request_alone() {
    let (url, _stop) = start().await;
    let body = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8,
                      "temperature": 1.0, "seed": 40, "n": 3});
    let many = json_of(&url, "/v1/completions", &body).await;
    let choices = many["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{many}");
    let mut completion = 0;
    let mut alone = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i as u64);
        let mut one = body.clone();
        one["n"] = json!(1);
        one["seed"] = json!(40 + i as u64);
        let v = json_of(&url, "/v1/completions", &one).await;
        assert_eq!(c["text"], v["choices"][0]["text"], "choice {i}");
        assert_eq!(c["finish_reason"], v["choices"][0]["finish_reason"]);
        assert_eq!(many["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
        completion += v["usage"]["completion_tokens"].as_u64().unwrap();
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert_eq!(many["usage"]["completion_tokens"], completion);
    assert_eq!(
        many["usage"]["total_tokens"],
        many["usage"]["prompt_tokens"].as_u64().unwrap() + completion
    );
    // Three seeds over 8 sampled tokens: the choices are not one text thrice.
    assert!(alone.iter().any(|t| t != &alone[0]), "{alone:?}");

    // Streamed: each index's text is the whole response's choice; one [DONE] after all.
    let mut s = body.clone();
    s["stream"] = json!(true);
    s["stream_options"] = json!({"include_usage": true});
    let (by, usage) =
        streamed_choices(&sse(post(&url, "/v1/completions", &s).await).await, "/text");
    assert_eq!(by.len(), 3);
    for (i, (text, finishes)) in &by {
        assert_eq!(text.as_str(), alone[*i as usize], "streamed choice {i}");
        assert_eq!(*finishes, 1);
    }
    assert_eq!(usage["completion_tokens"], completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_chat_choices_are_equal_and_streamed_alike() {
    let (url, _stop) = start().await;
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}],
                      "max_tokens": 6, "temperature": 0, "n": 2});
    let v = json_of(&url, "/v1/chat/completions", &chat).await;
    let c = v["choices"].as_array().expect("choices");
    assert_eq!(c.len(), 2);
    assert_eq!(c[0]["message"]["content"], c[1]["message"]["content"]);
    assert_eq!(
        (c[0]["index"].clone(), c[1]["index"].clone()),
        (json!(0), json!(1))
    );
    let mut s = chat.clone();
    s["stream"] = json!(true);
    let events = sse(post(&url, "/v1/chat/completions", &s).await).await;
    let (by, usage) = streamed_choices(&events, "/delta/content");
    assert!(usage.is_null(), "no usage chunk unless asked");
    for i in 0..2u64 {
        assert_eq!(
            by[&i].0,
            c[i as usize]["message"]["content"].as_str().unwrap()
        );
    }
    // Each index opens with its own role chunk.
    let roles = events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v["choices"][0]["delta"]["role"] == "assistant")
        .count();
    assert_eq!(roles, 2);
    // Out of range: 400 naming `n`.
    let mut bad = chat.clone();
    bad["n"] = json!(17);
    let r = post(&url, "/v1/chat/completions", &bad).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "n");
}
