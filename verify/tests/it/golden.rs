//! `memra-verify golden`: values recorded for the device class are reproduced byte for byte;
//! a changed token or a logit one bit off is reported at its position; recording needs a
//! reason; a missing file or another model's file is a clear error.

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_verify::golden::{self, PromptGolden};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memra-golden-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .arg("golden")
        .args(args)
        .output()
        .expect("run memra-verify");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn tiny(dir: &Path, extra: &[&str]) -> (i32, String) {
    let d = dir.to_str().expect("utf-8 path");
    let mut a = vec![
        "--tiny",
        "llama",
        "--device",
        "cpu",
        "--dir",
        d,
        "--max-tokens",
        "6",
    ];
    a.extend_from_slice(extra);
    cli(&a)
}

#[test]
fn recorded_values_are_reproduced_and_a_changed_one_is_found() {
    let dir = scratch("tiny");
    let (code, out) = tiny(&dir, &["--record", "--reason", "test record"]);
    assert_eq!(code, 0, "{out}");
    let file = dir.join("tiny-llama.cpu-kvf16.json");
    let g = golden::read(&file).expect("golden file");
    assert_eq!(g.class, "cpu-kvf16");
    assert_eq!(g.reason, "test record");
    assert_eq!(g.prompts.len(), 3);
    assert!(g.prompts.iter().all(|p| p.tokens.len() == 6
        && p.logits_sha256.len() == 6
        && p.top.iter().all(|t| t.len() == golden::SAMPLES)));
    let (code, out) = tiny(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 differ"), "{out}");

    // One position's hash changed in the file: that prompt differs there, the gate fails.
    let mut bad = g.clone();
    bad.prompts[1].logits_sha256[4] = "0000000000000000".into();
    golden::write(&file, &bad).expect("write");
    let (code, out) = tiny(&dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("DIFFERS at position 4"), "{out}");
    assert!(out.contains("1 differ"), "{out}");
}

fn prompt(tokens: Vec<u32>, logits: &[Vec<f32>]) -> PromptGolden {
    use sha2::Digest;
    PromptGolden {
        name: "p".into(),
        prompt_ids: vec![1, 2],
        tokens,
        logits_sha256: logits
            .iter()
            .map(|l| {
                let mut h = sha2::Sha256::new();
                for v in l {
                    h.update(v.to_le_bytes());
                }
                h.finalize()[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            })
            .collect(),
        top: logits
            .iter()
            .map(|l| memra_engine::generate::top_k(l, 2))
            .collect(),
    }
}

#[test]
fn the_comparison_sees_a_token_a_bit_and_a_missing_position() {
    let l = vec![vec![1.0, 0.5, -0.0], vec![0.25, 2.0, 0.0]];
    let want = [prompt(vec![0, 1], &l)];
    assert!(golden::compare(&want, &want)[0].difference.is_none());
    // -0.0 vs +0.0: the same value, other bytes.
    let mut z = l.clone();
    z[0][2] = 0.0;
    let d = golden::compare(&want, &[prompt(vec![0, 1], &z)]);
    assert_eq!(d[0].difference.as_ref().map(|x| x.0), Some(0));
    // One ulp at the second position.
    let mut u = l.clone();
    u[1][1] = f32::from_bits(2.0f32.to_bits() + 1);
    let d = golden::compare(&want, &[prompt(vec![0, 1], &u)]);
    assert_eq!(d[0].difference.as_ref().map(|x| x.0), Some(1));
    // Another token, a missing position, another prompt.
    let d = golden::compare(&want, &[prompt(vec![0, 2], &l)]);
    assert!(
        d[0].difference
            .as_ref()
            .is_some_and(|x| x.1.contains("token"))
    );
    let d = golden::compare(&want, &[prompt(vec![0], &l[..1])]);
    assert_eq!(d[0].difference.as_ref().map(|x| x.0), Some(1));
    let mut other = prompt(vec![0, 1], &l);
    other.prompt_ids = vec![3];
    assert!(golden::compare(&want, &[other])[0].difference.is_some());
}

#[test]
fn recording_needs_a_reason_and_checking_needs_a_file() {
    let dir = scratch("errors");
    let (code, out) = tiny(&dir, &["--record"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("--reason"), "{out}");
    let (code, out) = tiny(&dir, &["--record", "--reason", " "]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("must say why"), "{out}");
    let (code, out) = tiny(&dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("no values for class cpu") && out.contains("--record"),
        "{out}"
    );
}

#[test]
fn the_committed_cpu_values_of_the_real_model_hold() {
    let model = memra_engine::testing::real_model();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/golden");
    let m = model.to_str().expect("utf-8 path");
    let (code, out) = cli(&[m, "--device", "cpu", "--dir", dir]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 differ"), "{out}");
    // The same values under another model file's name are refused, not compared.
    let other = scratch("other").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let bytes = std::fs::read(&model).expect("model");
    let mut edited = bytes.clone();
    let n = edited.len();
    edited[n - 1] ^= 1;
    std::fs::write(&other, edited).expect("copy");
    let (code, out) = cli(&[
        other.to_str().expect("utf-8"),
        "--device",
        "cpu",
        "--dir",
        dir,
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("another model file"), "{out}");
}
