// The vision tower (Gemma 3's SigLIP ViT and its pooling projector) on the device:
// engine/src/backend/cuda/vision.rs runs one image through these kernels and
// engine/src/vision/siglip.rs is the CPU reference they are checked against (docs/VERIFY.md
// "The CUDA tower"). The products and the attention run on tensor cores (mma.sync m16n8k16:
// activations rounded to f16, f16 weights, f32 accumulation); the rest is f32. Every output
// element is computed in one fixed order that depends only on the shapes, never on the launch
// beyond them or on timing: no atomics, no split reductions, so an image gives the same bits run
// after run. The module compiles with --fmad=false (kernels/src/lib.rs); the rest rounds every
// operation as the CPU does.
//
// vit_patches        the patch rows of the image (im2col of the stride-`patch` convolution).
// vit_gemm_mma       Y = X W^T + b over f32 rows X [M][K] (rounded to f16 as staged) and f16
//                    weights W [N][Kp] (zero-padded rows), with an epilogue: plain, tanh-GELU,
//                    or added onto Y (the residual stream), and the Qwen ViT's below.
// vit_qkv_half       the fused Q/K/V product's rows as f16, per head, for the attention.
// vit_layer_norm     LayerNorm with bias, one warp per row.
// vit_attn_mma_d<D>  full (bidirectional) softmax attention of every patch over every patch,
//                    head dim D (padded to 16), flash-style on tensor cores.
// vit_pool           average of the patch grid in pool x pool windows.
//
// The Qwen ViT (engine/src/backend/cuda/vision_qwen.rs; CPU reference vision/qwenvit.rs) runs
// the products (with the epilogues QuickGELU, erf-GELU and the SiLU gate), LayerNorm, norm.cu's
// `rms_norm` and the full attention above, and:
// qvit_patches             the patch rows of a temporal patch (an image twice, or a video's
//                          frame pair) in the tower's row order.
// qvit_rope                the 2D rotary embedding of Q and K in place, from the host's table.
// qvit_attn_win_mma_d<D>   attention within windows: each block a tile of query rows of one
//                          window, the window's keys (consecutive rows) in order.

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

// An f32 pair as f16x2 (lo in the low half), rounded to nearest even; finite values past the
// f16 range saturate to +-65504, NaN stays NaN (a poisoned input shows in the output).
__device__ __forceinline__ u32 vit_h2(float lo, float hi) {
    lo = fabsf(lo) > 65504.0f ? copysignf(65504.0f, lo) : lo;
    hi = fabsf(hi) > 65504.0f ? copysignf(65504.0f, hi) : hi;
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// The product on tensor cores: Y[m][n] = epilogue(sum_k f16(X[m][k]) W[n][k] (+ B[n])) with the
// epilogues G_PLAIN, G_GELU (tanh), G_ADD (Y + value), G_QUICK_GELU, G_GELU_ERF, G_MUL_SILU
// (Y * silu(value): the gated FFN, Y holding the up product). X: f32 rows [M][K], rounded to
// f16 as they are staged (vit_h2); W: f16 [N][Kp], each row zero-padded from K to Kp (a
// multiple of GM_BK: the host's layout), so its tiles are whole 16-byte copies. Blocks of 8
// warps own 128 x 128 outputs (warp w: rows 64 (w % 2) .., columns 32 (w / 2) ..: 4 x 4 mma
// tiles); K runs in tiles of 32 through double-buffered shared memory (W by cp.async, X through
// registers while the previous tile is multiplied). Each output is ONE chain of
// mma.sync.m16n8k16 (f16 in, f32 accumulate) over k = 0..16, 16..32, ... in order from +0, then
// + B[n] (rounded), then the epilogue: an mma output depends only on its own row of X and
// column of W (docs/KERNELS.md), so its bits depend on its row and column only, not on M, N or
// the grid. Zero padding past K (X zeroed, W's padded columns) adds exact zeros. B may be null.
#define GM_BM 128
#define GM_BN 128
#define GM_BK 32
#define GM_LD (GM_BK + 8)  // u16 per staged row: ldmatrix rows on distinct banks
#define GM_THREADS 256  // two blocks an SM: 128 registers (ptxas 12.8, sm_90a: no spills)

extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) vit_gemm_mma(const float* X, const u16* __restrict__ W,
                                                                      const float* __restrict__ B, float* Y, u32 M,
                                                                      u32 N, u32 K, u32 Kp, u32 mode) {
    pdl_entry();
    __shared__ __align__(16) u16 As[2][GM_BM][GM_LD];
    __shared__ __align__(16) u16 Bs[2][GM_BN][GM_LD];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 wm = warp & 1, wn = warp >> 1;
    const u32 m0 = blockIdx.y * GM_BM, n0 = blockIdx.x * GM_BN;
    // X loader: row ar of the tile, 16 values from column ak.
    const u32 ar = tid >> 1, ak = (tid & 1) * 16;
    const bool a_in = m0 + ar < M;
    const float* xrow = X + (u64)(a_in ? m0 + ar : 0) * K;
    const bool vec = (K & 3u) == 0;
    float ra[16];
    auto fetch_a = [&](u32 tile) {
        const u32 k = tile * GM_BK + ak;
        if (vec) {
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const u32 kk = k + 4 * h;
                float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (a_in && kk < K) f = *reinterpret_cast<const float4*>(xrow + kk);
                ra[4 * h] = f.x;
                ra[4 * h + 1] = f.y;
                ra[4 * h + 2] = f.z;
                ra[4 * h + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) ra[j] = a_in && k + j < K ? xrow[k + j] : 0.0f;
        }
    };
    auto stash_a = [&](u32 buf) {
        uint4* dst = reinterpret_cast<uint4*>(&As[buf][ar][ak]);
        dst[0] = make_uint4(vit_h2(ra[0], ra[1]), vit_h2(ra[2], ra[3]), vit_h2(ra[4], ra[5]), vit_h2(ra[6], ra[7]));
        dst[1] = make_uint4(vit_h2(ra[8], ra[9]), vit_h2(ra[10], ra[11]), vit_h2(ra[12], ra[13]),
                            vit_h2(ra[14], ra[15]));
    };
    // W loader: 128 rows x 4 chunks of 8 values, two chunks a thread; rows past N are zeros.
    auto fetch_b = [&](u32 tile, u32 buf) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 c = tid + GM_THREADS * i;
            const u32 r = c >> 2, ch = (c & 3) * 8;
            const bool in = n0 + r < N;
            const u16* src = W + (in ? (u64)(n0 + r) * Kp + tile * GM_BK + ch : 0);
            cp_async16_zfill(&Bs[buf][r][ch], src, in);
        }
        cp_async_commit();
    };
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    const u32 tiles = Kp / GM_BK;
    fetch_b(0, 0);
    fetch_a(0);
    stash_a(0);
    cp_async_wait<0>();
    __syncthreads();
    // ldmatrix lane addresses: A rows (lane & 15), k (lane >> 4) * 8; B columns (lane & 7) +
    // 8 ((lane >> 4) & 1), k ((lane >> 3) & 1) * 8 (matrices: n-tile j k lo, k hi, j + 1 k lo, k hi).
    const u32 a_row = wm * 64 + (lane & 15), a_col = (lane >> 4) * 8;
    const u32 b_row = wn * 32 + (lane & 7) + 8 * ((lane >> 4) & 1), b_col = ((lane >> 3) & 1) * 8;
    for (u32 tile = 0; tile < tiles; ++tile) {
        const u32 buf = tile & 1;
        const bool more = tile + 1 < tiles;
        // The other buffer was last read before the previous barrier: safe to overwrite.
        if (more) {
            fetch_b(tile + 1, buf ^ 1);
            fetch_a(tile + 1);
        }
#pragma unroll
        for (int ks = 0; ks < GM_BK / 16; ++ks) {
            u32 af[4][4], bf[2][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) ldsm_x4_of<false>(af[i], &As[buf][a_row + 16 * i][a_col + 16 * ks]);
#pragma unroll
            for (int j = 0; j < 2; ++j) ldsm_x4_of<false>(bf[j], &Bs[buf][b_row + 16 * j][b_col + 16 * ks]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_f16_k16(af[i], bf[j >> 1][2 * (j & 1)], bf[j >> 1][2 * (j & 1) + 1], acc[i][j]);
        }
        if (more) stash_a(buf ^ 1);
        cp_async_wait<0>();
        __syncthreads();
    }
    const u32 g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const u32 m = m0 + wm * 64 + 16 * i + g + 8 * e2;
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e1 = 0; e1 < 2; ++e1) {
                    const u32 n = n0 + wn * 32 + 8 * j + 2 * t + e1;
                    if (n >= N) continue;
                    float v = acc[i][j][2 * e2 + e1];
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
    }
}

// Q, K and V of the attention as f16 for the tensor cores: QKV rows [q | k | v] of `heads`
// heads of d (f32, the fused product's output) -> H [3][heads][rows][dp] (dp = d rounded up to
// 16; columns d .. dp zeros), each value rounded to nearest (vit_h2).
extern "C" __global__ void vit_qkv_half(const float* __restrict__ QKV, u32* __restrict__ H, u32 rows, u32 heads,
                                        u32 d, u32 dp) {
    pdl_entry();
    const u32 hp = dp / 2;
    const u64 n = 3ull * heads * rows * hp;
    const u64 wd = (u64)heads * d;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 j = (u32)(e % hp);
        const u64 rest = e / hp;
        const u32 r = (u32)(rest % rows);
        const u32 ph = (u32)(rest / rows);  // part * heads + head
        const u32 part = ph / heads, hd = ph % heads;
        u32 v = 0u;
        if (2 * j < d) {
            const float* x = QKV + (u64)r * 3 * wd + part * wd + (u64)hd * d + 2 * j;
            v = vit_h2(x[0], x[1]);
        }
        H[e] = v;
    }
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

// Attention on tensor cores (mma.sync m16n8k16, f16 in, f32 accumulate), flash-attention style,
// over the f16 Q / K / V of vit_qkv_half (H [3][heads][rows][DP], DP = D rounded up to 16, the
// padding zeros). A block of VA_WARPS warps takes VA_Q = 128 query rows q0 .. q1 of one head
// (blockIdx.y); warp w its 16 rows q0 + 16 w ... The rows attend to the keys k0 .. k1 (every
// row: the whole image; a window: its rows), walked in tiles of KT keys from k0 in order,
// staged in shared memory by cp.async (the next tile's copy in flight while this one is
// computed; keys at or past k1 zeros). Per tile and row, in this order:
//   1. s = (q . k) * (scale log2 e): DP / 16 k-steps chained from +0; keys past k1 -> -inf;
//   2. m' = max(m, the tile's s) (the lane's values, then the quad xor 1, 2: exact in any order);
//   3. c = 2^(m - m') (0 at the first tile), p = f16(2^(s - m')) (ex2.approx: the GPU's own),
//      l = l c + (the p as f32 summed: the lane's n-tiles in order, then the quad xor 1, 2),
//      o = o c, then o += P V (one mma chain over the tile's KT / 16 k-steps, on o);
// finally out = o / l. An mma output row depends on its own A row only (docs/KERNELS.md), so
// a row's bits depend on its q, its head and its key range: not on the other rows of the
// block, the grid, or how many rows the launch has.
// Two blocks an SM (__launch_bounds__(VA_THREADS, 2): 128 registers; ptxas 12.8 for sm_90a:
// no spills at D = 8 .. 64 and 96; 12 to 16 bytes in vit_attn_mma_d72 / _d80 / _d128).
#define VA_WARPS 8
#define VA_Q (16 * VA_WARPS)
#define VA_THREADS (32 * VA_WARPS)
#define VA_LOG2E 1.4426950408889634f

__device__ __forceinline__ float vit_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int D>
struct VaDims {
    static constexpr int DP = (D + 15) / 16 * 16;  // the padded head dim
    static constexpr int KT = DP <= 80 ? 64 : 32;  // keys per tile
    static constexpr int LD = DP + 8;              // u16 per staged row: ldmatrix on distinct banks
};

// Rows q0 .. q1 of head blockIdx.y over keys k0 .. k1 (k1 > k0) into O [rows][heads D] (f32).
template <int D>
__device__ __forceinline__ void vit_attn_mma_span(const u16* __restrict__ H, float* __restrict__ O, u32 rows,
                                                  u32 heads, u32 q0, u32 q1, u32 k0, u32 k1, float scale) {
    constexpr int DP = VaDims<D>::DP, KT = VaDims<D>::KT, LD = VaDims<D>::LD;
    constexpr int NS = KT / 8;   // score n-tiles (keys)
    constexpr int NO = DP / 8;   // output n-tiles (dims)
    constexpr int KS = DP / 16;  // k-steps of q . k
    constexpr int CH = DP / 8;   // 16-byte chunks per staged row
    __shared__ __align__(16) u16 Ks[2][KT][LD];
    __shared__ __align__(16) u16 Vs[2][KT][LD];
    const u32 hd = blockIdx.y;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3;
    const u16* Qh = H + ((u64)hd * rows) * DP;
    const u16* Kh = H + ((u64)(heads + hd) * rows) * DP;
    const u16* Vh = H + ((u64)(2 * heads + hd) * rows) * DP;
    auto stage = [&](u32 kb, u32 buf) {
        for (u32 c = tid; c < (u32)(KT * CH); c += VA_THREADS) {
            const u32 r = c / CH, ch = (c % CH) * 8;
            const bool in = kb + r < k1;
            const u64 off = in ? (u64)(kb + r) * DP + ch : 0;
            cp_async16_zfill(&Ks[buf][r][ch], Kh + off, in);
            cp_async16_zfill(&Vs[buf][r][ch], Vh + off, in);
        }
        cp_async_commit();
    };
    stage(k0, 0);
    // The warp's Q as A fragments (rows past q1: zeros).
    const u32 r0 = q0 + 16 * warp + g, r1 = r0 + 8;
    u32 qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        const u32 c = 16 * ks + 2 * t;
        qa[ks][0] = r0 < q1 ? *reinterpret_cast<const u32*>(Qh + (u64)r0 * DP + c) : 0u;
        qa[ks][1] = r1 < q1 ? *reinterpret_cast<const u32*>(Qh + (u64)r1 * DP + c) : 0u;
        qa[ks][2] = r0 < q1 ? *reinterpret_cast<const u32*>(Qh + (u64)r0 * DP + c + 8) : 0u;
        qa[ks][3] = r1 < q1 ? *reinterpret_cast<const u32*>(Qh + (u64)r1 * DP + c + 8) : 0u;
    }
    const float sl = __fmul_rn(scale, VA_LOG2E);
    const float NEG_INF = -__int_as_float(0x7f800000);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    // ldmatrix lane addresses: K as the B operand of S (n-tile pair: key (lane & 7) + 8 ((lane >>
    // 4) & 1), dims ((lane >> 3) & 1) * 8); V transposed for P V (key (lane & 7) + 8 ((lane >> 3)
    // & 1), dims 8 (lane >> 4)).
    const u32 kr = (lane & 7) + 8 * ((lane >> 4) & 1), kc = ((lane >> 3) & 1) * 8;
    const u32 vr = (lane & 7) + 8 * ((lane >> 3) & 1), vc = 8 * (lane >> 4);
    u32 buf = 0;
    for (u32 kb = k0; kb < k1; kb += KT, buf ^= 1) {
        const bool more = kb + KT < k1;
        cp_async_wait<0>();
        __syncthreads();  // this tile landed; the other buffer is no longer read
        if (more) stage(kb + KT, buf ^ 1);
        // 1. scores
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
            for (int j = 0; j < NS; j += 2) {
                u32 b[4];
                ldsm_x4_of<false>(b, &Ks[buf][8 * j + kr][16 * ks + kc]);
                mma_f16_k16(qa[ks], b[0], b[1], s[j]);
                mma_f16_k16(qa[ks], b[2], b[3], s[j + 1]);
            }
        }
        // 2. the rows' maxima
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 key = kb + 8 * j + 2 * t + (e & 1);
                s[j][e] = key < k1 ? __fmul_rn(s[j][e], sl) : NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2));
        }
        // 3. p (as the P V A fragments), l, o
        float c[2], lt[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            c[h] = vit_ex2(__fsub_rn(m[h], mx[h]));
            m[h] = mx[h];
        }
        u32 pa[KT / 16][4];
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 pr = vit_h2(vit_ex2(__fsub_rn(s[j][2 * h], m[h])), vit_ex2(__fsub_rn(s[j][2 * h + 1], m[h])));
                pa[j >> 1][(j & 1) * 2 + h] = pr;
                lt[h] = __fadd_rn(__fadd_rn(lt[h], f16_to_f32((u16)(pr & 0xffffu))), f16_to_f32((u16)(pr >> 16)));
            }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lt[h] = __fadd_rn(lt[h], __shfl_xor_sync(FULL_MASK, lt[h], 1));
            lt[h] = __fadd_rn(lt[h], __shfl_xor_sync(FULL_MASK, lt[h], 2));
            l[h] = __fmaf_rn(l[h], c[h], lt[h]);
        }
#pragma unroll
        for (int j = 0; j < NO; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[j][e] = __fmul_rn(o[j][e], c[e >> 1]);
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) {
#pragma unroll
            for (int j = 0; j < NO; j += 2) {
                u32 b[4];
                ldsm_x4_of<true>(b, &Vs[buf][16 * kk + vr][8 * j + vc]);
                mma_f16_k16(pa[kk], b[0], b[1], o[j]);
                mma_f16_k16(pa[kk], b[2], b[3], o[j + 1]);
            }
        }
    }
    const u64 wd = (u64)heads * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 r = h ? r1 : r0;
        if (r >= q1) continue;
        float* out = O + (u64)r * wd + (u64)hd * D;
#pragma unroll
        for (int j = 0; j < NO; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int dd = 8 * j + 2 * t + e;
                if (dd < D) out[dd] = __fdiv_rn(o[j][2 * h + e], l[h]);
            }
    }
}

// Every row attends to all n rows: block x takes rows 128 x .. (at most n).
#define VIT_ATTN_MMA(D)                                                                                        \
    extern "C" __global__ void __launch_bounds__(VA_THREADS, 2)                                                \
        vit_attn_mma_d##D(const u16* H, float* O, u32 n, u32 heads, float scale) {                             \
        pdl_entry();                                                                                           \
        const u32 q0 = blockIdx.x * VA_Q;                                                                      \
        vit_attn_mma_span<D>(H, O, n, heads, q0, min(n, q0 + VA_Q), 0, n, scale);                              \
    }
VIT_ATTN_MMA(8)
VIT_ATTN_MMA(16)
VIT_ATTN_MMA(32)
VIT_ATTN_MMA(64)
VIT_ATTN_MMA(72)
VIT_ATTN_MMA(80)
VIT_ATTN_MMA(96)
VIT_ATTN_MMA(128)

// Window attention: block (x, y) takes tile x of `tiles` (u32 q0, q1, k0, k1: query rows q0 ..
// q1, at most VA_Q of them, attend to the rows k0 .. k1 of their window) and head y; H holds
// `rows` rows.
#define QVIT_ATTN_WIN_MMA(D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(VA_THREADS, 2) qvit_attn_win_mma_d##D(                       \
        const u16* H, float* O, const u32* tiles, u32 rows, u32 heads, float scale) {                          \
        pdl_entry();                                                                                           \
        const u32* tl = tiles + 4 * (u64)blockIdx.x;                                                          \
        vit_attn_mma_span<D>(H, O, rows, heads, tl[0], tl[1], tl[2], tl[3], scale);                            \
    }
QVIT_ATTN_WIN_MMA(8)
QVIT_ATTN_WIN_MMA(16)
QVIT_ATTN_WIN_MMA(32)
QVIT_ATTN_WIN_MMA(64)
QVIT_ATTN_WIN_MMA(72)
QVIT_ATTN_WIN_MMA(80)
QVIT_ATTN_WIN_MMA(96)
QVIT_ATTN_WIN_MMA(128)

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
