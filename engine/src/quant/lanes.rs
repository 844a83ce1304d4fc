//! The 16 lane accumulators of the fixed dot-product order (dot.rs documents the order), shared
//! by the portable path (dot.rs) and the AVX2 kernels (dot_avx2.rs).

/// Lanes of the fixed accumulation order.
pub const DOT_LANES: usize = 16;

/// The 16 running lane sums of step 1.
#[derive(Clone, Copy)]
pub(super) struct Lanes(pub(super) [f32; DOT_LANES]);

impl Lanes {
    #[inline(always)]
    pub(super) fn new() -> Self {
        Lanes([0.0; DOT_LANES])
    }

    /// Step 1 over `a` and `b`, whose common length must be a multiple of 16 (extra ignored).
    #[inline(always)]
    pub(super) fn add_chunks(&mut self, a: &[f32], b: &[f32]) {
        for (ca, cb) in a.chunks_exact(DOT_LANES).zip(b.chunks_exact(DOT_LANES)) {
            let (Ok(ca), Ok(cb)) = (
                <&[f32; DOT_LANES]>::try_from(ca),
                <&[f32; DOT_LANES]>::try_from(cb),
            ) else {
                continue;
            };
            for l in 0..DOT_LANES {
                self.0[l] += ca[l] * cb[l];
            }
        }
    }

    /// Steps 2 and 3: the pairwise tree, then the tail in order.
    #[inline(always)]
    pub(super) fn finish(self, tail_a: &[f32], tail_b: &[f32]) -> f32 {
        let mut acc = self.0;
        for l in 0..8 {
            acc[l] += acc[l + 8];
        }
        for l in 0..4 {
            acc[l] += acc[l + 4];
        }
        for l in 0..2 {
            acc[l] += acc[l + 2];
        }
        let mut s = acc[0] + acc[1];
        for (x, y) in tail_a.iter().zip(tail_b) {
            s += x * y;
        }
        s
    }
}
