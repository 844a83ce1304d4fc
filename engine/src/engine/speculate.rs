//! Speculation inside the engine loop: before a step, drafts for the decoding sequences that
//! take part (batched in one drafter call); after it, the acceptance rule per sequence. Plain
//! and speculative sequences share the step; each sequence has its own K.
//!
//! Every decode step of a sequence that may speculate and checks no draft is counted with its
//! reason ([`SpecFallbacks`]): backing off after low acceptance, the load cut-off, no room, the
//! drafter had nothing, the drafter failed.
//!
//! A lookup drafter's sequence whose own context has no match of [`traffic::MIN_N`] or more
//! tokens drafts from the model's traffic store instead ([`TrafficStore`]: the outputs of
//! finished requests of the same scope, tenant and `cache_salt`), when the store has a match.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::scheduler::{Scheduler, SchedulerOutput, SeqId};
use crate::spec::control::{MATCH_BUCKETS, MatchRates, SpecControl, StepCost};
use crate::spec::traffic::{self, TrafficStore};
use crate::spec::{DraftReq, Drafter, SpecConfig, SpecCounts, SpecFallbacks};

/// Where a looked-up draft came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lookup {
    /// The sequence's own context, by a match of this many tokens.
    Own(usize),
    /// The traffic store.
    Traffic,
}

/// A model's speculation state (owned by its engine thread).
pub(crate) struct Speculation {
    pub(crate) cfg: SpecConfig,
    drafter: Box<dyn Drafter>,
    controls: HashMap<SeqId, SpecControl>,
    /// The cost of a row, fitted apart for steps with a sampled row (`[1]`) and greedy-only
    /// steps (`[0]`): a sampled step also picks from top-k candidates (on CUDA one `topk_rows`
    /// launch for all its sampled rows, a fixed cost per step), so the two fit different lines
    /// and one fit over both would let each class's steps skew the other's `r`.
    cost: [StepCost; 2],
    /// Whether each sequence samples (which fit its depth reads).
    sampled: HashMap<SeqId, bool>,
    /// Acceptance per match length of looked-up drafts, greedy (`[0]`) and sampled (`[1]`):
    /// model-wide (the replay found per-sequence tables no better, and a sequence has few drafts
    /// per bucket to learn from).
    matched: [MatchRates; 2],
    /// Acceptance of drafts from the traffic store, greedy and sampled: a class of its own
    /// (one bucket, the prior of a 1-token match), as the replay measured it (tools/spec/
    /// global_sim.py: such drafts are accepted less often than the context's own matches of
    /// the same length).
    traffic_rates: [MatchRates; 2],
    /// The model's traffic store (fed only while the drafter looks its drafts up).
    traffic: TrafficStore,
    /// Where each sequence's looked-up draft set this step came from, until [`Self::checked`].
    match_of: HashMap<SeqId, Lookup>,
    /// The target's vocabulary: a draft token outside it ends the draft there.
    vocab: usize,
    /// Drafts set this step (sequence, tokens), until [`Self::planned`] sees the plan.
    set: HashMap<SeqId, usize>,
    /// Rows of the last step without its drafts (its decoding sequences).
    rows: usize,
    /// Model totals (for /metrics).
    pub(crate) counts: SpecCounts,
    pub(crate) fallbacks: SpecFallbacks,
    /// Model totals of looked-up drafts per match-length bucket (for /metrics).
    pub(crate) by_match: [SpecCounts; MATCH_BUCKETS],
    /// Model totals of drafts from the traffic store (for /metrics).
    pub(crate) by_traffic: SpecCounts,
}

/// What the worker knows of a request, for drafting.
pub(crate) struct DraftCandidate {
    pub(crate) id: SeqId,
    /// Drafts that can still become output: tokens left before max_tokens and the context end,
    /// less the one the step picks anyway.
    pub(crate) room: usize,
    /// The request's sampling: a model drafter picks its drafts as the target will, and a
    /// request that samples reads the sampled steps' fit for its depth.
    pub(crate) params: crate::sampling::SamplingParams,
    /// The request's scope in the traffic store: its prefix-cache namespace (tenant and
    /// `cache_salt`).
    pub(crate) scope: Arc<[u8]>,
}

impl Speculation {
    pub(crate) fn new(cfg: SpecConfig, drafter: Box<dyn Drafter>, vocab: usize) -> Speculation {
        Speculation {
            cfg,
            drafter,
            controls: HashMap::new(),
            cost: Default::default(),
            sampled: HashMap::new(),
            matched: [MatchRates::new(false), MatchRates::new(true)],
            traffic_rates: [MatchRates::new(false), MatchRates::new(true)],
            traffic: TrafficStore::default(),
            match_of: HashMap::new(),
            vocab,
            set: HashMap::new(),
            rows: 1,
            counts: SpecCounts::default(),
            fallbacks: SpecFallbacks::default(),
            by_match: Default::default(),
            by_traffic: SpecCounts::default(),
        }
    }

    /// The drafter's name (`ngram`, `mtp+ngram`, ...).
    pub(crate) fn name(&self) -> String {
        self.drafter.name()
    }

    /// Counters per drafter: the parts of a drafter that picks among others, else the one.
    pub(crate) fn by_drafter(&self) -> Vec<(String, SpecCounts)> {
        let parts = self.drafter.parts();
        if parts.is_empty() {
            vec![(self.drafter.name(), self.counts)]
        } else {
            parts
        }
    }

    /// Sets this step's drafts in the scheduler. Under high occupancy (at least
    /// `cfg.max_batch` running) nobody drafts: plain batched decode fills the device better.
    /// K per sequence, under the measured cost of a row in a step of this many decoding
    /// sequences ([`StepCost::row_cost_in`]: the more sequences share a step, the more a draft
    /// row must be accepted to pay): for a drafter that reports the match length behind each
    /// draft, the drafter is asked for up to `k` (and the room) and each draft is cut to
    /// [`MatchRates::depth`] of its match length; for others, [`SpecControl::depth`]. Either
    /// way a sequence the controller backs off does not draft. A lookup drafter's sequence
    /// without a match of [`traffic::MIN_N`] or more tokens in its own context drafts from the
    /// traffic store of its scope when that has a match (cut to the depth of the store's own
    /// acceptance class).
    pub(crate) fn draft(&mut self, sched: &mut Scheduler, cands: &[DraftCandidate]) -> Result<()> {
        self.set.clear();
        if cands.is_empty() {
            return Ok(());
        }
        if sched.running_len() >= self.cfg.max_batch {
            self.fallbacks.load += cands.len() as u64;
            return Ok(());
        }
        let k_max = self.cfg.k;
        // A draft row is weighed against the step it joins: every decoding sequence's row.
        self.rows = sched.decoding().len().max(1);
        let matches = self.drafter.matches();
        let mut asks: Vec<(&DraftCandidate, usize)> = Vec::new();
        for c in cands {
            self.match_of.remove(&c.id);
            let sampled = !c.params.is_greedy();
            self.sampled.insert(c.id, sampled);
            let r = self.row_cost_of(sampled);
            let ctl = self
                .controls
                .entry(c.id)
                .or_insert_with(|| SpecControl::new(k_max));
            if ctl.backing_off() {
                self.fallbacks.backoff += 1;
                continue;
            }
            let ask = if matches { k_max } else { ctl.depth(r) };
            match ask.min(c.room) {
                0 => self.fallbacks.no_room += 1,
                k => asks.push((c, k)),
            }
        }
        if asks.is_empty() {
            return Ok(());
        }
        // Each request beside its scope in the traffic store.
        let (reqs, scopes): (Vec<DraftReq>, Vec<&Arc<[u8]>>) = asks
            .iter()
            .filter_map(|&(c, k)| {
                let req = DraftReq {
                    id: c.id,
                    tokens: sched.tokens(c.id)?,
                    k,
                    params: &c.params,
                };
                Some((req, &c.scope))
            })
            .unzip();
        let drafts = match self.drafter.draft_matched(&reqs) {
            Ok(d) => d,
            Err(e) => {
                self.fallbacks.error += reqs.len() as u64;
                return Err(e);
            }
        };
        let ids: Vec<(SeqId, usize)> = reqs.iter().map(|r| (r.id, r.k)).collect();
        for (((id, k), scope), (mut d, matched)) in ids.into_iter().zip(scopes).zip(drafts) {
            let sampled = self.sampled.get(&id).copied().unwrap_or(false);
            let r = self.row_cost_of(sampled);
            let mut lookup = matched.map(Lookup::Own);
            if matches
                && matched.is_none_or(|m| m < traffic::MIN_N)
                && let Some(tokens) = sched.tokens(id)
            {
                let (t, n) = self.traffic.propose(scope, tokens, k);
                if n > 0 {
                    (d, lookup) = (t, Some(Lookup::Traffic));
                }
            }
            let k = match lookup {
                Some(Lookup::Own(m)) => self.matched[usize::from(sampled)].depth(m, r, k),
                Some(Lookup::Traffic) => self.traffic_rates[usize::from(sampled)].depth(1, r, k),
                None => k,
            };
            if let Some(l) = lookup {
                self.match_of.insert(id, l);
            }
            d.truncate(k);
            if let Some(bad) = d.iter().position(|&t| t as usize >= self.vocab) {
                d.truncate(bad);
            }
            if d.is_empty() {
                self.fallbacks.no_draft += 1;
            } else {
                self.set.insert(id, d.len());
                sched.set_draft(id, d);
            }
        }
        Ok(())
    }

    /// The step's plan: a sequence whose draft the scheduler left out entirely (token budget,
    /// KV pool) decodes plainly for lack of room.
    pub(crate) fn planned(&mut self, plan: &SchedulerOutput) {
        for p in &plan.seqs {
            if p.sample && p.drafts.is_empty() && self.set.contains_key(&p.id) {
                self.fallbacks.no_room += 1;
            }
        }
        self.set.clear();
    }

    /// Whether the drafter reads the target's hidden states (an MTP drafter).
    pub(crate) fn wants_hidden(&self) -> bool {
        self.drafter.wants_hidden()
    }

    /// Hands a step's hidden states to the drafter, per sequence: `ids[seq]` is the sequence
    /// of the step's block table `seq`.
    pub(crate) fn observe(
        &mut self,
        ids: &[SeqId],
        rows: Vec<(crate::backend::StepRow, Vec<f32>)>,
    ) {
        let mut by: std::collections::BTreeMap<usize, Vec<_>> = Default::default();
        for r in rows {
            by.entry(r.0.seq).or_default().push(r);
        }
        for (seq, rows) in by {
            if let Some(&id) = ids.get(seq) {
                self.drafter.observe(id, &rows);
            }
        }
    }

    /// A step of `rows` rows took `secs`; `sampled`: a row of it sampled.
    pub(crate) fn step_ran(&mut self, rows: usize, secs: f64, sampled: bool) {
        self.cost[usize::from(sampled)].record(rows, secs);
    }

    /// The cost of a row in this step for sequence `id`: its class's fit.
    fn row_cost(&self, id: SeqId) -> f32 {
        self.row_cost_of(self.sampled.get(&id).copied().unwrap_or(false))
    }

    /// The cost of a row in this step for a sequence that samples or not: the configured
    /// fixed cost, else its class's fit.
    fn row_cost_of(&self, sampled: bool) -> f32 {
        match self.cfg.row_cost_permille {
            Some(p) => f32::from(p) / 1000.0,
            None => self.cost[usize::from(sampled)].row_cost_in(self.rows),
        }
    }

    /// Sequence `id` checked `drafted` drafts this step and `accepted` were accepted (0, 0: it
    /// decoded plainly).
    pub(crate) fn checked(&mut self, id: SeqId, drafted: usize, accepted: usize) {
        let r = self.row_cost(id);
        if let Some(c) = self.controls.get_mut(&id) {
            c.verified(drafted, accepted, r);
        }
        let sampled = usize::from(self.sampled.get(&id).copied().unwrap_or(false));
        match self.match_of.remove(&id) {
            Some(Lookup::Own(m)) => {
                self.matched[sampled].verified(m, drafted, accepted);
                if drafted > 0 {
                    self.by_match[MatchRates::bucket(m)].add(drafted, accepted);
                }
            }
            Some(Lookup::Traffic) => {
                self.traffic_rates[sampled].verified(1, drafted, accepted);
                self.by_traffic.add(drafted, accepted);
            }
            None => {}
        }
        if drafted > 0 {
            self.drafter.verified(id, drafted, accepted);
        }
        self.counts.add(drafted, accepted);
    }

    /// A sequence of `scope` that may speculate ended with `output` (its generated tokens):
    /// into the traffic store, while the drafter looks its drafts up (the store serves no
    /// other).
    pub(crate) fn finished(&mut self, scope: &[u8], output: &[u32]) {
        if self.drafter.matches() {
            self.traffic.feed(scope, output);
        }
    }

    /// The sequence ended.
    pub(crate) fn forget(&mut self, id: SeqId) {
        self.controls.remove(&id);
        self.sampled.remove(&id);
        self.match_of.remove(&id);
        self.drafter.forget(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::DrafterKind;
    use crate::spec::ngram::NgramDrafter;

    /// A lookup drafter whose every draft is `k` ones proposed by a match of `matched` tokens
    /// (`None`: a drafter without match lengths); it records the depth it was asked for.
    struct Fixed {
        matched: Option<usize>,
        asked: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Drafter for Fixed {
        fn name(&self) -> String {
            "fixed".into()
        }
        fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
            Ok(self.draft_matched(reqs)?.into_iter().map(|d| d.0).collect())
        }
        fn matches(&self) -> bool {
            self.matched.is_some()
        }
        fn draft_matched(&mut self, reqs: &[DraftReq]) -> Result<Vec<(Vec<u32>, Option<usize>)>> {
            let mut asked = self.asked.lock().unwrap();
            Ok(reqs
                .iter()
                .map(|r| {
                    asked.push(r.k);
                    (vec![1; r.k], self.matched)
                })
                .collect())
        }
    }

    /// A speculation state with drafter `Fixed { matched }` at `k` drafts and a row cost of 0.1,
    /// and a scheduler with sequence 1 decoding.
    fn one_decoding(
        matched: Option<usize>,
        k: usize,
    ) -> (
        Speculation,
        Scheduler,
        std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ) {
        use crate::kv::KvManager;
        use crate::prefix_cache::namespace;
        use crate::scheduler::{NewSeq, SchedulerConfig};
        let cfg = SpecConfig {
            row_cost_permille: Some(100),
            ..SpecConfig::new(DrafterKind::Ngram, k).unwrap()
        };
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let drafter = Fixed {
            matched,
            asked: asked.clone(),
        };
        let spec = Speculation::new(cfg, Box::new(drafter), 100);
        let sc = SchedulerConfig {
            max_batch_tokens: 64,
            max_running: 8,
            max_running_per_tenant: 8,
            admit_reserve_blocks: 0,
            recurrent: false,
            state_snapshots: None,
        };
        let mut sched = Scheduler::new(sc, KvManager::new(64, 4, true));
        sched.add(NewSeq {
            media: Vec::new(),
            id: 1,
            tenant: "t".into(),
            namespace: namespace("t", None),
            prompt: vec![2, 3, 4],
        });
        let o = sched.schedule();
        sched.complete(&o);
        assert!(sched.append_token(1, 5));
        assert_eq!(sched.decoding(), vec![1]);
        (spec, sched, asked)
    }

    /// The draft set for sequence 1 this step (0: none).
    fn drafted(spec: &mut Speculation, sched: &mut Scheduler, room: usize, sampled: bool) -> usize {
        let params = crate::sampling::SamplingParams {
            temperature: if sampled { 0.8 } else { 0.0 },
            ..crate::sampling::SamplingParams::GREEDY
        };
        let c = DraftCandidate {
            id: 1,
            room,
            params,
            scope: Arc::from(&b"t"[..]),
        };
        spec.draft(sched, &[c]).unwrap();
        let n = spec.set.get(&1).copied().unwrap_or(0);
        spec.set.clear();
        n
    }

    #[test]
    fn a_looked_up_draft_gets_the_depth_of_its_match_length() {
        // The priors at r = 0.1 (before any data): 1, 3, 4, 8 drafts greedy for a match of 1,
        // 2, 3, 4 tokens; 1, 3, 3, 8 sampled. The drafter is asked for k (or the room).
        for (sampled, want) in [(false, [1, 3, 4, 8]), (true, [1, 3, 3, 8])] {
            for (m, &want) in (1..=4).zip(&want) {
                let (mut spec, mut sched, asked) = one_decoding(Some(m), 8);
                assert_eq!(drafted(&mut spec, &mut sched, 100, sampled), want, "{m}");
                assert_eq!(*asked.lock().unwrap(), vec![8]);
            }
        }
        // The request's k and its room cap the depth.
        let (mut spec, mut sched, asked) = one_decoding(Some(4), 3);
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), 3);
        assert_eq!(drafted(&mut spec, &mut sched, 2, false), 2);
        assert_eq!(drafted(&mut spec, &mut sched, 0, false), 0);
        assert_eq!(*asked.lock().unwrap(), vec![3, 2]);
        assert_eq!(spec.fallbacks.no_room, 1);
    }

    #[test]
    fn match_depth_learns_and_backs_off() {
        let (mut spec, mut sched, _) = one_decoding(Some(4), 8);
        // 4-token matches whose drafts are all rejected: the model-wide table drops their
        // depth, and the sequence's controller backs it off.
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), 8);
        spec.checked(1, 8, 0);
        assert!(
            spec.matched[0].rate(4) < 0.97 * 4.0 / 5.0,
            "learned from the step"
        );
        let mut steps = 1;
        while !spec.controls[&1].backing_off() && steps < 10 {
            let n = drafted(&mut spec, &mut sched, 100, false);
            assert!(n > 0);
            spec.checked(1, n, 0);
            steps += 1;
        }
        assert!(
            spec.controls[&1].backing_off(),
            "no back-off in {steps} steps"
        );
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), 0);
        assert_eq!(spec.fallbacks.backoff, 1);
        for _ in 0..60 {
            spec.matched[0].verified(4, 8, 0);
        }
        spec.controls.clear();
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), 1);
        // The sampled table is apart: still its prior.
        assert_eq!(drafted(&mut spec, &mut sched, 100, true), 8);
        // A check without a draft (the scheduler left it out) teaches the table nothing.
        let p = spec.matched[1].rate(4);
        spec.checked(1, 0, 0);
        assert_eq!(spec.matched[1].rate(4), p);
        assert!(spec.match_of.is_empty());
    }

    #[test]
    fn the_traffic_store_stands_in_for_a_short_own_match_of_the_same_scope() {
        // Sequence 1 is [2, 3, 4, 5]: in scope `t` the store has [4, 5] followed by 6, 7, 8,
        // in scope `u` by 9.
        for (own, from_store) in [(1, true), (2, false)] {
            let (mut spec, mut sched, _) = one_decoding(Some(own), 8);
            spec.finished(b"t", &[4, 5, 6, 7, 8]);
            spec.finished(b"u", &[4, 5, 9, 9, 9]);
            let c = DraftCandidate {
                id: 1,
                room: 100,
                params: crate::sampling::SamplingParams::GREEDY,
                scope: Arc::from(&b"t"[..]),
            };
            spec.draft(&mut sched, &[c]).unwrap();
            let plan = sched.schedule();
            let drafts = plan.seqs[0].drafts.clone();
            if from_store {
                // The store's class starts from the 1-token prior: one draft at r = 0.1.
                assert_eq!(drafts, vec![6]);
                assert_eq!(spec.match_of.get(&1), Some(&Lookup::Traffic));
            } else {
                assert_eq!(drafts, vec![1; 3], "a 2-token own match keeps its draft");
                assert_eq!(spec.match_of.get(&1), Some(&Lookup::Own(2)));
            }
            spec.checked(1, drafts.len(), 1);
            let traffic = SpecCounts {
                drafted: 1,
                accepted: 1,
                steps: 1,
            };
            assert_eq!(spec.by_traffic == traffic, from_store);
            assert_eq!(spec.by_match[1].drafted > 0, !from_store);
        }
        // A drafter without lookups neither feeds nor reads the store.
        let (mut spec, _, _) = one_decoding(None, 8);
        spec.finished(b"t", &[4, 5, 6, 7, 8]);
        assert!(spec.traffic.is_empty());
    }

    #[test]
    fn drafts_without_a_match_length_keep_the_controllers_depth() {
        let (mut spec, mut sched, asked) = one_decoding(None, 8);
        // The controller's prior (p = 1) asks for its ceiling; after a poor step, for less.
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), 8);
        spec.checked(1, 8, 2);
        let want = spec.controls[&1].depth(0.1);
        assert!(want < 8, "{want}");
        assert_eq!(drafted(&mut spec, &mut sched, 100, false), want);
        assert_eq!(*asked.lock().unwrap(), vec![8, want]);
        assert!(spec.match_of.is_empty());
    }

    #[test]
    fn sampled_and_greedy_steps_fit_apart() {
        let cfg = SpecConfig::new(DrafterKind::Ngram, 4).unwrap();
        let mut s = Speculation::new(cfg, Box::new(NgramDrafter::default()), 100);
        let mut pooled = StepCost::default();
        // Greedy steps: 1 ms + 0.1 ms a row, deep (accepted drafts); sampled steps: the same
        // forward plus a fixed 0.4 ms pick, shallower.
        for i in 0..60 {
            let (g, t) = (3 + i % 3, 1 + i % 2);
            let (tg, ts) = (1.0 + 0.1 * g as f64, 1.4 + 0.1 * t as f64);
            s.step_ran(g, tg, false);
            s.step_ran(t, ts, true);
            pooled.record(g, tg);
            pooled.record(t, ts);
        }
        s.sampled.insert(1, false);
        s.sampled.insert(2, true);
        s.rows = 1;
        let (rg, rs) = (s.row_cost(1), s.row_cost(2));
        assert!((rg - 0.1 / 1.1).abs() < 1e-3, "{rg}");
        assert!((rs - 0.1 / 1.5).abs() < 1e-3, "{rs}");
        // One fit over both sees the shallow sampled steps as the slow ones: its slope goes
        // negative and `r` is clamped to its floor, wrong for both.
        assert_eq!(pooled.row_cost(), 0.05);
        // A sequence the controller has not seen reads the greedy fit.
        assert_eq!(s.row_cost(9), rg);
    }
}
