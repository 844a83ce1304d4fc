//! Compiles src/kernels.cpp (the emulator and the kernels of kernels/cu/, as they are) with the
//! host's C++ compiler (`$CXX`, default g++; C++20) into a static library. The prelude's PTX
//! f16 conversion is cut out (the emulator has its own) and elementwise.cu contributes only
//! `add_in_place` (its other kernels need PTX conversions).

use std::path::{Path, PathBuf};
use std::process::Command;

include!("emu_sources.rs");

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cu = root.join("kernels/cu");
    write_emu_sources(&cu, &out);
    let obj = out.join("kernels.o");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let ok = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-c"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels.cpp"))
        .arg("-I")
        .arg(&out)
        .arg("-I")
        .arg(&cu)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    assert!(ok.success(), "{cxx} failed on src/kernels.cpp");
    let lib = out.join("libkemu.a");
    let _ = std::fs::remove_file(&lib);
    assert!(
        Command::new("ar")
            .arg("crs")
            .arg(&lib)
            .arg(&obj)
            .status()
            .unwrap()
            .success()
    );
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=kemu");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    for f in ["prelude.cuh", "elementwise.cu", "delta.cu", "f32rows.cuh"] {
        println!("cargo:rerun-if-changed={}", cu.join(f).display());
    }
    for f in [
        "emu_sources.rs",
        "src/kernels.cpp",
        "src/shim.h",
        "src/check_util.h",
        "src/check_delta.h",
        "src/check_f32rows.h",
        "src/check_moe_tile.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
}
