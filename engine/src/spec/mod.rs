//! Speculative decoding: drafters propose tokens, the target model checks K of them in one
//! ordinary step of K+1 rows, and a draft token is kept iff it equals the token plain decoding
//! picks at that position (EXACTNESS.md): the output is plain decoding's, byte for byte, for
//! greedy and seeded sampling alike.
//!
//! - [`Drafter`]: the one trait every drafter implements ([`ngram::NgramDrafter`],
//!   [`draft_model::DraftModelDrafter`], [`mtp::MtpDrafter`], and [`pick::PickDrafter`], which
//!   picks among others per sequence by measured acceptance).
//! - [`accept`]: the acceptance rule.
//! - [`control::MatchRates`]: the depth of a looked-up draft from the length of the match that
//!   proposed it.
//! - [`control::SpecControl`]: the per-sequence fallback (depth K, off and back on).
//! - [`traffic::TrafficStore`]: n-gram drafts from earlier requests' outputs (per model and
//!   scope: tenant and `cache_salt`), where a sequence's own context has no match.
//! - [`generate::generate_spec`]: one sequence, speculatively (run-gen, memra-verify).
//! - The engine loop (engine/worker.rs) drafts for many sequences at once and verifies them in
//!   the same step as plain sequences.

pub mod control;
pub mod draft_model;
pub mod generate;
pub mod mtp;
pub mod ngram;
pub mod pick;
pub mod traffic;

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
    /// The request's sampling. A model drafter picks each draft as the target will pick the
    /// token at that position ([`draft_pick`]: the same penalties, and for a sampled request
    /// the same keyed random number), so where its logits are close to the target's it
    /// proposes the token the target's sampler will draw, not only the most likely one.
    pub params: &'a crate::sampling::SamplingParams,
}

/// The candidates a sampled draft is drawn from (fewer when the request's top-k is smaller).
const DRAFT_CANDIDATES: usize = 64;

/// A model drafter's pick from its `logits` for the position after `tokens` and the drafts
/// before it (`drafted`), as plain decoding would pick there: the request's penalties over that
/// history, then for a greedy request the argmax, for a sampled one the draw keyed by (seed,
/// position) over the first [`DRAFT_CANDIDATES`] candidates (the request's top-k when smaller),
/// as the CUDA selection draws over the device's first candidates: the target's own draw
/// whenever its cut keeps no more of them, a close one otherwise. A full-vocabulary order per
/// draft would cost more host time than the draft saves. A draft only proposes: the target's
/// own pick decides, so this changes which drafts are accepted, never the output.
pub fn draft_pick(
    logits: &[f32],
    tokens: &[u32],
    drafted: &[u32],
    params: &crate::sampling::SamplingParams,
) -> u32 {
    use crate::sampling::{SamplingParams, apply_penalties, argmax, sample};
    let penalized = params.repetition_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0;
    let owned;
    let l: &[f32] = if penalized {
        let mut history = Vec::with_capacity(tokens.len() + drafted.len());
        history.extend_from_slice(tokens);
        history.extend_from_slice(drafted);
        let mut v = logits.to_vec();
        apply_penalties(&mut v, &history, params);
        owned = v;
        &owned
    } else {
        logits
    };
    if params.is_greedy() {
        return argmax(l);
    }
    let c = match params.top_k {
        0 => DRAFT_CANDIDATES,
        k => k.min(DRAFT_CANDIDATES),
    };
    let top = crate::generate::top_k(l, c);
    let vals: Vec<f32> = top.iter().map(|t| t.1).collect();
    let p = SamplingParams {
        top_k: 0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        ..params.clone()
    };
    let pos = (tokens.len() + drafted.len()) as u64;
    let j = sample(&vals, &[], &p, pos) as usize;
    top.get(j).map_or_else(|| argmax(l), |t| t.0)
}

/// Proposes draft tokens. A drafter may be wrong as often as it likes: wrong drafts cost time,
/// never output.
pub trait Drafter: Send {
    /// Short name (`ngram`, `draft:NAME`).
    fn name(&self) -> String;
    /// At most `k` tokens per request, in request order (an empty draft means plain decoding
    /// for that sequence this step). Drafting many sequences at once lets a model drafter batch.
    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>>;
    /// Whether [`Drafter::draft_matched`] reports the length of the suffix match behind each
    /// draft (a lookup drafter): the caller then asks for the deepest draft it allows and cuts
    /// each to the depth its match length earns ([`control::MatchRates`]).
    fn matches(&self) -> bool {
        false
    }
    /// [`Drafter::draft`] with, per draft, the length of the suffix match that proposed it:
    /// `None` for a drafter that does not look its drafts up (the default; its depth is the
    /// per-sequence controller's, [`control::SpecControl::depth`]).
    fn draft_matched(&mut self, reqs: &[DraftReq]) -> Result<Vec<(Vec<u32>, Option<usize>)>> {
        Ok(self.draft(reqs)?.into_iter().map(|d| (d, None)).collect())
    }
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
    /// Sequence `id`'s last draft was checked: `accepted` of the `drafted` tokens the step
    /// checked (it may have cut the draft) were accepted. Feedback for a drafter that picks
    /// among others.
    fn verified(&mut self, _id: u64, _drafted: usize, _accepted: usize) {}
    /// A drafter made of others: each part's name and counters (empty for a single drafter).
    fn parts(&self) -> Vec<(String, SpecCounts)> {
        Vec::new()
    }
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
    /// The best the model has, picked per sequence and step by measured acceptance
    /// ([`pick::PickDrafter`]): its MTP layers when it has them, the draft model when one is
    /// given, and n-gram prompt lookup (alone when the model has neither).
    Auto(Option<PathBuf>),
}

impl DrafterKind {
    /// The parse of [`std::str::FromStr`] written back (`ngram`, `mtp`, `draft:PATH`, `auto`,
    /// `auto+draft:PATH`).
    pub fn label(&self) -> String {
        match self {
            DrafterKind::Ngram => "ngram".into(),
            DrafterKind::Mtp => "mtp".into(),
            DrafterKind::Model(p) => format!("draft:{}", p.display()),
            DrafterKind::Auto(None) => "auto".into(),
            DrafterKind::Auto(Some(p)) => format!("auto+draft:{}", p.display()),
        }
    }
}

impl std::str::FromStr for DrafterKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ngram" => Ok(DrafterKind::Ngram),
            "mtp" => Ok(DrafterKind::Mtp),
            "auto" => Ok(DrafterKind::Auto(None)),
            _ => {
                let (auto, rest) = match s.strip_prefix("auto+") {
                    Some(r) => (true, r),
                    None => (false, s),
                };
                match rest.strip_prefix("draft:") {
                    Some(p) if !p.is_empty() && auto => {
                        Ok(DrafterKind::Auto(Some(PathBuf::from(p))))
                    }
                    Some(p) if !p.is_empty() => Ok(DrafterKind::Model(PathBuf::from(p))),
                    _ => Err(Error::Input(format!(
                        "speculative drafter `{s}`: expected ngram, mtp, draft:PATH, auto or \
                         auto+draft:PATH"
                    ))),
                }
            }
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
    /// A fixed cost of a draft row, in thousandths of a step, instead of the fit of measured
    /// step times: drafting that does not depend on the machine's timing (tests; `None` in the
    /// product).
    pub row_cost_permille: Option<u16>,
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
            row_cost_permille: None,
        })
    }

    /// memra-server's default for a model named without options: `auto` (the model's MTP
    /// layers if it has them, with n-gram lookup) at [`DEFAULT_K`] drafts.
    pub fn auto() -> SpecConfig {
        SpecConfig {
            drafter: DrafterKind::Auto(None),
            k: DEFAULT_K,
            max_batch: 16,
            row_cost_permille: None,
        }
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

/// The label of each match-length bucket of [`control::MatchRates`] (for /metrics).
pub const MATCH_LABELS: [&str; control::MATCH_BUCKETS] = ["1", "2", "3", "4+"];

/// Most draft tokens per step of memra-server's default configuration. 8: an n-gram draft's
/// depth follows the length of the match that proposed it, and long matches pay up to 8 drafts
/// (the offline replay of reports/spec/ngram-sampled-cpu.md, "Depth from the match length").
pub const DEFAULT_K: usize = 8;

/// A drafter opened for a target, with what the opening noticed (an `auto` drafter that left
/// out the model's MTP layers, and why).
pub struct Opened {
    pub drafter: Box<dyn Drafter>,
    pub notes: Vec<String>,
}

/// Why decode steps of sequences that may speculate checked no draft (counts of such
/// sequence-steps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecFallbacks {
    /// Low acceptance: the sequence backs off (plain steps, then a probe).
    pub backoff: u64,
    /// Load: at least `max_batch` sequences running, so nobody drafts.
    pub load: u64,
    /// No room: nothing left to draft before the request's `max_tokens` or the context end,
    /// or the step's token budget / the KV pool left no row for the draft.
    pub no_room: u64,
    /// The drafter proposed nothing (no n-gram match, no state for the MTP layer, ...).
    pub no_draft: u64,
    /// The drafter failed (the step decoded plainly).
    pub error: u64,
}

impl SpecFallbacks {
    /// (label, count) of each reason, for /metrics.
    pub fn labeled(&self) -> [(&'static str, u64); 5] {
        [
            ("backoff", self.backoff),
            ("load", self.load),
            ("no_room", self.no_room),
            ("no_draft", self.no_draft),
            ("error", self.error),
        ]
    }
}

/// Opens the drafter `cfg` names for the target `target` (whose tokenizer, when given, a draft
/// model's must equal); a draft model or MTP layer runs on `device`.
pub fn open_drafter(
    cfg: &SpecConfig,
    device: crate::backend::Device,
    threads: usize,
    target: &crate::models::ModelWeights,
    tokenizer: Option<&crate::tokenizer::Tokenizer>,
) -> Result<Opened> {
    let draft_model = |p: &std::path::Path| -> Result<Box<dyn Drafter>> {
        Ok(Box::new(draft_model::DraftModelDrafter::open_checked(
            p,
            device,
            threads,
            target.config.vocab,
            tokenizer,
        )?))
    };
    let mut notes = Vec::new();
    let drafter: Box<dyn Drafter> = match &cfg.drafter {
        DrafterKind::Ngram => Box::new(ngram::NgramDrafter::default()),
        DrafterKind::Model(p) => draft_model(p)?,
        DrafterKind::Mtp => Box::new(mtp::MtpDrafter::new(target, device, threads)?),
        DrafterKind::Auto(draft) => {
            let mut models: Vec<Box<dyn Drafter>> = Vec::new();
            if target.config.mtp_layers > 0 {
                match mtp::MtpDrafter::new(target, device, threads) {
                    Ok(d) => models.push(Box::new(d)),
                    Err(e) => notes.push(format!(
                        "the model has {} MTP layer(s) but its MTP drafter did not open ({e}): \
                         drafting without it",
                        target.config.mtp_layers
                    )),
                }
            }
            if let Some(p) = draft {
                models.push(draft_model(p)?);
            }
            if models.is_empty() {
                Box::new(ngram::NgramDrafter::default())
            } else {
                Box::new(pick::PickDrafter::new(models))
            }
        }
    };
    Ok(Opened { drafter, notes })
}

/// An error's message without the `invalid input: ` of [`Error::Input`] (for messages that
/// wrap it in context of their own).
pub fn bare(e: &Error) -> String {
    match e {
        Error::Input(m) => m.clone(),
        e => e.to_string(),
    }
}

/// Whether a draft model's tokenizer is the target's: the same number of ids and the same
/// entry for every id. `Err` says where they differ.
pub fn check_tokenizers(
    draft: &crate::tokenizer::Tokenizer,
    target: &crate::tokenizer::Tokenizer,
) -> std::result::Result<(), String> {
    let (n, m) = (draft.vocab_size(), target.vocab_size());
    if n != m {
        return Err(format!(
            "its tokenizer has {n} tokens, the target's {m}: a draft model must share the \
             target's tokenizer"
        ));
    }
    let differ: Vec<u32> = (0..n as u32)
        .filter(|&id| draft.token_text(id) != target.token_text(id))
        .collect();
    if let Some(&id) = differ.first() {
        return Err(format!(
            "its tokenizer differs from the target's at {} of {n} tokens (first: id {id} is {:?}, \
             the target's {:?}): a draft model must share the target's tokenizer",
            differ.len(),
            draft.token_text(id).unwrap_or_default(),
            target.token_text(id).unwrap_or_default()
        ));
    }
    Ok(())
}

/// The checks of a draft model's path that need no model loaded: it exists, and it is a
/// readable file (GGUF magic) or a folder with a `config.json`. For a refusal before loading
/// the target; the error does not repeat the path.
pub fn check_draft_path(path: &std::path::Path) -> Result<()> {
    let unreadable = |e: std::io::Error| Error::Input(format!("cannot read it: {e}"));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if meta.is_dir() {
        std::fs::File::open(path.join("config.json")).map_err(|e| {
            Error::Input(format!(
                "a folder without a readable config.json (an HF model folder has one): {e}"
            ))
        })?;
        return Ok(());
    }
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(unreadable)?;
    std::io::Read::read_exact(&mut f, &mut magic).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            Error::Input("it is shorter than a GGUF header (empty?)".into())
        }
        _ => unreadable(e),
    })?;
    if &magic != b"GGUF" {
        return Err(Error::Input(format!(
            "not a GGUF file (it starts with {magic:02x?}) nor an HF model folder"
        )));
    }
    Ok(())
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
    fn draft_pick_is_the_targets_pick_within_its_candidates() {
        use crate::sampling::{SamplingParams, sample};
        // Every value five times: ties are broken by id on both sides.
        let logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919 % 1000) as f32) * 0.01 - 5.0)
            .collect();
        let tokens = [3u32, 17, 17, 4000, 999];
        for (t, k, rep) in [(0.0, 0, 1.0), (0.0, 0, 1.3), (0.8, 40, 1.0), (1.2, 10, 1.1)] {
            let p = SamplingParams {
                temperature: t,
                top_k: k,
                repetition_penalty: rep,
                seed: 9,
                ..SamplingParams::GREEDY
            };
            for d in 0..20u32 {
                let drafted = vec![d * 250; (d % 3) as usize];
                let mut h = tokens.to_vec();
                h.extend_from_slice(&drafted);
                assert_eq!(
                    draft_pick(&logits, &tokens, &drafted, &p),
                    sample(&logits, &h, &p, h.len() as u64),
                    "t {t} k {k} rep {rep} draft {d}"
                );
            }
        }
    }

    #[test]
    fn drafter_kind_parses_and_refuses() {
        assert_eq!("ngram".parse::<DrafterKind>().unwrap(), DrafterKind::Ngram);
        assert_eq!(
            "draft:/m/a.gguf".parse::<DrafterKind>().unwrap(),
            DrafterKind::Model("/m/a.gguf".into())
        );
        let e = "draft:".parse::<DrafterKind>().unwrap_err().to_string();
        assert!(e.contains("ngram, mtp, draft:PATH, auto"), "{e}");
        assert_eq!(
            "auto".parse::<DrafterKind>().unwrap(),
            DrafterKind::Auto(None)
        );
        let a = "auto+draft:/m/d.gguf".parse::<DrafterKind>().unwrap();
        assert_eq!(a, DrafterKind::Auto(Some("/m/d.gguf".into())));
        assert_eq!(a.label(), "auto+draft:/m/d.gguf");
        assert!("auto+ngram".parse::<DrafterKind>().is_err());
        assert_eq!("mtp".parse::<DrafterKind>().unwrap(), DrafterKind::Mtp);
        assert!("mtp2".parse::<DrafterKind>().is_err());
        assert!(SpecConfig::new(DrafterKind::Ngram, 0).is_err());
        assert!(SpecConfig::new(DrafterKind::Ngram, MAX_K + 1).is_err());
    }
}
