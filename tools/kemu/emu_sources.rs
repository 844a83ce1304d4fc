// The emulator's view of kernels/cu/ (shared by tools/kemu/build.rs and
// kernels/tests/emulated.rs through `include!`): the prelude without its PTX f16 conversion
// (the emulator has its own) and elementwise.cu's `add_in_place` alone (its other kernels
// need PTX conversions), written into `out` for the C++ compiler's include path.

fn emu_cut(src: &str, from: &str, to_end_of: &str) -> (usize, usize) {
    let i = src
        .find(from)
        .unwrap_or_else(|| panic!("`{from}` not found"));
    let j = src[i..].find(to_end_of).map(|k| i + k + to_end_of.len());
    (i, j.unwrap_or_else(|| panic!("end of `{from}` not found")))
}

/// Writes `prelude_emu.cuh` and `add_in_place.cu` from the kernel sources in `cu` into `out`.
fn write_emu_sources(cu: &std::path::Path, out: &std::path::Path) {
    let read = |f: &str| std::fs::read_to_string(cu.join(f)).unwrap();
    let pre = read("prelude.cuh");
    let (i, j) = emu_cut(&pre, "// f16 bits -> f32", "\n}\n");
    std::fs::write(
        out.join("prelude_emu.cuh"),
        format!("{}{}", &pre[..i], &pre[j..]),
    )
    .unwrap();
    let el = read("elementwise.cu");
    let (i, j) = emu_cut(&el, "extern \"C\" __global__ void add_in_place", "\n}\n");
    std::fs::write(out.join("add_in_place.cu"), &el[i..j]).unwrap();
}
