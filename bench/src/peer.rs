//! `memra-bench peer llama.cpp`: runs the peer's `llama-bench` on the same GGUF file and prompt
//! sizes as memra, and turns its JSON lines into measurement rows of the same run. Fetching and
//! building llama.cpp (from the llama-cpp-python 0.3.36 sdist) is peer_build's job; this takes
//! the built binaries' folder. llama.cpp's source and binaries are never committed.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use memra_engine::error::{Error, Result};

use crate::record::{DeviceRef, ModelRef, Row, Workload};

/// What llama-bench prints per test with `-o jsonl` (the fields read here).
#[derive(Debug, Deserialize)]
struct BenchLine {
    build_commit: Option<String>,
    build_number: Option<u64>,
    gpu_info: Option<String>,
    /// The `-m` path llama-bench was given.
    #[serde(default)]
    model_filename: Option<String>,
    n_prompt: u64,
    n_gen: u64,
    #[serde(default)]
    n_depth: u64,
    avg_ts: f64,
    stddev_ts: Option<f64>,
    #[serde(default)]
    samples_ts: Vec<f64>,
    /// The KV cache type (`-ctk`).
    #[serde(default)]
    type_k: Option<String>,
    /// When the test ran (RFC 3339 UTC, `2026-12-02T08:04:42Z`).
    #[serde(default)]
    test_time: Option<String>,
    /// `-ngl` (a number; read leniently, as the settings' types vary between versions).
    #[serde(default)]
    n_gpu_layers: Option<serde_json::Value>,
    /// `-fa`: a bool in older llama-bench, 0/1/-1 or on/off/auto in newer ones.
    #[serde(default)]
    flash_attn: Option<serde_json::Value>,
}

/// `flash_attn` as on (true) or off (false); None when absent or `auto`.
fn flash_attn_on(v: &serde_json::Value) -> Option<bool> {
    use serde_json::Value;
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_i64() {
            Some(1) => Some(true),
            Some(0) => Some(false),
            _ => None,
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "on" | "true" | "enabled" => Some(true),
            "0" | "off" | "false" | "disabled" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// The labels and run every row of one model file shares.
#[derive(Clone, Debug)]
pub struct PeerRun {
    pub run: String,
    /// The rows' time where a line has no `test_time` (llama-bench prints one per test).
    pub time: String,
    /// The device; a line's `gpu_info` names it instead where present.
    pub device: DeviceRef,
    pub commit: Option<String>,
    pub model: ModelRef,
    pub shape: Option<String>,
    pub dtype: Option<String>,
    /// The rows' `kv_dtype` where a line has no `type_k`.
    pub kv_dtype: Option<String>,
    /// Where the peer's source came from (`--peer-source`): the rows' version, with llama.cpp's
    /// build number and commit added when it reports them (a llama.cpp built outside its git
    /// tree reports build 0 and an unknown commit).
    pub version: String,
    /// The rows' `source` remark (how they were measured).
    pub source: String,
}

/// The `source` of the rows `peer llama.cpp` records.
pub const LLAMA_BENCH_SOURCE: &str = "llama-bench -ngl 99 -fa 1";

/// One row from llama-bench's output, with the line it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    /// 1-based line number in the text.
    pub line: usize,
    /// llama-bench's `model_filename` (the `-m` path), when printed.
    pub model_filename: Option<String>,
    /// `-ngl`, when printed.
    pub n_gpu_layers: Option<i64>,
    /// `-fa` on or off, when printed (None for `auto`).
    pub flash_attn: Option<bool>,
    pub row: Row,
}

/// Rows from llama-bench's JSON lines: a `pp` test is prefill, a `tg` test decode (a `pg` test,
/// both at once, has no row). Lines that do not start with `{` (log lines on the same stream)
/// are skipped.
pub fn rows_from_jsonl(text: &str, p: &PeerRun) -> Result<Vec<Row>> {
    let rows = peer_rows(text, p, false, "llama-bench output")?;
    Ok(rows.into_iter().map(|r| r.row).collect())
}

/// [`rows_from_jsonl`] with each row's line. `strict`: every non-blank line must be a
/// llama-bench JSON line (a saved `-o jsonl` file). Errors name `what` and the line.
pub fn peer_rows(text: &str, p: &PeerRun, strict: bool, what: &str) -> Result<Vec<PeerRow>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (!strict && !line.starts_with('{')) {
            continue;
        }
        let b: BenchLine = serde_json::from_str(line).map_err(|e| {
            Error::Input(format!(
                "{what}:{}: not a llama-bench JSON result line: {e}",
                i + 1
            ))
        })?;
        let workload = match (b.n_prompt, b.n_gen) {
            (_, 0) => Workload::Prefill,
            (0, _) => Workload::Decode,
            _ => continue,
        };
        let version = match (b.build_number, b.build_commit.as_deref()) {
            (Some(n), Some(c)) if n > 0 && c != "unknown" => {
                format!("{}, llama.cpp build {n} ({c})", p.version)
            }
            _ => p.version.clone(),
        };
        let mut device = p.device.clone();
        if let Some(g) = b.gpu_info.filter(|g| !g.is_empty()) {
            device.name = g;
        }
        let finite = b.samples_ts.iter().copied().filter(|x| x.is_finite());
        let min = finite.clone().reduce(f64::min);
        let max = finite.reduce(f64::max);
        let row = Row {
            time: b.test_time.unwrap_or_else(|| p.time.clone()),
            version: Some(version),
            commit: p.commit.clone(),
            model: Some(p.model.clone()),
            shape: p.shape.clone(),
            dtype: p.dtype.clone(),
            batch: Some(1),
            prompt: Some(b.n_prompt),
            generated: Some(b.n_gen),
            depth: Some(b.n_depth),
            value: Some(b.avg_ts),
            min,
            max,
            stddev: b.stddev_ts,
            weight_gb_s: p
                .model
                .bytes
                .filter(|_| workload == Workload::Decode)
                .map(|x| x as f64 * b.avg_ts / 1e9),
            kv_dtype: b.type_k.or_else(|| p.kv_dtype.clone()),
            runs: b.samples_ts.len().max(1) as u64,
            source: Some(p.source.clone()),
            ..Row::new(p.run.clone(), device, "llama.cpp", workload, "tok/s")
        };
        rows.push(PeerRow {
            line: i + 1,
            model_filename: b.model_filename,
            n_gpu_layers: b.n_gpu_layers.as_ref().and_then(|v| v.as_i64()),
            flash_attn: b.flash_attn.as_ref().and_then(flash_attn_on),
            row,
        });
    }
    if rows.is_empty() {
        return Err(Error::Input(format!(
            "{what}: no pp/tg result of llama-bench"
        )));
    }
    Ok(rows)
}

/// What the peer is asked to measure: llama-bench's `-p`, `-n`, `-d`, `-r` and the KV cache
/// type (`-ctk`/`-ctv`; None: llama.cpp's default f16).
#[derive(Clone, Debug)]
pub struct BenchPlan<'a> {
    pub prompt: &'a [usize],
    pub gen_tokens: usize,
    pub depth: &'a [usize],
    pub reps: usize,
    pub kv: Option<&'a str>,
}

/// llama-bench's arguments for `plan` on `model`: `-m M -ngl 99 -fa 1 -o jsonl -p P -n N -d D -r R
/// [-ctk T -ctv T]`.
pub fn llama_bench_args(model: &Path, plan: &BenchPlan<'_>) -> Vec<String> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut a: Vec<String> = vec!["-m".into(), model.display().to_string()];
    a.extend(["-ngl", "99", "-fa", "1", "-o", "jsonl"].map(String::from));
    a.extend(["-p".into(), list(plan.prompt)]);
    a.extend(["-n".into(), plan.gen_tokens.to_string()]);
    a.extend(["-d".into(), list(plan.depth)]);
    a.extend(["-r".into(), plan.reps.to_string()]);
    if let Some(t) = plan.kv {
        a.extend(["-ctk".into(), t.to_string(), "-ctv".into(), t.to_string()]);
    }
    a
}

/// Runs llama-bench from `bin_dir` on `model` ([`llama_bench_args`]); returns its JSON lines.
pub fn llama_bench(bin_dir: &Path, model: &Path, plan: &BenchPlan<'_>) -> Result<String> {
    let exe = bin_dir.join("llama-bench");
    let out = Command::new(&exe)
        .args(llama_bench_args(model, plan))
        .output()
        .map_err(|e| Error::Input(format!("{}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(Error::Input(format!(
            "{} failed ({}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_bench_is_asked_for_the_kv_type_of_memra_s_rows() {
        let plan = BenchPlan {
            prompt: &[0],
            gen_tokens: 128,
            depth: &[512, 8000],
            reps: 3,
            kv: None,
        };
        let a = llama_bench_args(Path::new("m.gguf"), &plan);
        assert_eq!(
            a.join(" "),
            "-m m.gguf -ngl 99 -fa 1 -o jsonl -p 0 -n 128 -d 512,8000 -r 3"
        );
        let q8 = llama_bench_args(
            Path::new("m.gguf"),
            &BenchPlan {
                kv: Some("q8_0"),
                ..plan
            },
        );
        assert!(q8.join(" ").ends_with("-r 3 -ctk q8_0 -ctv q8_0"), "{q8:?}");
    }

    fn run() -> PeerRun {
        PeerRun {
            run: "r1".into(),
            time: "2026-12-01T00:00:00Z".into(),
            device: DeviceRef {
                name: "cuda".into(),
                driver: Some("580".into()),
                sms: Some(132),
            },
            commit: Some("abc".into()),
            model: ModelRef {
                file: "m.gguf".into(),
                sha256: None,
                bytes: Some(4_000_000_000),
            },
            shape: Some("llama3-8b".into()),
            dtype: Some("Q4_K_M".into()),
            kv_dtype: None,
            version: "src".into(),
            source: LLAMA_BENCH_SOURCE.into(),
        }
    }

    #[test]
    fn pp_and_tg_lines_become_prefill_and_decode_rows() {
        let text = concat!(
            "ggml_cuda_init: found 1 CUDA devices\n",
            r#"{"build_commit": "b1", "build_number": 42, "gpu_info": "NVIDIA H200", "n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 9417.0, "stddev_ts": 960.0, "samples_ts": [9000.0, 9400.0, 9851.0]}"#,
            "\n",
            r#"{"build_commit": "b1", "build_number": 42, "gpu_info": "NVIDIA H200", "n_prompt": 0, "n_gen": 128, "n_depth": 8192, "avg_ts": 250.0, "stddev_ts": 1.0, "samples_ts": [249.0, 250.0, 251.0]}"#,
            "\n"
        );
        let rows = rows_from_jsonl(text, &run()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].workload, Workload::Prefill);
        assert_eq!(
            (rows[0].value, rows[0].min, rows[0].max),
            (Some(9417.0), Some(9000.0), Some(9851.0))
        );
        assert_eq!(rows[0].weight_gb_s, None);
        assert_eq!(rows[1].workload, Workload::Decode);
        assert_eq!((rows[1].depth, rows[1].runs), (Some(8192), 3));
        assert_eq!(rows[1].weight_gb_s, Some(1000.0));
        assert_eq!(rows[1].device.name, "NVIDIA H200");
        assert_eq!(
            rows[1].version.as_deref(),
            Some("src, llama.cpp build 42 (b1)")
        );
        let unknown = r#"{"build_commit": "unknown", "build_number": 0, "n_prompt": 0, "n_gen": 128, "avg_ts": 1.0}"#;
        let rows = rows_from_jsonl(unknown, &run()).unwrap();
        assert_eq!(rows[0].version.as_deref(), Some("src"));
        assert!(rows_from_jsonl("no json here\n", &run()).is_err());
        assert!(rows_from_jsonl("{\"n_prompt\": \"x\"}\n", &run()).is_err());
    }
}
