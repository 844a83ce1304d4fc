// moe_tile_expert (prelude.cuh): a grouped expert product's tile -> expert lookup against a
// scalar search, every tile of random tile offsets (empty experts included, runs of them at the
// start and the end) for 1 .. 1024 experts and the binary search past 1024, a warp of lanes
// each asking in turn.
static void moe_tile_case(unsigned E, unsigned seed) {
    std::mt19937_64 r(seed);
    std::vector<u32> toff(E + 1, 0);
    for (unsigned e = 0; e < E; ++e) {
        const unsigned roll = (unsigned)(r() % 8);
        toff[e + 1] = toff[e] + (roll < 3 ? 0 : roll - 2);  // ~3 in 8 experts empty
    }
    if (toff[E] == 0) toff[E] = 1, toff[E - 1] = E > 1 ? 0 : toff[E - 1];
    const unsigned tiles = toff[E];
    std::vector<u32> got(tiles, ~0u);
    emu_launch(1, 1, 32, [&] {
        for (unsigned b = 0; b < tiles; ++b) {
            const u32 e = moe_tile_expert(toff.data(), E, b);
            if (threadIdx.x == b % 32) got[b] = e;
        }
    });
    bool ok = true;
    for (unsigned b = 0; b < tiles && ok; ++b) {
        unsigned want = 0;
        for (unsigned e = 0; e < E; ++e)
            if (toff[e] <= b) want = e;
        ok = got[b] == want;
    }
    char what[96];
    snprintf(what, sizeof what, "moe_tile_expert E %u, %u tiles", E, tiles);
    bits_case(what, ok);
}

extern "C" int kemu_check_moe_tile() {
    const int before = fails;
    const unsigned es[] = {1, 2, 31, 32, 33, 128, 129, 512, 513, 1000, 1024, 1500};
    for (unsigned i = 0; i < sizeof es / sizeof es[0]; ++i) moe_tile_case(es[i], 7 + i);
    printf("moe_tile: %s (%d failures)\n", fails > before ? "FAILED" : "all ok", fails - before);
    fflush(stdout);
    return fails - before;
}
