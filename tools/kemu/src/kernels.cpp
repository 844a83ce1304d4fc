// The emulated kernels: kernels/cu/delta.cu, f32rows.cuh and prelude.cuh's moe_tile_expert as they are (build.rs prepares the prelude) and its
// checks. The vision tower's kernels left the emulator when they moved to tensor cores (mma.sync
// and ldmatrix have no emulation here): docs/VERIFY.md "The CUDA tower".
#include "shim.h"
#include "prelude_emu.cuh"
#include <string>
#include "delta.cu"
#include "f32rows.cuh"
#include "check_util.h"
#include "check_delta.h"
#include "check_f32rows.h"
#include "check_moe_tile.h"
