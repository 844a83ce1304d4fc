// Y[m][n] = sum_k W[n][k] * X[m][k] over weights in their GGUF block layout.
//
// Row invariance and the CPU's bits: each output element is the CPU's dot_f32 of the
// dequantized weight row and the input row (matmul_f32_rows below: F32 in the GPU's own order). A half-warp (16 lanes) owns one output feature n
// for a tile of up to 8 token rows; lane l accumulates elements l, l + 16, l + 32, ... in order
// into one f32 accumulator per token (product rounded, then added: --fmad=false), then the
// fixed tree +8, +4, +2, +1 (tree16), then lane 0 adds the K % 16 tail in order. No step depends
// on M, the tile a row lands in, or the other rows. A warp holds features 2w and 2w + 1; blocks
// of 256 threads (8 warps, 16 features); grid.y walks tiles of 8 rows.

template <int DT>
__device__ __forceinline__ void matmul_body(const u8* __restrict__ W, const float* __restrict__ X,
                                            float* __restrict__ Y, u32 M, u32 N, u32 K, u64 row_bytes,
                                            u32 mstart, u32 mstride) {
    typedef Blk<DT> B;
    const int lane = threadIdx.x & 31;
    const int l = lane & 15;
    const u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 n0 = warp * 2;
    if (n0 >= N) return;  // uniform over the warp
    const u32 n = n0 + (u32)(lane >> 4);
    const bool valid = n < N;
    const u8* row = W + (u64)(valid ? n : n0) * row_bytes;
    const u32 nb = K / B::BS;
    const u32 kfull = nb * B::BS;
    for (u32 m0 = mstart; m0 < M; m0 += mstride) {
        const u32 mt = min(8u, M - m0);
        const float* x0 = X + (u64)m0 * K;
        float acc[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) acc[t] = 0.0f;
        for (u32 b = 0; b < nb; ++b) {
            float v[B::VPL];
            B::lane(row + (u64)b * B::BB, l, v);
#pragma unroll
            for (int i = 0; i < B::VPL; ++i) {
                const u32 e = b * B::BS + i * 16 + l;
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    if ((u32)t < mt) acc[t] = acc[t] + v[i] * x0[(u64)t * K + e];
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            float s = tree16(acc[t]);
            if (l == 0 && valid && (u32)t < mt) {
                if (B::FLOAT) {
                    for (u32 e = kfull; e < K; ++e) s = s + B::elem(row, e) * x0[(u64)t * K + e];
                }
                Y[(u64)(m0 + t) * N + n] = s;
            }
        }
    }
}

// The F32 row products: f32rows.cuh (prepended with the module's headers).

#define MATMUL_KERNEL(suffix, DT)                                                               \
    extern "C" __global__ void __launch_bounds__(256) matmul_##suffix(                          \
        const u8* W, const float* X, float* Y, u32 M, u32 N, u32 K, u64 row_bytes) { pdl_entry();            \
        matmul_body<DT>(W, X, Y, M, N, K, row_bytes, blockIdx.y * 8, gridDim.y * 8);            \
    }

// F32 weights (Gpu::matmul, every F32 product; f32rows.cuh): matmul_f32_rows, grid (N, token
// tiles) of 256 threads, where the step has few rows; matmul_f32_tiles, grid (feature tiles,
// token tiles), where its tiles fill the device. The same bits.
extern "C" __global__ void __launch_bounds__(256) matmul_f32_rows(const u8* W, const float* X, float* Y, u32 M,
                                                                  u32 N, u32 K, u64 row_bytes) {
    pdl_entry();
    matmul_f32_rows_body(W, X, Y, M, N, K, row_bytes);
}

extern "C" __global__ void __launch_bounds__(256) matmul_f32_tiles(const u8* W, const float* X, float* Y, u32 M,
                                                                   u32 N, u32 K, u64 row_bytes) {
    pdl_entry();
    matmul_f32_tiles_body(W, X, Y, M, N, K, row_bytes);
}

FOR_EACH_DTYPE(MATMUL_KERNEL)

// The expert products of a mixture-of-experts FFN over the stored GGUF layout (the types the
// v2 products do not read): one (row, slot) pair p = p0 + blockIdx.y per block row, the body
// above at M = 1 over expert ids[p]'s rows (W + e * wstride; e clamped to n_experts - 1), input
// row p / xdiv of X (rows of K), output row p of Y (rows of N). Same bits as matmul_<type> of
// that expert on that row (F32: the half-warp body, not matmul_f32_rows), whatever the other pairs.
#define MATMUL_ID_KERNEL(suffix, DT)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) matmul_id_##suffix(                             \
        const u8* W, u64 wstride, const float* X, const u32* ids, u32 xdiv, u32 p0, u32 n_experts,    \
        float* Y, u32 N, u32 K, u64 row_bytes) { pdl_entry();                                                      \
        const u32 p = p0 + blockIdx.y;                                                                \
        const u32 e = min(ids[p], n_experts - 1);                                                     \
        matmul_body<DT>(W + (u64)e * wstride, X + (u64)(p / xdiv) * K, Y + (u64)p * N, 1, N, K,       \
                        row_bytes, 0, 8);                                                             \
    }

FOR_EACH_DTYPE(MATMUL_ID_KERNEL)
