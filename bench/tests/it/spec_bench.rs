//! `memra-bench spec` against a real memra-server in-process on the CPU (a tiny random model
//! with SmolLM2's tokenizer and chat template, served as `on` with the default speculation and
//! as `off` with `+spec=off`): every request kind, greedy and sampled, one client and several;
//! the outputs match, the rows and the table carry tok/s, TTFT, acceptance and the metrics.

use std::sync::Arc;

use memra_bench::spec::{self, Item, Sampling, SpecArgs, Target};
use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, KvBudget};
use memra_engine::testing::tiny_chat_model;
use memra_server::auth::Auth;
use memra_server::real::RealEngine;
use memra_server::state::{Limits, State};

/// A server with `on` (memra-server's default speculation) and `off` (`+spec=off`); its
/// address and the runtime that serves it.
fn serve() -> (String, tokio::runtime::Runtime) {
    let specs = memra_server::config::parse_models("on=/tiny.gguf,off=/tiny.gguf+spec=off")
        .expect("MEMRA_MODELS");
    let models = specs
        .iter()
        .map(|s| {
            let cfg = EngineConfig {
                device: Device::Cpu,
                threads: 2,
                kv: KvBudget::Blocks(256),
                spec: s.spec.clone(),
                ..EngineConfig::default()
            };
            (s.alias.clone(), tiny_chat_model(Arch::Llama, 1024), cfg)
        })
        .collect();
    let handle = Engine::start(models, AdmissionLimits::default()).expect("engine");
    let engine = Arc::new(RealEngine::from_handle(handle));
    let state = Arc::new(State::new(engine, Auth::Open, Limits::default()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    rt.spawn(
        async move { memra_server::serve(listener, state, std::future::pending::<()>()).await },
    );
    (addr, rt)
}

/// One short request of every kind; the extraction one with a JSON schema, the multi-turn one
/// with its history, the edit one with text to copy.
fn items() -> Vec<Item> {
    let file = "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n".repeat(3);
    let lines = [
        serde_json::json!({"id": "edit", "kind": "code_edit", "max_tokens": 24, "messages": [
            {"role": "user", "content": format!("Rename add to sum:\n{file}")}]}),
        serde_json::json!({"id": "rag", "kind": "rag_quote", "max_tokens": 16, "messages": [
            {"role": "user", "content": "[1] The sky is blue. [2] Grass is green. What colour is grass?"}]}),
        serde_json::json!({"id": "json", "kind": "json_extract", "max_tokens": 24,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema":
                {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
                 "required": ["name"], "additionalProperties": false}}},
            "messages": [{"role": "user", "content": "Ann is 30."}]}),
        serde_json::json!({"id": "sum", "kind": "summarize", "max_tokens": 12, "messages": [
            {"role": "user", "content": "Summarize: the meeting moved to Friday."}]}),
        serde_json::json!({"id": "chat", "kind": "chat", "max_tokens": 12, "messages": [
            {"role": "user", "content": "Hi!"}]}),
        serde_json::json!({"id": "turns", "kind": "multi_turn", "max_tokens": 12, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Say it again."}]}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    spec::parse_workload(&text.join("\n")).expect("workload")
}

fn args(addr: &str, clients: usize) -> SpecArgs {
    SpecArgs {
        items: items(),
        on: Target {
            addr: addr.into(),
            model: "on".into(),
        },
        off: Target {
            addr: addr.into(),
            model: "off".into(),
        },
        samplings: vec![Sampling::greedy(), Sampling::sampled(0.8, 0.9, 40)],
        seed: 1,
        clients,
        repeat: 1,
        max_tokens: 0,
        api_key: None,
    }
}

fn meta() -> spec::RowMeta {
    spec::RowMeta {
        engine: "memra".into(),
        run: "test".into(),
        time: memra_bench::record::now(),
        device: memra_bench::record::DeviceRef {
            name: "CPU".into(),
            driver: None,
            sms: None,
        },
        commit: None,
        model: None,
        shape: Some("tiny".into()),
        dtype: None,
    }
}

#[test]
fn spec_bench_runs_every_kind_on_and_off_with_identical_outputs() {
    let (addr, _rt) = serve();
    let a = args(&addr, 1);
    let o = spec::run(&a).expect("run");
    assert_eq!(o.drafter.as_deref(), Some("ngram"), "the default drafter");
    assert_eq!((o.on.len(), o.off.len()), (12, 12));
    for s in o.on.iter().chain(&o.off) {
        assert!(s.error.is_none(), "{:?}", s.error);
        assert!(s.completion_tokens > 0 && s.ttft_ms > 0.0);
    }
    assert!(o.on.iter().all(|s| s.metrics.is_some()));
    let drafted: usize = o.on.iter().map(|s| s.accepted + s.rejected).sum();
    assert!(drafted > 0, "nothing drafted");
    assert_eq!(
        o.off.iter().map(|s| s.accepted + s.rejected).sum::<usize>(),
        0
    );
    // The extraction output follows its schema in both modes.
    let json = o.on.iter().find(|s| a.items[s.item].id == "json").unwrap();
    let v: serde_json::Value = serde_json::from_str(&json.text).expect("schema JSON");
    assert!(v["name"].is_string(), "{}", json.text);
    let rows = spec::rows(&a, &o, &meta());
    // 2 samplings x (6 kinds + grounded + all) x (off, on).
    assert_eq!(rows.len(), 2 * 8 * 2);
    for r in &rows {
        assert!(r.valid, "{r:?}");
        assert_eq!(r.identical, r.compared);
        assert!(r.tok_s.is_some_and(|t| t > 0.0), "{r:?}");
    }
    let all_on = rows
        .iter()
        .find(|r| r.kind == "all" && r.mode == "on" && r.sampling == "greedy")
        .unwrap();
    assert_eq!(all_on.compared, 6);
    assert!(all_on.speedup.is_some());
    assert!(all_on.verify_steps.is_some());
    let grounded = rows
        .iter()
        .find(|r| r.kind == "grounded" && r.mode == "on" && r.sampling == "greedy")
        .unwrap();
    assert_eq!(grounded.requests, 3);
    let md = spec::table(&rows);
    assert_eq!(md.lines().count(), 2 + 2 * 8, "{md}");
    assert!(md.contains("| **grounded** | greedy | 3 |"), "{md}");
    assert!(!md.contains("DIFFER"), "{md}");
    // Rows round-trip as JSON lines.
    let line = serde_json::to_string(&rows[0]).unwrap();
    let back: spec::SpecRow = serde_json::from_str(&line).unwrap();
    assert_eq!(back, rows[0]);

    // Several clients: each mode as a load of its own (two rounds, the first mode
    // alternating), the aggregate in the `all` rows.
    let mut a = args(&addr, 3);
    a.repeat = 2;
    let o = spec::run(&a).expect("run with 3 clients");
    assert_eq!((o.on.len(), o.off.len()), (24, 24));
    let rows = spec::rows(&a, &o, &meta());
    assert!(rows.iter().all(|r| r.valid), "{rows:?}");
    let all_on = rows
        .iter()
        .find(|r| r.kind == "all" && r.mode == "on")
        .unwrap();
    assert!(all_on.aggregate_tok_s.is_some_and(|t| t > 0.0));
    let md = spec::table(&rows);
    assert_eq!(md.matches("aggregate, 3 clients").count(), 1, "{md}");

    // One model for both modes (one copy of the weights): the plain requests opt out with
    // `"speculative": false`, so they draft nothing, and every output is the same bytes.
    let mut same = args(&addr, 1);
    same.off = same.on.clone();
    let o = spec::run(&same).expect("one model for both modes");
    let drafts = |v: &[spec::Sample]| v.iter().map(|s| s.accepted + s.rejected).sum::<usize>();
    assert_eq!(drafts(&o.off), 0);
    assert!(drafts(&o.on) > 0);
    let rows = spec::rows(&same, &o, &meta());
    assert!(
        rows.iter().all(|r| r.valid && r.identical == r.compared),
        "{rows:?}"
    );
    // An `on` model that does not speculate is refused.
    let mut swapped = args(&addr, 1);
    std::mem::swap(&mut swapped.on, &mut swapped.off);
    assert!(
        spec::run(&swapped)
            .unwrap_err()
            .to_string()
            .contains("does not speculate")
    );
}

/// A stand-in for another OpenAI-compatible server (llama-server): a `/metrics` without memra's
/// counters, and a stream of `text` with usage. Its address.
fn fake_server(text: &'static str) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut r = BufReader::new(s);
            let (mut first, mut len) = (String::new(), 0usize);
            let _ = r.read_line(&mut first);
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let _ = r.by_ref().take(len as u64).read_to_end(&mut Vec::new());
            let body = if first.starts_with("GET /metrics") {
                "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 1\n"
                    .to_string()
            } else {
                let chunk = serde_json::json!({"choices": [{"delta": {"content": text}}]});
                let last = serde_json::json!({"choices": [{"delta": {}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3}});
                format!("data: {chunk}\n\ndata: {last}\n\ndata: [DONE]\n\n")
            };
            let mut s = r.into_inner();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}"
            );
        }
    });
    addr
}

#[test]
fn spec_bench_measures_another_server_without_memra_s_counters() {
    let (on, off) = (fake_server("a b c"), fake_server("a b c"));
    let mut a = args(&on, 1);
    a.off.addr = off;
    let o = spec::run(&a).expect("run against a non-memra server");
    assert_eq!(o.drafter, None);
    assert!(
        o.on.iter()
            .all(|s| s.error.is_none() && s.metrics.is_none())
    );
    let meta = spec::RowMeta {
        engine: "llama.cpp".into(),
        ..meta()
    };
    let rows = spec::rows(&a, &o, &meta);
    for r in &rows {
        assert_eq!(r.engine, "llama.cpp");
        assert!(r.valid && r.verify_steps.is_none(), "{r:?}");
    }
    // Outputs that differ between the two servers are counted, not hidden.
    let (on, off) = (fake_server("a b c"), fake_server("a b d"));
    let mut a = args(&on, 1);
    a.off.addr = off;
    let o = spec::run(&a).expect("run");
    let rows = spec::rows(&a, &o, &meta);
    assert!(rows.iter().filter(|r| r.mode == "on").all(|r| !r.valid));
}
