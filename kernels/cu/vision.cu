// The vision tower (Gemma 3's SigLIP ViT and its pooling projector) on the device, f32
// throughout: engine/src/backend/cuda/vision.rs runs one image through these kernels and
// engine/src/vision/siglip.rs is the CPU reference they are checked against (docs/VERIFY.md
// "The CUDA tower"). Every output element is computed by one thread in one fixed order that
// depends only on the shapes, never on the launch beyond them or on timing: no atomics, no
// split reductions, so an image gives the same bits run after run. The module compiles with
// --fmad=false (kernels/src/lib.rs); the products and the attention write their fused
// multiply-adds explicitly (__fmaf_rn), the rest rounds every operation as the CPU does.
//
// vit_patches     the patch rows of the image (im2col of the stride-`patch` convolution).
// vit_gemm_<w>    Y = X W^T + b over f32 rows X [M][K] and weights W [N][K] (f32 or f16: the
//                 mmproj's own values, widened exactly), with an epilogue: plain, tanh-GELU, or
//                 added onto Y (the residual stream).
// vit_layer_norm  LayerNorm with bias, one warp per row.
// vit_attn_d<D>   full (bidirectional) softmax attention of every patch over every patch, head
//                 dim D, flash-style: a thread per query row, K/V tiles in shared memory, the
//                 online softmax in key order.
// vit_pool        average of the patch grid in pool x pool windows.
//
// The Qwen ViT (engine/src/backend/cuda/vision_qwen.rs; CPU reference vision/qwenvit.rs) runs
// the products (with the epilogues QuickGELU, erf-GELU and the SiLU gate), LayerNorm, norm.cu's
// `rms_norm` and the full attention above, and:
// qvit_patches        the patch rows of a temporal patch (an image twice, or a video's frame pair)
//                     in the tower's row order.
// qvit_rope           the 2D rotary embedding of Q and K in place, from the host's table.
// qvit_attn_win_d<D>  attention within windows: each block a tile of query rows of one window,
//                     the window's keys (consecutive rows) in order.

#define G_BM 128
#define G_BN 128
#define G_BK 16
#define G_PAD 4
#define G_THREADS 256

// Epilogue of vit_gemm (the `mode` argument).
#define G_PLAIN 0u
#define G_GELU 1u
#define G_ADD 2u
#define G_QUICK_GELU 3u
#define G_GELU_ERF 4u
#define G_MUL_SILU 5u

// The CPU's gelu_tanh (siglip.rs): 0.5 x (1 + tanh(C (x + 0.044715 x^3))), C = sqrt(2 / pi)
// as its f32 constant, in its operation order; tanhf is the GPU's own.
__device__ __forceinline__ float vit_gelu(float x) {
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    const float t = tanhf(__fmul_rn(0.7978846f, __fadd_rn(x, cube)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
}

// The CPU's quick_gelu (qwenvit.rs): x / (1 + exp(-1.702 x)); expf is the GPU's own.
__device__ __forceinline__ float vit_quick_gelu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(-1.702f, x))));
}

// The CPU's silu (qwenvit.rs): x / (1 + exp(-x)).
__device__ __forceinline__ float vit_silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// The CPU's gelu_erf (qwenvit.rs) in double, in its operation order: 0.5 x (1 + erf(x / sqrt 2))
// with erf from the Chebyshev fit of erfc (Numerical Recipes' erfcc); exp is the GPU's own.
__device__ __forceinline__ float vit_gelu_erf(float xf) {
    const double x = (double)xf;
    const double u = __dmul_rn(x, 0.7071067811865476);
    const double z = fabs(u);
    const double t = __ddiv_rn(1.0, __dadd_rn(1.0, __dmul_rn(0.5, z)));
    double poly = 0.170872770;
    poly = __dadd_rn(__dmul_rn(poly, t), -0.822152230);
    poly = __dadd_rn(__dmul_rn(poly, t), 1.488515870);
    poly = __dadd_rn(__dmul_rn(poly, t), -1.135203980);
    poly = __dadd_rn(__dmul_rn(poly, t), 0.278868070);
    poly = __dadd_rn(__dmul_rn(poly, t), -0.186288060);
    poly = __dadd_rn(__dmul_rn(poly, t), 0.096784180);
    poly = __dadd_rn(__dmul_rn(poly, t), 0.374091960);
    poly = __dadd_rn(__dmul_rn(poly, t), 1.000023680);
    poly = __dadd_rn(__dmul_rn(poly, t), -1.265512230);
    const double erfc = __dmul_rn(t, exp(__dadd_rn(__dmul_rn(-z, z), poly)));
    const double e = u >= 0.0 ? __dsub_rn(1.0, erfc) : __dsub_rn(erfc, 1.0);
    return (float)__dmul_rn(__dmul_rn(0.5, x), __dadd_rn(1.0, e));
}

// The patch rows: row i (patch (i / g, i % g) of the g x g grid) holds the patch's values in
// (channel, y, x) order, the convolution weights' order. px is [3][size][size].
extern "C" __global__ void vit_patches(const float* __restrict__ px, float* __restrict__ cols, u32 size, u32 patch) {
    pdl_entry();
    const u32 g = size / patch;
    const u32 per = 3 * patch * patch;
    const u64 n = (u64)g * g * per;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 i = (u32)(e / per), j = (u32)(e % per);
        const u32 c = j / (patch * patch), y = (j / patch) % patch, x = j % patch;
        const u32 py = i / g, pxx = i % g;
        cols[e] = px[((u64)c * size + py * patch + y) * size + pxx * patch + x];
    }
}

// One weight value as f32 (exact for both types).
__device__ __forceinline__ float w_val(const float* w, u64 i) { return w[i]; }
__device__ __forceinline__ float w_val(const u16* w, u64 i) { return f16_to_f32(w[i]); }

// Eight values row[k .. k + 8) of a row of K values, zero past K. `vec`: K is a multiple of 4,
// so 4-value groups are aligned and either wholly inside the row or wholly past it.
__device__ __forceinline__ void load8(const float* row, u32 k, u32 K, bool vec, float* v) {
    if (vec) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 kk = k + 4 * h;
            float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kk < K) f = *reinterpret_cast<const float4*>(row + kk);
            v[4 * h] = f.x;
            v[4 * h + 1] = f.y;
            v[4 * h + 2] = f.z;
            v[4 * h + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = k + j < K ? row[k + j] : 0.0f;
    }
}

__device__ __forceinline__ void load8(const u16* row, u32 k, u32 K, bool vec, float* v) {
    if (vec) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 kk = k + 4 * h;
            uint2 b = make_uint2(0u, 0u);
            if (kk < K) b = *reinterpret_cast<const uint2*>(row + kk);
            v[4 * h] = f16_to_f32((u16)(b.x & 0xffffu));
            v[4 * h + 1] = f16_to_f32((u16)(b.x >> 16));
            v[4 * h + 2] = f16_to_f32((u16)(b.y & 0xffffu));
            v[4 * h + 3] = f16_to_f32((u16)(b.y >> 16));
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = k + j < K ? f16_to_f32(row[k + j]) : 0.0f;
    }
}

// Y[m][n] = epilogue(sum_k X[m][k] W[n][k] (+ B[n])); the epilogues G_PLAIN, G_GELU (tanh),
// G_ADD (Y + value), G_QUICK_GELU, G_GELU_ERF, G_MUL_SILU (Y * silu(value): the gated FFN, Y
// holding the up product). Blocks of 256 threads own 128 x 128
// outputs; each thread 8 x 8 of them (rows ty*4 + {0..3} and 64 + ty*4 + {0..3}, columns
// likewise with tx). K runs in tiles of 16 through double-buffered shared memory (the next tile
// is loaded into registers while the current one is multiplied). Each output is one chain of
// __fmaf_rn over k = 0, 1, ..., K - 1 (zero padding past K adds exact zeros), then + B[n], then
// the epilogue: its bits depend on its own row and column only, not on M, N or the grid.
// B may be null (no bias).
template <typename WT>
__device__ __forceinline__ void vit_gemm_body(const float* __restrict__ X, const WT* __restrict__ W,
                                              const float* __restrict__ B, float* Y, u32 M, u32 N, u32 K,
                                              u32 mode) {
    __shared__ __align__(16) float As[2][G_BK][G_BM + G_PAD];
    __shared__ __align__(16) float Bs[2][G_BK][G_BN + G_PAD];
    const u32 t = threadIdx.x;
    const u32 tx = t % 16, ty = t / 16;
    const u32 m0 = blockIdx.y * G_BM, n0 = blockIdx.x * G_BN;
    // The loader: row lr of the tile, k offset lk (0 or 8) within it.
    const u32 lr = t / 2, lk = (t % 2) * 8;
    const bool vec = K % 4 == 0;
    const bool a_in = m0 + lr < M, b_in = n0 + lr < N;
    const float* xrow = X + (u64)(a_in ? m0 + lr : 0) * K;
    const WT* wrow = W + (u64)(b_in ? n0 + lr : 0) * K;
    float ra[8], rb[8];
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    const u32 tiles = (K + G_BK - 1) / G_BK;
    auto fetch = [&](u32 tile) {
        const u32 k = tile * G_BK + lk;
        if (a_in) load8(xrow, k, K, vec, ra);
        else {
#pragma unroll
            for (int j = 0; j < 8; ++j) ra[j] = 0.0f;
        }
        if (b_in) load8(wrow, k, K, vec, rb);
        else {
#pragma unroll
            for (int j = 0; j < 8; ++j) rb[j] = 0.0f;
        }
    };
    auto stash = [&](u32 buf) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            As[buf][lk + j][lr] = ra[j];
            Bs[buf][lk + j][lr] = rb[j];
        }
    };
    if (tiles > 0) {
        fetch(0);
        stash(0);
    }
    __syncthreads();
    for (u32 tile = 0; tile < tiles; ++tile) {
        const u32 buf = tile % 2;
        if (tile + 1 < tiles) fetch(tile + 1);
#pragma unroll
        for (int kk = 0; kk < G_BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
        }
        // The other buffer was last read before the previous barrier: safe to overwrite.
        if (tile + 1 < tiles) stash(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const u32 n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (n >= N) continue;
            float v = acc[i][j];
            if (B) v = __fadd_rn(v, B[n]);
            const u64 o = (u64)m * N + n;
            if (mode == G_GELU) v = vit_gelu(v);
            else if (mode == G_ADD) v = __fadd_rn(Y[o], v);
            else if (mode == G_QUICK_GELU) v = vit_quick_gelu(v);
            else if (mode == G_GELU_ERF) v = vit_gelu_erf(v);
            else if (mode == G_MUL_SILU) v = __fmul_rn(Y[o], vit_silu(v));
            Y[o] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(G_THREADS) vit_gemm_f32(const float* X, const float* W, const float* B,
                                                                     float* Y, u32 M, u32 N, u32 K, u32 mode) {
    pdl_entry();
    vit_gemm_body<float>(X, W, B, Y, M, N, K, mode);
}

extern "C" __global__ void __launch_bounds__(G_THREADS) vit_gemm_f16(const float* X, const u16* W, const float* B,
                                                                     float* Y, u32 M, u32 N, u32 K, u32 mode) {
    pdl_entry();
    vit_gemm_body<u16>(X, W, B, Y, M, N, K, mode);
}

// The sum of one value per lane over the warp: the fixed xor tree (every lane gets it).
__device__ __forceinline__ float vit_warp_sum(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, o));
    return s;
}

// LayerNorm of `rows` rows of `width`, one warp per row: mean = sum / width, var = sum((v -
// mean)^2) / width (two passes, lane sums over columns lane, lane + 32, ... in order, then the
// xor tree), y = ((v - mean) * (1 / sqrt(var + eps))) * w + b, the CPU's formula. Y may be X.
extern "C" __global__ void __launch_bounds__(256) vit_layer_norm(const float* X, const float* __restrict__ Wt,
                                                                 const float* __restrict__ Bs, float* Y, u32 rows,
                                                                 u32 width, float eps) {
    pdl_entry();
    const u32 r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;  // uniform over the warp
    const u32 lane = threadIdx.x & 31;
    const float* x = X + (u64)r * width;
    float* y = Y + (u64)r * width;
    float s = 0.0f;
    for (u32 c = lane; c < width; c += 32) s = __fadd_rn(s, x[c]);
    const float mean = __fdiv_rn(vit_warp_sum(s), (float)width);
    float q = 0.0f;
    for (u32 c = lane; c < width; c += 32) {
        const float d = __fsub_rn(x[c], mean);
        q = __fadd_rn(q, __fmul_rn(d, d));
    }
    const float var = __fdiv_rn(vit_warp_sum(q), (float)width);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    __syncwarp();  // every read of the row before the first write (Y may be X)
    for (u32 c = lane; c < width; c += 32) {
        y[c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[c], mean), inv), Wt[c]), Bs[c]);
    }
}

// Attention: a block of ATT_Q threads per (ATT_Q query rows, head), one thread per query row.
// QKV rows are [q | k | v], each heads * D wide (the fused Q/K/V product's output); O rows are
// heads * D. The keys are walked in tiles of KT through shared memory, each tile in sub-chunks
// of ATT_SUB keys: scores s = dot(q, k) * scale (the dot a chain of __fmaf_rn over d in order),
// the running max m' = max(m, scores), the running sum and output rescaled by exp(m - m'), then
// each key in order: p = exp(s - m'), l += p, o[d] += p v[d]. Finally o[d] / l. Every step is
// the same for every row whatever the launch: the bits depend on the row, its head and the K/V.
#define ATT_Q 128
#define ATT_SUB 16

// One block's query rows: row i (live: a row of the launch; a dead thread still helps load the
// tiles) attends to the rows k0 .. k1 (k1 > k0) in order.
template <int D>
__device__ __forceinline__ void vit_attn_span(const float* __restrict__ QKV, float* __restrict__ O, u32 i,
                                              bool live, u32 k0, u32 k1, u32 heads, float scale) {
    constexpr int KT = D <= 72 ? 64 : 32;
    __shared__ __align__(16) float Ks[KT][D];
    __shared__ __align__(16) float Vs[KT][D];
    const u32 h = blockIdx.y;
    const u32 wd = heads * D;
    const u64 stride = 3ull * wd;
    float q[D], o[D];
    {
        const float* qr = QKV + (u64)(live ? i : 0) * stride + (u64)h * D;
#pragma unroll
        for (int d = 0; d < D; d += 4) {
            const float4 v = *reinterpret_cast<const float4*>(qr + d);
            q[d] = v.x;
            q[d + 1] = v.y;
            q[d + 2] = v.z;
            q[d + 3] = v.w;
        }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) o[d] = 0.0f;
    const float NEG_INF = -__int_as_float(0x7f800000);
    float m = NEG_INF, l = 0.0f;
    for (u32 j0 = k0; j0 < k1; j0 += KT) {
        const u32 cnt = min((u32)KT, k1 - j0);
        __syncthreads();  // the previous tile is no longer read
        for (u32 e = threadIdx.x; e < (u32)(KT * D / 4); e += ATT_Q) {
            const u32 r = e / (D / 4), c = (e % (D / 4)) * 4;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (r < cnt) {
                const float* src = QKV + (u64)(j0 + r) * stride + (u64)h * D + c;
                kv = *reinterpret_cast<const float4*>(src + wd);
                vv = *reinterpret_cast<const float4*>(src + 2 * (u64)wd);
            }
            *reinterpret_cast<float4*>(&Ks[r][c]) = kv;
            *reinterpret_cast<float4*>(&Vs[r][c]) = vv;
        }
        __syncthreads();
        // jj is a multiple of ATT_SUB below KT (a multiple of it): rows jj + u stay in the tile;
        // those at or past cnt are zeros and take no part.
        for (u32 jj = 0; jj < cnt; jj += ATT_SUB) {
            float s[ATT_SUB];
#pragma unroll
            for (int u = 0; u < ATT_SUB; ++u) s[u] = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d += 4) {
#pragma unroll
                for (int u = 0; u < ATT_SUB; ++u) {
                    const float4 k = *reinterpret_cast<const float4*>(&Ks[jj + u][d]);
                    s[u] = __fmaf_rn(q[d], k.x, s[u]);
                    s[u] = __fmaf_rn(q[d + 1], k.y, s[u]);
                    s[u] = __fmaf_rn(q[d + 2], k.z, s[u]);
                    s[u] = __fmaf_rn(q[d + 3], k.w, s[u]);
                }
            }
            float mx = m;
#pragma unroll
            for (int u = 0; u < ATT_SUB; ++u) {
                s[u] = __fmul_rn(s[u], scale);
                if (jj + u < cnt) mx = fmaxf(mx, s[u]);
            }
            const float corr = expf(__fsub_rn(m, mx));  // m = -inf at the first keys: 0
            l = __fmul_rn(l, corr);
#pragma unroll
            for (int d = 0; d < D; ++d) o[d] = __fmul_rn(o[d], corr);
#pragma unroll
            for (int u = 0; u < ATT_SUB; ++u) {
                if (jj + u < cnt) {
                    const float p = expf(__fsub_rn(s[u], mx));
                    l = __fadd_rn(l, p);
#pragma unroll
                    for (int d = 0; d < D; d += 4) {
                        const float4 v = *reinterpret_cast<const float4*>(&Vs[jj + u][d]);
                        o[d] = __fmaf_rn(p, v.x, o[d]);
                        o[d + 1] = __fmaf_rn(p, v.y, o[d + 1]);
                        o[d + 2] = __fmaf_rn(p, v.z, o[d + 2]);
                        o[d + 3] = __fmaf_rn(p, v.w, o[d + 3]);
                    }
                }
            }
            m = mx;
        }
    }
    if (!live) return;
    float* out = O + (u64)i * wd + (u64)h * D;
#pragma unroll
    for (int d = 0; d < D; ++d) out[d] = __fdiv_rn(o[d], l);
}

template <int D>
__device__ __forceinline__ void vit_attn_body(const float* __restrict__ QKV, float* __restrict__ O, u32 n,
                                              u32 heads, float scale) {
    const u32 i = blockIdx.x * ATT_Q + threadIdx.x;
    vit_attn_span<D>(QKV, O, i, i < n, 0, n, heads, scale);
}

// Window attention: block (x, y) takes tile x of `tiles` (u32 q0, q1, k0, k1: query rows q0 ..
// q1, at most ATT_Q of them, attend to the rows k0 .. k1 of their window) and head y.
template <int D>
__device__ __forceinline__ void qvit_attn_win_body(const float* __restrict__ QKV, float* __restrict__ O,
                                                   const u32* __restrict__ tiles, u32 heads, float scale) {
    const u32* t = tiles + 4 * (u64)blockIdx.x;
    const u32 q0 = t[0], q1 = t[1], k0 = t[2], k1 = t[3];
    const u32 i = q0 + threadIdx.x;
    vit_attn_span<D>(QKV, O, i, i < q1, k0, k1, heads, scale);
}

#define VIT_ATTN(D)                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATT_Q) vit_attn_d##D(const float* QKV, float* O, u32 n,      \
                                                                       u32 heads, float scale) {              \
        pdl_entry();                                                                                           \
        vit_attn_body<D>(QKV, O, n, heads, scale);                                                             \
    }
VIT_ATTN(8)
VIT_ATTN(16)
VIT_ATTN(32)
VIT_ATTN(64)
VIT_ATTN(72)
VIT_ATTN(80)
VIT_ATTN(96)
VIT_ATTN(128)

#define QVIT_ATTN_WIN(D)                                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_Q) qvit_attn_win_d##D(const float* QKV, float* O,         \
                                                                           const u32* tiles, u32 heads,       \
                                                                           float scale) {                     \
        pdl_entry();                                                                                           \
        qvit_attn_win_body<D>(QKV, O, tiles, heads, scale);                                                    \
    }
QVIT_ATTN_WIN(8)
QVIT_ATTN_WIN(16)
QVIT_ATTN_WIN(32)
QVIT_ATTN_WIN(64)
QVIT_ATTN_WIN(72)
QVIT_ATTN_WIN(80)
QVIT_ATTN_WIN(96)
QVIT_ATTN_WIN(128)

// The average of the g x g rows of X in pool x pool windows: token t (window (t / side, t %
// side), side = g / pool) column c = (sum over the window's rows in row-major order, from 0) *
// inv, inv = 1 / pool^2 as the host computed it: the CPU's order, bit for bit.
extern "C" __global__ void vit_pool(const float* __restrict__ X, float* __restrict__ Y, u32 g, u32 pool, u32 width,
                                    float inv) {
    pdl_entry();
    const u32 side = g / pool;
    const u64 n = (u64)side * side * width;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 t = (u32)(e / width), c = (u32)(e % width);
        const u32 ty = t / side, tx = t % side;
        float a = 0.0f;
        for (u32 y = 0; y < pool; ++y)
            for (u32 x = 0; x < pool; ++x) a = __fadd_rn(a, X[((u64)(ty * pool + y) * g + tx * pool + x) * width + c]);
        Y[e] = __fmul_rn(a, inv);
    }
}

// The Qwen ViT's patch rows: row r is the patch at (pos[r] >> 16, pos[r] & 0xffff) (row, column
// of the patch grid) of the temporal patch (px0, px1) (two frames, [3][h][w] each; an image is
// passed as both), its 2 x 3 x patch x patch values in (frame, channel, y, x) order, frame 0
// from px0 and frame 1 from px1 (the CPU's patch_cols): bit for bit.
extern "C" __global__ void qvit_patches(const float* __restrict__ px0, const float* __restrict__ px1,
                                        const u32* __restrict__ pos, float* __restrict__ cols, u32 rows,
                                        u32 w, u32 h, u32 patch) {
    pdl_entry();
    const u32 per = 3 * patch * patch;
    const u64 n = (u64)rows * 2 * per;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(e / (2 * per)), k = (u32)(e % (2 * per)), j = k % per;
        const u32 c = j / (patch * patch), y = (j / patch) % patch, x = j % patch;
        const u32 py = pos[r] >> 16, pxx = pos[r] & 0xffffu;
        const float* px = k < per ? px0 : px1;
        cols[e] = px[((u64)c * h + py * patch + y) * w + pxx * patch + x];
    }
}

// The 2D rotary embedding of Q and K in place: QKV rows [q | k | v] of `heads` heads of d; each
// head's pairs (j, j + d/2) turn by the row's table entry j (cos, sin: table [rows][d/2][2]):
// x1' = x1 c - x2 s, x2' = x2 c + x1 s, each product rounded (the CPU's rope): bit for bit.
extern "C" __global__ void qvit_rope(float* QKV, const float* __restrict__ table, u32 rows, u32 heads, u32 d) {
    pdl_entry();
    const u32 half = d / 2;
    const u64 wd = (u64)heads * d;
    const u64 n = (u64)rows * 2 * heads * half;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 j = (u32)(e % half);
        const u64 rest = e / half;
        const u32 hd = (u32)(rest % heads);
        const u32 part = (u32)((rest / heads) % 2);  // 0: q, 1: k
        const u32 r = (u32)(rest / (2ull * heads));
        float* x = QKV + (u64)r * 3 * wd + part * wd + (u64)hd * d;
        const float c = table[((u64)r * half + j) * 2], s = table[((u64)r * half + j) * 2 + 1];
        const float u = x[j], v = x[j + half];
        x[j] = __fsub_rn(__fmul_rn(u, c), __fmul_rn(v, s));
        x[j + half] = __fadd_rn(__fmul_rn(v, c), __fmul_rn(u, s));
    }
}
