//! `memra-verify vision` on the CPU (CI): a tiny random tower (Gemma 3's; the Qwen ViT's
//! three members) against the numpy reference and (Gemma 3) the Rust float64 one (each other
//! too), image prompts under mixed load and in the prefix cache.

use std::process::Command;

/// Runs `memra-verify vision ARGS --json FILE` and asserts it passed (exit 0, ALL GREEN); its
/// stdout and its JSON report.
fn passing_gate(args: &[&str]) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("vision.json");
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .arg("vision")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("ALL GREEN"), "{stdout}");
    let r = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (stdout, r)
}

#[test]
fn vision_gate_passes_on_cpu() {
    let python = memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into());
    let (stdout, r) = passing_gate(&[
        "--python",
        &python,
        "--reference",
        "both",
        "--images",
        "3",
        "--prompts",
        "8",
    ]);
    assert!(stdout.contains("equal on 8/8 image prompts"), "{stdout}");
    let errs = r["rel_errors"].as_array().unwrap();
    assert_eq!(errs.len(), 3);
    assert!(errs.iter().all(|e| e.as_f64().unwrap() < 1e-4), "{r}");
    // The Rust float64 reference (what runs where python does not) agrees with numpy's.
    assert_eq!(r["rel_errors_f64"].as_array().unwrap().len(), 3);
    assert!(r["f64_vs_numpy"].as_f64().unwrap() < 1e-6, "{r}");
    assert_eq!(r["serve_differences"], 0);
    assert!(r["cached_tokens_same_image"].as_u64().unwrap() > 16, "{r}");
    assert_eq!(r["cached_tokens_inside_image"], 20, "{r}");
}

/// The GPU machines have no python: `--reference f64` needs none.
#[test]
fn vision_gate_runs_without_python() {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .args([
            "vision",
            "--reference",
            "f64",
            "--python",
            "/nonexistent/python",
        ])
        .args(["--images", "2", "--prompts", "3"])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("vs the Rust float64 reference"), "{stdout}");
    assert!(!stdout.contains("numpy"), "{stdout}");
    assert!(stdout.contains("ALL GREEN"), "{stdout}");
}

/// `--reference none` (a real-size tower, whose float64 references take too long) runs no
/// reference; on the CPU the tower's own rows stand in for the tokens check, and no CUDA tower
/// is reported.
#[test]
fn vision_gate_runs_without_a_reference() {
    let (stdout, r) = passing_gate(&[
        "--reference",
        "none",
        "--python",
        "/nonexistent/python",
        "--images",
        "1",
        "--prompts",
        "2",
    ]);
    assert!(!stdout.contains("reference: largest"), "{stdout}");
    assert_eq!(r["tower"], "cpu", "{r}");
    assert!(r["rel_errors"].as_array().unwrap().is_empty(), "{r}");
    assert!(r["cuda_vs_cpu"].as_array().unwrap().is_empty(), "{r}");
    assert!(r["cuda_repeat_equal"].is_null(), "{r}");
}

/// The Qwen ViT (`--family qwen2vl|qwen25vl|qwen3vl`: a tiny random tower and a tiny qwen2vl /
/// qwen3vl text model, M-RoPE, the qwen3vl with a deepstack layer) against its numpy reference
/// (verify/reference/qwenvit_reference.py) on a square, a wide and a tall image (Qwen2.5-VL's
/// windows cut at the grid's edges; Qwen3-VL's deepstack values checked too), the text model
/// against its numpy reference (verify/reference/qwenvl_text_reference.py: M-RoPE positions
/// equal to HF's get_rope_index, logits), a 3-frame video through the video path (tower, text
/// model positions and logits, tokens), then served: tokens equal, exact under load,
/// prefix-cache hits.
#[test]
fn vision_gate_passes_for_the_qwen_vit() {
    let python = memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into());
    for family in ["qwen2vl", "qwen25vl", "qwen3vl"] {
        let (stdout, r) = passing_gate(&[
            "--family",
            family,
            "--python",
            &python,
            "--reference",
            "numpy",
            "--images",
            "3",
            "--prompts",
            "4",
        ]);
        assert!(stdout.contains("equal on 4/4 image prompts"), "{stdout}");
        assert!(r["projector"].as_str().unwrap().starts_with("qwen"), "{r}");
        assert_eq!(r["image_tokens"], serde_json::json!([36, 24, 15]), "{r}");
        let errs = r["rel_errors"].as_array().unwrap();
        assert_eq!(errs.len(), 3);
        assert!(errs.iter().all(|e| e.as_f64().unwrap() < 1e-4), "{r}");
        assert_eq!(r["serve_differences"], 0);
        assert!(r["cached_tokens_same_image"].as_u64().unwrap() > 36, "{r}");
        // The M-RoPE text model against the numpy text reference (HF's get_rope_index).
        assert_eq!(r["text"]["positions_equal"], true, "{r}");
        assert!(r["text"]["rel_error"].as_f64().unwrap() < 1e-4, "{r}");
        // The video case: 3 frames (2 groups of 8 x 3 tokens) at 1.5 fps through the video
        // path vs the reference's; its positions (Qwen2-VL group indices, Qwen2.5-VL 2 / 1.5
        // x 2 = 2.67 truncated to 2, Qwen3-VL a span per group after its timestamp) equal
        // HF's; its tokens equal fed either rows.
        let v = &r["video"];
        assert!(stdout.contains("vision: video of 3 frames"), "{stdout}");
        assert_eq!(v["groups"], 2, "{r}");
        assert_eq!(v["tokens"], 48, "{r}");
        assert!(v["rel_error"].as_f64().unwrap() < 1e-4, "{r}");
        assert_eq!(v["positions_equal"], true, "{r}");
        assert!(v["text_rel_error"].as_f64().unwrap() < 1e-4, "{r}");
        assert_eq!(v["tokens_equal"], true, "{r}");
        let times = match family {
            "qwen2vl" => serde_json::json!([0, 1]),
            "qwen25vl" => serde_json::json!([0, 2]),
            _ => serde_json::json!([]),
        };
        assert_eq!(v["times"], times, "{r}");
    }
    // The Rust float64 reference is Gemma 3's only: asking for it is a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .args(["vision", "--family", "qwen25vl", "--reference", "f64"])
        .output()
        .expect("run memra-verify");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(all.contains("--reference numpy"), "{all}");
}

/// Long images (225 rows, the tiny model's context being 256): 4 image prompts and 4 texts
/// under load are more than the default pool of 1,024 positions, so the gate sizes its
/// loaded engine's pool to hold them, and the same image again is a hit of every full block
/// before its last token (it was 0 when the first request's blocks were evicted, head first).
#[test]
fn vision_gate_with_long_images_hits_the_whole_prefix() {
    use memra_engine::quant::DType;
    use memra_engine::vision::TowerParams;
    use memra_engine::vision::random::{random_tower, write_mmproj};
    let dir = tempfile::tempdir().unwrap();
    let mmproj = dir.path().join("mm.gguf");
    // 60x60 images of 2x2 patches, pooled by 2: 15 x 15 rows.
    let p = TowerParams::tiny_long(64);
    assert_eq!(p.tokens_per_image(), 225);
    write_mmproj(&p, &random_tower(&p, 3), DType::F32, &mmproj).unwrap();
    let (_, r) = passing_gate(&[
        "--reference",
        "none",
        "--mmproj",
        mmproj.to_str().unwrap(),
        "--images",
        "1",
        "--prompts",
        "4",
    ]);
    assert_eq!(r["tokens_per_image"], 225, "{r}");
    assert_eq!(r["serve_differences"], 0, "{r}");
    // Prompt 0: 3 text tokens, the 225 rows, 4 text tokens (232): 57 full blocks of 4
    // before the last token.
    assert_eq!(r["cached_tokens_same_image"], 228, "{r}");
    assert_eq!(r["cached_tokens_other_image"], 0, "{r}");
}
