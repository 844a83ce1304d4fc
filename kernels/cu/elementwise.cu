// Elementwise and row-gather kernels. Each output element is computed by one thread from its
// own inputs only, so nothing depends on the launch geometry.

// x[i] += y[i] (residual add), i < n.
extern "C" __global__ void add_in_place(float* x, const float* y, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = x[i] + y[i];
    }
}

// x[m][j] += b[j] for rows of `width`, n = rows * width.
extern "C" __global__ void add_bias(float* x, const float* b, u64 n, u32 width) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = x[i] + b[i % width];
    }
}

// SwiGLU: g = (g / (1 + exp(-g))) * u, as the CPU's ops::swiglu.
extern "C" __global__ void swiglu(float* g, const float* u, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = g[i];
        float s = x / (1.0f + expf(-x));
        g[i] = s * u[i];
    }
}

// GeGLU with the tanh GELU: g = geglu_tanh_of(g, u) (prelude.cuh; docs/VERIFY.md: within 1e-6
// of the CPU, relative to the largest value).
extern "C" __global__ void geglu_tanh(float* g, const float* u, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        g[i] = geglu_tanh_of(g[i], u[i]);
    }
}

// GeGLU fused with the preparation of the product that reads it: v = geglu_tanh_of(g, u) for
// rows of `width` (geglu_tanh's bits), written as f32 to Y (when not null; Y may be G) and
// prepared into Xh / Xs (prep.cuh, as products.cu's swiglu_prep). One warp per (row, block).
extern "C" __global__ void geglu_prep(const float* G, const float* __restrict__ U, float* Y, u16* __restrict__ Xh,
                                      float* __restrict__ Xs, u32 M, u32 width, u32 kp, u32 bf) {
    pdl_entry();
    auto geglu = [](float g, float u) { return geglu_tanh_of(g, u); };
    glu_prep_rows(geglu, G, U, Y, Xh, Xs, M, width, kp, bf);
}

// The sigmoid of value i's gate, for rows of `width` values and `gwidth` gates a row (one gate
// per group of width / gwidth values): sigmoid_mul's and gated_add's factor.
__device__ __forceinline__ float gate_of(const float* g, u64 i, u32 width, u32 gwidth) {
    const u64 r = i / width;
    const u32 c = (u32)(i % width);
    return sigmoid_of(g[r * gwidth + c / (width / gwidth)]);
}

// Gating: x[r][c] *= 1 / (1 + exp(-g[r][c / (width / gwidth)])) for rows of `width` values and
// `gwidth` gates (one gate per group of values), n = rows * width: the CPU's sigmoid_mul.
extern "C" __global__ void sigmoid_mul(float* x, const float* g, u64 n, u32 width, u32 gwidth) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = x[i] * gate_of(g, i, width, gwidth);
    }
}

// A gated shared expert's output added to the routed experts' and into the residual: for rows of
// `width`, v = s * sigmoid(g) (`gwidth` gates per row, as sigmoid_mul), o += v, x += o (o keeps
// the FFN's output; s is left as it was): the bits of sigmoid_mul + add_in_place (o) +
// add_in_place (x), n = rows * width.
extern "C" __global__ void gated_add(float* x, float* o, const float* s, const float* g, u64 n, u32 width,
                                     u32 gwidth) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float ov = o[i] + s[i] * gate_of(g, i, width, gwidth);
        o[i] = ov;
        x[i] = x[i] + ov;
    }
}

// x[i] *= s, i < n (Gemma's embedding scale): the CPU's one rounded product, bit for bit.
extern "C" __global__ void scale_in_place(float* x, float s, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = x[i] * s;
    }
}

// Logit softcapping: x[i] = cap * tanh(x[i] / cap), i < n (IEEE division; the GPU's tanhf).
extern "C" __global__ void softcap(float* x, float cap, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = cap * tanhf(x[i] / cap);
    }
}

// dst[r][j] = src[idx[r]][j] for r < rows, j < width.
extern "C" __global__ void gather_rows(float* dst, const float* src, const u32* idx, u32 rows, u32 width) {
    pdl_entry();
    u64 n = (u64)rows * width;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 r = i / width, j = i % width;
        dst[i] = src[(u64)idx[r] * width + j];
    }
}

// dst[dst_off + i] = src[src_off + i] for i < n (KV block copies within one cache buffer).
extern "C" __global__ void copy_range(float* buf, u64 src_off, u64 dst_off, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        buf[dst_off + i] = buf[src_off + i];
    }
}

// Fills x[0..n) with v (poisoning output buffers in tests).
extern "C" __global__ void fill_f32(float* x, float v, u64 n) {
    pdl_entry();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = v;
    }
}
