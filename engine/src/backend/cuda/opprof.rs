//! A per-op device-time profile of plain (non-graph) steps, for tuning: with
//! `MEMRA_PROFILE_OPS=1` the backend records a CUDA event after each op group of a step and,
//! when dropped, prints the time between consecutive events summed per op label (stderr).
//! Graph steps are not profiled (run with `--no-cuda-graph`).

use std::cell::RefCell;
use std::collections::BTreeMap;

use cudarc::driver::CudaEvent;

use super::Gpu;

/// (decode or prefill, op label).
type Key = (&'static str, &'static str);

pub(super) struct OpProf {
    marks: RefCell<Vec<(&'static str, CudaEvent)>>,
    /// (decode or prefill, label) -> (count, milliseconds), and steps by row count.
    totals: RefCell<BTreeMap<Key, (u64, f64)>>,
    steps: RefCell<BTreeMap<usize, (u64, f64)>>,
}

// SAFETY: the events are only used by the backend's own thread (the backend is used through
// &mut, one thread at a time).
unsafe impl Send for OpProf {}

impl OpProf {
    /// A profile when `on` (`MEMRA_PROFILE_OPS=1`, settings.rs), else none.
    pub fn when(on: bool) -> Option<OpProf> {
        on.then(|| OpProf {
            marks: RefCell::new(Vec::new()),
            totals: RefCell::new(BTreeMap::new()),
            steps: RefCell::new(BTreeMap::new()),
        })
    }

    /// Marks the end of op `label` on the stream.
    pub fn tick(&self, g: &Gpu, label: &'static str) {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        if let Ok(e) = g.ctx.new_event(flags)
            && e.record(&g.stream).is_ok()
        {
            self.marks.borrow_mut().push((label, e));
        }
    }

    /// Accumulates the marks of one finished step of `rows` rows.
    pub fn finish_step(&self, rows: usize) {
        let marks = std::mem::take(&mut *self.marks.borrow_mut());
        let mut totals = self.totals.borrow_mut();
        let kind = if rows <= 64 { "decode" } else { "prefill" };
        let mut step = 0.0;
        for w in marks.windows(2) {
            if let Ok(ms) = w[0].1.elapsed_ms(&w[1].1) {
                let t = totals.entry((kind, w[1].0)).or_insert((0, 0.0));
                t.0 += 1;
                t.1 += ms as f64;
                step += ms as f64;
            }
        }
        let mut steps = self.steps.borrow_mut();
        let s = steps.entry(rows).or_insert((0, 0.0));
        s.0 += 1;
        s.1 += step;
    }
}

impl Drop for OpProf {
    fn drop(&mut self) {
        let totals = self.totals.borrow();
        eprintln!("== op profile (plain steps; ms summed over all steps; decode <= 64 rows)");
        for (rows, (n, ms)) in self.steps.borrow().iter() {
            eprintln!(
                "steps of {rows:>5} rows: {n:>6} steps, {:.3} ms per step",
                ms / *n as f64
            );
        }
        let mut v: Vec<_> = totals.iter().collect();
        v.sort_by(|a, b| a.0.0.cmp(b.0.0).then(b.1.1.total_cmp(&a.1.1)));
        for ((kind, label), (n, ms)) in v {
            let all: f64 = totals
                .iter()
                .filter(|(k, _)| k.0 == *kind)
                .map(|(_, t)| t.1)
                .sum();
            eprintln!(
                "{kind:<8} {label:<14} {n:>8} calls {ms:>10.3} ms {:>5.1}%",
                100.0 * ms / all.max(1e-12)
            );
        }
    }
}
