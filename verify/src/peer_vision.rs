//! `memra-verify peer-vision`: memra's image input against llama.cpp's multimodal library
//! (mtmd) on the same text GGUF, mmproj GGUF and images (docs/VERIFY.md "Against llama.cpp
//! mtmd"). llama.cpp's side comes from tools/peer/mtmd.py (a JSON file and three binary files
//! beside it: the images' RGB bytes, mtmd's embeddings of each image, the logit rows of its
//! greedy steps); memra's side is computed here:
//!
//! - embeddings: memra's tower ([`VisionTower::encode`], CPU f32) on the same RGB bytes, per
//!   image max |memra - mtmd| and that over max |mtmd|, within a tolerance;
//! - greedy: each image prompt (the peer's text ids around the image's rows) served by a memra
//!   engine, greedy for as many tokens as the peer generated: the sequences must be equal;
//! - teacher-forced: the prompt and the peer's continuation fed to memra in one step (memra's
//!   image rows injected): top-1 agreement with the peer's picks at every generated position and
//!   the largest logit difference (informative; a near-tie may flip).

use std::path::Path;
use std::sync::Arc;

use memra_engine::backend::{Backend, Device, RowEmbed, StepBatch, StepRow};
use memra_engine::error::{Error, Result};
use memra_engine::vision::{ImageTokens, VisionTower};

use crate::peer_logits::{f32s, forced_row};
use crate::vision::{Prompt, engine, request, run};

/// The default bound on max |memra - mtmd| / max |mtmd| over one image's embeddings: ggml's
/// CPU GELU reads a table of f16 values at the f16-rounded input (2^-11 relative twice), which
/// memra's f32 tanh-GELU does not (docs/VERIFY.md "Against llama.cpp mtmd").
pub const EMBED_TOL: f32 = 2e-3;

/// One image prompt of the peer's file.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct PeerCase {
    /// Text ids before the image's rows.
    pub before: Vec<u32>,
    /// Index of the image (in the images file).
    pub image: usize,
    /// Text ids after the image's rows.
    pub after: Vec<u32>,
    /// The peer's greedy tokens.
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct PeerFiles {
    images: String,
    embeddings: String,
    logits: String,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct PeerHeader {
    peer: String,
    vocab: usize,
    width: usize,
    image_size: usize,
    tokens_per_image: usize,
    images: usize,
    files: PeerFiles,
    cases: Vec<PeerCase>,
}

/// The peer's file and the binary files it names, checked for size.
#[derive(Clone, Debug)]
pub struct PeerVision {
    pub peer: String,
    pub vocab: usize,
    pub width: usize,
    pub image_size: usize,
    pub tokens_per_image: usize,
    /// RGB bytes of each image (`image_size^2 x 3`).
    pub images: Vec<Vec<u8>>,
    /// mtmd's rows of each image (`tokens_per_image x width`).
    pub embeds: Vec<Vec<f32>>,
    pub cases: Vec<PeerCase>,
    /// The logit row behind each greedy token, case after case (`vocab` each).
    pub logits: Vec<f32>,
}

impl PeerVision {
    /// Reads `json` and the files it names (beside it).
    pub fn open(json: &Path) -> Result<PeerVision> {
        let bad = |what: String| Error::Input(format!("{}: {what}", json.display()));
        let text = std::fs::read_to_string(json).map_err(|e| bad(e.to_string()))?;
        let h: PeerHeader = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let read = |name: &str| {
            let p = json.with_file_name(name);
            std::fs::read(&p).map_err(|e| bad(format!("{}: {e}", p.display())))
        };
        let (img, emb, log) = (
            read(&h.files.images)?,
            read(&h.files.embeddings)?,
            read(&h.files.logits)?,
        );
        PeerVision::parse(&text, &img, &emb, &log).map_err(|e| bad(e.to_string()))
    }

    /// The peer's data from the JSON text and the three files' bytes: every size and index
    /// checked (a truncated or foreign file is an error, never a panic).
    pub fn parse(json: &str, images: &[u8], embeds: &[u8], logits: &[u8]) -> Result<PeerVision> {
        let h: PeerHeader =
            serde_json::from_str(json).map_err(|e| Error::Input(format!("JSON: {e}")))?;
        let bad = |w: String| Err(Error::Input(w));
        let px = h.image_size * h.image_size * 3;
        let rows = h.tokens_per_image * h.width;
        if h.images == 0 || px == 0 || rows == 0 || h.vocab == 0 {
            return bad(format!(
                "{} images of {}x{}, {} rows of {}, vocabulary {}: nothing to compare",
                h.images, h.image_size, h.image_size, h.tokens_per_image, h.width, h.vocab
            ));
        }
        if images.len() != h.images * px {
            return bad(format!(
                "the images file holds {} bytes, expected {} images of {px}",
                images.len(),
                h.images
            ));
        }
        if embeds.len() != h.images * rows * 4 {
            return bad(format!(
                "the embeddings file holds {} bytes, expected {} images x {} rows x {} f32",
                embeds.len(),
                h.images,
                h.tokens_per_image,
                h.width
            ));
        }
        let steps: usize = h.cases.iter().map(|c| c.tokens.len()).sum();
        if logits.len() != steps * h.vocab * 4 {
            return bad(format!(
                "the logits file holds {} bytes, expected {steps} rows of {} f32",
                logits.len(),
                h.vocab
            ));
        }
        for (i, c) in h.cases.iter().enumerate() {
            if c.image >= h.images {
                return bad(format!("case {i} names image {} of {}", c.image, h.images));
            }
            if c.tokens.is_empty() {
                return bad(format!("case {i} has no generated tokens"));
            }
            let ids = c.before.iter().chain(&c.after).chain(&c.tokens);
            if let Some(t) = ids.copied().find(|&t| t as usize >= h.vocab) {
                return bad(format!(
                    "case {i}: token {t} is outside the vocabulary of {}",
                    h.vocab
                ));
            }
        }
        Ok(PeerVision {
            images: images.chunks_exact(px).map(<[u8]>::to_vec).collect(),
            embeds: embeds.chunks_exact(rows * 4).map(f32s).collect(),
            logits: f32s(logits),
            peer: h.peer,
            vocab: h.vocab,
            width: h.width,
            image_size: h.image_size,
            tokens_per_image: h.tokens_per_image,
            cases: h.cases,
        })
    }
}

/// How far memra's embeddings of one image are from the peer's.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EmbedDiff {
    pub max_abs: f32,
    /// max |peer|: the scale of `max_abs`.
    pub max_peer: f32,
    /// `max_abs / max_peer` (infinite when the lengths differ, NaN when a value is).
    pub rel: f32,
}

/// Compares two images' embedding rows.
pub fn embed_diff(ours: &[f32], peer: &[f32]) -> EmbedDiff {
    if ours.len() != peer.len() {
        return EmbedDiff {
            rel: f32::INFINITY,
            ..EmbedDiff::default()
        };
    }
    let mut d = EmbedDiff::default();
    for (a, b) in ours.iter().zip(peer) {
        let e = (a - b).abs();
        // NaN propagates (f32::max would drop it).
        d.max_abs = if e.is_nan() || d.max_abs.is_nan() {
            f32::NAN
        } else {
            d.max_abs.max(e)
        };
        d.max_peer = d.max_peer.max(b.abs());
    }
    d.rel = d.max_abs / d.max_peer.max(1e-30);
    d
}

/// The first index where two token sequences differ (a shorter one differs where it ends).
pub fn first_divergence(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// Where memra's greedy sequence of one prompt first left the peer's.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Divergence {
    pub prompt: usize,
    pub step: usize,
    pub memra: Option<u32>,
    pub peer: Option<u32>,
}

/// What the comparison found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PeerVisionReport {
    pub peer: String,
    pub image_size: usize,
    pub tokens_per_image: usize,
    pub width: usize,
    pub tolerance: f32,
    pub embeds: Vec<EmbedDiff>,
    pub prompts: usize,
    /// Greedy steps per prompt (the peer's).
    pub steps: usize,
    pub sequences_equal: usize,
    pub divergences: Vec<Divergence>,
    /// Teacher-forced positions and those whose memra argmax is the peer's pick.
    pub forced_positions: usize,
    pub forced_agree: usize,
    pub max_logit_diff: f32,
    pub max_logit: f32,
    /// (prompt, step, the peer's top-1 minus top-2 margin) of each teacher-forced disagreement.
    pub forced_disagreements: Vec<(usize, usize, f32)>,
    /// Set when the model's sliding window is shorter than an image: llama.cpp then masks
    /// image rows further back than the window on the local layers, HF (and memra) do not.
    pub window_note: Option<String>,
    pub failures: Vec<String>,
}

/// The note of [`PeerVisionReport::window_note`] for a model's sliding window and an image's rows.
pub fn window_note(window: Option<usize>, rows: usize) -> Option<String> {
    let w = window.filter(|&w| w < rows)?;
    Some(format!(
        "the model's sliding window ({w}) is shorter than an image ({rows} rows): on the local \
         layers llama.cpp masks an image row's keys more than {w} positions back inside the \
         image, HF's Gemma 3 and memra let it see the whole image, so the two differ by \
         definition (write the model with `memra-bench synth --sliding-window {rows}` or more)"
    ))
}

/// Runs the comparison: the tower `mmproj` on the CPU, the engine and `b` (a backend of the
/// same text model) on `device`.
pub fn check(
    b: &mut dyn Backend,
    model: &Path,
    mmproj: &Path,
    peer: &Path,
    device: Device,
    tolerance: f32,
) -> Result<PeerVisionReport> {
    let p = PeerVision::open(peer)?;
    let tower = VisionTower::open(mmproj)?;
    let m = memra_engine::loader::load_model(model)?;
    let (size, rows, width) = (
        tower.image_size(),
        tower.tokens_per_image(),
        tower.out_width(),
    );
    let mismatch = |what: &str, ours: usize, theirs: usize| {
        Error::Input(format!(
            "peer-vision: {what} is {ours} here and {theirs} in {} (other files?)",
            peer.display()
        ))
    };
    for (what, ours, theirs) in [
        ("the image size", size, p.image_size),
        ("the rows per image", rows, p.tokens_per_image),
        ("the embedding width", width, p.width),
        ("the model's width", m.config.hidden, p.width),
        ("the vocabulary", m.config.vocab, p.vocab),
        ("the backend's vocabulary", b.config().vocab, p.vocab),
    ] {
        if ours != theirs {
            return Err(mismatch(what, ours, theirs));
        }
    }
    let mut rep = PeerVisionReport {
        peer: p.peer.clone(),
        image_size: size,
        tokens_per_image: rows,
        width,
        tolerance,
        prompts: p.cases.len(),
        steps: p.cases.iter().map(|c| c.tokens.len()).max().unwrap_or(0),
        window_note: window_note(m.config.gemma3.map(|g| g.sliding_window), rows),
        ..Default::default()
    };
    // (a) embeddings
    let ours: Vec<Arc<[f32]>> = p
        .images
        .iter()
        .map(|img| tower.encode(img).map(Arc::from))
        .collect::<Result<_>>()?;
    for (i, (o, t)) in ours.iter().zip(&p.embeds).enumerate() {
        let d = embed_diff(o, t);
        if d.rel.is_nan() || d.rel > tolerance {
            rep.failures.push(format!(
                "image {i}: embeddings differ from mtmd's by {:.2e} ({:.2e} of the largest, \
                 tolerance {tolerance:.0e})",
                d.max_abs, d.rel
            ));
        }
        rep.embeds.push(d);
    }
    // (b) greedy sequences through a memra engine
    let soft = ImageTokens::from_tokenizer(&m.tokenizer).soft;
    let prompts: Vec<Prompt> = p
        .cases
        .iter()
        .map(|c| {
            let mut ids = c.before.clone();
            ids.extend(std::iter::repeat_n(soft, rows));
            ids.extend(&c.after);
            Prompt {
                ids,
                start: c.before.len(),
                grid: None,
            }
        })
        .collect();
    let longest = prompts.iter().map(|q| q.ids.len()).max().unwrap_or(0);
    let e = engine(m, device, 64.max(longest + 8))?;
    for (i, (c, q)) in p.cases.iter().zip(&prompts).enumerate() {
        let media = (ours[c.image].clone(), tower.hash(&p.images[c.image]));
        let got: Vec<u32> = run(&e, request(q, Some(media), width, c.tokens.len()))?
            .0
            .iter()
            .map(|t| t.0)
            .collect();
        match first_divergence(&got, &c.tokens) {
            None => rep.sequences_equal += 1,
            Some(step) => {
                rep.failures.push(format!(
                    "prompt {i}: greedy tokens leave llama.cpp's at step {step} (memra {:?}, \
                     llama.cpp {:?})",
                    got.get(step),
                    c.tokens.get(step)
                ));
                rep.divergences.push(Divergence {
                    prompt: i,
                    step,
                    memra: got.get(step).copied(),
                    peer: c.tokens.get(step).copied(),
                });
            }
        }
    }
    drop(e);
    // (c) teacher-forced logits on the backend
    forced(b, &p, &prompts, &ours, &mut rep)?;
    Ok(rep)
}

/// Feeds each prompt and the peer's continuation to `b` in one step and compares the logits
/// at every generated position with the peer's.
fn forced(
    b: &mut dyn Backend,
    p: &PeerVision,
    prompts: &[Prompt],
    ours: &[Arc<[f32]>],
    rep: &mut PeerVisionReport,
) -> Result<()> {
    let bs = b.kv_block_size();
    let vocab = p.vocab;
    let rows = p.tokens_per_image;
    let mut row_i = 0;
    for (ci, (c, q)) in p.cases.iter().zip(prompts).enumerate() {
        let ids: Vec<u32> = q
            .ids
            .iter()
            .chain(&c.tokens[..c.tokens.len() - 1])
            .copied()
            .collect();
        let first = q.ids.len() - 1;
        let span = q.start as u32..(q.start + rows) as u32;
        let batch = StepBatch {
            rows: ids
                .iter()
                .enumerate()
                .map(|(pos, &token)| StepRow {
                    token,
                    pos: pos as u32,
                    seq: 0,
                    want_logits: pos >= first,
                })
                .collect(),
            block_tables: vec![(0..ids.len().div_ceil(bs) as u32).collect()],
            state_slots: Vec::new(),
            embeds: (0..rows)
                .map(|r| RowEmbed {
                    row: q.start + r,
                    values: ours[c.image].clone(),
                    index: r,
                    width: b.config().embed_width(),
                    span: span.clone(),
                })
                .collect(),
            mrope: Vec::new(),
        };
        let out = b.step(&batch)?;
        for (si, got) in out.logits.iter().enumerate() {
            let want = &p.logits[row_i * vocab..(row_i + 1) * vocab];
            row_i += 1;
            rep.forced_positions += 1;
            let (diff, max) = (&mut rep.max_logit_diff, &mut rep.max_logit);
            match forced_row(got, want, c.tokens[si], diff, max) {
                None => rep.forced_agree += 1,
                Some(margin) => rep.forced_disagreements.push((ci, si, margin)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(images: usize, cases: &str) -> String {
        format!(
            r#"{{"peer":"test","vocab":10,"width":2,"image_size":1,"tokens_per_image":2,
            "images":{images},"files":{{"images":"a","embeddings":"b","logits":"c"}},
            "cases":[{cases}]}}"#
        )
    }

    const CASE: &str = r#"{"before":[1,2],"image":0,"after":[3],"tokens":[4,5]}"#;

    #[test]
    fn parse_checks_sizes_and_ids() {
        let (img, emb, log) = (vec![7u8; 3], vec![0u8; 16], vec![0u8; 2 * 10 * 4]);
        let p = PeerVision::parse(&json(1, CASE), &img, &emb, &log).unwrap();
        assert_eq!(
            (p.images.len(), p.embeds[0].len(), p.logits.len()),
            (1, 4, 20)
        );
        assert_eq!(p.cases[0].tokens, vec![4, 5]);
        // a truncated file of each kind, an image out of range, a token outside the vocabulary
        assert!(PeerVision::parse(&json(1, CASE), &img[..2], &emb, &log).is_err());
        assert!(PeerVision::parse(&json(1, CASE), &img, &emb[..12], &log).is_err());
        assert!(PeerVision::parse(&json(1, CASE), &img, &emb, &log[4..]).is_err());
        let far = CASE.replace("\"image\":0", "\"image\":1");
        assert!(PeerVision::parse(&json(1, &far), &img, &emb, &log).is_err());
        let big = CASE.replace("[4,5]", "[4,10]");
        assert!(PeerVision::parse(&json(1, &big), &img, &emb, &log).is_err());
        assert!(PeerVision::parse("{", &img, &emb, &log).is_err());
    }

    #[test]
    fn embed_diff_is_relative_and_keeps_nan() {
        let d = embed_diff(&[1.0, -2.0, 0.5], &[1.0, -2.001, 0.5]);
        assert!((d.max_abs - 0.001).abs() < 1e-6 && d.max_peer == 2.001);
        assert!((d.rel - 0.001 / 2.001).abs() < 1e-6);
        assert!(embed_diff(&[f32::NAN, 0.0], &[0.0, 1.0]).rel.is_nan());
        assert!(embed_diff(&[1.0], &[1.0, 2.0]).rel.is_infinite());
        assert_eq!(embed_diff(&[3.0, 4.0], &[3.0, 4.0]).rel, 0.0);
    }

    #[test]
    fn first_divergence_finds_the_step() {
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_divergence(&[1, 2], &[1, 2, 3]), Some(2));
    }

    #[test]
    fn window_note_only_for_windows_shorter_than_an_image() {
        assert!(window_note(Some(4), 16).is_some_and(|n| n.contains("(4)")));
        assert_eq!(window_note(Some(16), 16), None);
        assert_eq!(window_note(None, 16), None);
    }
}
