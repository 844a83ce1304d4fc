//! Precompiled kernels: NVRTC compiles a module straight to SASS for the real architecture
//! (`sm_90a`, a cubin) so that a machine loading it runs neither NVRTC nor the driver's PTX JIT.
//! `memra-bench kernel-cache --arch sm_90a --out DIR` writes them on a machine without a GPU;
//! the device loads `DIR/<module>-sm_90a-<hash>.cubin` when `MEMRA_KERNEL_CACHE` names DIR,
//! the hash being the PTX cache's (source and options), so a changed source or define never
//! loads a stale cubin. A cache folder without cubins gives the PTX path.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys::{self, nvrtcResult};

use crate::{
    Build, KernelError, Module, cache_hash, catch_panic, compile_cached_with, full_source_with,
    options_for,
};

/// A module's loadable image: SASS for the device's chip, or PTX for the driver to JIT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// The real architecture of a virtual one: `compute_90a` -> `sm_90a` (also accepts `sm_*`).
pub fn sass_arch(arch: &str) -> Result<String, KernelError> {
    let tail = arch
        .strip_prefix("compute_")
        .or_else(|| arch.strip_prefix("sm_"))
        .filter(|t| !t.is_empty() && t.chars().next().is_some_and(|c| c.is_ascii_digit()));
    match tail {
        Some(t) => Ok(format!("sm_{t}")),
        None => Err(KernelError::Compile {
            file: String::new(),
            arch: arch.to_string(),
            what: "not an architecture name (compute_90a or sm_90a)".into(),
            log: String::new(),
        }),
    }
}

/// The cubin file of `m` under build `b` for `arch`: `<module>-<sm arch>-<hash>.cubin`, the hash
/// of the full source and options (the PTX cache's); no NVRTC version: SASS is for the chip.
pub fn cubin_path_with(
    dir: &Path,
    m: &Module,
    arch: &str,
    b: &Build,
) -> Result<PathBuf, KernelError> {
    Ok(dir.join(format!(
        "{}-{}-{}.cubin",
        m.name,
        sass_arch(arch)?,
        cache_hash(m, b)
    )))
}

fn check(r: nvrtcResult, what: &str) -> Result<(), String> {
    if r == nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// Compiles `m` under `b` to a cubin for the real architecture of `arch`.
pub fn compile_cubin_with(m: &Module, arch: &str, b: &Build) -> Result<Vec<u8>, KernelError> {
    let sm = sass_arch(arch)?;
    let fail = |what: String, log: String| KernelError::Compile {
        file: m.file.to_string(),
        arch: sm.clone(),
        what,
        log,
    };
    let src = CString::new(full_source_with(m, b))
        .map_err(|_| fail("the source holds a NUL byte".into(), String::new()))?;
    let name = CString::new(m.file).map_err(|_| fail("bad file name".into(), String::new()))?;
    let mut opts: Vec<CString> = vec![CString::new(format!("--gpu-architecture={sm}")).unwrap()];
    for o in options_for(m, b) {
        opts.push(
            CString::new(o).map_err(|_| fail("an option holds a NUL".into(), String::new()))?,
        );
    }
    let out = catch_panic(|| -> Result<Vec<u8>, (String, String)> {
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: valid C strings that outlive the program; the program is destroyed below.
        unsafe {
            let r = sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            check(r, "nvrtcCreateProgram").map_err(|e| (e, String::new()))?;
            let ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
            let res = check(
                sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()),
                "nvrtcCompileProgram",
            )
            .and_then(|_| {
                let mut size = 0usize;
                check(sys::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize")?;
                let mut bin = vec![0u8; size];
                check(
                    sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast()),
                    "nvrtcGetCUBIN",
                )?;
                Ok(bin)
            });
            let log = res
                .as_ref()
                .err()
                .map(|_| program_log(prog))
                .unwrap_or_default();
            let _ = sys::nvrtcDestroyProgram(&mut prog);
            res.map_err(|e| (e, log))
        }
    })
    .map_err(KernelError::NvrtcMissing)?;
    out.map_err(|(what, log)| fail(what, log))
}

/// The program's compile log (empty when it cannot be read).
///
/// # Safety
/// `prog` is a live NVRTC program.
unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: the caller's program; the buffer is as long as NVRTC says.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog, &mut size) != nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) != nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Compiles `m` under `b` to a cubin and writes it (atomically) to its file under `dir`.
pub fn write_cubin_with(
    m: &Module,
    arch: &str,
    dir: &Path,
    b: &Build,
) -> Result<PathBuf, KernelError> {
    let path = cubin_path_with(dir, m, arch, b)?;
    let bin = compile_cubin_with(m, arch, b)?;
    let cache_err = |what: String| KernelError::Cache {
        path: path.clone(),
        what,
    };
    std::fs::create_dir_all(dir).map_err(|e| cache_err(format!("creating the folder: {e}")))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &bin).map_err(|e| cache_err(format!("writing: {e}")))?;
    std::fs::rename(&tmp, &path).map_err(|e| cache_err(format!("renaming: {e}")))?;
    Ok(path)
}

/// A cubin file's bytes when it is an ELF image.
fn read_cubin(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path)
        .ok()
        .filter(|b| b.starts_with(b"\x7fELF"))
}

/// The image of `m` under `b` for `arch`: the precompiled cubin under `dir` when there is a valid
/// one and `use_cubin`, else PTX (from the PTX cache or compiled).
pub fn image_with(
    m: &Module,
    arch: &'static str,
    dir: &Path,
    b: &Build,
    use_cubin: bool,
) -> Result<Image, KernelError> {
    if use_cubin && let Some(bin) = read_cubin(&cubin_path_with(dir, m, arch, b)?) {
        return Ok(Image::Cubin(bin));
    }
    compile_cached_with(m, arch, dir, b).map(Image::Ptx)
}

/// [`image_with`] taking a precompiled cubin when there is one (to load PTX instead, point
/// `MEMRA_KERNEL_CACHE` at a folder without cubins).
pub fn load_image_with(
    m: &Module,
    arch: &'static str,
    dir: &Path,
    b: &Build,
) -> Result<Image, KernelError> {
    image_with(m, arch, dir, b, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MODULES, cache_path_with};

    fn smallest() -> &'static Module {
        MODULES
            .iter()
            .min_by_key(|m| full_source_with(m, &Build::default()).len())
            .unwrap()
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("memra-cubin-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn sass_arch_names() {
        assert_eq!(sass_arch("compute_90a").unwrap(), "sm_90a");
        assert_eq!(sass_arch("compute_120a").unwrap(), "sm_120a");
        assert_eq!(sass_arch("sm_90a").unwrap(), "sm_90a");
        assert!(sass_arch("volta").is_err());
        assert!(sass_arch("compute_").is_err());
    }

    #[test]
    fn cubin_path_is_keyed_by_source_and_defines() {
        let m = smallest();
        let d = Path::new("/x");
        let a = cubin_path_with(d, m, "compute_90a", &Build::default()).unwrap();
        let b =
            cubin_path_with(d, m, "compute_90a", &Build::with_defines(&["X=1".into()])).unwrap();
        let c = cubin_path_with(d, m, "compute_120a", &Build::default()).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(a.to_string_lossy().contains("-sm_90a-"));
        assert!(a.extension().is_some_and(|e| e == "cubin"));
        let ptx = cache_path_with(d, m, "compute_90a", (13, 0), &Build::default());
        assert_ne!(a, ptx);
    }

    /// Needs NVRTC (tools/test.sh puts it on the path).
    #[test]
    fn compiles_a_module_to_sass_and_loads_it_back() {
        let m = smallest();
        let b = Build::default();
        let bin = compile_cubin_with(m, "compute_90a", &b).expect("NVRTC cubin");
        assert!(bin.starts_with(b"\x7fELF"), "not an ELF image");
        assert!(!String::from_utf8_lossy(&bin[..bin.len().min(4096)]).contains(".entry"));

        let dir = tmpdir("load");
        // no cubin: PTX
        match image_with(m, "compute_90a", &dir, &b, true).unwrap() {
            Image::Ptx(p) => assert!(p.contains(".entry")),
            Image::Cubin(_) => panic!("no cubin was written"),
        }
        let path = write_cubin_with(m, "compute_90a", &dir, &b).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bin);
        assert_eq!(
            image_with(m, "compute_90a", &dir, &b, true).unwrap(),
            Image::Cubin(bin)
        );
        // switched off: PTX
        assert!(matches!(
            image_with(m, "compute_90a", &dir, &b, false).unwrap(),
            Image::Ptx(_)
        ));
        // a file that is not ELF is ignored
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            image_with(m, "compute_90a", &dir, &b, true).unwrap(),
            Image::Ptx(_)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
