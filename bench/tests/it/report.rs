//! `memra-bench report` and the speed rows: the committed report is exactly what the committed
//! rows give; ratios never join two runs; decode/ttft rows on the real model are valid.

use std::path::{Path, PathBuf};

use memra_bench::record::{DeviceRef, Row, Workload};
use memra_bench::report::{render, side_by_side_runs};
use memra_bench::speed::{Kind, SpeedArgs};
use memra_engine::backend::Device;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn committed_report_is_regenerated_byte_identical() {
    let root = repo();
    let rows = memra_bench::record::read_dir(&root.join("reports/data")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let files = render(&rows, Some(&readme)).unwrap();
    assert!(files.len() >= 3, "README, reports/README.md and a figure");
    for (rel, text) in &files {
        let path = root.join("reports").join(rel);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            old == *text,
            "{} is not what `memra-bench report` makes of reports/data: run it and commit",
            path.display()
        );
    }
    // No figure on disk that the rows no longer make.
    for e in std::fs::read_dir(root.join("reports/figures")).unwrap() {
        let name = e.unwrap().file_name();
        let rel = Path::new("figures").join(&name);
        assert!(
            files.iter().any(|f| f.0 == rel),
            "reports/figures/{name:?} is stale"
        );
    }
    // Deterministic: a second rendering is the same bytes.
    assert_eq!(files, render(&rows, Some(&readme)).unwrap());
}

fn row(run: &str, engine: &str, w: Workload, value: f64) -> Row {
    Row {
        run: run.into(),
        time: "2026-12-01T00:00:00Z".into(),
        device: DeviceRef {
            name: "GPU".into(),
            driver: None,
            sms: None,
        },
        engine: engine.into(),
        version: None,
        commit: None,
        model: None,
        shape: Some("m".into()),
        dtype: Some("Q4_K_M".into()),
        workload: w,
        batch: Some(1),
        prompt: Some(512),
        generated: Some(128),
        depth: Some(0),
        value: Some(value),
        unit: "tok/s".into(),
        min: None,
        max: None,
        stddev: None,
        weight_gb_s: None,
        weight_bytes_per_token: None,
        kv_dtype: None,
        kv_gb_s: None,
        constraint: None,
        schema: None,
        runs: 1,
        valid: true,
        source: None,
    }
}

#[test]
fn ratios_only_join_rows_of_one_run() {
    let rows = [
        row("a", "memra", Workload::Decode, 100.0),
        row("b", "llama.cpp", Workload::Decode, 200.0),
    ];
    let refs: Vec<&Row> = rows.iter().collect();
    assert!(side_by_side_runs(&refs).is_empty());
    let readme = format!(
        "x\n{}\n{}\n",
        memra_bench::report::BEGIN,
        memra_bench::report::END
    );
    let files = render(&rows, Some(&readme)).unwrap();
    let text = &files
        .iter()
        .find(|f| f.0 == Path::new("../README.md"))
        .unwrap()
        .1;
    assert!(text.contains("No run with memra and a peer"), "{text}");
    assert!(!text.contains("0.50x"), "{text}");

    let rows = [
        row("c", "memra", Workload::Decode, 100.0),
        row("c", "llama.cpp", Workload::Decode, 200.0),
        row("d", "llama.cpp", Workload::Decode, 50.0),
    ];
    let files = render(&rows, Some(&readme)).unwrap();
    let text = &files
        .iter()
        .find(|f| f.0 == Path::new("../README.md"))
        .unwrap()
        .1;
    assert!(
        text.contains("| m Q4_K_M | 100.0 | 200.0 | 0.50x |"),
        "{text}"
    );
    // An invalid row is never shown.
    let mut bad = row("e", "memra", Workload::Decode, 999.0);
    bad.valid = false;
    let files = render(&[bad], None).unwrap();
    assert!(files.iter().all(|f| !f.1.contains("999")));
}

#[test]
fn speed_rows_on_the_real_model_are_valid() {
    let model = memra_engine::testing::real_model();
    let args = |kind| SpeedArgs {
        kind,
        device: Device::Cpu,
        prompts: vec![24],
        depths: Vec::new(),
        prefill_prompts: Vec::new(),
        turn: 0,
        gen_tokens: 4,
        runs: 2,
        run: "test".into(),
        progress: false,
        shape: Some("smollm2-135m".into()),
        dtype: Some("Q4_1".into()),
        kv_dtype: Default::default(),
        schema: None,
    };
    let rows = memra_bench::speed::run(
        &model,
        &SpeedArgs {
            depths: vec![40],
            prefill_prompts: vec![32],
            ..args(Kind::Decode)
        },
    )
    .unwrap();
    assert_eq!(rows.len(), 3);
    // The depth row: a 40-token context, then the decode.
    assert_eq!((rows[1].prompt, rows[1].depth), (Some(40), Some(40)));
    assert_eq!((rows[1].workload, rows[1].valid), (Workload::Decode, true));
    // The prefill row of the same engine: one generated token, its own prompt.
    let p = &rows[2];
    assert_eq!(
        (p.workload, p.valid, p.unit.as_str()),
        (Workload::Prefill, true, "tok/s")
    );
    assert_eq!(
        (p.prompt, p.depth, p.generated),
        (Some(32), Some(0), Some(1))
    );
    assert!(p.value.unwrap() > 0.0);
    let e = memra_bench::speed::run(
        &model,
        &SpeedArgs {
            prefill_prompts: vec![32],
            ..args(Kind::Prefill)
        },
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("--prefill applies to decode only"),
        "{e}"
    );
    assert!(
        memra_bench::speed::run(
            &model,
            &SpeedArgs {
                depths: vec![40],
                ..args(Kind::Prefill)
            }
        )
        .is_err()
    );
    let r = &rows[0];
    assert_eq!(r.depth, Some(0));
    assert_eq!((r.workload, r.valid, r.runs), (Workload::Decode, true, 2));
    assert!(r.value.unwrap() > 0.0 && r.min <= r.value && r.value <= r.max);
    // The weights a token reads: SmolLM2's tied table as the head, one row as the embedding,
    // the rest whole; less than the file (which holds the tokenizer too).
    let read = r.weight_bytes_per_token.unwrap();
    assert!(read > 0 && read < r.model.as_ref().unwrap().bytes.unwrap());
    assert_eq!(r.weight_gb_s, Some(read as f64 * r.value.unwrap() / 1e9));
    assert_eq!(r.kv_dtype.as_deref(), Some("f16"));
    assert!(r.kv_gb_s.unwrap() > 0.0, "decode reads the KV cache");
    assert_eq!(r.model.as_ref().unwrap().sha256.as_ref().unwrap().len(), 12);

    let rows = memra_bench::speed::run(&model, &args(Kind::Ttft)).unwrap();
    let w: Vec<_> = rows
        .iter()
        .map(|r| (r.workload, r.valid, r.unit.as_str()))
        .collect();
    assert_eq!(
        w,
        [
            (Workload::TtftCold, true, "ms"),
            (Workload::TtftCached, true, "ms")
        ]
    );
    // A new turn after the cached prompt: the row names the whole prompt and the cached depth,
    // and the cached run's tokens match the turn's cold run.
    let turn = SpeedArgs {
        turn: 9,
        ..args(Kind::Ttft)
    };
    let rows = memra_bench::speed::run(&model, &turn).unwrap();
    let c = &rows[1];
    assert_eq!((c.workload, c.valid), (Workload::TtftCached, true));
    assert_eq!((c.prompt, c.depth), (Some(33), Some(24)));
    assert!(c.value.unwrap() > 0.0);
    let e = memra_bench::speed::run(
        &model,
        &SpeedArgs {
            turn: 9,
            ..args(Kind::Prefill)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("--turn applies to ttft only"), "{e}");
    let mut bad = args(Kind::Prefill);
    bad.runs = 0;
    assert!(memra_bench::speed::run(&model, &bad).is_err());
}

#[test]
fn depth_rows_are_matched_by_context_and_kv_format_and_stay_out_of_the_headline() {
    let at = |engine: &str, prompt: u64, depth: u64, kv: &str, value: f64| Row {
        prompt: Some(prompt),
        depth: Some(depth),
        kv_dtype: Some(kv.into()),
        ..row("deep", engine, Workload::Decode, value)
    };
    let later = |engine: &str, value: f64| Row {
        time: "2026-12-02T00:00:00Z".into(),
        ..row("plain", engine, Workload::Decode, value)
    };
    let rows = [
        later("memra", 100.0),
        later("llama.cpp", 200.0),
        // memra's depth-0 row of a 512-token prompt is llama-bench's -d 512.
        at("memra", 512, 0, "f16", 300.0),
        at("llama.cpp", 0, 512, "f16", 250.0),
        at("memra", 8000, 8000, "f16", 150.0),
        at("llama.cpp", 0, 8000, "f16", 200.0),
        at("memra", 8000, 8000, "q8_0", 120.0),
        at("llama.cpp", 0, 8000, "q8_0", 240.0),
    ];
    let text = rendered(&rows);
    // The headline takes the model's newest comparison; the depth rows stay out of it.
    let top = text("../README.md");
    assert!(
        top.contains("Run `plain`") && !top.contains("Run `deep`"),
        "{top}"
    );
    // The side-by-side above the newest-numbers table holds no depth row.
    let side = top.split("The newest memra numbers").next().unwrap();
    assert!(
        side.contains("| m Q4_K_M | 100.0 | 200.0 | 0.50x |"),
        "{top}"
    );
    assert!(!side.contains("150.0") && !side.contains("8000"), "{top}");
    let all = text("README.md");
    assert!(
        all.contains("| m Q4_K_M | f16 | 512 | 300.0 | 250.0 | 1.20x |"),
        "{all}"
    );
    assert!(
        all.contains("| m Q4_K_M | f16 | 8000 | 150.0 | 200.0 | 0.75x |"),
        "{all}"
    );
    assert!(
        all.contains("| m Q4_K_M | q8_0 | 8000 | 120.0 | 240.0 | 0.50x |"),
        "{all}"
    );
}

/// A decode row of `shape` in `run`: `weight_bytes_per_token` where given, the file's bytes,
/// and the KV bytes per token as the engine records them (`kv_gb_s` = bytes x tok/s).
fn decode(run: &str, engine: &str, shape: &str, value: f64, wbpt: Option<u64>, kv: f64) -> Row {
    Row {
        shape: Some(shape.into()),
        model: Some(memra_bench::record::ModelRef {
            file: format!("{shape}.gguf"),
            sha256: None,
            bytes: Some(if shape.contains("a3b") { 18e9 } else { 5e9 } as u64),
        }),
        weight_bytes_per_token: wbpt,
        kv_gb_s: (engine == "memra").then_some(kv * value / 1e9),
        ..row(run, engine, Workload::Decode, value)
    }
}

#[test]
fn decode_rows_report_their_share_of_the_roofline() {
    let copy = |gb_s: f64| Row {
        shape: None,
        unit: "GB/s".into(),
        ..row("roof", "memra", Workload::CopyBandwidth, gb_s)
    };
    let bare = |engine: &str, value: f64| Row {
        time: "2026-12-02T00:00:00Z".into(),
        dtype: Some("Q8_0".into()),
        ..decode("bare", engine, "llama3-8b", value, Some(4_500_000_000), 5e8)
    };
    let rows = [
        // The run's copy bandwidth: the median of its rows, 3,000 GB/s.
        copy(3100.0),
        copy(2900.0),
        copy(3000.0),
        // Dense: 4.5 GB of weights + 0.5 GB of KV a token; 5 GB x 300 tok/s = 1,500 GB/s
        // = 50%; the peer reads the same 5 GB: x 240 tok/s = 40%.
        decode(
            "roof",
            "memra",
            "llama3-8b",
            300.0,
            Some(4_500_000_000),
            5e8,
        ),
        decode("roof", "llama.cpp", "llama3-8b", 240.0, None, 0.0),
        // MoE: 1.8 GB of its 18 GB file a token (the routed experts) + 0.2 GB of KV; 2 GB x
        // 500 tok/s = 33%, the peer's 2 GB x 450 tok/s = 30%.
        decode(
            "roof",
            "memra",
            "qwen3-30b-a3b",
            500.0,
            Some(1_800_000_000),
            2e8,
        ),
        decode("roof", "llama.cpp", "qwen3-30b-a3b", 450.0, None, 0.0),
        // Recorded before the field: a dense shape falls back to its file (5 GB + 0.1 GB of KV
        // x 100 tok/s = 17%, the peer's x 90 tok/s = 15%), an MoE one has no figure.
        decode("roof", "memra", "smollm2-135m", 100.0, None, 1e8),
        decode("roof", "llama.cpp", "smollm2-135m", 90.0, None, 0.0),
        decode("roof", "memra", "qwen3-next-80b-a3b", 250.0, None, 1e8),
        decode("roof", "llama.cpp", "qwen3-next-80b-a3b", 200.0, None, 0.0),
        // At depth 8000: 4.5 GB + 1.5 GB of KV a token; 6 GB x 200 tok/s = 40%, x 150 = 30%.
        Row {
            prompt: Some(8000),
            depth: Some(8000),
            ..decode(
                "roof",
                "memra",
                "llama3-8b",
                200.0,
                Some(4_500_000_000),
                1.5e9,
            )
        },
        Row {
            prompt: Some(0),
            depth: Some(8000),
            ..decode("roof", "llama.cpp", "llama3-8b", 150.0, None, 0.0)
        },
        // A run without a copy bandwidth row: no figure.
        bare("memra", 310.0),
        bare("llama.cpp", 250.0),
    ];
    let text = rendered(&rows);
    insta::assert_snapshot!(text("../README.md"), @r"
    x
    <!-- memra-bench report: begin (generated from reports/data; do not edit) -->
    Run `bare` on GPU (2026-12-02T00:00:00Z): memra (commit not recorded) and llama.cpp (version not recorded), same model files, batch 1.

    | model | memra decode tok/s | peer decode tok/s | ratio | decode % of roofline (memra / peer) | memra prefill tok/s | peer prefill tok/s | ratio |
    |---|---|---|---|---|---|---|---|
    | llama3-8b Q8_0 | 310.0 | 250.0 | 1.24x | — | — | — | — |

    Run `roof` on GPU (2026-12-01T00:00:00Z): memra (commit not recorded) and llama.cpp (version not recorded), same model files, batch 1.

    | model | memra decode tok/s | peer decode tok/s | ratio | decode % of roofline (memra / peer) | memra prefill tok/s | peer prefill tok/s | ratio |
    |---|---|---|---|---|---|---|---|
    | llama3-8b Q4_K_M | 300.0 | 240.0 | 1.25x | 50% / 40% | — | — | — |
    | qwen3-30b-a3b Q4_K_M | 500.0 | 450.0 | 1.11x | 33% / 30% | — | — | — |
    | smollm2-135m Q4_K_M | 100.0 | 90.0 | 1.11x | 17% / 15% | — | — | — |
    | qwen3-next-80b-a3b Q4_K_M | 250.0 | 200.0 | 1.25x | — | — | — | — |

    % of roofline (decode): the bytes a token reads (its weights, of an MoE model only the routed experts, and the KV cache at the mean context) x tok/s over the copy bandwidth measured in the same run; the peer's with memra's bytes of the same model; — where the run measured no copy bandwidth or the row does not say its bytes.

    The newest memra numbers (each from its own run; a ratio only ever joins rows of one run):

    | device | model | workload | batch | prompt | KV | memra | % of roofline | run |
    |---|---|---|---|---|---|---|---|---|
    | GPU | llama3-8b Q4_K_M | decode | 1 | 512 | — | 300.0 tok/s | 50% | `roof` |
    | GPU | llama3-8b Q4_K_M | decode | 1 | 8000 | — | 200.0 tok/s | 40% | `roof` |
    | GPU | llama3-8b Q8_0 | decode | 1 | 512 | — | 310.0 tok/s | — | `bare` |
    | GPU | qwen3-30b-a3b Q4_K_M | decode | 1 | 512 | — | 500.0 tok/s | 33% | `roof` |
    | GPU | qwen3-next-80b-a3b Q4_K_M | decode | 1 | 512 | — | 250.0 tok/s | — | `roof` |
    | GPU | smollm2-135m Q4_K_M | decode | 1 | 512 | — | 100.0 tok/s | 17% | `roof` |

    Generated by `memra-bench report` from reports/data (figures and every run: reports/README.md).
    <!-- memra-bench report: end -->
    ");
    // reports/README.md: the same cells.
    let all = text("README.md");
    assert!(
        all.contains("| llama3-8b Q4_K_M | 300.0 | 240.0 | 1.25x | 50% / 40% |"),
        "{all}"
    );
    assert!(
        all.contains("| llama3-8b Q8_0 | 310.0 | 250.0 | 1.24x | — |"),
        "{all}"
    );
    assert!(
        all.contains("| llama3-8b Q4_K_M | — | 8000 | 200.0 | 150.0 | 1.33x | 40% / 30% |"),
        "{all}"
    );
}

/// The report of `rows` rendered into a README holding only the markers: a generated file's
/// text by its path.
fn rendered(rows: &[Row]) -> impl Fn(&str) -> String {
    let readme = format!(
        "x\n{}\n{}\n",
        memra_bench::report::BEGIN,
        memra_bench::report::END
    );
    let files = render(rows, Some(&readme)).unwrap();
    move |name| {
        files
            .iter()
            .find(|f| f.0 == Path::new(name))
            .unwrap()
            .1
            .clone()
    }
}
