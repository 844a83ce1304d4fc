//! The memra-server binary on the real SmolLM2-135M (CPU): the official Python `openai` client
//! (server/tests/python/test_openai_client.py; structured output and tools:
//! server/tests/python/test_structured.py), a bounded loopback load test (16 concurrent
//! streaming clients x 4 requests: 0 errors, well-formed streams, outputs byte-identical to
//! solo runs), and SIGTERM drain with exit status 0.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use memra_server::keys::KeyringFile;
use serde_json::{Value, json};

const ALIAS: &str = "smol";

fn model_path() -> PathBuf {
    memra_engine::testing::real_model()
}

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(keys: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-server"))
        .env(
            "MEMRA_MODELS",
            format!("{ALIAS}={}", model_path().display()),
        )
        .env("MEMRA_ADDR", "127.0.0.1:0")
        .env("MEMRA_DEVICE", "cpu")
        .env("MEMRA_API_KEYS", keys)
        .args(["--drain-timeout-s", "60"])
        .env("MEMRA_KV_BLOCKS", "1024")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            if !sent && let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
                sent = true;
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server did not start listening");
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

async fn wait_ready(url: &str) {
    let c = reqwest::Client::new();
    for _ in 0..600 {
        if let Ok(r) = c.get(format!("{url}/ready")).send().await {
            if r.status() == 200 {
                return;
            }
            assert_eq!(r.status(), 503, "/ready while loading");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the model did not load in 60 s");
}

/// One streaming chat request; returns its text after checking the stream's shape.
async fn stream_chat(url: &str, key: &str, body: &Value) -> Result<String, String> {
    stream_chat_then(url, key, body, None).await
}

/// [`stream_chat`], telling `started` once the stream's status has arrived (memra-server sends
/// it with the first token: from then on a drain lets the stream finish).
async fn stream_chat_then(
    url: &str,
    key: &str,
    body: &Value,
    started: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<String, String> {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status() != 200 {
        return Err(format!("status {}", r.status()));
    }
    if let Some(tx) = started {
        let _ = tx.send(());
    }
    let text = r.text().await.map_err(|e| e.to_string())?;
    let (events, ok) = memra_server::sse::parse_events(&text);
    if !ok || events.last().map(String::as_str) != Some("[DONE]") {
        return Err(format!("malformed stream: {text:?}"));
    }
    let mut out = String::new();
    let mut finish = None;
    for (i, e) in events[..events.len() - 1].iter().enumerate() {
        let v: Value = serde_json::from_str(e).map_err(|e| e.to_string())?;
        if v.get("error").is_some() {
            return Err(format!("error chunk: {v}"));
        }
        let ch = &v["choices"][0];
        if i == 0 && ch["delta"]["role"] != "assistant" {
            return Err(format!("first chunk has no role: {v}"));
        }
        if finish.is_some() {
            return Err(format!("a chunk after finish_reason: {v}"));
        }
        out.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    if finish.is_none() {
        return Err("no finish_reason".into());
    }
    Ok(out)
}

fn prompt_body(i: usize) -> Value {
    let topics = [
        "the sea", "a cat", "bread", "winter", "trains", "music", "a garden", "the moon",
    ];
    let mut b = json!({"model": ALIAS, "stream": true, "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("Write one sentence about {}.", topics[i % 8])}]});
    if i % 2 == 1 {
        b["temperature"] = json!(0.8);
        b["seed"] = json!(100 + i);
    } else {
        b["temperature"] = json!(0);
    }
    b
}

async fn load_test(url: &str, key: &str) {
    let mut tasks = Vec::new();
    for client in 0..16 {
        let (url, key) = (url.to_string(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut outs = Vec::new();
            for r in 0..4 {
                let p = (client + r) % 8;
                outs.push((p, stream_chat(&url, &key, &prompt_body(p)).await));
            }
            outs
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.unwrap());
    }
    let errors: Vec<&String> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        errors.is_empty(),
        "{} errors under load: {errors:?}",
        errors.len()
    );
    for p in 0..8 {
        let solo = stream_chat(url, key, &prompt_body(p)).await.unwrap();
        assert!(!solo.is_empty());
        for (q, r) in &results {
            if *q == p {
                assert_eq!(
                    r.as_ref().unwrap(),
                    &solo,
                    "prompt {p}: loaded vs solo output"
                );
            }
        }
    }
}

/// A sample's value in the OpenMetrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// A client that drops a long stream: its sequence stops and its KV blocks are freed.
async fn disconnect_frees_kv(url: &str, key: &str) {
    let c = reqwest::Client::new();
    let body = json!({"model": ALIAS, "stream": true, "max_tokens": 400, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell a very long story."}]});
    let mut r = c
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data: ").count() < 3 {
        let chunk = r.chunk().await.unwrap().expect("the stream ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let m = c
        .get(format!("{url}/metrics"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(metric(&m, "memra_running_sequences"), 1.0);
    assert!(metric(&m, "memra_kv_blocks_used") > 0.0);
    drop(r);
    for _ in 0..100 {
        let m = c
            .get(format!("{url}/metrics"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metric(&m, "memra_running_sequences") == 0.0 && metric(&m, "memra_kv_blocks_used") == 0.0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the dropped stream's sequence and KV blocks were not freed within 2 s");
}

fn python() -> String {
    memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into())
}

#[tokio::test(flavor = "multi_thread")]
async fn real_model_python_client_load_and_drain() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.json");
    let mut ring = KeyringFile::default();
    let key = ring.add("ci", None).unwrap();
    ring.save(&keys).unwrap();
    let mut server = start(&keys);
    let url = server.url.clone();
    wait_ready(&url).await;

    for script in ["test_openai_client.py", "test_structured.py"] {
        let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(python())
            .arg(&path)
            .env("MEMRA_TEST_URL", &url)
            .env("MEMRA_TEST_KEY", &key)
            .env("MEMRA_TEST_ALIAS", ALIAS)
            .output()
            .expect("python3 (MEMRA_PYTHON) with `openai` and `jsonschema` (tools/test.sh installs them)");
        assert!(
            out.status.success(),
            "python {script} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    load_test(&url, &key).await;

    disconnect_frees_kv(&url, &key).await;

    // SIGTERM while a stream is in flight: it completes, then the process exits 0.
    let body = json!({"model": ALIAS, "stream": true, "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Count to twenty."}]});
    let k2 = key.clone();
    let u2 = url.clone();
    let (tx, started) = tokio::sync::oneshot::channel();
    let inflight = tokio::spawn(async move { stream_chat_then(&u2, &k2, &body, Some(tx)).await });
    // SIGTERM once the stream has started (its first token sent): a request still waiting for
    // its first token is answered 503 draining instead, for the balancer to retry elsewhere.
    tokio::time::timeout(Duration::from_secs(120), started)
        .await
        .expect("the stream starts within 120 s")
        .expect("the stream started");
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let text = inflight
        .await
        .unwrap()
        .expect("the in-flight stream completes during drain");
    assert!(!text.is_empty());
    let mut status = None;
    for _ in 0..600 {
        if let Some(s) = server.child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = status.expect("the server exits after draining");
    assert!(status.success(), "exit status {status:?}");
}
