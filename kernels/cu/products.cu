// v2 weight products on tensor cores: Y[m][n] = sum_k W[n][k] * X[m][k] (+ R[m][n]), for every
// M with one per-element arithmetic (EXACTNESS.md, KERNELS.md).
//
// Canonical order of one output element: the K tiles of the matrix are cut into `nseg` segments
// (segment s = tiles [s * nkt / nseg, (s + 1) * nkt / nseg)); nseg is a function of (N, K, dtype,
// device profile) only, never of M. Within a segment the tiles are walked in order, starting from
// -0.0 (quantized formats: block terms added with __fadd_rn; float formats: the mma chain); the
// segment sums are then added in segment order starting from -0.0. A launch computes that
// sequence whatever its geometry:
//   * blockDim = 32 * RPB warps (WK = 1): each warp walks every segment of its 16-row tile and
//     adds each finished segment to its total (prefill shape);
//   * blockDim = 32 * RPB * nseg (WK = nseg): warp (s, rp) walks segment s only; the block then
//     adds the nseg partials in segment order from shared memory (decode shape: K split over
//     warps for memory parallelism at small M).
// Both give ((-0 + p0) + p1) + ... for every element, so bits do not depend on M, on MMQ_NT
// (tokens per block, 8 * MMQ_NT) or MMQ_RPB (16-row tiles per block), which are performance
// choices (NVRTC defines). No atomics; each output element is written by one thread.
//
// Token rows past M are clamped to row M - 1 for loading and never written.

#ifndef MMQ_NT
#define MMQ_NT 1
#endif
#ifndef MMQ_RPB
#define MMQ_RPB 1
#endif
// Most threads per block a launch may use (the register budget follows from it).
#ifndef MMQ_MAXT
#define MMQ_MAXT 256
#endif

// ---------------------------------------------------------------------------------------------
// Activation preparation.

// Position (in 16-bit values) of column i (0..31) of a 32-column block in the permuted layout:
// lane t's B fragments of the block's two steps are the 16 bytes at 16t.
__device__ __forceinline__ u32 act_pos(u32 i) {
    const u32 step = i >> 4, j = i & 15;
    return 8 * ((j & 7) >> 1) + 4 * step + 2 * ((j >> 3) & 1) + (j & 1);
}

__device__ __forceinline__ u16 f32_to_f16_bits(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ u16 f32_to_bf16_bits(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_bits_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// X f32 [M][K] -> 16-bit [M][kp] (f16 clamped to +-65504, or bf16 when bf != 0), permuted per
// 32-column block, zero past K; and Xs [M][kp / 32]: the f32 sum of each block's 16-bit values
// (fixed xor tree). One warp per (row, block), grid-stride.
extern "C" __global__ void prepare_h16(const float* __restrict__ X, u16* __restrict__ Xh, float* __restrict__ Xs,
                                       u32 M, u32 K, u32 kp, u32 bf) {
    const int lane = threadIdx.x & 31;
    const u32 nb = kp / 32;
    const u64 total = (u64)M * nb;
    const u64 nwarps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < total; w += nwarps) {
        const u32 m = (u32)(w / nb), b = (u32)(w % nb);
        const u32 k = b * 32 + lane;
        float x = k < K ? X[(u64)m * K + k] : 0.0f;
        u16 h;
        float v;
        if (bf) {
            h = f32_to_bf16_bits(x);
            v = bf16_bits_to_f32(h);
        } else {
            x = fminf(fmaxf(x, -65504.0f), 65504.0f);
            h = f32_to_f16_bits(x);
            v = f16_to_f32(h);
        }
        Xh[(u64)m * kp + b * 32 + act_pos((u32)lane)] = h;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
        if (lane == 0) Xs[w] = v;
    }
}

// ---------------------------------------------------------------------------------------------
// The product driver.

// Per-lane token rows of one launch: B rows (column g) and C columns (2t, 2t + 1), clamped.
struct TokRows {
    u32 b[MMQ_NT], c0[MMQ_NT], c1[MMQ_NT];
};

__device__ __forceinline__ TokRows tok_rows(u32 m0, u32 M, int g, int t) {
    TokRows r;
#pragma unroll
    for (int nf = 0; nf < MMQ_NT; ++nf) {
        const u32 base = m0 + nf * 8;
        r.b[nf] = min(base + g, M - 1);
        r.c0[nf] = min(base + 2 * t, M - 1);
        r.c1[nf] = min(base + 2 * t + 1, M - 1);
    }
    return r;
}

// One tile: every block, every token fragment.
template <class F>
__device__ __forceinline__ void tile_blocks(const typename F::Tile& cur, u32 kt, const u8* __restrict__ Xh,
                                            const float* __restrict__ Xs, u32 kp, const TokRows& tr, int t,
                                            float acc[MMQ_NT][4]) {
    const u32 nbk = kp / 32;
#pragma unroll
    for (int b = 0; b < F::NB; ++b) {
        const u32 blk = kt * F::NB + b;
#pragma unroll
        for (int nf = 0; nf < MMQ_NT; ++nf) {
            const uint4 v = ld16(Xh + ((u64)tr.b[nf] * kp + blk * 32) * 2 + 16 * t);
            const u32 bf[4] = {v.x, v.y, v.z, v.w};
            XSum xs = {0.0f, 0.0f};
            if (F::MIN) {
                xs.s0 = __ldg(Xs + (u64)tr.c0[nf] * nbk + blk);
                xs.s1 = __ldg(Xs + (u64)tr.c1[nf] * nbk + blk);
            }
            F::block(cur, b, bf, xs, acc[nf]);
        }
    }
}

template <class F>
__device__ __forceinline__ void product(const u8* __restrict__ W, const u8* __restrict__ X,
                                        const float* __restrict__ Xs, float* Y, const float* R, u32 M, u32 N,
                                        u32 nkt, u32 nseg, u32 kp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 rp = (u32)warp % MMQ_RPB, wk = (u32)warp / MMQ_RPB;
    const u32 wks = blockDim.x / (32 * MMQ_RPB);  // 1 or nseg (checked by the host)
    const u32 rt = blockIdx.x * MMQ_RPB + rp;
    const bool live = rt < (N + 15) / 16;
    const u32 m0 = blockIdx.y * 8 * MMQ_NT;
    const TokRows tr = tok_rows(m0, M, g, t);
    float tot[MMQ_NT][4];
#pragma unroll
    for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
        for (int e = 0; e < 4; ++e) tot[nf][e] = NEG_ZERO;
    if (live) {
        const u8* wt = W + (u64)rt * nkt * F::TB;
        const u32 s0 = wks == 1 ? 0 : wk, s1 = wks == 1 ? nseg : wk + 1;
        for (u32 s = s0; s < s1; ++s) {
            const u32 k0 = s * nkt / nseg, k1 = (s + 1) * nkt / nseg;
            float acc[MMQ_NT][4];
#pragma unroll
            for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nf][e] = NEG_ZERO;
            typename F::Tile cur, nxt;
            if (k0 < k1) F::load(wt + (u64)k0 * F::TB, lane, cur);
            for (u32 kt = k0; kt < k1; ++kt) {
                if (kt + 1 < k1) F::load(wt + (u64)(kt + 1) * F::TB, lane, nxt);
                tile_blocks<F>(cur, kt, X, Xs, kp, tr, t, acc);
                cur = nxt;
            }
#pragma unroll
            for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
                for (int e = 0; e < 4; ++e) tot[nf][e] = __fadd_rn(tot[nf][e], acc[nf][e]);
        }
    }
    const u32 cols = 8 * MMQ_NT;
    if (wks == 1) {
        if (!live) return;
#pragma unroll
        for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 n = rt * 16 + g + 8 * (e >> 1);
                const u32 m = m0 + nf * 8 + 2 * t + (e & 1);
                if (n < N && m < M) {
                    const u64 o = (u64)m * N + n;
                    Y[o] = R ? __fadd_rn(R[o], tot[nf][e]) : tot[nf][e];
                }
            }
        return;
    }
    extern __shared__ float part[];  // [wks][RPB][16][cols]
#pragma unroll
    for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const u32 row = g + 8 * (e >> 1), col = nf * 8 + 2 * t + (e & 1);
            part[((wk * MMQ_RPB + rp) * 16 + row) * cols + col] = tot[nf][e];
        }
    __syncthreads();
    const u32 per = MMQ_RPB * 16 * cols;
    for (u32 i = threadIdx.x; i < per; i += blockDim.x) {
        const u32 rp2 = i / (16 * cols), row = (i / cols) % 16, col = i % cols;
        float v = NEG_ZERO;
        for (u32 s = 0; s < wks; ++s) v = __fadd_rn(v, part[((s * MMQ_RPB + rp2) * 16 + row) * cols + col]);
        const u32 n = (blockIdx.x * MMQ_RPB + rp2) * 16 + row;
        const u32 m = m0 + col;
        if (n < N && m < M) {
            const u64 o = (u64)m * N + n;
            Y[o] = R ? __fadd_rn(R[o], v) : v;
        }
    }
}

#define MMQ_KERNEL(suffix, FMT)                                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_MAXT) mmq_##suffix(                                      \
        const u8* W, const u8* X, const float* Xs, float* Y, const float* R, u32 M, u32 N, u32 nkt, u32 nseg, \
        u32 kp) {                                                                                             \
        product<FMT>(W, X, Xs, Y, R, M, N, nkt, nseg, kp);                                                    \
    }

MMQ_KERNEL(q8_0, FmtQ8_0)
MMQ_KERNEL(q4_0, FmtQ4_0)
MMQ_KERNEL(q4_1, FmtQ4_1)
MMQ_KERNEL(q4_k, FmtQ4_K)
MMQ_KERNEL(q5_k, FmtQ5_K)
MMQ_KERNEL(q6_k, FmtQ6_K)
MMQ_KERNEL(f16, FmtF16<0>)
MMQ_KERNEL(bf16, FmtF16<1>)
