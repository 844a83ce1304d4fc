// Greedy sampling: out[r] = argmax of logits row r (width values), the lowest index on ties.
// NaN never wins. One block of 256 threads per row; thread t scans t, t + 256, ... keeping the
// first maximum; a shared-memory tree then prefers the larger value, then the lower index.
extern "C" __global__ void __launch_bounds__(256) argmax_rows(const float* logits, u32* out, u32 width) {
    __shared__ float best_v[256];
    __shared__ u32 best_i[256];
    const float* x = logits + (u64)blockIdx.x * width;
    float bv = -__int_as_float(0x7f800000);
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = x[i];
        if (v > bv || (bi == 0xffffffffu && v == bv)) {
            bv = v;
            bi = i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const u32 oi = best_i[threadIdx.x + s];
            const float cv = best_v[threadIdx.x];
            const u32 ci = best_i[threadIdx.x];
            if (oi != 0xffffffffu && (ci == 0xffffffffu || ov > cv || (ov == cv && oi < ci))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] == 0xffffffffu ? 0u : best_i[0];
}
