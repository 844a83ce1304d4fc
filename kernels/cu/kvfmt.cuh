// KV cache formats (engine/src/kv_format.rs stores the same bytes on the CPU). A cache row is one
// position of one layer's K or V: `w` = n_kv_heads * head_dim values, `row_bytes(w)` bytes, rows
// at slot * row_bytes(w). Each format gives:
//   ld(row, i, w)  value i as f32;
//   st(row, i, x)  store value i (not Q8_0, whose blocks are written by kv_write_q8_0);
//   h4(row, d, w)  values d..d+3 (d % 4 == 0) as two mma operand words (lo = the lower index),
//                  in the tensor-core attention's input type: f16 (BF16 = false) or bf16;
//   h8(row, d, w)  values d..d+7 (d % 8 == 0) the same way, as four words (the same values as
//                  two h4, with wider loads);
//   DIRECT         whether the stored 16-bit values already are the mma input (f16, bf16): then
//                  h8 is a plain 16-byte copy, which the attention stages with cp.async.
// f16 saturates to +-65504 before rounding (the same bits as rounding an f32 cache row for the
// f16 mma); bf16 and f16 round to nearest even; Q8_0 holds the row's int8 quants, then its f16
// scales per 32 values (value = q * scale).

// Two f32 -> f16x2 (lo in the low half), clamped to the finite range.
__device__ __forceinline__ u32 h2_sat(float lo, float hi) {
    lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
    hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// Two f32 -> bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 b2_rn(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// h8 as two h4 (formats that convert their values on the way).
template <typename F>
__device__ __forceinline__ uint4 kv_h8_of_h4(const u8* r, u32 d, u32 w) {
    const uint2 lo = F::h4(r, d, w), hi = F::h4(r, d + 4, w);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

struct KvF32 {
    static constexpr bool DIRECT = false;
    static constexpr bool BF16 = false;
    static __device__ __forceinline__ u64 row_bytes(u64 w) { return 4 * w; }
    static __device__ __forceinline__ float ld(const u8* r, u32 i, u32) { return __ldg((const float*)r + i); }
    static __device__ __forceinline__ void st(u8* r, u32 i, float x) { ((float*)r)[i] = x; }
    static __device__ __forceinline__ uint2 h4(const u8* r, u32 d, u32) {
        const float4 v = __ldg((const float4*)(r + 4 * (u64)d));
        return make_uint2(h2_sat(v.x, v.y), h2_sat(v.z, v.w));
    }
    static __device__ __forceinline__ uint4 h8(const u8* r, u32 d, u32 w) { return kv_h8_of_h4<KvF32>(r, d, w); }
};

struct KvF16 {
    static constexpr bool DIRECT = true;
    static constexpr bool BF16 = false;
    static __device__ __forceinline__ u64 row_bytes(u64 w) { return 2 * w; }
    static __device__ __forceinline__ float ld(const u8* r, u32 i, u32) { return f16_to_f32(__ldg((const u16*)r + i)); }
    static __device__ __forceinline__ void st(u8* r, u32 i, float x) { ((u16*)r)[i] = (u16)(h2_sat(x, 0.0f) & 0xffffu); }
    static __device__ __forceinline__ uint2 h4(const u8* r, u32 d, u32) { return __ldg((const uint2*)(r + 2 * (u64)d)); }
    static __device__ __forceinline__ uint4 h8(const u8* r, u32 d, u32) { return __ldg((const uint4*)(r + 2 * (u64)d)); }
};

struct KvBF16 {
    static constexpr bool DIRECT = true;
    static constexpr bool BF16 = true;
    static __device__ __forceinline__ u64 row_bytes(u64 w) { return 2 * w; }
    static __device__ __forceinline__ float ld(const u8* r, u32 i, u32) { return bf16_to_f32(__ldg((const u16*)r + i)); }
    static __device__ __forceinline__ void st(u8* r, u32 i, float x) { ((u16*)r)[i] = (u16)(b2_rn(x, 0.0f) & 0xffffu); }
    static __device__ __forceinline__ uint2 h4(const u8* r, u32 d, u32) { return __ldg((const uint2*)(r + 2 * (u64)d)); }
    static __device__ __forceinline__ uint4 h8(const u8* r, u32 d, u32) { return __ldg((const uint4*)(r + 2 * (u64)d)); }
};

struct KvQ8 {
    static constexpr bool DIRECT = false;
    static constexpr bool BF16 = false;
    static __device__ __forceinline__ u64 row_bytes(u64 w) { return w + w / 16; }
    static __device__ __forceinline__ float scale(const u8* r, u32 i, u32 w) {
        return f16_to_f32(__ldg((const u16*)(r + w) + i / 32));
    }
    static __device__ __forceinline__ float ld(const u8* r, u32 i, u32 w) {
        return __fmul_rn((float)(i8)r[i], scale(r, i, w));
    }
    static __device__ __forceinline__ void st(u8*, u32, float) {}
    static __device__ __forceinline__ uint2 h4(const u8* r, u32 d, u32 w) {
        const u32 q = __ldg((const u32*)(r + d));
        const float s = scale(r, d, w);
        const float x0 = __fmul_rn((float)(i8)(q & 0xffu), s), x1 = __fmul_rn((float)(i8)((q >> 8) & 0xffu), s);
        const float x2 = __fmul_rn((float)(i8)((q >> 16) & 0xffu), s), x3 = __fmul_rn((float)(i8)(q >> 24), s);
        return make_uint2(h2_sat(x0, x1), h2_sat(x2, x3));
    }
    // Two h4 (a Q8_0 row is only 4-byte aligned).
    static __device__ __forceinline__ uint4 h8(const u8* r, u32 d, u32 w) { return kv_h8_of_h4<KvQ8>(r, d, w); }
};

// The first position a row of `n` = pos + 1 positions sees under a sliding `window` (0: none):
// the attention modules' one definition (attention.cu, attn_mma.cu and its attn_combine, which
// compile apart but all include this header), mirrored on the host by attn_window_start
// (engine/src/backend/cuda/attention.rs).
__device__ __forceinline__ u32 attn_window_lo(u32 n, u32 window) { return window != 0 && n > window ? n - window : 0u; }

// The positions lo ..< n that row r at `pos` attends to: causal under the window (n = pos + 1,
// lo = attn_window_lo), widened to the row's image span [span[2r], span[2r + 1]) when the launch
// has spans (Gemma 3's images attend bidirectionally; a text row's pair is (pos, pos + 1)).
// `span` null (every text-only launch): exactly the causal window's. Mirrors attn_range
// (engine/src/backend/spans.rs).
__device__ __forceinline__ void attn_row_range(const u32* __restrict__ span, u32 r, u32 pos, u32 window, u32& lo,
                                               u32& n) {
    n = pos + 1;
    lo = attn_window_lo(n, window);
    if (span) {
        lo = min(lo, span[2 * r]);
        n = max(n, span[2 * r + 1]);
    }
}
