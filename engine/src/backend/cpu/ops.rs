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

/// `x = cap * tanh(x / cap)`, elementwise.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// GeLU(gate) * up with the tanh approximation, elementwise into `gate`.
pub fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let t = (C * (x + 0.044_715 * x * x * x)).tanh();
        *g = 0.5 * x * (1.0 + t) * u;
    }
}

/// Rotates each head of `x` (heads of `head_dim`) by half rotation (NeoX / HF layout), with
/// the row's `cos`/`sin` (`half` each, at most `head_dim / 2`): pairs `(i, i + half)`; values
/// from `2 * half` on are left as they are (partial RoPE).
pub fn rope_apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len().min(head_dim / 2);
    for head in x.chunks_exact_mut(head_dim) {
        let (a, b) = head[..2 * half].split_at_mut(half);
        for i in 0..half {
            let (x0, x1) = (a[i], b[i]);
            a[i] = x0 * cos[i] - x1 * sin[i];
            b[i] = x1 * cos[i] + x0 * sin[i];
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
        let rope = crate::ops::rope::Rope::new(16, 10000.0, None, None);
        let (c, s) = rope.cos_sin(0);
        rope_apply(&mut x, 16, &c, &s);
        assert_eq!(x, orig);
        let (c, s) = rope.cos_sin(17);
        rope_apply(&mut x, 16, &c, &s);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(x, orig);
    }

    #[test]
    fn geglu_matches_gelu_values() {
        let mut g = vec![0.0f32, 1.0, -1.0, 3.0];
        geglu_tanh(&mut g, &[1.0; 4]);
        let want = [0.0f32, 0.841_192, -0.158_808, 2.996_363];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
