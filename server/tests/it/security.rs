//! The security review's findings on the HTTP side (issue 14): prompt byte bound before
//! tokenizing, slots held until tokenizing ends, bodies read before a slot is taken, the
//! connection cap, token counts of cancelled streams, the completions context error's param.

use std::time::Duration;

use crate::common::{self, TestServer, chat_body, expect_error, read_until};
use memra_server::auth::Auth;
use memra_server::state::Limits;
use serde_json::json;
use tokio::io::AsyncReadExt;

#[tokio::test(flavor = "multi_thread")]
async fn prompts_too_long_in_bytes_are_refused_before_tokenizing() {
    let s = common::open().await;
    // The fake context is 512 tokens: 512 * 32 bytes is the most that is tokenized.
    let long = "7".repeat(512 * 32 + 1);
    let v = expect_error(
        s.post("/v1/completions", &json!({"model": "tiny", "prompt": long}))
            .await,
        400,
        Some("context_length_exceeded"),
    )
    .await;
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("bytes"),
        "{v}"
    );
    let v = expect_error(
        s.post("/v1/chat/completions", &chat_body(&long)).await,
        400,
        Some("context_length_exceeded"),
    )
    .await;
    assert_eq!(v["error"]["param"], "messages", "{v}");
    assert!(s.engine.submitted.lock().unwrap().is_empty());
    // Under the byte bound but over the context once tokenized: the token check names `prompt`
    // on /v1/completions too (finding 8).
    let v = expect_error(
        s.post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "7".repeat(600)}),
        )
        .await,
        400,
        Some("context_length_exceeded"),
    )
    .await;
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    assert_eq!(s.get("/health").await.status(), 200);
}

fn raw(path: &str, body: &str, send: usize) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(&body.as_bytes()[..send.min(body.len())]);
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_hangs_up_keeps_its_slot_until_tokenizing_ends() {
    let limits = Limits {
        tenant_max_in_flight: 1,
        ..Limits::default()
    };
    let s = common::start(Auth::Open, limits).await;
    let body = chat_body("[slow-tokenize] hi").to_string();
    let sock = s.raw(&raw("/v1/chat/completions", &body, body.len())).await;
    let st = s.state.clone();
    TestServer::wait_for(|| st.in_flight() == 1, "the slot to be taken").await;
    drop(sock);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The tokenization still runs (400 ms): its slot is still held, so the tenant is at its limit.
    expect_error(
        s.post("/v1/chat/completions", &chat_body("hi")).await,
        429,
        Some("tenant_limit_exceeded"),
    )
    .await;
    TestServer::wait_for(|| st.in_flight() == 0, "the slot to be given back").await;
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stalled_bodies_hold_no_slot_and_time_out() {
    let limits = Limits {
        tenant_max_in_flight: 2,
        body_timeout: Duration::from_millis(600),
        ..Limits::default()
    };
    let s = common::start(Auth::Open, limits).await;
    let body = chat_body("hi").to_string();
    // Eight clients send the headers and 9 bytes of their body, then stall.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(s.raw(&raw("/v1/chat/completions", &body, 9)).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.state.in_flight(), 0);
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
    // Each stalled client gets 408 once the body timeout passes.
    for sock in &mut stalled {
        let got = read_until(sock, "body_timeout").await;
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_get_503_and_are_closed() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let s = common::start(Auth::Open, limits).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut got = String::new();
    tokio::time::timeout(Duration::from_secs(5), extra.read_to_string(&mut got))
        .await
        .expect("the refused connection is closed")
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.to_ascii_lowercase().contains("retry-after: 1"), "{got}");
    assert!(got.contains("too_many_connections"), "{got}");
    drop(idle);
    // Once the idle connections close, requests are served again.
    for _ in 0..100 {
        let ok = reqwest::get(format!("{}/health", s.url))
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("/health did not recover after the idle connections closed");
}

fn generation_tokens(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("memra_generation_tokens_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no memra_generation_tokens_total in {metrics}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_streams_count_their_tokens() {
    let s = common::open().await;
    let before = generation_tokens(&s.get("/metrics").await.text().await.unwrap());
    let body = json!({"model": "tiny", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": "[slow] hi"}]})
    .to_string();
    let mut sock = s.raw(&raw("/v1/chat/completions", &body, body.len())).await;
    read_until(&mut sock, "\"content\":\"q\"").await;
    drop(sock);
    let st = s.state.clone();
    TestServer::wait_for(|| st.in_flight() == 0, "the stream to be cancelled").await;
    let after = generation_tokens(&s.get("/metrics").await.text().await.unwrap());
    assert!(after >= before + 2, "{before} -> {after}");
}
