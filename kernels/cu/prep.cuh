// Preparation of product activations (shared by products.cu and the fused producers in
// attention.cu): 16-bit values permuted per 32-column block, and the f32 sum of each block.

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

// Stores one 32-column block held one value per lane as prepared activations: the 16-bit value
// (f16 clamped to +-65504, or bf16 when bf != 0) at its permuted place in `blk` (the block's 32
// values), and the f32 sum of the block's 16-bit values (fixed xor tree) at *sum.
__device__ __forceinline__ void prep_store(float x, int lane, u16* blk, float* sum, u32 bf) {
    u16 h;
    float v;
    if (bf) {
        h = f32_to_bf16_bits(x);
        v = bf16_bits_to_f32(h);
    } else {
        h = f32_to_f16_bits(fminf(fmaxf(x, -65504.0f), 65504.0f));
        v = f16_to_f32(h);
    }
    blk[act_pos((u32)lane)] = h;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
    if (lane == 0) *sum = v;
}

// The warp loop of every preparation: one warp per (row m, 32-column block b) of M rows of kp
// prepared columns, grid-stride over the grid's warps; value(m, b, k) is column k's value
// (k = b * 32 + lane; called by all 32 lanes of the warp), stored by prep_store.
template <class Value>
__device__ __forceinline__ void prep_rows(Value value, u16* __restrict__ Xh, float* __restrict__ Xs, u32 M, u32 kp,
                                          u32 bf) {
    const int lane = threadIdx.x & 31;
    const u32 nb = kp / 32;
    const u64 total = (u64)M * nb;
    const u64 nwarps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < total; w += nwarps) {
        const u32 m = (u32)(w / nb), b = (u32)(w % nb);
        const float v = value(m, b, b * 32 + lane);
        prep_store(v, lane, Xh + (u64)m * kp + b * 32, Xs + w, bf);
    }
}

// A gated activation fused with the preparation of the product that reads it: v = act(g, u) for
// rows of `width`, written as f32 to Y (when not null; Y may be G) and prepared into Xh / Xs.
// One warp per (row, block), grid-stride. `act` is compiled with the including module's
// rounding (products.cu's swiglu_prep, elementwise.cu's geglu_prep).
template <class Act>
__device__ __forceinline__ void glu_prep_rows(Act act, const float* G, const float* __restrict__ U, float* Y,
                                              u16* __restrict__ Xh, float* __restrict__ Xs, u32 M, u32 width,
                                              u32 kp, u32 bf) {
    prep_rows(
        [&](u32 m, u32, u32 k) {
            const u64 i = (u64)m * width + k;
            const float v = k < width ? act(G[i], U[i]) : 0.0f;
            __syncwarp();
            if (Y && k < width) Y[i] = v;
            return v;
        },
        Xh, Xs, M, kp, bf);
}
