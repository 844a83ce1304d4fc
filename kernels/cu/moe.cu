// Mixture-of-experts routing and combination (issue 16; engine/src/backend/cuda/moe.rs drives
// them around the expert products mmq_id_<type> / matmul_id_<type> / mms_grouped_<type>).
// moe_route and moe_combine are per row: a row's results depend on its own router logits and
// expert outputs only; moe_group only sorts pair indices (integers, one possible result).

// Most experts a router may have (the shared-memory arrays of moe_route; the host checks).
#define MOE_MAX_E 1024
// Most experts per row (moe_route_row's rank-order arrays; the host checks).
#define MOE_MAX_K 32
#define MOE_NONE 0xffffffffu

// A probability's place in the CPU's `f32::total_cmp` order as an unsigned key (a larger key
// ranks first; NaN above +inf, as the CPU's sort puts it).
__device__ __forceinline__ u32 moe_key(float p) {
    const u32 b = __float_as_uint(p);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Threads of moe_route (one block per row).
#define MOE_RT 256

// Experts per thread of moe_route_row (registers).
#define MOE_PER (MOE_MAX_E / MOE_RT)

// A shared expert folded into the MoE (qwen3next): expert E (the stacks' last), always chosen,
// as slot k (after the k routed experts, all below E: ascending expert index), its weight the
// sigmoid of logit E (the row's gate for it), with sigmoid_mul's operations, so that the combine
// adds w y last as the CPU adds sigmoid(g) * shared(h) after the routed experts.
__device__ __forceinline__ void moe_shared_slot(const float* l, u32* ids, float* wts, u32 E, u32 k) {
    const float g = __ldcg(l + E);
    ids[k] = E;
    wts[k] = sigmoid_of(g);
}

// The routing of one row of E router logits l by a block of MOE_RT threads: the softmax (max
// subtracted; the exponentials summed lane-strided in index order per lane, then a fixed xor
// tree: every warp computes this same sum, so no barrier waits for one warp's), the k highest
// probabilities (the CPU's order: `total_cmp`, equal ones the lower expert index; each expert's
// rank counted against all E at once), divided by their sum (added in rank order) when `norm`,
// written in ascending expert index to ids[0..k) / wts[0..k) (the order the CPU adds them). The
// logits are read once, through L2 (a block of another launch, or of this one, wrote them); each
// thread keeps its experts t, t + MOE_RT, ... in registers. Every step is per row: no other row
// changes a bit.
__device__ __forceinline__ void moe_route_row(const float* l, u32* __restrict__ ids, float* __restrict__ wts,
                                              u32 E, u32 k, u32 norm, u32 shared) {
    __shared__ float p[MOE_MAX_E];
    __shared__ __align__(16) u32 key[MOE_MAX_E];
    __shared__ float red[MOE_RT / 32];
    __shared__ u32 rid[MOE_MAX_K];
    __shared__ float rw[MOE_MAX_K];
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    float lv[MOE_PER];
    float mx = __int_as_float(0xff800000);  // -inf; fmaxf is order-free
#pragma unroll
    for (int j = 0; j < MOE_PER; ++j) {
        const u32 i = t + j * MOE_RT;
        lv[j] = i < E ? __ldcg(l + i) : mx;
        mx = fmaxf(mx, lv[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
#pragma unroll
    for (int w = 1; w < MOE_RT / 32; ++w) mx = fmaxf(mx, red[w]);
#pragma unroll
    for (int j = 0; j < MOE_PER; ++j) {
        const u32 i = t + j * MOE_RT;
        if (i < E) p[i] = expf(__fsub_rn(lv[j], mx));
    }
    // Keys past E (up to the next multiple of 4, read by the uint4 scan) are 0: never above a
    // probability's key, and an equal key past E is not "before" any expert.
    if (t < 4 && E + t < MOE_MAX_E) key[E + t] = 0u;
    __syncthreads();
    float s = 0.0f;
    for (u32 i = lane; i < E; i += 32) s = __fadd_rn(s, p[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, o));
    float pv[MOE_PER];
    u32 kv[MOE_PER];
#pragma unroll
    for (int j = 0; j < MOE_PER; ++j) {
        const u32 i = t + j * MOE_RT;
        pv[j] = 0.0f;
        kv[j] = 0u;
        if (i < E) {
            pv[j] = __fdiv_rn(p[i], s);
            kv[j] = moe_key(pv[j]);
            key[i] = kv[j];
        }
    }
    __syncthreads();
    // Rank of expert i: the experts before it (a larger key, or an equal key and a lower index),
    // 4 keys a load; the scan stops once k experts are before it (checked every 32 keys).
    const uint4* k4 = (const uint4*)key;
    const u32 e4 = (E + 3) / 4;
#pragma unroll
    for (int j = 0; j < MOE_PER; ++j) {
        const u32 i = t + j * MOE_RT;
        if (i >= E) continue;
        const u32 ki = kv[j];
        u32 rank = 0;
        for (u32 q0 = 0; q0 < e4 && rank < k; q0 += 8) {
            uint4 c[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) c[q] = q0 + q < e4 ? k4[q0 + q] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const u32 j0 = 4 * (q0 + q);
                rank += (c[q].x > ki || (c[q].x == ki && j0 < i)) ? 1u : 0u;
                rank += (c[q].y > ki || (c[q].y == ki && j0 + 1 < i)) ? 1u : 0u;
                rank += (c[q].z > ki || (c[q].z == ki && j0 + 2 < i)) ? 1u : 0u;
                rank += (c[q].w > ki || (c[q].w == ki && j0 + 3 < i)) ? 1u : 0u;
            }
        }
        if (rank < k) {
            rid[rank] = i;
            rw[rank] = pv[j];
        }
    }
    __syncthreads();
    if (t < k) {
        float u = 0.0f;
        if (norm)
            for (u32 j = 0; j < k; ++j) u = __fadd_rn(u, rw[j]);
        const u32 id = rid[t];
        u32 slot = 0;
        for (u32 j = 0; j < k; ++j) slot += rid[j] < id ? 1u : 0u;
        ids[slot] = id;
        wts[slot] = norm ? __fdiv_rn(rw[t], u) : rw[t];
    }
    if (shared && t == 0) moe_shared_slot(l, ids, wts, E, k);
    __syncthreads();  // the shared arrays are reused by the next row
}


// Most experts moe_route_warp takes (MOE_WPL a lane, in registers): qwen3next's 512 included
// (the block routing, alone on one SM after the router, took ~49 us a decode step's layer there).
#define MOE_WARP_E 512
#define MOE_WPL (MOE_WARP_E / 32)

// The probability whose key is `key` (moe_key's inverse).
__device__ __forceinline__ float moe_unkey(u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// moe_route_row's result (the same bits) by one warp and no barrier, for E <= MOE_WARP_E: lane
// l keeps experts l, l + 32, ... in registers, so its share of the softmax sum is the
// lane-strided order, then the same xor tree; the k experts are taken one after the other by a
// warp argmax over the keys not yet taken (the larger key, then the lower index: rank order),
// the renormalizing sum added in that order; lane r keeps the rank-r expert and writes it at its
// place in ascending expert index.
__device__ __forceinline__ void moe_route_warp(const float* l, u32* __restrict__ ids, float* __restrict__ wts,
                                               u32 E, u32 k, u32 norm, u32 shared) {
    const u32 lane = threadIdx.x & 31;
    const float ninf = __int_as_float(0xff800000);
    float lv[MOE_WPL];
    float mx = ninf;
#pragma unroll
    for (int j = 0; j < MOE_WPL; ++j) {
        const u32 i = lane + 32 * j;
        lv[j] = i < E ? __ldcg(l + i) : ninf;
        mx = fmaxf(mx, lv[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
    float pv[MOE_WPL];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_WPL; ++j) {
        pv[j] = 0.0f;
        if (lane + 32 * j < E) {
            pv[j] = expf(__fsub_rn(lv[j], mx));
            s = __fadd_rn(s, pv[j]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, o));
    u32 kv[MOE_WPL];
    u32 avail = 0;
#pragma unroll
    for (int j = 0; j < MOE_WPL; ++j) {
        kv[j] = 0u;
        if (lane + 32 * j < E) {
            kv[j] = moe_key(__fdiv_rn(pv[j], s));
            avail |= 1u << j;
        }
    }
    float u = 0.0f, my_w = 0.0f;
    u32 my_id = MOE_NONE;
    for (u32 r = 0; r < k; ++r) {
        // This lane's best expert not yet taken (j ascending: an equal key keeps the lower index).
        u32 bk = 0u, bi = MOE_NONE;
#pragma unroll
        for (int j = 0; j < MOE_WPL; ++j) {
            if (((avail >> j) & 1u) && (bi == MOE_NONE || kv[j] > bk)) {
                bk = kv[j];
                bi = lane + 32 * j;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u32 ok = __shfl_xor_sync(FULL_MASK, bk, o), oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (oi != MOE_NONE && (bi == MOE_NONE || ok > bk || (ok == bk && oi < bi))) {
                bk = ok;
                bi = oi;
            }
        }
        // bi: the rank-r expert (k <= E: one is left), on every lane.
        if ((bi & 31u) == lane) avail &= ~(1u << (bi >> 5));
        const float w = moe_unkey(bk);
        if (norm) u = __fadd_rn(u, w);
        if (lane == r) {
            my_id = bi;
            my_w = w;
        }
    }
    u32 slot = 0;
    for (u32 r = 0; r < k; ++r) slot += __shfl_sync(FULL_MASK, my_id, r) < my_id ? 1u : 0u;
    if (lane < k) {
        ids[slot] = my_id;
        wts[slot] = norm ? __fdiv_rn(my_w, u) : my_w;
    }
    if (shared && lane == 0) moe_shared_slot(l, ids, wts, E, k);
}

// The routing of rows 0 .. M of L (E + shared logits each; the k + shared ids and weights of row
// r at [r (k + shared), ...)): warp r routes row r (moe_route_warp) for up to MOE_WARP_E experts,
// else the block routes the rows one after the other (moe_route_row). Every thread of the block
// must call it.
__device__ __forceinline__ void moe_route_rows(const float* L, u32* __restrict__ ids, float* __restrict__ wts, u32 M,
                                               u32 E, u32 k, u32 norm, u32 shared) {
    const u32 warp = threadIdx.x >> 5;
    const u64 le = E + shared, ks = k + shared;
    if (E > MOE_WARP_E)
        for (u32 r = 0; r < M; ++r) moe_route_row(L + r * le, ids + r * ks, wts + r * ks, E, k, norm, shared);
    else if (warp < M)
        moe_route_warp(L + warp * le, ids + warp * ks, wts + warp * ks, E, k, norm, shared);
}

// The routing of each row r of L (grid M, MOE_RT threads: one row a block).
extern "C" __global__ void __launch_bounds__(MOE_RT) moe_route(const float* __restrict__ L, u32* __restrict__ ids,
                                                               float* __restrict__ wts, u32 E, u32 k, u32 norm,
                                                               u32 shared) {
    pdl_entry();
    const u64 row = blockIdx.x, le = E + shared, ks = k + shared;
    moe_route_rows(L + row * le, ids + row * ks, wts + row * ks, 1, E, k, norm, shared);
}

// A decode step's MoE router in one launch (M <= 8 rows of K): the FFN's RMSNorm, the F32
// router product and the routing. Block n (grid E, MOE_RT threads, M K floats of dynamic shared
// memory) normalizes the rows (rms_scale_warp by warp r for row r, then (x * scale) * G: the
// bits of rms_norm, written to H by block 0), then router row n over them in
// matmul_f32_rows_body's order (warp w sums its K / 8 chunk lane-strided with fma from +0, the
// xor tree, the 8 warp sums in warp order from -0) into L[r][n]; the last block to finish (a
// ticket, reset to 0 for the next launch) routes every row (moe_route_warp by warp r for row r,
// or moe_route_row for more than MOE_WARP_E experts). With `shared` the grid is E + 1: block E
// computes router row E (a folded shared expert's gate, L's rows are E + 1 wide) and each row
// gets the shared slot (moe_shared_slot). The bits of rms_norm, matmul_f32_rows and moe_route,
// whatever M. When Xh is not null the normalized rows
// are also prepared for the expert products (Xh / Xs, rows of kp columns, bf as prep_store:
// prepare_h16's bits of H), one 32-column block per warp of the grid. The block's first eight
// router weights a lane are loaded before the rows (they do not depend on them).
extern "C" __global__ void __launch_bounds__(MOE_RT) moe_norm_route(const float* __restrict__ X,
                                                                    const float* __restrict__ G, float eps,
                                                                    float* __restrict__ H, const u8* __restrict__ W,
                                                                    u64 row_bytes, float* L, u32* ticket, u32* ids,
                                                                    float* wts, u16* __restrict__ Xh,
                                                                    float* __restrict__ Xs, u32 kp, u32 bf, u32 M,
                                                                    u32 K, u32 E, u32 k, u32 norm, u32 shared) {
    pdl_entry();
    extern __shared__ float hs[];
    __shared__ float sc[8];
    __shared__ float part[8][8];
    __shared__ u32 last;
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5, n = blockIdx.x;
    const u32 mk = M * K;
    const float* w = (const float*)(W + (u64)n * row_bytes);
    const u32 c0 = (u32)((u64)warp * K / 8), c1 = (u32)((u64)(warp + 1) * K / 8);
    float wpre[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const u32 c = c0 + lane + 32 * q;
        wpre[q] = c < c1 ? __ldg(w + c) : 0.0f;
    }
    for (u32 i = t; i < mk; i += MOE_RT) hs[i] = X[i];
    __syncthreads();
    if (warp < M) {
        const float s = rms_scale_warp(hs + warp * K, K, eps);
        if (lane == 0) sc[warp] = s;
    }
    __syncthreads();
    for (u32 i = t; i < mk; i += MOE_RT) {
        const float v = (hs[i] * sc[i / K]) * G[i % K];
        hs[i] = v;
        if (n == 0) H[i] = v;
    }
    __syncthreads();
    if (Xh) prep_rows([&](u32 m, u32, u32 col) { return col < K ? hs[m * K + col] : 0.0f; }, Xh, Xs, M, kp, bf);
    float acc[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const u32 c = c0 + lane + 32 * q;
        if (c < c1) {
#pragma unroll
            for (int r = 0; r < 8; ++r)
                if ((u32)r < M) acc[r] = __fmaf_rn(wpre[q], hs[r * K + c], acc[r]);
        }
    }
#pragma unroll 4
    for (u32 c = c0 + lane + 256; c < c1; c += 32) {
        const float wv = __ldg(w + c);
#pragma unroll
        for (int r = 0; r < 8; ++r)
            if ((u32)r < M) acc[r] = __fmaf_rn(wv, hs[r * K + c], acc[r]);
    }
    warp_sums8(acc, part[warp]);
    __syncthreads();
    if (t < M) {
        float v = -0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) v = __fadd_rn(v, part[q][t]);
        L[(u64)t * (E + shared) + n] = v;
    }
    __threadfence();
    __syncthreads();
    if (t == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1 ? 1u : 0u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    moe_route_rows(L, ids, wts, M, E, k, norm, shared);
    if (t == 0) *ticket = 0;
}

// Warps of moe_group (each owns a contiguous range of pairs).
#define MOE_GW 8

// The pairs of a grouped expert product (issue 16; products.cu, mms_grouped_<type>), a
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
// When X is not null, X[r][c] += out[r][c] follows (add_in_place's operation: the MoE FFN
// added into the residual stream in the same launch).
extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ wts,
                                       float* __restrict__ out, float* __restrict__ X, u32 M, u32 k, u32 H) {
    pdl_entry();
    const u64 n = (u64)M * H;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / H, c = i % H;
        float acc = 0.0f;
#pragma unroll 8
        for (u32 j = 0; j < k; ++j) {
            const u64 pr = r * k + j;
            acc = __fadd_rn(acc, __fmul_rn(wts[pr], Y[pr * H + c]));
        }
        out[i] = acc;
        if (X) X[i] = __fadd_rn(X[i], acc);
    }
}
