// What the emulated checks share (check_delta.h, check_f32rows.h): the random inputs, the
// comparison against double precision and the bitwise one, which count failures. Included once,
// by kernels.cpp.
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
static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
static void bits_case(const char* what, bool ok) {
    if (!ok) ++fails;
    printf("%-5s %s\n", ok ? "ok" : "FAIL", what);
}
