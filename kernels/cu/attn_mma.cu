// Attention on tensor cores (mma.sync m16n8k16, f16 or bf16 in, f32 out), flash-attention style:
// the GPU's own arithmetic (EXACTNESS.md), one warp program per (16 query rows, split of
// AM_SPLIT positions) for prefill and decode rows alike.
//
// A block of 4 warps handles one group of 4 tiles and one KV head. A tile is `tpt` consecutive
// launch rows (tokens) times the G = n_heads / n_kv_heads query heads of KV head kvh: mma row
// i = j * G + hg (token j, head hg); rows past tpt * G are zero padding. Warp w owns tile w of the
// group. Tokens of the group that belong to other sequences are handled in further passes (one
// per sequence), each pass reading that sequence's KV. Per split of a pass:
//   0. the block stages the split's K and V (64 positions x HD, the mma input type: bf16 for a bf16
//      cache, else f16 with f32 / Q8_0 values rounded and clamped to +-65504 by kvfmt.cuh) in
//      shared memory; positions at or past the pass's last are zeros (never read). f16 / bf16
//      caches are copied with cp.async; with `stages` = 2 the next split's copy is in flight while
//      this split is computed (double buffering, dynamic shared memory: am_smem_bytes);
//   1. S = Q K^T: 8 n-tiles of 8 positions, HD / 16 k-steps chained from +0 (ldmatrix fragments);
//      s = S * scale, positions past the row's own -> -inf;
//   2. m = the row's max over the split (lane, then quad xor 1, 2: exact in any order);
//   3. p = f16 or bf16 of expf(s - m) (+0 for masked positions); l = the p (as f32) summed in a
//      fixed order (lane: n-tile, column; then quad xor 1, 2); o = P V, one mma chain of the 4
//      k-steps of 16 positions per n-tile of 8 dimensions, from +0;
//   4. (m, l, o) is the split's partial. Split mode writes it per split (block y of the grid takes
//      a contiguous range of the pass's splits: y * ns / gridDim.y up to (y + 1) * ns / gridDim.y)
//      and attn_combine folds the partials in split order; fold mode (attn_mmaf) walks the splits in order inside the block and
//      folds each into the row's running (M, L, O) with attn_fold / attn_fold_o, the SAME
//      operations as attn_combine, then writes the folded state once (attn_combine `folded`).
// A row's values depend only on its own q, pos and its sequence's KV: mma rows and columns are
// independent (KERNELS.md), masked positions enter P as +0 (times a finite V: written this step
// or earlier), and K / V past the pass's last position are never read. So the tile, the other
// tokens and sequences in the block, the mode and the launch never change a row's bits; the
// kernels gate (every tiling, both modes) and the invariance gate (chunkings 1 / 7 / 64 / whole,
// random batches) check it.

// Sliding window (`window` > 0; 0: none): row r sees positions lo_r ..= pos_r, lo_r = pos_r + 1 - window when
// pos_r + 1 > window (kvfmt.cuh's attn_window_lo). Positions below lo_r are masked like those
// past pos_r; a split wholly below lo_r is not the row's (no partial: attn_combine starts at
// lo_r's split, fold mode leaves the row's state untouched); a pass stages zeros below its
// lowest lo (never reading those positions). So a row's bits still depend only on its own q,
// pos, window and KV. head_dim 256 (Gemma 3): split mode over f16 / bf16 caches only (fold
// mode's O and the register-staged formats would need too many registers).
// Image spans (`span` non-null, kvfmt.cuh attn_row_range): a row of a bidirectional image sees
// lo_r ..< n_r, widened to its whole image; the masks, the pass's staged range and the splits
// follow lo_r and n_r as above (the step holds the image's K and V). Null: the causal rows.

#define AM_SPLIT 64  // = ATTN_SPLIT of attention.cu
#define AM_WARPS 4
#define AM_PAD 8  // u16 of padding per staged row: ldmatrix rows land on distinct banks


// The running state of a row (M, L) folded with a split's (m, l); a and b weigh the old O and the
// split's o. M = -inf before the first split gives a = 0, b = 1: the first fold is exact.
__device__ __forceinline__ void attn_fold(float& M, float& L, float m, float l, float& a, float& b) {
    const float mn = fmaxf(M, m);
    a = expf(M - mn);
    b = expf(m - mn);
    L = __fmaf_rn(L, a, __fmul_rn(l, b));
    M = mn;
}

__device__ __forceinline__ float attn_fold_o(float O, float o, float a, float b) {
    return __fmaf_rn(O, a, __fmul_rn(o, b));
}

// Two f32 -> the mma input type (lo in the low half).
template <bool BF>
__device__ __forceinline__ u32 am_pair(float lo, float hi) {
    return BF ? b2_rn(lo, hi) : h2_sat(lo, hi);
}

// A 16-bit mma input as f32.
template <bool BF>
__device__ __forceinline__ float am_f32(u32 h) {
    return BF ? bf16_to_f32((u16)h) : f16_to_f32((u16)h);
}

template <bool BF>
__device__ __forceinline__ void am_mma(const u32 a[4], u32 b0, u32 b1, float c[4]) {
    if (BF)
        mma_bf16_k16(a, b0, b1, c);
    else
        mma_f16_k16(a, b0, b1, c);
}

// S for n-tile nc (positions p0 + 8 nc ..) of the warp's 16 rows: the KS k-steps chained from +0,
// scaled; positions at or past a row's limit -> -inf. s[e]: row g + 8 (e >> 1), position
// p0 + 8 nc + 2t + (e & 1).
template <int HD, bool BF>
__device__ __forceinline__ void am_scores(float s[4], const u16* sk, const u32 (*qa)[4], int nc, u32 p0,
                                          const u32 lim[2], const u32 lo[2], float scale) {
    constexpr int LD = HD + AM_PAD;
    const int lane = threadIdx.x & 31, t = lane & 3;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const u16* kr = sk + (nc * 8 + (lane & 7)) * LD + 8 * (lane >> 3);
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks += 2) {
        u32 b[4];
        ldsm_x4(b, kr + 16 * ks);
        am_mma<BF>(qa[ks], b[0], b[1], c);
        am_mma<BF>(qa[ks + 1], b[2], b[3], c);
    }
    const float NEG_INF = -__int_as_float(0x7f800000);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const u32 pe = p0 + nc * 8 + 2 * t + (e & 1);
        s[e] = pe < lim[e >> 1] && pe >= lo[e >> 1] ? __fmul_rn(c[e], scale) : NEG_INF;
    }
}

// p of one n-tile's scores against the rows' maxima: the mma input pair per row h (+0 where
// masked), as placed in the P V A fragment.
template <bool BF>
__device__ __forceinline__ u32 am_p(const float s[4], int h, float m) {
    const float NEG_INF = -__int_as_float(0x7f800000);
    const float x0 = s[2 * h], x1 = s[2 * h + 1];
    const float e0 = x0 == NEG_INF ? 0.0f : expf(x0 - m);
    const float e1 = x1 == NEG_INF ? 0.0f : expf(x1 - m);
    return am_pair<BF>(e0, e1);
}

// l of the rows from the P fragments: per lane the p (as f32) of n-tiles 0..7 in order, then the
// quad (xor 1, 2).
template <bool BF>
__device__ __forceinline__ void am_l(float l[2], const u32 pa[4][4]) {
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int nc = 0; nc < 8; ++nc) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 ph = pa[nc >> 1][(nc & 1) * 2 + h];
            l[h] = __fadd_rn(__fadd_rn(l[h], am_f32<BF>(ph & 0xffffu)), am_f32<BF>(ph >> 16));
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] = __fadd_rn(l[h], __shfl_xor_sync(FULL_MASK, l[h], 1));
        l[h] = __fadd_rn(l[h], __shfl_xor_sync(FULL_MASK, l[h], 2));
    }
}

// o of n-tiles nt, nt + 1 (dimensions 8 nt ..) = P V: the split's 4 k-steps chained from +0.
// o0 / o1: (row g, dims 8 nt + 2t, + 1), (row g + 8, ...); o1 at n-tile nt + 1.
template <int HD, bool BF>
__device__ __forceinline__ void am_pv(float o0[4], float o1[4], const u16* sv, const u32 pa[4][4], int nt) {
    constexpr int LD = HD + AM_PAD;
    const int lane = threadIdx.x & 31;
    const u16* vr = sv + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
#pragma unroll
    for (int e = 0; e < 4; ++e) o0[e] = o1[e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        u32 b[4];
        ldsm_x4_t(b, vr + 16 * kk * LD + 8 * nt);
        am_mma<BF>(pa[kk], b[0], b[1], o0);
        am_mma<BF>(pa[kk], b[2], b[3], o1);
    }
}

// Stages positions p0 .. p0 + AM_SPLIT - 1 of KV head kvh of the caches (zeros below lmin and from nmax on) as
// rows of LD u16, 8 values per 16-byte chunk; every thread of the block takes part. With BOTH the
// K and V loads are all in flight before the first store (more registers), else K, then V.
template <int HD, typename F>
__device__ __forceinline__ void am_load(uint4* x, const u8* __restrict__ cache, const u32* __restrict__ tab, u32 p0,
                                        u32 lmin, u32 nmax, u32 kvh, u32 block_size, u64 rb, u32 width) {
    constexpr int CH = HD / 8;
    constexpr int PER = AM_SPLIT * CH / (AM_WARPS * 32);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const u32 c = threadIdx.x + AM_WARPS * 32 * i;
        const u32 p = p0 + c / CH, d = kvh * HD + (c % CH) * 8;
        x[i] = make_uint4(0u, 0u, 0u, 0u);
        if (p < nmax && p >= lmin) {
            const u8* row = cache + ((u64)tab[p / block_size] * block_size + p % block_size) * rb;
            x[i] = F::h8(row, d, width);
        }
    }
}

template <int HD>
__device__ __forceinline__ void am_store(u16* dst, const uint4* x) {
    constexpr int CH = HD / 8;
    constexpr int LD = HD + AM_PAD;
    constexpr int PER = AM_SPLIT * CH / (AM_WARPS * 32);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const u32 c = threadIdx.x + AM_WARPS * 32 * i;
        *(uint4*)(dst + (c / CH) * LD + (c % CH) * 8) = x[i];
    }
}

// The same positions of an f16 / bf16 cache (F::DIRECT) copied with cp.async (zeros below lmin and from nmax on,
// nothing read there); the caller commits and waits.
template <int HD, typename F>
__device__ __forceinline__ void am_issue(u16* dst, const u8* __restrict__ cache, const u32* __restrict__ tab, u32 p0,
                                         u32 lmin, u32 nmax, u32 kvh, u32 block_size, u64 rb) {
    constexpr int CH = HD / 8;
    constexpr int LD = HD + AM_PAD;
    constexpr int PER = AM_SPLIT * CH / (AM_WARPS * 32);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const u32 c = threadIdx.x + AM_WARPS * 32 * i;
        const u32 p = p0 + c / CH, d = kvh * HD + (c % CH) * 8;
        const bool in = p < nmax && p >= lmin;
        const u8* src = cache;
        if (in) src = cache + ((u64)tab[p / block_size] * block_size + p % block_size) * rb + 2 * (u64)d;
        cp_async16_zfill(dst + (c / CH) * LD + (c % CH) * 8, src, in);
    }
}

template <int HD, typename F, bool BOTH>
__device__ __forceinline__ void am_stage(u16* sk, u16* sv, const u8* __restrict__ Kc, const u8* __restrict__ Vc,
                                         const u32* __restrict__ tab, u32 p0, u32 lmin, u32 nmax, u32 kvh,
                                         u32 block_size, u64 rb, u32 width) {
    constexpr int PER = AM_SPLIT * (HD / 8) / (AM_WARPS * 32);
    uint4 xk[PER];
    am_load<HD, F>(xk, Kc, tab, p0, lmin, nmax, kvh, block_size, rb, width);
    if (BOTH) {
        uint4 xv[PER];
        am_load<HD, F>(xv, Vc, tab, p0, lmin, nmax, kvh, block_size, rb, width);
        am_store<HD>(sk, xk);
        am_store<HD>(sv, xv);
    } else {
        am_store<HD>(sk, xk);
        am_load<HD, F>(xk, Vc, tab, p0, lmin, nmax, kvh, block_size, rb, width);
        am_store<HD>(sv, xk);
    }
}

template <int HD, typename F, bool FOLD>
__device__ __forceinline__ void attn_mma_body(const float* __restrict__ Q, const u8* __restrict__ Kc,
                                              const u8* __restrict__ Vc, const u32* __restrict__ pos,
                                              const u32* __restrict__ row_seq, const u32* __restrict__ table_off,
                                              const u32* __restrict__ tables, float* __restrict__ part,
                                              u64 part_stride, u32 rows, u32 tpt, u32 n_heads, u32 n_kv_heads,
                                              u32 block_size, float scale, u32 stages, u32 wide_ok, u32 window,
                                              const u32* __restrict__ span) {
    constexpr int KS = HD / 16;  // k-steps of Q K^T
    constexpr int NT = HD / 8;   // n-tiles of P V
    constexpr int LD = HD + AM_PAD;
    constexpr int TILE = AM_SPLIT * LD;  // u16 of one staged K or V tile
    constexpr bool BF = F::BF16;
    // Buffer b: K tile at am_smem + 2 b TILE, V tile after it (b = 0 only, unless double-buffered).
    extern __shared__ __align__(16) u16 am_smem[];
    __shared__ float wide_m[AM_WARPS][16];   // wide: each warp's row maxima over its positions
    __shared__ uint4 wide_p[AM_WARPS][32];   // wide: warp w's lanes' P fragments of k-step w
    const bool pipe = F::DIRECT && stages > 1;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 G = n_heads / n_kv_heads;
    const u32 per_block = AM_WARPS * tpt;
    const u32 groups = (rows + per_block - 1) / per_block;
    const u32 bx = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    if (bx >= groups) return;
    // Fold mode starts the longest (last) groups first.
    const u32 b0 = (FOLD ? groups - 1 - bx : bx) * per_block;  // the block's first row
    const u32 bt = min(per_block, rows - b0);                   // the block's tokens (<= 64)
    // Wide (split mode, the block's tokens all in tile 0: decode at batch 1): the 4 warps share
    // tile 0's rows and split each split's work (n-tiles of S and of P V) between them.
    const bool wide = !FOLD && wide_ok && bt <= tpt;
    const u32 wt0 = wide ? 0 : w * tpt;                          // this warp's first token in the block
    const u32 ntok = wt0 < bt ? min(tpt, bt - wt0) : 0;
    const u64 width = (u64)n_kv_heads * HD;
    const u64 rb = F::row_bytes(width);
    const float NEG_INF = -__int_as_float(0x7f800000);
    // This lane's two mma rows (g, g + 8): token (in the block) and head, or none.
    u32 tok[2], head[2], lim0[2], lo0[2];
    bool real[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 i = (u32)g + 8 * h;
        tok[h] = wt0 + i / G;
        head[h] = kvh * G + i % G;
        real[h] = i / G < ntok;
        lim0[h] = lo0[h] = 0;
        if (real[h]) attn_row_range(span, b0 + tok[h], pos[b0 + tok[h]], window, lo0[h], lim0[h]);
    }
    // Lane j knows block tokens j and j + 32: sequence, first position seen and last + 1.
    const u32 ja = lane, jb = lane + 32;
    const u32 sa = ja < bt ? row_seq[b0 + ja] : 0xffffffffu, sb = jb < bt ? row_seq[b0 + jb] : 0xffffffffu;
    u32 la = 0, lb = 0, na = 0, nb = 0;
    if (ja < bt) attn_row_range(span, b0 + ja, pos[b0 + ja], window, la, na);
    if (jb < bt) attn_row_range(span, b0 + jb, pos[b0 + jb], window, lb, nb);
    unsigned long long todo = bt >= 64 ? ~0ull : ((1ull << bt) - 1);
    // Fold mode: the rows' running state (split mode leaves it unused).
    float M[2] = {NEG_INF, NEG_INF}, L[2] = {0.0f, 0.0f};
    float O[FOLD ? NT : 1][4];
#pragma unroll
    for (int nt = 0; nt < (FOLD ? NT : 1); ++nt) O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.0f;
    while (todo) {
        // One pass per sequence: the first token not yet done leads; its sequence's tokens join.
        const u32 seq = row_seq[b0 + (__ffsll((long long)todo) - 1)];
        const bool ina = sa == seq && ((todo >> ja) & 1ull), inb = sb == seq && ((todo >> jb) & 1ull);
        const unsigned long long act =
            ((unsigned long long)__ballot_sync(FULL_MASK, inb) << 32) | __ballot_sync(FULL_MASK, ina);
        todo &= ~act;
        u32 nmax = max(ina ? na : 0u, inb ? nb : 0u);  // the pass's largest pos + 1
        // The pass's lowest window start (0 without a window): nothing below it is staged.
        u32 lmin = min(ina ? la : 0xffffffffu, inb ? lb : 0xffffffffu);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            nmax = max(nmax, __shfl_xor_sync(FULL_MASK, nmax, o));
            lmin = min(lmin, __shfl_xor_sync(FULL_MASK, lmin, o));
        }
        const u32* tab = tables + table_off[seq];
        u32 lim[2], lo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lim[h] = real[h] && ((act >> tok[h]) & 1ull) ? lim0[h] : 0;
            lo[h] = lo0[h];
        }
        // Q fragments: a[0] = (row g, dims 2t, 2t+1), a[1] = (row g + 8, ...), a[2] = (row g, 2t+8,
        // 2t+9), a[3] = (row g + 8, ...) of each k-step of 16 dimensions.
        u32 qa[KS][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float* q = Q + ((u64)(b0 + tok[h]) * n_heads + head[h]) * HD + 2 * t;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                float2 lo = make_float2(0.0f, 0.0f), hi = lo;
                if (lim[h]) {
                    lo = __ldg((const float2*)(q + 16 * ks));
                    hi = __ldg((const float2*)(q + 16 * ks + 8));
                }
                qa[ks][h] = am_pair<BF>(lo.x, lo.y);
                qa[ks][h + 2] = am_pair<BF>(hi.x, hi.y);
            }
        }
        // Fold mode: every split of the pass in order; split mode: this block's range of splits
        // (of those from the pass's lowest window start; all of them without a window).
        const u32 ns = (nmax + AM_SPLIT - 1) / AM_SPLIT, s0 = lmin / AM_SPLIT;
        const u32 s_lo = FOLD ? s0 : s0 + (u32)((u64)blockIdx.y * (ns - s0) / gridDim.y);
        const u32 s_hi = FOLD ? ns : s0 + (u32)((u64)(blockIdx.y + 1) * (ns - s0) / gridDim.y);
        if (pipe && s_lo < s_hi) {
            __syncthreads();  // the previous pass's tiles are consumed
            am_issue<HD, F>(am_smem, Kc, tab, s_lo * AM_SPLIT, lmin, nmax, kvh, block_size, rb);
            am_issue<HD, F>(am_smem + TILE, Vc, tab, s_lo * AM_SPLIT, lmin, nmax, kvh, block_size, rb);
            cp_async_commit();
        }
        for (u32 split = s_lo; split < s_hi; ++split) {
            const u32 p0 = split * AM_SPLIT;
            u16* sk = am_smem + (pipe ? 2 * TILE * ((split - s_lo) & 1) : 0);
            u16* sv = sk + TILE;
            __syncthreads();  // the tiles staged next (the other buffer, or this one) are consumed
            if (pipe) {
                if (split + 1 < s_hi) {
                    u16* nk = am_smem + 2 * TILE * ((split + 1 - s_lo) & 1);
                    am_issue<HD, F>(nk, Kc, tab, p0 + AM_SPLIT, lmin, nmax, kvh, block_size, rb);
                    am_issue<HD, F>(nk + TILE, Vc, tab, p0 + AM_SPLIT, lmin, nmax, kvh, block_size, rb);
                    cp_async_commit();
                    cp_async_wait<1>();  // this split's group has landed
                } else {
                    cp_async_wait<0>();
                }
            } else if (F::DIRECT) {
                am_issue<HD, F>(sk, Kc, tab, p0, lmin, nmax, kvh, block_size, rb);
                am_issue<HD, F>(sv, Vc, tab, p0, lmin, nmax, kvh, block_size, rb);
                cp_async_commit();
                cp_async_wait<0>();
            } else {
                am_stage<HD, F, !FOLD>(sk, sv, Kc, Vc, tab, p0, lmin, nmax, kvh, block_size, rb, (u32)width);
            }
            __syncthreads();
            // The row's splits: below its pos, not wholly below its window.
            const bool mine[2] = {p0 < lim[0] && p0 + AM_SPLIT > lo[0], p0 < lim[1] && p0 + AM_SPLIT > lo[1]};
            if (!__any_sync(FULL_MASK, mine[0] || mine[1])) continue;  // uniform over the warp
            if (!FOLD && wide) {
                // The same values as the steps below, each computed by one warp: warp w takes
                // positions 16w .. 16w + 15 (n-tiles 2w, 2w + 1 of S, which are k-step w of P V)
                // and dimensions w HD / 4 .. of o; the maxima are exact in any order, and every
                // warp sums l from all the P fragments in the steps' order.
                float s2[2][4];
#pragma unroll
                for (int j = 0; j < 2; ++j) am_scores<HD, BF>(s2[j], sk, qa, 2 * w + j, p0, lim, lo, scale);
                float m[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m[h] = fmaxf(fmaxf(s2[0][2 * h], s2[0][2 * h + 1]), fmaxf(s2[1][2 * h], s2[1][2 * h + 1]));
                    m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 1));
                    m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 2));
                    if (t == 0) wide_m[w][g + 8 * h] = m[h];
                }
                __syncthreads();
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = g + 8 * h;
                    m[h] = fmaxf(fmaxf(wide_m[0][r], wide_m[1][r]), fmaxf(wide_m[2][r], wide_m[3][r]));
                }
                u32 mp[4];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) mp[j * 2 + h] = am_p<BF>(s2[j], h, m[h]);
                }
                wide_p[w][lane] = make_uint4(mp[0], mp[1], mp[2], mp[3]);
                __syncthreads();
                u32 pa[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const uint4 v = wide_p[kk][lane];
                    pa[kk][0] = v.x;
                    pa[kk][1] = v.y;
                    pa[kk][2] = v.z;
                    pa[kk][3] = v.w;
                }
                float l[2];
                am_l<BF>(l, pa);
                float* dst[2] = {nullptr, nullptr};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (!mine[h]) continue;
                    dst[h] = part + ((u64)(b0 + tok[h]) * n_heads + head[h]) * part_stride + (u64)split * (HD + 2);
                    if (w == 0 && t == 0) {
                        dst[h][0] = m[h];
                        dst[h][1] = l[h];
                    }
                }
#pragma unroll
                for (int nt = w * (NT / AM_WARPS); nt < (w + 1) * (NT / AM_WARPS); nt += 2) {
                    float o0[4], o1[4];
                    am_pv<HD, BF>(o0, o1, sv, pa, nt);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        if (!mine[h]) continue;
                        *(float2*)(dst[h] + 2 + 8 * nt + 2 * t) = make_float2(o0[2 * h], o0[2 * h + 1]);
                        *(float2*)(dst[h] + 2 + 8 * (nt + 1) + 2 * t) = make_float2(o1[2 * h], o1[2 * h + 1]);
                    }
                }
                continue;
            }
            // 1. scores of the split's 64 positions.
            float s[8][4];
#pragma unroll
            for (int nc = 0; nc < 8; ++nc) am_scores<HD, BF>(s[nc], sk, qa, nc, p0, lim, lo, scale);
            // 2. the rows' maxima over the split.
            float m[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m[h] = NEG_INF;
#pragma unroll
                for (int nc = 0; nc < 8; ++nc) m[h] = fmaxf(m[h], fmaxf(s[nc][2 * h], s[nc][2 * h + 1]));
                m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 1));
                m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 2));
            }
            // 3. p as the A fragments of the 4 k-steps of P V, and l.
            u32 pa[4][4];
#pragma unroll
            for (int nc = 0; nc < 8; ++nc) {
#pragma unroll
                for (int h = 0; h < 2; ++h) pa[nc >> 1][(nc & 1) * 2 + h] = am_p<BF>(s[nc], h, m[h]);
            }
            float l[2];
            am_l<BF>(l, pa);
            // 4. fold weights (fold mode) or the partial's destination (split mode).
            float fa[2] = {1.0f, 1.0f}, fb[2] = {0.0f, 0.0f};
            float* dst[2] = {nullptr, nullptr};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (!mine[h]) continue;
                if (FOLD) {
                    attn_fold(M[h], L[h], m[h], l[h], fa[h], fb[h]);
                } else {
                    dst[h] = part + ((u64)(b0 + tok[h]) * n_heads + head[h]) * part_stride + (u64)split * (HD + 2);
                    if (t == 0) {
                        dst[h][0] = m[h];
                        dst[h][1] = l[h];
                    }
                }
            }
            // o = P V, two n-tiles at a time.
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                float o0[4], o1[4];
                am_pv<HD, BF>(o0, o1, sv, pa, nt);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (!mine[h]) continue;
                    if (FOLD) {
                        constexpr int F0 = FOLD ? 1 : 0;  // O's n-tiles exist in fold mode only
                        O[nt * F0][2 * h] = attn_fold_o(O[nt * F0][2 * h], o0[2 * h], fa[h], fb[h]);
                        O[nt * F0][2 * h + 1] = attn_fold_o(O[nt * F0][2 * h + 1], o0[2 * h + 1], fa[h], fb[h]);
                        O[(nt + 1) * F0][2 * h] = attn_fold_o(O[(nt + 1) * F0][2 * h], o1[2 * h], fa[h], fb[h]);
                        O[(nt + 1) * F0][2 * h + 1] =
                            attn_fold_o(O[(nt + 1) * F0][2 * h + 1], o1[2 * h + 1], fa[h], fb[h]);
                    } else {
                        *(float2*)(dst[h] + 2 + 8 * nt + 2 * t) = make_float2(o0[2 * h], o0[2 * h + 1]);
                        *(float2*)(dst[h] + 2 + 8 * (nt + 1) + 2 * t) = make_float2(o1[2 * h], o1[2 * h + 1]);
                    }
                }
            }
        }
    }
    if (!FOLD) return;
    // Fold mode: the folded (M, L, O) of every real row as its one partial.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!real[h]) continue;
        float* d = part + ((u64)(b0 + tok[h]) * n_heads + head[h]) * part_stride;
        if (t == 0) {
            d[0] = M[h];
            d[1] = L[h];
        }
#pragma unroll
        for (int nt = 0; nt < (FOLD ? NT : 1); ++nt)
            *(float2*)(d + 2 + 8 * nt + 2 * t) = make_float2(O[nt][2 * h], O[nt][2 * h + 1]);
    }
}

// Grid: (ceil(rows / (4 tpt)) * n_kv_heads, up to the splits of the launch's longest row), 128
// threads, am_smem_bytes(HD, stages) of dynamic shared memory: attn_mma_h<HD>_<fmt> (split mode),
// attn_mmaf_h<HD>_<fmt> (fold mode, grid y = 1). stages: 2 double-buffers f16 / bf16 caches;
// wide: 1 lets a split-mode block whose tokens fit one tile spread each split over its 4 warps.
#define ATTN_MMA_KERNEL(suffix, HD, FMT, FOLD)                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_##suffix(                                        \
        const float* Q, const u8* Kc, const u8* Vc, const u32* pos, const u32* row_seq,                     \
        const u32* table_off, const u32* tables, float* part, u64 part_stride, u32 rows, u32 tpt,           \
        u32 n_heads, u32 n_kv_heads, u32 block_size, float scale, u32 stages, u32 wide, u32 window,         \
        const u32* span) { pdl_entry();                                                                      \
        attn_mma_body<HD, FMT, FOLD>(Q, Kc, Vc, pos, row_seq, table_off, tables, part, part_stride, rows,    \
                                     tpt, n_heads, n_kv_heads, block_size, scale, stages, wide, window,     \
                                     span);                                                                  \
    }
#define ATTN_MMA_SHAPES(M)                                                                        \
    M(mma_h64_f32, 64, KvF32, false) M(mma_h64_f16, 64, KvF16, false) M(mma_h64_bf16, 64, KvBF16, false)   \
    M(mma_h64_q8_0, 64, KvQ8, false) M(mma_h128_f32, 128, KvF32, false) M(mma_h128_f16, 128, KvF16, false) \
    M(mma_h128_bf16, 128, KvBF16, false) M(mma_h128_q8_0, 128, KvQ8, false)                                \
    M(mmaf_h64_f32, 64, KvF32, true) M(mmaf_h64_f16, 64, KvF16, true) M(mmaf_h64_bf16, 64, KvBF16, true)   \
    M(mmaf_h64_q8_0, 64, KvQ8, true) M(mmaf_h128_f32, 128, KvF32, true) M(mmaf_h128_f16, 128, KvF16, true) \
    M(mmaf_h128_bf16, 128, KvBF16, true) M(mmaf_h128_q8_0, 128, KvQ8, true)                                \
    M(mma_h256_f16, 256, KvF16, false) M(mma_h256_bf16, 256, KvBF16, false)

ATTN_MMA_SHAPES(ATTN_MMA_KERNEL)

// attn_combine: one block of 4 warps per (row, head) of `rows` rows, for the partials of every
// attention kernel (attn_split, attn_mma). The partials of splits 0 .. pos / 64 are
// folded in split order exactly as attn_fold / attn_fold_o do one after the other (the running
// state starts at M = -inf, L = 0, O = 0); with `folded` the one partial already is the folded
// state (attn_mmaf). Then out = O * (1 / L).
// Sliding window (`window` > 0, split partials of attn_split / attn_mma): the fold starts at the row's first split in the window, lo / 64 with
// lo = pos + 1 - window (attention.cu); the splits below it were never computed. Image spans
// (`span` non-null): splits lo / 64 .. of the row's widened range (attn_row_range).
// The partials are staged in shared memory CB chunks of splits at a time (coalesced loads). Per
// chunk, warp 0 forms the running maxima with an inclusive max scan (max is exact, so these are
// the running maxima of the sequential fold) and the weights a_i = expf(M_{i-1} - M_i), b_i =
// expf(m_i - M_i); lane 0 then chains L = fma(L, a_i, l_i b_i) and every thread chains its
// dimensions O = fma(O, a_i, o_i b_i), in split order: the sequential fold's operations.
// With Xh (head_dim a multiple of 32) the output is also prepared for the next product
// (prep.cuh): rows of kp columns, bf: bf16.
#define COMBINE_THREADS 128
#define COMBINE_STAGE 4160  // floats: 32 splits of head_dim <= 128, or 16 of head_dim <= 256
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attn_combine(
    const float* __restrict__ part, float* __restrict__ O, const u32* __restrict__ pos, u64 part_stride, u32 rows,
    u32 n_heads, u32 head_dim, u16* Xh, float* Xs, u32 kp, u32 bf, u32 folded, u32 window,
    const u32* __restrict__ span) {
    pdl_entry();
    __shared__ __align__(16) float so[COMBINE_STAGE];
    __shared__ float sa[32], sb[32], sl;
    const u32 gw = blockIdx.x;  // row * n_heads + head
    if (gw >= rows * n_heads) return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const u32 r = gw / n_heads;
    const float* src = part + (u64)gw * part_stride;
    const u32 st = head_dim + 2;
    const float NEG_INF = -__int_as_float(0x7f800000);
    float acc[2];  // dimensions threadIdx.x, threadIdx.x + 128
    float L = 0.0f;
    if (folded) {
        L = __ldg(src + 1);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const u32 d = threadIdx.x + COMBINE_THREADS * k;
            acc[k] = d < head_dim ? __ldg(src + 2 + d) : 0.0f;
        }
    } else {
        u32 rlo, rn;  // the row's positions rlo ..< rn (widened to its image, with spans)
        attn_row_range(span, r, pos[r], window, rlo, rn);
        const u32 ns = (rn + AM_SPLIT - 1) / AM_SPLIT;
        const u32 s0 = rlo / AM_SPLIT;
        const u32 cs = head_dim <= 128 ? 32 : 16;  // splits per chunk
        float M = NEG_INF;                         // warp 0: the running max
        acc[0] = acc[1] = 0.0f;
        // Chunk c0's partials (cs entries of st floats, st even) as float2 per thread, loaded
        // one chunk ahead: the next chunk's loads are in flight while this one is folded.
        constexpr int PRE = (COMBINE_STAGE / 2 + COMBINE_THREADS - 1) / COMBINE_THREADS;
        float2 pre[PRE];
        auto load = [&](u32 c0) {
            const u32 half = min(cs, ns - c0) * st / 2;
            const float2* s = (const float2*)(src + (u64)c0 * st);
#pragma unroll
            for (int k = 0; k < PRE; ++k) {
                const u32 x = threadIdx.x + COMBINE_THREADS * k;
                pre[k] = x < half ? __ldg(s + x) : make_float2(0.0f, 0.0f);
            }
        };
        load(s0);
        for (u32 c0 = s0; c0 < ns; c0 += cs) {
            const u32 n = min(cs, ns - c0);
            __syncthreads();  // the previous chunk is consumed
#pragma unroll
            for (int k = 0; k < PRE; ++k) {
                const u32 x = threadIdx.x + COMBINE_THREADS * k;
                if (x < n * st / 2) ((float2*)so)[x] = pre[k];
            }
            __syncthreads();
            if (c0 + cs < ns) load(c0 + cs);
            if (w == 0) {
                const float m = (u32)lane < n ? so[lane * st] : NEG_INF;
                float sc = m;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const float y = __shfl_up_sync(FULL_MASK, sc, o);
                    if (lane >= o) sc = fmaxf(sc, y);
                }
                const float mi = fmaxf(M, sc);  // the running max after split c0 + lane
                float prev = __shfl_up_sync(FULL_MASK, mi, 1);
                if (lane == 0) prev = M;
                if ((u32)lane < n) {
                    sa[lane] = expf(prev - mi);
                    sb[lane] = expf(m - mi);
                }
                M = __shfl_sync(FULL_MASK, mi, n - 1);
                __syncwarp();
                if (lane == 0)
                    for (u32 i = 0; i < n; ++i) L = __fmaf_rn(L, sa[i], __fmul_rn(so[i * st + 1], sb[i]));
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const u32 d = threadIdx.x + COMBINE_THREADS * k;
                if (d < head_dim)
                    for (u32 i = 0; i < n; ++i) acc[k] = attn_fold_o(acc[k], so[i * st + 2 + d], sa[i], sb[i]);
            }
        }
        if (threadIdx.x == 0) sl = L;
        __syncthreads();
        L = sl;
    }
    const float inv = 1.0f / L;
    float* out = O + (u64)gw * head_dim;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const u32 d = threadIdx.x + COMBINE_THREADS * k;
        const float v = __fmul_rn(acc[k], inv);
        if (d < head_dim) out[d] = v;
        // prep_store works on 32 consecutive dimensions: the warp's lanes.
        if (Xh && (d & ~31u) < head_dim) {
            const u32 col = (gw % n_heads) * head_dim + (d & ~31u);  // first column of this group
            prep_store(v, lane, Xh + (u64)r * kp + col, Xs + (u64)r * (kp / 32) + col / 32, bf);
        }
    }
}
