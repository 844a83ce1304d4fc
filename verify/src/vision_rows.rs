//! `memra-verify vision`'s comparisons of a tower's rows, one code path for every pair it
//! checks: the CPU tower against the float64 references (images and the video, CI), and on a
//! CUDA device the CUDA tower against the CPU tower (images and the video, `--reference none`
//! included), encoded twice with the same bits.

use memra_engine::error::Result;

/// max |a - r| / max |r| (a NaN anywhere: NaN; other lengths: infinity).
pub(crate) fn rel_error(a: &[f32], r: &[f32]) -> f32 {
    if a.len() != r.len() {
        return f32::INFINITY;
    }
    let max = r.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    // A NaN anywhere is a NaN error (f32::max would drop it).
    let d = a.iter().zip(r).fold(0f32, |m, (x, y)| {
        let e = (x - y).abs();
        if e.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(e)
        }
    });
    d / max
}

/// One comparison: what is compared (`"embeddings differ from the numpy reference"`), each
/// item's name (`"image 3"`, `"video"`) and the largest error allowed.
pub(crate) struct Against<'a> {
    pub what: &'a str,
    pub item: &'a dyn Fn(usize) -> String,
    pub tol: f32,
}

impl Against<'_> {
    /// [`rel_error`] of each of `ours` against the same item of `refs`; an item past the
    /// tolerance (or NaN) is a failure naming it.
    pub(crate) fn errors<A: AsRef<[f32]>, B: AsRef<[f32]>>(
        &self,
        ours: &[A],
        refs: &[B],
        failures: &mut Vec<String>,
    ) -> Vec<f32> {
        let mut errs = Vec::with_capacity(ours.len());
        for (i, (o, r)) in ours.iter().zip(refs).enumerate() {
            let e = rel_error(o.as_ref(), r.as_ref());
            errs.push(e);
            if e.is_nan() || e > self.tol {
                failures.push(format!(
                    "{}: {} by {e:.2e} of the largest (tolerance {:.0e})",
                    (self.item)(i),
                    self.what,
                    self.tol
                ));
            }
        }
        errs
    }
}

/// What [`on_device`] measured.
#[derive(Debug)]
pub(crate) struct OnDevice {
    /// The first encoding's rows, per item.
    pub rows: Vec<Vec<f32>>,
    /// Per item: max |device - cpu| / max |cpu|.
    pub errors: Vec<f32>,
    /// The second encoding gave the first's bits.
    pub repeat_equal: bool,
    /// The second encoding's time.
    pub ms: f64,
}

/// The tower on a CUDA device against the CPU tower: `encode` (the device's rows of each item)
/// runs twice and must give the same bits the second time (`what`: `"images"`, `"video"`); the
/// first encoding's rows against the CPU tower's (`cpu`) by `cmp`.
pub(crate) fn on_device<C: AsRef<[f32]>>(
    encode: &dyn Fn() -> Result<Vec<Vec<f32>>>,
    cpu: &[C],
    what: &str,
    cmp: &Against<'_>,
    failures: &mut Vec<String>,
) -> Result<OnDevice> {
    let first = encode()?;
    let t0 = std::time::Instant::now();
    let second = encode()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let bits = |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    let repeat_equal = bits(&first) == bits(&second);
    if !repeat_equal {
        failures.push(format!(
            "the CUDA tower gave other bits for the same {what} the second time"
        ));
    }
    let errors = cmp.errors(&first, cpu, failures);
    Ok(OnDevice {
        rows: first,
        errors,
        repeat_equal,
        ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn item(i: usize) -> String {
        format!("image {i}")
    }

    const CMP: Against<'static> = Against {
        what: "rows differ",
        item: &item,
        tol: 2e-3,
    };

    #[test]
    fn rel_error_is_relative_to_the_largest_reference_value() {
        assert_eq!(rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(rel_error(&[1.0, 3.0], &[1.0, -4.0]), 7.0 / 4.0);
        assert!(rel_error(&[f32::NAN, 0.0], &[1.0, 0.0]).is_nan());
        assert!(rel_error(&[0.0, f32::NAN], &[1.0, 0.0]).is_nan());
        assert_eq!(rel_error(&[1.0], &[1.0, 2.0]), f32::INFINITY);
    }

    #[test]
    fn errors_name_each_item_past_the_tolerance() {
        let refs = [vec![1.0f32, -2.0], vec![4.0, 0.5], vec![1.0, 1.0]];
        // Within (1e-3 of 2), past (0.1 of 4), NaN.
        let ours = [vec![1.002f32, -2.0], vec![4.0, 0.9], vec![f32::NAN, 1.0]];
        let mut f = Vec::new();
        let e = CMP.errors(&ours, &refs, &mut f);
        assert_eq!(e.len(), 3);
        assert!(e[0] > 0.0 && e[0] <= 2e-3, "{e:?}");
        assert!((e[1] - 0.1).abs() < 1e-6, "{e:?}");
        assert!(e[2].is_nan());
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].starts_with("image 1: rows differ by 1.00e-1"), "{f:?}");
        assert!(f[0].ends_with("(tolerance 2e-3)"), "{f:?}");
        assert!(f[1].starts_with("image 2: rows differ by NaN"), "{f:?}");
    }

    /// A fake device: each call's rows from `rows(call)`.
    fn device(rows: impl Fn(usize) -> Vec<Vec<f32>>) -> impl Fn() -> Result<Vec<Vec<f32>>> {
        let calls = Cell::new(0);
        move || {
            let n = calls.get();
            calls.set(n + 1);
            Ok(rows(n))
        }
    }

    #[test]
    fn on_device_passes_a_close_repeatable_tower() {
        let cpu = [vec![1.0f32, 2.0, -3.0]];
        let enc = device(|_| vec![vec![1.001, 2.0, -3.0]]);
        let mut f = Vec::new();
        let d = on_device(&enc, &cpu, "video", &CMP, &mut f).unwrap();
        assert!(f.is_empty(), "{f:?}");
        assert!(d.repeat_equal);
        assert_eq!(d.rows, vec![vec![1.001, 2.0, -3.0]]);
        assert!(d.errors[0] > 0.0 && d.errors[0] < 2e-3, "{:?}", d.errors);
    }

    #[test]
    fn on_device_fails_other_bits_the_second_time() {
        let cpu = [vec![1.0f32, 2.0]];
        // -0.0 == 0.0 as values, not as bits.
        let enc = device(|n| vec![vec![1.0, 2.0, if n == 0 { 0.0 } else { -0.0 }]]);
        let cpu3 = [vec![1.0f32, 2.0, 0.0]];
        let mut f = Vec::new();
        let d = on_device(&enc, &cpu3, "video", &CMP, &mut f).unwrap();
        assert!(!d.repeat_equal);
        assert_eq!(
            f,
            vec!["the CUDA tower gave other bits for the same video the second time"]
        );
        // The first encoding's rows are the ones compared and returned.
        assert_eq!(d.rows[0][2].to_bits(), 0.0f32.to_bits());
        assert_eq!(d.errors, vec![0.0]);
        // Rows of another length than the CPU tower's: an infinite error, a failure.
        let mut f = Vec::new();
        let d = on_device(&device(|_| vec![vec![1.0]]), &cpu, "images", &CMP, &mut f).unwrap();
        assert_eq!(d.errors, vec![f32::INFINITY]);
        assert_eq!(f.len(), 1, "{f:?}");
    }

    #[test]
    fn on_device_fails_a_tower_past_the_tolerance() {
        let cpu = [vec![1.0f32, 2.0], vec![10.0, 0.0]];
        let enc = device(|_| vec![vec![1.0, 2.0], vec![10.0, 0.05]]);
        let mut f = Vec::new();
        let d = on_device(&enc, &cpu, "images", &CMP, &mut f).unwrap();
        assert!(d.repeat_equal);
        assert_eq!(d.errors[0], 0.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].starts_with("image 1: rows differ by 5.00e-3"), "{f:?}");
    }
}
