// The F32 row products (mixture-of-experts routers: GGUF keeps `ffn_gate_inp` in F32; F32
// checkpoints), included by matmul.cu and run by kemu as they are (tools/kemu/src/check_f32rows.h).
// Both bodies compute one per-element order, the GPU's own (the products-v2 decision: within
// tolerance of the CPU's dot_f32, not its bits), so every M, tile and kernel gives the same bits:
// element (m, n) = the 8 fixed K chunks [w K / 8, (w + 1) K / 8) (w = 0..7); in chunk w, lane
// l (0..31) sums elements c0 + l, c0 + l + 32, ... in order with fma from +0; the 32 lane sums of
// a chunk are added by the xor tree (offsets 16, 8, 4, 2, 1: after each level a lane holds its
// sum plus its partner's); the 8 chunk sums are added in chunk order from -0.

// matmul_f32_rows: one block of 8 warps (warp w: chunk w) per output feature n (blockIdx.x) and
// tile of up to 8 token rows; then thread t adds the 8 warp sums into row t of the tile. A router
// (128 x 2048) ran ~80 us per call in the half-warp body of matmul.cu (16 lanes per feature, 8
// blocks for 128 features: H200 session 11); here its 128 blocks read each row with every load
// of a warp in flight (the default since the H200 gated it in session 13). At prefill it reads
// every token row once per feature: the qwen3-next 80B's 513-row router at 512 tokens, 273 us a
// layer (H100 run h100-20261207-dpro), hence matmul_f32_tiles below.
__device__ __forceinline__ void matmul_f32_rows_body(const u8* __restrict__ W, const float* __restrict__ X,
                                                float* __restrict__ Y, u32 M, u32 N, u32 K, u64 row_bytes) {
    __shared__ float part[8][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 n = blockIdx.x;
    const float* w = (const float*)(W + (u64)n * row_bytes);
    const u32 c0 = (u32)((u64)warp * K / 8), c1 = (u32)((u64)(warp + 1) * K / 8);
    for (u32 m0 = blockIdx.y * 8; m0 < M; m0 += gridDim.y * 8) {
        const u32 mt = min(8u, M - m0);
        const float* x0 = X + (u64)m0 * K;
        float acc[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) acc[t] = 0.0f;
#pragma unroll 4
        for (u32 k = c0 + lane; k < c1; k += 32) {
            const float wv = __ldg(w + k);
#pragma unroll
            for (int t = 0; t < 8; ++t)
                if ((u32)t < mt) acc[t] = __fmaf_rn(wv, x0[(u64)t * K + k], acc[t]);
        }
        warp_sums8(acc, part[warp]);
        __syncthreads();
        if (threadIdx.x < mt) {
            float v = -0.0f;
#pragma unroll
            for (int q = 0; q < 8; ++q) v = __fadd_rn(v, part[q][threadIdx.x]);
            Y[(u64)(m0 + threadIdx.x) * N + n] = v;
        }
        __syncthreads();  // part is rewritten by the next tile
    }
}

// matmul_f32_tiles: one block of 8 warps per tile of F32T features x F32T token rows (blockIdx.x,
// blockIdx.y; grid.y walks further tiles): warp w, lane l runs chunk w's lane-l chain of all
// F32T x F32T elements at once (each load of a row or a feature serves F32T chains: the tile's
// rows and features are read once a block instead of once a feature). The xor tree is then
// run as a reduce-scatter: at offset o a lane keeps half its elements (the upper half where
// lane & o), sends the other half to lane ^ o and adds what it receives to what it keeps, so
// after the five levels each lane holds 2 of the 64 chunk sums, each the sum of the same pairs
// in the same order as the tree (a + b == b + a in IEEE arithmetic). Rows and features past the
// edge compute copies of the last one, never written.
#define F32T 8  // 64 elements a tile: the five levels leave 2 a lane
__device__ __forceinline__ void matmul_f32_tiles_body(const u8* __restrict__ W, const float* __restrict__ X,
                                                      float* __restrict__ Y, u32 M, u32 N, u32 K, u64 row_bytes) {
    __shared__ float part[8][F32T * F32T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 n0 = blockIdx.x * F32T, nt = min((u32)F32T, N - n0);
    const u32 c0 = (u32)((u64)warp * K / 8), c1 = (u32)((u64)(warp + 1) * K / 8);
    // The two chunk sums this lane ends with: elements e0 and e0 + 1 of the tile (e = t F32T + f).
    const u32 e0 = ((lane & 16) ? 32 : 0) + ((lane & 8) ? 16 : 0) + ((lane & 4) ? 8 : 0) + ((lane & 2) ? 4 : 0) +
                   ((lane & 1) ? 2 : 0);
    for (u32 m0 = blockIdx.y * F32T; m0 < M; m0 += gridDim.y * F32T) {
        const u32 mt = min((u32)F32T, M - m0);
        float v[F32T * F32T];
#pragma unroll
        for (int e = 0; e < F32T * F32T; ++e) v[e] = 0.0f;
        for (u32 k = c0 + lane; k < c1; k += 32) {
            float xv[F32T], wv[F32T];
#pragma unroll
            for (int t = 0; t < F32T; ++t) xv[t] = X[(u64)(m0 + min((u32)t, mt - 1)) * K + k];
#pragma unroll
            for (int f = 0; f < F32T; ++f)
                wv[f] = __ldg((const float*)(W + (u64)(n0 + min((u32)f, nt - 1)) * row_bytes) + k);
#pragma unroll
            for (int t = 0; t < F32T; ++t)
#pragma unroll
                for (int f = 0; f < F32T; ++f) v[t * F32T + f] = __fmaf_rn(wv[f], xv[t], v[t * F32T + f]);
        }
#pragma unroll
        for (int lvl = 0; lvl < 5; ++lvl) {
            const int o = 16 >> lvl, h = 32 >> lvl;
            const bool up = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < h; ++i) {
                const float send = up ? v[i] : v[i + h];
                const float keep = up ? v[i + h] : v[i];
                v[i] = __fadd_rn(keep, __shfl_xor_sync(FULL_MASK, send, o));
            }
        }
        part[warp][e0] = v[0];
        part[warp][e0 + 1] = v[1];
        __syncthreads();
        if (threadIdx.x < F32T * F32T) {
            const u32 t = threadIdx.x / F32T, f = threadIdx.x % F32T;
            if (t < mt && f < nt) {
                float s = -0.0f;
#pragma unroll
                for (int q = 0; q < 8; ++q) s = __fadd_rn(s, part[q][threadIdx.x]);
                Y[(u64)(m0 + t) * N + n0 + f] = s;
            }
        }
        __syncthreads();  // part is rewritten by the next tile
    }
}
