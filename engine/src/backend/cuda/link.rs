//! The pipeline hand-over on CUDA (crate::pipeline::StageLink): stage `i`'s residual rows
//! copied into stage `i + 1`'s hidden-input buffer (hidden.rs) without leaving the device.
//!
//! - Same device (two stages on one GPU): a device-to-device copy enqueued on the sending
//!   stage's stream after its forward; the receiving stream then waits for it (an event).
//! - Two devices: the receiving stream waits for the sender's queued work, then a peer copy
//!   (`cuMemcpyPeerAsync`, through NVLink or PCIe) on the receiving stream. This path is
//!   compile-checked here; it runs where two GPUs are lent (docs/DEVICE.md). NCCL send/recv
//!   would replace this one type.
//!
//! Either way the host does not wait: the copy is ordered between the two stages' kernels
//! (or graphs) on the device.

use super::CudaOps;
use crate::error::Result;
use crate::ops::Act;
use crate::pipeline::StageLink;

/// A device-to-device (`peer: false`) or peer (`peer: true`) copy of the hand-over rows.
pub struct DeviceLink {
    peer: bool,
}

impl DeviceLink {
    /// `peer`: the two stages are on different devices.
    pub fn new(peer: bool) -> DeviceLink {
        DeviceLink { peer }
    }
}

impl StageLink<CudaOps> for DeviceLink {
    fn kind(&self) -> &'static str {
        if self.peer {
            "peer copy"
        } else {
            "device copy"
        }
    }

    fn send(&mut self, from: &mut CudaOps, x: Act, rows: usize, to: &mut CudaOps) -> Result<()> {
        to.receive_hidden_in(from, x, rows, self.peer)
    }
}
