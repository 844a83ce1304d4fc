// RMSNorm, one warp per row of `width`: Y = (X * (1 / sqrt(mean(X^2) + eps))) * W, with the sum
// of squares in the CPU's dot_f32 order (16 lane sums, tree16, tail in order); every lane
// computes the same total. Y may alias X (per-head q/k norm in place): the __syncwarp orders
// every read before the first write.
extern "C" __global__ void __launch_bounds__(256) rms_norm(const float* X, const float* W, float* Y,
                                                            u32 rows, u32 width, float eps) {
    pdl_entry();
    const u32 r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;  // uniform over the warp
    const int lane = threadIdx.x & 31;
    const float* x = X + (u64)r * width;
    float* y = Y + (u64)r * width;
    const float scale = rms_scale_warp(x, width, eps);
    __syncwarp();
    // Eight values per lane loaded before any is stored: y may alias x, so the compiler keeps
    // a load after an earlier store, and one value per iteration is one memory latency each
    // (a 2048-wide FFN norm by one warp took ~30 us that way).
    u32 e = lane;
    for (; e + 7 * 32 < width; e += 8 * 32) {
        float v[8], w[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            v[j] = x[e + 32 * j];
            w[j] = W[e + 32 * j];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) y[e + 32 * j] = (v[j] * scale) * w[j];
    }
    for (; e < width; e += 32) y[e] = (x[e] * scale) * W[e];
}
