//! The soak's verdict: a least-squares slope per hour of each sampled quantity over the samples
//! after the warm-up, compared with a stated threshold ("flat" at or below it, "growing" above).

use plotters::prelude::*;

use memra_engine::error::{Error, Result};

/// One sample of the server (`t_s`: seconds since the soak began).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub t_s: f64,
    /// `load` while clients run, `drained` for the sample taken after they stopped and the
    /// server went idle.
    pub phase: String,
    pub rss_bytes: u64,
    pub fds: u64,
    pub kv_blocks_used: Option<u64>,
    pub kv_blocks_free: Option<u64>,
    pub http_in_flight: Option<u64>,
    /// Requests finished by the soak's clients so far (any outcome).
    pub requests: u64,
    pub errors: u64,
}

/// Least-squares slope of `y` over `x` (units of y per unit of x); `None` for fewer than two
/// points or when every x is the same.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// When a quantity counts as growing: its slope per hour above
/// `max(relative x scale, absolute)`, where the scale is the quantity's mean (RSS, fds) or the
/// KV pool's size (KV blocks in use, which swing with load).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Threshold {
    pub relative_per_hour: f64,
    pub absolute_per_hour: f64,
}

/// RSS: 5% of its mean per hour, at least 8 MiB per hour.
pub const RSS: Threshold = Threshold {
    relative_per_hour: 0.05,
    absolute_per_hour: 8.0 * 1024.0 * 1024.0,
};
/// Open fds: 10% of their mean per hour, at least 4 per hour.
pub const FDS: Threshold = Threshold {
    relative_per_hour: 0.10,
    absolute_per_hour: 4.0,
};
/// KV blocks in use: 1% of the pool per hour, at least 4 blocks per hour.
pub const KV: Threshold = Threshold {
    relative_per_hour: 0.01,
    absolute_per_hour: 4.0,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Flat,
    Growing,
    /// Fewer than three samples after the warm-up: no verdict.
    TooFewSamples,
}

/// One quantity's trend after the warm-up.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Trend {
    pub metric: String,
    pub samples: usize,
    /// First and last value after the warm-up, and the mean.
    pub start: f64,
    pub end: f64,
    pub mean: f64,
    pub slope_per_hour: Option<f64>,
    pub threshold_per_hour: f64,
    pub verdict: Verdict,
}

/// The trend of `points` (seconds, value) from `warmup_s` on; `scale` (None: the mean) times
/// the relative threshold, at least the absolute one.
pub fn trend(
    metric: &str,
    points: &[(f64, f64)],
    warmup_s: f64,
    scale: Option<f64>,
    th: Threshold,
) -> Trend {
    let after: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0 >= warmup_s && p.1.is_finite())
        .map(|&(t, v)| (t / 3600.0, v))
        .collect();
    let mean = if after.is_empty() {
        0.0
    } else {
        after.iter().map(|p| p.1).sum::<f64>() / after.len() as f64
    };
    let threshold = (th.relative_per_hour * scale.unwrap_or(mean).abs()).max(th.absolute_per_hour);
    let s = slope(&after);
    let verdict = match s {
        Some(_) if after.len() < 3 => Verdict::TooFewSamples,
        Some(s) if s > threshold => Verdict::Growing,
        Some(_) => Verdict::Flat,
        None => Verdict::TooFewSamples,
    };
    Trend {
        metric: metric.to_string(),
        samples: after.len(),
        start: after.first().map_or(0.0, |p| p.1),
        end: after.last().map_or(0.0, |p| p.1),
        mean,
        slope_per_hour: s,
        threshold_per_hour: threshold,
        verdict,
    }
}

/// The three trends of the load-phase samples: RSS (bytes), open fds, KV blocks in use.
pub fn trends(samples: &[Sample], warmup_s: f64) -> Vec<Trend> {
    let load: Vec<&Sample> = samples.iter().filter(|s| s.phase == "load").collect();
    let series = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        load.iter().filter_map(|s| Some((s.t_s, f(s)?))).collect()
    };
    let pool = load
        .iter()
        .filter_map(|s| Some((s.kv_blocks_used? + s.kv_blocks_free?) as f64))
        .fold(0.0, f64::max);
    vec![
        trend(
            "rss_bytes",
            &series(&|s| Some(s.rss_bytes as f64)),
            warmup_s,
            None,
            RSS,
        ),
        trend("fds", &series(&|s| Some(s.fds as f64)), warmup_s, None, FDS),
        trend(
            "kv_blocks_used",
            &series(&|s| s.kv_blocks_used.map(|v| v as f64)),
            warmup_s,
            Some(pool),
            KV,
        ),
    ]
}

/// The overall verdict: growing if any trend grows, flat if all are flat.
pub fn overall(trends: &[Trend]) -> Verdict {
    if trends.iter().any(|t| t.verdict == Verdict::Growing) {
        Verdict::Growing
    } else if trends.iter().all(|t| t.verdict == Verdict::Flat) {
        Verdict::Flat
    } else {
        Verdict::TooFewSamples
    }
}

/// Three stacked panels (RSS MiB, open fds, KV blocks in use) against minutes, the warm-up
/// marked by where the fitted line starts.
pub fn plot(samples: &[Sample], warmup_s: f64, title: &str) -> Result<String> {
    let err = |e: &dyn std::fmt::Debug| Error::Input(format!("plotting: {e:?}"));
    let load: Vec<&Sample> = samples.iter().filter(|s| s.phase == "load").collect();
    let panels: [(&str, Vec<(f64, f64)>); 3] = [
        (
            "RSS (MiB)",
            load.iter()
                .map(|s| (s.t_s / 60.0, s.rss_bytes as f64 / 1048576.0))
                .collect(),
        ),
        (
            "open fds",
            load.iter().map(|s| (s.t_s / 60.0, s.fds as f64)).collect(),
        ),
        (
            "KV blocks in use",
            load.iter()
                .filter_map(|s| Some((s.t_s / 60.0, s.kv_blocks_used? as f64)))
                .collect(),
        ),
    ];
    let xmax = load.iter().map(|s| s.t_s / 60.0).fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 720)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(title, ("sans-serif", 20))
            .map_err(|e| err(&e))?;
        for (area, (name, pts)) in root.split_evenly((3, 1)).iter().zip(panels.iter()) {
            let ymax = pts.iter().map(|p| p.1).fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(area)
                .margin(8)
                .x_label_area_size(32)
                .y_label_area_size(64)
                .build_cartesian_2d(0f64..xmax * 1.02, 0f64..ymax * 1.15)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("minutes")
                .y_desc(*name)
                .draw()
                .map_err(|e| err(&e))?;
            let c = RGBColor(31, 119, 180);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(1)))
                .map_err(|e| err(&e))?;
            let fit: Vec<(f64, f64)> = pts
                .iter()
                .copied()
                .filter(|p| p.0 * 60.0 >= warmup_s)
                .collect();
            if let (Some(s), Some(a), Some(b)) = (slope(&fit), fit.first(), fit.last()) {
                let my = fit.iter().map(|p| p.1).sum::<f64>() / fit.len() as f64;
                let mx = fit.iter().map(|p| p.0).sum::<f64>() / fit.len() as f64;
                let at = |x: f64| my + s * (x - mx);
                let red = RGBColor(214, 39, 40);
                chart
                    .draw_series(LineSeries::new(
                        [(a.0, at(a.0)), (b.0, at(b.0))],
                        red.stroke_width(2),
                    ))
                    .map_err(|e| err(&e))?;
            }
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_is_least_squares() {
        let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 2.0)).collect();
        assert!((slope(&line).unwrap() - 3.0).abs() < 1e-12);
        // Symmetric noise around a flat line fits a zero slope.
        let flat = [(0.0, 1.0), (1.0, -1.0), (2.0, 1.0), (3.0, -1.0), (4.0, 0.0)];
        assert!(slope(&flat).unwrap().abs() < 0.21);
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 5.0)]), None);
    }

    fn series(per_hour: f64, base: f64, minutes: usize) -> Vec<(f64, f64)> {
        (0..=minutes * 6)
            .map(|i| {
                let t = i as f64 * 10.0;
                let wobble = if i % 2 == 0 { 1.0 } else { -1.0 };
                (t, base + per_hour * t / 3600.0 + wobble)
            })
            .collect()
    }

    #[test]
    fn growth_above_the_threshold_is_growing_and_below_is_flat() {
        let th = Threshold {
            relative_per_hour: 0.05,
            absolute_per_hour: 1.0,
        };
        // Mean ~1000: the threshold is 50 per hour.
        let t = trend("x", &series(200.0, 1000.0, 30), 300.0, None, th);
        assert_eq!(t.verdict, Verdict::Growing);
        assert!((t.slope_per_hour.unwrap() - 200.0).abs() < 5.0, "{t:?}");
        assert!((t.threshold_per_hour - 50.0).abs() < 3.0, "{t:?}");
        let t = trend("x", &series(20.0, 1000.0, 30), 300.0, None, th);
        assert_eq!(t.verdict, Verdict::Flat, "{t:?}");
        // Shrinking is not growth.
        assert_eq!(
            trend("x", &series(-500.0, 1000.0, 30), 300.0, None, th).verdict,
            Verdict::Flat
        );
        // The absolute floor applies when the scale is small.
        let t = trend("x", &series(0.5, 0.0, 30), 0.0, Some(1.0), th);
        assert_eq!((t.threshold_per_hour, t.verdict), (1.0, Verdict::Flat));
    }

    #[test]
    fn the_warm_up_is_left_out() {
        // A steep climb in the first five minutes, flat after.
        let pts: Vec<(f64, f64)> = (0..=180)
            .map(|i| {
                let t = i as f64 * 10.0;
                (t, if t < 300.0 { t } else { 300.0 })
            })
            .collect();
        let th = Threshold {
            relative_per_hour: 0.0,
            absolute_per_hour: 1.0,
        };
        assert_eq!(trend("x", &pts, 0.0, None, th).verdict, Verdict::Growing);
        let t = trend("x", &pts, 300.0, None, th);
        assert_eq!((t.verdict, t.start, t.end), (Verdict::Flat, 300.0, 300.0));
        assert_eq!(t.samples, 151);
        assert_eq!(
            trend("x", &pts[..2], 0.0, None, th).verdict,
            Verdict::TooFewSamples
        );
    }

    #[test]
    fn trends_read_the_load_samples_and_the_pool_scales_kv() {
        let mut samples: Vec<Sample> = (0..=30)
            .map(|i| Sample {
                t_s: i as f64 * 60.0,
                phase: "load".into(),
                rss_bytes: 100 << 20,
                fds: 20 + (i % 3),
                kv_blocks_used: Some(if i % 2 == 0 { 40 } else { 10 }),
                kv_blocks_free: Some(1000 - if i % 2 == 0 { 40 } else { 10 }),
                ..Sample::default()
            })
            .collect();
        samples.push(Sample {
            t_s: 2000.0,
            phase: "drained".into(),
            rss_bytes: 900 << 20,
            ..Sample::default()
        });
        let t = trends(&samples, 300.0);
        assert_eq!(t.len(), 3);
        assert!(t.iter().all(|t| t.verdict == Verdict::Flat), "{t:?}");
        assert_eq!(t[2].threshold_per_hour, 10.0, "1% of a 1000-block pool");
        assert_eq!(overall(&t), Verdict::Flat);
        // A KV leak of 2 blocks a minute shows.
        for (i, s) in samples.iter_mut().enumerate() {
            s.kv_blocks_used = s.kv_blocks_used.map(|v| v + 2 * i as u64);
        }
        let t = trends(&samples, 300.0);
        assert_eq!(t[2].verdict, Verdict::Growing);
        assert_eq!(overall(&t), Verdict::Growing);
        let svg = plot(&samples, 300.0, "soak").unwrap();
        assert!(svg.contains("<svg") && svg.contains("KV blocks in use"));
    }
}
