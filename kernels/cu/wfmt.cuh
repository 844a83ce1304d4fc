// Repacked weight formats of the v2 products (engine/src/quant/repack.rs writes them; its tests
// unpack them back to the GGUF blocks). A matrix of N rows x K columns is cut into tiles of 16
// rows x KT columns (rows padded to 16, columns to KT, with zeros); tile (rt, kt) starts at byte
// (rt * nkt + kt) * TB. Inside a tile the quantized values come first, ordered so that lane L of
// a warp reads its mma A fragment with 16-byte loads at L * 16 (coalesced 512-byte spans), then
// the scales of the 16 rows.
//
// The int8 A fragment of one 32-column block ("frag32"): lane (g, t) holds 4 words r = 0..3 of
// 4 bytes i = 0..3: word 0 = row g, columns 4t + i; word 1 = row g + 8, same columns; word 2 =
// row g, columns 16 + 4t + i; word 3 = row g + 8, columns 16 + 4t + i. (Words 0/1 and 2/3 are
// also the A fragments of the two k16 halves.)
//
// Activations for the int8 formats are quantized per row and per 32-column block (quantize_q8 in
// products.cu): int8 values, permuted inside each block so that lane t's B fragment (columns
// 4t..4t+3 and 16+4t..16+4t+3) is the 8 bytes at 8t, and one XS (scale d, sum of the int8
// values sq) per block.
//
// Each format's `accum` adds one block's contribution to a lane's four C elements with a FIXED
// float sequence (explicit _rn intrinsics, so no kernel can contract it differently); the
// integer part is exact. So any kernel that walks the blocks of a segment in order gives the
// same bits, whatever M, the tile or the launch.

struct XS {
    float d;
    int sq;
};

__device__ __forceinline__ XS ld_xs(const XS* p) {
    uint2 v = __ldg((const uint2*)p);
    XS x;
    x.d = __uint_as_float(v.x);
    x.sq = (int)v.y;
    return x;
}

__device__ __forceinline__ u32 word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Nibbles of block b from a word pair layout: low nibbles = even block, high = odd block.
__device__ __forceinline__ void nib_frag(const uint4& q, int hi, u32 a[4]) {
    const int sh = hi ? 4 : 0;
    a[0] = (q.x >> sh) & 0x0F0F0F0Fu;
    a[1] = (q.y >> sh) & 0x0F0F0F0Fu;
    a[2] = (q.z >> sh) & 0x0F0F0F0Fu;
    a[3] = (q.w >> sh) & 0x0F0F0F0Fu;
}

// One block's four C elements: c[e] is (row g + 8 (e >> 1), token 2t + (e & 1)).
template <class ROW>
__device__ __forceinline__ void accum_k32(const u32 a[4], const ROW& r0, const ROW& r1, u32 b0, u32 b1,
                                          const XS& x0, const XS& x1, float acc[4]) {
    int c[4];
    mma_s8_k32(a, b0, b1, c);
    acc[0] = __fadd_rn(acc[0], r0.term(c[0], x0));
    acc[1] = __fadd_rn(acc[1], r0.term(c[1], x1));
    acc[2] = __fadd_rn(acc[2], r1.term(c[2], x0));
    acc[3] = __fadd_rn(acc[3], r1.term(c[3], x1));
}

// ---- Q8_0: KT = 64 (2 blocks); [0, 1024) frag32 of block 0 then block 1 (int8); [1024, 1088)
// f16 d of (row, block) at 1024 + (row * 2 + block) * 2.
struct RowD {
    float d;
    __device__ __forceinline__ float term(int c, const XS& x) const {
        return __fmul_rn(__fmul_rn(d, x.d), (float)c);
    }
};

struct FmtQ8_0 {
    enum { KT = 64, TB = 1088, NB = 2 };
    struct Tile {
        uint4 q[2];
        u32 d[2];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q[0] = ld16(tile + lane * 16);
        t.q[1] = ld16(tile + 512 + lane * 16);
        const int g = lane >> 2;
        t.d[0] = __ldg((const u32*)(tile + 1024) + g);
        t.d[1] = __ldg((const u32*)(tile + 1024) + g + 8);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4] = {t.q[b].x, t.q[b].y, t.q[b].z, t.q[b].w};
        RowD r0 = {f16_to_f32((u16)(t.d[0] >> (16 * b)))};
        RowD r1 = {f16_to_f32((u16)(t.d[1] >> (16 * b)))};
        accum_k32(a, r0, r1, b0, b1, x0, x1, acc);
    }
};

// ---- Q4_0: KT = 64; [0, 512) byte (lane, r, i) = nibble of block 0 | nibble of block 1 << 4;
// [512, 576) f16 d of (row, block) at 512 + (row * 2 + block) * 2. Value d * (q - 8): the 8 is
// taken out exactly through the activation block sum.
struct RowQ4_0 {
    float d;
    __device__ __forceinline__ float term(int c, const XS& x) const {
        return __fmul_rn(__fmul_rn(d, x.d), (float)(c - 8 * x.sq));
    }
};

struct FmtQ4_0 {
    enum { KT = 64, TB = 576, NB = 2 };
    struct Tile {
        uint4 q;
        u32 d[2];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q = ld16(tile + lane * 16);
        const int g = lane >> 2;
        t.d[0] = __ldg((const u32*)(tile + 512) + g);
        t.d[1] = __ldg((const u32*)(tile + 512) + g + 8);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4];
        nib_frag(t.q, b, a);
        RowQ4_0 r0 = {f16_to_f32((u16)(t.d[0] >> (16 * b)))};
        RowQ4_0 r1 = {f16_to_f32((u16)(t.d[1] >> (16 * b)))};
        accum_k32(a, r0, r1, b0, b1, x0, x1, acc);
    }
};

// ---- Q4_1: KT = 64; nibbles as Q4_0; [512, 640) f16 (d, m) of (row, block) at
// 512 + (row * 2 + block) * 4. Value d * q + m.
struct RowDM {
    float d, m;
    __device__ __forceinline__ float term(int c, const XS& x) const {
        return __fmul_rn(x.d, __fmaf_rn(d, (float)c, __fmul_rn(m, (float)x.sq)));
    }
};

struct FmtQ4_1 {
    enum { KT = 64, TB = 640, NB = 2 };
    struct Tile {
        uint4 q;
        uint2 dm[2];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
        t.q = ld16(tile + lane * 16);
        const int g = lane >> 2;
        t.dm[0] = __ldg((const uint2*)(tile + 512) + g);
        t.dm[1] = __ldg((const uint2*)(tile + 512) + g + 8);
    }
    static __device__ __forceinline__ RowDM row(const uint2& v, int b) {
        const u32 w = b ? v.y : v.x;
        RowDM r = {f16_to_f32((u16)w), f16_to_f32((u16)(w >> 16))};
        return r;
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4];
        nib_frag(t.q, b, a);
        accum_k32(a, row(t.dm[0], b), row(t.dm[1], b), b0, b1, x0, x1, acc);
    }
};

// ---- Q4_K / Q5_K rows: the 16-byte GGUF block header (d, dmin, 12 bytes of 6-bit scales and
// mins); sub-block j of 32 values is (d * sc_j) * q - (dmin * m_j).
struct RowK {
    float dl, ml;
    __device__ __forceinline__ float term(int c, const XS& x) const {
        return __fmul_rn(x.d, __fmaf_rn(dl, (float)c, -__fmul_rn(ml, (float)x.sq)));
    }
};

__device__ __forceinline__ u32 hdr_byte(const uint4& h, int j) {  // byte j of the 12 scale bytes
    return (word_of(h, 1 + j / 4) >> (8 * (j % 4))) & 0xffu;
}

__device__ __forceinline__ RowK row_k(const uint4& h, int j) {
    u32 sc, mn;
    if (j < 4) {
        sc = hdr_byte(h, j) & 63;
        mn = hdr_byte(h, j + 4) & 63;
    } else {
        sc = (hdr_byte(h, j + 4) & 0x0f) | ((hdr_byte(h, j - 4) >> 2) & 0x30);
        mn = (hdr_byte(h, j + 4) >> 4) | ((hdr_byte(h, j) >> 2) & 0x30);
    }
    RowK r = {__fmul_rn(f16_to_f32((u16)h.x), (float)sc), __fmul_rn(f16_to_f32((u16)(h.x >> 16)), (float)mn)};
    return r;
}

// Q4_K: KT = 256 (8 blocks); [0, 2048) four 512-byte frag planes p = 0..3, byte (lane, r, i) of
// plane p = nibble of sub-block 2p | nibble of sub-block 2p + 1 << 4; [2048, 2304) the 16 rows'
// headers at 2048 + row * 16.
struct FmtQ4_K {
    enum { KT = 256, TB = 2304, NB = 8 };
    struct Tile {
        uint4 q[4];
        uint4 h[2];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = ld16(tile + p * 512 + lane * 16);
        const int g = lane >> 2;
        t.h[0] = ld16(tile + 2048 + g * 16);
        t.h[1] = ld16(tile + 2048 + (g + 8) * 16);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4];
        nib_frag(t.q[b >> 1], b & 1, a);
        accum_k32(a, row_k(t.h[0], b), row_k(t.h[1], b), b0, b1, x0, x1, acc);
    }
};

// 4 bits (h4 < 16) to bit 4 of each byte.
__device__ __forceinline__ u32 spread_bit4(u32 h4) { return ((h4 * 0x00204081u) & 0x01010101u) << 4; }

// Q5_K: KT = 256; nibbles as Q4_K in [0, 2048); [2048, 2560) the fifth bits: lane L's 16 bytes
// at 2048 + L * 16 as 4 words, bit 16 (j & 1) + 4r + i of word j / 2 = bit 4 of value (sub-block
// j, r, i); [2560, 2816) the headers at 2560 + row * 16.
struct FmtQ5_K {
    enum { KT = 256, TB = 2816, NB = 8 };
    struct Tile {
        uint4 q[4];
        uint4 hb;
        uint4 h[2];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = ld16(tile + p * 512 + lane * 16);
        t.hb = ld16(tile + 2048 + lane * 16);
        const int g = lane >> 2;
        t.h[0] = ld16(tile + 2560 + g * 16);
        t.h[1] = ld16(tile + 2560 + (g + 8) * 16);
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4];
        nib_frag(t.q[b >> 1], b & 1, a);
        const u32 hw = word_of(t.hb, b >> 1) >> (16 * (b & 1));
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] |= spread_bit4((hw >> (4 * r)) & 15u);
        accum_k32(a, row_k(t.h[0], b), row_k(t.h[1], b), b0, b1, x0, x1, acc);
    }
};

// Q6_K: KT = 256; low nibbles as Q4_K in [0, 2048); [2048, 3072) the high 2 bits: lane L's 32
// bytes at 2048 + L * 32 as 8 words, bits 8r + 2i, +1 of word j = bits 4-5 of value (sub-block j,
// r, i); [3072, 3328) the 16 int8 scales of each row at 3072 + row * 16 (one per 16 values);
// [3328, 3360) f16 d of each row at 3328 + row * 2. Value d * sc * (q - 32); the two k16 halves
// of a block have their own scale, combined exactly in int32.
struct RowQ6 {
    float d;
    int sa, sb;
};

struct FmtQ6_K {
    enum { KT = 256, TB = 3360, NB = 8 };
    struct Tile {
        uint4 q[4];
        uint4 hb[2];
        uint4 s[2];
        u32 d;  // d of row g (low half) and row g + 8 (high half)
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int p = 0; p < 4; ++p) t.q[p] = ld16(tile + p * 512 + lane * 16);
        t.hb[0] = ld16(tile + 2048 + lane * 32);
        t.hb[1] = ld16(tile + 2048 + lane * 32 + 16);
        const int g = lane >> 2;
        t.s[0] = ld16(tile + 3072 + g * 16);
        t.s[1] = ld16(tile + 3072 + (g + 8) * 16);
        const u16* dp = (const u16*)(tile + 3328);
        t.d = (u32)__ldg(dp + g) | ((u32)__ldg(dp + g + 8) << 16);
    }
    static __device__ __forceinline__ RowQ6 row(const Tile& t, int hi, int b) {
        const u32 w = word_of(t.s[hi], b >> 1) >> (16 * (b & 1));
        RowQ6 r = {f16_to_f32((u16)(t.d >> (16 * hi))), (int)(i8)(w & 0xff), (int)(i8)((w >> 8) & 0xff)};
        return r;
    }
    static __device__ __forceinline__ void block(const Tile& t, int b, u32 b0, u32 b1, const XS& x0,
                                                 const XS& x1, float acc[4]) {
        u32 a[4];
        nib_frag(t.q[b >> 1], b & 1, a);
        const u32 hw = word_of(t.hb[b >> 2], b & 3);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const u32 h8 = (hw >> (8 * r)) & 0xffu;
            const u32 sp = (h8 & 3u) | ((h8 & 0xcu) << 6) | ((h8 & 0x30u) << 12) | ((h8 & 0xc0u) << 18);
            const u32 x = (a[r] | (sp << 4)) ^ 0x20202020u;  // q - 32 as int8, byte-wise
            a[r] = x | ((x & 0x20202020u) * 6u);
        }
        int c1[4], c2[4];
        mma_s8_k16(a[0], a[1], b0, c1);
        mma_s8_k16(a[2], a[3], b1, c2);
        const RowQ6 r0 = row(t, 0, b), r1 = row(t, 1, b);
        const XS xs[2] = {x0, x1};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const RowQ6& r = (e >> 1) ? r1 : r0;
            const XS& x = xs[e & 1];
            const int s = r.sa * c1[e] + r.sb * c2[e];
            acc[e] = __fadd_rn(acc[e], __fmul_rn(__fmul_rn(r.d, x.d), (float)s));
        }
    }
};

// ---- F16 / BF16: KT = 64 (four k16 steps); [0, 2048) step s at s * 512 + L * 16: the 4 words of
// lane L's m16n8k16 A fragment (word 0 = row g, columns 2t, 2t + 1; 1 = row g + 8; 2 = row g,
// columns 8 + 2t, 8 + 2t + 1; 3 = row g + 8). Activations are 16-bit, permuted per 16 columns so
// that lane t's B fragment (columns 2t, 2t + 1, 8 + 2t, 8 + 2t + 1) is the 8 bytes at 8t.
// Accumulation is the mma's own, into the f32 C registers, step after step in column order.
template <int BF>
struct FmtF16 {
    enum { KT = 64, TB = 2048, NB = 4 };
    struct Tile {
        uint4 q[4];
    };
    static __device__ __forceinline__ void load(const u8* tile, int lane, Tile& t) {
#pragma unroll
        for (int s = 0; s < 4; ++s) t.q[s] = ld16(tile + s * 512 + lane * 16);
    }
    static __device__ __forceinline__ void step(const Tile& t, int s, u32 b0, u32 b1, float acc[4]) {
        u32 a[4] = {t.q[s].x, t.q[s].y, t.q[s].z, t.q[s].w};
        if (BF) {
            mma_bf16_k16(a, b0, b1, acc);
        } else {
            mma_f16_k16(a, b0, b1, acc);
        }
    }
};
