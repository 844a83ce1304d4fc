// Probe (H200, sm_90a): does wgmma m64nNk16 (A from registers, B from shared memory) give the
// same f32 bits as mma.sync m16n8k16 for the same A, B and accumulator? KERNELS.md allows a
// wgmma product only if it is bit-identical to the mma.sync path; this measures it.
//
// Build and run on the GPU machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o wgmma_bits wgmma_bits.cu && ./wgmma_bits
//
// Cases: f16 and bf16, N = 8 / 64 / 256 columns, chains of 1 and 64 k16 steps from random
// accumulators, value distributions with wide exponent ranges and heavy cancellation; and, as a
// side question, whether mma.sync's result depends on the order of k inside one k16 step (the
// same permutation applied to A's and B's k). Prints mismatch counts; exit 1 on any mismatch.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef uint32_t u32;
typedef uint16_t u16;

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

template <int BF>
__device__ __forceinline__ void mma16816(const u32 a[4], u32 b0, u32 b1, float c[4]) {
    if (BF) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// A: [steps][64 rows][16 k] 16-bit; B: [steps][N cols][16 k]; C/D: [64][N] f32.
// Reference path: every warp w takes rows 16w..16w+15 and walks n8 fragments with mma.sync.
template <int BF>
__global__ void ref_mma(const u16* A, const u16* B, const float* C, float* D, int N, int steps, const int* perm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    for (int nf = 0; nf < N / 8; ++nf) {
        float c[4];
        const int r0 = 16 * w + g, r1 = r0 + 8, c0 = nf * 8 + 2 * t;
        c[0] = C[r0 * N + c0];
        c[1] = C[r0 * N + c0 + 1];
        c[2] = C[r1 * N + c0];
        c[3] = C[r1 * N + c0 + 1];
        for (int s = 0; s < steps; ++s) {
            const u16* As = A + s * 64 * 16;
            const u16* Bs = B + s * N * 16;
            auto ka = [&](int k) { return perm ? perm[k] : k; };
            auto pa = [&](int r, int k) { return (u32)As[r * 16 + ka(k)] | ((u32)As[r * 16 + ka(k + 1)] << 16); };
            auto pb = [&](int n, int k) { return (u32)Bs[n * 16 + ka(k)] | ((u32)Bs[n * 16 + ka(k + 1)] << 16); };
            const u32 a[4] = {pa(r0, 2 * t), pa(r1, 2 * t), pa(r0, 8 + 2 * t), pa(r1, 8 + 2 * t)};
            const int n = nf * 8 + g;
            mma16816<BF>(a, pb(n, 2 * t), pb(n, 8 + 2 * t), c);
        }
        D[r0 * N + c0] = c[0];
        D[r0 * N + c0 + 1] = c[1];
        D[r1 * N + c0] = c[2];
        D[r1 * N + c0 + 1] = c[3];
    }
}

__device__ __forceinline__ unsigned long long desc_of(const void* smem, u32 lbo, u32 sbo) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem);
    unsigned long long d = 0;
    d |= (unsigned long long)((addr >> 4) & 0x3FFF);
    d |= (unsigned long long)((lbo >> 4) & 0x3FFF) << 16;
    d |= (unsigned long long)((sbo >> 4) & 0x3FFF) << 32;
    return d;  // layout type 0: no swizzle (core matrices of 8 rows x 16 bytes)
}

// wgmma m64nNk16 with A from registers (the mma.sync A fragment of each warp's 16 rows) and B
// from shared memory: no swizzle, K-major. Core matrix (k-half kc, column group ng) = 8 columns x
// 8 k values, 128 contiguous bytes, at (ng * 2 + kc) * 128: LBO (next k core) = 128, SBO (next
// 8 columns) = 256.

template <int BF, int NN>
__device__ __forceinline__ void wgmma_step(float* d, const u32 a[4], unsigned long long desc);

#define D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])

#define WG8(TYS, BFV)                                                                                      \
    template <>                                                                                            \
    __device__ __forceinline__ void wgmma_step<BFV, 8>(float* d, const u32 a[4], unsigned long long desc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                           \
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32." TYS "." TYS                              \
                     " {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"                                  \
                     : D4(0)                                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));                           \
    }
WG8("f16", 0)
WG8("bf16", 1)

#define WG64(TYS, BFV)                                                                                      \
    template <>                                                                                             \
    __device__ __forceinline__ void wgmma_step<BFV, 64>(float* d, const u32 a[4], unsigned long long desc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                            \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYS "." TYS                              \
                     " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"     \
                     " {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"                                             \
                     : D4(0), D4(4), D4(8), D4(12), D4(16), D4(20), D4(24), D4(28)                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));                            \
    }
WG64("f16", 0)
WG64("bf16", 1)

template <int BF, int NN>
__global__ void wg_mma(const u16* A, const u16* B, const float* C, float* D, int steps, u32 lbo, u32 sbo) {
    __shared__ __align__(128) u16 sb[NN * 16];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    constexpr int ND = NN / 2;  // accumulators per thread
    float d[ND];
    // D fragment of m64nNk16: warp w rows 16w + g (+8), columns 8 j + 2t (+1): d[4j + e].
    const int r0 = 16 * w + g, r1 = r0 + 8;
    for (int j = 0; j < NN / 8; ++j) {
        const int c0 = 8 * j + 2 * t;
        d[4 * j + 0] = C[r0 * NN + c0];
        d[4 * j + 1] = C[r0 * NN + c0 + 1];
        d[4 * j + 2] = C[r1 * NN + c0];
        d[4 * j + 3] = C[r1 * NN + c0 + 1];
    }
    for (int s = 0; s < steps; ++s) {
        const u16* As = A + s * 64 * 16;
        const u16* Bs = B + s * NN * 16;
        __syncthreads();
        for (int i = threadIdx.x; i < NN * 16; i += blockDim.x) {
            const int n = i / 16, k = i % 16;
            const int kc = k / 8, ng = n / 8;
            sb[(ng * 2 + kc) * 64 + (n % 8) * 8 + (k % 8)] = Bs[n * 16 + k];
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        auto pa = [&](int r, int k) { return (u32)As[r * 16 + k] | ((u32)As[r * 16 + k + 1] << 16); };
        const u32 a[4] = {pa(r0, 2 * t), pa(r1, 2 * t), pa(r0, 8 + 2 * t), pa(r1, 8 + 2 * t)};
        const unsigned long long desc = desc_of(sb, lbo, sbo);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma_step<BF, NN>(d, a, desc);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    for (int j = 0; j < NN / 8; ++j) {
        const int c0 = 8 * j + 2 * t;
        D[r0 * NN + c0] = d[4 * j + 0];
        D[r0 * NN + c0 + 1] = d[4 * j + 1];
        D[r1 * NN + c0] = d[4 * j + 2];
        D[r1 * NN + c0 + 1] = d[4 * j + 3];
    }
}

static uint64_t rng = 88172645463325252ull;
static u32 rnd() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (u32)(rng >> 11);
}
static float urand() { return (rnd() & 0xFFFFFF) / 16777216.0f; }

static u16 f2h(float f) {  // round to nearest even f32 -> f16 (normal range only)
    u32 x;
    memcpy(&x, &f, 4);
    const u32 sign = (x >> 16) & 0x8000;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    u32 m = x & 0x7fffff;
    if (e <= 0) return (u16)sign;
    if (e >= 31) return (u16)(sign | 0x7bff);
    u32 h = sign | (e << 10) | (m >> 13);
    const u32 rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return (u16)h;
}
static u16 f2b(float f) {
    u32 x;
    memcpy(&x, &f, 4);
    const u32 r = x + 0x7fff + ((x >> 16) & 1);
    return (u16)(r >> 16);
}

// Distribution kinds: 0 uniform [-1, 1]; 1 wide exponents (2^-8..2^8); 2 cancellation (pairs of
// near-opposite large values plus small ones).
static float sample(int kind, int k) {
    const float s = (rnd() & 1) ? -1.0f : 1.0f;
    if (kind == 0) return s * urand();
    if (kind == 1) return s * (0.5f + urand()) * ldexpf(1.0f, (int)(rnd() % 17) - 8);
    return (k % 2 == 0) ? s * (8.0f + urand()) : ((rnd() & 1) ? -1.0f : 1.0f) * urand() * 0.01f;
}

template <int BF, int NN>
static long run_case(int kind, int steps, int trials, bool perm_test, u32 lbo = 128, u32 sbo = 256) {
    const size_t na = (size_t)steps * 64 * 16, nb = (size_t)steps * NN * 16, nc = 64 * NN;
    std::vector<u16> A(na), B(nb);
    std::vector<float> C(nc), D1(nc), D2(nc);
    u16 *dA, *dB;
    float *dC, *dD1, *dD2;
    int* dperm;
    CK(cudaMalloc(&dA, na * 2));
    CK(cudaMalloc(&dB, nb * 2));
    CK(cudaMalloc(&dC, nc * 4));
    CK(cudaMalloc(&dD1, nc * 4));
    CK(cudaMalloc(&dD2, nc * 4));
    CK(cudaMalloc(&dperm, 16 * 4));
    long bad = 0, maxulp = 0;
    for (int tr = 0; tr < trials; ++tr) {
        for (size_t i = 0; i < na; ++i) {
            const float v = sample(kind, (int)(i % 16));
            A[i] = BF ? f2b(v) : f2h(v);
        }
        for (size_t i = 0; i < nb; ++i) {
            const float v = sample(kind == 2 ? 0 : kind, (int)(i % 16));
            B[i] = BF ? f2b(v) : f2h(v);
        }
        for (size_t i = 0; i < nc; ++i) C[i] = (kind == 2 ? 1e-3f : 1.0f) * sample(kind == 2 ? 0 : kind, 0) * 4.0f;
        CK(cudaMemcpy(dA, A.data(), na * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, B.data(), nb * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dC, C.data(), nc * 4, cudaMemcpyHostToDevice));
        ref_mma<BF><<<1, 128>>>(dA, dB, dC, dD1, NN, steps, nullptr);
        if (perm_test) {
            int p[16];
            for (int i = 0; i < 16; ++i) p[i] = i;
            for (int i = 15; i > 0; --i) {
                const int j = rnd() % (i + 1);
                const int x = p[i];
                p[i] = p[j];
                p[j] = x;
            }
            CK(cudaMemcpy(dperm, p, 64, cudaMemcpyHostToDevice));
            ref_mma<BF><<<1, 128>>>(dA, dB, dC, dD2, NN, steps, dperm);
        } else {
            wg_mma<BF, NN><<<1, 128>>>(dA, dB, dC, dD2, steps, lbo, sbo);
        }
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(D1.data(), dD1, nc * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(D2.data(), dD2, nc * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nc; ++i) {
            int32_t x, y;
            memcpy(&x, &D1[i], 4);
            memcpy(&y, &D2[i], 4);
            if (x != y) {
                ++bad;
                const long u = labs((long)x - (long)y);
                if (u > maxulp) maxulp = u;
            }
        }
        if (tr == 0 && !perm_test) {  // sanity: the mma.sync result vs a double reference
            double worst = 0;
            for (int r = 0; r < 64; ++r)
                for (int n = 0; n < NN; ++n) {
                    double ref = C[r * NN + n];
                    for (int s = 0; s < steps; ++s)
                        for (int k = 0; k < 16; ++k) {
                            auto val = [&](u16 h) {
                                u32 x;
                                if (BF) {
                                    x = (u32)h << 16;
                                } else {
                                    const u32 sg = (h & 0x8000) << 16;
                                    const int e = (h >> 10) & 31;
                                    const u32 m = h & 0x3ff;
                                    x = e == 0 ? sg : sg | ((u32)(e - 15 + 127) << 23) | (m << 13);
                                }
                                float f;
                                memcpy(&f, &x, 4);
                                return (double)f;
                            };
                            ref += val(A[(size_t)s * 1024 + r * 16 + k]) * val(B[(size_t)s * NN * 16 + n * 16 + k]);
                        }
                    const double e = fabs(ref - D1[r * NN + n]) / (1e-6 + fabs(ref));
                    if (e > worst) worst = e;
                }
            printf("    (mma.sync vs f64: worst rel err %.3g)\n", worst);
        }
    }
    printf("%-5s N=%-3d kind=%d steps=%-3d trials=%-4d %-18s lbo %u sbo %u: mismatches %ld of %ld (max ulp %ld)\n",
           BF ? "bf16" : "f16", NN, kind, steps, trials, perm_test ? "mma k-permuted" : "wgmma vs mma.sync", lbo, sbo,
           bad, (long)nc * trials, maxulp);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD1);
    cudaFree(dD2);
    cudaFree(dperm);
    return bad;
}

int main() {
    // Which of LBO / SBO is the k direction: try both on a small case first.
    const long v1 = run_case<0, 64>(0, 1, 5, false, 128, 256);
    const long v2 = run_case<0, 64>(0, 1, 5, false, 256, 128);
    printf("layout (lbo 128, sbo 256): %ld mismatches; (lbo 256, sbo 128): %ld\n", v1, v2);
    long bad = 0;
    for (int kind = 0; kind < 3; ++kind) {
        bad += run_case<0, 8>(kind, 1, 200, false);
        bad += run_case<0, 64>(kind, 1, 200, false);
        bad += run_case<0, 64>(kind, 64, 20, false);
        bad += run_case<1, 8>(kind, 1, 200, false);
        bad += run_case<1, 64>(kind, 64, 20, false);
    }
    long pbad = 0;
    for (int kind = 0; kind < 3; ++kind) {
        pbad += run_case<0, 8>(kind, 1, 200, true);
        pbad += run_case<1, 8>(kind, 1, 200, true);
    }
    printf("RESULT wgmma==mma.sync: %s (%ld mismatches); k-order inside a step irrelevant: %s (%ld)\n",
           bad ? "NO" : "YES", bad, pbad ? "NO" : "YES", pbad);
    return bad ? 1 : 0;
}
