//! The report's SVG figures (plotters). A figure is written only when rows for it exist.

use plotters::prelude::*;

use memra_engine::error::{Error, Result};

use crate::record::{Row, Workload};

/// Every figure the report knows: file name and what it shows.
pub const FIGURES: &[(&str, &str)] = &[
    (
        "decode.svg",
        "batch-1 decode tok/s per model file: memra, the peer and the roofline, latest side-by-side run",
    ),
    (
        "ttft.svg",
        "time to first token against prompt length, cold and cached",
    ),
    (
        "concurrency.svg",
        "aggregate tok/s against concurrent sequences or clients",
    ),
    ("depth.svg", "decode tok/s against context depth"),
];

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Input(format!("plotting: {e:?}"))
}

type Series = (String, Vec<(f64, f64)>);

/// Lines with points; x and y from zero.
fn line_chart(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<String> {
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..xmax * 1.05, 0f64..ymax * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Grouped bars: one group per label, one bar per series (a missing value leaves a gap).
fn bar_chart(
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<String> {
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().flatten().copied())
        .fold(1.0, f64::max);
    let n = groups.len().max(1) as f64;
    let width = 0.8 / series.len().max(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n, 0f64..ymax * 1.15)
            .map_err(err)?;
        let label = |x: &f64| {
            let i = x.floor() as usize;
            match groups.get(i) {
                Some(g) if (x - i as f64 - 0.5).abs() < 1e-6 => g.clone(),
                _ => String::new(),
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * groups.len() + 1)
            .x_label_formatter(&label)
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for (s, (name, vals)) in series.iter().enumerate() {
            let c = COLORS[s % COLORS.len()];
            let bars = vals.iter().enumerate().filter_map(|(g, v)| {
                v.map(|v| {
                    let x0 = g as f64 + 0.1 + s as f64 * width;
                    Rectangle::new([(x0, 0.0), (x0 + width * 0.95, v)], c.filled())
                })
            });
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The newest run (by time, then file order) holding a row that `keep` accepts.
fn newest_run<'a>(rows: &[&'a Row], keep: impl Fn(&Row) -> bool) -> Option<&'a str> {
    rows.iter()
        .enumerate()
        .filter(|(_, r)| keep(r))
        .max_by(|(i, a), (j, b)| (a.time.as_str(), i).cmp(&(b.time.as_str(), j)))
        .map(|(_, r)| r.run.as_str())
}

fn decode_figure(rows: &[&Row]) -> Result<Option<String>> {
    // The newest side-by-side run with decode rows (a run of the vision workloads alone has
    // none to draw).
    let has_decode = |run: &str| {
        rows.iter()
            .any(|r| r.run == run && r.workload == Workload::Decode)
    };
    let Some(run) = super::side_by_side_runs(rows)
        .into_iter()
        .rev()
        .find(|run| has_decode(run))
    else {
        return Ok(None);
    };
    let in_run: Vec<&Row> = rows.iter().filter(|r| r.run == run).copied().collect();
    let mut groups: Vec<String> = Vec::new();
    for r in in_run.iter().filter(|r| r.workload == Workload::Decode) {
        if !groups.contains(&r.model_label()) {
            groups.push(r.model_label());
        }
    }
    let pick = |memra: bool| -> Vec<Option<f64>> {
        groups
            .iter()
            .map(|g| {
                in_run
                    .iter()
                    .find(|r| {
                        r.workload == Workload::Decode
                            && (r.engine == "memra") == memra
                            && &r.model_label() == g
                    })
                    .and_then(|r| r.value)
            })
            .collect()
    };
    let peer = in_run
        .iter()
        .find(|r| r.engine != "memra")
        .map(|r| r.engine.clone())
        .unwrap_or_default();
    let mut series = vec![("memra".to_string(), pick(true)), (peer, pick(false))];
    // The roofline: the run's copy bandwidth over the bytes memra's row says a token reads.
    if let Some(bw) = super::roof::copy_bandwidth(rows, run) {
        let roof: Vec<Option<f64>> = groups
            .iter()
            .map(|g| {
                in_run
                    .iter()
                    .find(|r| {
                        r.workload == Workload::Decode
                            && r.engine == "memra"
                            && &r.model_label() == g
                    })
                    .and_then(|r| super::roof::bytes_per_token(r))
                    .map(|b| bw * 1e9 / b)
            })
            .collect();
        if roof.iter().any(Option::is_some) {
            series.push(("roofline (copy GB/s / bytes per token)".into(), roof));
        }
    }
    let title = format!("Decode tok/s, batch 1 ({run})");
    bar_chart(&title, "tok/s", &groups, &series).map(Some)
}

/// Line series of one workload from the newest run that has it: one line per (engine, model).
/// The run is the newest holding a row that `keep` accepts.
fn by_x(
    rows: &[&Row],
    workloads: &[Workload],
    x: impl Fn(&Row) -> Option<u64>,
    keep: impl Fn(&Row) -> bool,
) -> Option<(String, Vec<Series>)> {
    let run = newest_run(rows, |r| {
        workloads.contains(&r.workload) && x(r).is_some() && keep(r)
    })?;
    let mut series: Vec<Series> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.run == run && workloads.contains(&r.workload))
    {
        let (Some(xv), Some(v)) = (x(r), r.value) else {
            continue;
        };
        let name = format!("{} {} {}", r.engine, r.workload.name(), r.model_label());
        match series.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push((xv as f64, v)),
            None => series.push((name, vec![(xv as f64, v)])),
        }
    }
    for s in &mut series {
        s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Some((run.to_string(), series))
}

/// Every figure that has rows: (file name, SVG).
pub fn figures(rows: &[&Row]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    if let Some(svg) = decode_figure(rows)? {
        out.push(("decode.svg".to_string(), svg));
    }
    let ttft = [Workload::TtftCold, Workload::TtftCached];
    if let Some((run, s)) = by_x(rows, &ttft, |r| r.prompt, |_| true) {
        let t = format!("Time to first token ({run})");
        out.push((
            "ttft.svg".into(),
            line_chart(&t, "prompt tokens", "ms", &s)?,
        ));
    }
    let conc = [Workload::Concurrency, Workload::Load];
    if let Some((run, s)) = by_x(rows, &conc, |r| r.batch, |_| true) {
        let t = format!("Aggregate throughput ({run})");
        let x = "concurrent sequences (engine) or clients (server)";
        out.push(("concurrency.svg".into(), line_chart(&t, x, "tok/s", &s)?));
    }
    let deep = |r: &Row| r.depth.is_some_and(|d| d > 0);
    if let Some((run, s)) = by_x(rows, &[Workload::Decode], |r| r.depth, deep) {
        let t = format!("Decode tok/s against context depth ({run})");
        out.push((
            "depth.svg".into(),
            line_chart(&t, "context depth (tokens)", "tok/s", &s)?,
        ));
    }
    Ok(out)
}
