//! [`Pipeline`]: one model split over stages, as one [`Backend`]. A step runs stage 0 (the
//! embedding and its layers) over the batch's rows, hands the residual rows to stage 1
//! ([`StageLink`]), and so on; the last stage runs its layers, the final norm and the head,
//! and picks the tokens. Every stage holds the KV blocks (same ids, its own layers) and the
//! recurrent-state slots of its own layers, so the scheduler above sees one backend.
//!
//! Micro-batches (micro.rs, `--pp-micro`): a step of several sequences is cut into runs of
//! whole sequences. Every stage but the last is enqueued over every micro-batch first, each
//! micro-batch's rows handed to its own parcel of the next stage; then the last stage runs
//! micro-batch by micro-batch, each waiting (on the device) for its own parcel only. On two
//! devices stage 0 thus runs micro-batch j + 1 while the last stage runs micro-batch j; the
//! host waits only in the last stage's read-back of each micro-batch's picks, on the last
//! stage's stream (stage 0's queued micro-batches keep running). The outputs are merged in
//! the step's row order; a row's bits do not depend on its micro-batch (row invariance).

use std::sync::{Arc, Mutex};

use super::link::StageLink;
use super::micro::{self, Micro};
use crate::backend::exec::Exec;
use crate::backend::runner::Runner;
use crate::backend::{
    Backend, DumpFn, KvDtype, MaskFn, SelectParams, StepBatch, StepMasks, StepOutput, StepRow,
    StepSelected,
};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// A model split into pipeline stages over one op implementation.
pub struct Pipeline<O: Exec> {
    stages: Vec<Runner<O>>,
    /// `links[i]` hands stage `i`'s rows to stage `i + 1`.
    links: Vec<Box<dyn StageLink<O>>>,
    /// The split, one line ([`Backend::pipeline`]).
    summary: String,
    /// Micro-batches a step is cut into at most (1: none).
    micro: usize,
    /// [`Backend::keep_hidden`], and the rows kept (with the step's own rows: the last stage
    /// sees a micro-batch's, whose sequences are renumbered).
    keep_hidden: bool,
    hidden: Vec<(StepRow, Vec<f32>)>,
}

impl<O: Exec> Pipeline<O> {
    /// Joins `stages` (built with [`Runner::build_stage`], in layer order) by `links`. They
    /// must agree on the KV pool (block size, block count, format): a block id names the same
    /// positions in every stage.
    pub fn new(
        stages: Vec<Runner<O>>,
        links: Vec<Box<dyn StageLink<O>>>,
        summary: String,
    ) -> Result<Pipeline<O>> {
        if stages.len() < 2 || links.len() + 1 != stages.len() {
            return Err(Error::Input(format!(
                "a pipeline needs at least two stages and one link between each two ({} \
                 stages, {} links)",
                stages.len(),
                links.len()
            )));
        }
        let pool = |r: &Runner<O>| (r.kv_block_size(), r.kv_blocks(), r.kv_dtype());
        if let Some(r) = stages.iter().find(|r| pool(r) != pool(&stages[0])) {
            return Err(Error::Input(format!(
                "pipeline stages disagree on the KV pool: {:?} vs {:?} (block size, blocks, \
                 format)",
                pool(&stages[0]),
                pool(r)
            )));
        }
        Ok(Pipeline {
            stages,
            links,
            summary,
            micro: 1,
            keep_hidden: false,
            hidden: Vec::new(),
        })
    }

    /// Cuts each step of two or more sequences into at most `n` micro-batches (1 or 0: none).
    pub fn set_micro(&mut self, n: usize) {
        self.micro = n.max(1);
    }

    /// The most micro-batches a step is cut into.
    pub fn micro(&self) -> usize {
        self.micro
    }

    /// The stages, in layer order.
    pub fn stages(&self) -> &[Runner<O>] {
        &self.stages
    }

    pub fn stages_mut(&mut self) -> &mut [Runner<O>] {
        &mut self.stages
    }

    /// `batch` cut into micro-batches ([`Pipeline::set_micro`]).
    fn parts<'a>(&self, batch: &'a StepBatch) -> Vec<Micro<'a>> {
        micro::split(batch, self.micro)
    }

    /// Runs every stage but the last over each micro-batch, in order, each one's rows handed
    /// to its own parcel of the next stage. Nothing here waits for a device.
    fn front(&mut self, parts: &[Micro]) -> Result<()> {
        let n = self.stages.len();
        for (j, m) in parts.iter().enumerate() {
            let rows = m.batch.rows.len();
            if rows == 0 {
                continue;
            }
            for i in 0..n - 1 {
                if i > 0 {
                    self.links[i - 1].deliver(self.stages[i].ops_mut(), j)?;
                }
                let x = self.stages[i].run_body(&m.batch)?;
                let (a, b) = self.stages.split_at_mut(i + 1);
                self.links[i].send(a[i].ops_mut(), x, rows, b[0].ops_mut(), j)?;
            }
        }
        Ok(())
    }

    /// Runs the last stage over each micro-batch with `f`, after delivering its parcel; the
    /// outputs concatenated (the step's row order), the kept hidden rows collected.
    fn back<T>(
        &mut self,
        batch: &StepBatch,
        parts: &[Micro],
        mut f: impl FnMut(&mut Runner<O>, &Micro) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let n = self.stages.len();
        // Rows a failed step left behind are not this step's.
        let _ = self.stages[n - 1].take_hidden();
        let mut out = Vec::new();
        for (j, m) in parts.iter().enumerate() {
            if !m.batch.rows.is_empty() {
                self.links[n - 2].deliver(self.stages[n - 1].ops_mut(), j)?;
            }
            out.extend(f(&mut self.stages[n - 1], m)?);
        }
        if self.keep_hidden {
            let h = self.stages[n - 1].take_hidden();
            if h.len() != batch.rows.len() {
                return Err(Error::Input(format!(
                    "pipeline: {} hidden rows kept for a step of {} rows",
                    h.len(),
                    batch.rows.len()
                )));
            }
            let rows = batch.rows.iter().copied();
            self.hidden.extend(rows.zip(h.into_iter().map(|(_, v)| v)));
        }
        Ok(out)
    }

    fn last(&mut self) -> &mut Runner<O> {
        let n = self.stages.len();
        &mut self.stages[n - 1]
    }

    /// The stages that hold recurrent-state layers.
    fn with_state(&mut self) -> impl Iterator<Item = &mut Runner<O>> {
        self.stages.iter_mut().filter(|s| s.state_snapshots())
    }
}

impl<O: Exec> Backend for Pipeline<O> {
    fn name(&self) -> String {
        let names: Vec<String> = self.stages.iter().map(|s| s.name()).collect();
        names.join(",")
    }

    fn profile(&self) -> Option<String> {
        self.stages[self.stages.len() - 1].profile()
    }

    fn pipeline(&self) -> Option<String> {
        Some(self.summary.clone())
    }

    fn config(&self) -> &ModelConfig {
        self.stages[0].config()
    }

    fn kv_block_size(&self) -> usize {
        self.stages[0].kv_block_size()
    }

    fn kv_blocks(&self) -> usize {
        self.stages[0].kv_blocks()
    }

    fn kv_dtype(&self) -> KvDtype {
        self.stages[0].kv_dtype()
    }

    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput> {
        let parts = self.parts(batch);
        self.front(&parts)?;
        let logits = self.back(batch, &parts, |r, m| Ok(r.step(&m.batch)?.logits))?;
        Ok(StepOutput { logits })
    }

    /// Every layer's K then every layer's V, as one backend lays a block out: each stage's
    /// bytes are its layers' K then V, so the K halves come first in stage order.
    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        let parts = self
            .stages
            .iter()
            .map(|s| s.kv_block_bytes(block))
            .collect::<Result<Vec<_>>>()?;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for p in &parts {
            let (pk, pv) = p.split_at(p.len() / 2);
            k.extend_from_slice(pk);
            v.extend_from_slice(pv);
        }
        k.extend_from_slice(&v);
        Ok(k)
    }

    fn set_dump(&mut self, dump: Option<DumpFn>) {
        let Some(dump) = dump else {
            self.stages.iter_mut().for_each(|s| s.set_dump(None));
            return;
        };
        // One sink for every stage (layers are numbered as in the whole model).
        let shared = Arc::new(Mutex::new(dump));
        for s in &mut self.stages {
            let sink = Arc::clone(&shared);
            s.set_dump(Some(Box::new(move |name, layer, rows, values| {
                if let Ok(mut f) = sink.lock() {
                    f(name, layer, rows, values)
                }
            })));
        }
    }

    fn keep_hidden(&mut self, on: bool) -> Result<()> {
        self.last().keep_hidden(on)?;
        self.keep_hidden = on;
        self.hidden.clear();
        Ok(())
    }

    fn take_hidden(&mut self) -> Vec<(StepRow, Vec<f32>)> {
        std::mem::take(&mut self.hidden)
    }

    fn set_state_keep(&mut self, positions: usize) {
        self.stages
            .iter_mut()
            .for_each(|s| s.set_state_keep(positions));
    }

    fn state_snapshots(&self) -> bool {
        self.stages.iter().any(|s| s.state_snapshots())
    }

    fn state_snapshot_capacity(&self) -> Option<usize> {
        self.stages
            .iter()
            .filter(|s| s.state_snapshots())
            .filter_map(|s| s.state_snapshot_capacity())
            .min()
    }

    fn save_state(&mut self, slot: u32, pos: u32, snap: u32) -> Result<()> {
        for s in self.with_state() {
            s.save_state(slot, pos, snap)?;
        }
        Ok(())
    }

    fn restore_state(&mut self, slot: u32, snap: u32) -> Result<u32> {
        let mut at = None;
        for s in self.with_state() {
            let p = s.restore_state(slot, snap)?;
            if at.is_some_and(|a| a != p) {
                return Err(Error::Input(format!(
                    "state snapshot {snap}: the pipeline's stages hold it at different \
                     positions"
                )));
            }
            at = Some(p);
        }
        at.ok_or_else(|| {
            Error::Unsupported("state snapshots: the model has no recurrent-state layers".into())
        })
    }

    fn step_select(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        crate::backend::check_select(batch, select)?;
        let parts = self.parts(batch);
        self.front(&parts)?;
        let rows = self.back(batch, &parts, |r, m| {
            Ok(r.step_select(&m.batch, &select[m.want.clone()])?.rows)
        })?;
        Ok(StepSelected { rows })
    }

    fn step_select_logprobs(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
    ) -> Result<StepSelected> {
        crate::backend::check_select(batch, select)?;
        crate::backend::check_logprobs(select, logprobs)?;
        let parts = self.parts(batch);
        self.front(&parts)?;
        let rows = self.back(batch, &parts, |r, m| {
            let w = m.want.clone();
            Ok(
                r.step_select_logprobs(&m.batch, &select[w.clone()], &logprobs[w])?
                    .rows,
            )
        })?;
        Ok(StepSelected { rows })
    }

    /// The step's masks are computed once, when the last stage has launched its first
    /// micro-batch (every earlier stage's work is queued by then), and split among the
    /// micro-batches.
    fn step_select_lazy_masks(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
        masks: &mut MaskFn,
    ) -> Result<StepSelected> {
        crate::backend::check_select(batch, select)?;
        crate::backend::check_logprobs(select, logprobs)?;
        let parts = self.parts(batch);
        self.front(&parts)?;
        let mut all: Option<StepMasks> = None;
        let rows = self.back(batch, &parts, |r, m| {
            let w = m.want.clone();
            let mut part = || -> Result<StepMasks> {
                if all.is_none() {
                    all = Some(masks()?);
                }
                let a = all.as_deref().unwrap_or(&[]);
                a.get(w.clone()).map(<[_]>::to_vec).ok_or_else(|| {
                    Error::Input(format!(
                        "step_select_lazy_masks: {} masks for {} rows",
                        a.len(),
                        select.len()
                    ))
                })
            };
            let (s, l) = (&select[w.clone()], &logprobs[w.clone()]);
            Ok(r.step_select_lazy_masks(&m.batch, s, l, &mut part)?.rows)
        })?;
        Ok(StepSelected { rows })
    }
}
