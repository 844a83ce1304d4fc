// Attention split partials on tensor cores (mma.sync m16n8k16, f16 or bf16 in, f32 out): the GPU's own
// arithmetic (EXACTNESS.md), one kernel for prefill and decode rows. It writes the same partials
// as attn_split (attention.cu): [mx, l, o[0..HD)] per (row, head, split of AM_SPLIT positions),
// combined in split order by attn_combine.
//
// A block of 4 warps handles one (tile, KV head, split). A tile is `tpt` consecutive launch rows
// (tokens) times the G = n_heads / n_kv_heads query heads of KV head kvh: mma row i = j * G + hg
// (token j, head hg); rows past tpt * G are zero padding. Tokens of a tile that belong to other
// sequences are handled in further passes (one per sequence), each pass loading that sequence's
// KV. Warp w covers positions p0 + 16 w .. p0 + 16 w + 15 of the split:
//   1. S = Q K^T (two n-tiles of 8 positions, HD / 16 chained mma from +0; lane t's dimensions of
//      a k-step are 4t..4t+3 in both Q and K, so they use one permutation); s = S * scale,
//      positions past the row's own -> -inf. The mma input type follows the KV cache (kvfmt.cuh):
//      bf16 for a bf16 cache (Q and P rounded to bf16), else f16 (Q, P and an f32 or Q8_0 cache's
//      values rounded to f16 and clamped to +-65504: an f16 cache gives the same bits as f32).
//   2. mx = the row's max over the split (lane, quad xor, the 4 warps' maxima: exact in any order).
//   3. p = f16 or bf16 of expf(s - mx) (+0 for masked positions); the warp's l = its p (as f32) summed in a
//      fixed order (lane: n-tile, column; then quad xor 1, 2); the warp's o = P V, one mma per
//      n-tile from +0 (column g of n-tile nt = dimension g * NT + nt).
//   4. the split's l and o = the 4 warps' values added in warp order, written for live rows.
// A row's values depend only on its own q, pos and its sequence's KV: mma rows and columns are
// independent (KERNELS.md), masked positions enter P as +0 (times a finite V: written this step
// or earlier), and K / V past the tile's last position are never read (zeros instead). So the
// tile (tpt, the other tokens and sequences in it) and the launch never change a row's bits; the
// invariance gate (chunkings 1 / 7 / 64 / whole, random batches) checks it.

#define AM_SPLIT 64  // = ATTN_SPLIT of attention.cu
#define AM_WARPS 4

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

// 16-bit element e (0..3) of four packed values.
__device__ __forceinline__ u32 am_el(uint2 v, int e) {
    const u32 w = (e & 2) ? v.y : v.x;
    return (e & 1) ? (w >> 16) : (w & 0xffffu);
}

__device__ __forceinline__ float4 am_ld4(const float* p) { return __ldg((const float4*)p); }

template <int HD, typename F>
__device__ __forceinline__ void attn_mma_body(const float* __restrict__ Q, const u8* __restrict__ Kc,
                                              const u8* __restrict__ Vc, const u32* __restrict__ pos,
                                              const u32* __restrict__ row_seq, const u32* __restrict__ table_off,
                                              const u32* __restrict__ tables, float* __restrict__ part,
                                              u64 part_stride, u32 rows, u32 tpt, u32 n_heads, u32 n_kv_heads,
                                              u32 block_size, float scale) {
    constexpr int KS = HD / 16;  // k-steps of Q K^T
    constexpr int NT = HD / 8;   // n-tiles of P V
    constexpr int V4 = NT / 4;   // 4-value groups of V per position and lane
    constexpr bool BF = F::BF16;
    __shared__ float s_max[AM_WARPS][16];
    __shared__ float s_l[AM_WARPS][16];
    __shared__ float s_o[AM_WARPS][16][HD + 1];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const u32 G = n_heads / n_kv_heads;
    const u32 tile = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    const u32 r0 = tile * tpt;
    if (r0 >= rows) return;
    const u32 ntok = min(tpt, rows - r0);
    const u64 width = (u64)n_kv_heads * HD;
    const u64 rb = F::row_bytes(width);
    const float NEG_INF = -__int_as_float(0x7f800000);
    // This lane's two mma rows (g, g + 8): token and head, or none.
    u32 tok[2], head[2];
    bool real[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 i = (u32)g + 8 * h;
        tok[h] = i / G;
        head[h] = kvh * G + i % G;
        real[h] = tok[h] < ntok;
    }
    u32 last = 0;  // the tile's largest pos + 1
    for (u32 j = 0; j < ntok; ++j) last = max(last, pos[r0 + j] + 1);
    const u32 all = (ntok >= 32) ? 0xffffffffu : ((1u << ntok) - 1);
    // Splits blockIdx.y, blockIdx.y + gridDim.y, ... (the grid only bounds the parallelism).
    for (u32 split = blockIdx.y; split * AM_SPLIT < last; split += gridDim.y) {
        const u32 p0 = split * AM_SPLIT;
        u32 done = 0;
        while (done != all) {
            // One pass per sequence: the first token not yet done leads; its sequence's tokens join.
            const u32 lead = __ffs(~done) - 1;
            const u32 seq = row_seq[r0 + lead];
            u32 act = 0, nmax = 0;
            for (u32 j = lead; j < ntok; ++j) {
                if (!((done >> j) & 1u) && row_seq[r0 + j] == seq) {
                    act |= 1u << j;
                    nmax = max(nmax, pos[r0 + j] + 1);
                }
            }
            done |= act;
            if (p0 >= nmax) continue;  // uniform over the block
            const u32* tab = tables + table_off[seq];
            bool live[2];
            u32 lim[2];
    #pragma unroll
            for (int h = 0; h < 2; ++h) {
                live[h] = real[h] && ((act >> tok[h]) & 1u);
                lim[h] = live[h] ? pos[r0 + tok[h]] + 1 : 0;
            }
            // Q fragments: a[0] = (row g, dims 4t, 4t+1), a[1] = (row g + 8, ...), a[2] = (row g, 4t+2,
            // 4t+3), a[3] = (row g + 8, ...) of each k-step.
            u32 qa[KS][4];
    #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float* q = Q + ((u64)(r0 + tok[h]) * n_heads + head[h]) * HD + 4 * t;
    #pragma unroll
                for (int ks = 0; ks < KS; ++ks) {
                    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (live[h]) v = am_ld4(q + 16 * ks);
                    qa[ks][h] = am_pair<BF>(v.x, v.y);
                    qa[ks][h + 2] = am_pair<BF>(v.z, v.w);
                }
            }
            // 1. scores of this warp's 16 positions.
            const u32 pw = p0 + 16 * w;
            float s[2][4];
    #pragma unroll
            for (int nc = 0; nc < 2; ++nc) {
                const u32 p = pw + 8 * nc + g;  // column g of n-tile nc
                uint2 kv[KS];
                if (p < nmax) {
                    const u8* k = Kc + ((u64)tab[p / block_size] * block_size + p % block_size) * rb;
    #pragma unroll
                    for (int ks = 0; ks < KS; ++ks) kv[ks] = F::h4(k, kvh * HD + 4 * t + 16 * ks, (u32)width);
                } else {
    #pragma unroll
                    for (int ks = 0; ks < KS; ++ks) kv[ks] = make_uint2(0u, 0u);
                }
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
                for (int ks = 0; ks < KS; ++ks) am_mma<BF>(qa[ks], kv[ks].x, kv[ks].y, c);
    #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 pe = pw + 8 * nc + 2 * t + (e & 1);
                    s[nc][e] = pe < lim[e >> 1] ? __fmul_rn(c[e], scale) : NEG_INF;
                }
            }
            // V of this warp's positions pw + 2t, + 1, + 8, + 9 at dimensions g * NT .. g * NT + NT - 1.
            uint2 vv[4][V4];
    #pragma unroll
            for (int q4 = 0; q4 < 4; ++q4) {
                const u32 p = pw + 2 * t + (q4 & 1) + 8 * (q4 >> 1);
                if (p < nmax) {
                    const u8* v = Vc + ((u64)tab[p / block_size] * block_size + p % block_size) * rb;
    #pragma unroll
                    for (int i = 0; i < V4; ++i) vv[q4][i] = F::h4(v, kvh * HD + g * NT + 4 * i, (u32)width);
                } else {
    #pragma unroll
                    for (int i = 0; i < V4; ++i) vv[q4][i] = make_uint2(0u, 0u);
                }
            }
            // 2. the rows' maxima over the split.
            float m[2];
    #pragma unroll
            for (int h = 0; h < 2; ++h) {
                m[h] = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
                m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 1));
                m[h] = fmaxf(m[h], __shfl_xor_sync(FULL_MASK, m[h], 2));
            }
            if (t == 0) {
                s_max[w][g] = m[0];
                s_max[w][g + 8] = m[1];
            }
            __syncthreads();
    #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = g + 8 * h;
                m[h] = fmaxf(fmaxf(s_max[0][i], s_max[1][i]), fmaxf(s_max[2][i], s_max[3][i]));
            }
            // 3. p, the warp's l and o.
            u32 pa[4];  // P as the A fragment of one k-step: (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
            float l[2] = {0.0f, 0.0f};
    #pragma unroll
            for (int nc = 0; nc < 2; ++nc) {
    #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float e0 = s[nc][2 * h] == NEG_INF ? 0.0f : expf(s[nc][2 * h] - m[h]);
                    const float e1 = s[nc][2 * h + 1] == NEG_INF ? 0.0f : expf(s[nc][2 * h + 1] - m[h]);
                    const u32 ph = am_pair<BF>(e0, e1);
                    pa[2 * nc + h] = ph;
                    l[h] = __fadd_rn(__fadd_rn(l[h], am_f32<BF>(ph & 0xffffu)), am_f32<BF>(ph >> 16));
                }
            }
    #pragma unroll
            for (int h = 0; h < 2; ++h) {
                l[h] = __fadd_rn(l[h], __shfl_xor_sync(FULL_MASK, l[h], 1));
                l[h] = __fadd_rn(l[h], __shfl_xor_sync(FULL_MASK, l[h], 2));
            }
            if (t == 0) {
                s_l[w][g] = l[0];
                s_l[w][g + 8] = l[1];
            }
    #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                // Column g of n-tile nt is dimension g * NT + nt: element nt of this lane's V run.
                u32 vx[4];
    #pragma unroll
                for (int q4 = 0; q4 < 4; ++q4) vx[q4] = am_el(vv[q4][nt / 4], nt & 3);
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                am_mma<BF>(pa, vx[0] | (vx[1] << 16), vx[2] | (vx[3] << 16), c);
                // c: (row g, col 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) -> dimension col * NT + nt.
                s_o[w][g][(2 * t) * NT + nt] = c[0];
                s_o[w][g][(2 * t + 1) * NT + nt] = c[1];
                s_o[w][g + 8][(2 * t) * NT + nt] = c[2];
                s_o[w][g + 8][(2 * t + 1) * NT + nt] = c[3];
            }
            __syncthreads();
            // 4. the split's partial: warps added in order, written for live rows.
            for (u32 x = threadIdx.x; x < 16 * (HD + 2); x += blockDim.x) {
                const u32 i = x / (HD + 2), c = x % (HD + 2);
                const u32 j = i / G;
                if (j >= ntok || !((act >> j) & 1u) || p0 > pos[r0 + j]) continue;
                float v;
                if (c == 0) {
                    v = fmaxf(fmaxf(s_max[0][i], s_max[1][i]), fmaxf(s_max[2][i], s_max[3][i]));
                } else if (c == 1) {
                    v = __fadd_rn(__fadd_rn(__fadd_rn(s_l[0][i], s_l[1][i]), s_l[2][i]), s_l[3][i]);
                } else {
                    const u32 d = c - 2;
                    v = __fadd_rn(__fadd_rn(__fadd_rn(s_o[0][i][d], s_o[1][i][d]), s_o[2][i][d]), s_o[3][i][d]);
                }
                const u32 h = kvh * G + i % G;
                part[((u64)(r0 + j) * n_heads + h) * part_stride + (u64)split * (HD + 2) + c] = v;
            }
            __syncthreads();  // shared memory is reused by the next pass
        }
    }
}

// Grid: (ceil(rows / tpt) * n_kv_heads, up to the splits of the launch's longest row), 128 threads.
// One kernel per head size and KV format: attn_mma_h<HD>_<fmt>.
#define ATTN_MMA_KERNEL(suffix, HD, FMT)                                                                    \
    extern "C" __global__ void __launch_bounds__(128) attn_mma_##suffix(                                    \
        const float* Q, const u8* Kc, const u8* Vc, const u32* pos, const u32* row_seq,                     \
        const u32* table_off, const u32* tables, float* part, u64 part_stride, u32 rows, u32 tpt,           \
        u32 n_heads, u32 n_kv_heads, u32 block_size, float scale) {                                         \
        attn_mma_body<HD, FMT>(Q, Kc, Vc, pos, row_seq, table_off, tables, part, part_stride, rows, tpt,    \
                               n_heads, n_kv_heads, block_size, scale);                                     \
    }

ATTN_MMA_KERNEL(h64_f32, 64, KvF32)
ATTN_MMA_KERNEL(h64_f16, 64, KvF16)
ATTN_MMA_KERNEL(h64_bf16, 64, KvBF16)
ATTN_MMA_KERNEL(h64_q8_0, 64, KvQ8)
ATTN_MMA_KERNEL(h128_f32, 128, KvF32)
ATTN_MMA_KERNEL(h128_f16, 128, KvF16)
ATTN_MMA_KERNEL(h128_bf16, 128, KvBF16)
ATTN_MMA_KERNEL(h128_q8_0, 128, KvQ8)
