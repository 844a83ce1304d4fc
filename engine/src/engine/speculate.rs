//! Speculation inside the engine loop: before a step, drafts for the decoding sequences that
//! take part (batched in one drafter call); after it, the acceptance rule per sequence. Plain
//! and speculative sequences share the step; each sequence has its own K.

use std::collections::HashMap;

use crate::error::Result;
use crate::scheduler::{Scheduler, SeqId};
use crate::spec::control::{SpecControl, StepCost};
use crate::spec::{DraftReq, Drafter, SpecConfig, SpecCounts};

/// A model's speculation state (owned by its engine thread).
pub(crate) struct Speculation {
    pub(crate) cfg: SpecConfig,
    drafter: Box<dyn Drafter>,
    controls: HashMap<SeqId, SpecControl>,
    cost: StepCost,
    /// Model totals (for /metrics).
    pub(crate) counts: SpecCounts,
}

/// What the worker knows of a request, for drafting.
pub(crate) struct DraftCandidate {
    pub(crate) id: SeqId,
    /// Drafts that can still become output: tokens left before max_tokens and the context end,
    /// less the one the step picks anyway.
    pub(crate) room: usize,
}

impl Speculation {
    pub(crate) fn new(cfg: SpecConfig, drafter: Box<dyn Drafter>) -> Speculation {
        Speculation {
            cfg,
            drafter,
            controls: HashMap::new(),
            cost: StepCost::default(),
            counts: SpecCounts::default(),
        }
    }

    /// Sets this step's drafts in the scheduler. Under high occupancy (at least
    /// `cfg.max_batch` running) nobody drafts: plain batched decode fills the device better.
    pub(crate) fn draft(&mut self, sched: &mut Scheduler, cands: &[DraftCandidate]) -> Result<()> {
        if sched.running_len() >= self.cfg.max_batch {
            return Ok(());
        }
        let k_max = self.cfg.k;
        let mut asks: Vec<(SeqId, usize)> = Vec::new();
        for c in cands {
            let ctl = self
                .controls
                .entry(c.id)
                .or_insert_with(|| SpecControl::new(k_max));
            let k = ctl.k().min(c.room);
            if k > 0 {
                asks.push((c.id, k));
            }
        }
        if asks.is_empty() {
            return Ok(());
        }
        let reqs: Vec<DraftReq> = asks
            .iter()
            .filter_map(|&(id, k)| sched.tokens(id).map(|tokens| DraftReq { id, tokens, k }))
            .collect();
        let drafts = self.drafter.draft(&reqs)?;
        let ids: Vec<(SeqId, usize)> = reqs.iter().map(|r| (r.id, r.k)).collect();
        for ((id, k), mut d) in ids.into_iter().zip(drafts) {
            d.truncate(k);
            if !d.is_empty() {
                sched.set_draft(id, d);
            }
        }
        Ok(())
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

    /// A step of `rows` rows took `secs`.
    pub(crate) fn step_ran(&mut self, rows: usize, secs: f64) {
        self.cost.record(rows, secs);
    }

    /// Sequence `id` checked `drafted` drafts this step and `accepted` were accepted (0, 0: it
    /// decoded plainly).
    pub(crate) fn checked(&mut self, id: SeqId, drafted: usize, accepted: usize) {
        let r = self.cost.row_cost();
        if let Some(c) = self.controls.get_mut(&id) {
            c.verified(drafted, accepted, r);
        }
        self.counts.add(drafted, accepted);
    }

    /// The sequence ended.
    pub(crate) fn forget(&mut self, id: SeqId) {
        self.controls.remove(&id);
        self.drafter.forget(id);
    }
}
