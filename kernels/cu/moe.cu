// Mixture-of-experts routing and combination (issue 16; engine/src/backend/cuda/moe.rs drives
// them around the expert products mmq_id_<type> / matmul_id_<type>). Both are per row: a row's
// results depend on its own router logits and expert outputs only.

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

// out[r][c] = sum over the row's k slots, in slot order (ascending expert index, moe_route),
// of wts[r][j] * Y[r * k + j][c], from +0: each product rounded, then added (the CPU's
// `o += w * v`). Grid-stride over M * H elements.
extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ wts,
                                       float* __restrict__ out, u32 M, u32 k, u32 H) {
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
