//! `memra-verify spec` and `memra-verify all`: the spec gate passes on a tiny random model, its
//! comparison catches a different token, finish reason or logit bit, a drafter that changes the
//! output would fail it, and `all --device cpu` passes on the real SmolLM2 (CI).

use std::process::Command;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::config::Arch;
use memra_engine::generate::{FinishReason, GenOutput};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::spec::Drafter;
use memra_engine::spec::ngram::NgramDrafter;
use memra_verify::spec::{self, Options, compare};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memra-verify"))
}

fn output(tokens: &[u32], logits: Vec<Vec<f32>>) -> GenOutput {
    GenOutput {
        tokens: tokens.to_vec(),
        finish_reason: FinishReason::Length,
        logits_top: Vec::new(),
        logits,
        prompt_secs: 0.0,
        decode_secs: 0.0,
    }
}

#[test]
fn comparison_catches_every_kind_of_difference() {
    let l = vec![vec![0.5f32, -1.0, 2.0], vec![1.0, 0.0, -0.0]];
    let a = output(&[1, 2], l.clone());
    assert_eq!(compare(&a, &a.clone(), true), Ok(2));
    // Another token.
    let e = compare(&a, &output(&[1, 3], l.clone()), true).unwrap_err();
    assert!(e.contains("token 1"), "{e}");
    // One token fewer.
    let e = compare(&a, &output(&[1], l[..1].to_vec()), true).unwrap_err();
    assert!(e.contains("tokens"), "{e}");
    // Another finish reason.
    let mut b = a.clone();
    b.finish_reason = FinishReason::Stop;
    let e = compare(&a, &b, true).unwrap_err();
    assert!(e.contains("finish"), "{e}");
    // One logit one ulp off, and 0.0 vs -0.0: equal as numbers, other bits.
    let mut b = a.clone();
    b.logits[0][2] = f32::from_bits(2.0f32.to_bits() + 1);
    let e = compare(&a, &b, true).unwrap_err();
    assert!(e.contains("position 0") && e.contains("logit 2"), "{e}");
    let mut b = a.clone();
    b.logits[1][2] = 0.0;
    let e = compare(&a, &b, true).unwrap_err();
    assert!(e.contains("position 1"), "{e}");
    // Logits missing for a position, or not kept at all.
    let e = compare(&a, &output(&[1, 2], l[..1].to_vec()), true).unwrap_err();
    assert!(e.contains("logits kept"), "{e}");
    let e = compare(&output(&[1, 2], vec![]), &output(&[1, 2], vec![]), true).unwrap_err();
    assert!(e.contains("no logits"), "{e}");
    // The select path compares tokens only.
    let mut b = a.clone();
    b.logits[0][0] = 9.0;
    assert_eq!(compare(&a, &b, false), Ok(2));
}

fn tiny_backend(blocks: usize) -> CpuBackend {
    let w = random_weights(&tiny_config(Arch::Llama, 97), 5, DType::Q8_0).expect("weights");
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: blocks,
        block_size: 16,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

/// Proposes the n-gram drafts, but flips the first draft of every step to token 3: the drafts
/// stay wrong-but-harmless, so the gate must still pass (the output cannot depend on them).
struct Wrong(NgramDrafter);

impl Drafter for Wrong {
    fn name(&self) -> String {
        "wrong".into()
    }
    fn draft(
        &mut self,
        reqs: &[memra_engine::spec::DraftReq],
    ) -> memra_engine::Result<Vec<Vec<u32>>> {
        let mut d = self.0.draft(reqs)?;
        for v in &mut d {
            if let Some(x) = v.first_mut() {
                *x = 3;
            }
        }
        Ok(d)
    }
}

#[test]
fn spec_gate_library_passes_on_tiny_and_counts() {
    let mut b = tiny_backend(16);
    let mut drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(NgramDrafter::default()),
        Box::new(Wrong(NgramDrafter::default())),
    ];
    let opts = Options {
        max_tokens: 24,
        k_max: 8,
        ..Default::default()
    };
    let prompts = spec::synthetic_prompts(97);
    let rows = spec::run(&mut b, &mut drafters, &prompts, &opts).expect("spec gate");
    // 2 drafters x 2 samplings x K = 1..8.
    assert_eq!(rows.len(), 32);
    assert_eq!(spec::failures(&rows), 0, "{}", spec::report(&rows));
    for r in &rows {
        // 3 prompts x 24 tokens x 2 paths.
        assert_eq!(r.tokens, 3 * 24 * 2, "{r:?}");
        assert!(r.counts.accepted <= r.counts.drafted);
    }
    let ngram_accepted: u64 = rows
        .iter()
        .filter(|r| r.drafter == "ngram")
        .map(|r| r.counts.accepted)
        .sum();
    assert!(
        ngram_accepted > 0,
        "no draft accepted: the gate proves little"
    );
    let report = spec::report(&rows);
    assert!(report.contains("mean acc len"), "{report}");
    assert!(report.contains("0 failed"), "{report}");
}

#[test]
fn spec_gate_refuses_bad_options() {
    let mut b = tiny_backend(16);
    let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(NgramDrafter::default())];
    let prompts = spec::synthetic_prompts(97);
    for (opts, what) in [
        (
            Options {
                k_max: 0,
                ..Default::default()
            },
            "k-max",
        ),
        (
            Options {
                k_max: 99,
                ..Default::default()
            },
            "k-max",
        ),
        (
            Options {
                max_tokens: 0,
                ..Default::default()
            },
            "max-tokens",
        ),
        (
            Options {
                logits_path: false,
                select_path: false,
                ..Default::default()
            },
            "no path",
        ),
    ] {
        let e = spec::run(&mut b, &mut drafters, &prompts, &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{what}: {e}");
    }
    let bad = vec![spec::Prompt {
        name: "big".into(),
        ids: vec![1, 500],
    }];
    let e = spec::run(&mut b, &mut drafters, &bad, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("token 500"), "{e}");
}

#[test]
fn spec_cli_passes_on_tiny() {
    let out = bin()
        .args([
            "spec",
            "--tiny",
            "llama",
            "--device",
            "cpu",
            "--threads",
            "2",
        ])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // ngram, self and random drafters x greedy/sampled x K = 1..8.
    assert_eq!(stdout.matches("identical").count(), 48, "{stdout}");
    assert!(stdout.contains("draft:self"), "{stdout}");
    assert!(stdout.contains("draft:random-tiny"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ALL GREEN"), "{stdout}");
}

/// A recurrent-state model (qwen3next): the target's state slots roll back on rejection, the
/// draft model (`self`) rewinds its drafts one step each.
#[test]
fn spec_cli_passes_on_a_tiny_recurrent_model() {
    let out = bin()
        .args([
            "spec",
            "--tiny",
            "qwen3next",
            "--device",
            "cpu",
            "--threads",
            "2",
            "--k-max",
            "4",
            "--max-tokens",
            "16",
            "--drafters",
            "ngram,self",
        ])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // ngram and self x greedy/sampled x K = 1..4.
    assert_eq!(stdout.matches("identical").count(), 16, "{stdout}");
    assert!(stdout.trim_end().ends_with("ALL GREEN"), "{stdout}");
}

/// `spec --tiny ARCH+mtp[-oracle] --drafters mtp` on the CPU: the command the GPU runbook runs
/// (there with `--device cuda:0`, which adds the hand-over check against the CPU).
fn spec_mtp_cli(tiny: &str) -> String {
    let out = bin()
        .args(["spec", "--tiny", tiny, "--drafters", "mtp", "--k-max", "4"])
        .args(["--max-tokens", "16", "--device", "cpu", "--threads", "2"])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // mtp x greedy/sampled x K = 1..4, no hand-over check on the CPU (it is the reference).
    assert_eq!(stdout.matches("identical").count(), 8, "{stdout}");
    assert!(!stdout.contains("mtp hand-over"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ALL GREEN"), "{stdout}");
    stdout
}

/// (drafted, accepted) of the greedy rows of a spec table.
fn greedy_counts(table: &str) -> (u64, u64) {
    table
        .lines()
        .filter(|l| l.starts_with("mtp ") && l.contains(" greedy "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[4].parse::<u64>().unwrap(), f[5].parse::<u64>().unwrap())
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

#[test]
fn spec_cli_passes_with_the_mtp_drafter() {
    let random = spec_mtp_cli("llama+mtp");
    let (d, _) = greedy_counts(&random);
    assert!(d > 0, "{random}");
    // The wired layer drafts the model's own picks: the gate requires 90% of greedy drafts.
    let oracle = spec_mtp_cli("llama+mtp-oracle");
    let (d, a) = greedy_counts(&oracle);
    assert!(d > 0 && a * 10 >= d * 9, "{oracle}");
}

/// qwen3next's own MTP module (qwen3next_mtp.rs: a full-attention layer with the MoE FFN) as
/// the drafter of a recurrent-state target.
#[test]
fn spec_cli_passes_with_the_qwen3next_mtp_drafter() {
    let random = spec_mtp_cli("qwen3next+mtp");
    assert!(greedy_counts(&random).0 > 0, "{random}");
    let oracle = spec_mtp_cli("qwen3next+mtp-oracle");
    let (d, a) = greedy_counts(&oracle);
    assert!(d > 0 && a * 10 >= d * 9, "{oracle}");
}

/// memra-server's default drafter (`auto`: here the MTP layer and n-gram lookup, picked per
/// step) and `pick` (the target as a draft model and n-gram lookup): the drafter changes
/// between steps of one sequence, and the output never does.
#[test]
fn spec_cli_passes_with_drafters_picked_per_step() {
    let out = bin()
        .args([
            "spec",
            "--tiny",
            "llama+mtp-oracle",
            "--drafters",
            "auto,pick",
        ])
        .args(["--k-max", "3", "--max-tokens", "12", "--device", "cpu"])
        .args(["--threads", "2", "--paths", "logits"])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // 2 drafters x greedy/sampled x K = 1..3.
    assert_eq!(stdout.matches("identical").count(), 12, "{stdout}");
    assert!(stdout.contains("mtp+ngram "), "{stdout}");
    assert!(stdout.contains("draft:self+ngram "), "{stdout}");
    assert!(stdout.trim_end().ends_with("ALL GREEN"), "{stdout}");
}

#[test]
fn rows_without_drafts_or_with_a_failing_oracle_fail() {
    let row = |sampling: &str, drafted, accepted| spec::Row {
        drafter: "mtp".into(),
        sampling: sampling.into(),
        k: 2,
        counts: memra_engine::spec::SpecCounts {
            drafted,
            accepted,
            steps: 1,
        },
        ..Default::default()
    };
    let mut rows = vec![
        row("greedy", 20, 19),
        row("greedy", 20, 10),
        row("t0.8/k40/s1234", 20, 1),
    ];
    spec::require_oracle_acceptance(&mut rows, "mtp", false);
    let ok: Vec<bool> = rows.iter().map(spec::Row::ok).collect();
    assert_eq!(ok, [true, false, true]);
    assert!(rows[1].failures[0].contains("10 of 20"), "{:?}", rows[1]);
    // With `sampled`, the seeded-sampling rows are held to it too.
    for r in &mut rows {
        r.failures.clear();
    }
    spec::require_oracle_acceptance(&mut rows, "mtp", true);
    let ok: Vec<bool> = rows.iter().map(spec::Row::ok).collect();
    assert_eq!(ok, [true, false, false]);
    assert!(
        rows[2].failures[0].contains("1 of 20 t0.8"),
        "{:?}",
        rows[2]
    );
    // The gate itself fails a row that drafted nothing: a drafter that never drafts.
    struct Never;
    impl Drafter for Never {
        fn name(&self) -> String {
            "never".into()
        }
        fn draft(
            &mut self,
            reqs: &[memra_engine::spec::DraftReq],
        ) -> memra_engine::Result<Vec<Vec<u32>>> {
            Ok(vec![Vec::new(); reqs.len()])
        }
    }
    let mut b = tiny_backend(16);
    let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Never)];
    let opts = Options {
        max_tokens: 8,
        k_max: 1,
        ..Default::default()
    };
    let rows = spec::run(&mut b, &mut drafters, &spec::synthetic_prompts(97), &opts).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r.failures.iter().any(|f| f.contains("nothing was drafted"))),
        "{}",
        spec::report(&rows)
    );
}

#[test]
fn spec_cli_names_bad_input() {
    for (args, want) in [
        (vec!["spec", "--tiny", "llama", "--drafters", "mtp"], "mtp"),
        (vec!["spec", "--tiny", "llama", "--paths", "x"], "path `x`"),
        (vec!["spec", "--tiny", "llama", "--k-max", "0"], "k-max"),
        (vec!["spec", "--tiny", "nope"], "nope"),
        (vec!["spec"], "MODEL or --tiny"),
        (vec!["spec", "/nonexistent/model.gguf"], "nonexistent"),
        (vec!["all", "/nonexistent/model.gguf"], "does not exist"),
    ] {
        let out = bin()
            .args(&args)
            .args(["--device", "cpu"])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn all_passes_on_cpu_with_smollm2() {
    let model = memra_engine::testing::real_model();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/smollm2-135m-reference.json"
    );
    let out = bin()
        .arg("all")
        .arg(&model)
        .args(["--device", "cpu", "--fixture", fixture])
        .args([
            "--golden-dir",
            concat!(env!("CARGO_MANIFEST_DIR"), "/golden"),
        ])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for gate in ["invariance", "spec", "tokens", "golden", "serve-invariance"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(gate) && l.ends_with("ALL GREEN")),
            "{gate} not green in the summary:\n{stdout}"
        );
    }
    // CUDA-only gates do not run on the CPU.
    assert!(!stdout.contains("== kernels"), "{stdout}");
    assert!(stdout.contains("draft:self"), "{stdout}");
    // The golden gate compared the committed CPU values (not skipped).
    assert!(
        stdout.contains("(class cpu-kvf16)") && stdout.contains("0 differ"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("ALL GREEN"), "{stdout}");
}

#[test]
fn batch_dependent_backend_fails_the_spec_gate() {
    // Logits that depend on the rows in the step: a verify step of K + 1 rows gives other logits
    // than plain decoding's one-row steps, so the logits path must fail for every K.
    let mut b = crate::invariance_cpu::Leaky(crate::invariance_cpu::cpu(Arch::Llama));
    let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(NgramDrafter::default())];
    let opts = Options {
        max_tokens: 12,
        k_max: 3,
        select_path: false,
        ..Default::default()
    };
    let rows =
        spec::run(&mut b, &mut drafters, &spec::synthetic_prompts(97), &opts).expect("spec gate");
    let report = spec::report(&rows);
    assert!(spec::failures(&rows) > 0, "{report}");
    assert!(
        rows.iter()
            .filter(|r| r.counts.drafted > 0)
            .all(|r| !r.ok()),
        "{report}"
    );
    assert!(report.contains("logits path"), "{report}");
}
