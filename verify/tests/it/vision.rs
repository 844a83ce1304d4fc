//! `memra-verify vision` on the CPU (CI): a tiny random tower against the numpy reference,
//! image prompts under mixed load and in the prefix cache.

use std::process::Command;

#[test]
fn vision_gate_passes_on_cpu() {
    let python = memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("vision.json");
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .args([
            "vision",
            "--python",
            &python,
            "--images",
            "3",
            "--prompts",
            "8",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("ALL GREEN"), "{stdout}");
    assert!(stdout.contains("equal on 8/8 image prompts"), "{stdout}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let errs = r["rel_errors"].as_array().unwrap();
    assert_eq!(errs.len(), 3);
    assert!(errs.iter().all(|e| e.as_f64().unwrap() < 1e-4), "{r}");
    assert_eq!(r["serve_differences"], 0);
    assert!(r["cached_tokens_same_image"].as_u64().unwrap() > 16, "{r}");
}
