//! Row-wise f32 operations of the CPU reference backend. Each works on one row at a time in a
//! fixed order, so a row's result never depends on other rows, the batch size or the thread count.

pub use crate::quant::dot_f32 as dot;

/// RMSNorm of one row: `out = (x * (1 / sqrt(mean(x^2) + eps))) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = (xi * scale) * wi;
    }
}

/// SiLU(gate) * up, elementwise into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

/// Adds `b` into `a` elementwise.
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// RoPE frequencies: `inv_freq[i] = theta^(-2i/d)`, optional llama3 scaling, optional divisors.
#[derive(Clone, Debug)]
pub struct Rope {
    pub inv_freq: Vec<f64>,
}

impl Rope {
    pub fn new(cfg: &crate::config::ModelConfig, factors: Option<&[f32]>) -> Rope {
        let d = cfg.head_dim;
        let theta = cfg.rope_theta as f64;
        let mut inv_freq: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64))
            .collect();
        if let Some(f) = factors {
            for (v, &fac) in inv_freq.iter_mut().zip(f) {
                *v /= fac as f64;
            }
        } else if let Some(rs) = cfg.rope_scaling {
            let old = rs.original_max_position_embeddings as f64;
            let (lo, hi, factor) = (
                rs.low_freq_factor as f64,
                rs.high_freq_factor as f64,
                rs.factor as f64,
            );
            let low_wavelen = old / lo;
            let high_wavelen = old / hi;
            for v in inv_freq.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *v;
                if wavelen > low_wavelen {
                    *v /= factor;
                } else if wavelen >= high_wavelen {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    *v = (1.0 - smooth) * *v / factor + smooth * *v;
                }
            }
        }
        Rope { inv_freq }
    }

    /// cos and sin of every frequency at position `pos`.
    pub fn cos_sin(&self, pos: u32) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip()
    }

    /// Rotates each head of `x` (heads of `head_dim`) by half rotation (NeoX / HF layout).
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weight_has_unit_rms() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
        let w = vec![1.0; 64];
        let mut out = vec![0.0; 64];
        rms_norm(&x, &w, 0.0, &mut out);
        let ms: f32 = out.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let mut x: Vec<f32> = (0..32).map(|i| (i as f32).sin()).collect();
        let orig = x.clone();
        let cfg = test_cfg();
        let rope = Rope::new(&cfg, None);
        let (c, s) = rope.cos_sin(0);
        Rope::apply(&mut x, 16, &c, &s);
        assert_eq!(x, orig);
        let (c, s) = rope.cos_sin(17);
        Rope::apply(&mut x, 16, &c, &s);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(x, orig);
    }

    fn test_cfg() -> crate::config::ModelConfig {
        crate::config::ModelConfig {
            arch: crate::config::Arch::Llama,
            n_layers: 1,
            hidden: 32,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 16,
            ffn: 64,
            vocab: 10,
            rope_theta: 10000.0,
            rope_scaling: None,
            rms_eps: 1e-5,
            max_ctx: 64,
            tie_embeddings: true,
        }
    }
}
