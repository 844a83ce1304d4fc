// Embedding lookup: Y[m] = dequantize(W[tokens[m]]), exact f32 (the CPU's dequantize_row).
// One block per row m; thread t handles (unit t / 16, lane t % 16) in a loop.

template <int DT>
__device__ __forceinline__ void embed_body(const u8* __restrict__ W, const u32* __restrict__ tokens,
                                           float* __restrict__ Y, u32 K, u64 row_bytes) {
    typedef Blk<DT> B;
    const u32 m = blockIdx.x;
    const u8* row = W + (u64)tokens[m] * row_bytes;
    float* y = Y + (u64)m * K;
    const u32 nb = K / B::BS;
    for (u32 t = threadIdx.x; t < nb * 16; t += blockDim.x) {
        const u32 b = t / 16;
        const int l = (int)(t % 16);
        float v[B::VPL];
        B::lane(row + (u64)b * B::BB, l, v);
#pragma unroll
        for (int i = 0; i < B::VPL; ++i) y[b * B::BS + i * 16 + l] = v[i];
    }
    if (B::FLOAT) {
        for (u32 e = nb * B::BS + threadIdx.x; e < K; e += blockDim.x) y[e] = B::elem(row, e);
    }
}

#define EMBED_KERNEL(suffix, DT)                                                                     \
    extern "C" __global__ void embed_##suffix(const u8* W, const u32* tokens, float* Y, u32 K,      \
                                              u64 row_bytes) { pdl_entry();                                       \
        embed_body<DT>(W, tokens, Y, K, row_bytes);                                                  \
    }

FOR_EACH_DTYPE(EMBED_KERNEL)
