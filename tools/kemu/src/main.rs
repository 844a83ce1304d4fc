//! kemu: the gated DeltaNet kernels (kernels/cu/delta.cu) on the CPU through a small CUDA
//! emulator, against float64 and their bit-for-bit promises (src/check_delta.h), and the F32
//! row products (kernels/cu/f32rows.cuh: the tiled body == the row body bit for bit,
//! src/check_f32rows.h), and the grouped products' tile -> expert lookup (prelude.cuh
//! `moe_tile_expert`, src/check_moe_tile.h). The CI runs
//! the same checks through kernels/tests/emulated.rs (src/delta_main.cpp, no Rust side).
//!
//! The vision towers' kernels were emulated here too until they moved to tensor cores
//! (mma.sync / ldmatrix, which the emulator cannot run): their checks are the device gates of
//! docs/VERIFY.md "The CUDA tower".

unsafe extern "C" {
    fn kemu_check_delta() -> i32;
    fn kemu_check_f32rows() -> i32;
    fn kemu_check_moe_tile() -> i32;
}

fn main() {
    // SAFETY: no arguments; it runs the emulated kernels on buffers it owns.
    let fails = unsafe { kemu_check_delta() + kemu_check_f32rows() + kemu_check_moe_tile() } as usize;
    println!(
        "kemu: {}",
        if fails == 0 {
            "ALL OK".to_string()
        } else {
            format!("{fails} FAILED")
        }
    );
    std::process::exit(i32::from(fails > 0));
}
