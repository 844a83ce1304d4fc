//! CI compile check without a GPU: every kernel module compiles with NVRTC for sm_90a (H100/H200)
//! and sm_120a (RTX 50xx / RTX PRO 6000), and the PTX defines every kernel of the module table.
//!
//! NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc` (tools/test.sh fetches it and puts its lib
//! folder on LD_LIBRARY_PATH). Without it this test FAILS with a message saying so.

use memra_kernels::{KernelError, MODULES, compile, compile_cached, nvrtc_version};

fn require_nvrtc() -> (i32, i32) {
    match nvrtc_version() {
        Ok(v) => v,
        Err(e) => panic!(
            "{e}\n(run tools/test.sh, or: python3 -m pip download --no-deps \
             nvidia-cuda-nvrtc==13.0.88, unzip it, and set LD_LIBRARY_PATH=<dir>/nvidia/cu13/lib)"
        ),
    }
}

#[test]
fn every_module_compiles_for_sm90a_and_sm120a() {
    let v = require_nvrtc();
    eprintln!("NVRTC {}.{}", v.0, v.1);
    let mut failures = Vec::new();
    for arch in ["compute_90a", "compute_120a"] {
        for m in MODULES {
            match compile(m, arch) {
                Ok(ptx) => {
                    for k in m.kernels {
                        let entry = format!(".entry {k}(");
                        if !ptx.contains(&entry) {
                            failures.push(format!("{} ({arch}): PTX lacks kernel {k}", m.file));
                        }
                    }
                    let target = arch.replace("compute_", "sm_");
                    if !ptx.contains(&format!(".target {target}")) {
                        failures.push(format!("{} ({arch}): PTX target is not {target}", m.file));
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn compile_error_names_the_file_and_shows_the_log() {
    require_nvrtc();
    let bad = memra_kernels::Module {
        name: "bad",
        file: "kernels/cu/bad.cu",
        headers: &[],
        source: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        kernels: &["k"],
    };
    match compile(&bad, "compute_90a") {
        Err(KernelError::Compile { file, log, .. }) => {
            assert_eq!(file, "kernels/cu/bad.cu");
            assert!(log.contains("undefined_name"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn disk_cache_is_written_and_reused() {
    let v = require_nvrtc();
    let dir = std::env::temp_dir().join(format!("memra-kcache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = &MODULES[0];
    let first = compile_cached(m, "compute_90a", &dir).expect("compile");
    let path = memra_kernels::cache_path(&dir, m, "compute_90a", v);
    assert!(path.exists(), "cache file {} not written", path.display());
    // A doctored cache entry is returned as is: proof the second call reads the cache.
    let marked = format!("{first}\n// cached\n");
    std::fs::write(&path, &marked).expect("write");
    let second = compile_cached(m, "compute_90a", &dir).expect("cached");
    assert_eq!(second, marked);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The grouped expert products (`mms_grouped_<type>`) are launched from the products variant of
/// `MOE_GROUPED_LAUNCH` (engine/src/backend/cuda/profile.rs: smem(1, 2), 16 tokens x 128 rows
/// per block): that variant compiles for both architectures and defines every grouped kernel.
#[test]
fn the_grouped_expert_products_compile_in_their_variant() {
    require_nvrtc();
    let m = memra_kernels::module("products").expect("products module");
    let defines = ["MMS_NT=1", "MMS_RT=2", "MMS_STAGES=3", "MMS_TOTS=0"].map(String::from);
    let b = memra_kernels::Build::with_defines(&defines);
    for arch in ["compute_90a", "compute_120a"] {
        let ptx = memra_kernels::compile_with(m, arch, &b).unwrap_or_else(|e| panic!("{e}"));
        for t in memra_kernels::PRODUCT_TYPES {
            assert!(
                ptx.contains(&format!(".entry mms_grouped_{t}(")),
                "{arch}: mms_grouped_{t}"
            );
        }
    }
}
