//! `MEMRA_MODELS` with `+spec=mtp` and with the default (`auto`), end to end on the CPU, through
//! the path the binary takes (flags -> model specs -> `StartConfig::from_args` -> load -> engine
//! loop -> HTTP): one file (a tiny llama with an MTP layer wired to draft the model's own picks,
//! and the real SmolLM2 tokenizer) served by one server as `plain=FILE+spec=off` and
//! `mtp=FILE+spec=mtp+spec_k=3` (or `auto=FILE`, no option). Completions (greedy with logprobs,
//! seeded sampling with top-p and top-k, streamed) are byte-identical; usage reports the drafts
//! accepted and rejected (none without speculation); /metrics reports each model's drafter,
//! drafts per drafter, verify steps and fallbacks. A missing draft model is refused before
//! anything loads.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::formats::gguf::Gguf;
use memra_engine::models::random::{oracle_mtp_weights, tiny_config};
use memra_engine::testing::tiny_gguf::{gguf_meta, write_model};
use memra_engine::tokenizer::Tokenizer;
use memra_server::auth::Auth;
use memra_server::config::Cli;
use memra_server::real::{RealEngine, StartConfig};
use memra_server::state::{Limits, State};
use serde_json::{Value, json};

/// The tiny MTP model with the real tokenizer (its metadata copied from SmolLM2's file).
fn write_mtp_model(path: &Path) {
    let g = Gguf::open(&memra_engine::testing::real_model()).expect("open SmolLM2");
    let vocab = Tokenizer::from_gguf(&g).expect("tokenizer").vocab_size();
    let cfg = ModelConfig {
        mtp_layers: 1,
        max_ctx: 512,
        ..tiny_config(Arch::Llama, vocab)
    };
    let w = oracle_mtp_weights(&cfg, 3).expect("weights");
    let mut meta = gguf_meta(&w.config);
    meta.extend(
        g.metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned(),
    );
    write_model(&w, &meta, path).expect("write the model");
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .expect("request")
}

async fn complete(url: &str, model: &str, body: &Value) -> Value {
    let mut b = body.clone();
    b["model"] = json!(model);
    let r = post(url, &b).await;
    assert_eq!(r.status(), 200, "{model}");
    r.json().await.expect("json")
}

/// The `data:` payloads of a streamed completion, without the ids and model name.
async fn stream(url: &str, model: &str, body: &Value) -> Vec<Value> {
    let mut b = body.clone();
    b["model"] = json!(model);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let text = post(url, &b).await.text().await.expect("body");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let mut v: Value = serde_json::from_str(d).expect("chunk");
            for k in ["id", "created", "model", "system_fingerprint"] {
                v.as_object_mut().map(|o| o.remove(k));
            }
            v
        })
        .collect()
}

fn details(v: &Value) -> (u64, u64) {
    let d = &v["usage"]["completion_tokens_details"];
    (
        d["accepted_prediction_tokens"].as_u64().expect("accepted"),
        d["rejected_prediction_tokens"].as_u64().expect("rejected"),
    )
}

/// Serves `models` (MEMRA_MODELS) through the binary's path; returns the URL once ready.
async fn serve(models: &str) -> (String, tokio::sync::oneshot::Sender<()>) {
    let argv = ["memra-server", "--models", models, "--device", "cpu"];
    let args = Cli::try_parse_from(argv.iter().chain(&["--threads", "2", "--kv-blocks", "128"]))
        .expect("flags")
        .serve;
    let specs = args.model_specs().expect("MEMRA_MODELS");
    let cfg = StartConfig::from_args(&specs, &args).expect("start config");
    let (fail_tx, fail_rx) = std::sync::mpsc::channel::<String>();
    let engine = RealEngine::start(
        cfg,
        Box::new(move |e| {
            let _ = fail_tx.send(e);
        }),
    );
    let state = Arc::new(State::new(engine, Auth::Open, Limits::from_args(&args)));
    let (url, stop) = crate::common::serve(state).await;
    // Loading runs in the background: wait for /ready (a deadline, not a measurement).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(e) = fail_rx.try_recv() {
            panic!("loading failed: {e}");
        }
        let r = reqwest::get(format!("{url}/ready")).await.expect("ready");
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the models did not load");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (url, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_served_with_spec_mtp_completes_as_without() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny-mtp.gguf");
    write_mtp_model(&file);
    let f = file.display();
    let (url, _stop) = serve(&format!("plain={f}+spec=off,mtp={f}+spec=mtp+spec_k=3")).await;

    let greedy = json!({"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0,
                        "logprobs": 2, "ignore_eos": true});
    let seeded = json!({"prompt": [504, 3575, 282, 28, 9], "max_tokens": 20,
                        "temperature": 0.8, "top_k": 40, "seed": 7, "ignore_eos": true});
    for (what, body) in [("greedy", &greedy), ("seeded", &seeded)] {
        let plain = complete(&url, "plain", body).await;
        let mtp = complete(&url, "mtp", body).await;
        assert_eq!(
            plain["choices"], mtp["choices"],
            "{what}: completions differ"
        );
        assert_eq!(
            plain["usage"]["completion_tokens"],
            mtp["usage"]["completion_tokens"]
        );
        assert_eq!(details(&plain), (0, 0), "{what}: plain speculated");
        let (accepted, rejected) = details(&mtp);
        assert!(accepted + rejected > 0, "{what}: nothing drafted: {mtp}");
        if what == "greedy" {
            // The wired layer drafts the model's own greedy picks.
            assert!(accepted > 0 && accepted >= 3 * rejected, "{mtp}");
            let lp = &mtp["choices"][0]["logprobs"]["token_logprobs"];
            assert_eq!(lp.as_array().map(Vec::len), Some(24), "{mtp}");
        }
    }
    // Streamed: the same chunks, and usage in the last one.
    let plain = stream(&url, "plain", &greedy).await;
    let mtp = stream(&url, "mtp", &greedy).await;
    let (last_p, last_m) = (plain.last().unwrap(), mtp.last().unwrap());
    assert_eq!(
        plain[..plain.len() - 1],
        mtp[..mtp.len() - 1],
        "streamed chunks differ"
    );
    assert_eq!(details(last_p), (0, 0));
    assert!(details(last_m).0 > 0, "{last_m}");
}

/// A model's line of /metrics.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in /metrics:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_speculates_with_the_models_mtp_layers_and_ngram() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny-mtp.gguf");
    write_mtp_model(&file);
    let f = file.display();
    let (url, _stop) = serve(&format!("plain={f}+spec=off,auto={f}")).await;
    let greedy = json!({"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0,
                        "logprobs": 2, "ignore_eos": true});
    let sampled = json!({"prompt": [504, 3575, 282, 28, 9], "max_tokens": 20,
                         "temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 11,
                         "ignore_eos": true});
    let mut accepted_total = 0;
    for (what, body) in [("greedy", &greedy), ("sampled", &sampled)] {
        let plain = complete(&url, "plain", body).await;
        let auto = complete(&url, "auto", body).await;
        assert_eq!(
            plain["choices"], auto["choices"],
            "{what}: completions differ"
        );
        assert_eq!(details(&plain), (0, 0), "{what}: +spec=off speculated");
        let (a, r) = details(&auto);
        assert!(a + r > 0, "{what}: the default drafted nothing: {auto}");
        accepted_total += a;
    }
    assert!(accepted_total > 0);
    let plain = stream(&url, "plain", &sampled).await;
    let auto = stream(&url, "auto", &sampled).await;
    assert_eq!(
        plain[..plain.len() - 1],
        auto[..auto.len() - 1],
        "streamed chunks differ"
    );
    let m = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(
            &m,
            r#"memra_model_spec_drafter{model="auto",drafter="mtp+ngram"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            r#"memra_model_spec_drafter{model="plain",drafter="off"}"#
        ),
        1.0
    );
    let mtp = metric(
        &m,
        r#"memra_model_spec_draft_tokens_total{model="auto",drafter="mtp"}"#,
    );
    let ngram = metric(
        &m,
        r#"memra_model_spec_draft_tokens_total{model="auto",drafter="ngram"}"#,
    );
    assert!(mtp + ngram > 0.0, "{m}");
    assert!(metric(&m, r#"memra_model_spec_verify_steps_total{model="auto"}"#) > 0.0);
    let ratio = metric(&m, r#"memra_model_spec_acceptance_ratio{model="auto"}"#);
    assert!((0.0..=1.0).contains(&ratio) && ratio > 0.0, "{ratio}");
    for reason in ["backoff", "load", "no_room", "no_draft", "error"] {
        let v = metric(
            &m,
            &format!(r#"memra_model_spec_fallbacks_total{{model="auto",reason="{reason}"}}"#),
        );
        assert!(v >= 0.0);
    }
    assert_eq!(
        metric(
            &m,
            r#"memra_model_spec_fallbacks_total{model="auto",reason="load"}"#
        ),
        0.0
    );
}

#[test]
fn a_missing_draft_model_is_refused_before_anything_loads() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    for opt in ["+draft=", "+spec=draft+draft="] {
        let models = format!("m=/no/target.gguf{opt}{}", missing.display());
        let args = Cli::try_parse_from(["memra-server", "--models", &models])
            .expect("flags")
            .serve;
        let specs = args.model_specs().expect("MEMRA_MODELS");
        let cfg = StartConfig::from_args(&specs, &args).expect("start config");
        let e = memra_server::real::check_draft_paths(&cfg).unwrap_err();
        assert!(e.contains("model `m`"), "{e}");
        assert!(e.contains("nope.gguf"), "{e}");
        assert!(e.contains("No such file"), "{e}");
    }
}
