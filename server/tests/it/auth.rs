//! API keys: 401/403 on keyed routes, open probes, per-tenant limits (429), keyring reload,
//! and the `keys add` / `keys revoke` subcommands.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{TestServer, chat_body, expect_error, read_until};
use memra_server::auth::{Auth, KeyringWatch};
use memra_server::keys::KeyringFile;
use memra_server::state::Limits;
use serde_json::json;

async fn keyed_post(s: &TestServer, key: &str, body: &serde_json::Value) -> reqwest::Response {
    TestServer::client()
        .post(format!("{}/v1/chat/completions", s.url))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn wait_status(s: &TestServer, key: &str, status: u16) {
    for _ in 0..200 {
        if keyed_post(s, key, &chat_body("hi")).await.status().as_u16() == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the keyring change was not picked up (wanted {status})");
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_tenants_limits_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.json");
    let mut ring = KeyringFile::default();
    let acme = ring.add("acme", Some(1)).unwrap();
    let bolt = ring.add("bolt", None).unwrap();
    ring.save(&path).unwrap();
    let watch = Arc::new(KeyringWatch::open(path.clone()).unwrap());
    watch.spawn_watcher(Duration::from_millis(20));
    let s = common::start(Auth::Keyring(watch), Limits::default()).await;

    // Probes need no key; metrics (tenant names in its labels), inference and models do.
    for p in ["/health", "/ready"] {
        assert_eq!(s.get(p).await.status(), 200, "{p}");
    }
    expect_error(s.get("/metrics").await, 401, Some("missing_api_key")).await;
    expect_error(s.get("/v1/models").await, 401, Some("missing_api_key")).await;
    expect_error(
        s.post("/v1/chat/completions", &chat_body("hi")).await,
        401,
        None,
    )
    .await;
    expect_error(
        s.post("/v1/completions", &json!({"model": "tiny", "prompt": "x"}))
            .await,
        401,
        None,
    )
    .await;
    expect_error(
        keyed_post(&s, "mk-wrong", &chat_body("hi")).await,
        401,
        Some("invalid_api_key"),
    )
    .await;
    assert_eq!(keyed_post(&s, &acme, &chat_body("hi")).await.status(), 200);
    assert_eq!(
        s.engine.submitted.lock().unwrap().last().unwrap().tenant,
        "acme"
    );

    // acme may have one request in flight; bolt is unaffected.
    let body = json!({"model": "tiny", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": "[slow]"}]})
    .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {acme}\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sock = s.raw(req.as_bytes()).await;
    read_until(&mut sock, "data: ").await;
    let r = keyed_post(&s, &acme, &chat_body("hi")).await;
    assert_eq!(r.headers()["retry-after"], "1");
    expect_error(r, 429, Some("tenant_limit_exceeded")).await;
    assert_eq!(keyed_post(&s, &bolt, &chat_body("hi")).await.status(), 200);
    drop(sock);

    // Revoking in the file: 403 once reloaded. A new key works once reloaded.
    let mut ring = KeyringFile::load(&path).unwrap();
    ring.revoke(&bolt[..11]).unwrap();
    let fresh = ring.add("acme", None).unwrap();
    ring.save(&path).unwrap();
    wait_status(&s, &bolt, 403).await;
    wait_status(&s, &fresh, 200).await;
    let m = TestServer::client()
        .get(format!("{}/metrics", s.url))
        .bearer_auth(&fresh)
        .send()
        .await
        .unwrap();
    assert_eq!(m.status(), 200);
    let m = m.text().await.unwrap();
    assert!(
        m.contains(r#"tenant="acme""#) && m.contains(r#"status="403""#),
        "{m}"
    );
}

#[test]
fn keys_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.json");
    let bin = env!("CARGO_BIN_EXE_memra-server");
    let out = std::process::Command::new(bin)
        .args(["keys", "add", "acme", "--max-in-flight", "2"])
        .env("MEMRA_API_KEYS", &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("mk-"), "{key}");
    let stored = std::fs::read_to_string(&path).unwrap();
    assert!(!stored.contains(&key));
    let ring = KeyringFile::load(&path).unwrap();
    assert_eq!(ring.keys.len(), 1);
    assert_eq!(ring.tenants["acme"].max_in_flight, Some(2));
    let out = std::process::Command::new(bin)
        .args(["keys", "revoke", &key[..11]])
        .env("MEMRA_API_KEYS", &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(KeyringFile::load(&path).unwrap().keys[0].revoked);
    let out = std::process::Command::new(bin)
        .args(["keys", "revoke", "mk-nothing"])
        .env("MEMRA_API_KEYS", &path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no active key"));
}
