// The gated DeltaNet kernels (kernels/cu/delta.cu) on the emulator: gated_delta_k<HK> against a
// double-precision reference of the rule (one sequence, a whole prompt in one step), then the
// promises the engine's invariance rests on, bit for bit: one row a step, steps of three rows
// that first replay a pending position from the kept inputs (keep_inputs), and
// gated_delta_conv_k<HK> against conv1d_silu then gated_delta_k<HK>. Included once, by
// kernels.cpp, after check_util.h (rng, randv, check, fails).
#pragma once

// Launch shims: the kernels by HK.
template <int HK>
void delta_call(const float* QKV, const float* BA, const float* A, const float* DT, float* O, const float* S, float* D,
                u32 per_slot, const float* inputs, const u32* plan, u32 n_seqs, u32 nk, u32 nv, u32 hv) {
    gated_delta_body<HK, false>(QKV, BA, A, DT, O, S, D, per_slot, inputs, plan, n_seqs, nk, nv, hv);
}
template <int HK>
void delta_conv_call(float* QKV, const float* BA, const float* A, const float* DT, float* O, const float* S, float* D,
                     u32 per_slot, const float* inputs, const u32* plan, u32 n_seqs, u32 nk, u32 nv, u32 hv,
                     const float* X, const float* W, float* ring, u32 taps) {
    gated_delta_body<HK, true>(QKV, BA, A, DT, O, S, D, per_slot, inputs, plan, n_seqs, nk, nv, hv,
                               DeltaConv{X, W, ring, taps});
}

// One head geometry: key head size HK, key heads nk, value heads nv of size hv, T positions,
// conv taps.
struct DeltaGeo {
    u32 nk, nv, hv, T, taps;
};

template <int HK>
struct DeltaRun {
    DeltaGeo g;
    u32 conv_dim, iw;
    std::vector<float> x;     // conv inputs [T][conv_dim]
    std::vector<float> w;     // conv weights [conv_dim][taps]
    std::vector<float> ba;    // [T][2 nv]
    std::vector<float> a, dt; // [nv]

    explicit DeltaRun(DeltaGeo geo) : g(geo) {
        conv_dim = 2 * g.nk * HK + g.nv * g.hv;
        iw = conv_dim + 2 * g.nv;
        x = randv((size_t)g.T * conv_dim, 1.0f);
        w = randv((size_t)conv_dim * g.taps, 0.6f);
        ba = randv((size_t)g.T * 2 * g.nv, 2.0f);
        a = randv(g.nv, 1.0f);
        for (auto& v : a) v = -std::fabs(v) - 0.1f;
        dt = randv(g.nv, 0.5f);
    }
    u32 blocks() const { return (g.hv + 31) / 32 * g.nv; }
    u32 threads() const { return 32 * DELTA_NW(HK); }
    size_t state_len() const { return (size_t)g.nv * HK * g.hv; }

    // The plan of one sequence (slot 0): rows 0.. of the step buffers.
    static std::vector<u32> plan(u32 first, u32 replay_from, u32 commit_to, u32 n) {
        std::vector<u32> p = {0, first, replay_from, commit_to, n, 0};
        for (u32 i = 0; i < n; ++i) p.push_back(i);
        return p;
    }

    // conv1d_silu over positions [first, first + n) (the ring holds the earlier ones): the
    // step's inputs are x's rows first.., the outputs into qkv.
    void conv(u32 first, u32 n, std::vector<float>& qkv, std::vector<float>& ring) const {
        auto pl = plan(first, first, first + n, n);
        const float* xs = x.data() + (size_t)first * conv_dim;
        emu_launch((conv_dim + CONV_CH - 1) / CONV_CH, 1, CONV_CH * CONV_GROUPS, [&] {
            conv1d_silu(xs, qkv.data(), w.data(), ring.data(), pl.data(), 1, conv_dim, g.taps);
        });
    }

    // One step: rows [first, first + n) from qkv (the step's rows, conv applied), positions
    // replay_from..first from the kept inputs; state in place in s; outputs into o; then the
    // step's inputs kept (keep_inputs).
    void step(u32 first, u32 replay_from, u32 commit_to, u32 n, std::vector<float>& qkv, std::vector<float>& s,
              std::vector<float>& kept, std::vector<float>& o, const std::vector<float>* ring = nullptr) {
        auto pl = plan(first, replay_from, commit_to, n);
        const float* bas = ba.data() + (size_t)first * 2 * g.nv;
        if (ring) {
            const float* xs = x.data() + (size_t)first * conv_dim;
            float* rg = const_cast<float*>(ring->data());
            emu_launch(blocks(), 1, threads(), [&] {
                delta_conv_call<HK>(qkv.data(), bas, a.data(), dt.data(), o.data(), s.data(), s.data(), 1,
                                    kept.data(), pl.data(), 1, g.nk, g.nv, g.hv, xs, w.data(), rg, g.taps);
            });
        } else {
            emu_launch(blocks(), 1, threads(), [&] {
                delta_call<HK>(qkv.data(), bas, a.data(), dt.data(), o.data(), s.data(), s.data(), 1, kept.data(),
                               pl.data(), 1, g.nk, g.nv, g.hv);
            });
        }
        emu_launch(4, 1, 128, [&] { keep_inputs(qkv.data(), bas, kept.data(), pl.data(), 1, conv_dim, g.nv); });
    }

    // The whole conv output, position by position in double: the reference's input.
    std::vector<double> conv_ref() const {
        std::vector<double> y((size_t)g.T * conv_dim);
        for (u32 t = 0; t < g.T; ++t)
            for (u32 c = 0; c < conv_dim; ++c) {
                double acc = 0;
                for (u32 k = 0; k < g.taps; ++k)
                    if (t + k + 1 >= g.taps) acc += (double)w[(size_t)c * g.taps + k] * x[(size_t)(t + k + 1 - g.taps) * conv_dim + c];
                y[(size_t)t * conv_dim + c] = acc / (1 + std::exp(-acc));
            }
        return y;
    }

    // The rule in double over every position: outputs [T][nv][hv].
    std::vector<double> rule_ref() const {
        const auto y = conv_ref();
        const u32 r = g.nv / g.nk;
        std::vector<double> out((size_t)g.T * g.nv * g.hv);
        for (u32 h = 0; h < g.nv; ++h) {
            const u32 gk = h / r, jj = h % r;
            std::vector<double> S((size_t)HK * g.hv, 0.0);
            for (u32 t = 0; t < g.T; ++t) {
                const double* row = y.data() + (size_t)t * conv_dim;
                double nq = 0, nkk = 0;
                for (u32 i = 0; i < HK; ++i) {
                    nq += row[gk * HK + i] * row[gk * HK + i];
                    nkk += row[(g.nk + gk) * HK + i] * row[(g.nk + gk) * HK + i];
                }
                const double iq = 1 / std::sqrt(nq + 1e-6) / std::sqrt((double)HK), ik = 1 / std::sqrt(nkk + 1e-6);
                const float* b = ba.data() + (size_t)t * 2 * g.nv;
                const double beta = 1 / (1 + std::exp(-(double)b[gk * 2 * r + jj]));
                const double av = (double)b[gk * 2 * r + r + jj] + dt[h];
                const double decay = std::exp(a[h] * (av > 20 ? av : std::log1p(std::exp(av))));
                for (u32 j = 0; j < g.hv; ++j) {
                    double kv = 0;
                    for (u32 i = 0; i < HK; ++i) {
                        S[(size_t)i * g.hv + j] *= decay;
                        kv += S[(size_t)i * g.hv + j] * row[(g.nk + gk) * HK + i] * ik;
                    }
                    const double d = (row[2 * g.nk * HK + h * g.hv + j] - kv) * beta;
                    double o = 0;
                    for (u32 i = 0; i < HK; ++i) {
                        S[(size_t)i * g.hv + j] += row[(g.nk + gk) * HK + i] * ik * d;
                        o += S[(size_t)i * g.hv + j] * row[gk * HK + i] * iq;
                    }
                    out[((size_t)t * g.nv + h) * g.hv + j] = o;
                }
            }
        }
        return out;
    }
};


template <int HK>
static void delta_case(DeltaGeo geo) {
    DeltaRun<HK> d(geo);
    const u32 T = geo.T, ow = geo.nv * geo.hv;
    char what[160];
    snprintf(what, sizeof what, "gated_delta_k%d nk %u nv %u hv %u, %u rows (%u warps)", HK, geo.nk, geo.nv, geo.hv, T,
             DELTA_NW(HK));
    // The whole prompt in one step, conv by conv1d_silu.
    std::vector<float> qkv((size_t)T * d.conv_dim), ring((size_t)CONV_RING * d.conv_dim, 0.0f);
    std::vector<float> s(d.state_len(), 0.0f), kept((size_t)RING * d.iw, 0.0f), whole((size_t)T * ow, NAN);
    d.conv(0, T, qkv, ring);
    d.step(0, 0, T, T, qkv, s, kept, whole);
    check(what, whole, d.rule_ref(), 2e-5);
    const std::vector<float> s_whole = s;
    // One row a step (the state committed after each).
    {
        std::vector<float> s1(d.state_len(), 0.0f), k1((size_t)RING * d.iw, 0.0f), rg1((size_t)CONV_RING * d.conv_dim, 0.0f);
        std::vector<float> out((size_t)T * ow, NAN), q1(d.conv_dim), o1(ow);
        for (u32 t = 0; t < T; ++t) {
            d.conv(t, 1, q1, rg1);
            d.step(t, t, t + 1, 1, q1, s1, k1, o1);
            std::memcpy(out.data() + (size_t)t * ow, o1.data(), ow * 4);
        }
        snprintf(what, sizeof what, "gated_delta_k%d one row a step == whole (outputs, state)", HK);
        bits_case(what, same_bits(out, whole) && same_bits(s1, s_whole));
    }
    // Steps of three rows, each replaying the previous step's last position from the kept
    // inputs first (committed one position behind: the speculative verify's rule).
    {
        std::vector<float> s3(d.state_len(), 0.0f), k3((size_t)RING * d.iw, 0.0f), rg3((size_t)CONV_RING * d.conv_dim, 0.0f);
        std::vector<float> out((size_t)T * ow, NAN);
        for (u32 f = 0; f < T; f += 3) {
            const u32 n = std::min(3u, T - f), rf = f == 0 ? 0 : f - 1, commit = f + n == T ? T : f + n - 1;
            std::vector<float> q3((size_t)n * d.conv_dim), o3((size_t)n * ow);
            d.conv(f, n, q3, rg3);
            d.step(f, rf, commit, n, q3, s3, k3, o3);
            std::memcpy(out.data() + (size_t)f * ow, o3.data(), (size_t)n * ow * 4);
        }
        snprintf(what, sizeof what, "gated_delta_k%d steps of 3 replaying 1 == whole", HK);
        bits_case(what, same_bits(out, whole) && same_bits(s3, s_whole));
    }
    // gated_delta_conv_k: the conv inside, steps of 5 rows (at most RING).
    {
        std::vector<float> sc(d.state_len(), 0.0f), kc((size_t)RING * d.iw, 0.0f), rgc((size_t)CONV_RING * d.conv_dim, 0.0f);
        std::vector<float> out((size_t)T * ow, NAN), yq((size_t)T * d.conv_dim, NAN);
        for (u32 f = 0; f < T; f += 5) {
            const u32 n = std::min(5u, T - f);
            std::vector<float> qc((size_t)n * d.conv_dim, NAN), oc((size_t)n * ow);
            d.step(f, f, f + n, n, qc, sc, kc, oc, &rgc);
            std::memcpy(out.data() + (size_t)f * ow, oc.data(), (size_t)n * ow * 4);
            std::memcpy(yq.data() + (size_t)f * d.conv_dim, qc.data(), (size_t)n * d.conv_dim * 4);
        }
        snprintf(what, sizeof what, "gated_delta_conv_k%d steps of 5 == conv1d_silu + gated_delta", HK);
        bits_case(what, same_bits(out, whole) && same_bits(sc, s_whole) && same_bits(yq, qkv) && same_bits(rgc, ring));
    }
}

extern "C" int kemu_check_delta() {
    const int before = fails;
    delta_case<16>({2, 4, 40, 9, 4});
    delta_case<32>({1, 2, 32, 10, 4});
    delta_case<64>({2, 2, 48, 11, 3});
    delta_case<128>({1, 2, 64, 13, 4});
    delta_case<128>({2, 4, 32, 7, 4});
    // More positions than a chunk of the four-warp kernel (16): three chunks, the last short.
    delta_case<128>({1, 1, 32, 37, 4});
    // Longer than the conv ring (CONV_RING rows): conv1d_silu keeps the last ones.
    delta_case<32>({1, 2, 32, 30, 4});
    printf("delta: %s (%d failures)\n", fails > before ? "FAILED" : "all ok", fails - before);
    fflush(stdout);
    return fails - before;
}
