//! The hand-over between two pipeline stages: after stage `i` has run its layers over a
//! step's rows, the residual rows (`rows x hidden` f32, the activation its body returned)
//! become stage `i + 1`'s hidden input ([`crate::ops::Ops::hidden_in`]) for the same step.
//! The values are copied exactly (f32 to f32), so a row's bits do not depend on where the
//! model is split.
//!
//! Implementations: [`HostLink`] (through host memory: any backend, the CPU's), and on CUDA
//! `backend::cuda::link::DeviceLink` (a device-to-device copy on one GPU, a peer copy between
//! two; backend/cuda/link.rs).

use crate::backend::exec::Exec;
use crate::error::Result;
use crate::ops::Act;

/// Moves a stage's output rows to the next stage.
pub trait StageLink<O: Exec>: Send {
    /// What the link is (`host copy`, `device copy`, `peer copy`), for the startup log.
    fn kind(&self) -> &'static str;
    /// Hands rows `0..rows` of `x` (a step activation of `from`) to `to` as the hidden input
    /// of the step `to` runs next. On a device the copy is ordered after `from`'s queued work
    /// and before `to`'s next; it need not have completed when this returns.
    fn send(&mut self, from: &mut O, x: Act, rows: usize, to: &mut O) -> Result<()>;
}

/// Reads the rows back to the host and gives them to the next stage
/// ([`Exec::read_rows`], [`Exec::set_hidden_in`]).
pub struct HostLink;

impl<O: Exec> StageLink<O> for HostLink {
    fn kind(&self) -> &'static str {
        "host copy"
    }

    fn send(&mut self, from: &mut O, x: Act, rows: usize, to: &mut O) -> Result<()> {
        let all: Vec<usize> = (0..rows).collect();
        let values = from.read_rows(x, &all)?.concat();
        to.set_hidden_in(values)
    }
}
