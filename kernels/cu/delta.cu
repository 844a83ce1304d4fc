// Gated DeltaNet (qwen3next linear attention): the causal depthwise convolution, the gated delta
// rule and the kept per-token inputs, over each sequence's recurrent state slot. The rule for
// where a slot's state stands is engine/src/backend/state.rs; the CPU reference is
// engine/src/backend/cpu/delta.rs, whose operation order these kernels follow (products rounded
// before they are added: --fmad=false).
//
// The step's plan (one entry per sequence, PLAN_W u32 each, then the row lists):
//   slot, first position, replay_from, commit_to, rows in the step, offset of its row list.
// A sequence's row list holds its step rows in position order. Entries with no rows are inert
// (the padding of a CUDA graph's bucket).

#define PLAN_W 6
// Must equal engine/src/backend/state.rs RING / CONV_RING / MAX_CONV_KERNEL.
#define RING 16
#define MAX_CONV_KERNEL 8
#define CONV_RING (RING + MAX_CONV_KERNEL - 1)

struct SeqPlan {
    u32 slot, first, replay_from, commit_to, n_rows;
    const u32* rows;
};

__device__ __forceinline__ SeqPlan seq_plan(const u32* plan, u32 n_seqs, u32 s) {
    const u32* e = plan + s * PLAN_W;
    SeqPlan p;
    p.slot = e[0];
    p.first = e[1];
    p.replay_from = e[2];
    p.commit_to = e[3];
    p.n_rows = e[4];
    p.rows = plan + n_seqs * PLAN_W + e[5];
    return p;
}

// silu(sum_t w[t] * x[pos - (K - 1) + t][c]) for channel c at position pos of a sequence whose
// step starts at `first` with row list `rows`: taps of the step's own positions from X, earlier
// ones from the slot's ring rg, zero before position 0; the sum in ascending t from +0.
__device__ __forceinline__ float conv_silu_at(const float* X, const float* rg, const u32* rows, u32 first, u32 pos,
                                              u32 c, u32 conv_dim, u32 kernel, const float w[MAX_CONV_KERNEL]) {
    float acc = 0.0f;
    for (u32 t = 0; t < kernel; t++) {
        if (pos + t < kernel - 1) continue;
        const u32 q = pos + t - (kernel - 1);
        const float v = q >= first ? X[(u64)rows[q - first] * conv_dim + c] : rg[(u64)(q % CONV_RING) * conv_dim + c];
        acc += w[t] * v;
    }
    return acc / (1.0f + expf(-acc));
}

// Channel c's conv weights (zeros past the kernel).
__device__ __forceinline__ void conv_weights(const float* W, u32 c, u32 kernel, float w[MAX_CONV_KERNEL]) {
#pragma unroll
    for (u32 t = 0; t < MAX_CONV_KERNEL; t++) w[t] = t < kernel ? W[(u64)c * kernel + t] : 0.0f;
}

// Y[row][c] = conv_silu_at(...) for every row of sequence blockIdx.y and channel c = blockIdx.x *
// CONV_CH + threadIdx.x % CONV_CH: the rows split over CONV_GROUPS thread groups (row i by group
// i % CONV_GROUPS; each output is conv_silu_at's whichever thread computes it). Then, after a
// block barrier (a channel's ring is read and written by its block only), the inputs of the
// step's last CONV_RING rows into the ring (an older row's slot is a later row's).
#define CONV_CH 32
#define CONV_GROUPS 8
extern "C" __global__ void __launch_bounds__(CONV_CH* CONV_GROUPS)
    conv1d_silu(const float* __restrict__ X, float* __restrict__ Y, const float* __restrict__ W,
                float* __restrict__ ring, const u32* __restrict__ plan, u32 n_seqs, u32 conv_dim, u32 kernel) {
    pdl_entry();
    const SeqPlan p = seq_plan(plan, n_seqs, blockIdx.y);
    if (p.n_rows == 0) return;
    const u32 c = blockIdx.x * CONV_CH + threadIdx.x % CONV_CH, grp = threadIdx.x / CONV_CH;
    const bool live = c < conv_dim;
    float* rg = ring + (u64)p.slot * CONV_RING * conv_dim;
    if (live) {
        float w[MAX_CONV_KERNEL];
        conv_weights(W, c, kernel, w);
        for (u32 i = grp; i < p.n_rows; i += CONV_GROUPS)
            Y[(u64)p.rows[i] * conv_dim + c] = conv_silu_at(X, rg, p.rows, p.first, p.first + i, c, conv_dim, kernel, w);
    }
    __syncthreads();
    if (!live) return;
    const u32 from = p.n_rows > CONV_RING ? p.n_rows - CONV_RING : 0;
    for (u32 i = from + grp; i < p.n_rows; i += CONV_GROUPS)
        rg[(u64)((p.first + i) % CONV_RING) * conv_dim + c] = X[(u64)p.rows[i] * conv_dim + c];
}

// The conv of gated_delta_conv_k<HK> (null X: the step's rows were convolved by conv1d_silu
// into QKV): X the conv inputs, W its weights, ring the conv rings, kernel its taps.
struct DeltaConv {
    const float* X;
    const float* W;
    float* ring;
    u32 kernel;
};

// Warps of a gated_delta block (the host launches 32 * DELTA_NW(HK) threads): each owns HK /
// DELTA_NW(HK) rows of the block's state columns.
#define DELTA_NW(HK) ((HK) >= 64 ? (HK) / 32 : 1)

// The gated delta rule of value head h of sequence blockIdx.y, columns tile * 32 + lane of its
// state (HK x hv, row-major per head in S[slot][head]), blockIdx.x = h * tiles + tile with
// tiles = ceil(hv / 32). NW = DELTA_NW(HK) warps; lane j of warp w owns state column j, rows
// w * R .. w * R + R - 1 (R = HK / NW, in registers): the state's products run NW times
// shorter chains on NW times more warps. Each warp's partial of S^T k (and S^T q) over its rows
// (delta_dot), then the NW partials in warp order (a fixed order: the same bits at every M).
// Positions replay_from..first come from the slot's kept inputs, then the step's rows (their
// outputs into O); the state after position commit_to - 1 (the start state when commit_to is
// replay_from) is written to D: D[slot][head] when d_per_slot, else D[head] (a snapshot: an
// entry with no rows that only replays up to `first`). Per position, as the CPU: q, k L2-normalised (q scaled by 1/sqrt(HK)),
// beta = sigmoid(b), decay = exp(a_coef * softplus(a + dt)); S *= decay; kv = S^T k;
// S += k ((v - kv) beta)^T; o = S^T q.
//
// The positions go in chunks of DC = 4 NW: first every warp prepares 4 of the chunk's positions
// (their loads in flight together: q and k channels lane, lane + 32, ... below HK, v of the
// lane's column, beta's and the decay's inputs, the step row; then q and k L2-normalised, beta
// and the decay) into shared memory, then the chain walks the chunk holding only the state's
// operations. Each value is computed by the operations the CPU order fixes whichever warp runs
// them, so the chunking changes no bit (and one row a step prepares a chunk of one).
//
// CONV (gated_delta_conv_k<HK>, steps of at most RING rows a sequence): first the step's rows are
// convolved, conv1d_silu's operations (conv_silu_at), every thread of the block a share of the
// q and k channels of its key head and of its tile's v columns, all rows, into shared memory
// (their loads in flight together); the owners (q / k: the first value head of the key head,
// tile 0; v: the column's block) write them to QKV (for keep_inputs) and put the step's inputs
// into the conv ring (the step's slots, RING or fewer, are not the K - 1 below `first` any block
// reads: CONV_RING = RING + MAX_CONV_KERNEL - 1). The same bits as conv1d_silu then
// gated_delta_k<HK> (the kernels gate compares them).
// sum_i s[i] v[i] over a warp's R rows: four partial sums (rows i = q mod 4, in row order), then
// (p0 + p1) + (p2 + p3): chains of R / 4 on the position's critical path instead of R.
template <int R>
__device__ __forceinline__ float delta_dot(const float s[R], const float* v) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < R; i++) a[i % 4] += s[i] * v[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

template <int HK>
struct DeltaIn {
    float q[(HK + 31) / 32], k[(HK + 31) / 32];
    float v, b, a;
    u32 row;
};

template <int HK, bool CONV>
__device__ __forceinline__ void gated_delta_body(const float* QKV, const float* BA, const float* A, const float* DT,
                                                 float* O, const float* S, float* D, u32 d_per_slot,
                                                 const float* inputs, const u32* plan, u32 n_seqs, u32 nk, u32 nv,
                                                 u32 hv, const DeltaConv cv = DeltaConv{nullptr, nullptr, nullptr, 0}) {
    constexpr int NW = DELTA_NW(HK);
    constexpr int R = HK / NW;
    constexpr int QL = (HK + 31) / 32;  // q / k channels a lane
    constexpr int CR = CONV ? RING : 1;
    // The chunk's positions, prepared (DC of them; PW a warp): q and k normalised, v the
    // block's columns, beta, the decay, the step row.
    constexpr int PW = 4, DC = PW * NW;
    __shared__ float qn[DC][HK];
    __shared__ float kn[DC][HK];
    __shared__ float vn[DC][32];
    __shared__ float bn[DC], dn[DC];
    __shared__ u32 rn[DC];
    // Partials of S^T k (two buffers by position parity: a replayed position has one barrier)
    // and of S^T q.
    __shared__ float part_kv[2][NW][32];
    __shared__ float part_o[NW][32];
    // CONV: the step rows' conv outputs, q | k channels of the key head, the tile's v columns.
    __shared__ float cqk[CR][2 * HK];
    __shared__ float cvv[CR][32];
    const SeqPlan p = seq_plan(plan, n_seqs, blockIdx.y);
    if (p.n_rows == 0 && p.first == p.replay_from) return;
    const u32 lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const u32 tiles = (hv + 31) / 32;
    const u32 h = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const u32 j = tile * 32 + lane;
    const bool col = j < hv;
    const u32 r = nv / nk, g = h / r, jj = h % r;
    const u32 conv_dim = 2 * nk * HK + nv * hv;
    const u32 iw = conv_dim + 2 * nv;
    const u32 i0 = w * R;  // this warp's first state row
    const float* sb = S + ((u64)p.slot * nv + h) * HK * hv;
    float* db = D + ((d_per_slot ? (u64)p.slot * nv : 0) + h) * HK * hv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = (col && p.first > 0) ? sb[(u64)(i0 + i) * hv + j] : 0.0f;
    if (col && p.commit_to == p.replay_from) {
#pragma unroll
        for (int i = 0; i < R; i++) db[(u64)(i0 + i) * hv + j] = s[i];
    }
    if (CONV && p.n_rows > 0) {
        constexpr u32 T = 32 * NW, CH = 2 * HK + 32, PER = (CH + T - 1) / T;
        const bool qk_owner = jj == 0 && tile == 0;
        float* rg = cv.ring + (u64)p.slot * CONV_RING * conv_dim;
        float* Y = (float*)QKV;
        // Item ci's channel: q then k of key head g, then the tile's v columns; ~0u: none.
        auto chan = [&](u32 ci) -> u32 {
            if (ci < HK) return g * HK + ci;
            if (ci < 2 * HK) return (nk + g) * HK + (ci - HK);
            const u32 jc = tile * 32 + (ci - 2 * HK);
            return ci < CH && jc < hv ? 2 * nk * HK + h * hv + jc : ~0u;
        };
#pragma unroll
        for (u32 u = 0; u < PER; u++) {
            const u32 ci = threadIdx.x + u * T, c = chan(ci);
            if (c == ~0u) continue;
            float wt[MAX_CONV_KERNEL];
            conv_weights(cv.W, c, cv.kernel, wt);
            for (u32 i = 0; i < p.n_rows; i++) {
                const float y = conv_silu_at(cv.X, rg, p.rows, p.first, p.first + i, c, conv_dim, cv.kernel, wt);
                if (ci < 2 * HK) cqk[i][ci] = y;
                else cvv[i][ci - 2 * HK] = y;
            }
        }
#pragma unroll
        for (u32 u = 0; u < PER; u++) {
            const u32 ci = threadIdx.x + u * T, c = chan(ci);
            if (c == ~0u || (ci < 2 * HK && !qk_owner)) continue;
            for (u32 i = 0; i < p.n_rows; i++) {
                const u32 row = p.rows[i];
                Y[(u64)row * conv_dim + c] = ci < 2 * HK ? cqk[i][ci] : cvv[i][ci - 2 * HK];
                rg[(u64)((p.first + i) % CONV_RING) * conv_dim + c] = cv.X[(u64)row * conv_dim + c];
            }
        }
        __syncthreads();
    }
    // Position n's inputs (n from replay_from): replayed ones from the slot's kept inputs, the
    // step's rows from QKV / BA (CONV: q, k, v from the conv outputs above).
    auto load = [&](u32 n, DeltaIn<HK>& in) {
        const u32 pos = p.replay_from + n;
        const float* x;
        const float* ba;
        bool conv_row = false;
        u32 f = 0;
        in.row = 0;
        if (pos < p.first) {
            x = inputs + ((u64)p.slot * RING + pos % RING) * iw;
            ba = x + conv_dim;
        } else {
            f = pos - p.first;
            in.row = p.rows[f];
            x = QKV + (u64)in.row * conv_dim;
            ba = BA + (u64)in.row * 2 * nv;
            conv_row = CONV;
        }
#pragma unroll
        for (int m = 0; m < QL; m++) {
            const u32 i = lane + 32 * m;
            if (i >= HK) continue;
            in.q[m] = conv_row ? cqk[f][i] : x[g * HK + i];
            in.k[m] = conv_row ? cqk[f][HK + i] : x[(nk + g) * HK + i];
        }
        in.v = col ? (conv_row ? cvv[f][lane] : x[2 * nk * HK + h * hv + j]) : 0.0f;
        in.b = ba[g * 2 * r + jj];
        in.a = ba[g * 2 * r + r + jj];
    };
    const float scale = 1.0f / sqrtf((float)HK);
    const float a_coef = A[h], dt = DT[h];
    const u32 total = p.first - p.replay_from + p.n_rows;
    for (u32 n0 = 0; n0 < total; n0 += DC) {
        const u32 nc = total - n0 < DC ? total - n0 : DC;
        // The chunk's inputs, off the chain: warp w takes positions n0 + w, n0 + w + NW, ...
        // (its loads in flight together), each normalised by one warp with the operations
        // every warp ran on it before (lane partials in m order, the xor tree).
        DeltaIn<HK> in[PW];
#pragma unroll
        for (int u = 0; u < PW; u++)
            if (w + u * NW < nc) load(n0 + w + u * NW, in[u]);
#pragma unroll
        for (int u = 0; u < PW; u++) {
            const u32 c = w + u * NW;
            if (c >= nc) continue;
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int m = 0; m < QL; m++) {
                const u32 i = lane + 32 * m;
                if (i >= HK) continue;
                sq += in[u].q[m] * in[u].q[m];
                sk += in[u].k[m] * in[u].k[m];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                sq += __shfl_xor_sync(FULL_MASK, sq, o);
                sk += __shfl_xor_sync(FULL_MASK, sk, o);
            }
            const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
#pragma unroll
            for (int m = 0; m < QL; m++) {
                const u32 i = lane + 32 * m;
                if (i >= HK) continue;
                qn[c][i] = in[u].q[m] * iq * scale;
                kn[c][i] = in[u].k[m] * ik * 1.0f;
            }
            vn[c][lane] = in[u].v;
            if (lane == 0) {
                const float a = in[u].a + dt;
                const float sp = a > 20.0f ? a : log1pf(expf(a));
                bn[c] = sigmoid_of(in[u].b);
                dn[c] = expf(a_coef * sp);
                rn[c] = in[u].row;
            }
        }
        __syncthreads();
        for (u32 c = 0; c < nc; c++) {
            const u32 n = n0 + c, pos = p.replay_from + n;
            const float* ks = kn[c];
            const float* qs = qn[c];
            const float beta = bn[c], decay = dn[c], v = vn[c][lane];
#pragma unroll
            for (int i = 0; i < R; i++) s[i] *= decay;
            float kv = delta_dot<R>(s, ks + i0);
            float* pk = part_kv[n & 1][0];
            pk[w * 32 + lane] = kv;
            __syncthreads();
            kv = pk[lane];
#pragma unroll
            for (int q = 1; q < NW; q++) kv += pk[q * 32 + lane];
            const float d = (v - kv) * beta;
#pragma unroll
            for (int i = 0; i < R; i++) s[i] += ks[i0 + i] * d;
            if (pos >= p.first) {  // the same for the whole block
                float o = delta_dot<R>(s, qs + i0);
                part_o[w][lane] = o;
                __syncthreads();
                if (w == 0 && col) {
                    o = part_o[0][lane];
#pragma unroll
                    for (int q = 1; q < NW; q++) o += part_o[q][lane];
                    O[(u64)rn[c] * nv * hv + (u64)h * hv + j] = o;
                }
            }
            if (col && pos + 1 == p.commit_to) {
#pragma unroll
                for (int i = 0; i < R; i++) db[(u64)(i0 + i) * hv + j] = s[i];
            }
        }
        __syncthreads();  // every warp is done with the chunk before the next one is written
    }
}

#define GATED_DELTA_KERNEL(HK)                                                                                   \
    extern "C" __global__ void gated_delta_k##HK(const float* QKV, const float* BA, const float* A,              \
                                                 const float* DT, float* O, const float* S, float* D,           \
                                                 u32 d_per_slot, const float* inputs, const u32* plan,          \
                                                 u32 n_seqs, u32 nk, u32 nv, u32 hv) {                          \
        pdl_entry();                                                                                             \
        gated_delta_body<HK, false>(QKV, BA, A, DT, O, S, D, d_per_slot, inputs, plan, n_seqs, nk, nv, hv);             \
    }

GATED_DELTA_KERNEL(16)
GATED_DELTA_KERNEL(32)
GATED_DELTA_KERNEL(64)
GATED_DELTA_KERNEL(128)

// gated_delta_k<HK> with the step's conv (DeltaConv): X the conv inputs, W the conv weights,
// ring the conv rings, kernel the taps; QKV receives the conv outputs. Steps of at most RING
// rows a sequence (the host checks).
#define GATED_DELTA_CONV_KERNEL(HK)                                                                             \
    extern "C" __global__ void gated_delta_conv_k##HK(float* QKV, const float* BA, const float* A,              \
                                                      const float* DT, float* O, const float* S, float* D,      \
                                                      u32 d_per_slot, const float* inputs, const u32* plan,     \
                                                      u32 n_seqs, u32 nk, u32 nv, u32 hv, const float* X,        \
                                                      const float* W, float* ring, u32 kernel) {                \
        pdl_entry();                                                                                             \
        gated_delta_body<HK, true>(QKV, BA, A, DT, O, S, D, d_per_slot, inputs, plan, n_seqs, nk, nv, hv,        \
                             DeltaConv{X, W, ring, kernel});                                                     \
    }

GATED_DELTA_CONV_KERNEL(16)
GATED_DELTA_CONV_KERNEL(32)
GATED_DELTA_CONV_KERNEL(64)
GATED_DELTA_CONV_KERNEL(128)

// Keeps the delta-rule inputs (the conv output row and [b a]) of each sequence's last RING step
// rows in its slot's ring, after gated_delta read the older ones. Grid: y = sequence.
extern "C" __global__ void keep_inputs(const float* QKV, const float* BA, float* inputs, const u32* plan, u32 n_seqs,
                                       u32 conv_dim, u32 nv) {
    pdl_entry();
    const SeqPlan p = seq_plan(plan, n_seqs, blockIdx.y);
    const u32 iw = conv_dim + 2 * nv;
    const u32 kept = p.n_rows < RING ? p.n_rows : RING;
    const u64 n = (u64)kept * iw;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u32 i = p.n_rows - kept + (u32)(idx / iw);
        const u32 c = (u32)(idx % iw);
        const u32 row = p.rows[i];
        const float v = c < conv_dim ? QKV[(u64)row * conv_dim + c] : BA[(u64)row * 2 * nv + (c - conv_dim)];
        inputs[((u64)p.slot * RING + (p.first + i) % RING) * iw + c] = v;
    }
}
