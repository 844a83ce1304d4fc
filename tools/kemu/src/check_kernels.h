// The vision kernels, each alone, against double-precision references (and bit-exact CPU
// orders where the kernel promises them), on small odd shapes: `kemu_check_kernels` returns the
// number of failures. Included once, by kernels.cpp.
#pragma once
#include <cstdio>
#include <random>

static std::mt19937_64 rng(42);
static std::vector<float> randv(size_t n, float s) {
    std::uniform_real_distribution<float> d(-s, s);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
static u16 to_f16(float f) {  // round-to-nearest for modest normal values (test data only)
    u32 b; std::memcpy(&b, &f, 4);
    u32 s = (b >> 16) & 0x8000; int e = ((b >> 23) & 255) - 127 + 15; u32 m = b & 0x7fffff;
    if (e <= 0) return (u16)s;
    u32 r = (m >> 13) + ((m >> 12) & 1);
    u32 v = ((u32)e << 10) + r;
    return (u16)(s | v);
}
static int fails = 0;
static void check(const char* what, const std::vector<float>& got, const std::vector<double>& want, double tol) {
    double mx = 1e-30, d = 0; size_t bad = (size_t)-1;
    for (size_t i = 0; i < got.size(); ++i) {
        mx = std::max(mx, std::fabs(want[i]));
        if (std::isnan(got[i]) && bad == (size_t)-1) bad = i;
        d = std::max(d, std::fabs(got[i] - want[i]));
    }
    bool ok = d / mx <= tol && bad == (size_t)-1;
    if (!ok) ++fails;
    printf("%-5s %-50s rel %.3e%s\n", ok ? "ok" : "FAIL", what, d / mx, bad != (size_t)-1 ? " (NaN)" : "");
}
static double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double epilogue(u32 mode, double s, double y0) {
    switch (mode) {
        case G_GELU: return gelu(s);
        case G_ADD: return y0 + s;
        case G_QUICK_GELU: return s / (1 + std::exp(-1.702 * s));
        case G_GELU_ERF: return 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
        case G_MUL_SILU: return y0 * (s / (1 + std::exp(-s)));
        default: return s;
    }
}

static void gemm_case(u32 M, u32 N, u32 K, bool f16, bool bias, u32 mode) {
    auto X = randv((size_t)M * K, 1.0f), Wf = randv((size_t)N * K, 1.0f), B = randv(N, 0.5f);
    std::vector<u16> Wh(Wf.size());
    if (f16) for (size_t i = 0; i < Wf.size(); ++i) { Wh[i] = to_f16(Wf[i]); Wf[i] = f16_to_f32(Wh[i]); }
    auto Y0 = randv((size_t)M * N, 2.0f);
    std::vector<float> Y(Y0);
    if (mode != G_ADD && mode != G_MUL_SILU) for (auto& y : Y) y = NAN;
    const float* bp = bias ? B.data() : nullptr;
    emu_launch((N + 127) / 128, (M + 127) / 128, 256, [&] {
        if (f16) vit_gemm_f16(X.data(), Wh.data(), bp, Y.data(), M, N, K, mode);
        else vit_gemm_f32(X.data(), Wf.data(), bp, Y.data(), M, N, K, mode);
    });
    std::vector<double> want((size_t)M * N);
    for (u32 m = 0; m < M; ++m)
        for (u32 n = 0; n < N; ++n) {
            double s = 0;
            for (u32 k = 0; k < K; ++k) s += (double)X[(size_t)m * K + k] * Wf[(size_t)n * K + k];
            if (bias) s += B[n];
            want[(size_t)m * N + n] = epilogue(mode, s, Y0[(size_t)m * N + n]);
        }
    char w[128];
    snprintf(w, sizeof w, "gemm_%s M=%u N=%u K=%u bias=%d mode=%u", f16 ? "f16" : "f32", M, N, K, bias, mode);
    check(w, Y, want, 2e-6);
}

static void ln_case(u32 rows, u32 width) {
    auto X = randv((size_t)rows * width, 3.0f), Wt = randv(width, 1.0f), Bs = randv(width, 0.5f);
    for (auto& v : X) v += 1.5f;
    std::vector<float> Y((size_t)rows * width, NAN);
    emu_launch((rows * 32 + 255) / 256, 1, 256, [&] { vit_layer_norm(X.data(), Wt.data(), Bs.data(), Y.data(), rows, width, 1e-6f); });
    std::vector<double> want(Y.size());
    for (u32 r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (u32 c = 0; c < width; ++c) mean += X[(size_t)r * width + c];
        mean /= width;
        for (u32 c = 0; c < width; ++c) { double d = X[(size_t)r * width + c] - mean; var += d * d; }
        var /= width;
        double inv = 1 / std::sqrt(var + 1e-6);
        for (u32 c = 0; c < width; ++c) want[(size_t)r * width + c] = (X[(size_t)r * width + c] - mean) * inv * Wt[c] + Bs[c];
    }
    char w[128];
    snprintf(w, sizeof w, "layer_norm rows=%u width=%u", rows, width);
    check(w, Y, want, 2e-6);
    // in place
    emu_launch((rows * 32 + 255) / 256, 1, 256, [&] { vit_layer_norm(X.data(), Wt.data(), Bs.data(), X.data(), rows, width, 1e-6f); });
    bool same = std::memcmp(X.data(), Y.data(), Y.size() * 4) == 0;
    if (!same) ++fails;
    printf("%-5s layer_norm in place == out of place\n", same ? "ok" : "FAIL");
}

template <int D>
static void attn_case(u32 n, u32 heads, void (*k)(const float*, float*, u32, u32, float)) {
    const u32 wd = heads * D;
    auto QKV = randv((size_t)n * 3 * wd, 2.0f);
    std::vector<float> O((size_t)n * wd, NAN);
    const float scale = 1.0f / std::sqrt((float)D);
    emu_launch((n + 127) / 128, heads, 128, [&] { k(QKV.data(), O.data(), n, heads, scale); });
    std::vector<double> want(O.size());
    for (u32 i = 0; i < n; ++i)
        for (u32 h = 0; h < heads; ++h) {
            std::vector<double> s(n);
            double mx = -1e300;
            for (u32 j = 0; j < n; ++j) {
                double d = 0;
                for (int c = 0; c < D; ++c) d += (double)QKV[(size_t)i * 3 * wd + h * D + c] * QKV[(size_t)j * 3 * wd + wd + h * D + c];
                s[j] = d * scale;
                mx = std::max(mx, s[j]);
            }
            double l = 0;
            for (auto& x : s) { x = std::exp(x - mx); l += x; }
            for (int c = 0; c < D; ++c) {
                double o = 0;
                for (u32 j = 0; j < n; ++j) o += s[j] * QKV[(size_t)j * 3 * wd + 2 * wd + h * D + c];
                want[(size_t)i * wd + h * D + c] = o / l;
            }
        }
    char w[128];
    snprintf(w, sizeof w, "attn_d%d n=%u heads=%u", D, n, heads);
    check(w, O, want, 2e-6);
}

static void pool_case(u32 g, u32 pool, u32 width) {
    auto X = randv((size_t)g * g * width, 2.0f);
    u32 side = g / pool;
    std::vector<float> Y((size_t)side * side * width, NAN);
    float inv = 1.0f / (float)(pool * pool);
    emu_launch(4, 1, 256, [&] { vit_pool(X.data(), Y.data(), g, pool, width, inv); });
    std::vector<float> w(Y.size(), 0.0f);
    for (u32 t = 0; t < side * side; ++t) {
        u32 ty = t / side, tx = t % side;
        for (u32 y = 0; y < pool; ++y) for (u32 x = 0; x < pool; ++x)
            for (u32 c = 0; c < width; ++c) w[(size_t)t * width + c] += X[(size_t)((ty * pool + y) * g + tx * pool + x) * width + c];
        for (u32 c = 0; c < width; ++c) w[(size_t)t * width + c] *= inv;
    }
    bool same = std::memcmp(w.data(), Y.data(), Y.size() * 4) == 0;
    if (!same) ++fails;
    printf("%-5s pool g=%u pool=%u width=%u bit-exact\n", same ? "ok" : "FAIL", g, pool, width);
}

static void patches_case(u32 size, u32 patch) {
    auto px = randv((size_t)3 * size * size, 1.0f);
    u32 g = size / patch, per = 3 * patch * patch;
    std::vector<float> cols((size_t)g * g * per, NAN);
    emu_launch(3, 1, 256, [&] { vit_patches(px.data(), cols.data(), size, patch); });
    std::vector<float> w(cols.size());
    for (u32 i = 0; i < g * g; ++i) {
        u32 py = i / g, pxx = i % g;
        for (u32 c = 0; c < 3; ++c) for (u32 y = 0; y < patch; ++y) for (u32 x = 0; x < patch; ++x)
            w[(size_t)i * per + c * patch * patch + y * patch + x] = px[(size_t)c * size * size + (py * patch + y) * size + pxx * patch + x];
    }
    bool same = std::memcmp(w.data(), cols.data(), w.size() * 4) == 0;
    if (!same) ++fails;
    printf("%-5s patches size=%u patch=%u exact\n", same ? "ok" : "FAIL", size, patch);
}

// The Qwen ViT's patch rows of two different frames (a video's frame pair): bit for bit the
// CPU's patch_cols in a shuffled row order, frame 0 from the first, frame 1 from the second.
static void qwen_patches_case(u32 w, u32 h, u32 patch) {
    auto px = randv((size_t)3 * w * h, 1.0f);
    auto px1 = randv((size_t)3 * w * h, 1.0f);
    const u32 gw = w / patch, gh = h / patch, rows = gw * gh, per = 3 * patch * patch;
    std::vector<u32> pos(rows);
    for (u32 r = 0; r < rows; ++r) {
        const u32 i = (r * 7 + 3) % rows;  // a permutation when gcd(7, rows) = 1
        pos[r] = ((i / gw) << 16) | (i % gw);
    }
    std::vector<float> cols((size_t)rows * 2 * per, NAN);
    emu_launch(3, 1, 256, [&] { qvit_patches(px.data(), px1.data(), pos.data(), cols.data(), rows, w, h, patch); });
    std::vector<float> want(cols.size());
    for (u32 r = 0; r < rows; ++r) {
        const u32 py = pos[r] >> 16, pxx = pos[r] & 0xffff;
        for (u32 f = 0; f < 2; ++f) for (u32 c = 0; c < 3; ++c) for (u32 y = 0; y < patch; ++y) for (u32 x = 0; x < patch; ++x)
            want[(size_t)r * 2 * per + f * per + c * patch * patch + y * patch + x] = (f ? px1 : px)[((size_t)c * h + py * patch + y) * w + pxx * patch + x];
    }
    bool same = std::memcmp(want.data(), cols.data(), want.size() * 4) == 0;
    if (!same) ++fails;
    printf("%-5s qvit_patches %ux%u patch=%u exact\n", same ? "ok" : "FAIL", w, h, patch);
}

// The 2D rotary embedding: bit for bit the CPU's rope (each product rounded, then the sum).
static void rope_case(u32 rows, u32 heads, u32 d) {
    const u32 wd = heads * d, half = d / 2;
    auto QKV = randv((size_t)rows * 3 * wd, 2.0f), table = randv((size_t)rows * d, 1.0f);
    std::vector<float> want(QKV);
    for (u32 r = 0; r < rows; ++r) for (u32 part = 0; part < 2; ++part) for (u32 hd = 0; hd < heads; ++hd)
        for (u32 j = 0; j < half; ++j) {
            float* x = want.data() + (size_t)r * 3 * wd + part * wd + hd * d;
            const float c = table[((size_t)r * half + j) * 2], sn = table[((size_t)r * half + j) * 2 + 1];
            const float u = x[j], v = x[j + half];
            volatile float uc = u * c, vs = v * sn, vc = v * c, us = u * sn;
            x[j] = uc - vs;
            x[j + half] = vc + us;
        }
    emu_launch(2, 1, 256, [&] { qvit_rope(QKV.data(), table.data(), rows, heads, d); });
    bool same = std::memcmp(want.data(), QKV.data(), want.size() * 4) == 0;
    if (!same) ++fails;
    printf("%-5s qvit_rope rows=%u heads=%u d=%u bit-exact\n", same ? "ok" : "FAIL", rows, heads, d);
}

// Window attention over windows of the given sizes (consecutive rows), tiles of at most 128
// query rows, against double precision over each window's keys.
template <int D>
static void win_attn_case(std::vector<u32> sizes, u32 heads, void (*k)(const float*, float*, const u32*, u32, float)) {
    const u32 wd = heads * D;
    u32 n = 0;
    std::vector<u32> tiles, win_of;
    std::vector<std::pair<u32, u32>> bounds;
    for (u32 sz : sizes) {
        for (u32 q = 0; q < sz; q += 128) tiles.insert(tiles.end(), {n + q, n + std::min(q + 128, sz), n, n + sz});
        bounds.push_back({n, n + sz});
        for (u32 i = 0; i < sz; ++i) win_of.push_back((u32)bounds.size() - 1);
        n += sz;
    }
    auto QKV = randv((size_t)n * 3 * wd, 2.0f);
    std::vector<float> O((size_t)n * wd, NAN);
    const float scale = 1.0f / std::sqrt((float)D);
    const u32 count = (u32)tiles.size() / 4;
    emu_launch(count, heads, 128, [&] { k(QKV.data(), O.data(), tiles.data(), heads, scale); });
    std::vector<double> want(O.size());
    for (u32 i = 0; i < n; ++i)
        for (u32 h = 0; h < heads; ++h) {
            const auto [k0, k1] = bounds[win_of[i]];
            std::vector<double> s(k1 - k0);
            double mx = -1e300;
            for (u32 j = k0; j < k1; ++j) {
                double d = 0;
                for (int c = 0; c < D; ++c) d += (double)QKV[(size_t)i * 3 * wd + h * D + c] * QKV[(size_t)j * 3 * wd + wd + h * D + c];
                s[j - k0] = d * scale;
                mx = std::max(mx, s[j - k0]);
            }
            double l = 0;
            for (auto& x : s) { x = std::exp(x - mx); l += x; }
            for (int c = 0; c < D; ++c) {
                double o = 0;
                for (u32 j = k0; j < k1; ++j) o += s[j - k0] * QKV[(size_t)j * 3 * wd + 2 * wd + h * D + c];
                want[(size_t)i * wd + h * D + c] = o / l;
            }
        }
    char w[128];
    snprintf(w, sizeof w, "qvit_attn_win_d%d n=%u windows=%zu heads=%u", D, n, sizes.size(), heads);
    check(w, O, want, 2e-6);
}

extern "C" int kemu_check_kernels() {
    patches_case(64, 8);
    patches_case(42, 14);
    pool_case(8, 2, 32);
    pool_case(12, 4, 37);
    ln_case(1, 32);
    ln_case(9, 1152);
    ln_case(13, 77);
    for (u32 mode : {G_PLAIN, G_GELU, G_ADD, G_QUICK_GELU, G_GELU_ERF, G_MUL_SILU}) {
        gemm_case(1, 1, 1, false, true, mode);
        gemm_case(5, 3, 17, false, true, mode);
        gemm_case(37, 129, 16, true, true, mode);
        gemm_case(130, 200, 100, false, false, mode);
        gemm_case(129, 130, 588, true, true, mode);
        gemm_case(64, 64, 194, false, true, mode);
        gemm_case(16, 64, 33, true, false, mode);
    }
    attn_case<8>(1, 1, vit_attn_d8);
    attn_case<8>(16, 4, vit_attn_d8);
    attn_case<8>(64, 4, vit_attn_d8);
    attn_case<8>(130, 2, vit_attn_d8);
    attn_case<72>(17, 2, vit_attn_d72);
    attn_case<72>(65, 1, vit_attn_d72);
    attn_case<72>(200, 2, vit_attn_d72);
    attn_case<128>(33, 2, vit_attn_d128);
    attn_case<128>(70, 1, vit_attn_d128);
    attn_case<16>(50, 3, vit_attn_d16);
    qwen_patches_case(16, 24, 4);
    qwen_patches_case(42, 28, 14);
    rope_case(5, 3, 8);
    rope_case(9, 2, 80);
    win_attn_case<8>({64, 64, 32, 16}, 2, qvit_attn_win_d8);
    win_attn_case<8>({144, 48, 4}, 1, qvit_attn_win_d8);
    win_attn_case<80>({64, 20, 130}, 2, qvit_attn_win_d80);
    win_attn_case<16>({300}, 1, qvit_attn_win_d16);
    printf("kernels: %s (%d failures)\n", fails ? "FAILED" : "all ok", fails);
    fflush(stdout);
    return fails;
}
