//! The hand-over between two pipeline stages: after stage `i` has run its layers over a
//! step's rows (or a micro-batch's, micro.rs), the residual rows (`rows x hidden` f32, the
//! activation its body returned) become stage `i + 1`'s hidden input
//! ([`crate::ops::Ops::hidden_in`]) when it runs the same rows. The values are copied exactly
//! (f32 to f32, as bytes), so a row's bits do not depend on where the model is split.
//!
//! A hand-over has two halves, so that a stage can run every micro-batch of a step before the
//! next stage runs the first: [`StageLink::send`] puts the rows in parcel `slot` (one per
//! micro-batch), [`StageLink::deliver`] makes a parcel the receiving stage's hidden input just
//! before it runs those rows. On a device the receiving stage then waits for that parcel's
//! copy only, not for the sender's later micro-batches.
//!
//! Implementations: [`HostLink`] (through host memory: any backend, the CPU's), and on CUDA
//! `backend::cuda::link::DeviceLink` (a device-to-device copy on one GPU, a peer copy between
//! two) and `backend::cuda::link::NcclLink` (NCCL send/recv between two GPUs).

use crate::backend::exec::Exec;
use crate::error::{Error, Result};
use crate::ops::Act;

/// Moves a stage's output rows to the next stage.
pub trait StageLink<O: Exec>: Send {
    /// What the link is (`host copy`, `device copy`, `peer copy`, `nccl`), for the startup
    /// log and `/v1/models`.
    fn kind(&self) -> &'static str;
    /// Puts rows `0..rows` of `x` (a step activation of `from`) in parcel `slot`. On a device
    /// the copy is ordered after `from`'s queued work and before `from`'s next (which may
    /// overwrite `x`); it need not have completed when this returns, and `to`'s stream does
    /// not wait for it yet.
    fn send(&mut self, from: &mut O, x: Act, rows: usize, to: &mut O, slot: usize) -> Result<()>;
    /// Makes parcel `slot` the hidden input of the step `to` runs next (ordered after the
    /// parcel's copy). A parcel is delivered once; delivering one never sent is an error.
    fn deliver(&mut self, to: &mut O, slot: usize) -> Result<()>;
}

/// Reads the rows back to the host ([`Exec::read_rows`]) and gives them to the next stage on
/// delivery ([`Exec::set_hidden_in`]).
#[derive(Default)]
pub struct HostLink {
    parcels: Vec<Option<Vec<f32>>>,
}

impl<O: Exec> StageLink<O> for HostLink {
    fn kind(&self) -> &'static str {
        "host copy"
    }

    fn send(&mut self, from: &mut O, x: Act, rows: usize, _to: &mut O, slot: usize) -> Result<()> {
        let all: Vec<usize> = (0..rows).collect();
        let values = from.read_rows(x, &all)?.concat();
        if self.parcels.len() <= slot {
            self.parcels.resize(slot + 1, None);
        }
        self.parcels[slot] = Some(values);
        Ok(())
    }

    fn deliver(&mut self, to: &mut O, slot: usize) -> Result<()> {
        let values = self.parcels.get_mut(slot).and_then(Option::take);
        let values = values.ok_or_else(|| {
            Error::Input(format!("pipeline hand-over: parcel {slot} was never sent"))
        })?;
        to.set_hidden_in(values)
    }
}
