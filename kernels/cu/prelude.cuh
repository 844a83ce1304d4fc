// memra kernel prelude: prepended to every kernel source. No CUDA toolkit header is included;
// NVRTC's built-in declarations (threadIdx, __shfl_xor_sync, expf, sqrtf, ...) are all we use.
// Sources are compiled with --fmad=false so every `a * b + c` rounds the product, as the CPU
// reference does.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Every kernel's first statement (programmatic dependent launch, sm_90+): the host launches a
// kernel while the one before it on the stream is still finishing (its blocks get resident and
// run this), `griddepcontrol.wait` holds it until that grid has completed and its memory is
// visible, then `launch_dependents` lets the next kernel do the same. Nothing, neither a read nor
// a write, happens before the wait, so the order of every memory access is the stream's order
// and no output bit can change (one exception: the dense products, products.cu `product_early`,
// request their first weight tiles before the wait; weights are never written while a model is
// loaded); launched without the attribute (below sm_90) both
// instructions return at once. A macro, so that a module can set PDL_TRIGGER before its kernels:
// 0 leaves out `launch_dependents`, and the next kernel is launched as this one's blocks exit
// (products.cu does: F16 decode 8% faster on the H200, session 16; why the early trigger costs
// it is not yet measured).
__device__ __forceinline__ void pdl_entry_(bool trigger) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (trigger) asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
    else asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#define PDL_TRIGGER 1
#define pdl_entry() pdl_entry_(PDL_TRIGGER)
// The wait, then the early trigger whatever the module's PDL_TRIGGER: the small kernels before a
// product (norm_prep, swiglu_prep, ...; a few blocks) let the product's blocks get resident and
// request their first weight tiles (products.cu `product_early`) while they run.
#define pdl_entry_trigger() pdl_entry_(true)

// The logistic sigmoid as the CPU computes it, 1 / (1 + exp(-x)) (IEEE division, the GPU's
// expf): sigmoid_mul, gated_add, the delta rule's beta and a folded shared expert's weight.
__device__ __forceinline__ float sigmoid_of(float x) { return 1.0f / (1.0f + expf(-x)); }

// f16 bits -> f32 (exact) by the PTX conversion instruction.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// bf16 bits -> f32 (exact): the high half of an f32.
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Little-endian u16 at any 1-byte-aligned address.
__device__ __forceinline__ u16 ld_u16(const u8* p) { return (u16)((u32)p[0] | ((u32)p[1] << 8)); }

// f16 stored little-endian at p (GGUF block scales are only 2-byte aligned).
__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32(ld_u16(p)); }

// The 16-lane fixed tree of the CPU's dot_f32 (acc[l] += acc[l + 8], + 4, + 2, + 1) over the
// 16 lanes of a half-warp; every lane of the half gets the total. All 32 lanes must call it.
__device__ __forceinline__ float tree16(float s) {
    s += __shfl_xor_sync(FULL_MASK, s, 8);
    s += __shfl_xor_sync(FULL_MASK, s, 4);
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    return s;
}

// Eight accumulators' warp sums by the fixed xor tree (offsets 16, 8, 4, 2, 1; after each level
// a lane holds its own and its partner's sum), lane 0 storing sum t at out[t]: the F32 row
// products (f32rows.cuh) and the MoE router's logits (moe.cu moe_norm_route) write their
// per-warp partials with it, so both sum in one order. All 32 lanes must call it.
__device__ __forceinline__ void warp_sums8(const float (&acc)[8], float* out) {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, o));
        if ((threadIdx.x & 31) == 0) out[t] = s;
    }
}

// The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of a row of `width` at x, computed by one warp
// (every lane gets it) with the sum of squares in the CPU's dot_f32 order (16 lane sums, tree16,
// the tail in order): rms_norm (norm.cu) and add_norm_prep (products.cu) share it, so their
// bits agree. Explicit _rn operations: the products module compiles with FMA contraction
// allowed, the others without (kernels/src/lib.rs fmad_free), and neither may change these.
// All 32 lanes must call it.
__device__ __forceinline__ float rms_scale_warp(const float* x, u32 width, float eps) {
    const int l = threadIdx.x & 15;
    const u32 w16 = width - width % 16;
    float acc = 0.0f;
    u32 e = l;
    // Eight loads in flight before their squares are added in order (a wide row, e.g. an FFN
    // norm of 2048 values by one warp, is otherwise one dependent load per add).
    for (; e + 7 * 16 < w16; e += 8 * 16) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = x[e + 16 * j];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc = __fadd_rn(acc, __fmul_rn(v[j], v[j]));
    }
    for (; e < w16; e += 16) acc = __fadd_rn(acc, __fmul_rn(x[e], x[e]));
    float ss = tree16(acc);
    for (u32 e = w16; e < width; ++e) ss = __fadd_rn(ss, __fmul_rn(x[e], x[e]));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)width), eps)));
}

// GeGLU with the tanh GELU of one value: ((0.5 x) (1 + tanh(C (x + ((0.044715 x) x) x)))) u,
// C = sqrt(2 / pi) (the f32 constant of the CPU's ops::geglu_tanh), in the CPU's operation
// order; tanhf is the GPU's own. geglu_tanh and geglu_prep (elementwise.cu, compiled without
// FMA contraction like every module but the products) share it.
__device__ __forceinline__ float geglu_tanh_of(float x, float u) {
    const float t = tanhf(0.7978846f * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t) * u;
}

// The expert of token tile b of a grouped expert product (products.cu, mms_grouped_<type>): the
// last e in [0, E) with toff[e] <= b, for the tile offsets toff[0..=E] of moe_group (toff[0] = 0,
// nondecreasing; empty experts repeat an offset; the caller has checked b < toff[E]). Called by
// every lane of a warp alike. Up to 1024 experts in two rounds of 32 loads a warp: the probes
// toff[lane * step] (step = ceil(E / 32) <= 32), whose lanes at or below b form a prefix, then
// toff[lo + lane] within the last such probe's step; more experts by the binary search.
__device__ __forceinline__ u32 moe_tile_expert(const u32* __restrict__ toff, u32 E, u32 b) {
    if (E > 1024) {
        u32 lo = 0, hi = E;  // toff[lo] <= b; the answer is in [lo, hi)
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) / 2;
            if (__ldg(toff + mid) <= b) lo = mid;
            else hi = mid;
        }
        return lo;
    }
    const u32 lane = threadIdx.x & 31, step = (E + 31) / 32;
    const u32 p1 = lane * step;
    const u32 m1 = __ballot_sync(FULL_MASK, p1 < E && __ldg(toff + p1) <= b);
    const u32 lo = (31 - __clz(m1)) * step;
    const u32 p2 = lo + lane;
    const u32 m2 = __ballot_sync(FULL_MASK, lane < step && p2 < E && __ldg(toff + p2) <= b);
    return lo + (31 - __clz(m2));
}
