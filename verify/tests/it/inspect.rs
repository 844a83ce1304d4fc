//! `memra-verify inspect`: the real model is valid and summarised; damaged copies of it are
//! invalid with exit status 2 and a reason naming the problem.

use std::path::PathBuf;
use std::process::Command;

use memra_verify::inspect::inspect;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memra-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d.join(name)
}

fn cli(path: &std::path::Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .arg("inspect")
        .arg(path)
        .output()
        .expect("run memra-verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_real_model_is_valid_and_summarised() {
    let model = memra_engine::testing::real_model();
    let s = inspect(&model, true).expect("SmolLM2 is valid");
    assert_eq!((s.layers, s.hidden, s.heads, s.kv_heads), (30, 576, 9, 3));
    assert_eq!((s.vocab, s.tokenizer_vocab), (49152, 49152));
    assert_eq!(s.tensors, 272);
    assert_eq!(s.dtypes.get("q4_1"), Some(&210));
    assert_eq!(s.non_finite, Some(0));
    assert!(s.tokenizer_round_trip);
    assert!(s.chat_template_tokens.is_some_and(|n| n > 10));
    let (code, out) = cli(&model);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(": valid") && out.contains("30 layers"),
        "{out}"
    );
}

#[test]
fn damaged_files_are_invalid_with_the_reason() {
    let model = memra_engine::testing::real_model();
    let bytes = std::fs::read(&model).expect("read the model");
    let truncated = scratch("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let (code, out) = cli(&truncated);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("invalid") && out.contains("outside the file"),
        "{out}"
    );
    let mut bad_magic = bytes[..4096].to_vec();
    bad_magic[..4].copy_from_slice(b"GGUX");
    let f = scratch("magic.gguf");
    std::fs::write(&f, &bad_magic).expect("write");
    let (code, out) = cli(&f);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("bad magic"), "{out}");
    let (code, out) = cli(&scratch("missing.gguf"));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no such model file"), "{out}");
    assert!(inspect(&truncated, false).is_err());
}

/// NaN and Inf weights load (the file is well formed) but `--scan` counts them; without the
/// scan they are not looked for.
#[test]
fn scan_counts_non_finite_weights() {
    let model = memra_engine::testing::real_model();
    let mut bytes = std::fs::read(&model).expect("read the model");
    let g = memra_engine::formats::gguf::Gguf::open(&model).expect("open");
    let t = g.tensor_info("output_norm.weight").expect("output_norm");
    assert_eq!(t.dtype, memra_engine::quant::DType::F32);
    let at = t.offset as usize;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    bytes[at + 8..at + 12].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    bytes[at + 16..at + 20].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let f = scratch("nan.gguf");
    std::fs::write(&f, &bytes).expect("write");
    assert_eq!(inspect(&f, false).expect("valid").non_finite, None);
    assert_eq!(inspect(&f, true).expect("valid").non_finite, Some(3));
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .args(["inspect", "--scan"])
        .arg(&f)
        .output()
        .expect("run memra-verify");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("3 non-finite values"), "{text}");
}
