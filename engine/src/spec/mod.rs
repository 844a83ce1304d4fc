//! Speculative decoding: drafters propose tokens, the target model checks K of them in one
//! ordinary step of K+1 rows, and a draft token is kept iff it equals the token plain decoding
//! picks at that position (EXACTNESS.md): the output is plain decoding's, byte for byte, for
//! greedy and seeded sampling alike.
//!
//! - [`Drafter`]: the one trait every drafter implements ([`ngram::NgramDrafter`],
//!   [`draft_model::DraftModelDrafter`]).
//! - [`accept`]: the acceptance rule.
//! - [`control::SpecControl`]: the per-sequence fallback (depth K, off and back on).
//! - [`generate::generate_spec`]: one sequence, speculatively (run-gen, memra-verify).
//! - The engine loop (engine/worker.rs) drafts for many sequences at once and verifies them in
//!   the same step as plain sequences.

pub mod control;
pub mod draft_model;
pub mod generate;
pub mod mtp;
pub mod ngram;

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Most draft tokens checked per step.
pub const MAX_K: usize = 16;

/// One sequence's draft request: propose up to `k` tokens following `tokens`.
#[derive(Clone, Copy, Debug)]
pub struct DraftReq<'a> {
    /// The sequence (a drafter with per-sequence state keys it by this).
    pub id: u64,
    /// Prompt and generated tokens so far.
    pub tokens: &'a [u32],
    pub k: usize,
}

/// Proposes draft tokens. A drafter may be wrong as often as it likes: wrong drafts cost time,
/// never output.
pub trait Drafter: Send {
    /// Short name (`ngram`, `draft:NAME`).
    fn name(&self) -> String;
    /// At most `k` tokens per request, in request order (an empty draft means plain decoding
    /// for that sequence this step). Drafting many sequences at once lets a model drafter batch.
    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>>;
    /// The sequence ended: drop its state.
    fn forget(&mut self, _id: u64) {}
    /// Whether the drafter reads the target's final hidden states (an MTP drafter): the
    /// caller then keeps them ([`crate::backend::Backend::keep_hidden`]) and hands every
    /// step's rows of each sequence to [`Drafter::observe`].
    fn wants_hidden(&self) -> bool {
        false
    }
    /// The target's hidden states of rows of sequence `id` (the row's token and position; the
    /// row's `seq` is the step's, not meaningful here), in position order, as a step computed
    /// them: rows of drafts the target went on to reject included (the drafter keeps the rows
    /// its next request's tokens agree with).
    fn observe(&mut self, _id: u64, _rows: &[(crate::backend::StepRow, Vec<f32>)]) {}
}

/// Which drafter a model uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrafterKind {
    /// Prompt lookup: no weights.
    Ngram,
    /// A smaller model with the same tokenizer.
    Model(PathBuf),
    /// The target's own multi-token-prediction layer (models/mtp.rs).
    Mtp,
}

impl std::str::FromStr for DrafterKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ngram" => Ok(DrafterKind::Ngram),
            "mtp" => Ok(DrafterKind::Mtp),
            _ => match s.strip_prefix("draft:") {
                Some(p) if !p.is_empty() => Ok(DrafterKind::Model(PathBuf::from(p))),
                _ => Err(Error::Input(format!(
                    "speculative drafter `{s}`: expected ngram, mtp or draft:PATH"
                ))),
            },
        }
    }
}

/// Speculative decoding settings of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    pub drafter: DrafterKind,
    /// Most draft tokens per sequence and step (1..=MAX_K).
    pub k: usize,
    /// Running sequences at or above which the engine drafts for nobody (plain batched decode
    /// fills the device better there).
    pub max_batch: usize,
}

impl SpecConfig {
    pub fn new(drafter: DrafterKind, k: usize) -> Result<SpecConfig> {
        if !(1..=MAX_K).contains(&k) {
            return Err(Error::Input(format!("spec_k = {k}: expected 1..={MAX_K}")));
        }
        Ok(SpecConfig {
            drafter,
            k,
            max_batch: 16,
        })
    }
}

/// How many leading drafts are accepted: `picks[j]` is the token the target picks (exactly as
/// plain decoding does) at the position of `drafts[j]`, given every earlier draft. Draft `j` is
/// accepted iff it equals `picks[j]` and every earlier draft was accepted. The tokens emitted are
/// `picks[..=accepted]` (`picks` has one more entry than `drafts`).
pub fn accept(drafts: &[u32], picks: &[u32]) -> usize {
    drafts.iter().zip(picks).take_while(|(d, p)| d == p).count()
}

/// Counters of speculation (per request, per model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    /// Draft tokens checked.
    pub drafted: u64,
    /// Draft tokens accepted (emitted without a step of their own).
    pub accepted: u64,
    /// Verify steps (steps that checked at least one draft).
    pub steps: u64,
}

impl SpecCounts {
    pub fn add(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.steps += u64::from(drafted > 0);
    }
}

/// Opens the drafter `cfg` names for the target `target`; a draft model runs on `device`.
pub fn open_drafter(
    cfg: &SpecConfig,
    device: crate::backend::Device,
    threads: usize,
    target: &crate::models::ModelWeights,
) -> Result<Box<dyn Drafter>> {
    match &cfg.drafter {
        DrafterKind::Ngram => Ok(Box::new(ngram::NgramDrafter::default())),
        DrafterKind::Model(p) => Ok(Box::new(draft_model::DraftModelDrafter::open(
            p,
            device,
            threads,
            target.config.vocab,
        )?)),
        DrafterKind::Mtp => Ok(Box::new(mtp::MtpDrafter::new(target, device, threads)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_counts_leading_matches_only() {
        assert_eq!(accept(&[], &[5]), 0);
        assert_eq!(accept(&[5, 6, 7], &[5, 6, 7, 8]), 3);
        assert_eq!(accept(&[5, 9, 7], &[5, 6, 7, 8]), 1);
        assert_eq!(accept(&[4, 6, 7], &[5, 6, 7, 8]), 0);
    }

    #[test]
    fn drafter_kind_parses_and_refuses() {
        assert_eq!("ngram".parse::<DrafterKind>().unwrap(), DrafterKind::Ngram);
        assert_eq!(
            "draft:/m/a.gguf".parse::<DrafterKind>().unwrap(),
            DrafterKind::Model("/m/a.gguf".into())
        );
        let e = "draft:".parse::<DrafterKind>().unwrap_err().to_string();
        assert!(e.contains("ngram, mtp or draft:PATH"), "{e}");
        assert_eq!("mtp".parse::<DrafterKind>().unwrap(), DrafterKind::Mtp);
        assert!("mtp2".parse::<DrafterKind>().is_err());
        assert!(SpecConfig::new(DrafterKind::Ngram, 0).is_err());
        assert!(SpecConfig::new(DrafterKind::Ngram, MAX_K + 1).is_err());
    }
}
