//! `memra-verify vision --family qwen2vl|qwen25vl|qwen3vl`, the text side: a tiny random
//! Qwen-VL text model (qwen2vl, or qwen3vl with the tower's deepstack layers; F32 weights,
//! written to a GGUF) fed the tower's rows, against verify/reference/qwenvl_text_reference.py
//! (float64 numpy, HF's `get_rope_index` and M-RoPE / deepstack structure, no code shared):
//! the M-RoPE positions of prompts of text and two images equal, and every position's logits
//! of one step within the tolerance of the largest.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, RowEmbed, StepBatch, StepRow};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::error::{Error, Result};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::testing::tiny_gguf::{gguf_meta, write_model};
use memra_engine::vision::{MediaSpan, QwenParams, mrope};

/// The reference model's vocabulary; the image placeholder; text tokens from 10 on.
pub(crate) const VOCAB: usize = 512;
pub(crate) const SOFT: u32 = 5;

/// What the text check measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TextReport {
    /// Prompts of text and two images compared.
    pub prompts: usize,
    /// memra's M-RoPE positions equal HF's `get_rope_index` on every prompt.
    pub positions_equal: bool,
    /// Largest max |memra - ref| / max |ref| over one prompt's logits.
    pub rel_error: f32,
}

/// The tiny text model of `arch` that takes the rows of a tower of `q`'s widths.
pub(crate) fn config(arch: Arch, q: &QwenParams) -> ModelConfig {
    let mut c = tiny_config(arch, VOCAB);
    c.hidden = q.text_hidden;
    if let Some(v) = c.vl.as_mut() {
        v.deepstack = if arch == Arch::Qwen3Vl {
            q.deepstack.len()
        } else {
            0
        };
    }
    c
}

/// One prompt: 3 text tokens, image `a`, 4 text tokens, image `b`, 3 text tokens.
fn prompt(i: usize, grids: [(usize, usize); 2]) -> (Vec<u32>, Vec<usize>) {
    let text = |n: usize, k: usize| -> Vec<u32> {
        (0..n)
            .map(|j| 10 + ((37 * (i * 13 + k * 5 + j)) % (VOCAB - 10)) as u32)
            .collect()
    };
    let mut ids = text(3, 0);
    let mut starts = Vec::new();
    for (k, (r, c)) in grids.into_iter().enumerate() {
        starts.push(ids.len());
        ids.extend(std::iter::repeat_n(SOFT, r * c));
        ids.extend(text(4 - k, k + 1));
    }
    (ids, starts)
}

pub(crate) fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs the check: prompt `i` holds images `i` and `i + 1` (of `rows`, their `grids`).
pub fn check(
    python: &str,
    arch: Arch,
    q: &QwenParams,
    rows: &[Arc<[f32]>],
    grids: &[(usize, usize)],
    dir: &Path,
) -> Result<TextReport> {
    let cfg = config(arch, q);
    cfg.validate()?;
    let width = cfg.embed_width();
    if rows.iter().any(|r| r.len() % width != 0) {
        return Err(Error::Input(format!(
            "vision text check: the tower's rows are not rows of {width}"
        )));
    }
    let w = random_weights(&cfg, 23, DType::F32)?;
    let gguf = dir.join("text.gguf");
    write_model(&w, &gguf_meta(&cfg), &gguf)?;
    let n = rows.len();
    let mut cases = Vec::new();
    let mut mine = Vec::new();
    for i in 0..n {
        let (a, b) = (i, (i + 1) % n);
        let (ids, starts) = prompt(i, [grids[a], grids[b]]);
        let media: Vec<MediaSpan> = [a, b]
            .iter()
            .zip(&starts)
            .map(|(&k, &start)| MediaSpan {
                start,
                embeds: rows[k].clone(),
                width,
                hash: k as u128,
                grid: Some(grids[k]),
                times: Vec::new(),
            })
            .collect();
        let embeds = dir.join(format!("text{i}.rows.f32"));
        let bytes: Vec<u8> = [a, b]
            .iter()
            .flat_map(|&k| rows[k].iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        std::fs::write(&embeds, bytes).map_err(|e| Error::io(&embeds, e))?;
        let m = q.merge;
        let thw = [grids[a], grids[b]].map(|(r, c)| [1, r * m, c * m]);
        cases.push(serde_json::json!({
            "ids": ids,
            "image_token_id": SOFT,
            "grid_thw": thw,
            "spatial_merge_size": m,
            "embeds": embeds,
            "logits": dir.join(format!("text{i}.logits.f32")),
        }));
        mine.push((ids, media));
    }
    let theirs = text_reference(python, &gguf, dir, "text", serde_json::json!(cases), "")?;
    // An f32 cache: the comparison is of the arithmetic, not of the cache's rounding.
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 64,
        block_size: 16,
        kv_dtype: memra_engine::backend::KvDtype::F32,
    };
    let mut b = CpuBackend::new(w, &opts)?;
    let mut rep = TextReport {
        prompts: n,
        positions_equal: true,
        rel_error: 0.0,
    };
    for (i, (ids, media)) in mine.iter().enumerate() {
        let pos = mrope::positions(media, 0, ids.len());
        let want = &theirs["cases"][i]["positions"];
        let same = (0..3).all(|axis| {
            let got: Vec<u64> = pos.iter().map(|p| p[axis] as u64).collect();
            want[axis].as_array().is_some_and(|v| {
                v.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>() == Some(got)
            })
        });
        rep.positions_equal &= same;
        let logits = step(&mut b, ids, media, pos)?;
        let f = dir.join(format!("text{i}.logits.f32"));
        let r = f32s(&std::fs::read(&f).map_err(|e| Error::io(&f, e))?);
        let got: Vec<f32> = logits.into_iter().flatten().collect();
        if r.len() != got.len() {
            return Err(Error::Input(format!(
                "the text reference gave {} logits, memra {}",
                r.len(),
                got.len()
            )));
        }
        let max = r.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = r
            .iter()
            .zip(&got)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let e = if max > 0.0 { diff / max } else { diff };
        rep.rel_error = if e.is_nan() { e } else { rep.rel_error.max(e) };
    }
    Ok(rep)
}

/// Every position's logits of prompt `ids` in one step on a fresh sequence.
pub(crate) fn step(
    b: &mut CpuBackend,
    ids: &[u32],
    media: &[MediaSpan],
    mrope: Vec<[u32; 3]>,
) -> Result<Vec<Vec<f32>>> {
    let mut batch = StepBatch {
        rows: ids
            .iter()
            .enumerate()
            .map(|(p, &token)| StepRow {
                token,
                pos: p as u32,
                seq: 0,
                want_logits: true,
            })
            .collect(),
        block_tables: vec![(0..ids.len().div_ceil(16) as u32).collect()],
        state_slots: Vec::new(),
        embeds: Vec::new(),
        mrope,
    };
    for m in media {
        for (index, row) in m.range().enumerate() {
            batch.embeds.push(RowEmbed {
                row,
                values: m.embeds.clone(),
                index,
                width: m.width,
                span: m.start as u32..m.range().end as u32,
            });
        }
    }
    Ok(b.step(&batch)?.logits)
}

/// Runs the numpy text reference (reference/qwenvl_text_reference.py) on the GGUF `gguf` over
/// `cases` (through `dir/{stem}_cases.json` and `dir/{stem}_out.json`) and returns its output;
/// `what` names the input in its failure (e.g. " on the video").
pub(crate) fn text_reference(
    python: &str,
    gguf: &Path,
    dir: &Path,
    stem: &str,
    cases: serde_json::Value,
    what: &str,
) -> Result<serde_json::Value> {
    let spec = dir.join(format!("{stem}_cases.json"));
    let out = dir.join(format!("{stem}_out.json"));
    let body = serde_json::json!({ "cases": cases }).to_string();
    std::fs::write(&spec, body).map_err(|e| Error::io(&spec, e))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/qwenvl_text_reference.py");
    let run = Command::new(python)
        .arg(&script)
        .args([gguf, &spec, &out])
        .output()
        .map_err(|e| Error::io(python, e))?;
    if !run.status.success() {
        return Err(Error::Input(format!(
            "the numpy text reference failed{what}: {}",
            String::from_utf8_lossy(&run.stderr)
        )));
    }
    let text = std::fs::read(&out).map_err(|e| Error::io(&out, e))?;
    serde_json::from_slice(&text).map_err(|e| Error::Input(format!("{out:?}: {e}")))
}
