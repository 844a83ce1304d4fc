// The F32 row products of prelude.cuh (matmul_f32_rows_body over f32_row_load / f32_row_dot;
// moe_norm_route shares the two) on the emulator, bit for bit against a scalar model of the order
// they promise: 8 fixed K chunks, lane l's columns c0 + l, c0 + l + 32, ... with fma from +0,
// the xor tree 16 .. 1, the chunk sums in order from -0. Included once, by kernels.cpp, after
// check_delta.h (check_util.h: rng, randv, fails; check_delta.h: same_bits, bits_case).
#pragma once

// The promised order, one value at a time.
static float router_model(const float* w, const float* x, u32 K) {
    float v = -0.0f;
    for (u32 q = 0; q < 8; ++q) {
        const u32 c0 = (u32)((u64)q * K / 8), c1 = (u32)((u64)(q + 1) * K / 8);
        float s[32];
        for (u32 l = 0; l < 32; ++l) {
            float acc = 0.0f;
            for (u32 c = c0 + l; c < c1; c += 32) acc = std::fma(w[c], x[c], acc);
            s[l] = acc;
        }
        for (u32 o = 16; o > 0; o >>= 1) {
            float t[32];
            for (u32 l = 0; l < 32; ++l) t[l] = __fadd_rn(s[l], s[l ^ o]);
            std::memcpy(s, t, sizeof s);
        }
        v = __fadd_rn(v, s[0]);
    }
    return v;
}

static void router_case(u32 M, u32 N, u32 K, u32 gy) {
    const auto W = randv((size_t)N * K, 0.3f), X = randv((size_t)M * K, 2.0f);
    std::vector<float> Y((size_t)M * N, std::nanf("")), want(Y.size());
    for (u32 m = 0; m < M; ++m)
        for (u32 n = 0; n < N; ++n) want[(size_t)m * N + n] = router_model(&W[(size_t)n * K], &X[(size_t)m * K], K);
    emu_launch((N + 7) / 8, gy, 256, [&] { matmul_f32_rows_body((const u8*)W.data(), X.data(), Y.data(), M, N, K, K * 4); });
    char what[160];
    snprintf(what, sizeof what, "f32_row_dot M %u N %u K %u (%u tile groups) == the promised order", M, N, K, gy);
    bits_case(what, same_bits(Y, want));
}

extern "C" int kemu_check_router() {
    const int before = fails;
    router_case(1, 13, 2048, 1);   // a router's row wholly in registers; a part block of warps
    router_case(8, 9, 1000, 1);    // chunks of 125: lanes past a chunk's end
    router_case(19, 8, 4100, 2);   // past the registers (the chunk's tail loop); a part tile
    router_case(3, 5, 40, 1);      // chunks of 5: most lanes add nothing
    router_case(40, 16, 768, 2);   // tiles walked by two tile groups
    printf("router: %s (%d failures)\n", fails > before ? "FAILED" : "all ok", fails - before);
    fflush(stdout);
    return fails - before;
}
