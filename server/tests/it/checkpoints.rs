//! The memra-server binary serving HF FP8 (128 x 128 block scales) and ModelOpt NVFP4 folders on
//! the CPU: tiny llama checkpoints with SmolLM2's tokenizer load from their paths (`--models`),
//! answer greedy completions, and a request's text is the same streamed and not.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use memra_engine::config::Arch;
use memra_engine::formats::gguf::Gguf;
use memra_engine::formats::safetensors::HfFolderSpec;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::testing::quant_folder::{Ckpt, entries, write};
use memra_engine::tokenizer::Tokenizer;
use serde_json::{Value, json};

/// A tiny llama checkpoint of type `ck` in `dir`.
fn folder(dir: &std::path::Path, ck: Ckpt) -> std::path::PathBuf {
    let g = Gguf::open(&memra_engine::testing::real_model()).expect("SmolLM2");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let mut c = tiny_config(Arch::Llama, tok.vocab_size());
    c.max_ctx = 256;
    let w = random_weights(&c, 11, DType::F32).expect("weights");
    let spec = HfFolderSpec {
        config_json: c.to_hf_json(tok.bos_id(), tok.eos_id()),
        tokenizer_json: Some(tok.to_hf_json().expect("tokenizer.json")),
        tokenizer_config_json: None,
        max_shard_bytes: 1 << 30,
    };
    let out = dir.join(format!("{ck:?}"));
    write(
        &out,
        &spec,
        Some(ck.config()),
        entries(&w, ck).expect("entries"),
    )
    .expect("write");
    out
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(models: &str) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-server"))
        .env("MEMRA_MODELS", models)
        .env("MEMRA_ADDR", "127.0.0.1:0")
        .env("MEMRA_DEVICE", "cpu")
        .env("MEMRA_KV_BLOCKS", "64")
        .stderr(Stdio::piped())
        .spawn()
        .expect("memra-server");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let server = Server(child);
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server did not start listening");
    (server, format!("http://{addr}"))
}

async fn complete(url: &str, model: &str, stream: bool) -> String {
    let body = json!({"model": model, "prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0, "stream": stream});
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200, "{model}");
    let text = r.text().await.expect("body");
    if !stream {
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["usage"]["completion_tokens"], 8, "{model}: {v}");
        return v["choices"][0]["text"].as_str().expect("text").to_string();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fp8_and_nvfp4_folders_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fp8, nv) = (
        folder(dir.path(), Ckpt::Fp8),
        folder(dir.path(), Ckpt::Nvfp4),
    );
    let (_server, url) = start(&format!("fp8={},nvfp4={}", fp8.display(), nv.display()));
    let c = reqwest::Client::new();
    for _ in 0..600 {
        match c.get(format!("{url}/ready")).send().await {
            Ok(r) if r.status() == 200 => break,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    for model in ["fp8", "nvfp4"] {
        let plain = complete(&url, model, false).await;
        assert!(!plain.is_empty(), "{model}");
        assert_eq!(complete(&url, model, true).await, plain, "{model}");
    }
}
