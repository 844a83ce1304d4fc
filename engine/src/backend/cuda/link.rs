//! The pipeline hand-over on CUDA (crate::pipeline::StageLink): stage `i`'s residual rows
//! copied into a parcel buffer on stage `i + 1`'s device (one per micro-batch), and on
//! delivery into that stage's hidden-input buffer (hidden.rs), without leaving the devices.
//!
//! - [`DeviceLink`], same device (two stages on one GPU): a device-to-device copy enqueued on
//!   the sending stage's stream after its forward.
//! - [`DeviceLink`], two devices: a peer copy (`cuMemcpyPeerAsync`, through NVLink or PCIe)
//!   on the sending stage's stream.
//! - [`NcclLink`], two devices: NCCL send/recv over a 2-rank communicator created at start
//!   (one rank per device, both driven from this thread, so each hand-over is one NCCL group),
//!   on a side stream of each device. Chosen when libnccl loads (cudarc loads it at run time;
//!   the build needs no NCCL), else the peer copy (`--pp-link`, crate::pipeline::LinkChoice).
//!
//! Ordering, all by events, the host never waiting: the copy (or the send) waits for the
//! sender's forward, and the sender's next forward (which overwrites the rows) waits for the
//! copy; the receiving stream waits for a parcel only when it is delivered, just before the
//! receiving stage runs those rows, so the receiver's micro-batch j never waits for the
//! sender's micro-batch j + 1; a parcel is written again only after its last delivery read it.
//! Every copy moves the f32 rows as bytes: exact.
//!
//! The peer and NCCL paths are compile-checked here; they run where two GPUs are lent
//! (docs/DEVICE.md).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DriverError};

use super::CudaOps;
use crate::error::{Error, Result};
use crate::ops::Act;
use crate::pipeline::StageLink;

/// One micro-batch's rows on the receiving device.
struct Parcel {
    buf: CudaSlice<f32>,
    /// Values sent.
    n: usize,
    /// Recorded after the copy that filled it; taken by the delivery.
    sent: Option<CudaEvent>,
    /// Recorded on the receiving stream after the delivery read it.
    read: Option<CudaEvent>,
}

impl Parcel {
    /// The parcel holds `n` values once `stream`'s work queued so far (the copy or the
    /// receive) has run; `from`'s device names the error.
    fn filled(&mut self, n: usize, stream: &CudaStream, from: &CudaOps) -> Result<()> {
        self.n = n;
        self.sent = Some(stream.record_event(None).map_err(fail(from))?);
        Ok(())
    }
}

/// The error of a failed CUDA call of the hand-over, on `ops`'s device.
fn fail(ops: &CudaOps) -> impl Fn(DriverError) -> Error + Copy + '_ {
    move |e| ops.gpu.err(format!("pipeline hand-over: {e:?}"))
}

/// The parcels of one link, on the receiving device.
#[derive(Default)]
struct Parcels(Vec<Parcel>);

impl Parcels {
    /// Parcel `slot` with room for `n` values, allocated on `to`'s device when missing or too
    /// small (the allocation's zeroing is on `to`'s stream: `writer` waits for it).
    fn get(
        &mut self,
        to: &CudaOps,
        slot: usize,
        n: usize,
        writer: &CudaStream,
    ) -> Result<&mut Parcel> {
        while self.0.len() <= slot || self.0[slot].buf.len() < n {
            let fresh = Parcel {
                buf: to.gpu.zeros(n.max(1).next_power_of_two())?,
                n: 0,
                sent: None,
                read: None,
            };
            // The old buffer is freed on `to`'s stream: after any copy `writer` queued into
            // it; the new one is written by `writer` after its zeroing.
            to.gpu.stream.join(writer).map_err(fail(to))?;
            writer.join(&to.gpu.stream).map_err(fail(to))?;
            match self.0.get_mut(slot) {
                Some(p) => *p = fresh,
                None => self.0.push(fresh),
            }
        }
        Ok(&mut self.0[slot])
    }

    /// Parcel `slot` ready for `writer` to fill with `n` values: [`Parcels::get`], then
    /// `writer` waits for the last delivery that read it; `from`'s device names the error.
    fn ready(
        &mut self,
        from: &CudaOps,
        to: &CudaOps,
        slot: usize,
        n: usize,
        writer: &CudaStream,
    ) -> Result<&mut Parcel> {
        let p = self.get(to, slot, n, writer)?;
        if let Some(read) = p.read.take() {
            writer.wait(&read).map_err(fail(from))?;
        }
        Ok(p)
    }

    /// Delivers parcel `slot` to `to`: `to`'s stream waits for its copy, then takes its rows
    /// as the next step's hidden input.
    fn deliver(&mut self, to: &mut CudaOps, slot: usize) -> Result<()> {
        let p = self.0.get_mut(slot);
        let Some((p, sent)) = p.and_then(|p| p.sent.take().map(|e| (p, e))) else {
            return Err(to
                .gpu
                .err(format!("pipeline hand-over: parcel {slot} was never sent")));
        };
        to.gpu.stream.wait(&sent).map_err(fail(to))?;
        to.hidden_in_from(&p.buf, p.n)?;
        let read = to.gpu.stream.record_event(None);
        p.read = Some(read.map_err(fail(to))?);
        Ok(())
    }
}

/// The rows `0..rows` of `from`'s activation `x`: its first `rows * x.width` values.
fn rows_of<'a>(from: &'a CudaOps, x: Act, rows: usize, to: &CudaOps) -> Result<CudaView<'a, f32>> {
    if x.width != to.hidden {
        return Err(to.gpu.err(format!(
            "pipeline hand-over: rows of {} values into a stage of hidden size {}",
            x.width, to.hidden
        )));
    }
    let n = rows * x.width;
    let src = from.acts[x.id].buf.as_ref().and_then(|b| b.try_slice(..n));
    src.ok_or_else(|| {
        from.gpu
            .err(format!("pipeline hand-over: no {n} values to send"))
    })
}

/// A device-to-device (`peer: false`) or peer (`peer: true`) copy of the hand-over rows.
pub struct DeviceLink {
    peer: bool,
    /// Peer access from the sender's context to the receiver's memory is on (a direct copy
    /// over NVLink or PCIe); off, the driver stages the peer copy through the host.
    p2p: bool,
    parcels: Parcels,
}

impl DeviceLink {
    /// `peer`: the two stages are on different devices (see [`DeviceLink::peer`]).
    pub fn new(peer: bool) -> DeviceLink {
        DeviceLink {
            peer,
            p2p: false,
            parcels: Parcels::default(),
        }
    }

    /// The peer copy from `from`'s device to `to`'s, with peer access turned on where the
    /// devices allow it (else the copy is staged through the host: slower, the same bytes).
    pub fn peer(from: &CudaOps, to: &CudaOps) -> Result<DeviceLink> {
        use cudarc::driver::sys::{CUresult, cuCtxEnablePeerAccess};
        from.gpu
            .ctx
            .bind_to_thread()
            .map_err(|e| from.gpu.err(format!("peer access: {e:?}")))?;
        // SAFETY: both contexts are alive (held by the stages); the call only changes what
        // the current context (the sender's, bound above) may address.
        let r = unsafe { cuCtxEnablePeerAccess(to.gpu.ctx.cu_ctx(), 0) };
        let p2p = matches!(
            r,
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        );
        Ok(DeviceLink {
            peer: true,
            p2p,
            parcels: Parcels::default(),
        })
    }
}

impl StageLink<CudaOps> for DeviceLink {
    fn kind(&self) -> &'static str {
        match (self.peer, self.p2p) {
            (false, _) => "device copy",
            (true, true) => "peer copy",
            (true, false) => "peer copy (no peer access: staged through the host)",
        }
    }

    fn send(
        &mut self,
        from: &mut CudaOps,
        x: Act,
        rows: usize,
        to: &mut CudaOps,
        slot: usize,
    ) -> Result<()> {
        let view = rows_of(from, x, rows, to)?;
        let n = view.len();
        let src = view.device_ptr(&from.gpu.stream).0;
        let s_from = Arc::clone(&from.gpu.stream);
        let p = self.parcels.ready(from, to, slot, n, &s_from)?;
        let fail = fail(from);
        let bytes = n * std::mem::size_of::<f32>();
        let dst = to.gpu.ptr(&p.buf);
        from.gpu.ctx.bind_to_thread().map_err(fail)?;
        // SAFETY: `src` holds `n` values of `from`'s activation (checked by `rows_of`) and
        // `dst` the parcel's at least `n` (`Parcels::get`); both stay allocated until the copy
        // has run: the activation is only freed or regrown after a synchronization of its
        // stream, on which the copy is queued, and the parcel is freed on `to`'s stream, which
        // waits for this copy before the delivery and any later reallocation.
        let copied = unsafe {
            if self.peer {
                cudarc::driver::result::memcpy_peer_async(
                    to.gpu.ctx.cu_ctx(),
                    dst,
                    from.gpu.ctx.cu_ctx(),
                    src,
                    bytes,
                    s_from.cu_stream(),
                )
            } else {
                cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, s_from.cu_stream())
            }
        };
        copied.map_err(fail)?;
        p.filled(n, &s_from, from)
    }

    fn deliver(&mut self, to: &mut CudaOps, slot: usize) -> Result<()> {
        self.parcels.deliver(to, slot)
    }
}

/// Whether libnccl loads on this machine (cudarc loads it at run time).
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library (libloading); no NCCL call is made.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// The 2-rank communicator of an [`NcclLink`]. `Comm` holds a raw NCCL handle and is not
/// `Send`; it is only used through `&mut` of the pipeline that owns the link, one thread at a
/// time, and NCCL communicators may be used from any thread so used.
struct Comms(Vec<cudarc::nccl::Comm>);
// SAFETY: see above.
unsafe impl Send for Comms {}

/// NCCL send/recv between stages on two GPUs: rank 0 on the sending device, rank 1 on the
/// receiving one, each on a side stream of its device.
pub struct NcclLink {
    comms: Comms,
    parcels: Parcels,
}

impl NcclLink {
    /// The communicator over `from`'s and `to`'s devices (two different GPUs), created once
    /// at start. An error, not a panic, when libnccl does not load or the devices are one.
    pub fn open(from: &CudaOps, to: &CudaOps) -> Result<NcclLink> {
        let (a, b) = (from.gpu.ctx.ordinal(), to.gpu.ctx.ordinal());
        Self::check(a, b)?;
        let side = |o: &CudaOps| {
            o.gpu
                .ctx
                .new_stream()
                .map_err(|e| o.gpu.err(format!("nccl side stream: {e:?}")))
        };
        let streams = vec![side(from)?, side(to)?];
        let comms = cudarc::nccl::Comm::from_devices(streams).map_err(|e| {
            Error::Unsupported(format!(
                "nccl: creating the communicator of cuda:{a} and cuda:{b}: {e:?}"
            ))
        })?;
        Ok(NcclLink {
            comms: Comms(comms),
            parcels: Parcels::default(),
        })
    }

    /// Refuses what NCCL cannot link (checked before any CUDA or NCCL call).
    pub fn check(from: usize, to: usize) -> Result<()> {
        if from == to {
            return Err(Error::Input(format!(
                "--pp-link nccl: both stages are on cuda:{from}; NCCL links stages on two \
                 different GPUs (one GPU uses a device copy)"
            )));
        }
        if !nccl_available() {
            return Err(Self::missing());
        }
        Ok(())
    }

    /// The error of a machine where libnccl does not load.
    pub fn missing() -> Error {
        Error::Unsupported(
            "--pp-link nccl: the NCCL library (libnccl.so) did not load; install NCCL or use \
             --pp-link peer (or auto, which falls back to the peer copy)"
                .into(),
        )
    }
}

impl StageLink<CudaOps> for NcclLink {
    fn kind(&self) -> &'static str {
        "nccl"
    }

    fn send(
        &mut self,
        from: &mut CudaOps,
        x: Act,
        rows: usize,
        to: &mut CudaOps,
        slot: usize,
    ) -> Result<()> {
        let src = rows_of(from, x, rows, to)?;
        let n = src.len();
        let [c0, c1] = self.comms.0.as_slice() else {
            return Err(Error::Unsupported(
                "nccl: the communicator has not 2 ranks".into(),
            ));
        };
        let (side0, side1) = (c0.stream(), c1.stream());
        let fail = fail(from);
        // The send reads the rows after the sender's forward; the receive overwrites the
        // parcel after its last delivery read it (`ready`).
        side0.join(&from.gpu.stream).map_err(fail)?;
        let p = self.parcels.ready(from, to, slot, n, &side1)?;
        let mut dst = p.buf.try_slice_mut(..n);
        let Some(dst) = dst.as_mut() else {
            return Err(from
                .gpu
                .err(format!("pipeline hand-over: no {n} values to send")));
        };
        let nccl = |e: cudarc::nccl::result::NcclError| {
            from.gpu.err(format!("pipeline hand-over (nccl): {e:?}"))
        };
        // One thread drives both ranks: the send and the receive must be one group.
        cudarc::nccl::group_start().map_err(nccl)?;
        let sent = c0.send(&src, 1).map_err(nccl);
        let recv = c1.recv(dst, 0).map(|_| ()).map_err(nccl);
        cudarc::nccl::group_end().map_err(nccl)?;
        sent.and(recv)?;
        // The sender's next forward overwrites the rows: after the send.
        from.gpu.stream.join(&side0).map_err(fail)?;
        p.filled(n, &side1, from)
    }

    fn deliver(&mut self, to: &mut CudaOps, slot: usize) -> Result<()> {
        self.parcels.deliver(to, slot)
    }
}
