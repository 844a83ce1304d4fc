//! `synth --format hf`: tiny models of every architecture reopen with the expected config and
//! values; output is deterministic and independent of the thread count.

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_bench::generate::tensor_values;
use memra_bench::plan::{SynthDType, plan};
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, synth};
use memra_engine::formats::safetensors::HfModel;
use memra_engine::quant::{DType, quantize};

const VOCAB: usize = 256;

fn args(shape: Shape, dtype: SynthDType, seed: u64, out: PathBuf) -> SynthArgs {
    let tokenizer = TokenizerSource::None { vocab: VOCAB };
    SynthArgs {
        seed,
        format: Format::Hf,
        ..SynthArgs::new(shape, dtype, out, tokenizer)
    }
}

fn read_all(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn tiny_models_reopen_with_expected_config_and_values() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [Shape::TinyLlama, Shape::TinyQwen2, Shape::TinyQwen3] {
        for dtype in [SynthDType::F32, SynthDType::F16, SynthDType::BF16] {
            let out = dir.path().join(format!("{shape}-{}", dtype.name()));
            let a = args(shape, dtype, 42, out.clone());
            let rep = synth(&a).unwrap();
            let m = HfModel::open(&out).unwrap();
            assert_eq!(m.config, shape.config(VOCAB), "{shape} {}", dtype.name());
            assert_eq!(rep.config, m.config);
            let p = plan(&m.config, dtype);
            assert_eq!(m.tensor_names().len(), p.len());
            assert_eq!(rep.tensors, p.len());
            for t in &p {
                let got = m.tensor(&t.hf_name()).unwrap().unwrap();
                assert_eq!(got.shape, t.shape, "{}", t.hf_name());
                let want_dtype = if t.shape.len() == 1 {
                    DType::F32
                } else {
                    dtype.float_type().unwrap()
                };
                assert_eq!(got.dtype, want_dtype, "{}", t.hf_name());
                let want = quantize(want_dtype, &tensor_values(42, t)).unwrap();
                assert_eq!(&got.data[..], &want[..], "{}", t.hf_name());
                let vals = got.to_f32().unwrap();
                assert!(
                    vals.iter().all(|v| v.is_finite() && v.abs() < 1.2),
                    "{}",
                    t.hf_name()
                );
            }
        }
    }
}

#[test]
fn deterministic_across_runs_and_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut outs = Vec::new();
    for (i, threads) in [Some(1), Some(3), None, Some(2)].into_iter().enumerate() {
        let seed = if i == 3 { 8 } else { 7 };
        let out = dir.path().join(format!("m{i}"));
        let mut a = args(Shape::TinyQwen2, SynthDType::BF16, seed, out.clone());
        a.threads = threads;
        a.layers = Some(3);
        synth(&a).unwrap();
        outs.push(read_all(&out));
    }
    assert_eq!(outs[0], outs[1], "1 vs 3 threads");
    assert_eq!(outs[0], outs[2], "1 thread vs default");
    assert_ne!(outs[0], outs[3], "another seed gives other weights");
    let m = HfModel::open(&dir.path().join("m0")).unwrap();
    assert_eq!(m.config.n_layers, 3);
}

#[test]
fn sharded_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m");
    let mut a = args(Shape::TinyLlama, SynthDType::F32, 1, out.clone());
    a.shard_bytes = 40_000;
    synth(&a).unwrap();
    let m = HfModel::open(&out).unwrap();
    assert!(m.shard_paths().len() > 2);
    let t = &plan(&m.config, SynthDType::F32)[3];
    let got = m.tensor(&t.hf_name()).unwrap().unwrap();
    assert_eq!(got.to_f32().unwrap(), tensor_values(1, t));
}

#[test]
fn hf_refuses_quantized_types() {
    let dir = tempfile::tempdir().unwrap();
    let e = synth(&args(
        Shape::TinyLlama,
        SynthDType::Q8_0,
        1,
        dir.path().join("m"),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("f32/f16/bf16"), "{e}");
    assert!(!dir.path().join("m").exists());
    assert!(!dir.path().join("m.tmp").exists());
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memra-bench"))
}

#[test]
fn cli_synth_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cli");
    let st = bin()
        .args([
            "synth",
            "--shape",
            "tiny-qwen3",
            "--dtype",
            "f16",
            "--seed",
            "3",
            "--format",
            "hf",
        ])
        .args([
            "--tokenizer-from",
            "none",
            "--vocab",
            "300",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_eq!(
        HfModel::open(&out).unwrap().config,
        Shape::TinyQwen3.config(300)
    );

    let cases: [(&[&str], &str); 4] = [
        (
            &["--shape", "gpt5", "--tokenizer-from", "none"],
            "unknown shape `gpt5`",
        ),
        (
            &[
                "--shape",
                "tiny-llama",
                "--dtype",
                "q3_x",
                "--tokenizer-from",
                "none",
            ],
            "unknown --dtype",
        ),
        (
            &[
                "--shape",
                "tiny-llama",
                "--format",
                "onnx",
                "--tokenizer-from",
                "none",
            ],
            "unknown --format",
        ),
        (
            &[
                "--shape",
                "tiny-llama",
                "--tokenizer-from",
                "/nonexistent/tok.gguf",
            ],
            "tools/fetch-models.sh",
        ),
    ];
    for (extra, words) in cases {
        let o = bin()
            .arg("synth")
            .args(extra)
            .arg("--out")
            .arg(dir.path().join("bad"))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{extra:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(words),
            "{extra:?}: `{err}` should contain `{words}`"
        );
    }
}
