// The F32 row products (kernels/cu/f32rows.cuh): matmul_f32_tiles_body against
// matmul_f32_rows_body bit for bit (one per-element order, two work splits), and both against
// double precision. Shapes: K off the 8-chunk and 32-lane grid, features and rows off the 8-tile,
// row bytes past the row (a stride), and a grid of one token tile walking several (grid.y loop).
struct F32RowsShape {
    unsigned m, n, k, pad, gy;  // rows, features, K, floats of row padding, tiles kernel grid.y
};

static void f32rows_case(F32RowsShape s) {
    const unsigned rowf = s.k + s.pad;
    const auto w = randv((size_t)s.n * rowf, 1.0f), x = randv((size_t)s.m * s.k, 1.0f);
    const u8* wb = (const u8*)w.data();
    const u64 row_bytes = (u64)rowf * 4;
    std::vector<float> rows((size_t)s.m * s.n, NAN), tiles((size_t)s.m * s.n, NAN);
    emu_launch(s.n, (s.m + 7) / 8, 256, [&] { matmul_f32_rows_body(wb, x.data(), rows.data(), s.m, s.n, s.k, row_bytes); });
    emu_launch((s.n + F32T - 1) / F32T, s.gy, 256,
               [&] { matmul_f32_tiles_body(wb, x.data(), tiles.data(), s.m, s.n, s.k, row_bytes); });
    std::vector<double> want((size_t)s.m * s.n);
    for (unsigned i = 0; i < s.m; ++i)
        for (unsigned j = 0; j < s.n; ++j) {
            double d = 0;
            for (unsigned q = 0; q < s.k; ++q) d += (double)w[(size_t)j * rowf + q] * x[(size_t)i * s.k + q];
            want[(size_t)i * s.n + j] = d;
        }
    char what[160];
    snprintf(what, sizeof what, "matmul_f32_rows M %u N %u K %u vs float64", s.m, s.n, s.k);
    check(what, rows, want, 1e-5);
    snprintf(what, sizeof what, "matmul_f32_tiles M %u N %u K %u (grid.y %u) == matmul_f32_rows", s.m, s.n, s.k, s.gy);
    bits_case(what, same_bits(tiles, rows));
}

extern "C" int kemu_check_f32rows() {
    const int before = fails;
    f32rows_case({8, 8, 256, 0, 1});
    f32rows_case({13, 11, 77, 3, 2});
    f32rows_case({17, 9, 2050, 0, 1});
    f32rows_case({1, 20, 600, 5, 1});
    f32rows_case({24, 16, 5, 0, 3});
    printf("f32rows: %s (%d failures)\n", fails > before ? "FAILED" : "all ok", fails - before);
    fflush(stdout);
    return fails - before;
}
