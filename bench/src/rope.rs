//! llama.cpp's way of storing Llama 3 RoPE scaling: a `rope_freqs.weight` tensor of per-frequency
//! divisors (llama.cpp rejects a `rope.scaling.type` of `llama3`).

use memra_engine::config::{Llama3RopeScaling, ModelConfig};

/// GGUF name of the tensor.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The `head_dim / 2` frequency divisors for `rs`, as llama.cpp's converter computes them.
pub fn llama3_rope_factors(theta: f32, head_dim: usize, rs: &Llama3RopeScaling) -> Vec<f32> {
    let old = rs.original_max_position_embeddings as f64;
    let (lo, hi, factor) = (
        rs.low_freq_factor as f64,
        rs.high_freq_factor as f64,
        rs.factor as f64,
    );
    let (low_wavelen, high_wavelen) = (old / lo, old / hi);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / (theta as f64).powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - lo) / (hi - lo);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// The standard Llama 3.1 parameters.
pub const LLAMA31: Llama3RopeScaling = Llama3RopeScaling {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

/// Recognises `factors` as the llama3 divisors of a known parameter set for `cfg`.
pub fn recognise(cfg: &ModelConfig, factors: &[f32]) -> Option<Llama3RopeScaling> {
    let want = llama3_rope_factors(cfg.rope_theta, cfg.head_dim, &LLAMA31);
    let close = want.len() == factors.len()
        && want
            .iter()
            .zip(factors)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * a.abs().max(1.0));
    close.then_some(LLAMA31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_span_one_to_factor() {
        let f = llama3_rope_factors(500000.0, 128, &LLAMA31);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0); // highest frequency: unscaled
        assert_eq!(f[63], 8.0); // lowest frequency: divided by the factor
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0)); // the smooth band
    }
}
