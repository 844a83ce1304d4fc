//! The same model as a GGUF file and as the HF safetensors folder converted from it gives
//! bitwise-identical logits on the CPU. This pins the rope layout trap: GGUF llama stores q/k
//! rows permuted for adjacent-pair RoPE, HF checkpoints use half rotation.

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;

fn bench(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-bench"))
        .args(args)
        .output()
        .expect("run memra-bench");
    assert!(
        out.status.success(),
        "memra-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

/// Logit bits of a greedy run: every prompt position's successor and 6 decoded tokens.
fn logit_bits(model: &Path, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let w = load_weights(model).expect("load");
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 8,
        block_size: 16,
        ..Default::default()
    };
    let mut b = CpuBackend::new(w, &opts).expect("backend");
    let mut req = GenRequest::greedy(prompt.to_vec(), 6);
    req.keep_logits = true;
    req.prefill_chunk = 5;
    let out = generate(&mut b, &req, &mut |_| Ok(())).expect("generate");
    let bits = out
        .logits
        .iter()
        .map(|l| l.iter().map(|v| v.to_bits()).collect())
        .collect();
    (out.tokens, bits)
}

fn assert_same(gguf: &Path, hf: &Path, prompt: &[u32]) {
    let a = logit_bits(gguf, prompt);
    let b = logit_bits(hf, prompt);
    assert_eq!(a.0, b.0, "greedy tokens differ");
    for (i, (x, y)) in a.1.iter().zip(&b.1).enumerate() {
        let diff = x.iter().zip(y).filter(|(p, q)| p != q).count();
        assert_eq!(diff, 0, "position {i}: {diff} logits differ in bits");
    }
}

#[test]
fn smollm2_gguf_and_converted_hf_folder_agree_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("smollm2-hf");
    let src = real_model();
    bench(&[
        "convert",
        src.to_str().unwrap(),
        hf.to_str().unwrap(),
        "--quiet",
    ]);
    let prompt = [
        1u32, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 314, 260,
    ];
    assert_same(&src, &hf, &prompt);
}

#[test]
fn synthetic_models_in_both_formats_agree_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, dtype) in [
        ("tiny-qwen3", "q8_0"),
        ("tiny-qwen3", "f16"),
        ("tiny-llama", "q4_0"),
        ("tiny-qwen2", "bf16"),
        ("tiny-postnorm", "q8_0"),
        ("tiny-gemma3", "q8_0"),
        ("tiny-gemma3", "bf16"),
        ("tiny-qwen3moe", "q8_0"),
        ("tiny-qwen3moe", "bf16"),
        ("tiny-qwen2vl", "q8_0"),
        ("tiny-qwen3vl", "f16"),
    ] {
        let gguf = dir.path().join(format!("{shape}-{dtype}.gguf"));
        let hf = dir.path().join(format!("{shape}-{dtype}-hf"));
        let (g, h) = (gguf.to_str().unwrap(), hf.to_str().unwrap());
        bench(&[
            "synth", "--shape", shape, "--dtype", dtype, "--seed", "5", "--out", g, "--quiet",
        ]);
        bench(&["convert", g, h, "--quiet"]);
        assert_same(&gguf, &hf, &[3, 17, 250, 9, 4000, 77, 12, 5, 6, 1000, 2]);
    }
}

/// qwen3moe's expert stacks through every path: `synth --format hf` (one tensor per expert)
/// and `convert --to gguf` of it (stacks again) give the GGUF's logits bit for bit.
#[test]
fn moe_synth_hf_and_round_trip_agree_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (gguf, hf, back) = (p("moe.gguf"), p("moe-hf"), p("moe-back.gguf"));
    let synth = [
        "synth",
        "--shape",
        "tiny-qwen3moe",
        "--dtype",
        "f16",
        "--seed",
        "8",
    ];
    bench(&[&synth[..], &["--out", &gguf, "--quiet"]].concat());
    bench(&[&synth[..], &["--out", &hf, "--format", "hf", "--quiet"]].concat());
    bench(&["convert", &hf, &back, "--to", "gguf", "--quiet"]);
    let names = memra_engine::formats::safetensors::HfModel::open(Path::new(&hf))
        .unwrap()
        .tensor_names();
    let expert = "model.layers.1.mlp.experts.7.down_proj.weight";
    assert!(
        names.iter().any(|n| n == expert),
        "no per-expert HF tensors"
    );
    let prompt = [3, 17, 250, 9, 4000, 77, 12, 5, 6, 1000, 2];
    assert_same(Path::new(&gguf), Path::new(&hf), &prompt);
    assert_same(Path::new(&gguf), Path::new(&back), &prompt);
}
