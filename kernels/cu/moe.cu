// Mixture-of-experts routing and combination (issue 16; engine/src/backend/cuda/moe.rs drives
// them around the expert products mmq_id_<type> / matmul_id_<type> / mmq_grouped_<type>).
// moe_route and moe_combine are per row: a row's results depend on its own router logits and
// expert outputs only; moe_group only sorts pair indices (integers, one possible result).

// Most experts a router may have (the shared-memory arrays of moe_route; the host checks).
#define MOE_MAX_E 1024
// Most experts per row (one per lane; the host checks).
#define MOE_MAX_K 32
#define MOE_NONE 0xffffffffu

// Whether candidate (pa, ia) ranks before (pb, ib): the higher probability, equal ones the lower
// expert index; a missing candidate (MOE_NONE) never ranks first.
__device__ __forceinline__ bool moe_before(float pa, u32 ia, float pb, u32 ib) {
    if (ia == MOE_NONE) return false;
    if (ib == MOE_NONE) return true;
    return pa > pb || (pa == pb && ia < ib);
}

// One warp per row of E router logits L (blockDim 32, grid M): the softmax (max subtracted;
// the exponentials summed lane-strided in index order per lane, then a fixed xor tree), the k
// highest probabilities (equal ones: the lowest expert index first; k passes of a warp arg-max),
// divided by their sum (added in rank order) when `norm`, then sorted by expert index: ids and
// weights of row r at [r * k, r * k + k), ascending expert index (the order the CPU adds them).
extern "C" __global__ void __launch_bounds__(32) moe_route(const float* __restrict__ L, u32* __restrict__ ids,
                                                           float* __restrict__ wts, u32 E, u32 k, u32 norm) {
    pdl_entry();
    __shared__ float p[MOE_MAX_E];
    __shared__ u8 taken[MOE_MAX_E];
    __shared__ u32 rid[MOE_MAX_K];
    __shared__ float rw[MOE_MAX_K];
    const u32 row = blockIdx.x;
    const u32 lane = threadIdx.x;
    const float* l = L + (u64)row * E;
    float mx = __int_as_float(0xff800000);  // -inf
    for (u32 i = lane; i < E; i += 32) mx = fmaxf(mx, l[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
    float s = 0.0f;
    for (u32 i = lane; i < E; i += 32) {
        const float v = expf(__fsub_rn(l[i], mx));
        p[i] = v;
        taken[i] = 0;
        s = __fadd_rn(s, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, o));
    __syncwarp();
    for (u32 i = lane; i < E; i += 32) p[i] = __fdiv_rn(p[i], s);
    __syncwarp();
    for (u32 j = 0; j < k; ++j) {
        u32 bi = MOE_NONE;
        float bp = 0.0f;
        for (u32 i = lane; i < E; i += 32) {
            if (!taken[i] && moe_before(p[i], i, bp, bi)) {
                bi = i;
                bp = p[i];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u32 oi = __shfl_xor_sync(FULL_MASK, bi, o);
            const float op = __shfl_xor_sync(FULL_MASK, bp, o);
            if (moe_before(op, oi, bp, bi)) {
                bi = oi;
                bp = op;
            }
        }
        // Lane 0's pick for every lane (NaN probabilities order nothing; the pick is still an
        // untaken expert: k <= E leaves one, and a real candidate always beats MOE_NONE).
        bi = __shfl_sync(FULL_MASK, bi, 0);
        if (lane == 0) {
            taken[bi] = 1;
            rid[j] = bi;
            rw[j] = p[bi];
        }
        __syncwarp();
    }
    if (lane == 0) {
        if (norm) {
            float t = 0.0f;
            for (u32 j = 0; j < k; ++j) t = __fadd_rn(t, rw[j]);
            for (u32 j = 0; j < k; ++j) rw[j] = __fdiv_rn(rw[j], t);
        }
        // Insertion sort by expert index (k <= 32, ids distinct).
        for (u32 j = 1; j < k; ++j) {
            const u32 id = rid[j];
            const float w = rw[j];
            u32 i = j;
            while (i > 0 && rid[i - 1] > id) {
                rid[i] = rid[i - 1];
                rw[i] = rw[i - 1];
                --i;
            }
            rid[i] = id;
            rw[i] = w;
        }
        for (u32 j = 0; j < k; ++j) {
            ids[(u64)row * k + j] = rid[j];
            wts[(u64)row * k + j] = rw[j];
        }
    }
}

// Warps of moe_group (each owns a contiguous range of pairs).
#define MOE_GW 8

// The pairs of a grouped expert product (issue 16; products.cu, mmq_grouped_<type>), a
// deterministic counting sort of the P pair ids (each clamped to E - 1 as mmq_id does): writes
// order[0..P) = the pair indices sorted by expert, ascending pair index within an expert;
// offs[e] = the first of expert e's pairs in `order` (offs[E] = P); offs[E + 1 + e] = its first
// token tile of T pairs (each expert's pairs cut into ceil(count / T) tiles; offs[2 E + 1] = all
// tiles). One block of 32 * MOE_GW threads; warp w owns pairs [w P / GW, (w + 1) P / GW): its
// per-expert counts (a warp's equal ids found with __match_any_sync, the lowest lane adds them),
// then each expert's exclusive offset (experts in index order, then warps in order), then the
// warp walks its range again and each pair takes the next place of its expert (its rank among
// the warp's earlier equal lanes). Integers only: the result is unique.
extern "C" __global__ void __launch_bounds__(32 * MOE_GW) moe_group(const u32* __restrict__ ids,
                                                                   u32* __restrict__ order,
                                                                   u32* __restrict__ offs, u32 P, u32 E, u32 T) {
    pdl_entry();
    __shared__ u32 cnt[MOE_GW][MOE_MAX_E];
    __shared__ u32 base[MOE_MAX_E];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u32 e = lane; e < E; e += 32) cnt[warp][e] = 0;
    __syncwarp();
    const u32 lo = (u32)((u64)P * warp / MOE_GW), hi = (u32)((u64)P * (warp + 1) / MOE_GW);
    for (u32 q = lo; q < hi; q += 32) {
        const u32 p = q + lane;
        const bool ok = p < hi;
        const u32 e = ok ? min(ids[p], E - 1) : MOE_NONE;
        const u32 same = __match_any_sync(FULL_MASK, e);
        if (ok && lane == (u32)(__ffs(same) - 1)) cnt[warp][e] += __popc(same);
        __syncwarp();
    }
    __syncthreads();
    // Per expert: the warps' counts become exclusive offsets among the expert's pairs.
    for (u32 e = threadIdx.x; e < E; e += blockDim.x) {
        u32 s = 0;
        for (u32 w = 0; w < MOE_GW; ++w) {
            const u32 c = cnt[w][e];
            cnt[w][e] = s;
            s += c;
        }
        base[e] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 a = 0, t = 0;
        for (u32 e = 0; e < E; ++e) {
            const u32 c = base[e];
            offs[e] = a;
            offs[E + 1 + e] = t;
            base[e] = a;
            a += c;
            t += (c + T - 1) / T;
        }
        offs[E] = a;
        offs[2 * E + 1] = t;
    }
    __syncthreads();
    for (u32 q = lo; q < hi; q += 32) {
        const u32 p = q + lane;
        const bool ok = p < hi;
        const u32 e = ok ? min(ids[p], E - 1) : MOE_NONE;
        const u32 same = __match_any_sync(FULL_MASK, e);
        if (ok) order[base[e] + cnt[warp][e] + __popc(same & ((1u << lane) - 1))] = p;
        __syncwarp();
        if (ok && lane == (u32)(__ffs(same) - 1)) cnt[warp][e] += __popc(same);
        __syncwarp();
    }
}

// out[r][c] = sum over the row's k slots, in slot order (ascending expert index, moe_route),
// of wts[r][j] * Y[r * k + j][c], from +0: each product rounded, then added (the CPU's
// `o += w * v`). Grid-stride over M * H elements.
extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ wts,
                                       float* __restrict__ out, u32 M, u32 k, u32 H) {
    pdl_entry();
    const u64 n = (u64)M * H;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / H, c = i % H;
        float acc = 0.0f;
        for (u32 j = 0; j < k; ++j) {
            const u64 pr = r * k + j;
            acc = __fadd_rn(acc, __fmul_rn(wts[pr], Y[pr * H + c]));
        }
        out[i] = acc;
    }
}
