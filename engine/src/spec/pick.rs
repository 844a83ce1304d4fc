//! Several drafters behind one: per sequence and per step, the one whose drafts are being
//! accepted best drafts. Built for memra-server's default (`auto`): the model's own drafters
//! (its MTP layers, a draft model) and n-gram prompt lookup side by side.
//!
//! Each sequence keeps a decayed acceptance estimate per drafter (`p`: the chance a draft is
//! accepted given the one before it was, as [`super::control::SpecControl`] measures it). The
//! drafter that drafted learns from the verify step ([`Drafter::verified`]). n-gram lookup costs
//! nothing, so while a model drafter drafts, the n-gram proposal is still made and scored
//! against the tokens that followed (a shadow draft): its estimate stays current. Each step the
//! n-gram proposal drafts when it has one and its estimate is within [`NGRAM_MARGIN`] of the
//! best model drafter's (it costs no drafting time); otherwise the best model drafter drafts,
//! and when it has nothing (an MTP drafter missing a prefix-cached prompt's states, a draft
//! model's pool short) the n-gram proposal stands in. Which drafter drafts never changes
//! output: every draft is checked against plain decoding's pick.

use std::collections::HashMap;

use super::ngram::NgramDrafter;
use super::{DraftReq, Drafter, SpecCounts};
use crate::error::Result;

/// n-gram lookup drafts while its acceptance estimate is at least the best model drafter's
/// less this (it costs no drafting time).
pub const NGRAM_MARGIN: f32 = 0.05;
/// Weight a step's evidence keeps per later step.
const DECAY: f32 = 0.7;
/// Prior (hits, tries) of a model drafter and of n-gram lookup.
const MODEL_PRIOR: (f32, f32) = (0.7, 1.0);
const NGRAM_PRIOR: (f32, f32) = (0.5, 1.0);

/// One sequence's choice.
#[derive(Clone, Debug)]
struct Pick {
    /// Decayed (hits, tries) per part: the model drafters, then n-gram.
    rate: Vec<(f32, f32)>,
    /// The part whose draft the next verify step checks.
    last: Option<usize>,
    /// The n-gram proposal made while a model drafter drafted: (sequence length then, tokens).
    shadow: Option<(usize, Vec<u32>)>,
}

impl Pick {
    fn p(&self, part: usize) -> f32 {
        let (h, t) = self.rate[part];
        if t > 0.0 { h / t } else { 0.0 }
    }

    fn learn(&mut self, part: usize, hits: usize, tries: usize) {
        let r = &mut self.rate[part];
        r.0 = DECAY * r.0 + hits as f32;
        r.1 = DECAY * r.1 + tries as f32;
    }
}

/// Model drafters and n-gram lookup, picked per sequence by measured acceptance.
pub struct PickDrafter {
    models: Vec<Box<dyn Drafter>>,
    ngram: NgramDrafter,
    seqs: HashMap<u64, Pick>,
    /// Counters per part (models, then n-gram): drafts checked and accepted.
    counts: Vec<SpecCounts>,
}

impl PickDrafter {
    /// `models` in order of preference (ties go to the first), with n-gram lookup beside them.
    pub fn new(models: Vec<Box<dyn Drafter>>) -> PickDrafter {
        let n = models.len() + 1;
        PickDrafter {
            models,
            ngram: NgramDrafter::default(),
            seqs: HashMap::new(),
            counts: vec![SpecCounts::default(); n],
        }
    }

    fn ngram_part(&self) -> usize {
        self.models.len()
    }

    fn part_name(&self, part: usize) -> String {
        self.models
            .get(part)
            .map_or_else(|| self.ngram.name(), |m| m.name())
    }

    /// Which part drafts sequence `id` next (tests): `None` before its first draft.
    pub fn last_part(&self, id: u64) -> Option<String> {
        let p = self.seqs.get(&id)?.last?;
        Some(self.part_name(p))
    }

    /// The acceptance estimate of each part for sequence `id` (tests).
    pub fn rates(&self, id: u64) -> Vec<(String, f32)> {
        let Some(s) = self.seqs.get(&id) else {
            return Vec::new();
        };
        (0..self.counts.len())
            .map(|i| (self.part_name(i), s.p(i)))
            .collect()
    }
}

/// Leading agreement of a proposal made at length `at` with the tokens that followed:
/// (hits, tries) as [`super::control::SpecControl`] counts them.
fn score(proposal: &[u32], followed: &[u32]) -> (usize, usize) {
    let n = proposal.len().min(followed.len());
    let m = proposal
        .iter()
        .zip(followed)
        .take(n)
        .take_while(|(a, b)| a == b)
        .count();
    (m, m + usize::from(m < n))
}

impl Drafter for PickDrafter {
    fn name(&self) -> String {
        let mut parts: Vec<String> = self.models.iter().map(|m| m.name()).collect();
        parts.push(self.ngram.name());
        parts.join("+")
    }

    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
        let ng = self.ngram_part();
        let nparts = ng + 1;
        let mut out = vec![Vec::new(); reqs.len()];
        // Per model part: the requests it drafts (index into `reqs`).
        let mut asks: Vec<Vec<usize>> = vec![Vec::new(); ng];
        let mut props: Vec<Vec<u32>> = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            let s = self.seqs.entry(r.id).or_insert_with(|| Pick {
                rate: (0..nparts)
                    .map(|p| if p == ng { NGRAM_PRIOR } else { MODEL_PRIOR })
                    .collect(),
                last: None,
                shadow: None,
            });
            if let Some((at, shadow)) = s.shadow.take()
                && r.tokens.len() > at
            {
                let (h, t) = score(&shadow, &r.tokens[at..]);
                s.learn(ng, h, t);
            }
            let prop = self.ngram.propose(r.tokens, r.k);
            let best = (0..ng).fold(None::<usize>, |b, p| match b {
                Some(q) if s.p(q) >= s.p(p) => Some(q),
                _ => Some(p),
            });
            let use_ngram = match best {
                None => true,
                Some(b) => !prop.is_empty() && s.p(ng) + NGRAM_MARGIN >= s.p(b),
            };
            match best {
                Some(b) if !use_ngram => {
                    asks[b].push(i);
                    s.last = Some(b);
                    if !prop.is_empty() {
                        s.shadow = Some((r.tokens.len(), prop.clone()));
                    }
                }
                _ => {
                    s.last = (!prop.is_empty()).then_some(ng);
                }
            }
            props.push(prop);
        }
        for (part, idx) in asks.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let sub: Vec<DraftReq> = idx.iter().map(|&i| reqs[i]).collect();
            let got = self.models[part].draft(&sub)?;
            for (&i, d) in idx.iter().zip(got) {
                out[i] = d;
            }
        }
        for (i, r) in reqs.iter().enumerate() {
            if out[i].is_empty() {
                // n-gram's turn, or it stands in for a model drafter that had nothing.
                let prop = std::mem::take(&mut props[i]);
                if let Some(s) = self.seqs.get_mut(&r.id) {
                    s.last = (!prop.is_empty()).then_some(ng);
                    s.shadow = None;
                }
                out[i] = prop;
            }
        }
        Ok(out)
    }

    fn verified(&mut self, id: u64, drafted: usize, accepted: usize) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let Some(part) = s.last.take() else {
            return;
        };
        if drafted == 0 {
            return;
        }
        s.learn(part, accepted, accepted + usize::from(accepted < drafted));
        self.counts[part].add(drafted, accepted);
        if let Some(m) = self.models.get_mut(part) {
            m.verified(id, drafted, accepted);
        }
    }

    fn parts(&self) -> Vec<(String, SpecCounts)> {
        (0..self.counts.len())
            .map(|i| (self.part_name(i), self.counts[i]))
            .collect()
    }

    fn forget(&mut self, id: u64) {
        self.seqs.remove(&id);
        for m in &mut self.models {
            m.forget(id);
        }
    }

    fn wants_hidden(&self) -> bool {
        self.models.iter().any(|m| m.wants_hidden())
    }

    fn observe(&mut self, id: u64, rows: &[(crate::backend::StepRow, Vec<f32>)]) {
        for m in &mut self.models {
            if m.wants_hidden() {
                m.observe(id, rows);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drafts a fixed continuation of a known sequence: `truth[len..len + k]`.
    struct Oracle {
        truth: Vec<u32>,
        calls: usize,
    }

    impl Drafter for Oracle {
        fn name(&self) -> String {
            "oracle".into()
        }
        fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
            self.calls += reqs.len();
            Ok(reqs
                .iter()
                .map(|r| {
                    let n = r.tokens.len();
                    self.truth[n.min(self.truth.len())..(n + r.k).min(self.truth.len())].to_vec()
                })
                .collect())
        }
    }

    /// Always wrong.
    struct Wrong;

    impl Drafter for Wrong {
        fn name(&self) -> String {
            "wrong".into()
        }
        fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
            Ok(reqs.iter().map(|r| vec![u32::MAX; r.k]).collect())
        }
    }

    /// Runs `steps` verify steps of `truth` from length `from` through `d` (K = 4), as the engine
    /// does: drafts checked against the truth, accepted ones plus one pick appended.
    fn drive(d: &mut PickDrafter, truth: &[u32], from: usize, steps: usize) -> Vec<String> {
        let mut len = from;
        let mut who = Vec::new();
        for _ in 0..steps {
            if len + 1 >= truth.len() {
                break;
            }
            let req = DraftReq {
                id: 7,
                tokens: &truth[..len],
                k: 4,
                params: &crate::sampling::SamplingParams::GREEDY,
            };
            let draft = d.draft(&[req]).unwrap().pop().unwrap();
            who.push(d.last_part(7).unwrap_or_else(|| "-".into()));
            let acc = draft
                .iter()
                .zip(&truth[len..])
                .take_while(|(a, b)| a == b)
                .count();
            d.verified(7, draft.len(), acc);
            len += acc + 1;
        }
        who
    }

    #[test]
    fn a_model_drafter_that_is_right_keeps_drafting_over_poor_ngram() {
        // No repetition: n-gram lookup rarely proposes the truth.
        let truth: Vec<u32> = (0..200).map(|i| (i * 37 % 1009) as u32).collect();
        let mut d = PickDrafter::new(vec![Box::new(Oracle {
            truth: truth.clone(),
            calls: 0,
        })]);
        let who = drive(&mut d, &truth, 4, 30);
        let oracle = who.iter().filter(|w| *w == "oracle").count();
        assert!(oracle * 10 >= who.len() * 9, "{who:?}");
        let parts = d.parts();
        assert_eq!(parts[0].0, "oracle");
        assert_eq!(parts[0].1.accepted, parts[0].1.drafted);
        assert_eq!(d.name(), "oracle+ngram");
    }

    #[test]
    fn ngram_takes_over_from_a_wrong_model_drafter_on_copied_text() {
        // The output copies the prompt: n-gram lookup proposes the truth.
        let unit: Vec<u32> = (0..40).map(|i| (i * 13 % 50) as u32 + 3).collect();
        let truth: Vec<u32> = unit.iter().cycle().take(400).copied().collect();
        let mut d = PickDrafter::new(vec![Box::new(Wrong)]);
        let who = drive(&mut d, &truth, 60, 40);
        let tail = &who[who.len() - 20..];
        assert!(tail.iter().all(|w| w == "ngram"), "{who:?}");
        let rates = d.rates(7);
        assert!(rates[1].1 > rates[0].1, "{rates:?}");
    }

    #[test]
    fn ngram_stands_in_when_the_model_drafter_has_nothing() {
        let unit: Vec<u32> = (0..10).map(|i| i as u32 + 3).collect();
        let truth: Vec<u32> = unit.iter().cycle().take(100).copied().collect();
        // An oracle that knows nothing beyond the first 5 tokens: empty drafts.
        let mut d = PickDrafter::new(vec![Box::new(Oracle {
            truth: truth[..5].to_vec(),
            calls: 0,
        })]);
        let req = DraftReq {
            id: 1,
            tokens: &truth[..20],
            k: 3,
            params: &crate::sampling::SamplingParams::GREEDY,
        };
        assert_eq!(d.draft(&[req]).unwrap()[0], truth[20..23].to_vec());
        assert_eq!(d.last_part(1).as_deref(), Some("ngram"));
        d.forget(1);
        assert!(d.rates(1).is_empty());
    }

    #[test]
    fn shadow_scores_count_the_first_miss_only() {
        assert_eq!(score(&[1, 2, 3], &[1, 2, 3, 4]), (3, 3));
        assert_eq!(score(&[1, 9, 3], &[1, 2, 3, 4]), (1, 2));
        assert_eq!(score(&[1, 2, 3, 4], &[1, 2]), (2, 2));
        assert_eq!(score(&[], &[1]), (0, 0));
    }
}
