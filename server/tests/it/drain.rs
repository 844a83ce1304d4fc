//! The shutdown path (what SIGTERM runs) while a stream is in flight: the stream runs to its
//! end; meanwhile a client that connects is still answered, with 503 + Retry-After for
//! inference and 503 from `/ready` (`/health` stays 200); requests still waiting for their
//! first token are answered 503 `draining` + Retry-After at once (nothing was sent yet: the
//! client retries elsewhere) and cancelled in the engine; then `serve` returns and the port
//! closes. (The process-level SIGTERM -> exit 0 is in real_model.rs.)

use std::time::Duration;

use serde_json::json;

use crate::common::{TestServer, chat_body, expect_error, open};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_answers_new_clients_503_while_in_flight_streams_finish() {
    let mut s = open().await;
    let mut b = chat_body("[slow] hi");
    b["stream"] = json!(true);
    b["max_tokens"] = json!(30);
    let mut resp = s.post("/v1/chat/completions", &b).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.expect("chunk").expect("a first event");
    assert_eq!(s.get("/ready").await.status(), 200);
    s.shutdown();
    let st = s.state.clone();
    TestServer::wait_for(|| st.is_draining(), "draining").await;

    // New clients during the drain (fresh connections: the client's pool is bypassed).
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let ready = fresh()
        .get(format!("{}/ready", s.url))
        .send()
        .await
        .expect("/ready answered");
    assert_eq!(ready.status(), 503);
    let health = fresh()
        .get(format!("{}/health", s.url))
        .send()
        .await
        .expect("/health");
    assert_eq!(health.status(), 200);
    let r = fresh()
        .post(format!("{}/v1/chat/completions", s.url))
        .json(&chat_body("hi"))
        .send()
        .await
        .expect("a new request is answered");
    assert!(r.headers().contains_key("retry-after"));
    expect_error(r, 503, Some("draining")).await;

    // The in-flight stream still ends with its 30 tokens and [DONE].
    let mut text = String::from_utf8_lossy(&first).into_owned();
    while let Some(c) = resp.chunk().await.expect("chunk") {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    let (events, ok) = memra_server::sse::parse_events(&text);
    assert!(ok, "{text}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        events.len(),
        1 + 30 + 1 + 1,
        "role, 30 tokens, finish, DONE"
    );

    let r = tokio::time::timeout(Duration::from_secs(5), s.handle.take().expect("handle"))
        .await
        .expect("serve returns after the drain")
        .expect("join");
    assert!(r.is_ok());
    assert!(s.engine.is_draining());
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_answers_requests_waiting_for_their_first_token_503_at_once() {
    let mut s = open().await;
    let post = |stream: bool| {
        let url = format!("{}/v1/chat/completions", s.url);
        let mut b = chat_body("[queued] hi");
        b["stream"] = json!(stream);
        tokio::spawn(async move {
            TestServer::client()
                .post(url)
                .json(&b)
                .send()
                .await
                .expect("answered")
        })
    };
    let (whole, streamed) = (post(false), post(true));
    let st = s.state.clone();
    TestServer::wait_for(|| st.engine.stats().queue_depth == 2, "two queued requests").await;
    let t0 = std::time::Instant::now();
    s.shutdown();
    for r in [whole.await.unwrap(), streamed.await.unwrap()] {
        assert!(r.headers().contains_key("retry-after"));
        expect_error(r, 503, Some("draining")).await;
    }
    // Well before the 2 s the queued requests would have waited for a first token.
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    let engine = s.engine.clone();
    TestServer::wait_for(
        || engine.cancelled.load(std::sync::atomic::Ordering::SeqCst) == 2,
        "both cancelled in the engine",
    )
    .await;
    let r = tokio::time::timeout(Duration::from_secs(5), s.handle.take().expect("handle"))
        .await
        .expect("serve returns after the drain")
        .expect("join");
    assert!(r.is_ok());
}
