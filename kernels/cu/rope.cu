// Which table row frequency i of row r reads. Plain RoPE: the row's position.
struct PosPlain {
    const u32* pos;
    __device__ __forceinline__ u32 at(u32 r, u32) const { return pos[r]; }
};

// M-RoPE (qwen2vl, qwen3vl; engine/src/ops/rope.rs `Sections`): each row has three positions
// (temporal, height, width) in pos3[3 r + axis], frequency i takes axis(i): contiguous sections
// (the first st temporal, the next sh height, the rest width), or Qwen3-VL's interleaved ones
// (height where i % 3 == 1 && i < 3 sh, width where i % 3 == 2 && i < 3 sw, else temporal).
// The cos / sin values are the plain table's at that position (Rope::cos_sin_at).
struct PosM {
    const u32* pos3;
    u32 st, sh, sw, inter;
    __device__ __forceinline__ u32 axis(u32 i) const {
        if (inter) {
            const u32 m = i % 3;
            if (m == 1 && i < 3 * sh) return 1;
            if (m == 2 && i < 3 * sw) return 2;
            return 0;
        }
        return i < st ? 0 : (i < st + sh ? 1 : 2);
    }
    __device__ __forceinline__ u32 at(u32 r, u32 i) const { return pos3[3 * (u64)r + axis(i)]; }
};

// RoPE by half rotation (NeoX / HF order) from host-computed tables cos/sin[pos][half] (f64
// angles rounded to f32, as the CPU's Rope::cos_sin): the pairs (i, i + half) of each head for
// i < half, `half` at most head_dim / 2 (fewer: partial RoPE, the rest of the head unchanged).
// One thread per (row, head, i). `P` says which table row (PosPlain, PosM).
template <typename P>
__device__ __forceinline__ void rope_body(float* X, P pos, const float* cos_t, const float* sin_t, u32 rows,
                                          u32 n_heads, u32 head_dim, u32 half) {
    const u64 n = (u64)rows * n_heads * half;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u64 rh = idx / half;
        const u32 i = (u32)(idx % half);
        const u32 r = (u32)(rh / n_heads);
        float* h = X + rh * head_dim;
        const u64 t = (u64)pos.at(r, i) * half + i;
        const float c = cos_t[t], s = sin_t[t];
        const float x0 = h[i], x1 = h[half + i];
        h[i] = x0 * c - x1 * s;
        h[half + i] = x1 * c + x0 * s;
    }
}

extern "C" __global__ void rope(float* X, const u32* pos, const float* cos_t, const float* sin_t,
                                u32 rows, u32 n_heads, u32 head_dim, u32 half) {
    pdl_entry();
    rope_body(X, PosPlain{pos}, cos_t, sin_t, rows, n_heads, head_dim, half);
}

// `rope` at M-RoPE positions: pos3 holds (t, h, w) per row, the sections st / sh / sw and the
// layout `inter` as PosM.
extern "C" __global__ void rope_mrope(float* X, const u32* pos3, u32 st, u32 sh, u32 sw, u32 inter,
                                      const float* cos_t, const float* sin_t, u32 rows, u32 n_heads,
                                      u32 head_dim, u32 half) {
    pdl_entry();
    rope_body(X, PosM{pos3, st, sh, sw, inter}, cos_t, sin_t, rows, n_heads, head_dim, half);
}

// Writes each row's K and V (width = n_kv_heads * head_dim values) into the paged caches (kvfmt.cuh)
// at row index slot[r] = block * block_size + slot (layout [block][slot][kv_head][head_dim]).
template <typename F>
__device__ __forceinline__ void kv_write_body(u8* Kc, u8* Vc, const float* K, const float* V, const u32* slot,
                                              u32 rows, u32 width) {
    const u64 n = (u64)rows * width;
    const u64 rb = F::row_bytes(width);
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u64 r = idx / width;
        const u32 i = (u32)(idx % width);
        F::st(Kc + slot[r] * rb, i, K[idx]);
        F::st(Vc + slot[r] * rb, i, V[idx]);
    }
}

#define KV_WRITE_KERNEL(suffix, FMT)                                                                    \
    extern "C" __global__ void kv_write_##suffix(u8* Kc, u8* Vc, const float* K, const float* V,        \
                                                 const u32* slot, u32 rows, u32 width) { pdl_entry();                \
        kv_write_body<FMT>(Kc, Vc, K, V, slot, rows, width);                                            \
    }

KV_WRITE_KERNEL(f32, KvF32)
KV_WRITE_KERNEL(f16, KvF16)
KV_WRITE_KERNEL(bf16, KvBF16)

// Q8_0 rows (ggml's arithmetic, as engine/src/kv_format.rs): one warp per (row, 32-value block) of
// K and of V: d = max|x| / 127 (the warp's xor max: exact), q = roundf(x * (1 / d)), scale f16(d).
extern "C" __global__ void kv_write_q8_0(u8* Kc, u8* Vc, const float* K, const float* V, const u32* slot,
                                         u32 rows, u32 width) {
    pdl_entry();
    const u32 lane = threadIdx.x & 31;
    const u32 nb = width / 32;
    const u64 rb = KvQ8::row_bytes(width);
    const u64 warps = (u64)rows * nb * 2;
    for (u64 wi = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; wi < warps;
         wi += ((u64)gridDim.x * blockDim.x) >> 5) {
        const bool isv = wi >= (u64)rows * nb;
        const u64 j = isv ? wi - (u64)rows * nb : wi;
        const u64 r = j / nb;
        const u32 b = (u32)(j % nb);
        const float x = (isv ? V : K)[r * width + b * 32 + lane];
        float amax = fabsf(x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        u8* row = (isv ? Vc : Kc) + slot[r] * rb;
        row[b * 32 + lane] = (u8)(i8)roundf(__fmul_rn(x, id));
        if (lane == 0) ((u16*)(row + width))[b] = (u16)(h2_sat(d, 0.0f) & 0xffffu);
    }
}

// RoPE of Q (n_heads) and K (n_kv_heads) and the KV cache write, in one pass: thread (row, i)
// for i < (n_heads + n_kv_heads) * head_dim / 2; within a head, i < rot (the table's half, at
// most head_dim / 2) rotates the pair (i, i + rot) (same arithmetic as `rope`), i >= rot moves
// the two unrotated values rot + i and head_dim / 2 + i (partial RoPE). The K values and the
// matching V values go to the caches at slot[r] (as `kv_write`). KvQ8 stores nothing
// (`rope_kv_q8_0` is RoPE of Q and K only; kv_write_q8_0 follows).
template <typename F, typename P>
__device__ __forceinline__ void rope_kv_body(float* Q, float* K, const float* V, P pos, const float* cos_t,
                                             const float* sin_t, u8* Kc, u8* Vc, const u32* slot, u32 rows,
                                             u32 n_heads, u32 n_kv_heads, u32 head_dim, u32 rot) {
    const u32 half = head_dim / 2;
    const u32 per_row = (n_heads + n_kv_heads) * half;
    const u64 n = (u64)rows * per_row;
    const u64 width = (u64)n_kv_heads * head_dim;
    const u64 rb = F::row_bytes(width);
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(idx / per_row), j = (u32)(idx % per_row);
        const u32 hh = j / half, i = j % half;
        const bool isk = hh >= n_heads;
        const u32 h = isk ? hh - n_heads : hh;
        float* x = isk ? K + ((u64)r * n_kv_heads + h) * head_dim : Q + ((u64)r * n_heads + h) * head_dim;
        // The two values of this thread: a rotated pair, or two unrotated ones.
        const u32 e0 = i < rot ? i : rot + i;
        const u32 e1 = i < rot ? rot + i : half + i;
        float y0 = x[e0], y1 = x[e1];
        if (i < rot) {
            const u64 t = (u64)pos.at(r, i) * rot + i;
            const float c = cos_t[t], s = sin_t[t];
            const float x0 = y0, x1 = y1;
            y0 = x0 * c - x1 * s;
            y1 = x1 * c + x0 * s;
            x[e0] = y0;
            x[e1] = y1;
        }
        if (isk) {
            const u64 src = (u64)r * width + (u64)h * head_dim;
            u8* kr = Kc + slot[r] * rb;
            u8* vr = Vc + slot[r] * rb;
            const u32 c0 = h * head_dim;
            F::st(kr, c0 + e0, y0);
            F::st(kr, c0 + e1, y1);
            F::st(vr, c0 + e0, V[src + e0]);
            F::st(vr, c0 + e1, V[src + e1]);
        }
    }
}

#define ROPE_KV_KERNEL(suffix, FMT)                                                                       \
    extern "C" __global__ void rope_kv_##suffix(float* Q, float* K, const float* V, const u32* pos,       \
                                                const float* cos_t, const float* sin_t, u8* Kc, u8* Vc,   \
                                                const u32* slot, u32 rows, u32 n_heads, u32 n_kv_heads,   \
                                                u32 head_dim, u32 rot) { pdl_entry();                                  \
        rope_kv_body<FMT>(Q, K, V, PosPlain{pos}, cos_t, sin_t, Kc, Vc, slot, rows, n_heads, n_kv_heads,     \
                          head_dim, rot);                                                                   \
    }

// rope_kv at M-RoPE positions (pos3 and the sections as `rope_mrope`).
#define ROPE_KV_MROPE_KERNEL(suffix, FMT)                                                                 \
    extern "C" __global__ void rope_kv_mrope_##suffix(                                                     \
        float* Q, float* K, const float* V, const u32* pos3, u32 st, u32 sh, u32 sw, u32 inter,            \
        const float* cos_t, const float* sin_t, u8* Kc, u8* Vc, const u32* slot, u32 rows, u32 n_heads,    \
        u32 n_kv_heads, u32 head_dim, u32 rot) { pdl_entry();                                               \
        rope_kv_body<FMT>(Q, K, V, PosM{pos3, st, sh, sw, inter}, cos_t, sin_t, Kc, Vc, slot, rows,        \
                          n_heads, n_kv_heads, head_dim, rot);                                              \
    }

// rope_kv with the per-head RMSNorm of q and k before RoPE (qwen3 / Gemma 3 q_norm, k_norm),
// one warp per (row, head): the head's scale by rms_scale_warp and y = (x * scale) * W, the
// operations of rms_norm (norm.cu) on a row of head_dim, then rope_kv_body's rotation and cache
// stores; the normalized (and rotated) values go back to Q / K as the two launches leave them.
// The bits of rms_norm (q), rms_norm (k), rope_kv.
template <typename F, typename P>
__device__ __forceinline__ void rope_kv_norm_body(float* Q, float* K, const float* V, P pos,
                                                  const float* cos_t, const float* sin_t, u8* Kc, u8* Vc,
                                                  const u32* slot, const float* __restrict__ qn,
                                                  const float* __restrict__ kn, float eps, u32 rows, u32 n_heads,
                                                  u32 n_kv_heads, u32 head_dim, u32 rot) {
    const u32 half = head_dim / 2;
    const u32 per_row = n_heads + n_kv_heads;
    const u64 n = (u64)rows * per_row;
    const u64 width = (u64)n_kv_heads * head_dim;
    const u64 rb = F::row_bytes(width);
    const u32 lane = threadIdx.x & 31;
    const u64 nwarps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 wi = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; wi < n; wi += nwarps) {
        const u32 r = (u32)(wi / per_row), hh = (u32)(wi % per_row);
        const bool isk = hh >= n_heads;
        const u32 h = isk ? hh - n_heads : hh;
        float* x = isk ? K + ((u64)r * n_kv_heads + h) * head_dim : Q + ((u64)r * n_heads + h) * head_dim;
        const float* W = isk ? kn : qn;
        const float scale = rms_scale_warp(x, head_dim, eps);
        const u64 src = (u64)r * width + (u64)h * head_dim;
        u8* kr = Kc + slot[r] * rb;
        u8* vr = Vc + slot[r] * rb;
        const u32 c0 = h * head_dim;
        // Pair i with what it reads (its two values, their norm weights, cos / sin, V): normalized,
        // rotated, written back, K and V cached.
        struct In {
            float x0, x1, w0, w1, c, s, v0, v1;
        };
        auto load = [&](u32 i) {
            const u32 e0 = i < rot ? i : rot + i;
            const u32 e1 = i < rot ? rot + i : half + i;
            In a{x[e0], x[e1], W[e0], W[e1], 0.0f, 0.0f, 0.0f, 0.0f};
            if (i < rot) {
                const u64 t = (u64)pos.at(r, i) * rot + i;
                a.c = cos_t[t];
                a.s = sin_t[t];
            }
            if (isk) {
                a.v0 = V[src + e0];
                a.v1 = V[src + e1];
            }
            return a;
        };
        auto store = [&](u32 i, const In& a) {
            const u32 e0 = i < rot ? i : rot + i;
            const u32 e1 = i < rot ? rot + i : half + i;
            float y0 = (a.x0 * scale) * a.w0, y1 = (a.x1 * scale) * a.w1;
            if (i < rot) {
                const float x0 = y0, x1 = y1;
                y0 = x0 * a.c - x1 * a.s;
                y1 = x1 * a.c + x0 * a.s;
            }
            x[e0] = y0;
            x[e1] = y1;
            if (isk) {
                F::st(kr, c0 + e0, y0);
                F::st(kr, c0 + e1, y1);
                F::st(vr, c0 + e0, a.v0);
                F::st(vr, c0 + e1, a.v1);
            }
        };
        // The lane's first four pairs (head_dim <= 256: all of them) read before any store: Q / K
        // are written in place, so a read after a store would wait behind it.
        In in[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 i = lane + 32 * j;
            if (i < half) in[j] = load(i);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 i = lane + 32 * j;
            if (i < half) store(i, in[j]);
        }
        for (u32 i = lane + 128; i < half; i += 32) store(i, load(i));
        __syncwarp();
    }
}

#define ROPE_KV_NORM_KERNEL(suffix, FMT)                                                                   \
    extern "C" __global__ void rope_kv_norm_##suffix(                                                      \
        float* Q, float* K, const float* V, const u32* pos, const float* cos_t, const float* sin_t, u8* Kc, \
        u8* Vc, const u32* slot, const float* qn, const float* kn, float eps, u32 rows, u32 n_heads,       \
        u32 n_kv_heads, u32 head_dim, u32 rot) { pdl_entry();                                               \
        rope_kv_norm_body<FMT>(Q, K, V, PosPlain{pos}, cos_t, sin_t, Kc, Vc, slot, qn, kn, eps, rows,      \
                               n_heads, n_kv_heads, head_dim, rot);                                         \
    }

// rope_kv_norm at M-RoPE positions (pos3 and the sections as `rope_mrope`).
#define ROPE_KV_NORM_MROPE_KERNEL(suffix, FMT)                                                            \
    extern "C" __global__ void rope_kv_norm_mrope_##suffix(                                                \
        float* Q, float* K, const float* V, const u32* pos3, u32 st, u32 sh, u32 sw, u32 inter,            \
        const float* cos_t, const float* sin_t, u8* Kc, u8* Vc, const u32* slot, const float* qn,          \
        const float* kn, float eps, u32 rows, u32 n_heads, u32 n_kv_heads, u32 head_dim, u32 rot) {         \
        pdl_entry();                                                                                       \
        rope_kv_norm_body<FMT>(Q, K, V, PosM{pos3, st, sh, sw, inter}, cos_t, sin_t, Kc, Vc, slot, qn, kn, \
                               eps, rows, n_heads, n_kv_heads, head_dim, rot);                              \
    }

ROPE_KV_NORM_KERNEL(f32, KvF32)
ROPE_KV_NORM_KERNEL(f16, KvF16)
ROPE_KV_NORM_KERNEL(bf16, KvBF16)
ROPE_KV_NORM_KERNEL(q8_0, KvQ8)

ROPE_KV_KERNEL(f32, KvF32)
ROPE_KV_KERNEL(f16, KvF16)
ROPE_KV_KERNEL(bf16, KvBF16)
ROPE_KV_KERNEL(q8_0, KvQ8)

ROPE_KV_MROPE_KERNEL(f32, KvF32)
ROPE_KV_MROPE_KERNEL(f16, KvF16)
ROPE_KV_MROPE_KERNEL(bf16, KvBF16)
ROPE_KV_MROPE_KERNEL(q8_0, KvQ8)

ROPE_KV_NORM_MROPE_KERNEL(f32, KvF32)
ROPE_KV_NORM_MROPE_KERNEL(f16, KvF16)
ROPE_KV_NORM_MROPE_KERNEL(bf16, KvBF16)
ROPE_KV_NORM_MROPE_KERNEL(q8_0, KvQ8)
