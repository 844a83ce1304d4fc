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
