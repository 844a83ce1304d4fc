// `kemu --delta` without the Rust side (kernels/tests/emulated.rs compiles and runs it in the
// CI): the gated DeltaNet kernels against their float64 reference and their bit-for-bit
// promises (check_delta.h), and the F32 row products (check_f32rows.h). Exit status: 0 when every case passes.
#include "kernels.cpp"

int main() {
    const int d = kemu_check_delta(), r = kemu_check_f32rows();
    return d == 0 && r == 0 ? 0 : 1;
}
