//! [`Pipeline`]: one model split over stages, as one [`Backend`]. A step runs stage 0 (the
//! embedding and its layers) over the batch's rows, hands the residual rows to stage 1
//! ([`StageLink`]), and so on; the last stage runs its layers, the final norm and the head,
//! and picks the tokens. Every stage holds the KV blocks (same ids, its own layers) and the
//! recurrent-state slots of its own layers, so the scheduler above sees one backend.

use std::sync::{Arc, Mutex};

use super::link::StageLink;
use crate::backend::exec::Exec;
use crate::backend::runner::Runner;
use crate::backend::{
    Backend, DumpFn, KvDtype, MaskFn, SelectParams, StepBatch, StepOutput, StepRow, StepSelected,
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
        })
    }

    /// The stages, in layer order.
    pub fn stages(&self) -> &[Runner<O>] {
        &self.stages
    }

    pub fn stages_mut(&mut self) -> &mut [Runner<O>] {
        &mut self.stages
    }

    /// Runs every stage but the last over `batch` and hands each one's rows on.
    fn front(&mut self, batch: &StepBatch) -> Result<()> {
        if batch.rows.is_empty() {
            return Ok(());
        }
        let n = self.stages.len();
        for i in 0..n - 1 {
            let x = self.stages[i].run_body(batch)?;
            let (a, b) = self.stages.split_at_mut(i + 1);
            let (from, to) = (a[i].ops_mut(), b[0].ops_mut());
            self.links[i].send(from, x, batch.rows.len(), to)?;
        }
        Ok(())
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
        self.front(batch)?;
        self.last().step(batch)
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
        self.last().keep_hidden(on)
    }

    fn take_hidden(&mut self) -> Vec<(StepRow, Vec<f32>)> {
        self.last().take_hidden()
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
        self.front(batch)?;
        self.last().step_select(batch, select)
    }

    fn step_select_logprobs(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
    ) -> Result<StepSelected> {
        crate::backend::check_select(batch, select)?;
        self.front(batch)?;
        self.last().step_select_logprobs(batch, select, logprobs)
    }

    fn step_select_lazy_masks(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
        masks: &mut MaskFn,
    ) -> Result<StepSelected> {
        crate::backend::check_select(batch, select)?;
        self.front(batch)?;
        self.last()
            .step_select_lazy_masks(batch, select, logprobs, masks)
    }
}
