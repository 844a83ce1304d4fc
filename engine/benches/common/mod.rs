//! Inputs shared by the benches.

/// Deterministic values in about [-3.5, 3.5).
pub fn pseudo_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (0..4).map(|_| next()).sum::<f32>() * 1.732 - 3.464)
        .collect()
}
