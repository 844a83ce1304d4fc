//! The generic runner: implements [`Backend`] once over any op implementation ([`Exec`]) and
//! any architecture's forward pass ([`Forward`]): batch checks, the output head on the rows that
//! want logits, logits read-back and token selection. Row metadata and CUDA graph capture are
//! the backend's [`Exec::execute`].

use super::exec::{Exec, HeadRows};
use super::{
    Backend, DumpFn, MaskFn, SelectParams, StepBatch, StepOutput, StepRow, StepSelected,
    check_batch, check_logprobs, check_select, logits_for_scoring, score_on_host, with_masks,
};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::{self, Forward, ModelWeights, Stage};
use crate::ops::{Act, Rows};

/// One model on one backend.
pub struct Runner<O: Exec> {
    ops: O,
    model: Box<dyn Forward<O>>,
    config: ModelConfig,
    /// The head input: the residual rows that want logits.
    head_in: Act,
    logits: Act,
    /// Keep every row's final hidden state ([`Backend::keep_hidden`]).
    keep_hidden: bool,
    hidden: Vec<(StepRow, Vec<f32>)>,
    /// The body's output activation, learnt the first time the pass runs: a replayed CUDA
    /// graph does not call the pass, but the body always returns the same activation (the
    /// residual stream), which the replay fills.
    body_x: Option<Act>,
    /// Whether the forward ends with the output head: false on a pipeline stage before the
    /// last (crate::pipeline), whose steps stop at the residual stream.
    head: bool,
}

impl<O: Exec> Runner<O> {
    /// Builds `weights`' architecture on `ops` (uploads its parameters, declares its
    /// activations, RoPE tables and KV layers).
    pub fn build(ops: O, weights: &ModelWeights) -> Result<Runner<O>> {
        Self::build_with(ops, weights, models::build)
    }

    /// [`Runner::build`] with another forward pass over the same weights (an MTP layer's,
    /// models/mtp.rs).
    pub fn build_with(
        ops: O,
        weights: &ModelWeights,
        build: models::BuildFn<O>,
    ) -> Result<Runner<O>> {
        Self::build_from(ops, weights, true, build)
    }

    /// Builds pipeline stage `stage` of `weights`' architecture on `ops` (crate::pipeline):
    /// a stage before the last runs no head ([`Runner::run_body`]).
    pub fn build_stage(ops: O, weights: &ModelWeights, stage: &Stage) -> Result<Runner<O>> {
        Self::build_from(ops, weights, stage.last(), |w, o| {
            models::build_stage(w, stage, o)
        })
    }

    fn build_from(
        mut ops: O,
        weights: &ModelWeights,
        head: bool,
        build: impl FnOnce(&ModelWeights, &mut O) -> Result<Box<dyn Forward<O>>>,
    ) -> Result<Runner<O>> {
        let config = weights.config.clone();
        let model = build(weights, &mut ops)?;
        let head_in = ops.act("head_in", config.hidden, Rows::Head);
        // A stage without a head never writes logits: one column keeps the handle valid.
        let logits = ops.act("logits", if head { config.vocab } else { 1 }, Rows::Head);
        Ok(Runner {
            ops,
            model,
            config,
            head_in,
            logits,
            keep_hidden: false,
            hidden: Vec::new(),
            body_x: None,
            head,
        })
    }

    /// Runs the forward of a stage without a head over `batch`: its rows' K/V (and
    /// recurrent state) written, the residual rows after its last layer left in the returned
    /// activation (step rows `0..batch.rows.len()`), for the next stage
    /// (crate::pipeline::StageLink). On CUDA it may return before the device has run it.
    pub fn run_body(&mut self, batch: &StepBatch) -> Result<Act> {
        self.forward(batch)?;
        self.body_x.ok_or_else(|| {
            Error::Unsupported("a pipeline stage's body ran without an output activation".into())
        })
    }

    /// The op implementation (for backend-specific controls, e.g. CUDA graphs).
    pub fn ops(&self) -> &O {
        &self.ops
    }

    pub fn ops_mut(&mut self) -> &mut O {
        &mut self.ops
    }

    /// Runs the forward pass; returns, per row that wants logits, its row in `self.logits` and
    /// in the activation the head read (the returned one: the gathered head input, or the final
    /// residual rows themselves when the head ran over every row).
    fn forward(&mut self, batch: &StepBatch) -> Result<(Vec<usize>, Act)> {
        let o = &self.ops;
        check_batch(
            batch,
            self.config.vocab,
            o.kv_block_size(),
            o.kv_blocks(),
            &o.name(),
        )?;
        if batch.rows.is_empty() {
            return Ok((Vec::new(), self.head_in));
        }
        if !batch.embeds.is_empty() {
            super::check_embeds(batch, self.config.embed_width())?;
            super::spans::check_spans(batch)?;
            if !(self.ops.injects_rows() && self.model.takes_embeds()) {
                return Err(Error::Unsupported(format!(
                    "image input is not supported for {} on {}",
                    self.config.arch.gguf_name(),
                    self.ops.name()
                )));
            }
        }
        let want: Vec<usize> = (0..batch.rows.len())
            .filter(|&i| batch.rows[i].want_logits)
            .collect();
        let (model, head_in, logits) = (&self.model, self.head_in, self.logits);
        let run_head = self.head;
        let mut body_out = None;
        let mut head_x = head_in;
        let rows = self.ops.execute(batch, &want, &mut |ops, head| {
            let x = model.body(ops)?;
            body_out = Some(x);
            if !run_head {
                return Ok(());
            }
            let h = match head {
                HeadRows::All => x,
                HeadRows::Gather([]) => return Ok(()),
                HeadRows::Gather(rows) => {
                    ops.gather(x, rows, head_in)?;
                    head_in
                }
            };
            head_x = h;
            model.head(ops, h, logits)
        })?;
        if body_out.is_some() {
            self.body_x = body_out;
        } else if let Some(x) = self.body_x {
            // A replayed graph: its head ran over every row of the body's output.
            head_x = x;
        }
        if self.keep_hidden {
            // On a graph replay the pass did not run: `body_out` is None, the rows are in the
            // activation the captured pass wrote (H200 session 9: the MTP drafter got no hidden
            // rows and drafted nothing).
            let x = self.body_x.ok_or_else(|| {
                Error::Unsupported("hidden states asked before the forward pass ran".into())
            })?;
            let all: Vec<usize> = (0..batch.rows.len()).collect();
            let h = self.ops.read_rows(x, &all)?;
            self.hidden.extend(batch.rows.iter().copied().zip(h));
        }
        Ok((rows, head_x))
    }
}

impl<O: Exec> Backend for Runner<O> {
    fn name(&self) -> String {
        self.ops.name()
    }

    fn profile(&self) -> Option<String> {
        self.ops.profile()
    }

    fn accepts_embeds(&self) -> bool {
        self.ops.injects_rows() && self.model.takes_embeds()
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_block_size(&self) -> usize {
        self.ops.kv_block_size()
    }

    fn kv_blocks(&self) -> usize {
        self.ops.kv_blocks()
    }

    fn kv_dtype(&self) -> crate::kv_format::KvDtype {
        self.ops.kv_dtype()
    }

    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput> {
        let (rows, _) = self.forward(batch)?;
        let logits = self.ops.read_rows(self.logits, &rows)?;
        Ok(StepOutput { logits })
    }

    fn step_select(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        let (rows, _) = self.forward(batch)?;
        self.ops.select(self.logits, &rows, select)
    }

    /// The forward pass first ([`Exec::execute`] returns once it is launched: on CUDA
    /// enqueued, graph or plain, and not waited for), then the masks (on CUDA while the device
    /// runs the forward), then the selection as `step_select_logprobs` makes it. With
    /// [`Backend::keep_hidden`] on, the forward reads the hidden states back, which waits for
    /// the device before the masks.
    fn step_select_lazy_masks(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
        masks: &mut MaskFn,
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        check_logprobs(select, logprobs)?;
        let (rows, _) = self.forward(batch)?;
        let m = masks()?;
        let select = with_masks(select, &m)?;
        let inner = logits_for_scoring(&select, logprobs);
        let out = self.ops.select(self.logits, &rows, &inner)?;
        Ok(score_on_host(out, &select, logprobs))
    }

    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        self.ops.kv_block_bytes(block)
    }

    fn set_dump(&mut self, dump: Option<DumpFn>) {
        self.ops.set_dump(dump);
    }

    fn keep_hidden(&mut self, on: bool) -> Result<()> {
        if on && !self.ops.reads_step_rows() {
            return Err(Error::Unsupported(format!(
                "mtp speculation is not supported on {} (it reads the target's hidden states, \
                 which this backend does not expose)",
                self.ops.name()
            )));
        }
        self.keep_hidden = on;
        self.hidden.clear();
        Ok(())
    }

    fn take_hidden(&mut self) -> Vec<(StepRow, Vec<f32>)> {
        std::mem::take(&mut self.hidden)
    }

    fn set_state_keep(&mut self, positions: usize) {
        self.ops.set_state_keep(positions);
    }

    fn state_snapshots(&self) -> bool {
        self.ops.state_snapshots()
    }

    fn state_snapshot_capacity(&self) -> Option<usize> {
        self.ops.state_snapshot_capacity()
    }

    fn save_state(&mut self, slot: u32, pos: u32, snap: u32) -> Result<()> {
        self.ops.save_state(slot, pos, snap)
    }

    fn restore_state(&mut self, slot: u32, snap: u32) -> Result<u32> {
        self.ops.restore_state(slot, snap)
    }
}

/// A forward pass that reads a hidden input per row (an MTP layer, models/mtp.rs), run one step
/// at a time: the drafter's side of the hidden-state hand-over (spec/mtp.rs).
pub trait HiddenStep: Backend {
    /// Runs `batch` with `hidden_in` (`rows x hidden` values, in row order) as its rows'
    /// hidden inputs; returns, per row that wants logits (in row order), its logits and its
    /// final hidden state (the residual rows the head read: only those come back).
    fn step_hidden(
        &mut self,
        batch: &StepBatch,
        hidden_in: Vec<f32>,
    ) -> Result<Vec<(Vec<f32>, Vec<f32>)>>;
}

impl<O: Exec> HiddenStep for Runner<O> {
    fn step_hidden(
        &mut self,
        batch: &StepBatch,
        hidden_in: Vec<f32>,
    ) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        let want = batch.rows.len() * self.config.hidden;
        if hidden_in.len() != want {
            return Err(Error::Input(format!(
                "step_hidden: {} hidden input values for {} rows of {}",
                hidden_in.len(),
                batch.rows.len(),
                self.config.hidden
            )));
        }
        self.ops.set_hidden_in(hidden_in)?;
        let (rows, head_x) = self.forward(batch)?;
        let logits = self.ops.read_rows(self.logits, &rows)?;
        let hidden = self.ops.read_rows(head_x, &rows)?;
        Ok(logits.into_iter().zip(hidden).collect())
    }
}
