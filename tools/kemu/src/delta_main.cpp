// `kemu --delta` without the Rust side (kernels/tests/emulated.rs compiles and runs it in the
// CI): the gated DeltaNet kernels against their float64 reference and their bit-for-bit
// promises (check_delta.h). Exit status: 0 when every case passes.
#include "kernels.cpp"

int main() { return kemu_check_delta() == 0 ? 0 : 1; }
