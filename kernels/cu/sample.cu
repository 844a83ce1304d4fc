// Token selection on the device, exactly as engine/src/sampling.rs picks on the host.
//
// argmax_rows: greedy. out[r] = the lowest index of the largest logit of row r; NaN and -inf
// never win (the host's `v > best` from best = -inf); a row with no winner gives 0. One block of
// ARGMAX_T threads per row; each thread scans its share in increasing index order keeping its
// first maximum; the threads' candidates are then folded (warp shuffles, then the warps' in
// shared memory) preferring the larger value, then the lower index: a total order, so any split
// of the row among the threads, and any fold order, gives the same winner. A row of a multiple
// of 4 floats at a 16-byte address (every vocabulary) is read as float4, 8 of them in flight per
// thread: thread t takes floats 4t .. 4t + 3, then 4t + 4 ARGMAX_T ..; a 262,144-float row is 8
// rounds of loads (with 256 threads and 4 in flight it was 64 dependent L2 round trips, ~39 us).
#define ARGMAX_T 1024
#define ARGMAX_NONE 0xffffffffu

__device__ __forceinline__ void argmax_take(float v, u32 i, float& bv, u32& bi) {
    if (v > bv) {
        bv = v;
        bi = i;
    }
}

__device__ __forceinline__ void argmax_take4(float4 v, u32 i4, float& bv, u32& bi) {
    argmax_take(v.x, 4 * i4, bv, bi);
    argmax_take(v.y, 4 * i4 + 1, bv, bi);
    argmax_take(v.z, 4 * i4 + 2, bv, bi);
    argmax_take(v.w, 4 * i4 + 3, bv, bi);
}

// (ov, oi) in place of (bv, bi) when it is preferred: a candidate (oi set) with the larger value,
// or an equal value and the lower index.
__device__ __forceinline__ void argmax_fold(float ov, u32 oi, float& bv, u32& bi) {
    if (oi != ARGMAX_NONE && (bi == ARGMAX_NONE || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
    }
}

__device__ __forceinline__ void argmax_warp(float& bv, u32& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const u32 oi = __shfl_xor_sync(FULL_MASK, bi, o);
        argmax_fold(ov, oi, bv, bi);
    }
}

// The argmax of the `width` floats at x, by the whole block (ARGMAX_T threads); thread 0 gets it.
__device__ __forceinline__ u32 argmax_block(const float* x, u32 width) {
    __shared__ float wv[ARGMAX_T / 32];
    __shared__ u32 wi[ARGMAX_T / 32];
    const u32 nt = blockDim.x;
    float bv = -__int_as_float(0x7f800000);
    u32 bi = ARGMAX_NONE;
    if ((width & 3) == 0 && ((u64)x & 15) == 0) {
        const float4* x4 = (const float4*)x;
        const u32 n4 = width / 4;
        u32 i = threadIdx.x;
        for (; i + 7 * nt < n4; i += 8 * nt) {
            float4 v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = x4[i + j * nt];
#pragma unroll
            for (int j = 0; j < 8; ++j) argmax_take4(v[j], i + j * nt, bv, bi);
        }
        for (; i < n4; i += nt) argmax_take4(x4[i], i, bv, bi);
    } else {
        for (u32 i = threadIdx.x; i < width; i += nt) argmax_take(x[i], i, bv, bi);
    }
    argmax_warp(bv, bi);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = nt / 32;
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? wv[lane] : 0.0f;
        bi = lane < nw ? wi[lane] : ARGMAX_NONE;
        argmax_warp(bv, bi);
    }
    return bi == ARGMAX_NONE ? 0u : bi;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_T) argmax_rows(const float* logits, u32* out, u32 width) {
    pdl_entry();
    const u32 t = argmax_block(logits + (u64)blockIdx.x * width, width);
    if (threadIdx.x == 0) out[blockIdx.x] = t;
}

// argmax_at: argmax_rows for n chosen rows in one launch (a step's greedy rows, a verify step's
// K + 1 among them): block j takes row rows[j] of the `width`-float rows at `logits` and writes
// its token to out[j * stride]. The same per-row code as argmax_rows, so the same token.
extern "C" __global__ void __launch_bounds__(ARGMAX_T) argmax_at(const float* logits, const u32* rows,
    u32 width, u32 stride, u32* out) {
    pdl_entry();
    const u32 j = blockIdx.x;
    const u32 t = argmax_block(logits + (u64)rows[j] * width, width);
    if (threadIdx.x == 0) out[(u64)j * stride] = t;
}

// penalize_row: the host's apply_penalties for one row. `tok`/`cnt` hold each distinct token of
// the history once with its count (so no two threads touch one logit); ids >= width are skipped.
// The same f32 operations in the same order (--fmad=false keeps `freq * n` rounded):
//   l = rep != 1 ? (l > 0 ? l / rep : l * rep) : l;   l = l - (pres + freq * (float)n).
extern "C" __global__ void __launch_bounds__(256) penalize_row(float* logits, const u32* tok,
    const u32* cnt, u32 n, u32 width, float rep, float pres, float freq) {
    pdl_entry();
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u32 t = tok[i];
        if (t >= width) continue;
        float l = logits[t];
        if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
        l = l - (pres + freq * (float)cnt[i]);
        logits[t] = l;
    }
}

#define TOPK_MAX 1024

// The host's candidate order as one unsigned 64-bit key, larger first: the scaled logit
// v = l / temperature mapped so that unsigned order is f32::total_cmp order, then the id
// ascending (0xffffffff - id). Keys are unique per id and never 0.
__device__ __forceinline__ u64 cand_key(float l, float temperature, u32 id) {
    const u32 b = __float_as_uint(l / temperature);
    const u32 ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)ord << 32) | (u64)(0xffffffffu - id);
}

// topk_row: the first k candidates of the host sampler's sorted list for one row of `width`
// logits (NaN excluded; k <= TOPK_MAX; fewer when fewer are not NaN). Writes out[0] = count,
// out[1 .. 1 + count] = the ids in order, out[1 + kmax .. 1 + kmax + count] = their logits' bits
// (the unscaled, penalized values: the host finishes with sampling::sample on them).
// Radix select over the 64-bit keys (up to 8 passes of 8 bits, integer histograms:
// order-independent), then the k keys >= the k-th are gathered and bitonic-sorted. One block of
// 1024 threads. Two shortcuts that leave the result alone: the passes stop as soon as the k-th
// key is the last of its digit's bin (then the keys at or above that bin's lowest value are
// exactly the k wanted: usually after 2 or 3 passes, each of which reads the row once), and
// the sort covers the first power of two >= k slots, not all TOPK_MAX (the others hold 0).
__device__ __forceinline__ void topk_block(const float* logits, u32 width, float temperature,
    u32 k, u32 kmax, u32* out) {
    __shared__ u64 keys[TOPK_MAX];
    __shared__ u32 hist[256];
    __shared__ u32 s_valid, s_count, s_remaining, s_done;
    __shared__ u64 s_prefix;
    if (threadIdx.x == 0) {
        s_valid = 0;
        s_count = 0;
        s_prefix = 0;
        s_done = 0;
    }
    __syncthreads();
    u32 valid = 0;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) valid += logits[i] == logits[i] ? 1u : 0u;
    atomicAdd(&s_valid, valid);
    __syncthreads();
    const u32 want = k < s_valid ? k : s_valid;
    if (threadIdx.x == 0) s_remaining = want;
    u64 mask = 0;
    for (int shift = 56; shift >= 0 && want > 0; shift -= 8) {
        if (threadIdx.x < 256) hist[threadIdx.x] = 0;
        __syncthreads();
        const u64 prefix = s_prefix;
        // Lanes of a warp with the same digit add once, by the lowest of them: the first
        // passes put most of the row in a few bins, and shared atomics on one address
        // serialize. Every lane of the block takes every round (the bound is uniform).
        for (u32 base = 0; base < width; base += blockDim.x) {
            const u32 i = base + threadIdx.x;
            u32 bin = 256;
            if (i < width) {
                const float l = logits[i];
                if (l == l) {
                    const u64 key = cand_key(l, temperature, i);
                    if ((key & mask) == prefix) bin = (u32)(key >> shift) & 255u;
                }
            }
            const u32 same = __match_any_sync(FULL_MASK, bin);
            if (bin < 256 && (threadIdx.x & 31u) == (u32)(__ffs(same) - 1))
                atomicAdd(&hist[bin], (u32)__popc(same));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 acc = 0;
            for (int d = 255; d >= 0; --d) {
                if (acc + hist[d] >= s_remaining) {
                    s_prefix = prefix | ((u64)d << shift);
                    // The bin holds exactly the keys still wanted: every key >= s_prefix (its
                    // lower digits 0) is one of the `want`, and no other key is.
                    s_done = acc + hist[d] == s_remaining ? 1u : 0u;
                    s_remaining -= acc;
                    break;
                }
                acc += hist[d];
            }
        }
        mask |= (u64)255 << shift;
        __syncthreads();
        if (s_done) break;
    }
    // Exactly `want` keys are >= s_prefix (after all 8 passes it is the want-th largest key).
    for (u32 j = threadIdx.x; j < TOPK_MAX; j += blockDim.x) keys[j] = 0;
    __syncthreads();
    const u64 thr = s_prefix;
    if (want > 0) {
        for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
            const float l = logits[i];
            if (l != l) continue;
            const u64 key = cand_key(l, temperature, i);
            if (key >= thr) {
                const u32 slot = atomicAdd(&s_count, 1u);
                if (slot < TOPK_MAX) keys[slot] = key;
            }
        }
    }
    __syncthreads();
    // Bitonic sort of the first n slots, descending (padding keys are 0, the smallest): the
    // `want` keys are in slots below want <= n, the rest of the n are 0.
    u32 n = 2;
    while (n < want) n <<= 1;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < n; t += blockDim.x) {
                const u32 o = t ^ stride;
                if (o > t) {
                    const u64 a = keys[t], b = keys[o];
                    const bool desc = (t & size) == 0;
                    if (desc ? (a < b) : (a > b)) {
                        keys[t] = b;
                        keys[o] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (u32 j = threadIdx.x; j < want; j += blockDim.x) {
        const u32 id = 0xffffffffu - (u32)(keys[j] & 0xffffffffu);
        out[1 + j] = id;
        out[1 + kmax + j] = __float_as_uint(logits[id]);
    }
    if (threadIdx.x == 0) out[0] = want;
}

extern "C" __global__ void __launch_bounds__(1024) topk_row(const float* logits, u32 width,
    float temperature, u32 k, u32 kmax, u32* out) {
    pdl_entry();
    topk_block(logits, width, temperature, k, kmax, out);
}

// topk_rows: topk_row for n rows in one launch (a step's sampled rows, a verify step's K + 1
// among them), one block per entry, the blocks side by side on the SMs: block j reads
// desc[3j .. 3j + 3] = (row of the `width`-float rows at `logits`, k, temperature's f32 bits) and
// writes topk_row's layout at out + j * (1 + 2 * kmax). The same per-row code as topk_row, so the
// same candidates; a launch costs about one row's time instead of one per row.
extern "C" __global__ void __launch_bounds__(1024) topk_rows(const float* logits, const u32* desc,
    u32 width, u32 kmax, u32* out) {
    pdl_entry();
    const u32 j = blockIdx.x;
    const u32 row = desc[3 * j], k = desc[3 * j + 1];
    const float temperature = __uint_as_float(desc[3 * j + 2]);
    topk_block(logits + (u64)row * width, width, temperature, k, kmax, out + (u64)j * (1 + 2 * kmax));
}

// mask_rows: the host's apply_mask for `n` rows of a grammar-constrained launch, in place, before
// the penalties. `packed` is [n row indices | n masks of `words` u32 each]: entry j masks row
// packed[j] of the `width`-float rows at `logits` with the words at packed + n + j * words (bit
// i % 32 of word i / 32 allows token i; words >= (width + 31) / 32). A token not allowed becomes
// -inf. live[j] (zeroed by the caller) becomes 1 when an allowed token's logit, before the
// penalties, is neither NaN nor -inf: the host's sample_masked picks the lowest allowed id when
// it stays 0. Grid (x, n), 256 threads: a grid-stride loop over the row per y.
extern "C" __global__ void __launch_bounds__(256) mask_rows(float* logits, const u32* packed,
    u32 n, u32 width, u32 words, u32* live) {
    pdl_entry();
    const u32 j = blockIdx.y;
    if (j >= n) return;
    float* x = logits + (u64)packed[j] * width;
    const u32* m = packed + n + (u64)j * words;
    bool any = false;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        if ((m[i >> 5] >> (i & 31u)) & 1u) {
            const float v = x[i];
            if (v == v && v != -__int_as_float(0x7f800000)) any = true;
        } else {
            x[i] = -__int_as_float(0x7f800000);
        }
    }
    if (__syncthreads_or(any ? 1 : 0) && threadIdx.x == 0) atomicOr(&live[j], 1u);
}
