//! Measurement records: one JSON object per line in `reports/data/*.jsonl`, one measurement per
//! line. Every benchmark appends here; `memra-bench report` reads every file back. docs/BENCH.md
//! describes the fields.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use memra_engine::error::{Error, Result};

/// The machine a measurement ran on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceRef {
    /// `NVIDIA H200`, or `CPU (N cores)`.
    pub name: String,
    /// The NVIDIA driver version, when known.
    pub driver: Option<String>,
    /// Streaming multiprocessors, for a GPU.
    pub sms: Option<u32>,
}

/// The model file a measurement used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelRef {
    /// The file (or folder) name, with how it was made for synthetic files.
    pub file: String,
    /// The first 12 hex digits of the file's sha256 (null where it was not recorded).
    pub sha256: Option<String>,
    /// The file's size in bytes (the roofline's weight bytes of a dense model's decode row
    /// without `weight_bytes_per_token`).
    pub bytes: Option<u64>,
}

/// What was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Batch-1 decode tok/s after a `prompt`-token prompt.
    Decode,
    /// Prefill tok/s of a `prompt`-token prompt.
    Prefill,
    /// Time to first token of a fresh prompt (ms).
    TtftCold,
    /// Time to first token when the prompt's prefix is in the prefix cache (ms).
    TtftCached,
    /// Aggregate tok/s of `batch` streaming clients through a server.
    Load,
    /// Aggregate tok/s of `batch` concurrent sequences in the engine loop.
    Concurrency,
    /// Device copy bandwidth (GB/s) measured in the same run: the roofline's numerator.
    CopyBandwidth,
    /// Images/s of the vision tower alone, images of its size encoded back to back
    /// (`memra-bench vision`; llama.cpp: llama-mtmd-cli's encode time).
    VisionEncode,
    /// Time to first token of a one-image chat request (ms), the image's encode included.
    VisionTtft,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Decode => "decode",
            Workload::Prefill => "prefill",
            Workload::TtftCold => "ttft_cold",
            Workload::TtftCached => "ttft_cached",
            Workload::Load => "load",
            Workload::Concurrency => "concurrency",
            Workload::CopyBandwidth => "copy_bandwidth",
            Workload::VisionEncode => "vision_encode",
            Workload::VisionTtft => "vision_ttft",
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// One id per invocation, shared by memra's and the peer's rows of that invocation.
    pub run: String,
    /// RFC 3339 UTC (a date alone for rows converted from hand-made records without a time).
    pub time: String,
    pub device: DeviceRef,
    /// `memra` or `llama.cpp`.
    pub engine: String,
    /// The engine's version where it is not memra at `commit`.
    pub version: Option<String>,
    /// memra's commit (short hash).
    pub commit: Option<String>,
    pub model: Option<ModelRef>,
    /// The model's shape (`llama3-8b`, `smollm2-135m`).
    pub shape: Option<String>,
    /// The weight type as llama.cpp names it (`Q4_K_M`, `Q8_0`, `F16`, `Q4_1`).
    pub dtype: Option<String>,
    pub workload: Workload,
    /// Sequences (or clients) at once.
    pub batch: Option<u64>,
    /// Prompt tokens.
    pub prompt: Option<u64>,
    /// Generated tokens (`gen` in the JSON).
    #[serde(rename = "gen")]
    pub generated: Option<u64>,
    /// Context depth before the measured tokens.
    pub depth: Option<u64>,
    /// The median of the runs; null when the row is invalid.
    pub value: Option<f64>,
    /// `tok/s`, `ms`, `GB/s` or `images/s`.
    pub unit: String,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// The peer's standard deviation, where that is what it reports instead of min/max.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
    /// Achieved weight bandwidth of a decode row: `weight_bytes_per_token` x tok/s (GB/s); on
    /// rows without that field (older memra rows, the peer's), the model file's bytes x tok/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_gb_s: Option<f64>,
    /// The weight bytes one batch-1 decode token reads (memra's decode rows): the engine's
    /// `ModelInfo::weight_token_bytes`, the routed experts of an MoE model only, one embedding
    /// row, the whole head. With the KV bytes (`kv_gb_s` / tok/s), the roofline's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes_per_token: Option<u64>,
    /// The KV cache's element format (`bf16`, `f16`, `q8_0`, `f32`; llama.cpp: `-ctk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
    /// Achieved KV cache read bandwidth of a decode row: the KV bytes attention reads per token
    /// (all layers' K and V of the positions before it, averaged over the generated tokens) x
    /// tok/s (GB/s); weights + KV = the step's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_gb_s: Option<f64>,
    /// What constrained the generated tokens: `json_schema` for a decode run with `--schema`
    /// (structured output through llguidance); absent when unconstrained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// The schema file's name of a constrained row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Timed runs behind `value`.
    pub runs: u64,
    /// False when a timed run's tokens differed from the untimed reference run's.
    pub valid: bool,
    /// Where a converted row came from (a report file), or a remark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl Row {
    /// A valid row of `workload` measured now, every optional field empty and no runs yet:
    /// the base that each workload's row fills with struct update syntax.
    pub fn new(
        run: String,
        device: DeviceRef,
        engine: impl Into<String>,
        workload: Workload,
        unit: impl Into<String>,
    ) -> Row {
        Row {
            run,
            time: now(),
            device,
            engine: engine.into(),
            version: None,
            commit: None,
            model: None,
            shape: None,
            dtype: None,
            workload,
            batch: None,
            prompt: None,
            generated: None,
            depth: None,
            value: None,
            unit: unit.into(),
            min: None,
            max: None,
            stddev: None,
            weight_gb_s: None,
            weight_bytes_per_token: None,
            kv_dtype: None,
            kv_gb_s: None,
            constraint: None,
            schema: None,
            runs: 0,
            valid: true,
            source: None,
        }
    }

    /// The model's label in tables: shape and dtype.
    pub fn model_label(&self) -> String {
        let label = self.plain_label();
        match &self.constraint {
            Some(c) => format!("{label} [{c}]"),
            None => label,
        }
    }

    fn plain_label(&self) -> String {
        match (&self.shape, &self.dtype) {
            (Some(s), Some(d)) => format!("{s} {d}"),
            (Some(s), None) => s.clone(),
            _ => self
                .model
                .as_ref()
                .map(|m| m.file.clone())
                .unwrap_or_default(),
        }
    }
}

/// Rows as JSON lines, each ending in a newline.
pub fn to_lines(rows: &[Row]) -> Result<String> {
    let mut text = String::new();
    for r in rows {
        text.push_str(&serde_json::to_string(r).map_err(|e| Error::Input(e.to_string()))?);
        text.push('\n');
    }
    Ok(text)
}

/// Appends rows to a JSONL file (created with its folder when absent) in one write; a file whose
/// last line lacks its newline gets one first.
pub fn append(path: &Path, rows: &[Row]) -> Result<()> {
    let err = |e: std::io::Error| Error::Input(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut text = to_lines(rows)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
        .map_err(err)?;
    let len = f.metadata().map_err(err)?.len();
    if len > 0 {
        use std::io::{Read, Seek, SeekFrom};
        let mut last = [0u8];
        f.seek(SeekFrom::End(-1)).map_err(err)?;
        f.read_exact(&mut last).map_err(err)?;
        if last[0] != b'\n' {
            text.insert(0, '\n');
        }
    }
    f.write_all(text.as_bytes()).map_err(err)
}

/// Every row of every `*.jsonl` file in `dir`, files in name order, rows in file order. A line
/// that is not a row is an error naming the file and line.
pub fn read_dir(dir: &Path) -> Result<Vec<Row>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Input(format!("{}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f)
            .map_err(|e| Error::Input(format!("{}: {e}", f.display())))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let row: Row = serde_json::from_str(line).map_err(|e| {
                Error::Input(format!(
                    "{}:{}: not a measurement row: {e}",
                    f.display(),
                    i + 1
                ))
            })?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A model file's reference: name, size and sha256 prefix (a folder: its name, no hash; the
/// prefix remembered across runs: [`crate::model_hash`]).
pub fn model_ref(path: &Path) -> Result<ModelRef> {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    if path.is_dir() {
        return Ok(ModelRef {
            file,
            sha256: None,
            bytes: None,
        });
    }
    let (hex, bytes) = crate::model_hash::sha256_prefix(path)?;
    Ok(ModelRef {
        file,
        sha256: Some(hex),
        bytes: Some(bytes),
    })
}

/// RFC 3339 UTC time of `secs` since the Unix epoch.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The current time, RFC 3339 UTC.
pub fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// A run id: the time and the process id (`20261201T182700Z-1234`).
pub fn new_run_id() -> String {
    let t = now().replace(['-', ':'], "");
    format!("{t}-{}", std::process::id())
}

/// memra's commit: `MEMRA_COMMIT`, else `git rev-parse --short HEAD` in the current folder.
pub fn commit() -> Option<String> {
    if let Some(c) = memra_engine::settings::commit() {
        return Some(c).filter(|c| !c.is_empty());
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// The median, min and max of a non-empty sample.
pub fn median_min_max(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Some((med, s[0], s[n - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_150_221), "2026-12-01T18:37:01Z");
    }

    #[test]
    fn median_of_even_and_odd_samples() {
        assert_eq!(median_min_max(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(median_min_max(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(median_min_max(&[]), None);
    }

    #[test]
    fn rows_round_trip_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let row = Row {
            run: "r".into(),
            time: now(),
            device: DeviceRef {
                name: "CPU (2 cores)".into(),
                driver: None,
                sms: None,
            },
            engine: "memra".into(),
            version: None,
            commit: Some("abc".into()),
            model: None,
            shape: Some("smollm2-135m".into()),
            dtype: Some("Q4_1".into()),
            workload: Workload::Decode,
            batch: Some(1),
            prompt: Some(8),
            generated: Some(4),
            depth: Some(0),
            value: Some(1.5),
            unit: "tok/s".into(),
            min: Some(1.0),
            max: Some(2.0),
            stddev: None,
            weight_gb_s: None,
            weight_bytes_per_token: Some(7),
            kv_dtype: Some("bf16".into()),
            kv_gb_s: Some(0.5),
            constraint: None,
            schema: None,
            runs: 3,
            valid: true,
            source: None,
        };
        let p = dir.path().join("a.jsonl");
        append(&p, std::slice::from_ref(&row)).unwrap();
        append(&p, std::slice::from_ref(&row)).unwrap();
        assert_eq!(read_dir(dir.path()).unwrap(), vec![row.clone(), row]);
        std::fs::write(dir.path().join("b.jsonl"), "{\"run\": 1}\n").unwrap();
        let e = read_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("b.jsonl:1"), "{e}");
    }
}
