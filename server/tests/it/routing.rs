//! What a router in front of several replicas reads (docs/DEPLOY.md): the per-tenant queue and
//! in-flight gauges and the KV headroom in /metrics, and the optional `x-memra-cache-key`
//! response header (`--cache-key-header`): the same for every turn of a conversation, different
//! across conversations and tenants' namespaces, absent unless asked for.

use memra_server::auth::Auth;
use memra_server::state::Limits;
use serde_json::{Value, json};

use crate::common::{self, TestServer, chat_body, open};

/// `name{labels} value` lines of an OpenMetrics text.
fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name_and_labels} in:\n{text}"))
}

async fn metrics(s: &TestServer) -> String {
    let r = s.get("/metrics").await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_give_each_tenants_queue_and_the_kv_headroom() {
    let s = open().await;
    // A tenant whose requests all ended between two scrapes is listed, at 0.
    let r = s.post("/v1/chat/completions", &chat_body("hi")).await;
    assert_eq!(r.status(), 200);
    let t = metrics(&s).await;
    assert_eq!(
        metric(&t, r#"memra_tenant_queue_depth{tenant="default"}"#),
        0.0
    );
    let url = format!("{}/v1/chat/completions", s.url);
    let waiting = tokio::spawn(async move {
        TestServer::client()
            .post(url)
            .json(&chat_body("[queued] hi"))
            .send()
            .await
            .unwrap()
            .status()
    });
    let st = s.state.clone();
    TestServer::wait_for(|| st.engine.stats().queue_depth == 1, "a queued request").await;
    let t = metrics(&s).await;
    let tenant = r#"{tenant="default"}"#;
    assert_eq!(
        metric(&t, &format!("memra_tenant_queue_depth{tenant}")),
        1.0
    );
    assert_eq!(
        metric(&t, &format!("memra_tenant_running_sequences{tenant}")),
        0.0
    );
    assert_eq!(
        metric(&t, &format!("memra_tenant_http_in_flight{tenant}")),
        1.0
    );
    let model = r#"{model="tiny"}"#;
    assert_eq!(
        metric(&t, &format!("memra_kv_blocks_capacity{model}")),
        128.0
    );
    let ratio = metric(&t, &format!("memra_kv_headroom_ratio{model}"));
    assert!(ratio > 0.9 && ratio < 1.0, "{ratio}");
    assert_eq!(waiting.await.unwrap(), 200);
    // A tenant with nothing in flight reads 0 rather than vanishing.
    let t = metrics(&s).await;
    assert_eq!(
        metric(&t, &format!("memra_tenant_queue_depth{tenant}")),
        0.0
    );
    assert_eq!(
        metric(&t, &format!("memra_tenant_http_in_flight{tenant}")),
        0.0
    );
    assert_eq!(metric(&t, &format!("memra_kv_headroom_ratio{model}")), 1.0);
}

fn conversation(turns: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": t}));
    }
    json!({"model": "tiny", "messages": messages, "max_tokens": 3})
}

async fn key_of(s: &TestServer, body: &Value) -> Option<String> {
    let r = s.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let k = r
        .headers()
        .get("x-memra-cache-key")
        .map(|v| v.to_str().unwrap().to_string());
    let _ = r.bytes().await.unwrap();
    k
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cache_key_header_follows_the_conversation() {
    let off = open().await;
    assert_eq!(
        key_of(&off, &conversation(&["hi"])).await,
        None,
        "off by default"
    );

    let limits = Limits {
        cache_key_header: true,
        ..Limits::default()
    };
    let s = common::start(Auth::Open, limits).await;
    let k1 = key_of(&s, &conversation(&["hi"]))
        .await
        .expect("the header");
    assert_eq!(k1.len(), 16);
    assert!(k1.chars().all(|c| c.is_ascii_hexdigit()), "{k1}");
    let turn2 = conversation(&["hi", "The quick", "and then?"]);
    assert_eq!(key_of(&s, &turn2).await.as_deref(), Some(k1.as_str()));
    let other = key_of(&s, &conversation(&["hello"])).await.unwrap();
    assert_ne!(other, k1);
    // cache_salt namespaces the key as it does the cache.
    let mut salted = conversation(&["hi"]);
    salted["cache_salt"] = json!("s1");
    assert_ne!(key_of(&s, &salted).await.unwrap(), k1);
    // prompt_cache_key (then user) names the conversation when given.
    let mut a = conversation(&["hi"]);
    a["prompt_cache_key"] = json!("conv-1");
    let mut b = conversation(&["hello"]);
    b["prompt_cache_key"] = json!("conv-1");
    assert_eq!(key_of(&s, &a).await, key_of(&s, &b).await);
    let mut bad = conversation(&["hi"]);
    bad["prompt_cache_key"] = json!(7);
    let r = s.post("/v1/chat/completions", &bad).await;
    common::expect_error(r, 400, None).await;
    // Streams carry it too.
    let mut st = conversation(&["hi"]);
    st["stream"] = json!(true);
    assert_eq!(key_of(&s, &st).await.as_deref(), Some(k1.as_str()));
}
