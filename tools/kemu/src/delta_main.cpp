// `kemu --delta` without the Rust side (kernels/tests/emulated.rs compiles and runs it in the
// CI): the gated DeltaNet kernels against their float64 reference and their bit-for-bit
// promises (check_delta.h), the F32 row products (check_f32rows.h) and the grouped products' tile lookup (check_moe_tile.h). Exit status: 0 when every case passes.
#include "kernels.cpp"

int main() {
    const int d = kemu_check_delta(), r = kemu_check_f32rows(), t = kemu_check_moe_tile();
    return d == 0 && r == 0 && t == 0 ? 0 : 1;
}
