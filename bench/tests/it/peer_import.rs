//! `memra-bench peer import`: llama-bench JSON lines saved by hand become the rows `peer
//! llama.cpp` records; a bad line or a test already in the file writes nothing; `--replace`.

use std::path::{Path, PathBuf};

use memra_bench::peer::{PeerRun, rows_from_jsonl};
use memra_bench::peer_import::{DEFAULT_SOURCE, DEFAULT_VERSION, ImportArgs, import};
use memra_bench::record::{DeviceRef, Row, model_ref, to_lines};

/// One line as llama-bench (llama-cpp-python 0.3.36's llama.cpp, built outside git) prints it
/// with `-o jsonl`: every field, in its order.
#[allow(clippy::too_many_arguments)]
fn bench_line(
    model: &str,
    kv: &str,
    (n_prompt, n_gen, n_depth): (u64, u64, u64),
    time: &str,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: &[f64],
    ngl: u32,
) -> String {
    let tokens = (n_prompt + n_gen) as f64;
    let ns: Vec<String> = samples_ts
        .iter()
        .map(|t| format!("{}", (tokens / t * 1e9) as u64))
        .collect();
    let ts: Vec<String> = samples_ts.iter().map(|t| format!("{t}")).collect();
    format!(
        concat!(
            r#"{{"build_commit": "unknown", "build_number": 0, "cpu_info": "INTEL(R) XEON(R) PLATINUM 8568Y+", "#,
            r#""gpu_info": "NVIDIA H200", "backends": "CUDA", "model_filename": "{model}", "#,
            r#""model_type": "llama 8B Q4_K - Medium", "model_size": 4450189312, "model_n_params": 8030261248, "#,
            r#""n_batch": 2048, "n_ubatch": 512, "n_threads": 64, "cpu_mask": "0x0", "cpu_strict": false, "#,
            r#""poll": 50, "type_k": "{kv}", "type_v": "{kv}", "n_gpu_layers": {ngl}, "split_mode": "layer", "#,
            r#""main_gpu": 0, "no_kv_offload": false, "flash_attn": true, "tensor_split": "0.00", "#,
            r#""tensor_buft_overrides": "none", "use_mmap": true, "embeddings": false, "no_op_offload": 0, "#,
            r#""n_prompt": {n_prompt}, "n_gen": {n_gen}, "n_depth": {n_depth}, "test_time": "{time}", "#,
            r#""avg_ns": {avg_ns}, "stddev_ns": 0, "avg_ts": {avg_ts}, "stddev_ts": {stddev_ts}, "#,
            r#""samples_ns": [ {ns} ], "samples_ts": [ {ts} ]}}"#
        ),
        model = model,
        kv = kv,
        ngl = ngl,
        n_prompt = n_prompt,
        n_gen = n_gen,
        n_depth = n_depth,
        time = time,
        avg_ns = (tokens / avg_ts * 1e9) as u64,
        avg_ts = avg_ts,
        stddev_ts = stddev_ts,
        ns = ns.join(", "),
        ts = ts.join(", "),
    )
}

/// One test's measurement: (n_prompt, n_gen, n_depth), test_time, avg_ts, stddev_ts,
/// samples_ts.
type Test<'a> = ((u64, u64, u64), &'a str, f64, f64, &'a [f64]);

/// The lines of `-ngl 99 -ctk q8_0 -ctv q8_0` runs of `model`, one a test.
fn q8_lines(model: &str, tests: &[Test<'_>]) -> String {
    tests
        .iter()
        .map(|&(npd, time, avg, sd, samples)| {
            bench_line(model, "q8_0", npd, time, avg, sd, samples, 99)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `llama-bench -m /root/m.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192 -r 3 -ctk q8_0 -ctv q8_0
/// -o jsonl`: pp512 and tg128 at depth 0, then at depth 8192.
#[rustfmt::skip]
const SAMPLE: [Test<'static>; 4] = [
    ((512, 0, 0), "2026-12-03T10:00:01Z", 9278.5, 1305.6, &[7770.89, 10041.3, 10023.4]),
    ((0, 128, 0), "2026-12-03T10:00:02Z", 280.5, 1.5, &[279.0, 280.5, 282.0]),
    ((512, 0, 8192), "2026-12-03T10:00:05Z", 7000.25, 10.0, &[6990.0, 7000.0, 7010.75]),
    ((0, 128, 8192), "2026-12-03T10:00:09Z", 203.9, 1.6, &[202.0, 204.0, 205.7]),
];

/// [`SAMPLE`]'s lines.
fn sample() -> String {
    q8_lines("/root/m.gguf", &SAMPLE) + "\n"
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The flags the lead passes when memra's rows of the run are not in --out.
fn explicit(files: Vec<PathBuf>, out: &Path, model: &Path) -> ImportArgs {
    ImportArgs {
        model: Some(model.into()),
        shape: Some("llama3-8b".into()),
        dtype: Some("Q4_K_M".into()),
        kv_dtype: Some("q8_0".into()),
        driver: Some("580.159.04".into()),
        sms: Some(132),
        commit: Some("c88788e".into()),
        ..ImportArgs::new(files, "h200-x", out)
    }
}

fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn llama_bench_jsonl_becomes_the_rows_peer_llama_cpp_records() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "m.gguf", &"GGUF".repeat(1000));
    let input = write(dir.path(), "q8.jsonl", &sample());
    let out = dir.path().join("data/h200.jsonl");
    let r = import(&explicit(vec![input], &out, &model)).unwrap();

    let m = model_ref(&model).unwrap();
    assert_eq!((m.file.as_str(), m.bytes), ("m.gguf", Some(4000)));
    let sha = m.sha256.clone().unwrap();
    let base = format!(
        r#""run": "h200-x", "device": {{"name": "NVIDIA H200", "driver": "580.159.04", "sms": 132}}, "engine": "llama.cpp", "version": "llama-cpp-python 0.3.36 (vendored llama.cpp)", "commit": "c88788e", "model": {{"file": "m.gguf", "sha256": "{sha}", "bytes": 4000}}, "shape": "llama3-8b", "dtype": "Q4_K_M", "batch": 1, "unit": "tok/s", "kv_dtype": "q8_0", "runs": 3, "valid": true, "source": "llama-bench -ngl 99 -fa 1 JSON, same lease as memra""#
    );
    let expected = rows(&format!(
        concat!(
            r#"{{{b}, "time": "2026-12-03T10:00:01Z", "workload": "prefill", "prompt": 512, "gen": 0, "depth": 0, "value": 9278.5, "min": 7770.89, "max": 10041.3, "stddev": 1305.6}}"#,
            "\n",
            r#"{{{b}, "time": "2026-12-03T10:00:02Z", "workload": "decode", "prompt": 0, "gen": 128, "depth": 0, "value": 280.5, "min": 279.0, "max": 282.0, "stddev": 1.5, "weight_gb_s": {w0}}}"#,
            "\n",
            r#"{{{b}, "time": "2026-12-03T10:00:05Z", "workload": "prefill", "prompt": 512, "gen": 0, "depth": 8192, "value": 7000.25, "min": 6990.0, "max": 7010.75, "stddev": 10.0}}"#,
            "\n",
            r#"{{{b}, "time": "2026-12-03T10:00:09Z", "workload": "decode", "prompt": 0, "gen": 128, "depth": 8192, "value": 203.9, "min": 202.0, "max": 205.7, "stddev": 1.6, "weight_gb_s": {w1}}}"#,
        ),
        b = base,
        w0 = 4000.0 * 280.5 / 1e9,
        w1 = 4000.0 * 203.9 / 1e9,
    ));
    assert_eq!(r.rows, expected);
    assert_eq!(r.replaced, 0);
    // Exactly those lines in the new file (its folder made).
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        to_lines(&expected).unwrap()
    );
    // The same rows `peer llama.cpp` makes of that output (peer::rows_from_jsonl).
    let p = PeerRun {
        run: "h200-x".into(),
        time: "unused".into(),
        device: DeviceRef {
            name: "cuda:0".into(),
            driver: Some("580.159.04".into()),
            sms: Some(132),
        },
        commit: Some("c88788e".into()),
        model: m,
        shape: Some("llama3-8b".into()),
        dtype: Some("Q4_K_M".into()),
        kv_dtype: None,
        version: DEFAULT_VERSION.into(),
        source: DEFAULT_SOURCE.into(),
    };
    assert_eq!(rows_from_jsonl(&sample(), &p).unwrap(), expected);
}

/// reports/data/h200.jsonl: memra's decode row of run h200-20261202-s6-b (line 198) and the
/// llama.cpp rows the hand conversion made of the same lease's llama-bench (lines 215, 216).
const OUR_ROW: &str = r#"{"run": "h200-20261202-s6-b", "time": "2026-12-02T08:01:17Z", "device": {"name": "NVIDIA H200", "driver": "580.159.04", "sms": 132}, "engine": "memra", "version": null, "commit": "c88788e", "model": {"file": "q4.gguf", "sha256": "a65e030642f0", "bytes": 4466639808}, "shape": "llama3-8b", "dtype": "Q4_K_M", "workload": "decode", "batch": 1, "prompt": 512, "gen": 128, "depth": 0, "value": 280.9337669467129, "unit": "tok/s", "min": 275.48718737724823, "max": 281.67093836539516, "weight_gb_s": 1254.8299468555824, "kv_dtype": "f16", "kv_gb_s": 21.191377928563366, "runs": 3, "valid": true}"#;
const COMMITTED: &str = concat!(
    r#"{"run": "h200-20261202-s6-b", "time": "2026-12-02T08:04:54Z", "device": {"name": "NVIDIA H200", "driver": "580.159.04", "sms": 132}, "engine": "llama.cpp", "version": "llama-cpp-python 0.3.36 (vendored llama.cpp)", "commit": "c88788e", "model": {"file": "q4.gguf", "sha256": "a65e030642f0", "bytes": 4466639808}, "shape": "llama3-8b", "dtype": "Q4_K_M", "workload": "decode", "batch": 1, "prompt": 0, "gen": 128, "depth": 512, "value": 251.033889, "unit": "tok/s", "min": 247.373, "max": 253.117, "stddev": 3.180445, "weight_gb_s": 1121.2779617644533, "kv_dtype": "q8_0", "runs": 3, "valid": true, "source": "llama-bench -ngl 99 -fa 1 JSON, same lease as memra"}"#,
    "\n",
    r#"{"run": "h200-20261202-s6-b", "time": "2026-12-02T08:04:56Z", "device": {"name": "NVIDIA H200", "driver": "580.159.04", "sms": 132}, "engine": "llama.cpp", "version": "llama-cpp-python 0.3.36 (vendored llama.cpp)", "commit": "c88788e", "model": {"file": "q4.gguf", "sha256": "a65e030642f0", "bytes": 4466639808}, "shape": "llama3-8b", "dtype": "Q4_K_M", "workload": "decode", "batch": 1, "prompt": 0, "gen": 128, "depth": 2048, "value": 237.148252, "unit": "tok/s", "min": 234.622, "max": 238.61, "stddev": 2.19717, "weight_gb_s": 1059.2558227808156, "kv_dtype": "q8_0", "runs": 3, "valid": true, "source": "llama-bench -ngl 99 -fa 1 JSON, same lease as memra"}"#,
);

#[test]
fn the_committed_hand_converted_rows_come_from_the_run_s_memra_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = write(dir.path(), "h200.jsonl", &format!("{OUR_ROW}\n"));
    #[rustfmt::skip]
    let tests: [Test<'_>; 2] = [
        ((0, 128, 512), "2026-12-02T08:04:54Z", 251.033889, 3.180445, &[247.373, 252.611, 253.117]),
        ((0, 128, 2048), "2026-12-02T08:04:56Z", 237.148252, 2.19717, &[234.622, 238.61, 238.2]),
    ];
    let text = q8_lines("/root/q4.gguf", &tests);
    let input = write(dir.path(), "depth-q8.jsonl", &text);
    // No GGUF here, no labels: only the run and the file.
    let a = ImportArgs::new(vec![input], "h200-20261202-s6-b", &out);
    let r = import(&a).unwrap();
    assert_eq!(r.rows, rows(COMMITTED));
    assert!(
        r.notes.iter().any(|n| n.contains("a65e030642f0")),
        "{:?}",
        r.notes
    );
    let after = std::fs::read_to_string(&out).unwrap();
    assert!(after.starts_with(&format!("{OUR_ROW}\n")));
    assert_eq!(rows(&after)[1..], rows(COMMITTED)[..]);

    // Without memra's rows the model must be named: an error saying how, nothing written.
    let empty = dir.path().join("empty.jsonl");
    let e = import(&ImportArgs::new(
        a.files.clone(),
        "h200-20261202-s6-b",
        &empty,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("--model-sha256"), "{e}");
    assert!(!empty.exists());
    // ... which --model-sha256 and --model-bytes do.
    let given = ImportArgs {
        model_sha256: Some("a65e030642f0".into()),
        model_bytes: Some(4466639808),
        shape: Some("llama3-8b".into()),
        dtype: Some("Q4_K_M".into()),
        driver: Some("580.159.04".into()),
        sms: Some(132),
        commit: Some("c88788e".into()),
        ..ImportArgs::new(a.files.clone(), "h200-20261202-s6-b", &empty)
    };
    assert_eq!(import(&given).unwrap().rows, rows(COMMITTED));
}

#[test]
fn another_model_of_the_run_lends_the_machine_not_its_labels() {
    let dir = tempfile::tempdir().unwrap();
    let out = write(dir.path(), "h200.jsonl", &format!("{OUR_ROW}\n"));
    let model = write(dir.path(), "m.gguf", "GGUF");
    let input = write(dir.path(), "q8.jsonl", &sample());
    let r = import(&ImportArgs {
        model: Some(model),
        ..ImportArgs::new(vec![input], "h200-20261202-s6-b", &out)
    })
    .unwrap();
    let row = &r.rows[0];
    assert_eq!((row.shape.as_deref(), row.dtype.as_deref()), (None, None));
    assert_eq!(row.device.driver.as_deref(), Some("580.159.04"));
    assert_eq!(
        (row.device.sms, row.commit.as_deref()),
        (Some(132), Some("c88788e"))
    );
    assert_eq!(row.model.as_ref().unwrap().file, "m.gguf");
}

#[test]
fn a_malformed_line_is_an_error_naming_it_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "m.gguf", "GGUF");
    let good = write(dir.path(), "good.jsonl", &sample());
    let lines: Vec<String> = sample().lines().map(String::from).collect();
    let cut = &lines[2][..lines[2].len() / 2];
    let bad = write(
        dir.path(),
        "bad.jsonl",
        &format!("{}\n{}\n{cut}\n{}\n", lines[0], lines[1], lines[3]),
    );
    let before = format!("{OUR_ROW}\n");
    let out = write(dir.path(), "h200.jsonl", &before);
    let e = import(&explicit(vec![good.clone(), bad], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.jsonl:3"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), before);

    // A log line in a saved -o jsonl file is an error too (peer llama.cpp skips them on its
    // captured stdout), as is a line of the wrong type; a missing --out stays missing.
    let log = write(
        dir.path(),
        "log.jsonl",
        &format!("{}\nggml_cuda_init: found 1 CUDA devices\n", lines[0]),
    );
    let typed = write(
        dir.path(),
        "typed.jsonl",
        &lines[1].replace(r#""n_gen": 128"#, r#""n_gen": "128""#),
    );
    let fresh = dir.path().join("fresh.jsonl");
    for (f, at) in [(log, "log.jsonl:2"), (typed, "typed.jsonl:1")] {
        let e = import(&explicit(vec![good.clone(), f], &fresh, &model))
            .unwrap_err()
            .to_string();
        assert!(e.contains(at), "{e}");
        assert!(!fresh.exists());
    }
    // A bad row already in --out is named, and nothing is written.
    let broken = write(
        dir.path(),
        "broken.jsonl",
        &format!("{OUR_ROW}\n{{\"run\": 1}}\n"),
    );
    let e = import(&explicit(vec![good], &broken, &model))
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken.jsonl:2"), "{e}");
}

#[test]
fn a_test_already_in_the_file_is_refused_unless_replace() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "m.gguf", "GGUF");
    let input = write(dir.path(), "q8.jsonl", &sample());
    // A file whose last line lacks its newline: the rows still start on lines of their own.
    let out = write(dir.path(), "h200.jsonl", OUR_ROW);
    let a = explicit(vec![input.clone()], &out, &model);
    let first = import(&a).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text,
        format!("{OUR_ROW}\n{}", to_lines(&first.rows).unwrap())
    );

    // Again: refused, naming the file's line and the test; nothing written.
    let e = import(&a).unwrap_err().to_string();
    assert!(e.contains("h200.jsonl:2 already holds"), "{e}");
    assert!(e.contains("q8.jsonl:1"), "{e}");
    assert!(e.contains("h200.jsonl:5"), "{e}");
    assert!(e.contains("prefill of llama3-8b Q4_K_M"), "{e}");
    assert!(e.contains("--replace"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    // The same test twice in one import is refused too.
    let e = import(&explicit(vec![input.clone(), input.clone()], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(e.contains("measure the same test"), "{e}");

    // A new measurement of one test (tg128 at depth 8192) and one new test (tg128 at 32768).
    let redo = sample()
        .lines()
        .nth(3)
        .unwrap()
        .replace(r#""avg_ts": 203.9"#, r#""avg_ts": 210.5"#);
    let more = redo
        .replace(r#""n_depth": 8192"#, r#""n_depth": 32768"#)
        .replace(r#""avg_ts": 210.5"#, r#""avg_ts": 124.7"#);
    let second = write(dir.path(), "redo.jsonl", &format!("{redo}\n{more}\n"));
    let e = import(&explicit(vec![second.clone()], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(e.contains("h200.jsonl:5"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    let r = import(&ImportArgs {
        replace: true,
        ..explicit(vec![second], &out, &model)
    })
    .unwrap();
    assert_eq!(r.replaced, 1);
    let after: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let before: Vec<&str> = text.lines().collect();
    // Lines 1-4 untouched, line 5 replaced in place, the new test appended.
    assert_eq!(after.len(), 6);
    assert_eq!(after[..4], before[..4]);
    let got = rows(&after.join("\n"));
    assert_eq!(got[4], r.rows[0]);
    assert_eq!((got[4].value, got[4].depth), (Some(210.5), Some(8192)));
    assert_eq!((got[5].value, got[5].depth), (Some(124.7), Some(32768)));
    assert!(!dir.path().join("h200.jsonl.import-tmp").exists());
}

#[test]
fn lines_that_contradict_the_labels_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "m.gguf", "GGUF");
    let out = dir.path().join("h200.jsonl");
    // -ngl 0 is not what the default source says; --source describes it.
    let cpu = bench_line(
        "/root/m.gguf",
        "q8_0",
        (0, 128, 0),
        "2026-12-03T10:00:02Z",
        20.0,
        0.1,
        &[20.0],
        0,
    );
    let f = write(dir.path(), "cpu.jsonl", &cpu);
    let e = import(&explicit(vec![f.clone()], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cpu.jsonl:1") && e.contains("-ngl 0"), "{e}");
    let r = import(&ImportArgs {
        source: Some("llama-bench -ngl 0 -fa 1".into()),
        dry_run: true,
        ..explicit(vec![f], &out, &model)
    })
    .unwrap();
    assert_eq!(
        r.rows[0].source.as_deref(),
        Some("llama-bench -ngl 0 -fa 1")
    );
    assert!(!out.exists(), "--dry-run writes nothing");
    // An f16 KV file under --kv-dtype q8_0.
    let f16 = write(dir.path(), "f16.jsonl", &sample().replace("q8_0", "f16"));
    let e = import(&explicit(vec![f16], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("f16.jsonl:1") && e.contains("--kv-dtype q8_0"),
        "{e}"
    );
    // Two model files in one import.
    let other = write(
        dir.path(),
        "other.jsonl",
        &sample().replace("/root/m.gguf", "/root/q8.gguf"),
    );
    let first = write(dir.path(), "first.jsonl", &sample());
    let e = import(&explicit(vec![first, other], &out, &model))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("other.jsonl:1") && e.contains("one model"),
        "{e}"
    );
    assert!(!out.exists());
}
