//! The bad-request battery (RELIABILITY.md "Bad requests") against a live server on the
//! loopback (the HTTP stack and validation are the real ones; the engine is the scripted fake):
//! each row is a 4xx with an OpenAI error object whose `param` (or message) names the field at
//! fault, the error never echoes a large input, and the server stays healthy after every row.
//! Covered elsewhere: chunked bodies over the limit, 404/405 (api.rs), auth (auth.rs).

use serde_json::{Value, json};

use crate::common::{TestServer, start};
use memra_server::auth::Auth;
use memra_server::state::Limits;

const CHAT: &str = "/v1/chat/completions";
const COMP: &str = "/v1/completions";
const MAX_BODY: usize = 64 << 10;

/// One hostile request and what it must give.
struct Row {
    name: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    /// The OpenAI `param` (None: the field is named in the message instead).
    param: Option<&'static str>,
    /// A fragment the message must hold (the field's name when `param` is None).
    says: &'static str,
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// A chat body with `extra` merged in (a `null` removes the key).
fn chat(extra: Value) -> Vec<u8> {
    let mut b = json!({"model": "tiny", "messages": msgs()});
    merge(&mut b, extra);
    b.to_string().into_bytes()
}

fn comp(extra: Value) -> Vec<u8> {
    let mut b = json!({"model": "tiny", "prompt": "hi"});
    merge(&mut b, extra);
    b.to_string().into_bytes()
}

fn merge(b: &mut Value, extra: Value) {
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        for (k, v) in e {
            if v.is_null() {
                o.remove(&k);
            } else {
                o.insert(k, v);
            }
        }
    }
}

fn row(name: &'static str, path: &'static str, body: Vec<u8>, param: &'static str) -> Row {
    Row {
        name,
        path,
        content_type: Some("application/json"),
        body,
        status: 400,
        param: Some(param),
        says: "",
    }
}

fn body_row(name: &'static str, body: Vec<u8>, status: u16, says: &'static str) -> Row {
    Row {
        name,
        path: CHAT,
        content_type: Some("application/json"),
        body,
        status,
        param: None,
        says,
    }
}

fn table() -> Vec<Row> {
    let deep = format!(
        "{{\"model\":\"tiny\",\"messages\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let stops: Vec<String> = (0..9).map(|i| format!("s{i}")).collect();
    vec![
        // ---- the body itself
        body_row(
            "not JSON",
            b"{\"model\": \"tiny\", ".to_vec(),
            400,
            "not valid JSON",
        ),
        body_row(
            "JSON array",
            b"[1,2,3]".to_vec(),
            400,
            "must be a JSON object",
        ),
        body_row(
            "JSON string",
            b"\"hi\"".to_vec(),
            400,
            "must be a JSON object",
        ),
        body_row("empty body", Vec::new(), 400, "not valid JSON"),
        body_row(
            "invalid UTF-8",
            b"{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"
                .to_vec(),
            400,
            "not valid UTF-8",
        ),
        body_row(
            "nested 10,000 deep",
            deep.into_bytes(),
            400,
            "not valid JSON",
        ),
        body_row(
            "over the body limit",
            chat(json!({"user": "x".repeat(MAX_BODY)})),
            413,
            "",
        ),
        Row {
            name: "text/plain content type",
            content_type: Some("text/plain"),
            ..body_row("", chat(json!({})), 400, "Content-Type")
        },
        Row {
            name: "form content type",
            content_type: Some("application/x-www-form-urlencoded"),
            ..body_row("", b"model=tiny".to_vec(), 400, "Content-Type")
        },
        // ---- model
        row("model missing", CHAT, chat(json!({"model": null})), "model"),
        row("model a number", CHAT, chat(json!({"model": 7})), "model"),
        Row {
            says: "does not exist",
            ..row(
                "model unknown",
                CHAT,
                chat(json!({"model": "gpt-9"})),
                "model",
            )
        },
        row("n = 17", CHAT, chat(json!({"n": 17})), "n"),
        // ---- messages
        row(
            "messages missing",
            CHAT,
            chat(json!({"messages": null})),
            "messages",
        ),
        row(
            "messages a string",
            CHAT,
            chat(json!({"messages": "hi"})),
            "messages",
        ),
        row(
            "messages empty",
            CHAT,
            chat(json!({"messages": []})),
            "messages",
        ),
        row(
            "unknown role",
            CHAT,
            chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})),
            "messages[0].role",
        ),
        row(
            "role missing",
            CHAT,
            chat(json!({"messages": [{"content": "hi"}]})),
            "messages[0].role",
        ),
        row(
            "content missing",
            CHAT,
            chat(json!({"messages": [{"role": "user"}]})),
            "messages[0].content",
        ),
        row(
            "content a number",
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": 5}]})),
            "messages[0].content",
        ),
        row(
            "image for a model without a vision tower",
            CHAT,
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            ),
            "messages",
        ),
        row(
            "second message bad",
            CHAT,
            chat(
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": {}}]}),
            ),
            "messages[1].content",
        ),
        // ---- max_tokens
        row(
            "max_tokens huge",
            CHAT,
            chat(json!({"max_tokens": 1u64 << 40})),
            "max_tokens",
        ),
        row(
            "max_tokens negative",
            CHAT,
            chat(json!({"max_tokens": -1})),
            "max_tokens",
        ),
        row(
            "max_tokens 0",
            CHAT,
            chat(json!({"max_tokens": 0})),
            "max_tokens",
        ),
        row(
            "max_tokens a string",
            CHAT,
            chat(json!({"max_tokens": "10"})),
            "max_tokens",
        ),
        row(
            "max_tokens fractional",
            CHAT,
            chat(json!({"max_tokens": 2.5})),
            "max_tokens",
        ),
        row(
            "max_completion_tokens huge",
            CHAT,
            chat(json!({"max_completion_tokens": 100000})),
            "max_completion_tokens",
        ),
        // ---- sampling
        row(
            "temperature negative",
            CHAT,
            chat(json!({"temperature": -0.5})),
            "temperature",
        ),
        row(
            "temperature 1e39 (inf as f32)",
            CHAT,
            chat(json!({"temperature": 1e39})),
            "temperature",
        ),
        row(
            "temperature 3",
            CHAT,
            chat(json!({"temperature": 3})),
            "temperature",
        ),
        row(
            "temperature a string",
            CHAT,
            chat(json!({"temperature": "hot"})),
            "temperature",
        ),
        row("top_p 0", CHAT, chat(json!({"top_p": 0})), "top_p"),
        row("top_p 1.5", CHAT, chat(json!({"top_p": 1.5})), "top_p"),
        row("top_p negative", CHAT, chat(json!({"top_p": -1})), "top_p"),
        row("top_k -5", CHAT, chat(json!({"top_k": -5})), "top_k"),
        row("min_p 2", CHAT, chat(json!({"min_p": 2})), "min_p"),
        row(
            "presence_penalty 5",
            CHAT,
            chat(json!({"presence_penalty": 5})),
            "presence_penalty",
        ),
        row(
            "frequency_penalty -9",
            CHAT,
            chat(json!({"frequency_penalty": -9})),
            "frequency_penalty",
        ),
        row(
            "repetition_penalty 0",
            CHAT,
            chat(json!({"repetition_penalty": 0})),
            "repetition_penalty",
        ),
        row("seed a string", CHAT, chat(json!({"seed": "x"})), "seed"),
        // ---- stop, stream, logprobs, tags
        row(
            "stop list too long",
            CHAT,
            chat(json!({"stop": stops})),
            "stop",
        ),
        row(
            "stop empty string",
            CHAT,
            chat(json!({"stop": [""]})),
            "stop",
        ),
        row("stop a number", CHAT, chat(json!({"stop": 3})), "stop"),
        row(
            "stop string too long",
            CHAT,
            chat(json!({"stop": "x".repeat(300)})),
            "stop",
        ),
        row(
            "stream not a bool",
            CHAT,
            chat(json!({"stream": "yes"})),
            "stream",
        ),
        row(
            "stream_options not an object",
            CHAT,
            chat(json!({"stream_options": 1})),
            "stream_options",
        ),
        row(
            "top_logprobs without logprobs",
            CHAT,
            chat(json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        row(
            "top_logprobs 99",
            CHAT,
            chat(json!({"logprobs": true, "top_logprobs": 99})),
            "top_logprobs",
        ),
        row(
            "user too long",
            CHAT,
            chat(json!({"user": "u".repeat(300)})),
            "user",
        ),
        // ---- completions
        row(
            "prompt missing",
            COMP,
            comp(json!({"prompt": null})),
            "prompt",
        ),
        row("prompt empty", COMP, comp(json!({"prompt": ""})), "prompt"),
        row(
            "prompt an object",
            COMP,
            comp(json!({"prompt": {"a": 1}})),
            "prompt",
        ),
        row(
            "prompt negative id",
            COMP,
            comp(json!({"prompt": [1, -2]})),
            "prompt",
        ),
        row(
            "prompt two strings",
            COMP,
            comp(json!({"prompt": ["a", "b"]})),
            "prompt",
        ),
        row(
            "prompt id past u32",
            COMP,
            comp(json!({"prompt": [1u64 << 33]})),
            "prompt",
        ),
        row(
            "logprobs 50",
            COMP,
            comp(json!({"logprobs": 50})),
            "logprobs",
        ),
        Row {
            says: "context",
            ..row(
                "prompt + max_tokens over the context",
                COMP,
                comp(json!({"prompt": vec![5; 500], "max_tokens": 100})),
                "prompt",
            )
        },
    ]
}

async fn send(s: &TestServer, r: &Row) -> reqwest::Response {
    let mut req = TestServer::client()
        .post(format!("{}{}", s.url, r.path))
        .body(r.body.clone());
    if let Some(ct) = r.content_type {
        req = req.header("content-type", ct);
    }
    req.send().await.expect("send")
}

async fn healthy(s: &TestServer) {
    assert_eq!(s.get("/health").await.status(), 200);
    let ok = s
        .post(
            CHAT,
            &json!({"model": "tiny", "messages": msgs(), "max_tokens": 4}),
        )
        .await;
    assert_eq!(ok.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_4xx_naming_the_field() {
    let limits = Limits {
        max_body_bytes: MAX_BODY,
        ..Limits::default()
    };
    let s = start(Auth::Open, limits).await;
    let rows = table();
    assert!(rows.len() >= 50, "{} rows", rows.len());
    let mut failed = Vec::new();
    for r in &rows {
        let resp = send(&s, r).await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let e = &v["error"];
        let shaped = e["message"].is_string()
            && e["type"].is_string()
            && e.get("param").is_some()
            && e.get("code").is_some();
        let msg = e["message"].as_str().unwrap_or("");
        if status != r.status || !shaped {
            failed.push(format!("{}: {status} {text}", r.name));
        } else if r.param.is_some_and(|p| e["param"] != p) {
            failed.push(format!("{}: param {} in {text}", r.name, e["param"]));
        } else if !msg.contains(r.says) {
            failed.push(format!("{}: message lacks `{}`: {text}", r.name, r.says));
        } else if text.len() > 2048 {
            failed.push(format!(
                "{}: a {}-byte error echoes the input",
                r.name,
                text.len()
            ));
        }
        if let Err(e) = tokio::time::timeout(std::time::Duration::from_secs(5), healthy(&s)).await {
            failed.push(format!("{}: the server is unhealthy after it: {e}", r.name));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    eprintln!("{} bad requests, each a 4xx naming the field", rows.len());
}
