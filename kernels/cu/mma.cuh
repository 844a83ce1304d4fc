// Tensor-core building blocks of the v2 products (mmq.cu, mmf.cu): warp-level mma.sync
// wrappers and the lane roles of their fragments.
//
// Lane L of a warp is (g, t) = (L / 4, L % 4). For every mma used here the C fragment of lane
// (g, t) holds C[g][2t], C[g][2t + 1], C[g + 8][2t], C[g + 8][2t + 1] (rows = 16 output
// features, columns = 8 tokens), and the B fragment of lane (g, t) comes from token column g.
// A column's result depends on that column's B values only (KERNELS.md: checked on the H200),
// so a token's bits never depend on which other tokens share its launch.

// Signed int8 x int8 -> int32, k = 32: exact.
__device__ __forceinline__ void mma_s8_k32(const u32 a[4], u32 b0, u32 b1, int c[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// Signed int8, k = 16 (two A registers, one B register): exact.
__device__ __forceinline__ void mma_s8_k16(u32 a0, u32 a1, u32 b0, int c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// f16 x f16 -> f32, k = 16, accumulating into c.
__device__ __forceinline__ void mma_f16_k16(const u32 a[4], u32 b0, u32 b1, float c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16 x bf16 -> f32, k = 16, accumulating into c.
__device__ __forceinline__ void mma_bf16_k16(const u32 a[4], u32 b0, u32 b1, float c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte global load through the read-only path.
__device__ __forceinline__ uint4 ld16(const u8* p) { return __ldg((const uint4*)p); }
__device__ __forceinline__ unsigned long long ld8(const u8* p) { return __ldg((const unsigned long long*)p); }

// -0.0f: the identity of IEEE addition for every x (including -0.0), the start of every sum.
#define NEG_ZERO (-0.0f)

// Where a weight tile is read from: global memory through the read-only path (Gld), or shared
// memory (Sld, the staged tiles of the shared-memory product). Same bytes, same bits.
struct Gld {
    static __device__ __forceinline__ uint4 u4(const u8* p) { return __ldg((const uint4*)p); }
    static __device__ __forceinline__ u32 w(const u32* p) { return __ldg(p); }
    static __device__ __forceinline__ uint2 w2(const uint2* p) { return __ldg(p); }
    static __device__ __forceinline__ u16 h(const u16* p) { return __ldg(p); }
};
struct Sld {
    static __device__ __forceinline__ uint4 u4(const u8* p) { return *(const uint4*)p; }
    static __device__ __forceinline__ u32 w(const u32* p) { return *p; }
    static __device__ __forceinline__ uint2 w2(const uint2* p) { return *p; }
    static __device__ __forceinline__ u16 h(const u16* p) { return *p; }
};

// Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), in commit groups.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    u32 s;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// The same, or 16 zero bytes without reading gmem when !full.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool full) {
    u32 s;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(full ? 16u : 0u)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
