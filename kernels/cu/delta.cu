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

// The step's inputs of channel c into the slot's ring (after every tap of the step was read).
__device__ __forceinline__ void conv_keep(const float* X, float* rg, const SeqPlan& p, u32 c, u32 conv_dim) {
    for (u32 i = 0; i < p.n_rows; i++) rg[(u64)((p.first + i) % CONV_RING) * conv_dim + c] = X[(u64)p.rows[i] * conv_dim + c];
}

// Y[row][c] = conv_silu_at(...) for every row of sequence blockIdx.y, channel c = blockIdx.x *
// blockDim.x + threadIdx.x, then the step's inputs into the ring. One thread owns a channel of a
// sequence, in position order.
extern "C" __global__ void conv1d_silu(const float* X, float* Y, const float* W, float* ring, const u32* plan,
                                       u32 n_seqs, u32 conv_dim, u32 kernel) {
    pdl_entry();
    const SeqPlan p = seq_plan(plan, n_seqs, blockIdx.y);
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (p.n_rows == 0 || c >= conv_dim) return;
    float* rg = ring + (u64)p.slot * CONV_RING * conv_dim;
    float w[MAX_CONV_KERNEL];
    conv_weights(W, c, kernel, w);
    for (u32 i = 0; i < p.n_rows; i++)
        Y[(u64)p.rows[i] * conv_dim + c] = conv_silu_at(X, rg, p.rows, p.first, p.first + i, c, conv_dim, kernel, w);
    conv_keep(X, rg, p, c, conv_dim);
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
// shorter chains on NW times more warps. Each warp's partial of S^T k (and S^T q) over its rows,
// in row order, then the NW partials in warp order (a fixed order: the same bits at every M).
// Positions replay_from..first come from the slot's kept inputs, then the step's rows (their
// outputs into O); the state after position commit_to - 1 (the start state when commit_to is
// replay_from) is written to D: D[slot][head] when d_per_slot, else D[head] (a snapshot: an
// entry with no rows that only replays up to `first`). Per position, as the CPU: q, k L2-normalised (q scaled by 1/sqrt(HK)),
// beta = sigmoid(b), decay = exp(a_coef * softplus(a + dt)); S *= decay; kv = S^T k;
// S += k ((v - kv) beta)^T; o = S^T q.
//
// With cv.X (gated_delta_conv_k<HK>, steps of at most RING rows a sequence): the step's rows are
// convolved here, conv1d_silu's operations (conv_silu_at), each warp the q and k channels of
// its key head and its v columns, and written to QKV (for keep_inputs) by the warp 0 that owns
// them (q / k: the first value head of the key head, tile 0; v: its column); after its positions
// the owner puts the step's inputs into the conv ring (the step's slots, RING or fewer, are not
// the K - 1 below `first` any block reads: CONV_RING = RING + MAX_CONV_KERNEL - 1). The same
// bits as conv1d_silu then gated_delta_k<HK> (the kernels gate compares them).
template <int HK>
__device__ __forceinline__ void gated_delta_body(const float* QKV, const float* BA, const float* A, const float* DT,
                                                 float* O, const float* S, float* D, u32 d_per_slot,
                                                 const float* inputs, const u32* plan, u32 n_seqs, u32 nk, u32 nv,
                                                 u32 hv, const DeltaConv cv = DeltaConv{nullptr, nullptr, nullptr, 0}) {
    constexpr int NW = DELTA_NW(HK);
    constexpr int R = HK / NW;
    __shared__ float qs_all[NW][HK];
    __shared__ float ks_all[NW][HK];
    // Partials of S^T k (two buffers by position parity: a replayed position has one barrier)
    // and of S^T q.
    __shared__ float part_kv[2][NW][32];
    __shared__ float part_o[NW][32];
    const SeqPlan p = seq_plan(plan, n_seqs, blockIdx.y);
    if (p.n_rows == 0 && p.first == p.replay_from) return;
    const u32 lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const u32 tiles = (hv + 31) / 32;
    const u32 h = blockIdx.x / tiles;
    const u32 j = (blockIdx.x % tiles) * 32 + lane;
    const bool col = j < hv;
    const u32 r = nv / nk, g = h / r, jj = h % r;
    const u32 conv_dim = 2 * nk * HK + nv * hv;
    const u32 iw = conv_dim + 2 * nv;
    const u32 i0 = w * R;  // this warp's first state row
    float* qs = qs_all[w];
    float* ks = ks_all[w];
    const float* sb = S + ((u64)p.slot * nv + h) * HK * hv;
    float* db = D + ((d_per_slot ? (u64)p.slot * nv : 0) + h) * HK * hv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = (col && p.first > 0) ? sb[(u64)(i0 + i) * hv + j] : 0.0f;
    if (col && p.commit_to == p.replay_from) {
#pragma unroll
        for (int i = 0; i < R; i++) db[(u64)(i0 + i) * hv + j] = s[i];
    }
    const bool conv = cv.X != nullptr;
    const bool own_qk = jj == 0 && blockIdx.x % tiles == 0 && w == 0;  // writes this key head's q / k channels
    float* rg = conv ? cv.ring + (u64)p.slot * CONV_RING * conv_dim : nullptr;
    float* Y = (float*)QKV;
    const float scale = 1.0f / sqrtf((float)HK);
    const float a_coef = A[h], dt = DT[h];
    const u32 total = p.first - p.replay_from + p.n_rows;
    for (u32 n = 0; n < total; n++) {
        const u32 pos = p.replay_from + n;
        const float* x;
        const float* ba;
        u32 row = 0;
        if (pos < p.first) {
            x = inputs + ((u64)p.slot * RING + pos % RING) * iw;
            ba = x + conv_dim;
        } else {
            row = p.rows[pos - p.first];
            x = QKV + (u64)row * conv_dim;
            ba = BA + (u64)row * 2 * nv;
        }
        // Every warp normalises the whole q and k (the same operations: the same bits).
        float sq = 0.0f, sk = 0.0f;
        const bool fresh = conv && pos >= p.first;  // this row's q, k, v convolved here
        for (u32 i = lane; i < HK; i += 32) {
            float qv, kv;
            if (fresh) {
                float wt[MAX_CONV_KERNEL];
                const u32 cq = g * HK + i, ck = (nk + g) * HK + i;
                conv_weights(cv.W, cq, cv.kernel, wt);
                qv = conv_silu_at(cv.X, rg, p.rows, p.first, pos, cq, conv_dim, cv.kernel, wt);
                conv_weights(cv.W, ck, cv.kernel, wt);
                kv = conv_silu_at(cv.X, rg, p.rows, p.first, pos, ck, conv_dim, cv.kernel, wt);
                if (own_qk) {
                    Y[(u64)row * conv_dim + cq] = qv;
                    Y[(u64)row * conv_dim + ck] = kv;
                }
            } else {
                qv = x[g * HK + i];
                kv = x[(nk + g) * HK + i];
            }
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sq += __shfl_xor_sync(FULL_MASK, sq, o);
            sk += __shfl_xor_sync(FULL_MASK, sk, o);
        }
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        for (u32 i = lane; i < HK; i += 32) {
            qs[i] = qs[i] * iq * scale;
            ks[i] = ks[i] * ik * 1.0f;
        }
        __syncwarp();
        const float beta = sigmoid_of(ba[g * 2 * r + jj]);
        const float a = ba[g * 2 * r + r + jj] + dt;
        const float sp = a > 20.0f ? a : log1pf(expf(a));
        const float decay = expf(a_coef * sp);
        float v = 0.0f;
        if (col) {
            if (fresh) {
                float wt[MAX_CONV_KERNEL];
                const u32 cvh = 2 * nk * HK + h * hv + j;
                conv_weights(cv.W, cvh, cv.kernel, wt);
                v = conv_silu_at(cv.X, rg, p.rows, p.first, pos, cvh, conv_dim, cv.kernel, wt);
                if (w == 0) Y[(u64)row * conv_dim + cvh] = v;
            } else {
                v = x[2 * nk * HK + h * hv + j];
            }
        }
        float kv = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) s[i] *= decay;
#pragma unroll
        for (int i = 0; i < R; i++) kv += s[i] * ks[i0 + i];
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
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < R; i++) o += s[i] * qs[i0 + i];
            part_o[w][lane] = o;
            __syncthreads();
            if (w == 0 && col) {
                o = part_o[0][lane];
#pragma unroll
                for (int q = 1; q < NW; q++) o += part_o[q][lane];
                O[(u64)row * nv * hv + (u64)h * hv + j] = o;
            }
        }
        if (col && pos + 1 == p.commit_to) {
#pragma unroll
            for (int i = 0; i < R; i++) db[(u64)(i0 + i) * hv + j] = s[i];
        }
        __syncwarp();
    }
    if (!conv || p.n_rows == 0 || w != 0) return;
    if (own_qk)
        for (u32 i = lane; i < HK; i += 32) {
            conv_keep(cv.X, rg, p, g * HK + i, conv_dim);
            conv_keep(cv.X, rg, p, (nk + g) * HK + i, conv_dim);
        }
    if (col) conv_keep(cv.X, rg, p, 2 * nk * HK + h * hv + j, conv_dim);
}

#define GATED_DELTA_KERNEL(HK)                                                                                   \
    extern "C" __global__ void gated_delta_k##HK(const float* QKV, const float* BA, const float* A,              \
                                                 const float* DT, float* O, const float* S, float* D,           \
                                                 u32 d_per_slot, const float* inputs, const u32* plan,          \
                                                 u32 n_seqs, u32 nk, u32 nv, u32 hv) {                          \
        pdl_entry();                                                                                             \
        gated_delta_body<HK>(QKV, BA, A, DT, O, S, D, d_per_slot, inputs, plan, n_seqs, nk, nv, hv);             \
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
        gated_delta_body<HK>(QKV, BA, A, DT, O, S, D, d_per_slot, inputs, plan, n_seqs, nk, nv, hv,              \
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
