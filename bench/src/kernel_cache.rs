//! `memra-bench kernel-cache --arch sm_90a [--out DIR]`: precompiles every kernel module and
//! products variant the engine can load on that architecture to SASS (cubin files named by the
//! kernel cache's key), on a machine without a GPU. A device whose `MEMRA_KERNEL_CACHE` holds
//! them loads them as they are: no NVRTC, no driver JIT (docs/DEVICE.md section 1).

use std::path::Path;
use std::time::Instant;

use memra_engine::backend::cuda::profile::kernel_builds;
use memra_engine::error::{Error, Result};

/// The virtual architecture of a `--arch` value: `sm_90a` / `compute_90a` -> `compute_90a`
/// (the architectures the engine runs on: Hopper and Blackwell consumer / workstation parts).
pub fn virtual_arch(arch: &str) -> Result<&'static str> {
    match arch.trim() {
        "sm_90a" | "compute_90a" => Ok("compute_90a"),
        "sm_120a" | "compute_120a" => Ok("compute_120a"),
        other => Err(Error::Input(format!(
            "--arch {other}: expected sm_90a (H100/H200) or sm_120a (RTX 5090 / RTX PRO 6000)"
        ))),
    }
}

/// One written cubin: its file name, size and compile seconds.
pub struct Written {
    pub file: String,
    pub bytes: u64,
    pub secs: f64,
}

/// Compiles every [`kernel_builds`] entry of `arch` to a cubin under `out`, `threads` at a time,
/// keeping a cubin already there (its name is the key of its source and options: the same
/// compile; a run with `MEMRA_KERNEL_DIR` then compiles only the builds the directory changes).
/// Stops at the first failure, naming the module and its defines.
pub fn write_all(arch: &str, out: &Path, threads: usize) -> Result<Vec<Written>> {
    let arch = virtual_arch(arch)?;
    let builds = kernel_builds(arch);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, builds.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((m, b)) = builds.get(i) else { break };
                    let t0 = Instant::now();
                    let have = memra_kernels::cubin::cubin_path_with(out, m, arch, b)
                        .ok()
                        .filter(|p| p.is_file());
                    let r = have
                        .map(Ok)
                        .unwrap_or_else(|| memra_kernels::cubin::write_cubin_with(m, arch, out, b))
                        .map_err(|e| format!("{} {:?}: {e}", m.file, b.defines))
                        .map(|p| {
                            let bytes = std::fs::metadata(&p).map(|md| md.len()).unwrap_or(0);
                            let file = p
                                .file_name()
                                .map(|f| f.to_string_lossy().into_owned())
                                .unwrap_or_default();
                            Written {
                                file,
                                bytes,
                                secs: t0.elapsed().as_secs_f64(),
                            }
                        });
                    let failed = r.is_err();
                    results.lock().map(|mut v| v.push((i, r))).ok();
                    if failed {
                        next.store(usize::MAX / 2, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                }
            });
        }
    });
    let mut results = results
        .into_inner()
        .map_err(|_| Error::Input("kernel-cache: a compile thread panicked".into()))?;
    results.sort_by_key(|(i, _)| *i);
    results
        .into_iter()
        .map(|(_, r)| r.map_err(|e| Error::Input(format!("kernel-cache: {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(virtual_arch("sm_90a").unwrap(), "compute_90a");
        assert_eq!(virtual_arch("compute_120a").unwrap(), "compute_120a");
        let e = virtual_arch("sm_75").unwrap_err().to_string();
        assert!(e.contains("sm_75") && e.contains("sm_90a"), "{e}");
    }
}
