//! Counter-based random weights: every element is a pure function of (seed, tensor name,
//! element index), so tensors can be generated in any order, in parallel, with identical output.

/// The splitmix64 increment (2^64 / golden ratio).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

pub use memra_engine::models::random::mix64;

/// The key of one tensor: the seed mixed with an FNV-1a hash of the tensor's (HF) name, so a
/// tensor has the same values whatever file format or tensor order it is written in.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(mix64(seed ^ GOLDEN) ^ h)
}

/// The `i`-th 64-bit draw of the stream `key` (splitmix64 state `key + (i + 1) * GOLDEN`).
pub fn draw(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A roughly standard-normal value: the Irwin-Hall sum of the four 16-bit lanes of one draw,
/// centred and scaled to unit variance (range about +-3.46).
pub fn normalish(key: u64, i: u64) -> f32 {
    let r = draw(key, i);
    let s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
    // Each lane is uniform on [0, 65535]: mean 32767.5, variance (65536^2 - 1) / 12.
    const MEAN: f32 = 4.0 * 32767.5;
    const INV_STD: f32 = 1.0 / 37837.23; // 1 / sqrt(4 * (65536^2 - 1) / 12)
    (s as f32 - MEAN) * INV_STD
}

/// Fills `out` with `mean + std * normalish(key, first + j)`.
pub fn fill_normal(key: u64, first: u64, mean: f32, std: f32, out: &mut [f32]) {
    for (j, v) in out.iter_mut().enumerate() {
        *v = mean + std * normalish(key, first + j as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalish_has_unit_variance_and_zero_mean() {
        let n = 200_000u64;
        let key = tensor_key(7, "x");
        let (mut s, mut s2) = (0f64, 0f64);
        for i in 0..n {
            let v = normalish(key, i) as f64;
            s += v;
            s2 += v * v;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn keys_differ_by_seed_and_name() {
        assert_ne!(tensor_key(1, "a"), tensor_key(2, "a"));
        assert_ne!(tensor_key(1, "a"), tensor_key(1, "b"));
        assert_eq!(tensor_key(1, "a"), tensor_key(1, "a"));
        assert_ne!(draw(5, 0), draw(5, 1));
    }
}
