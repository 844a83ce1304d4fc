// kemu: a small CUDA-on-CPU emulator for checking kernel logic without a GPU. Every CUDA thread
// of a block is a std::thread; __syncthreads / __syncwarp are barriers; a warp shuffle goes
// through a per-block array between two warp barriers. Blocks run one after another, so
// `__shared__` (a function static here) is private to the running block. Threads that return
// early drop out of the barriers (as exited threads do on sm_70+). Float operations are the
// host's IEEE f32 ones (`fma` for __fmaf_rn); expf / tanhf / exp are glibc's, not the GPU's. What it
// does not model: memory alignment faults, the memory model between blocks, timing.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
#define FULL_MASK 0xffffffffu

struct emu_dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local emu_dim3 threadIdx, blockIdx;
inline emu_dim3 blockDim, gridDim;
inline std::barrier<>* emu_block_bar;
inline std::vector<std::unique_ptr<std::barrier<>>> emu_warp_bar;
inline float emu_shfl[1024];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = FULL_MASK) { emu_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int m) {
    const unsigned t = threadIdx.x;
    emu_shfl[t] = v;
    __syncwarp();
    const float r = emu_shfl[t ^ (unsigned)m];
    __syncwarp();
    return r;
}
inline unsigned emu_ballot[1024];
inline unsigned __ballot_sync(unsigned, bool p) {
    const unsigned t = threadIdx.x, w0 = t & ~31u;
    emu_ballot[t] = p ? 1u : 0u;
    __syncwarp();
    unsigned m = 0;
    for (unsigned i = 0; i < 32 && w0 + i < blockDim.x; ++i) m |= emu_ballot[w0 + i] << i;
    __syncwarp();
    return m;
}
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
template <class A, class B> inline auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) { return a > b ? a : b; }

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

// f16 bits -> f32, exactly (the prelude's PTX conversion is cut out of the emulated sources).
inline float f16_to_f32(u16 h) {
    const unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}

// Runs f on a grid of (gx, gy) blocks of `block` threads, block after block.
inline void emu_launch(unsigned gx, unsigned gy, unsigned block, const std::function<void()>& f) {
    gridDim = {gx, gy, 1};
    blockDim = {block, 1, 1};
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            std::barrier<> bar(block);
            emu_block_bar = &bar;
            emu_warp_bar.clear();
            for (unsigned w = 0; w < (block + 31) / 32; ++w)
                emu_warp_bar.emplace_back(new std::barrier<>(std::min(32u, block - 32 * w)));
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < block; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    f();
                    emu_warp_bar[t / 32]->arrive_and_drop();
                    emu_block_bar->arrive_and_drop();
                });
            for (auto& th : ts) th.join();
        }
}
