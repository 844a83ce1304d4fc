// Causal attention over the paged KV cache, one warp per (row, head), the CPU reference's
// arithmetic in the same order (backend/cpu/attention.rs):
//   1. score[p] = dot_f32(q, k_p) * scale for p = 0..=pos (lane p % 32 computes position p with
//      the 16-accumulator order and fixed tree in registers), kept in `scores`;
//   2. max over all scores (exact whatever the order), score[p] = exp(score[p] - max);
//   3. every lane walks p = 0..=pos IN ORDER: sum += w_p, o[d] += w_p * v_p[d] for its dims
//      d = lane + 32 j; out[d] = o[d] * (1 / sum).
// Nothing depends on the other rows, M, or the launch: same bits in prefill and decode.
// GQA: head h reads KV head h / (n_heads / n_kv_heads). head_dim <= 256.
// scores: score_stride floats per (row, head) of this launch, indexed by the launch's row.

#define ATTN_MAX_DIMS_PER_LANE 8

extern "C" __global__ void __launch_bounds__(128) attention(
    const float* __restrict__ Q, float* __restrict__ O, const float* __restrict__ Kc,
    const float* __restrict__ Vc, const u32* __restrict__ pos, const u32* __restrict__ row_seq,
    const u32* __restrict__ table_off, const u32* __restrict__ tables, float* scores, u64 score_stride,
    u32 rows, u32 n_heads, u32 n_kv_heads, u32 head_dim, u32 block_size, float scale) {
    const u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (gw >= rows * n_heads) return;  // uniform over the warp
    const int lane = threadIdx.x & 31;
    const u32 r = gw / n_heads, h = gw % n_heads;
    const u32 kvh = h / (n_heads / n_kv_heads);
    const u64 width = (u64)n_kv_heads * head_dim;
    const float* q = Q + (u64)gw * head_dim;
    float* out = O + (u64)gw * head_dim;
    const u32 n = pos[r] + 1;
    const u32* tab = tables + table_off[row_seq[r]];
    float* sc = scores + (u64)gw * score_stride;
    const u32 hd16 = head_dim - head_dim % 16;

    // 1. scores, and each lane's running max.
    float mx = -__int_as_float(0x7f800000);
    for (u32 p = lane; p < n; p += 32) {
        const float* k = Kc + ((u64)tab[p / block_size] * block_size + p % block_size) * width + (u64)kvh * head_dim;
        float acc[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
        for (u32 e0 = 0; e0 < hd16; e0 += 16) {
#pragma unroll
            for (int j = 0; j < 16; ++j) acc[j] = acc[j] + q[e0 + j] * k[e0 + j];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = acc[j] + acc[j + 8];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = acc[j] + acc[j + 4];
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[j] = acc[j] + acc[j + 2];
        float s = acc[0] + acc[1];
        for (u32 e = hd16; e < head_dim; ++e) s = s + q[e] * k[e];
        s = s * scale;
        sc[p] = s;
        mx = fmaxf(mx, s);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));

    // 2. unnormalized weights.
    for (u32 p = lane; p < n; p += 32) sc[p] = expf(sc[p] - mx);
    __syncwarp();

    // 3. weighted sum of V in position order.
    float o[ATTN_MAX_DIMS_PER_LANE];
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DIMS_PER_LANE; ++j) o[j] = 0.0f;
    float sum = 0.0f;
    for (u32 p = 0; p < n; ++p) {
        const float w = sc[p];
        sum = sum + w;
        const float* v = Vc + ((u64)tab[p / block_size] * block_size + p % block_size) * width + (u64)kvh * head_dim;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DIMS_PER_LANE; ++j) {
            const u32 d = lane + 32 * j;
            if (d < head_dim) o[j] = o[j] + w * v[d];
        }
    }
    const float inv = 1.0f / sum;
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DIMS_PER_LANE; ++j) {
        const u32 d = lane + 32 * j;
        if (d < head_dim) out[d] = o[j] * inv;
    }
}
