//! One checked kernel case, the comparison that makes it and the report table (shared by every
//! `kernels` check module).

/// One checked case.
pub struct Case {
    pub kernel: String,
    pub shape: String,
    /// max |gpu - cpu| / max(|cpu|, 1e-6) over the output.
    pub rel_err: f64,
    pub tol: f64,
    /// Extra failure (unwritten elements, invariance).
    pub problem: Option<String>,
}

impl Case {
    pub fn ok(&self) -> bool {
        self.problem.is_none() && self.rel_err <= self.tol
    }
}

/// Compares `got` (device) with `want` (CPU reference): relative error and unwritten (NaN)
/// elements.
pub fn compare(kernel: &str, shape: String, got: &[f32], want: &[f32], tol: f64) -> Case {
    let mut problem = None;
    let mut max_ref = 1e-6f64;
    let mut max_diff = 0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() && !w.is_nan() {
            problem.get_or_insert_with(|| format!("element {i} not written (NaN)"));
        }
        max_ref = max_ref.max(w.abs() as f64);
        max_diff = max_diff.max((g as f64 - w as f64).abs());
    }
    if got.len() != want.len() {
        problem = Some(format!("{} values, expected {}", got.len(), want.len()));
    }
    Case {
        kernel: kernel.into(),
        shape,
        rel_err: max_diff / max_ref,
        tol,
        problem,
    }
}

/// The table of cases: failures in full, passes summarized per kernel.
pub fn report(cases: &[Case]) -> String {
    let mut s = String::new();
    let mut kernels: Vec<&str> = cases.iter().map(|c| c.kernel.as_str()).collect();
    kernels.dedup();
    s.push_str(&format!(
        "{:<22} {:>6} {:>12} {:>10}  status\n",
        "kernel", "cases", "max rel err", "tol"
    ));
    for k in kernels {
        let cs: Vec<&Case> = cases.iter().filter(|c| c.kernel == k).collect();
        let worst = cs.iter().map(|c| c.rel_err).fold(0f64, f64::max);
        let tol = cs.iter().map(|c| c.tol).fold(0f64, f64::max);
        let bad = cs.iter().filter(|c| !c.ok()).count();
        let status = if bad == 0 {
            "ok".to_string()
        } else {
            format!("FAIL ({bad})")
        };
        s.push_str(&format!(
            "{k:<22} {:>6} {worst:>12.3e} {tol:>10.1e}  {status}\n",
            cs.len()
        ));
    }
    for c in cases.iter().filter(|c| !c.ok()) {
        s.push_str(&format!(
            "FAIL {} {}: rel err {:.3e} (tol {:.1e}){}\n",
            c.kernel,
            c.shape,
            c.rel_err,
            c.tol,
            c.problem
                .as_ref()
                .map(|p| format!(", {p}"))
                .unwrap_or_default()
        ));
    }
    s
}

impl Case {
    /// Row invariance across M: the first call keeps `row0` (row 0's values at the smallest M);
    /// later calls mark the case when row 0 has other bits.
    pub fn check_row0(&mut self, first: &mut Option<Vec<f32>>, row0: &[f32]) {
        match first {
            None => *first = Some(row0.to_vec()),
            Some(f) => {
                let same = f.iter().zip(row0).all(|(a, b)| a.to_bits() == b.to_bits());
                if !same && self.problem.is_none() {
                    self.problem = Some("row 0 differs from its M=1 bits".into());
                }
            }
        }
    }
}

/// `n` random values in `[-scale, scale)` from stream `s` of `seed` (`models::random::unit`):
/// the checks' inputs.
pub fn rand_vec(seed: u64, s: u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| scale * memra_engine::models::random::unit(seed, s, i))
        .collect()
}

/// Whether `a` and `b` hold the same values bit for bit (and as many).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The little-endian bytes of `v`.
pub fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A case that passes when `got` and `want` have the same bytes; `of` names where `want` came
/// from in the failure ("the unfused launches").
pub fn same_bytes(kernel: &str, shape: String, got: &[u8], want: &[u8], of: &str) -> Case {
    let problem = match got.iter().zip(want).position(|(a, b)| a != b) {
        _ if got.len() != want.len() => {
            Some(format!("{} bytes, expected {}", got.len(), want.len()))
        }
        Some(i) => Some(format!("byte {i} differs from {of}' bits")),
        None => None,
    };
    Case {
        kernel: kernel.into(),
        shape,
        rel_err: 0.0,
        tol: 0.0,
        problem,
    }
}
