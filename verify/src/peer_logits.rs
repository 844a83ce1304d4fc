//! `memra-verify peer-logits`: memra's logits against another engine's on the same GGUF file
//! (llama.cpp through tools/peer/logits.py): per prompt, the peer's greedy continuation is fed
//! to memra as one step (prompt + continuation), and memra's logits at every generated position
//! are compared with the peer's: top-1 agreement (memra's argmax, lowest index on ties, equals
//! the peer's pick) and the largest absolute logit difference (docs/VERIFY.md "Against a peer").

use std::path::Path;

use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::{Error, Result};

/// The default bound on the largest logit difference, relative to the largest |logit|
/// (docs/VERIFY.md "Against a peer").
pub const PEER_TOL: f64 = 1e-2;

/// One prompt of the peer's file: its token ids and the peer's greedy continuation.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct PeerCase {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct PeerFile {
    peer: String,
    vocab: usize,
    /// The logits file, next to the JSON.
    logits: String,
    cases: Vec<PeerCase>,
}

/// Little-endian f32 values of a peer's binary file.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One teacher-forced row, memra's logits `got` against the peer's `want`: folds the largest
/// difference into `max_abs` and the largest peer |logit| into `max_logit`; `None` when memra's
/// argmax is the peer's `token`, else the peer's margin between its top two logits.
pub fn forced_row(
    got: &[f32],
    want: &[f32],
    token: u32,
    max_abs: &mut f32,
    max_logit: &mut f32,
) -> Option<f32> {
    for (x, y) in got.iter().zip(want) {
        *max_abs = max_abs.max((x - y).abs());
        *max_logit = max_logit.max(y.abs());
    }
    if argmax(got) as u32 == token {
        return None;
    }
    let mut s = want.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    Some(s[0] - s.get(1).copied().unwrap_or(s[0]))
}

/// What the comparison found.
#[derive(Clone, Debug, Default)]
pub struct PeerReport {
    pub peer: String,
    pub steps: usize,
    /// Steps where memra's argmax is the peer's pick.
    pub agree: usize,
    pub max_abs: f32,
    /// The largest peer logit (scale of `max_abs`).
    pub max_logit: f32,
    /// (prompt, step, peer's top-1 minus top-2 margin) of each disagreement.
    pub disagreements: Vec<(usize, usize, f32)>,
}

impl PeerReport {
    pub fn agreement(&self) -> f64 {
        self.agree as f64 / self.steps.max(1) as f64
    }
}

/// The lowest index of the largest value.
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Compares `b`'s logits with the peer's in `json` (and the logits file it names).
pub fn run(b: &mut dyn Backend, json: &Path) -> Result<PeerReport> {
    let bad = |what: String| Error::Input(format!("{}: {what}", json.display()));
    let text = std::fs::read_to_string(json).map_err(|e| bad(e.to_string()))?;
    let f: PeerFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let vocab = b.config().vocab;
    if f.vocab != vocab {
        return Err(bad(format!(
            "vocabulary {} but the model's is {vocab}",
            f.vocab
        )));
    }
    let bin = json.with_file_name(&f.logits);
    let raw = std::fs::read(&bin).map_err(|e| bad(format!("{}: {e}", bin.display())))?;
    let steps: usize = f.cases.iter().map(|c| c.tokens.len()).sum();
    if raw.len() != steps * vocab * 4 {
        return Err(bad(format!(
            "{} holds {} bytes, expected {steps} rows of {vocab} f32",
            bin.display(),
            raw.len()
        )));
    }
    let peer_row = |i: usize| f32s(&raw[i * vocab * 4..(i + 1) * vocab * 4]);
    let bs = b.kv_block_size();
    let mut rep = PeerReport {
        peer: f.peer.clone(),
        ..PeerReport::default()
    };
    let mut row_i = 0;
    for (ci, c) in f.cases.iter().enumerate() {
        if c.prompt.is_empty() {
            return Err(bad(format!("case {ci} has an empty prompt")));
        }
        let ids: Vec<u32> = c
            .prompt
            .iter()
            .chain(&c.tokens[..c.tokens.len().saturating_sub(1)])
            .copied()
            .collect();
        let first = c.prompt.len() - 1;
        let batch = StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: ids
                .iter()
                .enumerate()
                .map(|(p, &token)| StepRow {
                    token,
                    pos: p as u32,
                    seq: 0,
                    want_logits: p >= first,
                })
                .collect(),
            block_tables: vec![(0..ids.len().div_ceil(bs) as u32).collect()],
            state_slots: Vec::new(),
        };
        let out = b.step(&batch)?;
        for (si, got) in out.logits.iter().enumerate() {
            let want = peer_row(row_i);
            row_i += 1;
            rep.steps += 1;
            match forced_row(
                got,
                &want,
                c.tokens[si],
                &mut rep.max_abs,
                &mut rep.max_logit,
            ) {
                None => rep.agree += 1,
                Some(margin) => rep.disagreements.push((ci, si, margin)),
            }
        }
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_row_folds_its_differences_and_names_the_peers_margin() {
        let (mut max_abs, mut max_logit) = (0.0f32, 0.0f32);
        // memra's argmax (index 1, the lowest of the tie) is the peer's token: agreement.
        let r = forced_row(
            &[0.0, 2.0, 2.0],
            &[0.5, 2.0, 1.0],
            1,
            &mut max_abs,
            &mut max_logit,
        );
        assert_eq!(r, None);
        assert_eq!((max_abs, max_logit), (1.0, 2.0));
        // The peer picked 2: a disagreement with the peer's top-2 margin (3.0 - 2.5).
        let r = forced_row(
            &[0.0, 2.0, 1.0],
            &[0.0, 2.5, 3.0],
            2,
            &mut max_abs,
            &mut max_logit,
        );
        assert_eq!(r, Some(0.5));
        assert_eq!((max_abs, max_logit), (2.0, 3.0));
        assert_eq!(f32s(&1.5f32.to_le_bytes()), vec![1.5]);
    }
}
