// The emulated kernels (kernels/cu/vision.cu with the Qwen ViT's, norm.cu, elementwise.cu's add_in_place; build.rs
// prepares the prelude and add_in_place) and `kemu_run`, a launch by kernel name with the
// engine's 8-byte argument cells (backend/cuda/device.rs `launch_ex`).
#include "shim.h"
#include "prelude_emu.cuh"
#include <string>
#include "vision.cu"
#include "norm.cu"
#include "add_in_place.cu"
#include "delta.cu"
#include "check_kernels.h"
#include "check_delta.h"
#include "check_router.h"

extern "C" int kemu_run(const char* name, unsigned gx, unsigned gy, unsigned block, const u64* a, unsigned n) {
    auto P = [&](int i) { return (void*)a[i]; };
    auto U = [&](int i) { return (u32)a[i]; };
    auto F = [&](int i) { u32 b = (u32)a[i]; float f; std::memcpy(&f, &b, 4); return f; };
    const std::string s(name);
    std::function<void()> f;
    if (s == "vit_patches" && n == 4) f = [&] { vit_patches((const float*)P(0), (float*)P(1), U(2), U(3)); };
    else if (s == "vit_gemm_f32" && n == 8) f = [&] { vit_gemm_f32((const float*)P(0), (const float*)P(1), (const float*)P(2), (float*)P(3), U(4), U(5), U(6), U(7)); };
    else if (s == "vit_gemm_f16" && n == 8) f = [&] { vit_gemm_f16((const float*)P(0), (const u16*)P(1), (const float*)P(2), (float*)P(3), U(4), U(5), U(6), U(7)); };
    else if (s == "vit_layer_norm" && n == 7) f = [&] { vit_layer_norm((const float*)P(0), (const float*)P(1), (const float*)P(2), (float*)P(3), U(4), U(5), F(6)); };
    else if (s == "vit_pool" && n == 6) f = [&] { vit_pool((const float*)P(0), (float*)P(1), U(2), U(3), U(4), F(5)); };
    else if (s == "rms_norm" && n == 6) f = [&] { rms_norm((const float*)P(0), (const float*)P(1), (float*)P(2), U(3), U(4), F(5)); };
    else if (s == "add_in_place" && n == 3) f = [&] { add_in_place((float*)P(0), (const float*)P(1), a[2]); };
    else if (s == "qvit_patches" && n == 8) f = [&] { qvit_patches((const float*)P(0), (const float*)P(1), (const u32*)P(2), (float*)P(3), U(4), U(5), U(6), U(7)); };
    else if (s == "qvit_rope" && n == 5) f = [&] { qvit_rope((float*)P(0), (const float*)P(1), U(2), U(3), U(4)); };
#define ATT(D) else if (s == "vit_attn_d" #D && n == 5) f = [&] { vit_attn_d##D((const float*)P(0), (float*)P(1), U(2), U(3), F(4)); };
    ATT(8) ATT(16) ATT(32) ATT(64) ATT(72) ATT(80) ATT(96) ATT(128)
#define WATT(D) else if (s == "qvit_attn_win_d" #D && n == 5) f = [&] { qvit_attn_win_d##D((const float*)P(0), (float*)P(1), (const u32*)P(2), U(3), F(4)); };
    WATT(8) WATT(16) WATT(32) WATT(64) WATT(72) WATT(80) WATT(96) WATT(128)
    else return 1;
    emu_launch(gx, gy, block, f);
    return 0;
}
