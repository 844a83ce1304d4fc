//! Client disconnect cancels generation; graceful drain; overload limits.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{TestServer, chat_body, expect_error, open, read_until};
use memra_server::auth::Auth;
use memra_server::state::Limits;
use serde_json::json;

fn raw_chat(content: &str, stream: bool) -> Vec<u8> {
    let body = json!({"model": "tiny", "stream": stream, "max_tokens": 40,
        "messages": [{"role": "user", "content": content}]})
    .to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_mid_stream_cancels_generation() {
    let s = open().await;
    let mut sock = s.raw(&raw_chat("[slow] hi", true)).await;
    let got = read_until(&mut sock, "\"content\":\"T\"").await;
    assert!(got.contains("HTTP/1.1 200"), "{got}");
    assert_eq!(s.engine.live.load(Ordering::SeqCst), 1);
    drop(sock);
    let e = s.engine.clone();
    TestServer::wait_for(
        || e.live.load(Ordering::SeqCst) == 0,
        "the generation to stop",
    )
    .await;
    assert_eq!(s.engine.cancelled.load(Ordering::SeqCst), 1);
    // A fresh request then succeeds at once, and the in-flight slot was given back.
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
    assert_eq!(s.state.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_while_waiting_for_a_whole_response_cancels() {
    let s = open().await;
    let sock = s.raw(&raw_chat("[slow] hi", false)).await;
    let e = s.engine.clone();
    TestServer::wait_for(
        || e.live.load(Ordering::SeqCst) == 1,
        "the generation to start",
    )
    .await;
    drop(sock);
    TestServer::wait_for(
        || e.live.load(Ordering::SeqCst) == 0,
        "the generation to stop",
    )
    .await;
    assert_eq!(s.engine.cancelled.load(Ordering::SeqCst), 1);
    let st = s.state.clone();
    TestServer::wait_for(|| st.in_flight() == 0, "the slot to be freed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_finishes_in_flight_streams_then_stops() {
    let mut s = open().await;
    let mut b = chat_body("[slow] hi");
    b["stream"] = json!(true);
    b["max_tokens"] = json!(20);
    let mut resp = s.post("/v1/chat/completions", &b).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    s.shutdown();
    let st = s.state.clone();
    TestServer::wait_for(|| st.is_draining(), "draining").await;
    // The in-flight stream still runs to its end.
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    let (events, ok) = memra_server::sse::parse_events(&rest);
    assert!(ok);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        events.len(),
        1 + 20 + 1 + 1,
        "role, 20 tokens, finish, DONE"
    );
    // serve() returns cleanly, the engine was told to drain, new connections are refused.
    let r = tokio::time::timeout(Duration::from_secs(5), s.handle.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_ok());
    assert!(s.engine.is_draining());
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_timeout_cuts_off_long_requests() {
    let limits = Limits {
        drain_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let mut s = common::start(Auth::Open, limits).await;
    let mut b = chat_body("[slow] hi");
    b["stream"] = json!(true);
    b["max_tokens"] = json!(40);
    let mut resp = s.post("/v1/chat/completions", &b).await;
    resp.chunk().await.unwrap().unwrap();
    s.shutdown();
    let r = tokio::time::timeout(Duration::from_secs(5), s.handle.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_ok());
    let mut text = String::new();
    while let Ok(Some(c)) = resp.chunk().await {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(
        !text.contains("[DONE]"),
        "the stream should have been cut off"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn server_wide_limit_is_503_with_retry_after() {
    let limits = Limits {
        max_in_flight: 1,
        ..Default::default()
    };
    let s = common::start(Auth::Open, limits).await;
    let mut sock = s.raw(&raw_chat("[slow] hi", true)).await;
    read_until(&mut sock, "data: ").await;
    let r = s.post("/v1/chat/completions", &chat_body("hi")).await;
    assert_eq!(r.headers()["retry-after"], "1");
    expect_error(r, 503, Some("overloaded")).await;
    drop(sock);
    let st = s.state.clone();
    TestServer::wait_for(|| st.in_flight() == 0, "the slot to be freed").await;
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
}

fn kv_used(metrics: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("memra_kv_blocks_used "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no memra_kv_blocks_used in {metrics}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_storm_leaks_nothing() {
    // RELIABILITY.md: 200 streams dropped mid-generation (4 rounds of 50 at once); then a fresh
    // request succeeds at once and no KV block or slot is held.
    let s = open().await;
    for _ in 0..4 {
        let mut round = Vec::new();
        for _ in 0..50 {
            let req = raw_chat("[slow] hi", true);
            let addr = s.addr;
            round.push(tokio::spawn(async move {
                let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
                tokio::io::AsyncWriteExt::write_all(&mut sock, &req)
                    .await
                    .unwrap();
                read_until(&mut sock, "\"content\":\"T\"").await;
            }));
        }
        for t in round {
            t.await.unwrap();
        }
    }
    let e = s.engine.clone();
    TestServer::wait_for(
        || e.live.load(Ordering::SeqCst) == 0,
        "every generation to stop",
    )
    .await;
    assert_eq!(s.engine.cancelled.load(Ordering::SeqCst), 200);
    let st = s.state.clone();
    TestServer::wait_for(|| st.in_flight() == 0, "every slot to be freed").await;
    let m = s.get("/metrics").await.text().await.unwrap();
    assert_eq!(kv_used(&m), 0.0, "{m}");
    let t = std::time::Instant::now();
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("hi"))
            .await
            .status(),
        200
    );
    assert!(t.elapsed() < Duration::from_secs(1));
}
