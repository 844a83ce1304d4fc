//! `memra-verify pp` on the CPU (CI): tiny models of the architectures whose stage boundary
//! carries something (tied output, sliding windows, recurrent state, experts) split at every
//! layer boundary give the unsplit bits; `invariance --pp 2` holds inside a split model; the
//! gate's comparison catches a changed bit, and bad splits are clear errors.

use std::process::Command;

use memra_engine::backend::Device;
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_verify::pp::{self, Options};

fn verify(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .args(args)
        .output()
        .expect("run memra-verify");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_pp_gate_is_green_on_tiny_models() {
    for arch in ["llama", "gemma3", "qwen3next", "qwen3moe"] {
        let (ok, out) = verify(&["pp", "--tiny", arch, "--device", "cpu", "--max-m", "9"]);
        assert!(ok && out.contains("ALL GREEN"), "{arch}: {out}");
        // The planned split and every boundary of the 4 layers.
        for s in [
            "planned split",
            "split at [1]",
            "split at [2]",
            "split at [3]",
        ] {
            assert!(out.contains(s), "{arch}: {s}: {out}");
        }
        assert!(out.contains(", 0 failed"), "{arch}: {out}");
    }
    let (ok, out) = verify(&["pp", "--tiny", "llama", "--device", "cpu", "--pp", "3"]);
    assert!(ok && out.contains("ALL GREEN"), "three stages: {out}");
}

#[test]
fn invariance_holds_inside_a_split_model() {
    for arch in ["llama", "qwen3next"] {
        let args = [
            "invariance",
            "--tiny",
            arch,
            "--device",
            "cpu",
            "--pp",
            "2",
            "--max-m",
            "8",
        ];
        let (ok, out) = verify(&args);
        assert!(ok && out.contains("ALL GREEN"), "{arch}: {out}");
        assert!(out.contains("invariance on cpu,cpu"), "{arch}: {out}");
        assert!(
            out.contains("pp 2: stage 0 cpu layers 0..1"),
            "{arch}: {out}"
        );
    }
}

#[test]
fn a_changed_bit_fails_the_comparison() {
    let cfg = ModelConfig {
        n_layers: 3,
        ..tiny_config(Arch::Qwen3, 97)
    };
    let w = random_weights(&cfg, 5, DType::Q8_0).expect("weights");
    let o = Options {
        prompt_len: 9,
        max_m: 5,
        gen_tokens: 3,
        seed: 1,
        threads: 1,
        kv_dtype: Default::default(),
        stages: 2,
        devices: Vec::new(),
        splits: Some(vec![vec![1], vec![2]]),
        micro: vec![1, 2],
        link: Default::default(),
    };
    let rep = pp::run(&w, Device::Cpu, &o).expect("gate");
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    assert_eq!(rep.splits.len(), 4);
    assert!(
        rep.splits[1].contains("micro-batches: up to 2 a step"),
        "{:?}",
        rep.splits
    );
    let mut b = memra_engine::backend::open_backend(
        Device::Cpu,
        w,
        (pp::blocks_needed(&o), 16, Default::default()),
        1,
    )
    .expect("backend");
    let base = pp::trace(b.as_mut(), &o).expect("trace");
    let mut bad = pp::trace(b.as_mut(), &o).expect("trace again");
    assert_eq!(pp::compare(&base, &bad, "same").1, Vec::<String>::new());
    bad.logits[5].1[3] ^= 1;
    bad.kv[0][7] ^= 1;
    let (_, fails) = pp::compare(&base, &bad, "flipped");
    assert_eq!(fails.len(), 2, "{fails:?}");
    assert!(fails[0].contains("logits bits of"), "{fails:?}");
    assert!(fails[1].contains("KV block 0"), "{fails:?}");
}

#[test]
fn bad_splits_are_clear_errors() {
    for args in [
        vec!["pp", "--tiny", "llama", "--device", "cpu", "--splits", "4"],
        vec!["pp", "--tiny", "llama", "--device", "cpu", "--splits", "x"],
        vec!["pp", "--tiny", "llama", "--device", "cpu", "--pp", "9"],
        vec![
            "pp",
            "--tiny",
            "llama",
            "--device",
            "cpu",
            "--devices",
            "cpu",
        ],
    ] {
        let (ok, out) = verify(&args);
        assert!(!ok, "{args:?}: {out}");
        assert!(out.contains("invalid input"), "{args:?}: {out}");
        assert!(!out.contains("panicked"), "{args:?}: {out}");
    }
}
