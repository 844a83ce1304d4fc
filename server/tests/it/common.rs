//! A real server on a loopback port, backed by the scripted FakeEngine; the loopback server
//! and the tiny model that the real-engine tests share.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use memra_server::auth::Auth;
use memra_server::fake::FakeEngine;
use memra_server::state::{Limits, State};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub engine: Arc<FakeEngine>,
    pub state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
    pub handle: Option<JoinHandle<std::io::Result<()>>>,
}

/// Serves `state` on a loopback port until the sender fires or is dropped: the address, the
/// sender and the server's task.
pub async fn listen(
    state: Arc<State>,
) -> (
    SocketAddr,
    oneshot::Sender<()>,
    JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        memra_server::serve(listener, state, async {
            let _ = rx.await;
        })
        .await
    });
    (addr, tx, handle)
}

/// [`listen`]'s URL and stop.
pub async fn serve(state: Arc<State>) -> (String, oneshot::Sender<()>) {
    let (addr, stop, _) = listen(state).await;
    (format!("http://{addr}"), stop)
}

/// A random model of `arch` at the tiny shape (2 layers) with SmolLM2's tokenizer and chat
/// template, context 512.
pub fn tiny_model(arch: memra_engine::config::Arch) -> memra_engine::loader::Model {
    memra_engine::testing::tiny_chat_model(arch, 512)
}

pub async fn start(auth: Auth, limits: Limits) -> TestServer {
    let engine = Arc::new(FakeEngine::new());
    let state = Arc::new(State::new(engine.clone(), auth, limits));
    let (addr, tx, handle) = listen(state.clone()).await;
    TestServer {
        addr,
        url: format!("http://{addr}"),
        engine,
        state,
        shutdown: Some(tx),
        handle: Some(handle),
    }
}

pub async fn open() -> TestServer {
    start(Auth::Open, Limits::default()).await
}

impl TestServer {
    /// Starts the drain (as SIGTERM does).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub fn client() -> reqwest::Client {
        reqwest::Client::new()
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        Self::client()
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        Self::client()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    /// The `data:` payloads of an SSE response, checking the framing.
    pub async fn sse(resp: reqwest::Response) -> Vec<String> {
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let text = resp.text().await.unwrap();
        let (events, ok) = memra_server::sse::parse_events(&text);
        assert!(ok, "malformed SSE: {text:?}");
        events
    }

    /// Waits (at most 5 s) until `f` holds.
    pub async fn wait_for(f: impl Fn() -> bool, what: &str) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// Sends raw bytes on a new connection and returns the stream.
    pub async fn raw(&self, request: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(request).await.unwrap();
        s
    }
}

/// Reads from `s` until `needle` appears (or 5 s pass); returns what was read.
pub async fn read_until(s: &mut TcpStream, needle: &str) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&buf).contains(needle) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("timed out reading")
            .unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

pub fn chat_body(content: &str) -> Value {
    serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": content}]})
}

/// Checks an error response: status, the OpenAI error object, and its code.
pub async fn expect_error(resp: reqwest::Response, status: u16, code: Option<&str>) -> Value {
    assert_eq!(resp.status().as_u16(), status);
    assert!(resp.headers().contains_key("x-request-id"));
    let v: Value = resp.json().await.unwrap();
    let e = &v["error"];
    assert!(e["message"].is_string(), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{v}");
    }
    v
}
