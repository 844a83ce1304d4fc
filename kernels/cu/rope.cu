// RoPE by half rotation (NeoX / HF order) from host-computed tables cos/sin[pos][head_dim / 2]
// (f64 angles rounded to f32, as the CPU's Rope::cos_sin). One thread per (row, head, i).
extern "C" __global__ void rope(float* X, const u32* pos, const float* cos_t, const float* sin_t,
                                u32 rows, u32 n_heads, u32 head_dim) {
    const u32 half = head_dim / 2;
    const u64 n = (u64)rows * n_heads * half;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u64 rh = idx / half;
        const u32 i = (u32)(idx % half);
        const u32 r = (u32)(rh / n_heads);
        float* h = X + rh * head_dim;
        const u64 t = (u64)pos[r] * half + i;
        const float c = cos_t[t], s = sin_t[t];
        const float x0 = h[i], x1 = h[half + i];
        h[i] = x0 * c - x1 * s;
        h[half + i] = x1 * c + x0 * s;
    }
}

// Writes each row's K and V (width = n_kv_heads * head_dim values) into the paged caches at
// position index slot[r] = block * block_size + slot (layout [block][slot][kv_head][head_dim]).
extern "C" __global__ void kv_write(float* Kc, float* Vc, const float* K, const float* V, const u32* slot,
                                    u32 rows, u32 width) {
    const u64 n = (u64)rows * width;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u64 r = idx / width, i = idx % width;
        const u64 dst = (u64)slot[r] * width + i;
        Kc[dst] = K[idx];
        Vc[dst] = V[idx];
    }
}

// RoPE of Q (n_heads) and K (n_kv_heads) and the KV cache write, in one pass: thread (row, i)
// for i < (n_heads + n_kv_heads) * head_dim / 2 rotates one pair (same arithmetic as `rope`);
// the K pairs and the matching V values go to the caches at slot[r] (as `kv_write`).
extern "C" __global__ void rope_kv(float* Q, float* K, const float* V, const u32* pos, const float* cos_t,
                                   const float* sin_t, float* Kc, float* Vc, const u32* slot, u32 rows,
                                   u32 n_heads, u32 n_kv_heads, u32 head_dim) {
    const u32 half = head_dim / 2;
    const u32 per_row = (n_heads + n_kv_heads) * half;
    const u64 n = (u64)rows * per_row;
    const u64 width = (u64)n_kv_heads * head_dim;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(idx / per_row), j = (u32)(idx % per_row);
        const u32 hh = j / half, i = j % half;
        const bool isk = hh >= n_heads;
        const u32 h = isk ? hh - n_heads : hh;
        float* x = isk ? K + ((u64)r * n_kv_heads + h) * head_dim : Q + ((u64)r * n_heads + h) * head_dim;
        const u64 t = (u64)pos[r] * half + i;
        const float c = cos_t[t], s = sin_t[t];
        const float x0 = x[i], x1 = x[half + i];
        const float y0 = x0 * c - x1 * s;
        const float y1 = x1 * c + x0 * s;
        x[i] = y0;
        x[half + i] = y1;
        if (isk) {
            const u64 src = (u64)r * width + (u64)h * head_dim;
            const u64 dst = (u64)slot[r] * width + (u64)h * head_dim;
            Kc[dst + i] = y0;
            Kc[dst + half + i] = y1;
            Vc[dst + i] = V[src + i];
            Vc[dst + half + i] = V[src + half + i];
        }
    }
}
