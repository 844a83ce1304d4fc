//! The gated DeltaNet kernels (kernels/cu/delta.cu, as they are) run on the CPU through
//! tools/kemu's CUDA emulator, in the CI without a GPU: gated_delta_k<HK> and
//! gated_delta_conv_k<HK> for HK 16 / 32 / 64 / 128 (one to four warps a block) against a
//! float64 reference of the rule, and bit for bit the promises the engine's invariance rests
//! on: one row a step, steps replaying a kept position, the conv inside the kernel
//! (tools/kemu/src/check_delta.h); and the F32 row products (f32rows.cuh): the tiled body
//! bit for bit against the row body, both against float64 (check_f32rows.h); and the grouped
//! products' tile -> expert lookup against a scalar search (check_moe_tile.h). Needs g++ with C++20 (kemu's own build takes `$CXX`); without
//! it this test FAILS saying so.

use std::path::Path;
use std::process::Command;

include!("../../tools/kemu/emu_sources.rs");

#[test]
fn delta_kernels_on_the_emulator() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cu = root.join("kernels/cu");
    let kemu = root.join("tools/kemu/src");
    let dir = tempfile::tempdir().unwrap();
    write_emu_sources(&cu, dir.path());
    let exe = dir.path().join("kemu-delta");
    let cxx = "g++";
    let built = Command::new(cxx)
        .args(["-std=c++20", "-O2", "-ffp-contract=off", "-pthread"])
        .arg(kemu.join("delta_main.cpp"))
        .arg("-I")
        .arg(dir.path())
        .arg("-I")
        .arg(&kemu)
        .arg("-I")
        .arg(&cu)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cxx} (a C++20 compiler, for the kernel emulator): {e}"));
    assert!(
        built.status.success(),
        "{cxx} failed on tools/kemu/src/delta_main.cpp:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    eprintln!("{out}");
    assert!(
        run.status.success(),
        "emulated delta kernels failed:\n{out}"
    );
    assert!(out.contains("delta: all ok (0 failures)"), "{out}");
    assert!(out.contains("f32rows: all ok (0 failures)"), "{out}");
    assert!(out.contains("moe_tile: all ok (0 failures)"), "{out}");
    // Every head size and every promise ran: 7 geometries (one longer than the conv ring, one
    // of three position chunks) x 4 cases, 5 F32 row shapes x 2, and 12 expert counts of the tile lookup.
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        50,
        "{out}"
    );
}
