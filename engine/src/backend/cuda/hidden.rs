//! Hidden states for the MTP drafter (spec/mtp.rs, models/mtp.rs) on the device, and the
//! step's given embedding rows (image input).
//!
//! - Read-back (the target's final hidden states, and the MTP layer's own output of the rows
//!   that want logits) needs nothing here: the runner reads the rows it needs from the step's
//!   activations with `Exec::read_rows`, one device-to-host copy per step.
//! - The MTP forward's hidden input ([`crate::ops::Ops::hidden_in`]): `Exec::set_hidden_in`
//!   uploads the next step's rows into a buffer of at least [`MAX_BUCKET`] rows whose address
//!   stays fixed (a captured graph copies from it; growing it bumps `layout_epoch`, so graphs
//!   are captured again); the op is one device-to-device copy of the step's rows. A forward that
//!   reads them gets an error for a step whose rows were not given.
//! - A pipeline stage's hidden input (crate::pipeline, link.rs): the delivered parcel (the
//!   previous stage's rows for this micro-batch) copied on this stream into the same buffer
//!   (`CudaOps::hidden_in_from`).

use cudarc::driver::CudaSlice;

use super::CudaOps;
use super::graph::MAX_BUCKET;
use crate::error::Result;
use crate::ops::Act;

/// The hidden input rows of the MTP forward.
#[derive(Default)]
pub(super) struct HiddenIn {
    buf: Option<cudarc::driver::CudaSlice<f32>>,
    /// Values given for the next step.
    given: usize,
    /// Rows of the step being run.
    step_rows: usize,
    /// The forward reads them (set by the op's first call).
    read: bool,
}

impl CudaOps {
    /// Uploads the hidden input rows of the next step (`rows x hidden` values, row order).
    pub(super) fn upload_hidden_in(&mut self, rows: Vec<f32>) -> Result<()> {
        let need = rows.len().max(MAX_BUCKET * self.hidden);
        if self.hidden_in.buf.as_ref().is_none_or(|b| b.len() < need) {
            // Queued work (or a captured graph) may still read the old buffer.
            self.gpu.sync()?;
            self.hidden_in.buf = None;
            self.hidden_in.buf = Some(self.gpu.zeros(need.next_power_of_two())?);
            self.layout_epoch += 1;
        }
        if let Some(buf) = self.hidden_in.buf.as_mut()
            && !rows.is_empty()
        {
            self.gpu
                .stream
                .memcpy_htod(rows.as_slice(), buf)
                .map_err(|e| self.gpu.err(format!("hidden input upload: {e:?}")))?;
        }
        self.hidden_in.given = rows.len();
        Ok(())
    }

    /// The pipeline hand-over's delivery (link.rs): the first `n` values of `parcel` (on this
    /// device, its copy already ordered before this stream's next work) become the hidden
    /// input of this stage's next step, by a device copy on this stream into the fixed buffer
    /// a captured graph reads. The host does not wait.
    pub(super) fn hidden_in_from(&mut self, parcel: &CudaSlice<f32>, n: usize) -> Result<()> {
        if !n.is_multiple_of(self.hidden) {
            return Err(self.gpu.err(format!(
                "pipeline hand-over: {n} values into a stage of hidden size {}",
                self.hidden
            )));
        }
        let need = n.max(MAX_BUCKET * self.hidden);
        if self.hidden_in.buf.as_ref().is_none_or(|b| b.len() < need) {
            // Queued work (or a captured graph) may still read the old buffer.
            self.gpu.sync()?;
            self.hidden_in.buf = None;
            self.hidden_in.buf = Some(self.gpu.zeros(need.next_power_of_two())?);
            self.layout_epoch += 1;
        }
        let src = parcel.try_slice(..n).ok_or_else(|| {
            self.gpu.err(format!(
                "pipeline hand-over: a parcel of fewer than {n} values"
            ))
        })?;
        let mut dst = self
            .hidden_in
            .buf
            .as_mut()
            .and_then(|b| b.try_slice_mut(..n))
            .ok_or_else(|| {
                self.gpu
                    .err(format!("pipeline hand-over: no buffer of {n} values"))
            })?;
        self.gpu
            .stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| self.gpu.err(format!("pipeline hand-over: {e:?}")))?;
        self.hidden_in.given = n;
        Ok(())
    }

    /// Before a step of `m` rows: when the forward reads hidden inputs, they must have been
    /// given for exactly these rows.
    pub(super) fn begin_hidden_in(&mut self, m: usize) -> Result<()> {
        self.hidden_in.step_rows = m;
        let h = &self.hidden_in;
        if h.read && h.given != m * self.hidden {
            return Err(self.hidden_in_error(m, self.hidden));
        }
        Ok(())
    }

    /// After a step: its rows are used up.
    pub(super) fn end_hidden_in(&mut self) {
        self.hidden_in.given = 0;
    }

    fn hidden_in_error(&self, m: usize, width: usize) -> crate::error::Error {
        self.gpu.err(format!(
            "hidden_in: {} values for {m} rows of {width}",
            self.hidden_in.given
        ))
    }

    /// The op: the step's hidden input rows into `out` (every row of the launch: a graph
    /// bucket's inert rows copy stale but finite values whose outputs are never read).
    pub(super) fn copy_hidden_in(&mut self, out: Act) -> Result<()> {
        let m = self.hidden_in.step_rows;
        if self.hidden_in.given != m * out.width {
            return Err(self.hidden_in_error(m, out.width));
        }
        self.hidden_in.read = true;
        let n = self.n(out) * out.width;
        let src = self
            .hidden_in
            .buf
            .as_ref()
            .and_then(|b| b.try_slice(..n))
            .ok_or_else(|| self.gpu.err(format!("hidden_in: no buffer of {n} values")))?;
        let dst = self.acts[out.id]
            .buf
            .as_mut()
            .and_then(|b| b.try_slice_mut(..n))
            .ok_or_else(|| {
                self.gpu.err(format!(
                    "hidden_in: activation {} holds fewer than {n} values",
                    out.id
                ))
            });
        let mut dst = dst?;
        self.gpu
            .stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| self.gpu.err(format!("hidden_in copy: {e:?}")))
    }

    /// [`crate::ops::Ops::inject`] (`part` 0): part `part` of each of the step's given rows
    /// (values `part * w..(part + 1) * w` of its row of `e.width`) copied from the host into
    /// its row of `x` (stream-ordered after the embedding that it replaces). Steps with given
    /// rows never run as graphs (step.rs), so the copies are never captured.
    pub(super) fn inject_rows(&mut self, x: Act, part: usize) -> Result<()> {
        let w = x.width;
        let embeds = std::mem::take(&mut self.embeds);
        let mut r = Ok(());
        for e in &embeds {
            let at = e.index * e.width + part * w;
            let src = e
                .values
                .get(at..at + w)
                .filter(|_| (part + 1) * w <= e.width);
            let Some(src) = src else {
                r = Err(self.gpu.err(format!(
                    "inject: part {part} of embedding row {} (rows of {}) of {} values",
                    e.index,
                    e.width,
                    e.values.len()
                )));
                break;
            };
            let dst = self.acts[x.id]
                .buf
                .as_mut()
                .and_then(|b| b.try_slice_mut(e.row * w..(e.row + 1) * w));
            let Some(mut dst) = dst else {
                r = Err(self
                    .gpu
                    .err(format!("inject: activation {} has no row {}", x.id, e.row)));
                break;
            };
            if let Err(err) = self.gpu.stream.memcpy_htod(src, &mut dst) {
                r = Err(self.gpu.err(format!("inject copy: {err:?}")));
                break;
            }
        }
        self.embeds = embeds;
        r
    }

    /// [`crate::ops::Ops::inject_add`]: part `part` of the given rows copied into their rows of
    /// `tmp` ([`CudaOps::inject_rows`]), then added into `x` by `add_in_place` over each run of
    /// consecutive given rows (an image's rows are consecutive in a step), `x[r] = x[r] +
    /// tmp[r]` as the CPU's add; other rows untouched.
    pub(super) fn inject_add_rows(&mut self, x: Act, part: usize, tmp: Act) -> Result<()> {
        if tmp.width != x.width {
            return Err(self.gpu.err(format!(
                "inject_add: scratch of {} for rows of {}",
                tmp.width, x.width
            )));
        }
        self.inject_rows(tmp, part)?;
        let (px, pt, w) = (self.ptr(x)?, self.ptr(tmp)?, x.width);
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for e in &self.embeds {
            match runs.last_mut() {
                Some((r0, n)) if *r0 + *n == e.row => *n += 1,
                _ => runs.push((e.row, 1)),
            }
        }
        for (r0, n) in runs {
            let off = (r0 * w * 4) as u64;
            self.gpu.add_in_place(px + off, pt + off, n * w)?;
        }
        Ok(())
    }
}
