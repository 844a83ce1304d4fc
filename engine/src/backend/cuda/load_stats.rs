//! Where a model's load goes on CUDA, summed over the process: repacking weights into the
//! products' tile layouts and the host-to-device copies (`memra-bench` prints them after the
//! engine starts, so a lease's logs say what its loads of a 48 GB file cost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static REPACK_NS: AtomicU64 = AtomicU64::new(0);
static UPLOAD_NS: AtomicU64 = AtomicU64::new(0);
static UPLOAD_BYTES: AtomicU64 = AtomicU64::new(0);

/// Time spent so far in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadStats {
    /// Repacking into tile layouts (seconds).
    pub repack_s: f64,
    /// Host-to-device copies (seconds) and their bytes.
    pub upload_s: f64,
    pub upload_bytes: u64,
}

/// The totals so far.
pub fn load_stats() -> LoadStats {
    LoadStats {
        repack_s: REPACK_NS.load(Ordering::Relaxed) as f64 * 1e-9,
        upload_s: UPLOAD_NS.load(Ordering::Relaxed) as f64 * 1e-9,
        upload_bytes: UPLOAD_BYTES.load(Ordering::Relaxed),
    }
}

/// Runs `f`, adding its time to `total`.
fn timed<R>(total: &AtomicU64, f: impl FnOnce() -> R) -> R {
    let t0 = Instant::now();
    let r = f();
    total.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Runs a repack, counting its time.
pub(super) fn repacking<R>(f: impl FnOnce() -> R) -> R {
    timed(&REPACK_NS, f)
}

/// Runs a host-to-device copy of `bytes`, counting its time and bytes.
pub(super) fn uploading<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    UPLOAD_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    timed(&UPLOAD_NS, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_grow_with_what_ran() {
        let before = load_stats();
        let v = uploading(1000, || repacking(|| 7));
        assert_eq!(v, 7);
        let after = load_stats();
        assert_eq!(after.upload_bytes - before.upload_bytes, 1000);
        assert!(after.upload_s >= before.upload_s && after.repack_s >= before.repack_s);
        assert!(after.upload_s - before.upload_s >= after.repack_s - before.repack_s - 1e-9);
    }
}
