//! % of the roofline of a decode row: the bytes one token reads x tok/s over the copy bandwidth
//! measured in the same run. The bytes of a token are its weights (`weight_bytes_per_token`) and
//! the KV cache attention reads at the row's mean context (`kv_gb_s` / tok/s); the peer reads
//! the same file, so its row takes the bytes of memra's row of the same model and context.

use crate::record::{Row, Workload};
use crate::shapes::Shape;

/// The copy bandwidth (GB/s, bytes read + written) of `run`: the median of its copy rows (one
/// per `memra-bench decode|prefill|ttft` invocation on a GPU); `None` when it recorded none.
pub fn copy_bandwidth(rows: &[&Row], run: &str) -> Option<f64> {
    let v: Vec<f64> = rows
        .iter()
        .filter(|r| r.run == run && r.workload == Workload::CopyBandwidth)
        .filter_map(|r| r.value)
        .collect();
    crate::record::median_min_max(&v).map(|m| m.0)
}

/// The weight bytes one decode token of `r` reads: the row's `weight_bytes_per_token`; a row
/// without it (recorded before the field) falls back to its file's bytes when its shape is a
/// known dense one (an MoE token reads a fraction of the file: no figure).
pub fn weight_bytes(r: &Row) -> Option<f64> {
    if let Some(b) = r.weight_bytes_per_token {
        return Some(b as f64);
    }
    let shape: Shape = r.shape.as_deref()?.parse().ok()?;
    if shape.config(1).moe.is_some() {
        return None;
    }
    r.model.as_ref()?.bytes.map(|b| b as f64)
}

/// The bytes one decode token of memra's row `r` reads: weights and the KV of the positions
/// before it (`kv_gb_s` / tok/s: `kv_token_bytes` x the mean context); `None` without either.
pub fn bytes_per_token(r: &Row) -> Option<f64> {
    let v = r.value.filter(|&v| v > 0.0)?;
    Some(weight_bytes(r)? + r.kv_gb_s? * 1e9 / v)
}

/// The % of the roofline of decode row `r` (memra's or the peer's) whose token reads what
/// memra's row `bytes_of` says, against the copy bandwidth of `r`'s run.
pub fn percent(rows: &[&Row], r: &Row, bytes_of: &Row) -> Option<f64> {
    let bw = copy_bandwidth(rows, &r.run).filter(|&b| b > 0.0)?;
    Some(bytes_per_token(bytes_of)? * r.value? / (bw * 1e9) * 100.0)
}

/// A percentage as the tables print it (`41%`), `—` when there is none.
pub fn fmt_percent(p: Option<f64>) -> String {
    p.map_or("—".into(), |p| format!("{p:.0}%"))
}

/// The cell of a decode line: memra's % and the peer's (`41% / 30%`), `—` when neither has one.
pub fn pair(rows: &[&Row], memra: Option<&Row>, peer: Option<&Row>) -> String {
    let m = memra.and_then(|m| percent(rows, m, m));
    let p = memra.zip(peer).and_then(|(m, p)| percent(rows, p, m));
    match (m, p) {
        (None, None) => "—".into(),
        _ => format!("{} / {}", fmt_percent(m), fmt_percent(p)),
    }
}
