// Dequantization of the GGUF block formats, lane by lane, exactly as engine/src/quant does it
// (same products and sums, each rounded to f32; the module is built with --fmad=false).
//
// Lane assignment (the CPU's dot_f32 order): element e of a row belongs to lane e % 16 of a
// half-warp. A "unit" is BS consecutive elements stored in BB bytes (a quant block, or 16 floats
// for F32/F16/BF16); Blk<DT>::lane(unit, l, v) writes the VPL = BS / 16 values of lane l in
// element order: v[i] is element i * 16 + l of the unit.

#define DT_F32 0
#define DT_F16 1
#define DT_Q4_0 2
#define DT_Q4_1 3
#define DT_Q5_0 6
#define DT_Q5_1 7
#define DT_Q8_0 8
#define DT_Q4_K 12
#define DT_Q5_K 13
#define DT_Q6_K 14
#define DT_BF16 30

template <int DT> struct Blk;

template <> struct Blk<DT_F32> {
    enum { BS = 16, BB = 64, VPL = 1, FLOAT = 1 };
    static __device__ __forceinline__ float elem(const u8* row, u32 e) { return ((const float*)row)[e]; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) { v[0] = ((const float*)b)[l]; }
};

template <> struct Blk<DT_F16> {
    enum { BS = 16, BB = 32, VPL = 1, FLOAT = 1 };
    static __device__ __forceinline__ float elem(const u8* row, u32 e) { return f16_to_f32(((const u16*)row)[e]); }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) { v[0] = f16_to_f32(((const u16*)b)[l]); }
};

template <> struct Blk<DT_BF16> {
    enum { BS = 16, BB = 32, VPL = 1, FLOAT = 1 };
    static __device__ __forceinline__ float elem(const u8* row, u32 e) { return bf16_to_f32(((const u16*)row)[e]); }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) { v[0] = bf16_to_f32(((const u16*)b)[l]); }
};

// Q4_0 (18 B): d, 16 nibble bytes; element j < 16 low nibble of byte j, j + 16 high nibble.
template <> struct Blk<DT_Q4_0> {
    enum { BS = 32, BB = 18, VPL = 2, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b);
        u32 q = b[2 + l];
        v[0] = d * (float)((int)(q & 15) - 8);
        v[1] = d * (float)((int)(q >> 4) - 8);
    }
};

// Q4_1 (20 B): d, m, nibbles as Q4_0; d * q + m.
template <> struct Blk<DT_Q4_1> {
    enum { BS = 32, BB = 20, VPL = 2, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b), m = ld_f16(b + 2);
        u32 q = b[4 + l];
        v[0] = d * (float)(q & 15) + m;
        v[1] = d * (float)(q >> 4) + m;
    }
};

__device__ __forceinline__ u32 ld_u32_bytes(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Q5_0 (22 B): d, qh (u32), nibbles; d * (q - 16).
template <> struct Blk<DT_Q5_0> {
    enum { BS = 32, BB = 22, VPL = 2, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b);
        u32 qh = ld_u32_bytes(b + 2);
        u32 q = b[6 + l];
        u32 lo = (q & 15) | (((qh >> l) & 1) << 4);
        u32 hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4);
        v[0] = d * (float)((int)lo - 16);
        v[1] = d * (float)((int)hi - 16);
    }
};

// Q5_1 (24 B): d, m, qh, nibbles; d * q + m.
template <> struct Blk<DT_Q5_1> {
    enum { BS = 32, BB = 24, VPL = 2, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b), m = ld_f16(b + 2);
        u32 qh = ld_u32_bytes(b + 4);
        u32 q = b[8 + l];
        u32 lo = (q & 15) | (((qh >> l) & 1) << 4);
        u32 hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4);
        v[0] = d * (float)lo + m;
        v[1] = d * (float)hi + m;
    }
};

// Q8_0 (34 B): d, 32 signed bytes; q * d.
template <> struct Blk<DT_Q8_0> {
    enum { BS = 32, BB = 34, VPL = 2, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b);
        v[0] = (float)(i8)b[2 + l] * d;
        v[1] = (float)(i8)b[2 + 16 + l] * d;
    }
};

// 6-bit scale and min of sub-block j of Q4_K / Q5_K (s = the 12 scale bytes).
__device__ __forceinline__ void scale_min_k4(const u8* s, int j, u32* sc, u32* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

// Q4_K (144 B): d, dmin, 12 scale bytes, 128 nibble bytes. Sub-block j (32 values) uses the low
// (j even) or high nibbles of bytes 16 + 32 (j / 2) ..; (d * sc) * q - (dmin * m).
template <> struct Blk<DT_Q4_K> {
    enum { BS = 256, BB = 144, VPL = 16, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b), dmin = ld_f16(b + 2);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            u32 sc, mn;
            scale_min_k4(b + 4, j, &sc, &mn);
            float dl = d * (float)sc;
            float ml = dmin * (float)mn;
            const u8* qs = b + 16 + 32 * (j / 2);
            int sh = 4 * (j & 1);
            u32 q0 = (qs[l] >> sh) & 15;
            u32 q1 = (qs[16 + l] >> sh) & 15;
            v[2 * j] = dl * (float)q0 - ml;
            v[2 * j + 1] = dl * (float)q1 - ml;
        }
    }
};

// Q5_K (176 B): as Q4_K with 32 bytes qh at 16 (bit j of qh[o] = 5th bit of element o of
// sub-block j) and the nibbles at 48.
template <> struct Blk<DT_Q5_K> {
    enum { BS = 256, BB = 176, VPL = 16, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b), dmin = ld_f16(b + 2);
        const u8* qh = b + 16;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            u32 sc, mn;
            scale_min_k4(b + 4, j, &sc, &mn);
            float dl = d * (float)sc;
            float ml = dmin * (float)mn;
            const u8* qs = b + 48 + 32 * (j / 2);
            int sh = 4 * (j & 1);
            u32 q0 = ((qs[l] >> sh) & 15) | (((qh[l] >> j) & 1) << 4);
            u32 q1 = ((qs[16 + l] >> sh) & 15) | (((qh[16 + l] >> j) & 1) << 4);
            v[2 * j] = dl * (float)q0 - ml;
            v[2 * j + 1] = dl * (float)q1 - ml;
        }
    }
};

// Q6_K (210 B): ql[128], qh[64], 16 signed scales, d. Element e = 128 jj + 32 k + ll:
// low bits from ql[64 jj + ll + 32 (k & 1)] >> 4 (k >> 1), high bits (qh[32 jj + ll] >> 2k) & 3;
// (d * scale[e / 16]) * (q - 32).
template <> struct Blk<DT_Q6_K> {
    enum { BS = 256, BB = 210, VPL = 16, FLOAT = 0 };
    static __device__ __forceinline__ float elem(const u8*, u32) { return 0.0f; }
    static __device__ __forceinline__ void lane(const u8* b, int l, float* v) {
        float d = ld_f16(b + 208);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int jj = i / 8, k = (i % 8) / 2, ll = (i % 2) * 16 + l;
            u32 lo = (b[64 * jj + ll + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
            u32 hi = (b[128 + 32 * jj + ll] >> (2 * k)) & 3;
            int q = (int)(lo | (hi << 4)) - 32;
            float sc = d * (float)(i8)b[192 + i];
            v[i] = sc * (float)q;
        }
    }
};

// Instantiates `MACRO(suffix, DT)` for every supported weight type.
#define FOR_EACH_DTYPE(MACRO) \
    MACRO(f32, DT_F32)        \
    MACRO(f16, DT_F16)        \
    MACRO(bf16, DT_BF16)      \
    MACRO(q4_0, DT_Q4_0)      \
    MACRO(q4_1, DT_Q4_1)      \
    MACRO(q5_0, DT_Q5_0)      \
    MACRO(q5_1, DT_Q5_1)      \
    MACRO(q8_0, DT_Q8_0)      \
    MACRO(q4_k, DT_Q4_K)      \
    MACRO(q5_k, DT_Q5_K)      \
    MACRO(q6_k, DT_Q6_K)
