// Causal attention over the paged KV cache (any format of kvfmt.cuh, read as f32), split by a FIXED length in positions
// (flash-decoding): a query row's positions 0..=pos are cut into splits of ATTN_SPLIT positions
// starting at 0, so the split boundaries depend only on the row's own position.
//
// attn_split: one block of 4 warps per (row, head, split).
//   1. warp w scores positions p0 + 16w .. p0 + 16w + 15 of the split: lanes over dimensions
//      (dims lane, lane + 32, ... in order), then the fixed xor tree; s = dot * scale;
//   2. mx = the split's max score (exact whatever the order);
//   3. warp w walks its positions in order: l += e, o[d] += e * v_p[d] with e = expf(s - mx);
//   4. the split's (mx, l, o) = warp partials added in warp order, written to `part`.
// attn_combine (attn_mma.cu) folds the partials in split order.
// Nothing depends on the other rows, M or the launch: prefill and decode rows at the same
// position compute the same sequence. GQA: head h reads KV head h / (n_heads / n_kv_heads).
// head_dim <= 256. part: part_stride floats per (row, head) of the launch, split i at
// i * (head_dim + 2): [mx, l, o[0..head_dim)].
// Sliding window (`window` > 0; 0: none): a row sees positions lo ..= pos, lo = pos + 1 - window
// when pos + 1 > window, else 0 (the CPU's backend/cpu/attention.rs). The split grid stays the
// fixed one from position 0: the splits below lo's split lo / ATTN_SPLIT are never computed (their
// partial slots are left as they are; attn_combine starts at that split), and positions below
// lo inside that first split are skipped like positions past pos: their K and V are never read
// and they add nothing to the max, the sum or the weighted V. The first split holds lo <= pos, so
// no computed split is empty. So a row's bits depend only on its position, window and KV; with
// window 0 (or window >= pos + 1) the operations are exactly those of the unwindowed kernel.
// Image spans (`span` non-null, kvfmt.cuh attn_row_range): a row of a bidirectional image sees
// lo ..< n with lo = min(window lo, the image's start), n = max(pos + 1, the image's end); the
// same walk over those positions (the step holds the image's K and V). Null: the causal walk.

#define ATTN_SPLIT 64
#define ATTN_WARPS 4
#define ATTN_PER_WARP (ATTN_SPLIT / ATTN_WARPS)
#define ATTN_DPL 8  // most dimensions per lane


__device__ __forceinline__ float warp_sum_tree(float s) {
    s += __shfl_xor_sync(FULL_MASK, s, 16);
    s += __shfl_xor_sync(FULL_MASK, s, 8);
    s += __shfl_xor_sync(FULL_MASK, s, 4);
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    return s;
}

// The cache row of position p (kvfmt.cuh).
template <typename F>
__device__ __forceinline__ const u8* kv_row(const u8* cache, const u32* tab, u32 p, u32 block_size, u64 width) {
    return cache + ((u64)tab[p / block_size] * block_size + p % block_size) * F::row_bytes(width);
}

template <typename F>
__device__ __forceinline__ void attn_split_body(
    const float* __restrict__ Q, const u8* __restrict__ Kc, const u8* __restrict__ Vc,
    const u32* __restrict__ pos, const u32* __restrict__ row_seq, const u32* __restrict__ table_off,
    const u32* __restrict__ tables, float* __restrict__ part, u64 part_stride, u32 n_heads, u32 n_kv_heads,
    u32 head_dim, u32 block_size, float scale, u32 window, const u32* __restrict__ span) {
    __shared__ float sc[ATTN_SPLIT];
    __shared__ float wo[ATTN_WARPS][256];
    __shared__ float wl[ATTN_WARPS];
    const u32 rh = blockIdx.x;  // row * n_heads + head
    const u32 r = rh / n_heads, h = rh % n_heads;
    u32 lo, n;  // the row sees positions lo ..< n
    attn_row_range(span, r, pos[r], window, lo, n);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const u32 kvh = h / (n_heads / n_kv_heads);
    const u64 width = (u64)n_kv_heads * head_dim;
    const u32* tab = tables + table_off[row_seq[r]];
    const float* q = Q + (u64)rh * head_dim;
    float qv[ATTN_DPL];
#pragma unroll
    for (int j = 0; j < ATTN_DPL; ++j) {
        const u32 d = lane + 32 * j;
        qv[j] = d < head_dim ? q[d] : 0.0f;
    }
    // Splits s0 + blockIdx.y, s0 + blockIdx.y + gridDim.y, ... from the window's first split s0
    // (the grid only bounds the parallelism).
    for (u32 split = lo / ATTN_SPLIT + blockIdx.y; split * ATTN_SPLIT < n; split += gridDim.y) {
        const u32 p0 = split * ATTN_SPLIT;
        const u32 p1 = min(p0 + ATTN_SPLIT, n);
        const u32 j0 = lo > p0 ? lo - p0 : 0u;  // the first position seen, relative to p0
        // 1. scores. Every lane first forms its partial dot product of all its positions
        // (independent chains, every load in flight at once), then the 16 xor trees run
        // interleaved: the same operations per position as one position at a time.
        const u32 a0 = p0 + w * ATTN_PER_WARP;
        const u32 cnt = p1 > a0 ? min((u32)ATTN_PER_WARP, p1 - a0) : 0;
        float sp[ATTN_PER_WARP];
#pragma unroll
        for (u32 i = 0; i < ATTN_PER_WARP; ++i) {
            sp[i] = 0.0f;
            if (i < cnt && a0 + i >= lo) {
                const u8* k = kv_row<F>(Kc, tab, a0 + i, block_size, width);
#pragma unroll
                for (int j = 0; j < ATTN_DPL; ++j) {
                    const u32 d = lane + 32 * j;
                    if (d < head_dim) sp[i] = __fmaf_rn(qv[j], F::ld(k, kvh * head_dim + d, (u32)width), sp[i]);
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (u32 i = 0; i < ATTN_PER_WARP; ++i) sp[i] += __shfl_xor_sync(FULL_MASK, sp[i], o);
        if (lane == 0) {
#pragma unroll
            for (u32 i = 0; i < ATTN_PER_WARP; ++i)
                if (i < cnt && a0 + i >= lo) sc[a0 + i - p0] = __fmul_rn(sp[i], scale);
        }
        __syncthreads();
        // 2. the split's max (exact whatever the order): two scores per lane, then the warp's
        // xor tree.
        float mx = -__int_as_float(0x7f800000);
        if ((u32)lane >= j0 && (u32)lane < p1 - p0) mx = sc[lane];
        if ((u32)lane + 32 >= j0 && (u32)lane + 32 < p1 - p0) mx = fmaxf(mx, sc[lane + 32]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
        // 3. this warp's weighted V sum, in position order (loads first, then the chains).
        float o[ATTN_DPL];
#pragma unroll
        for (int j = 0; j < ATTN_DPL; ++j) o[j] = 0.0f;
        float l = 0.0f;
#pragma unroll
        for (u32 i = 0; i < ATTN_PER_WARP; ++i) {
            if (i < cnt && a0 + i >= lo) {
                const u32 p = a0 + i;
                const float e = expf(sc[p - p0] - mx);
                l = __fadd_rn(l, e);
                const u8* v = kv_row<F>(Vc, tab, p, block_size, width);
#pragma unroll
                for (int j = 0; j < ATTN_DPL; ++j) {
                    const u32 d = lane + 32 * j;
                    if (d < head_dim) o[j] = __fmaf_rn(e, F::ld(v, kvh * head_dim + d, (u32)width), o[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < ATTN_DPL; ++j) {
            const u32 d = lane + 32 * j;
            if (d < head_dim) wo[w][d] = o[j];
        }
        if (lane == 0) wl[w] = l;
        __syncthreads();
        // 4. warp partials in warp order.
        float* dst = part + (u64)rh * part_stride + (u64)split * (head_dim + 2);
        for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float acc = wo[0][d];
            for (int k = 1; k < ATTN_WARPS; ++k) acc = __fadd_rn(acc, wo[k][d]);
            dst[2 + d] = acc;
        }
        if (threadIdx.x == 0) {
            float acc = wl[0];
            for (int k = 1; k < ATTN_WARPS; ++k) acc = __fadd_rn(acc, wl[k]);
            dst[0] = mx;
            dst[1] = acc;
        }
        __syncthreads();  // sc / wo are reused by the next split
    }
}

// The split kernels per KV format: attn_split_<fmt>. Grid: (rows x n_heads,
// up to the splits a row computes), 128 threads.
#define ATTN_SPLIT_KERNEL(suffix, FMT)                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_split_##suffix(                                     \
        const float* Q, const u8* Kc, const u8* Vc, const u32* pos, const u32* row_seq, const u32* table_off,  \
        const u32* tables, float* part, u64 part_stride, u32 n_heads, u32 n_kv_heads, u32 head_dim,           \
        u32 block_size, float scale, u32 window, const u32* span) { pdl_entry();                               \
        attn_split_body<FMT>(Q, Kc, Vc, pos, row_seq, table_off, tables, part, part_stride, n_heads,           \
                             n_kv_heads, head_dim, block_size, scale, window, span);                          \
    }
ATTN_SPLIT_KERNEL(f32, KvF32)
ATTN_SPLIT_KERNEL(f16, KvF16)
ATTN_SPLIT_KERNEL(bf16, KvBF16)
ATTN_SPLIT_KERNEL(q8_0, KvQ8)
