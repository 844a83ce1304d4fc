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

// This module's kernels do not trigger their dependents early (prelude.cuh, PDL_TRIGGER): the
// next kernel starts as this one's blocks exit. H200 session 16: with the early trigger, F16
// decode ran 197.6 tok/s, without it 213.5 (without PDL: 210.7); Q4_K_M decode 297.0 / 294.3.
// PDL_EARLY (an A/B define) restores the early trigger.
#ifndef PDL_EARLY
#undef PDL_TRIGGER
#define PDL_TRIGGER 0
#endif

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
// Blocks of MMQ_MAXT threads that should fit on one SM (caps the registers per thread).
#ifndef MMQ_MINB
#define MMQ_MINB 1
#endif
// Weight tiles in flight per warp (0: 4 for the small tiles of Q4_0 / Q4_1 at decode
// widths, else 2; measured on the H200, reports/kernel-notes.md).
#ifndef MMQ_PF
#define MMQ_PF 0
#endif

// ---------------------------------------------------------------------------------------------
// Activation preparation.

// X f32 [M][K] -> prepared [M][kp] (zero past K) and Xs [M][kp / 32]. One warp per (row,
// block), grid-stride.
extern "C" __global__ void prepare_h16(const float* __restrict__ X, u16* __restrict__ Xh, float* __restrict__ Xs,
                                       u32 M, u32 K, u32 kp, u32 bf) {
    pdl_entry_trigger();
    prep_rows([&](u32 m, u32, u32 k) { return k < K ? X[(u64)m * K + k] : 0.0f; }, Xh, Xs, M, kp, bf);
}

// One row of norm_prep: y = (x * (1 / sqrt(mean(x^2) + eps))) * w, written as f32 to y (when
// not null; y may be x) and prepared into xh / xs, the 32-column blocks by + 8 i ... of the row
// (block slice `by` of `gy`). Sum of squares: thread i adds x[i]^2, x[i + 256]^2, ... in order
// (fma), then the warp xor tree, then the 8 warp sums in warp order. 256 threads.
__device__ __forceinline__ void norm_prep_row(const float* x, const float* __restrict__ W, float* y,
                                              u16* __restrict__ xh, float* __restrict__ xs, u32 width,
                                              u32 kp, float eps, u32 bf, u32 by, u32 gy) {
    __shared__ float part[8];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float ss = 0.0f;
    for (u32 e = threadIdx.x; e < width; e += 256) ss = __fmaf_rn(x[e], x[e], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(FULL_MASK, ss, o));
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = part[0];
        for (int i = 1; i < 8; ++i) t = __fadd_rn(t, part[i]);
        total = t;
    }
    __syncthreads();
    const float scale = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)width), eps)));
    const u32 nb = kp / 32;
    // y may alias x: every block must finish its sum before any block writes.
    if (y == x && gy > 1) return;  // the host never launches this combination
    // The warp's first four blocks read before any store (y may alias x, so a read after a
    // store waits behind it); each value is read and written by the same lane.
    float xv[4], wv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 b = by * 8 + warp + 8 * gy * j, k = b * 32 + lane;
        xv[j] = 0.0f;
        wv[j] = 0.0f;
        if (b < nb && k < width) {
            xv[j] = x[k];
            wv[j] = W[k];
        }
    }
    auto put = [&](u32 b, float xk, float wk) {
        const u32 k = b * 32 + lane;
        float v = 0.0f;
        if (k < width) v = __fmul_rn(__fmul_rn(xk, scale), wk);
        __syncwarp();
        if (y && k < width) y[k] = v;
        prep_store(v, lane, xh + b * 32, xs + b, bf);
    };
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 b = by * 8 + warp + 8 * gy * j;
        if (b < nb) put(b, xv[j], wv[j]);  // uniform over the warp
    }
    for (u32 b = by * 8 + warp + 32 * gy; b < nb; b += 8 * gy) {
        const u32 k = b * 32 + lane;
        put(b, k < width ? x[k] : 0.0f, k < width ? W[k] : 0.0f);
    }
}

// RMSNorm fused with the preparation, gridDim.y blocks of 256 threads per row (each computes the
// row's sum of squares the same way, then handles its share of the 32-column blocks): row
// blockIdx.x, block slice blockIdx.y (norm_prep_row).
extern "C" __global__ void __launch_bounds__(256) norm_prep(const float* X, const float* __restrict__ W, float* Y,
                                                            u16* __restrict__ Xh, float* __restrict__ Xs,
                                                            u32 width, u32 kp, float eps, u32 bf) {
    pdl_entry_trigger();
    const u32 row = blockIdx.x;
    norm_prep_row(X + (u64)row * width, W, Y ? Y + (u64)row * width : nullptr, Xh + (u64)row * kp,
                  Xs + (u64)row * (kp / 32), width, kp, eps, bf, blockIdx.y, gridDim.y);
}

// Values of o add_norm_prep stages in shared memory for its scale (rows up to this wide).
#define ANP_STAGE 1024

// A post-norm sublayer's output added into the residual, then the next RMSNorm prepared (Gemma
// 3's sandwich norms): x += (o * rms_scale_warp(o)) * Wp (rms_norm's operations, then
// add_in_place's; o is left as it was), then, when Xh is not null, norm_prep_row of the new x
// (W, eps) into Y / Xh / Xs. One block of 256 threads per row (the row's x is written before it
// is read back): the bits of rms_norm + add_in_place + norm_prep.
extern "C" __global__ void __launch_bounds__(256) add_norm_prep(const float* O, const float* __restrict__ Wp,
                                                                float post_eps, float* X,
                                                                const float* __restrict__ W, float* Y,
                                                                u16* __restrict__ Xh, float* __restrict__ Xs,
                                                                u32 width, u32 kp, float eps, u32 bf) {
    pdl_entry_trigger();
    __shared__ float os[ANP_STAGE];
    const u32 row = blockIdx.x;
    const float* o = O + (u64)row * width;
    float* x = X + (u64)row * width;
    // Up to four values a thread read before any store (x is written in place), all at once;
    // a row of up to ANP_STAGE values of o is staged in shared memory, so the scale's 16 lane
    // chains read it there instead of one L2 round trip per eight values.
    float xv[4], ov[4], wv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 e = threadIdx.x + 256 * j;
        if (e < width) {
            xv[j] = x[e];
            ov[j] = o[e];
            wv[j] = Wp[e];
            if (e < ANP_STAGE) os[e] = ov[j];
        }
    }
    const bool staged = width <= ANP_STAGE;
    if (staged) __syncthreads();  // uniform
    const float so = rms_scale_warp(staged ? os : o, width, post_eps);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 e = threadIdx.x + 256 * j;
        if (e < width) x[e] = __fadd_rn(xv[j], __fmul_rn(__fmul_rn(ov[j], so), wv[j]));
    }
    for (u32 e = threadIdx.x + 1024; e < width; e += 256) x[e] = __fadd_rn(x[e], __fmul_rn(__fmul_rn(o[e], so), Wp[e]));
    if (!Xh) return;
    __syncthreads();
    norm_prep_row(x, W, Y ? Y + (u64)row * width : nullptr, Xh + (u64)row * kp, Xs + (u64)row * (kp / 32), width,
                  kp, eps, bf, 0, 1);
}

// SwiGLU fused with the preparation: v = (g / (1 + exp(-g))) * u for rows of `width`, written as
// f32 to Y (when not null; Y may be G) and prepared into Xh / Xs. One warp per (row, block).
// (geglu_prep, its GeGLU twin, lives in elementwise.cu: tanhf under that module's rounding.)
extern "C" __global__ void swiglu_prep(const float* G, const float* __restrict__ U, float* Y, u16* __restrict__ Xh,
                                       float* __restrict__ Xs, u32 M, u32 width, u32 kp, u32 bf) {
    pdl_entry_trigger();
    // The epilogue of product_ws (GLU) spells the same operations: keep them in step.
    auto silu_mul = [](float g, float u) { return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u); };
    glu_prep_rows(silu_mul, G, U, Y, Xh, Xs, M, width, kp, bf);
}

// The gated DeltaNet's output gating fused with the preparation of its output product: for rows
// of `width` = heads x `group` values, u = (C * s) * W[c % group] with s the RMSNorm scale of C's
// head (rms_norm's operations, one norm per group), then v = silu(Z) * u (swiglu_prep's), written
// as f32 to Y (when not null; Y may be Z) and prepared into Xh / Xs: the bits of rms_norm +
// swiglu_prep. One warp per (row, block of 32 values); group % 32 == 0, so a block lies in one
// head and every warp of a head computes its scale the same way.
extern "C" __global__ void norm_gate_prep(const float* __restrict__ C, const float* __restrict__ W, const float* Z,
                                          float* Y, u16* __restrict__ Xh, float* __restrict__ Xs, u32 M, u32 width,
                                          u32 group, float eps, u32 kp, u32 bf) {
    pdl_entry_trigger();
    prep_rows(
        [&](u32 m, u32 b, u32 k) {
            float v = 0.0f;
            if (b * 32 < width) {  // uniform over the warp: width % 32 == 0
                const float* c = C + (u64)m * width;
                const u32 head = (b * 32) / group * group;
                const float s = rms_scale_warp(c + head, group, eps);
                const float u = __fmul_rn(__fmul_rn(c[k], s), W[k - head]);
                const float g = Z[(u64)m * width + k];
                v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
            }
            __syncwarp();
            if (Y && k < width) Y[(u64)m * width + k] = v;
            return v;
        },
        Xh, Xs, M, kp, bf);
}

// The token image of the warp-specialized product (product_ws): prepared rows
// [M][kp] rewritten, per 128-token block and 64-column k-tile, as the 16 KiB that the block's B
// slot holds (128-byte-swizzled K-major: token n's row at (n / 8) * 1024 + (n % 8) * 128,
// columns 8c .. 8c + 7 of the k-tile, in order, as 16-byte chunk c ^ (n % 8)), so that one bulk
// copy fills a slot. Image (b, kt) is at (b * (kp / 64) + kt) * 16384. Tokens past M are zeros
// (their columns are never written out, and an mma column does not depend on the others). The
// prepared block's word 4t + j (j = 2 step + half) holds columns 8j + 2t, +1, so chunk j of a
// 32-column block is words j, j + 4, j + 8, j + 12. One thread per 16-byte chunk of the image,
// in image order, grid-stride.
extern "C" __global__ void ws_image(const u32* __restrict__ Xh, uint4* __restrict__ img, u32 M, u32 kp) {
    pdl_entry();
    const u32 nkt = kp / 64;
    const u64 total = (u64)((M + 127) / 128) * nkt * 1024;
    for (u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (u64)gridDim.x * blockDim.x) {
        const u64 tile = o / 1024;
        const u32 pos = (u32)(o % 1024), r = (pos / 8) % 8, c = (pos % 8) ^ r;
        const u32 n = (u32)(tile / nkt) * 128 + (pos / 64) * 8 + r, kt = (u32)(tile % nkt);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (n < M) {
            const u32* src = Xh + (u64)n * (kp / 2) + kt * 32 + (c / 4) * 16 + (c % 4);
            v = make_uint4(src[0], src[4], src[8], src[12]);
        }
        img[o] = v;
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

// Where output column n of row m goes: columns [0, n1) to Y (rows of n1), [n1, n1 + n2) to Y2
// (rows of n2), the rest to Y3 (a fused QKV or gate/up matrix written to separate buffers).
// n2 == GLU_ILV: a gate/up matrix with its rows interleaved by 8 (16-row tile j = gate rows
// 8j .. 8j + 7, then up rows 8j .. 8j + 7; engine quant::repack::interleave_glu), written back
// to the gate (Y) and up (Y2) rows of n1 features each.
#define GLU_ILV 0xffffffffu
struct Outs {
    float* y[3];
    u32 n1, n2, N;
    __device__ __forceinline__ u64 off(u32 m, u32 n, int* which) const {
        if (n2 == GLU_ILV) {
            *which = (n >> 3) & 1;
            return (u64)m * n1 + (n >> 4) * 8 + (n & 7);
        }
        if (n < n1) {
            *which = 0;
            return (u64)m * n1 + n;
        }
        if (n < n1 + n2) {
            *which = 1;
            return (u64)m * n2 + (n - n1);
        }
        *which = 2;
        return (u64)m * (N - n1 - n2) + (n - n1 - n2);
    }
    // Writes v (+ R when given: R has rows of N and is only used without a split). The pointer
    // is selected, not indexed: y[w] with w known only at run time put y in local memory (ncu,
    // H200 session 16); selecting it made F16 decode 209.3 -> 219.2 tok/s and Q8_0 287.0 ->
    // 300.6 (session 17). Same bits.
    __device__ __forceinline__ void put(u32 m, u32 n, float v, const float* R) const {
        int w;
        const u64 o = off(m, n, &w);
        float* const p = w == 0 ? y[0] : (w == 1 ? y[1] : y[2]);
        p[o] = R ? __fadd_rn(R[o], v) : v;
    }
};

__device__ __forceinline__ Outs outs(float* Y, float* Y2, float* Y3, u32 n1, u32 n2, u32 N) {
    Outs o;
    o.y[0] = Y;
    o.y[1] = Y2;
    o.y[2] = Y3;
    o.n1 = n1;
    o.n2 = n2;
    o.N = N;
    return o;
}

// PRE (product_early, the dense products): the kernel's wait for the previous one (pdl_entry)
// comes after each warp's first weight tiles are requested, not before; nothing else is read or
// written before it (the weights are constant while a model is loaded).
template <class F, bool PRE = false>
__device__ __forceinline__ void product(const u8* __restrict__ W, const u8* __restrict__ X,
                                        const float* __restrict__ Xs, const Outs& out, const float* R, u32 M,
                                        u32 N, u32 nkt, u32 nseg, u32 kp, u32 m0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 rp = (u32)warp % MMQ_RPB, wk = (u32)warp / MMQ_RPB;
    const u32 wks = blockDim.x / (32 * MMQ_RPB);  // 1 or nseg (checked by the host)
    const u32 rt = blockIdx.x * MMQ_RPB + rp;
    const bool live = rt < (N + 15) / 16;
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
            // A ring of PF tiles in flight (register arrays indexed by unrolled constants): tile
            // kt + PF is requested as soon as tile kt is consumed. Tiles are used in order.
            constexpr int PF = MMQ_PF > 0 ? MMQ_PF : (F::TB < 1088 && MMQ_NT <= 2 ? 4 : 2);
            typename F::Tile buf[PF];
#pragma unroll
            for (int i = 0; i < PF; ++i)
                if (k0 + i < k1) F::load(wt + (u64)(k0 + i) * F::TB, lane, buf[i]);
            if (PRE && s == s0) pdl_entry();
            for (u32 kt = k0; kt < k1; kt += PF) {
#pragma unroll
                for (int i = 0; i < PF; ++i) {
                    if (kt + i < k1) {
                        tile_blocks<F>(buf[i], kt + i, X, Xs, kp, tr, t, acc);
                        if (kt + i + PF < k1) F::load(wt + (u64)(kt + i + PF) * F::TB, lane, buf[i]);
                    }
                }
            }
#pragma unroll
            for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
                for (int e = 0; e < 4; ++e) tot[nf][e] = __fadd_rn(tot[nf][e], acc[nf][e]);
        }
    }
    if (PRE && !live) pdl_entry();
    const u32 cols = 8 * MMQ_NT;
    if (wks == 1) {
        if (!live) return;
#pragma unroll
        for (int nf = 0; nf < MMQ_NT; ++nf)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 n = rt * 16 + g + 8 * (e >> 1);
                const u32 m = m0 + nf * 8 + 2 * t + (e & 1);
                if (n < N && m < M) out.put(m, n, tot[nf][e], R);
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
        if (n < N && m < M) out.put(m, n, v, R);
    }
}

// The dense products: `product` with its first weight tiles requested before the wait (PRE).
template <class F>
__device__ __forceinline__ void product_early(const u8* __restrict__ W, const u8* __restrict__ X,
                                              const float* __restrict__ Xs, const Outs& out, const float* R,
                                              u32 M, u32 N, u32 nkt, u32 nseg, u32 kp, u32 m0) {
    product<F, true>(W, X, Xs, out, R, M, N, nkt, nseg, kp, m0);
}

// ---------------------------------------------------------------------------------------------
// The shared-memory product for large M: the same per-element sequence as `product` with WK = 1
// (every segment in order, the tiles of a segment in order, the blocks of a tile in order, each
// through F::block on the same A and B bytes), with the operands staged in shared memory so that
// a block of 8 warps reads each weight tile once for MMS_WT * MMS_NT * 8 tokens and each token's
// activations once for MMS_WR * MMS_RT * 16 rows. cp.async fills MMS_STAGES k-tile stages ahead.
// Warp (wr, wt) owns row tiles wr * MMS_RT .. and token fragments wt * MMS_NT .. of the block.

#ifndef MMS_RT
#define MMS_RT 2
#endif
#ifndef MMS_NT
#define MMS_NT 4
#endif
#ifndef MMS_STAGES
#define MMS_STAGES 3
#endif
// Blocks of 256 threads per SM the register budget is cut for (0: per format, MMS_KERNEL).
#ifndef MMS_MINB
#define MMS_MINB 0
#endif
// 1: the segment totals live in shared memory after the stages (one f32 per thread and C
// element, touched once per segment), leaving the registers to the accumulators of a larger
// warp tile; 0: in registers. Same additions in the same order either way.
#ifndef MMS_TOTS
#define MMS_TOTS 0
#endif
#define MMS_WR 4
#define MMS_WT 2


// Bytes of one staged token row: the k-tile's 16-bit values plus 64 (a quarter-warp's eight
// 16-byte fragment loads then fall on distinct banks).
template <class F>
struct Mms {
    enum {
        TILES = MMS_WR * MMS_RT,
        TOKS = MMS_WT * MMS_NT * 8,
        BROW = F::KT * 2 + 64,
        ABYTES = TILES * F::TB,
        STAGE = ABYTES + TOKS * BROW,
    };
};

// Stage k-tile kt of the block's row tiles and tokens into `st` (one commit group per call); L
// (Mms<F> or Mwg<F>) gives the block's TILES, TOKS, the staged token row's bytes BROW and ABYTES.
// With G (mms_grouped), staged token i is activation row gather[i] / xdiv (as product_smem's G).
template <class F, class L = Mms<F>, bool G = false>
__device__ __forceinline__ void mms_stage(u8* st, const u8* __restrict__ W, const u8* __restrict__ X, u32 kt,
                                          u32 rt0, u32 nrt, u32 nkt, u32 m0, u32 M, u32 kp,
                                          const u32* __restrict__ gather = nullptr, u32 xdiv = 1) {
    constexpr u32 ACH = F::TB / 16, BCH = F::KT * 2 / 16;
    for (u32 i = threadIdx.x; i < L::TILES * ACH; i += blockDim.x) {
        const u32 tl = i / ACH, c = i % ACH;
        const u32 rt = min(rt0 + tl, nrt - 1);  // past the last tile: a copy, never written out
        cp_async16(st + tl * F::TB + c * 16, W + ((u64)rt * nkt + kt) * F::TB + c * 16);
    }
    u8* b = st + L::ABYTES;
    for (u32 i = threadIdx.x; i < L::TOKS * BCH; i += blockDim.x) {
        const u32 tk = i / BCH, c = i % BCH;
        u32 m = min(m0 + tk, M - 1);  // past M: a copy of row M - 1, never written out
        if (G) m = __ldg(gather + m) / xdiv;
        cp_async16(b + tk * L::BROW + c * 16, X + ((u64)m * kp + (u64)kt * F::KT) * 2 + c * 16);
    }
}

// The order in which a product's blocks take their (row-tile group, token block) pairs. The
// launch runs blocks in linear order, x fastest; taken straight (TILE_GROUP 0), the ~132 blocks
// in flight at M = 512 are 132 row-tile groups of ONE token block, so every token block streams
// the whole weight matrix from HBM again (llama3-8b's 28672-row gate/up: 4 x 235 MB per layer,
// ~3 TB/s in session 14's kernel rows). Grouped, consecutive blocks take TILE_GROUP row-tile
// groups by every token block, so the blocks sharing a weight tile run together and read it
// once from HBM, then from L2. Only the order changes: every block computes the same tile with
// the same operations, so the bits are those of any order.
#ifndef TILE_GROUP
#define TILE_GROUP 8
#endif
__device__ __forceinline__ uint2 tile_order() {
    const u32 gx = gridDim.x, gy = gridDim.y;
    if (TILE_GROUP == 0 || gy == 1) return make_uint2(blockIdx.x, blockIdx.y);
    const u32 lin = blockIdx.y * gx + blockIdx.x, per = TILE_GROUP * gy;
    const u32 x0 = lin / per * TILE_GROUP, r = lin % per;
    const u32 w = min((u32)TILE_GROUP, gx - x0);  // the last group may be narrower
    return make_uint2(x0 + r % w, r / w);
}

// G (mms_grouped_<type>): the block's tokens are rows m0 .. of the gathered rows (token i reads
// activation row gather[i] / xdiv and writes output row gather[i]), m0 from the caller and the
// row-tile group from blockIdx.x (no TILE_GROUP order). Only addresses move.
template <class F, bool G = false>
__device__ __forceinline__ void product_smem(const u8* __restrict__ W, const u8* __restrict__ X,
                                             const float* __restrict__ Xs, const Outs& out, const float* R,
                                             u32 M, u32 N, u32 nkt, u32 nseg, u32 kp, u32 gm0 = 0,
                                             const u32* __restrict__ gather = nullptr, u32 xdiv = 1) {
    extern __shared__ uint4 mms_smem[];
    u8* sm = (u8*)mms_smem;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 wr = (u32)warp % MMS_WR, wt = (u32)warp / MMS_WR;
    const u32 nrt = (N + 15) / 16;
    const uint2 bt = G ? make_uint2(blockIdx.x, 0) : tile_order();
    const u32 rt0 = bt.x * Mms<F>::TILES;
    const u32 m0 = G ? gm0 : bt.y * Mms<F>::TOKS;
    const u32 nbk = kp / 32;
    // This lane's token columns 2t, 2t + 1 of each fragment (the block sums of MIN formats).
    u32 c0[MMS_NT], c1[MMS_NT];
#pragma unroll
    for (int nf = 0; nf < MMS_NT; ++nf) {
        const u32 base = m0 + (wt * MMS_NT + nf) * 8;
        c0[nf] = min(base + 2 * t, M - 1);
        c1[nf] = min(base + 2 * t + 1, M - 1);
        if (G) {
            c0[nf] = __ldg(gather + c0[nf]) / xdiv;
            c1[nf] = __ldg(gather + c1[nf]) / xdiv;
        }
    }
    float acc[MMS_RT][MMS_NT][4];
#if MMS_TOTS
    // Element (r, nf, e) of this thread at [((r * MMS_NT + nf) * 4 + e) * 256 + threadIdx.x].
    float* tots = (float*)(sm + MMS_STAGES * Mms<F>::STAGE);
#define MMS_TOT(r, nf, e) tots[(((r) * MMS_NT + (nf)) * 4 + (e)) * 256 + threadIdx.x]
#else
    float tot[MMS_RT][MMS_NT][4];
#define MMS_TOT(r, nf, e) tot[r][nf][e]
#endif
#pragma unroll
    for (int r = 0; r < MMS_RT; ++r)
#pragma unroll
        for (int nf = 0; nf < MMS_NT; ++nf)
#pragma unroll
            for (int e = 0; e < 4; ++e) MMS_TOT(r, nf, e) = acc[r][nf][e] = NEG_ZERO;
#pragma unroll
    for (int s = 0; s < MMS_STAGES - 1; ++s) {
        if ((u32)s < nkt) mms_stage<F, Mms<F>, G>(sm + s * Mms<F>::STAGE, W, X, s, rt0, nrt, nkt, m0, M, kp, gather, xdiv);
        cp_async_commit();
    }
    u32 seg = 0, kend = nkt / nseg, rel = 0;
    for (u32 kt = 0; kt < nkt; ++kt) {
        cp_async_wait<MMS_STAGES - 2>();
        __syncthreads();  // stage kt is in; every warp is done with stage kt - 1
        const u32 nk = kt + MMS_STAGES - 1;
        if (nk < nkt)
            mms_stage<F, Mms<F>, G>(sm + (nk % MMS_STAGES) * Mms<F>::STAGE, W, X, nk, rt0, nrt, nkt, m0, M, kp,
                                    gather, xdiv);
        cp_async_commit();
        const u8* a = sm + (kt % MMS_STAGES) * Mms<F>::STAGE;
        const u8* b = a + Mms<F>::ABYTES;
        typename F::Tile tl[MMS_RT];
#pragma unroll
        for (int r = 0; r < MMS_RT; ++r) F::template load<Sld>(a + (wr * MMS_RT + r) * F::TB, lane, tl[r]);
#pragma unroll
        for (int bb = 0; bb < F::NB; ++bb) {
#pragma unroll
            for (int nf = 0; nf < MMS_NT; ++nf) {
                const uint4 v =
                    *(const uint4*)(b + ((wt * MMS_NT + nf) * 8 + g) * Mms<F>::BROW + bb * 64 + 16 * t);
                const u32 bf[4] = {v.x, v.y, v.z, v.w};
                XSum xs = {0.0f, 0.0f};
                if (F::MIN) {
                    xs.s0 = __ldg(Xs + (u64)c0[nf] * nbk + kt * F::NB + bb);
                    xs.s1 = __ldg(Xs + (u64)c1[nf] * nbk + kt * F::NB + bb);
                }
#pragma unroll
                for (int r = 0; r < MMS_RT; ++r) F::block(tl[r], bb, bf, xs, acc[r][nf]);
            }
        }
        if (kt + 1 == kend) {  // the end of segment `seg`
#pragma unroll
            for (int r = 0; r < MMS_RT; ++r)
#pragma unroll
                for (int nf = 0; nf < MMS_NT; ++nf)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        MMS_TOT(r, nf, e) = __fadd_rn(MMS_TOT(r, nf, e), acc[r][nf][e]);
                        acc[r][nf][e] = NEG_ZERO;
                    }
            ++seg;
            kend = (seg + 1) * nkt / nseg;
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < MMS_RT; ++r)
#pragma unroll
        for (int nf = 0; nf < MMS_NT; ++nf)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 n = (rt0 + wr * MMS_RT + r) * 16 + g + 8 * (e >> 1);
                const u32 m = m0 + (wt * MMS_NT + nf) * 8 + 2 * t + (e & 1);
                if (n < N && m < M) out.put(G ? __ldg(gather + m) : m, n, MMS_TOT(r, nf, e), R);
            }
#undef MMS_TOT
}

// ---------------------------------------------------------------------------------------------
// The warpgroup product for large M on sm_90a (`mwg_<type>`, F16 / BF16 / Q4_K / Q8_0 / Q4_0 /
// Q6_K): the same per-element sequence as `product_smem` (every segment in order, the steps of a
// segment in order, each a k16 mma accumulating into the segment's chain from -0.0, or for the
// scaled formats into the part's chain from +0.0 then scaled into the segment's, the segment sums
// added in order from -0.0), with each step one wgmma of 64 rows x MWG_N tokens instead of 4 x
// MWG_N / 8 mma.sync per warp: wgmma gives mma.sync's bits (mma.cuh), so mwg, mms and mmq
// results are bitwise equal at every M. A block = 2 warpgroups x 64 rows (warp w: row tile w of
// the block's 8) x MWG_N tokens; weight tiles and token rows staged by cp.async (MMS_STAGES
// stages), each stage's token rows then rewritten into the wgmma B layout (mma.cuh, wg_desc):
// the prepared activations hold, per 32-column block, lane t's B fragments of the block's two
// steps in 32-bit words 4t..4t+3 (prep.cuh: word 4t + 2 step + h = columns 16 step + 8 h + 2t,
// +1); a B core row needs the columns 16 step + 8 h + 0..7 = words 2 step + h + (0, 4, 8, 12).

#ifndef MWG_N
#define MWG_N 128
#endif

template <class F>
struct Mwg {
    enum {
        TILES = 8,
        TOKS = MWG_N,
        BROW = F::KT * 2 + 16,
        ABYTES = TILES * F::TB,
        STAGE = ABYTES + TOKS * BROW,
        STEP = MWG_N * 32,  // bytes of one k16 step of the B layout
        BBYTES = (F::KT / 16) * STEP,
    };
};

template <class F>
__device__ __forceinline__ void mwg_relayout(const u8* raw, u8* bl) {
    constexpr u32 BLOCKS = F::KT / 32;
    for (u32 i = threadIdx.x; i < MWG_N * BLOCKS; i += blockDim.x) {
        const u32 n = i % MWG_N, bb = i / MWG_N;
        const uint4* q = (const uint4*)(raw + n * Mwg<F>::BROW + bb * 64);
        const uint4 q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
        u8* d0 = bl + 2 * bb * Mwg<F>::STEP + (n / 8) * 256 + (n % 8) * 16;
        u8* d1 = d0 + Mwg<F>::STEP;
        *(uint4*)d0 = make_uint4(q0.x, q1.x, q2.x, q3.x);
        *(uint4*)(d0 + 128) = make_uint4(q0.y, q1.y, q2.y, q3.y);
        *(uint4*)d1 = make_uint4(q0.z, q1.z, q2.z, q3.z);
        *(uint4*)(d1 + 128) = make_uint4(q0.w, q1.w, q2.w, q3.w);
    }
}

// One k-tile of a scaled format (F::WGP > 0: Q8_0, Q4_0, Q6_K), whose `block` chains each part
// (2 / WGP steps) from +0.0 and adds scale * chain into the segment chain (wfmt.cuh): per part,
// the chain c from +0.0 by wgmma (the same steps in the same order, the same bits as mma.sync),
// then acc += s * c per element with the scales of the warp's rows g, g + 8 (the wgmma C layout
// is mma.sync's per warp: element i is row g + 8 ((i & 3) >> 1)). The same sequence as `block`.
//
// Experiment (session 9, NOT yet run on a GPU; `#define MWG_SPIPE 1` through MEMRA_KERNEL_DIR to
// A/B it): two chain sets, part q + 1's wgmmas issued before part q's epilogue (wait_group 1), so
// the tensor cores run while the scales are applied. The same chains and the same additions into
// acc in the same order: the same bits.
#ifndef MWG_SPIPE
#define MWG_SPIPE 0
#endif

template <class F>
__device__ __forceinline__ void mwg_part_issue(const typename F::Tile& tl, const u8* bl, int q, float* c) {
    constexpr int ND = MWG_N / 2, H = 2 / F::WGP;
    const int b = q / F::WGP, p = q % F::WGP;
    u32 af[2][4];
    F::part_a(tl, b, p, af);
#pragma unroll
    for (int i = 0; i < ND; ++i) c[i] = 0.0f;
    wg_keep<MWG_N>(c);  // the zeros written before the fence, not between it and the wgmma
    wg_fence();
#pragma unroll
    for (int h = 0; h < H; ++h)
        wg_mma<MWG_N, F::BF>(c, af[h], wg_desc(bl + (2 * b + p * H + h) * Mwg<F>::STEP));
    wg_commit();
}

template <class F>
__device__ __forceinline__ void mwg_scaled(const typename F::Tile& tl, const u8* bl, float* acc) {
    constexpr int ND = MWG_N / 2, H = 2 / F::WGP;
    if constexpr (MWG_SPIPE) {
        constexpr int P = F::NB * F::WGP;
        float c[2][ND];
        mwg_part_issue<F>(tl, bl, 0, c[0]);
#pragma unroll
        for (int q = 0; q < P; ++q) {
            if (q + 1 < P) {
                mwg_part_issue<F>(tl, bl, q + 1, c[(q + 1) & 1]);
                wg_wait1();
            } else {
                wg_wait0();
            }
            wg_keep<MWG_N>(c[q & 1]);
            float sc[2];
            F::part_scale(tl, q / F::WGP, q % F::WGP, sc);
#pragma unroll
            for (int i = 0; i < ND; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(sc[(i & 3) >> 1], c[q & 1][i]));
        }
        return;
    }
#pragma unroll
    for (int b = 0; b < F::NB; ++b) {
#pragma unroll
        for (int p = 0; p < F::WGP; ++p) {
            u32 af[2][4];
            F::part_a(tl, b, p, af);
            float c[ND];
#pragma unroll
            for (int i = 0; i < ND; ++i) c[i] = 0.0f;
            wg_fence();
#pragma unroll
            for (int h = 0; h < H; ++h)
                wg_mma<MWG_N, F::BF>(c, af[h], wg_desc(bl + (2 * b + p * H + h) * Mwg<F>::STEP));
            wg_commit();
            wg_wait0();
            float sc[2];
            F::part_scale(tl, b, p, sc);
#pragma unroll
            for (int i = 0; i < ND; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(sc[(i & 3) >> 1], c[i]));
        }
    }
}

// Shared by the warpgroup products (product_wg, product_ws): one k-tile's wgmmas
// (fence, then the NB blocks' two k16 steps in order; `desc(step)`: step's B descriptor) and
// their commit; a segment's end (totals += chain in order, the chain back to -0.0); the totals
// out.
template <class F, class D>
__device__ __forceinline__ void mwg_issue(float* acc, const typename F::Tile& tl, D desc) {
    wg_fence();
#pragma unroll
    for (int b = 0; b < F::NB; ++b) {
        u32 af[2][4];
        F::block_a(tl, b, af);
#pragma unroll
        for (int half = 0; half < 2; ++half) wg_mma<MWG_N, F::BF>(acc, af[half], desc(2 * b + half));
    }
    wg_commit();
}

template <int ND>
__device__ __forceinline__ void mwg_fold(float* tot, float* acc) {
#pragma unroll
    for (int i = 0; i < ND; ++i) {
        tot[i] = __fadd_rn(tot[i], acc[i]);
        acc[i] = NEG_ZERO;
    }
}

template <int ND>
__device__ __forceinline__ void mwg_store(const Outs& out, const float* tot, const float* R, u32 M, u32 N, u32 n0,
                                          u32 m0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < ND; ++i) {
        const int j = i >> 2, e = i & 3;
        const u32 n = n0 + g + 8 * (e >> 1);
        const u32 m = m0 + j * 8 + 2 * t + (e & 1);
        if (n < N && m < M) out.put(m, n, tot[i], R);
    }
}

template <class F>
__device__ __forceinline__ void product_wg(const u8* __restrict__ W, const u8* __restrict__ X, const Outs& out,
                                           const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp) {
#if MWG_OK
    extern __shared__ uint4 mwg_smem[];
    u8* sm = (u8*)mwg_smem;
    u8* bl = sm + MMS_STAGES * Mwg<F>::STAGE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 nrt = (N + 15) / 16;
    const uint2 bt = tile_order();
    const u32 rt0 = bt.x * Mwg<F>::TILES;
    const u32 m0 = bt.y * MWG_N;
    constexpr int ND = MWG_N / 2;
    float acc[ND], tot[ND];
#pragma unroll
    for (int i = 0; i < ND; ++i) acc[i] = tot[i] = NEG_ZERO;
#pragma unroll
    for (int s = 0; s < MMS_STAGES - 1; ++s) {
        if ((u32)s < nkt) mms_stage<F, Mwg<F>>(sm + s * Mwg<F>::STAGE, W, X, s, rt0, nrt, nkt, m0, M, kp);
        cp_async_commit();
    }
    u32 seg = 0, kend = nkt / nseg, rel = 0;
    for (u32 kt = 0; kt < nkt; ++kt) {
        cp_async_wait<MMS_STAGES - 2>();
        __syncthreads();  // stage kt is in; every warp is done with stage kt - 1 and with `bl`
        const u32 nk = kt + MMS_STAGES - 1;
        if (nk < nkt) mms_stage<F, Mwg<F>>(sm + (nk % MMS_STAGES) * Mwg<F>::STAGE, W, X, nk, rt0, nrt, nkt, m0, M, kp);
        cp_async_commit();
        const u8* a = sm + (kt % MMS_STAGES) * Mwg<F>::STAGE;
        mwg_relayout<F>(a + Mwg<F>::ABYTES, bl);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        typename F::Tile tl;
        F::template load<Sld>(a + warp * F::TB, lane, tl);
        if constexpr (F::WGP == 0) {
            mwg_issue<F>(acc, tl, [&](int st) { return wg_desc(bl + st * Mwg<F>::STEP); });
            wg_wait0();
        } else {
            mwg_scaled<F>(tl, bl, acc);
        }
        if (kt + 1 == kend) {  // the end of segment `seg`
            mwg_fold<ND>(tot, acc);
            ++seg;
            kend = (seg + 1) * nkt / nseg;
        }
    }
    cp_async_wait<0>();
    mwg_store<ND>(out, tot, R, M, N, (rt0 + warp) * 16, m0);
#else
    __trap();  // sm_90a only: the host launches mwg only there (profile.rs)
#endif
}

// Y, Y2, Y3 with n1 / n2: see Outs (n1 = N for a single output); R: residual (rows of N).
#define MMQ_KERNEL(suffix, FMT)                                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_MAXT, MMQ_MINB) mmq_##suffix(                                      \
        const u8* W, const u8* X, const float* Xs, float* Y, float* Y2, float* Y3, u32 n1, u32 n2,            \
        const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp) {                                          \
        product_early<FMT>(W, X, Xs, outs(Y, Y2, Y3, n1, n2, N), R, M, N, nkt, nseg, kp,                    \
                           blockIdx.y * 8 * MMQ_NT);                                                         \
    }

MMQ_KERNEL(q8_0, FmtQ8_0)
MMQ_KERNEL(q4_0, FmtQ4_0)
MMQ_KERNEL(q4_1, FmtQ4_1)
MMQ_KERNEL(q5_0, FmtQ5_0)
MMQ_KERNEL(q5_1, FmtQ5_1)
MMQ_KERNEL(q4_k, FmtQ4_K)
MMQ_KERNEL(q5_k, FmtQ5_K)
MMQ_KERNEL(q6_k, FmtQ6_K)
MMQ_KERNEL(f16, FmtF16<0>)
MMQ_KERNEL(bf16, FmtF16<1>)

// The expert products of a mixture-of-experts FFN (issue 16; engine/src/backend/cuda/moe.rs):
// one (row, slot) pair per blockIdx.y (pair p = p0 + blockIdx.y, slot p % k of step row p / k),
// each the product above at M = 1 of the pair's expert's matrix: W holds the experts' tile
// layouts one after the other, `wstride` bytes apart; ids[p] is the pair's expert (clamped to
// n_experts - 1, so a bad id cannot read out of bounds). The pair's activations are prepared
// row p / xdiv (xdiv = k: the step row's input, shared by its k slots; xdiv = 1: the pair's own
// row) and its N outputs go to row p of Y. Every element is the dense product's sequence for
// that expert and row (M = 1 computes the same bits as any M), so a pair's result does not
// depend on the other pairs, on how many chose its expert, or on the launch. Two matrices of
// one shape and type over the same pairs (an expert FFN's gate and up) in one launch: grid.y =
// 2 np, blocks np.. take W2 / Y2 for pair p0 + blockIdx.y - np (one matrix: np = grid.y).
#define MMQ_ID_KERNEL(suffix, FMT)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMQ_MAXT, MMQ_MINB) mmq_id_##suffix(                                   \
        const u8* W, const u8* W2, u64 wstride, const u8* X, const float* Xs, const u32* ids, u32 xdiv,     \
        u32 p0, u32 np, u32 n_experts, float* Y, float* Y2, u32 N, u32 nkt, u32 nseg, u32 kp) { pdl_entry();  \
        const bool two = blockIdx.y >= np;                                                                  \
        const u32 p = p0 + (two ? blockIdx.y - np : blockIdx.y);                                            \
        const u32 e = min(ids[p], n_experts - 1);                                                           \
        const u32 xr = p / xdiv;                                                                            \
        const Outs o = outs((two ? Y2 : Y) + (u64)p * N, nullptr, nullptr, N, 0, N);                        \
        product<FMT>((two ? W2 : W) + (u64)e * wstride, X + (u64)xr * kp * 2, Xs + (u64)xr * (kp / 32), o,  \
                     nullptr, 1, N, nkt, nseg, kp, 0);                                                      \
    }

MMQ_ID_KERNEL(q8_0, FmtQ8_0)
MMQ_ID_KERNEL(q4_0, FmtQ4_0)
MMQ_ID_KERNEL(q4_1, FmtQ4_1)
MMQ_ID_KERNEL(q5_0, FmtQ5_0)
MMQ_ID_KERNEL(q5_1, FmtQ5_1)
MMQ_ID_KERNEL(q4_k, FmtQ4_K)
MMQ_ID_KERNEL(q5_k, FmtQ5_K)
MMQ_ID_KERNEL(q6_k, FmtQ6_K)
MMQ_ID_KERNEL(f16, FmtF16<0>)
MMQ_ID_KERNEL(bf16, FmtF16<1>)

// The grouped expert products (issue 16, prefill-sized calls; engine/src/backend/cuda/moe.rs):
// moe_group (moe.cu) has sorted the pairs by expert, ascending pair index within an expert, into
// `order`, with the pair offsets offs[0..=E] and the token-tile offsets offs[E + 1..=2 E + 1]
// (tiles of Mms<F>::TOKS pairs). Block (x, y) takes tile b = b0 + y: expert e with
// tile_off[e] <= b < tile_off[e + 1] (the last such e: empty experts have no tiles; blocks past
// the last tile exit), and runs the shared-memory product over row-tile group x of that
// expert's matrix and that tile of its pairs as M rows, gathered: pair order[offs[e] + i] reads
// activation row pair / xdiv and writes row pair of Y. product_smem computes the per-element
// sequence of `product` (every segment in order from -0.0), which at M = 1 is mmq_id's: bitwise
// equal results. The shared-memory form reads each weight tile once for the tile's TOKS pairs and
// each pair's activations once for the block's 16 * TILES rows (the register product it replaces,
// 16 rows a block, read the activations ~7x the weights' bytes: 60% of the 80B hybrid's pp512).
// moe_tile_expert (prelude.cuh) finds a tile's expert.

// Two blocks an SM: at 16 tokens and 8 row tiles a stage is 28-37 KiB (Q4_K / Q6_K), so two
// blocks' three stages fit, and the accumulators (MMS_RT x MMS_NT x 4) fit 128 registers.
#define MMS_GROUPED_KERNEL(suffix, FMT)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 2) mms_grouped_##suffix(                              \
        const u8* W, u64 wstride, const u8* X, const float* Xs, const u32* order, const u32* offs, u32 xdiv,  \
        u32 b0, u32 n_experts, float* Y, u32 N, u32 nkt, u32 nseg, u32 kp) { pdl_entry();                 \
        const u32 b = b0 + blockIdx.y;                                                                      \
        const u32* toff = offs + n_experts + 1;                                                             \
        if (b >= __ldg(toff + n_experts)) return;                                                           \
        const u32 e = moe_tile_expert(toff, n_experts, b);                                                  \
        const u32 first = __ldg(offs + e), cnt = __ldg(offs + e + 1) - first;                               \
        const u32 m0 = (b - __ldg(toff + e)) * Mms<FMT>::TOKS;                                              \
        const Outs o = outs(Y, nullptr, nullptr, N, 0, N);                                                  \
        product_smem<FMT, true>(W + (u64)e * wstride, X, Xs, o, nullptr, cnt, N, nkt, nseg, kp, m0,         \
                                order + first, xdiv);                                                       \
    }

MMS_GROUPED_KERNEL(q8_0, FmtQ8_0)
MMS_GROUPED_KERNEL(q4_0, FmtQ4_0)
MMS_GROUPED_KERNEL(q4_1, FmtQ4_1)
MMS_GROUPED_KERNEL(q5_0, FmtQ5_0)
MMS_GROUPED_KERNEL(q5_1, FmtQ5_1)
MMS_GROUPED_KERNEL(q4_k, FmtQ4_K)
MMS_GROUPED_KERNEL(q5_k, FmtQ5_K)
MMS_GROUPED_KERNEL(q6_k, FmtQ6_K)
MMS_GROUPED_KERNEL(f16, FmtF16<0>)
MMS_GROUPED_KERNEL(bf16, FmtF16<1>)

// MINB: two blocks per SM where stages and registers allow it (F16 and Q8_0 at
// M = 512: 20-30% faster than one, H200), one for the K-quants and Q4_1 (which would spill)
// and for the large warp tiles (MMS_TOTS).
#define MMS_KERNEL(suffix, FMT, MINB)                                                                       \
    extern "C" __global__ void __launch_bounds__(256, MMS_MINB > 0 ? MMS_MINB : MMS_TOTS ? 1 : MINB) mms_##suffix(                                         \
        const u8* W, const u8* X, const float* Xs, float* Y, float* Y2, float* Y3, u32 n1, u32 n2,            \
        const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp) { pdl_entry();                                            \
        const Outs o = outs(Y, Y2, Y3, n1, n2, N);                                                           \
        product_smem<FMT>(W, X, Xs, o, R, M, N, nkt, nseg, kp);                                               \
    }

MMS_KERNEL(q8_0, FmtQ8_0, 2)
MMS_KERNEL(q4_0, FmtQ4_0, 2)
MMS_KERNEL(q4_1, FmtQ4_1, 1)
MMS_KERNEL(q5_0, FmtQ5_0, 2)
MMS_KERNEL(q5_1, FmtQ5_1, 1)
MMS_KERNEL(q4_k, FmtQ4_K, 1)
MMS_KERNEL(q5_k, FmtQ5_K, 1)
MMS_KERNEL(q6_k, FmtQ6_K, 1)
MMS_KERNEL(f16, FmtF16<0>, 2)
MMS_KERNEL(bf16, FmtF16<1>, 2)

// (The MWG_PIPE / MWG_GATHER experiments that could replace product_wg here were deleted in
// session 13: reports/kernel-notes.md.)
template <class F>
__device__ __forceinline__ void product_mwg(const u8* __restrict__ W, const u8* __restrict__ X, const Outs& out,
                                            const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp) {
    product_wg<F>(W, X, out, R, M, N, nkt, nseg, kp);
}

// The warpgroup product (sm_90a): one block of 2 warpgroups per SM.
#define MWG_KERNEL(suffix, FMT)                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 1) mwg_##suffix(                                     \
        const u8* W, const u8* X, const float* Xs, float* Y, float* Y2, float* Y3, u32 n1, u32 n2,            \
        const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp) { pdl_entry();                                            \
        const Outs o = outs(Y, Y2, Y3, n1, n2, N);                                                           \
        product_mwg<FMT>(W, X, o, R, M, N, nkt, nseg, kp);                                                    \
    }

MWG_KERNEL(q4_k, FmtQ4_K)
MWG_KERNEL(f16, FmtF16<0>)
MWG_KERNEL(bf16, FmtF16<1>)
MWG_KERNEL(q8_0, FmtQ8_0)
MWG_KERNEL(q4_0, FmtQ4_0)
MWG_KERNEL(q6_k, FmtQ6_K)

// ---------------------------------------------------------------------------------------------
// The warp-specialized warpgroup product (`mws_<type>`, sm_90a, F16 / BF16; issue 8: F16
// prefill): the same per-element sequence as product_wg (every segment in order, the k16 steps
// of a segment in order as wgmmas accumulating into the segment's chain from -0.0, the segment
// sums added into the totals in order from -0.0), so its bits equal mwg's, mms's and mmq's at
// every M. What differs is who waits for what:
//   * 3 warpgroups: warpgroup 0 only copies, warpgroups 1 and 2 only compute: 64 rows (warp w
//     of the pair: row tile w of the block's 8) x MWG_N tokens each. One thread of warpgroup 0
//     fills a slot with 9 bulk copies (the copy engine): the block's 8 weight tiles of the
//     k-tile (2 KiB each) and its 16 KiB token image (ws_image above, already in the
//     128-byte-swizzled K-major B layout of wg_desc_sw128). Session 14 measured the cp.async
//     feed this replaced (128 threads, the token rows in 4-byte copies) at half the speed, and
//     session 15 a wgmma group left in flight past each k-tile as slower: both are gone (they
//     stay in git history, kernel-notes names the commits);
//   * MWS_STAGES slots, each with two mbarriers: `full` (one arrival expecting the slot's bytes,
//     complete when the bulk copies have landed) and `empty` (8 arrivals: lane 0 of each
//     computing warp once the wgmmas that read the slot have retired). No block barrier in the
//     loop;
//   * a warp waits for its k-tile's wgmmas (wait_group 0) before the next k-tile, the other
//     computing warpgroup's keeping the tensor pipe busy; a segment's end adds the chain into
//     the totals, which live in shared memory (one f32 per computing thread and element,
//     touched once per segment) so the registers hold one chain.
// Shared memory: [B slots (1024-aligned)][A slots][totals][full x S][empty x S].
#ifndef MWS_STAGES
#define MWS_STAGES 4
#endif
// Computing warpgroups (64 rows each; the launch's `wgs`, profile.rs: with 3, blocks of 192 rows,
// 96 KiB of totals, 3 slots; the same per-element sequence, so the same bits).
#ifndef MWS_WG
#define MWS_WG 2
#endif

template <class F>
struct Mws {
    enum {
        S = MWS_STAGES,
        TILES = 4 * MWS_WG,
        CT = 128 * MWS_WG,  // computing threads
        ABYTES = TILES * F::TB,
        BBYTES = MWG_N * F::KT * 2,  // KT / 64 atom columns of MWG_N 128-byte rows
        ND = MWG_N / 2,
        TOTS = CT * ND * 4,
        SMEM = 1024 + S * (BBYTES + ABYTES) + TOTS + 16 * S,
    };
};

// The SwiGLU epilogue of product_ws (`mws_glu_<type>`): a gate/up matrix with its rows
// interleaved by 8 (Outs, GLU_ILV), so a block's 128 rows are 64 features' gate and up. Instead
// of the totals, it writes v = (g / (1 + exp(-g))) * u of each feature and token, prepared for
// the down product into xh / xs (rows of kp columns, bf as in prep_store) with swiglu_prep's
// operations and warp organization: a warp takes (token, 32-feature block) pairs,
// lane = feature, so the values, their rounding and each block's sum are swiglu_prep's bits.
// Features at or past ff are 0 (as past swiglu_prep's width).
struct GluOut {
    u16* xh;
    float* xs;
    u32 ff, kp, bf;
};

template <class F, bool GLU = false>
__device__ __forceinline__ void product_ws(const u8* __restrict__ W, const u8* __restrict__ Xi, const Outs& out,
                                           const float* R, u32 M, u32 N, u32 nkt, u32 nseg,
                                           const GluOut glu = GluOut{}) {
#if MWG_OK && MWG_N == 128
    using L = Mws<F>;
    static_assert(F::WGP == 0 && F::KT % 64 == 0 && MWG_N % 8 == 0, "pure chains, whole swizzle atoms");
    static_assert(F::KT == 64 && L::BBYTES == 16384, "the token image's 16 KiB k-tiles");
    constexpr u32 S = L::S;
    constexpr int ND = L::ND;
    extern __shared__ uint4 mws_smem[];
    u8* sm = (u8*)mws_smem;
    const u32 sbase = smem_addr(sm);
    u8* bsl = sm + (((sbase + 1023) & ~1023u) - sbase);  // B slot 0, 1024-byte aligned
    u8* asl = bsl + S * L::BBYTES;
    float* tots = (float*)(asl + S * L::ABYTES);
    u64* full = (u64*)(tots + L::CT * ND);
    u64* empty = full + S;
    // The warp index through a shuffle: warp-uniform to the compiler, so the role branch below
    // is not a divergent path (ptxas would otherwise serialize the wgmmas inside it).
    const int lane = threadIdx.x & 31, warp = __shfl_sync(FULL_MASK, threadIdx.x >> 5, 0);
    const u32 nrt = (N + 15) / 16;
    const uint2 bt = tile_order();
    const u32 rt0 = bt.x * L::TILES;
    const u32 m0 = bt.y * MWG_N;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < S; ++s) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, 4 * MWS_WG);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (warp < 4) {  // the copier warpgroup: one thread drives the copy engine
        if (threadIdx.x != 0) return;
        const u8* xi = Xi + (u64)bt.y * nkt * L::BBYTES;
        for (u32 kt = 0; kt < nkt; ++kt) {
            const u32 s = kt % S;
            if (kt >= S) mbar_wait(empty + s, ((kt / S) + 1) & 1);  // use kt / S - 1 retired
            mbar_expect(full + s, L::BBYTES + L::ABYTES);
            bulk_g2s(bsl + s * L::BBYTES, xi + (u64)kt * L::BBYTES, L::BBYTES, full + s);
            for (u32 tl = 0; tl < L::TILES; ++tl) {
                const u32 rt = min(rt0 + tl, nrt - 1);  // past the last tile: a copy, never written out
                bulk_g2s(asl + s * L::ABYTES + tl * F::TB, W + ((u64)rt * nkt + kt) * F::TB, F::TB, full + s);
            }
        }
        return;
    }
    const u32 ct = threadIdx.x - 128, cw = (u32)warp - 4;  // computing thread, warp (= row tile)
#pragma unroll
    for (int i = 0; i < ND; ++i) tots[i * L::CT + ct] = NEG_ZERO;
    float acc[ND];
#pragma unroll
    for (int i = 0; i < ND; ++i) acc[i] = NEG_ZERO;
    u32 seg = 0, kend = nkt / nseg, rel = 0;
    // One k-tile; `cur` holds its A fragments (ptxas keeps an in-flight wgmma's registers apart:
    // a loop unrolled by two with two named sets made it serialize the wgmmas instead).
    auto step = [&](u32 kt, typename F::Tile& cur) {
        const u32 s = kt % S;
        mbar_wait(full + s, (kt / S) & 1);
        // No proxy fence: the bulk copies complete_tx on the slot's mbarrier, whose completion
        // makes their bytes visible to the waiting threads and their wgmmas (H200 sessions 16 /
        // 17: with a fence here 0-4% slower, bits equal).
        F::template load<Sld>(asl + s * L::ABYTES + cw * F::TB, lane, cur);
        const u8* bl = bsl + s * L::BBYTES;
        mwg_issue<F>(acc, cur, [&](int st) { return wg_desc_sw128(bl + (st / 4) * (MWG_N * 128) + (st % 4) * 32); });
        const bool send = kt + 1 == kend;  // the end of segment `seg`
        wg_wait0();
        wg_keep<MWG_N>(acc);
        // Slot kt % S goes back (rel == kt here: one arrival; this form is the SASS the H200
        // gated and timed, a plain arrive on `s` compiles differently and is for a lease to try).
        for (; rel < kt + 1; ++rel)
            if (lane == 0) mbar_arrive(empty + rel % S);
        if (send) {
#pragma unroll
            for (int i = 0; i < ND; ++i) {
                tots[i * L::CT + ct] = __fadd_rn(tots[i * L::CT + ct], acc[i]);
                acc[i] = NEG_ZERO;
            }
            ++seg;
            kend = (seg + 1) * nkt / nseg;
        }
    };
    for (u32 kt = 0; kt < nkt; ++kt) {
        typename F::Tile cur;
        step(kt, cur);
    }
    if (GLU) {
        // Every computing thread's totals are final: the computing warpgroups meet (named
        // barrier 1, their L::CT threads; the copier has left). Total i of thread (warp w, lane 4 g + t) is
        // row 16 w + g + 8 ((i & 3) >> 1), token 8 (i >> 2) + 2 t + (i & 1) of the block; row
        // 16 w + g is feature 8 w + g's gate, row 16 w + 8 + g its up.
        asm volatile("bar.sync 1, %0;\n" ::"n"((int)L::CT) : "memory");
        constexpr u32 NB = MWS_WG;  // 32-feature blocks per block (64 rows per warpgroup)
        for (u32 u = cw; u < NB * MWG_N; u += 4 * MWS_WG) {
            const u32 mm = u / NB, q = u % NB, m = m0 + mm, b = bt.x * NB + q;
            if (m >= M || b >= glu.kp / 32) continue;  // warp-uniform
            const u32 fb = q * 32 + lane, f = bt.x * 32 * NB + fb;
            const u32 src = (fb >> 3) * 32 + (fb & 7) * 4 + ((mm & 7) >> 1);
            const u32 i = (mm >> 3) * 4 + (mm & 1);
            float v = 0.0f;
            if (f < glu.ff) {
                const float g = tots[i * L::CT + src], u = tots[(i + 2) * L::CT + src];
                v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);  // swiglu_prep's
            }
            __syncwarp();
            prep_store(v, lane, glu.xh + (u64)m * glu.kp + b * 32, glu.xs + (u64)m * (glu.kp / 32) + b, glu.bf);
        }
        return;
    }
    const int g = lane >> 2, t = lane & 3;
    const u32 n0 = (rt0 + cw) * 16;
#pragma unroll
    for (int i = 0; i < ND; ++i) {
        const int j = i >> 2, e = i & 3;
        const u32 n = n0 + g + 8 * (e >> 1);
        const u32 m = m0 + j * 8 + 2 * t + (e & 1);
        if (n < N && m < M) out.put(m, n, tots[i * L::CT + ct], R);
    }
#else
    __trap();  // sm_90a, the 128-token build only (the host launches mws only there)
#endif
}

// The warp-specialized product (sm_90a): one block of 3 warpgroups per SM.
#define MWS_KERNEL(suffix, FMT)                                                                            \
    extern "C" __global__ void __launch_bounds__(128 * (MWS_WG + 1), 1) mws_##suffix(                                     \
        const u8* W, const u8* X, const float* Xs, float* Y, float* Y2, float* Y3, u32 n1, u32 n2,            \
        const float* R, u32 M, u32 N, u32 nkt, u32 nseg, u32 kp, const u8* Xi) { pdl_entry();                              \
        const Outs o = outs(Y, Y2, Y3, n1, n2, N);                                                           \
        product_ws<FMT>(W, Xi, o, R, M, N, nkt, nseg);                                                         \
    }

// The same product over a gate/up matrix interleaved by 8, with the SwiGLU epilogue above: v
// prepared for the down product (xh / xs: rows of kp columns; ff features).
#define MWS_GLU_KERNEL(suffix, FMT)                                                                        \
    extern "C" __global__ void __launch_bounds__(128 * (MWS_WG + 1), 1) mws_glu_##suffix(                                 \
        const u8* W, const u8* Xi, u16* Xh, float* Xs, u32 M, u32 N, u32 nkt, u32 nseg, u32 ff, u32 kp,     \
        u32 bf) { pdl_entry();                                                                              \
        const Outs o = outs(nullptr, nullptr, nullptr, N, 0, N);                                            \
        product_ws<FMT, true>(W, Xi, o, nullptr, M, N, nkt, nseg, GluOut{Xh, Xs, ff, kp, bf});              \
    }

// Every build defines them (one kernel list per module); only the 128-token build has a body.
MWS_KERNEL(f16, FmtF16<0>)
MWS_KERNEL(bf16, FmtF16<1>)
MWS_GLU_KERNEL(f16, FmtF16<0>)
MWS_GLU_KERNEL(bf16, FmtF16<1>)
