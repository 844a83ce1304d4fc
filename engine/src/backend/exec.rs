//! What the generic runner (runner.rs) needs from a backend beyond the ops (crate::ops): step
//! setup and the forward pass (plainly or as a captured graph), gathering and reading rows,
//! token selection, KV bytes.

use super::{DumpFn, SelectParams, StepBatch, StepSelected, select_on_host};
use crate::error::Result;
use crate::ops::{Act, Ops};

/// Which rows a step's output head runs on.
#[derive(Clone, Copy, Debug)]
pub enum HeadRows<'a> {
    /// The rows at these step indices are gathered into [`Rows::Head`](crate::ops::Rows::Head) activations first.
    Gather(&'a [usize]),
    /// Every step row (a captured graph computes logits for all rows; row `i`'s logits are
    /// then at head row `i`). The head input is the step activation itself.
    All,
}

/// What the generic runner ([`super::runner::Runner`]) needs beyond the ops: step setup,
/// running the forward (plainly or as a captured graph), gathering and reading rows, KV bytes.
pub trait Exec: Ops {
    /// Short name (`cpu`, `cuda:0`).
    fn name(&self) -> String;
    /// See [`crate::backend::Backend::profile`].
    fn profile(&self) -> Option<String> {
        None
    }
    fn kv_block_size(&self) -> usize;
    fn kv_blocks(&self) -> usize;
    fn kv_dtype(&self) -> crate::kv_format::KvDtype;

    /// Runs one step's forward: sets up the rows of `batch` (checked by the runner) and calls
    /// `pass` with the head rows to use. Returns, per row of `want` (the step rows that want
    /// logits), its row in the head activations. It may return before the device has run the
    /// pass, and should when it can (the CUDA backend enqueues the kernels or the step's graph
    /// and does not wait): the runner computes the step's grammar masks meanwhile
    /// ([`crate::backend::Backend::step_select_lazy_masks`]).
    fn execute(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Vec<usize>>;

    /// Copies step rows `rows` of `x` into head rows `0..rows.len()` of `out` and sets the
    /// head row count to `rows.len()`.
    fn gather(&mut self, x: Act, rows: &[usize], out: Act) -> Result<()>;

    /// The values of rows `rows` of a head activation (logits), in that order.
    fn read_rows(&mut self, x: Act, rows: &[usize]) -> Result<Vec<Vec<f32>>>;

    /// Picks tokens as [`super::Backend::step_select`] says, from the logits at head rows
    /// `rows` (one per entry of `select`). The default reads the logits back and samples on
    /// the host; a backend may pick on the device, but must pick exactly the same token.
    fn select(
        &mut self,
        logits: Act,
        rows: &[usize],
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        let l = self.read_rows(logits, rows)?;
        Ok(select_on_host(l, select))
    }

    /// Sets the hidden input rows (`rows x width` values) of the following steps, for
    /// [`Ops::hidden_in`] (MTP). Only backends with [`crate::ops::Feature::Mtp`] have it.
    fn set_hidden_in(&mut self, _rows: Vec<f32>) -> Result<()> {
        Err(crate::error::Error::Unsupported(format!(
            "mtp speculation is not yet supported on {}",
            self.name()
        )))
    }

    /// Whether [`Ops::inject`] writes the step's given embeddings
    /// ([`super::StepBatch::embeds`], image input). The CPU does; CUDA does not yet.
    fn injects_rows(&self) -> bool {
        false
    }

    /// Whether [`Exec::read_rows`] reads step activations after a step (the residual rows the
    /// MTP drafter needs, [`crate::backend::Backend::keep_hidden`]).
    fn reads_step_rows(&self) -> bool {
        false
    }

    /// The raw bytes of one KV block (all layers, K then V).
    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>>;

    /// See [`crate::backend::Backend::set_state_keep`].
    fn set_state_keep(&mut self, _positions: usize) {}

    /// See [`crate::backend::Backend::state_snapshots`].
    fn state_snapshots(&self) -> bool {
        false
    }

    /// See [`crate::backend::Backend::state_snapshot_capacity`].
    fn state_snapshot_capacity(&self) -> Option<usize> {
        None
    }

    /// See [`crate::backend::Backend::save_state`].
    fn save_state(&mut self, _slot: u32, _pos: u32, _snap: u32) -> Result<()> {
        Err(crate::error::Error::Unsupported(format!(
            "recurrent-state snapshots are not supported on {}",
            self.name()
        )))
    }

    /// See [`crate::backend::Backend::restore_state`].
    fn restore_state(&mut self, _slot: u32, _snap: u32) -> Result<u32> {
        Err(crate::error::Error::Unsupported(format!(
            "recurrent-state snapshots are not supported on {}",
            self.name()
        )))
    }

    /// Installs (or removes) the sink for [`Ops::dump`].
    fn set_dump(&mut self, _dump: Option<DumpFn>) {}
}
