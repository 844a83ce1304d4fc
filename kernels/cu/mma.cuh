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

// ---------------------------------------------------------------------------------------------
// Warpgroup mma (sm_90a only; `MWG_OK`): D[64 x N] += A[64 x 16] B[16 x N], A from registers
// (each warp of the warpgroup its 16 rows, in the mma.sync m16n8k16 A fragment layout), B from
// shared memory through a matrix descriptor, f32 accumulators in the mma.sync C layout per n8
// group j: d[4 j + e] = C[g + 8 (e >> 1)][8 j + 2 t + (e & 1)]. Measured on the H200
// (tools/device/probes/wgmma_bits.cu): the same bits as mma.sync m16n8k16 on the same A, B and
// accumulator, f16 and bf16, so a wgmma product computes what the mma.sync products compute.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MWG_OK 1
#else
#define MWG_OK 0
#endif

// Descriptor of a no-swizzle K-major B operand: core matrices of 8 columns x 8 k values (8 rows
// of 16 bytes, 128 contiguous bytes); the k-neighbour core at +128 (LBO), the next 8 columns at
// +256 (SBO).
__device__ __forceinline__ unsigned long long wg_desc(const void* smem) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)(128 >> 4) << 16) |
           ((unsigned long long)(256 >> 4) << 32);
}

// Descriptor of a 128-byte-swizzled K-major B operand (product_ws; bit-equal to wg_desc's
// layout on the H200, session 13): rows (columns n of B) of 64 16-bit k values = 128 bytes, the 16-byte chunk j of
// row r stored at chunk j ^ (r % 8), 8-row groups 1024 bytes apart (SBO; LBO unused: 1), each
// 8 x 128-byte atom 1024-byte aligned; k16 step s of an atom starts at its address + 32 s.
__device__ __forceinline__ unsigned long long wg_desc_sw128(const void* smem) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    return (unsigned long long)((addr >> 4) & 0x3FFF) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
#if MWG_OK
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if MWG_OK
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait0() {
#if MWG_OK
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait1() {
#if MWG_OK
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}

#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16R(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
#define WG_OPS32                                                                                       \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
    "%27,%28,%29,%30,%31}"
#define WG_OPS64                                                                                       \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
    "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"   \
    "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// An empty asm that "rewrites" d[N / 2]: reads of d after it are ordered after it, so after a
// preceding wgmma wait (the compiler may otherwise schedule them above the wait, and ptxas then
// injects a full warpgroup.wait of its own).
template <int N>
__device__ __forceinline__ void wg_keep(float* d) {
#if MWG_OK
    if (N == 64) {
        asm volatile("" : WG_F16R(0), WG_F16R(16)::"memory");
    } else {
        asm volatile("" : WG_F16R(0), WG_F16R(16), WG_F16R(32), WG_F16R(48)::"memory");
    }
#endif
}

// d[N / 2] += A B for one k16 step: N = 64 or 128 columns, BF = 1 for bf16 operands.
template <int N, int BF>
__device__ __forceinline__ void wg_mma(float* d, const u32 a[4], unsigned long long desc) {
#if MWG_OK
    if (N == 64 && !BF) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_OPS32
                     ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : WG_F16R(0), WG_F16R(16)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else if (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_OPS32
                     ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : WG_F16R(0), WG_F16R(16)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else if (!BF) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_OPS64
                     ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : WG_F16R(0), WG_F16R(16), WG_F16R(32), WG_F16R(48)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_OPS64
                     ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : WG_F16R(0), WG_F16R(16), WG_F16R(32), WG_F16R(48)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// mbarriers in shared memory (the warp-specialized product, products.cu `product_ws`): a phase
// completes when its expected arrivals have arrived; waits name the phase by its parity.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
#if MWG_OK
// One arrival on `bar` that also makes its phase expect `bytes` more transaction bytes (the
// bulk copies below complete them).
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// The copy engine (sm_90): `bytes` (a multiple of 16; both addresses 16-byte aligned) global ->
// shared in one instruction, completing as transaction bytes on `bar`.
__device__ __forceinline__ void bulk_g2s(void* smem, const void* gmem, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
// Makes initialized mbarriers visible to the copy engine.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
#endif
// Blocks until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nMBAR_WAIT:\nmbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra MBAR_WAIT;\n}\n" ::"r"(
            smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// Four 8x8 16-bit matrices from shared memory (attn_mma.cu, vision.cu): lanes 8j..8j+7 give the
// row addresses of matrix j; lane (g, t) receives row g, columns 2t, 2t+1 of each (TRANS: rows
// 2t, 2t+1 of column g).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4_of(u32 r[4], const u16* p) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32 r[4], const u16* p) { ldsm_x4_of<false>(r, p); }
__device__ __forceinline__ void ldsm_x4_t(u32 r[4], const u16* p) { ldsm_x4_of<true>(r, p); }
