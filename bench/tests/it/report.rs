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
    assert!(r.weight_gb_s.unwrap() > 0.0);
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
    let readme = format!(
        "x\n{}\n{}\n",
        memra_bench::report::BEGIN,
        memra_bench::report::END
    );
    let files = render(&rows, Some(&readme)).unwrap();
    let text = |name: &str| {
        files
            .iter()
            .find(|f| f.0 == Path::new(name))
            .unwrap()
            .1
            .clone()
    };
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
