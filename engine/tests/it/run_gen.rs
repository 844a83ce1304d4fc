//! End-to-end checks of the `run-gen` binary on the real SmolLM2-135M-Instruct (CPU).

use crate::common;

use std::process::Command;

fn run_gen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_run-gen"))
        .args(args)
        .output()
        .expect("run run-gen")
}

#[test]
fn chat_answers_paris() {
    let m = common::real_model();
    let out = run_gen(&[
        m.to_str().unwrap(),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "24",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), "The capital of France is Paris.");
}

#[test]
fn json_output_has_the_documented_fields() {
    let m = common::real_model();
    let out = run_gen(&[
        m.to_str().unwrap(),
        "--prompt",
        "The quick brown fox",
        "--max-tokens",
        "5",
        "--json",
        "--logits-top",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let tokens = v["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 5);
    assert_eq!(v["finish_reason"], "length");
    assert!(!v["prompt_ids"].as_array().expect("prompt_ids").is_empty());
    assert!(v["text"].is_string());
    assert!(v["prompt_tok_per_s"].as_f64().expect("prompt tok/s") > 0.0);
    assert!(v["decode_tok_per_s"].as_f64().expect("decode tok/s") >= 0.0);
    let top = v["logits_top"].as_array().expect("logits_top");
    assert_eq!(top.len(), 5);
    for (pos, step) in top.iter().enumerate() {
        let step = step.as_array().expect("step");
        assert_eq!(step.len(), 3);
        // Greedy: the generated token is the first of the top list.
        assert_eq!(step[0][0], tokens[pos]);
        let l: Vec<f64> = step.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(l[0] >= l[1] && l[1] >= l[2]);
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_prompt_ids_work() {
    let m = common::real_model();
    let args = [
        m.to_str().unwrap(),
        "--prompt-ids",
        "504,3575,282",
        "--max-tokens",
        "8",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "11",
        "--json",
    ];
    let a = run_gen(&args);
    let b = run_gen(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let ta: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let tb: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    assert_eq!(ta["tokens"], tb["tokens"]);
    assert_eq!(ta["prompt_ids"], serde_json::json!([504, 3575, 282]));
}

#[test]
fn user_errors_are_clear_and_non_zero() {
    let m = common::real_model();
    let m = m.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["/nonexistent/model.gguf", "--prompt", "x"],
            "no such model",
        ),
        (
            &[m, "--prompt", "x", "--device", "tpu"],
            "expected auto, cpu, cuda",
        ),
        (&[m, "--prompt", "x", "--top-p", "0"], "top_p"),
        (&[m, "--prompt-ids", "999999"], "outside the vocabulary"),
        (
            &[m, "--prompt", "x", "--device", "cuda"],
            "CUDA is not available",
        ),
    ];
    for (args, want) in cases {
        let out = run_gen(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(want),
            "{args:?}: stderr {err:?} lacks {want:?}"
        );
    }
}
