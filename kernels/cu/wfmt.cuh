// Repacked weight formats of the v2 products (engine/src/quant/repack.rs writes them; its tests
// unpack them back to the GGUF blocks). A matrix of N rows x K columns is cut into tiles of 16
// rows x KT columns (rows padded to 16, columns to KT, with zeros); tile (rt, kt) starts at byte
// (rt * nkt + kt) * TB. Inside a tile the stored integer codes come first, ordered so that lane L
// of a warp reads its part of the mma A fragments with 16-byte loads at L * 16 (coalesced
// 512-byte spans), then the scales of the 16 rows.
//
// Every product is an f16 (bf16 for BF16 weights) m16n8k16 mma with f32 accumulation. A "step"
// is 16 columns. Lane (g, t) holds A registers r = 0..3 of two halves h: (row g + 8 (r & 1),
// column 8 (r >> 1) + 2t + h). Quantized weights enter the mma as their integer codes, exact in
// f16, converted in registers (the 1024 + code bit trick); the scales are applied in f32 per
// block after the mma:
//   4-bit codes: one word per step and lane, nibble r + 4h at bits 4 (r + 4h);
//   8-bit codes: two words per step and lane, bytes (r0h0, r0h1, r1h0, r1h1), (r2h0, ...).
// Activations are f16, permuted per 16 columns so that lane t's B fragment (columns 2t, 2t + 1,
// 8 + 2t, 8 + 2t + 1) is the 8 bytes at 8t, plus one f32 per 32 columns: the sum of the f16
// values (for the formats with a minimum).
//
// Each format's `block` adds one 32-column block to a lane's four C elements (c[e]: row
// g + 8 (e >> 1), token 2t + (e & 1)) with a FIXED sequence: the block's mma chain from zero,
// then the scale terms with explicit _rn intrinsics. So any kernel that walks the blocks of a
// segment in order computes the same bits, whatever M, the tile or the launch.

__device__ __forceinline__ u32 word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// 1024 + code (code < 1024) as f16 bits, minus `bias` (f16x2): the code (or code - offset).
#define F16_1024X2 0x64006400u

// A fragment of one step from a nibble word (+ optional bits above the nibble, already placed at
// bits 4.. of each half), minus `bias`.
__device__ __forceinline__ void codes4(u32 w, u32 hi0, u32 hi1, u32 hi2, u32 hi3, u32 bias, u32 a[4]) {
    a[0] = hsub2(((w >> 0) & 0x000F000Fu) | hi0 | F16_1024X2, bias);
    a[1] = hsub2(((w >> 4) & 0x000F000Fu) | hi1 | F16_1024X2, bias);
    a[2] = hsub2(((w >> 8) & 0x000F000Fu) | hi2 | F16_1024X2, bias);
    a[3] = hsub2(((w >> 12) & 0x000F000Fu) | hi3 | F16_1024X2, bias);
}

// A fragment of one step from two words of signed 8-bit codes.
__device__ __forceinline__ void codes8(u32 w0, u32 w1, u32 a[4]) {
    const u32 x0 = w0 ^ 0x80808080u, x1 = w1 ^ 0x80808080u;
    const u32 bias = 0x64806480u;  // 1152 = 1024 + 128
    a[0] = hsub2(__byte_perm(x0, 0x64646464u, 0x4140), bias);
    a[1] = hsub2(__byte_perm(x0, 0x64646464u, 0x4342), bias);
    a[2] = hsub2(__byte_perm(x1, 0x64646464u, 0x4140), bias);
    a[3] = hsub2(__byte_perm(x1, 0x64646464u, 0x4342), bias);
}

// Block sums of the lane's two tokens (only the formats with a minimum read them).
struct XSum {
    float s0, s1;
};

// Two chained steps from zero: the block's raw sums per C element.
__device__ __forceinline__ void mma2(const u32 a0[4], const u32 a1[4], u32 b00, u32 b01, u32 b10, u32 b11,
                                     float c[4]) {
    c[0] = c[1] = c[2] = c[3] = 0.0f;
    mma_f16_k16(a0, b00, b01, c);
    mma_f16_k16(a1, b10, b11, c);
}

// ---- Q8_0: KT = 64 (2 blocks, 4 steps); [0, 512) steps 0-1, [512, 1024) steps 2-3 (lane L's 16
// bytes = step words 0, 1 of the first step, then of the second); [1024, 1088) f16 d of (row,
// block) at 1024 + (row * 2 + block) * 2. Value d * q.
struct FmtQ8_0 {
    enum { KT = 64, TB = 1088, NB = 2, MIN = 0, BF = 0, WGP = 1 };
    struct Tile {
        uint4 q[2];
        u32 d[2];
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q[0] = L::u4(tile + lane * 16);
        t.q[1] = L::u4(tile + 512 + lane * 16);
        const int g = lane >> 2;
        t.d[0] = L::w((const u32*)(tile + 1024) + g);
        t.d[1] = L::w((const u32*)(tile + 1024) + g + 8);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum&,
                                                 float acc[4]) {
        u32 a0[4], a1[4];
        codes8(t.q[b].x, t.q[b].y, a0);
        codes8(t.q[b].z, t.q[b].w, a1);
        float c[4];
        mma2(a0, a1, bf[0], bf[1], bf[2], bf[3], c);
        const float d0 = f16_to_f32((u16)(t.d[0] >> (16 * b))), d1 = f16_to_f32((u16)(t.d[1] >> (16 * b)));
        acc[0] = __fadd_rn(acc[0], __fmul_rn(d0, c[0]));
        acc[1] = __fadd_rn(acc[1], __fmul_rn(d0, c[1]));
        acc[2] = __fadd_rn(acc[2], __fmul_rn(d1, c[2]));
        acc[3] = __fadd_rn(acc[3], __fmul_rn(d1, c[3]));
    }
    // The warpgroup product's view of `block` (WGP parts per block; products.cu, product_wg):
    // part p's A fragments (steps 2 b, 2 b + 1), chained from +0.0, then acc += scale * chain
    // with the scales of rows g, g + 8.
    static __device__ __forceinline__ void part_a(const Tile& t, int b, int, u32 a[2][4]) {
        codes8(t.q[b].x, t.q[b].y, a[0]);
        codes8(t.q[b].z, t.q[b].w, a[1]);
    }
    static __device__ __forceinline__ void part_scale(const Tile& t, int b, int, float s[2]) {
        s[0] = f16_to_f32((u16)(t.d[0] >> (16 * b)));
        s[1] = f16_to_f32((u16)(t.d[1] >> (16 * b)));
    }
};

// The scale terms of one 32-column block of the 32-value block formats (Q4_0 / Q4_1 / Q5_0 /
// Q5_1): acc[e] += d * c[e] (ONE = 0), or d * c[e] + m * (the token's block sum) (ONE = 1), with
// (d) or (d, m) of rows g, g + 8 in s[0], s[1] (.x block 0, .y block 1 for ONE; .x both blocks'
// d otherwise).
template <int ONE>
__device__ __forceinline__ void scale01(const uint2 s2[2], int b, const float c[4], const XSum& xs, float acc[4]) {
    const float xsum[2] = {xs.s0, xs.s1};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const uint2& s = s2[e >> 1];
        if (ONE) {
            const u32 w = b ? s.y : s.x;
            const float d = f16_to_f32((u16)w), m = f16_to_f32((u16)(w >> 16));
            acc[e] = __fadd_rn(acc[e], __fmaf_rn(d, c[e], __fmul_rn(m, xsum[e & 1])));
        } else {
            const float d = f16_to_f32((u16)(s.x >> (16 * b)));
            acc[e] = __fadd_rn(acc[e], __fmul_rn(d, c[e]));
        }
    }
}

// The warpgroup view's scales of block b (the formats without a minimum).
__device__ __forceinline__ void part_scale01(const uint2 s2[2], int b, float s[2]) {
    s[0] = f16_to_f32((u16)(s2[0].x >> (16 * b)));
    s[1] = f16_to_f32((u16)(s2[1].x >> (16 * b)));
}

// ---- Q4_0 / Q4_1: KT = 64; [0, 512) lane L's 16 bytes = the nibble words of steps 0..3; then
// Q4_0: f16 d of (row, block) at 512 + (row * 2 + block) * 2 (TB 576), value d * (q - 8);
// Q4_1: f16 (d, m) at 512 + (row * 2 + block) * 4 (TB 640), value d * q + m.
template <int ONE>
struct FmtQ4_01 {
    enum { KT = 64, TB = ONE ? 640 : 576, NB = 2, MIN = ONE, BF = 0, WGP = 1 };
    struct Tile {
        uint4 q;
        uint2 s[2];  // rows g, g + 8: Q4_0 uses .x (d of blocks 0, 1)
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q = L::u4(tile + lane * 16);
        const int g = lane >> 2;
        if (ONE) {
            t.s[0] = L::w2((const uint2*)(tile + 512) + g);
            t.s[1] = L::w2((const uint2*)(tile + 512) + g + 8);
        } else {
            t.s[0].x = L::w((const u32*)(tile + 512) + g);
            t.s[1].x = L::w((const u32*)(tile + 512) + g + 8);
            t.s[0].y = t.s[1].y = 0;
        }
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum& xs,
                                                 float acc[4]) {
        const u32 bias = ONE ? F16_1024X2 : 0x64086408u;  // codes, or codes - 8
        u32 a0[4], a1[4];
        codes4(word_of(t.q, 2 * b), 0, 0, 0, 0, bias, a0);
        codes4(word_of(t.q, 2 * b + 1), 0, 0, 0, 0, bias, a1);
        float c[4];
        mma2(a0, a1, bf[0], bf[1], bf[2], bf[3], c);
        scale01<ONE>(t.s, b, c, xs, acc);
    }
    // The warpgroup view of `block` (Q4_0 only: Q4_1's minimum term needs the block sums).
    static __device__ __forceinline__ void part_a(const Tile& t, int b, int, u32 a[2][4]) {
        const u32 bias = ONE ? F16_1024X2 : 0x64086408u;
        codes4(word_of(t.q, 2 * b), 0, 0, 0, 0, bias, a[0]);
        codes4(word_of(t.q, 2 * b + 1), 0, 0, 0, 0, bias, a[1]);
    }
    static __device__ __forceinline__ void part_scale(const Tile& t, int b, int, float s[2]) {
        part_scale01(t.s, b, s);
    }
};
typedef FmtQ4_01<0> FmtQ4_0;
typedef FmtQ4_01<1> FmtQ4_1;

// ---- Q4_K / Q5_K rows: the 16-byte GGUF block header (d, dmin, 12 bytes of 6-bit scales and
// mins); sub-block j of 32 values is (d * sc_j) * q - (dmin * m_j).
__device__ __forceinline__ u32 hdr_byte(const uint4& h, int j) {  // byte j of the 12 scale bytes
    return (word_of(h, 1 + j / 4) >> (8 * (j % 4))) & 0xffu;
}

__device__ __forceinline__ void row_k(const uint4& h, int j, float* dl, float* ml) {
    u32 sc, mn;
    if (j < 4) {
        sc = hdr_byte(h, j) & 63;
        mn = hdr_byte(h, j + 4) & 63;
    } else {
        sc = (hdr_byte(h, j + 4) & 0x0f) | ((hdr_byte(h, j - 4) >> 2) & 0x30);
        mn = (hdr_byte(h, j + 4) >> 4) | ((hdr_byte(h, j) >> 2) & 0x30);
    }
    *dl = __fmul_rn(f16_to_f32((u16)h.x), (float)sc);
    *ml = __fmul_rn(f16_to_f32((u16)(h.x >> 16)), (float)mn);
}

// The fifth bit of value (r, h) of a step from its byte of high bits, placed at bit 4 of half h.
__device__ __forceinline__ u32 hi5(u32 hb8, int r) {
    const u32 x = (hb8 >> r) & 0x11u;  // bit 0: half 0 (r), bit 4: half 1 (r + 4)
    return ((x & 1u) << 4) | ((x & 0x10u) << 16);
}

// ---- Q5_0 / Q5_1: KT = 64; [0, 512) the low nibbles as Q4_0 / Q4_1; [512, 640) lane L's 4
// bytes = one byte of fifth bits per step s (bit r + 4h, as Q5_K's plane); then
// Q5_0: f16 d of (row, block) at 640 + (row * 2 + block) * 2 (TB 704), value d * (q - 16);
// Q5_1: f16 (d, m) at 640 + (row * 2 + block) * 4 (TB 768), value d * q + m.
template <int ONE>
struct FmtQ5_01 {
    enum { KT = 64, TB = ONE ? 768 : 704, NB = 2, MIN = ONE, BF = 0, WGP = 1 };
    struct Tile {
        uint4 q;
        u32 hb;
        uint2 s[2];  // rows g, g + 8: Q5_0 uses .x (d of blocks 0, 1)
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q = L::u4(tile + lane * 16);
        t.hb = L::w((const u32*)(tile + 512) + lane);
        const int g = lane >> 2;
        if (ONE) {
            t.s[0] = L::w2((const uint2*)(tile + 640) + g);
            t.s[1] = L::w2((const uint2*)(tile + 640) + g + 8);
        } else {
            t.s[0].x = L::w((const u32*)(tile + 640) + g);
            t.s[1].x = L::w((const u32*)(tile + 640) + g + 8);
            t.s[0].y = t.s[1].y = 0;
        }
    }
    // Step s's A fragment: nibbles | fifth bits, minus 16 (Q5_0) or not (Q5_1).
    static __device__ __forceinline__ void step_codes(const Tile& t, int s, u32 a[4]) {
        const u32 bias = ONE ? F16_1024X2 : 0x64106410u;  // codes, or codes - 16
        const u32 hb8 = (t.hb >> (8 * s)) & 0xffu;
        codes4(word_of(t.q, s), hi5(hb8, 0), hi5(hb8, 1), hi5(hb8, 2), hi5(hb8, 3), bias, a);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum& xs,
                                                 float acc[4]) {
        u32 a0[4], a1[4];
        step_codes(t, 2 * b, a0);
        step_codes(t, 2 * b + 1, a1);
        float c[4];
        mma2(a0, a1, bf[0], bf[1], bf[2], bf[3], c);
        scale01<ONE>(t.s, b, c, xs, acc);
    }
    // The warpgroup view of `block` (no mwg kernel instantiates it today).
    static __device__ __forceinline__ void part_a(const Tile& t, int b, int, u32 a[2][4]) {
        step_codes(t, 2 * b, a[0]);
        step_codes(t, 2 * b + 1, a[1]);
    }
    static __device__ __forceinline__ void part_scale(const Tile& t, int b, int, float s[2]) {
        part_scale01(t.s, b, s);
    }
};
typedef FmtQ5_01<0> FmtQ5_0;
typedef FmtQ5_01<1> FmtQ5_1;

// Q4_K (HB = 0) / Q5_K (HB = 1): KT = 256 (8 blocks, 16 steps); [0, 2048) four 512-byte planes,
// lane L's 16 bytes of plane p = the nibble words of steps 4p..4p+3; Q5_K: [2048, 2560) lane L's
// 16 bytes = one byte of fifth bits per step (bit r + 4h); then the 16 rows' headers at
// 2048 (Q4_K, TB 2304) or 2560 (Q5_K, TB 2816) + row * 16.
template <int HB>
struct FmtQK {
    enum { KT = 256, TB = HB ? 2816 : 2304, NB = 8, MIN = 1, HDR = HB ? 2560 : 2048 };
    struct Tile {
        uint4 q[4];
        uint4 hb;
        uint4 h[2];
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = L::u4(tile + p * 512 + lane * 16);
        if (HB) t.hb = L::u4(tile + 2048 + lane * 16);
        const int g = lane >> 2;
        t.h[0] = L::u4(tile + HDR + g * 16);
        t.h[1] = L::u4(tile + HDR + (g + 8) * 16);
    }
    static __device__ __forceinline__ void step_codes(const Tile& t, int s, u32 a[4]) {
        const u32 w = word_of(t.q[s >> 2], s & 3);
        if (HB) {
            const u32 hb8 = (word_of(t.hb, s >> 2) >> (8 * (s & 3))) & 0xffu;
            codes4(w, hi5(hb8, 0), hi5(hb8, 1), hi5(hb8, 2), hi5(hb8, 3), F16_1024X2, a);
        } else {
            codes4(w, 0, 0, 0, 0, F16_1024X2, a);
        }
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum& xs,
                                                 float acc[4]) {
        u32 a0[4], a1[4];
        step_codes(t, 2 * b, a0);
        step_codes(t, 2 * b + 1, a1);
        float c[4];
        mma2(a0, a1, bf[0], bf[1], bf[2], bf[3], c);
        float dl[2], ml[2];
        row_k(t.h[0], b, &dl[0], &ml[0]);
        row_k(t.h[1], b, &dl[1], &ml[1]);
        const float xsum[2] = {xs.s0, xs.s1};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float r = __fmaf_rn(dl[e >> 1], c[e], -__fmul_rn(ml[e >> 1], xsum[e & 1]));
            acc[e] = __fadd_rn(acc[e], r);
        }
    }
};
typedef FmtQK<1> FmtQ5_K;

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// (a & mask) | F16_1024X2 in one instruction.
__device__ __forceinline__ u32 lop_1024(u32 a, u32 mask) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "r"(mask), "r"(F16_1024X2));
    return d;
}

// Q4_K, dequantized in f16 before the mma (Marlin-style): KT = 256; [0, 2048) the nibble planes
// as Q5_K's; [2048, 2304) word (g, j) at 2048 + (g * 8 + j) * 4 = the 6-bit scale and min of
// rows g and g + 8 in sub-block j as bytes [sc(g), m(g), sc(g + 8), m(g + 8)]; [2304, 2368) row
// r's f16 d and dmin at 2304 + r * 4 (engine/src/quant/repack/q4k.rs). A value is
// fma(q, dl, -ml) in f16 with dl = f16(d * sc) and ml = f16(dmin * m) (each product rounded
// once), and the mma chain over the whole segment is the accumulation (no per-block epilogue,
// no block sums of the activations).
struct FmtQ4_K {
    enum { KT = 256, TB = 2368, NB = 8, MIN = 0, BF = 0, WGP = 0 };
    struct Tile {
        uint4 q[4];
        uint4 s[2];  // words (g, 0..3), (g, 4..7)
        u32 dm[2];   // (d, -dmin) of rows g and g + 8
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = L::u4(tile + p * 512 + lane * 16);
        const int g = lane >> 2;
        t.s[0] = L::u4(tile + 2048 + g * 32);
        t.s[1] = L::u4(tile + 2048 + g * 32 + 16);
        t.dm[0] = L::w((const u32*)(tile + 2304) + g) ^ 0x80000000u;
        t.dm[1] = L::w((const u32*)(tile + 2304) + g + 8) ^ 0x80000000u;
    }
    // (dl, dl) and (-ml, -ml) of one row from its (sc, m) bytes at byte pair `sel` of `sw`.
    static __device__ __forceinline__ void row_scales(u32 sw, u32 sel, u32 dm, u32* dl2, u32* ml2) {
        const u32 scm = hsub2(__byte_perm(sw, 0x64646464u, sel), F16_1024X2);  // (sc, m) exact
        const u32 v = hmul2(scm, dm);                                          // (dl, -ml)
        *dl2 = __byte_perm(v, v, 0x1010);
        *ml2 = __byte_perm(v, v, 0x3232);
    }
    // The A fragments of block b's two steps (2 b, 2 b + 1), dequantized to f16.
    static __device__ __forceinline__ void block_a(const Tile& t, int b, u32 a[2][4]) {
        const u32 sw = word_of(t.s[b >> 2], b & 3);
        u32 dl[2], ml[2];
        row_scales(sw, 0x4140, t.dm[0], &dl[0], &ml[0]);
        row_scales(sw, 0x4342, t.dm[1], &dl[1], &ml[1]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int s = 2 * b + half;
            const u32 w = word_of(t.q[s >> 2], s & 3), w8 = w >> 8;
            a[half][0] = hsub2(lop_1024(w, 0x000F000Fu), F16_1024X2);
            a[half][1] = hfma2(lop_1024(w, 0x00F000F0u), 0x2C002C00u, 0xD400D400u);  // (1024 + 16 q) / 16 - 64
            a[half][2] = hsub2(lop_1024(w8, 0x000F000Fu), F16_1024X2);
            a[half][3] = hfma2(lop_1024(w8, 0x00F000F0u), 0x2C002C00u, 0xD400D400u);
#pragma unroll
            for (int r = 0; r < 4; ++r) a[half][r] = hfma2(a[half][r], dl[r & 1], ml[r & 1]);
        }
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum&,
                                                 float acc[4]) {
        u32 a[2][4];
        block_a(t, b, a);
#pragma unroll
        for (int half = 0; half < 2; ++half) mma_f16_k16(a[half], bf[2 * half], bf[2 * half + 1], acc);
    }
};

// Q6_K: KT = 256; nibble planes as Q4_K in [0, 2048); [2048, 3072) lane L's 32 bytes = one u16 of
// high bits per step (bits 2 (r + 4h), +1 = bits 4-5 of value (r, h)); [3072, 3328) the 16 int8
// scales of each row (one per 16 values = per step) at 3072 + row * 16; [3328, 3360) f16 d of
// each row at 3328 + row * 2. Value d * sc * (q - 32): one mma per step, scaled per step.
struct FmtQ6_K {
    enum { KT = 256, TB = 3360, NB = 8, MIN = 0, BF = 0, WGP = 2 };
    struct Tile {
        uint4 q[4];
        uint4 hb[2];
        uint4 s[2];
        u32 d;  // d of row g (low half) and row g + 8 (high half)
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = L::u4(tile + p * 512 + lane * 16);
        t.hb[0] = L::u4(tile + 2048 + lane * 32);
        t.hb[1] = L::u4(tile + 2048 + lane * 32 + 16);
        const int g = lane >> 2;
        t.s[0] = L::u4(tile + 3072 + g * 16);
        t.s[1] = L::u4(tile + 3072 + (g + 8) * 16);
        const u16* dp = (const u16*)(tile + 3328);
        t.d = (u32)L::h(dp + g) | ((u32)L::h(dp + g + 8) << 16);
    }
    static __device__ __forceinline__ void step_codes(const Tile& t, int s, u32 a[4]) {
        const u32 w = word_of(t.q[s >> 2], s & 3);
        const u32 h16 = (word_of(t.hb[s >> 3], (s >> 1) & 3) >> (16 * (s & 1))) & 0xffffu;
        u32 hi[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            hi[r] = (((h16 >> (2 * r)) & 3u) << 4) | (((h16 >> (2 * r + 8)) & 3u) << 20);
        }
        codes4(w, hi[0], hi[1], hi[2], hi[3], 0x64206420u, a);  // codes - 32
    }
    static __device__ __forceinline__ float scale(const Tile& t, int hi, int s) {
        const u32 w = word_of(t.s[hi], s >> 2) >> (8 * (s & 3));
        return __fmul_rn(f16_to_f32((u16)(t.d >> (16 * hi))), (float)(int)(i8)(w & 0xffu));
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum&,
                                                 float acc[4]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int s = 2 * b + half;
            u32 a[4];
            step_codes(t, s, a);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_f16_k16(a, bf[2 * half], bf[2 * half + 1], c);
            const float s0 = scale(t, 0, s), s1 = scale(t, 1, s);
            acc[0] = __fadd_rn(acc[0], __fmul_rn(s0, c[0]));
            acc[1] = __fadd_rn(acc[1], __fmul_rn(s0, c[1]));
            acc[2] = __fadd_rn(acc[2], __fmul_rn(s1, c[2]));
            acc[3] = __fadd_rn(acc[3], __fmul_rn(s1, c[3]));
        }
    }
    // The warpgroup view of `block`: two parts per block, part p = step 2 b + p alone.
    static __device__ __forceinline__ void part_a(const Tile& t, int b, int p, u32 a[2][4]) {
        step_codes(t, 2 * b + p, a[0]);
    }
    static __device__ __forceinline__ void part_scale(const Tile& t, int b, int p, float s[2]) {
        s[0] = scale(t, 0, 2 * b + p);
        s[1] = scale(t, 1, 2 * b + p);
    }
};

// ---- F16 / BF16: KT = 64 (four steps); [0, 2048) step s at s * 512 + L * 16: the 4 words of
// lane L's A fragment. No scales: the mma chain over the whole segment is the accumulation
// (block b = steps 2b, 2b + 1, added into acc directly).
template <int BFV>
struct FmtF16 {
    enum { KT = 64, TB = 2048, NB = 2, MIN = 0, BF = BFV, WGP = 0 };
    struct Tile {
        uint4 q[4];
    };
    template <class L = Gld>
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int s = 0; s < 4; ++s) t.q[s] = L::u4(tile + s * 512 + lane * 16);
    }
    static __device__ __forceinline__ void block_a(const Tile& t, int b, u32 a[2][4]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint4& q = t.q[2 * b + half];
            a[half][0] = q.x;
            a[half][1] = q.y;
            a[half][2] = q.z;
            a[half][3] = q.w;
        }
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, const u32 bf[4], const XSum&,
                                                 float acc[4]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint4& q = t.q[2 * b + half];
            const u32 a[4] = {q.x, q.y, q.z, q.w};
            if (BF) {
                mma_bf16_k16(a, bf[2 * half], bf[2 * half + 1], acc);
            } else {
                mma_f16_k16(a, bf[2 * half], bf[2 * half + 1], acc);
            }
        }
    }
};
