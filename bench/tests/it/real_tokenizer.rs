//! With the real SmolLM2 GGUF: synthetic models carry its tokenizer (GGUF metadata copied, HF
//! tokenizer files written), and `convert` turns the real model into an HF folder that loads with
//! the same weights, tokenizer and chat template.

use std::path::PathBuf;
use std::process::Command;

use memra_bench::convert::{ConvertArgs, convert_gguf_to_hf};
use memra_bench::plan::SynthDType;
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, synth};
use memra_engine::chat::ChatMessage;
use memra_engine::config::ModelConfig;
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::load_model;
use memra_engine::models::Role;
use memra_engine::tokenizer::Tokenizer;

fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

const TEXTS: [&str; 5] = [
    "Hello world",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    "def f(x):\n    return x * 12345",
    "Quelle est la capitale de l'Allemagne ?",
    "emoji 🦀 and 中文",
];

fn args(shape: Shape, dtype: SynthDType, format: Format, out: PathBuf) -> SynthArgs {
    SynthArgs {
        seed: 1,
        format,
        ..SynthArgs::new(shape, dtype, out, TokenizerSource::Gguf(real_model()))
    }
}

#[test]
fn synth_gguf_carries_the_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.gguf");
    let rep = synth(&args(
        Shape::TinyLlama,
        SynthDType::Q8_0,
        Format::Gguf,
        out.clone(),
    ))
    .unwrap();
    assert_eq!(rep.config.vocab, 49152);
    let (src, g) = (
        Gguf::open(&real_model()).unwrap(),
        Gguf::open(&out).unwrap(),
    );
    assert_eq!(
        ModelConfig::from_gguf(&g).unwrap(),
        Shape::TinyLlama.config(49152)
    );
    let tok_keys = |g: &Gguf| -> Vec<_> {
        g.metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned()
            .collect()
    };
    let keys = tok_keys(&src);
    assert!(keys.iter().any(|(k, _)| k == "tokenizer.chat_template"));
    assert_eq!(tok_keys(&g), keys);
    let (a, b) = (
        Tokenizer::from_gguf(&src).unwrap(),
        Tokenizer::from_gguf(&g).unwrap(),
    );
    for t in TEXTS {
        assert_eq!(
            a.encode(t, false).unwrap(),
            b.encode(t, false).unwrap(),
            "{t}"
        );
    }
}

#[test]
fn synth_hf_writes_tokenizer_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hf");
    synth(&args(
        Shape::TinyQwen3,
        SynthDType::BF16,
        Format::Hf,
        out.clone(),
    ))
    .unwrap();
    let m = load_model(&out).unwrap();
    assert_eq!(m.config, Shape::TinyQwen3.config(49152));
    let src = Gguf::open(&real_model()).unwrap();
    let want = Tokenizer::from_gguf(&src).unwrap();
    for t in TEXTS {
        assert_eq!(
            m.tokenizer.encode(t, false).unwrap(),
            want.encode(t, false).unwrap(),
            "{t}"
        );
    }
    assert_eq!(m.tokenizer.eos_id(), want.eos_id());
    assert_eq!(m.tokenizer.add_bos_default(), want.add_bos_default());
    let tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(
        tc["chat_template"].as_str(),
        src.get("tokenizer.chat_template").and_then(|v| v.as_str())
    );
    assert!(m.chat.is_some());
}

#[test]
fn convert_real_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-hf");
    let c = ConvertArgs {
        input: real_model(),
        out: out.clone(),
        dtype: None,
        shard_bytes: 300_000_000,
        progress: false,
    };
    let rep = convert_gguf_to_hf(&c).unwrap();
    assert_eq!(rep.tensors, 272);
    let (hf, gg) = (
        load_model(&out).unwrap(),
        load_model(&real_model()).unwrap(),
    );
    assert_eq!(hf.config, gg.config);
    // Weights: the HF copy is the dequantized GGUF model, q/k in HF order (the loader un-permutes).
    let roles = [
        Role::TokenEmbd,
        Role::OutputNorm,
        Role::Q(0),
        Role::K(0),
        Role::V(29),
        Role::Down(17),
    ];
    for r in roles {
        let (a, b) = (hf.weights.get(r).unwrap(), gg.weights.get(r).unwrap());
        assert_eq!(a.shape, b.shape, "{}", a.name);
        assert_eq!(a.to_f32().unwrap(), b.to_f32().unwrap(), "{}", a.name);
    }
    for t in TEXTS {
        assert_eq!(
            hf.tokenizer.encode(t, false).unwrap(),
            gg.tokenizer.encode(t, false).unwrap(),
            "{t}"
        );
    }
    let msgs = [ChatMessage::new("user", "What is the capital of France?")];
    let (hc, gc) = (hf.chat.unwrap(), gg.chat.unwrap());
    assert_eq!(
        hc.render(&msgs, true).unwrap(),
        gc.render(&msgs, true).unwrap()
    );
}

#[test]
fn cli_uses_models_dir_for_the_default_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cli.gguf");
    let models_dir = real_model().parent().unwrap().to_path_buf();
    let o = Command::new(env!("CARGO_BIN_EXE_memra-bench"))
        .env("MEMRA_MODELS_DIR", &models_dir)
        .args([
            "synth",
            "--shape",
            "tiny-qwen2",
            "--dtype",
            "q4_0",
            "--seed",
            "5",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g = Gguf::open(&out).unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&g).unwrap(),
        Shape::TinyQwen2.config(49152)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_memra-bench"))
        .env("MEMRA_MODELS_DIR", dir.path())
        .args(["synth", "--shape", "tiny-qwen2", "--out"])
        .arg(dir.path().join("x.gguf"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("run tools/fetch-models.sh"));
}
