//! The Markdown of the report: the latest side-by-side run, the latest memra rows, every run.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::roof;
use crate::record::{Row, Workload};

/// A value as the tables print it: thousands separated, one decimal below 1,000.
pub fn fmt_value(v: f64) -> String {
    if v.abs() < 1000.0 {
        return format!("{v:.1}");
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

fn cell(r: Option<&&Row>) -> String {
    match r.and_then(|r| r.value.map(|v| (v, r))) {
        None => "—".into(),
        Some((v, r)) => match (r.min, r.max) {
            (Some(a), Some(b)) if r.runs > 1 => {
                format!("{} ({}-{})", fmt_value(v), fmt_value(a), fmt_value(b))
            }
            _ => match r.stddev {
                Some(sd) => format!("{} ± {}", fmt_value(v), fmt_value(sd)),
                None => fmt_value(v),
            },
        },
    }
}

fn ratio(a: Option<&&Row>, b: Option<&&Row>, lower_is_better: bool) -> String {
    match (a.and_then(|r| r.value), b.and_then(|r| r.value)) {
        (Some(x), Some(y)) if x > 0.0 && y > 0.0 => {
            format!("{:.2}x", if lower_is_better { y / x } else { x / y })
        }
        _ => "—".into(),
    }
}

/// What the tables' % of roofline is (docs/BENCH.md, The report).
const ROOF_NOTE: &str = "% of roofline (decode): the bytes a token reads (its weights, of an MoE \
model only the routed experts, and the KV cache at the mean context) x tok/s over the copy \
bandwidth measured in the same run; the peer's with memra's bytes of the same model; — where \
the run measured no copy bandwidth or the row does not say its bytes.\n";

/// Runs that hold rows of memra and of a peer, oldest first.
pub fn side_by_side_runs<'a>(rows: &[&'a Row]) -> Vec<&'a str> {
    let mut order: Vec<&'a str> = Vec::new();
    for r in rows {
        if !order.contains(&r.run.as_str()) {
            order.push(&r.run);
        }
    }
    order.retain(|run| {
        let engines = |memra: bool| {
            rows.iter()
                .any(|r| r.run == *run && (r.engine == "memra") == memra)
        };
        engines(true) && engines(false)
    });
    order.sort_by_key(|run| latest_time(rows, run));
    order
}

fn latest_time<'a>(rows: &[&'a Row], run: &str) -> &'a str {
    rows.iter()
        .filter(|r| r.run == run)
        .map(|r| r.time.as_str())
        .max()
        .unwrap_or("")
}

/// The key of a side-by-side line: the model for decode / prefill, `workload:model` for the
/// server workloads (TTFT, load).
fn line_key(w: Workload, model: &str) -> String {
    match w {
        Workload::Decode | Workload::Prefill => model.to_string(),
        _ => format!("{}:{model}", w.name()),
    }
}

/// The side-by-side table of one run (only the lines keyed in `only`, when given).
fn side_by_side(rows: &[&Row], run: &str, only: Option<&[String]>) -> String {
    let wanted = |w: Workload, m: &str| only.is_none_or(|k| k.contains(&line_key(w, m)));
    let in_run: Vec<&Row> = rows.iter().filter(|r| r.run == run).copied().collect();
    let Some(first) = in_run.first() else {
        return String::new();
    };
    let find = |engine_is_memra: bool, model: &str, w: Workload| {
        in_run.iter().find(|r| {
            (r.engine == "memra") == engine_is_memra
                && r.model_label() == model
                && r.workload == w
                && r.depth.unwrap_or(0) == 0
                // Decode and prefill compare the engines themselves; server-measured rows of
                // those (`--server`) stay in the run list.
                && (matches!(
                    w,
                    Workload::TtftCold
                        | Workload::TtftCached
                        | Workload::VisionEncode
                        | Workload::VisionTtft
                ) || !via_server(r))
        })
    };
    // The peer as its engine-level rows name it (server rows may name the server instead).
    let engine_level =
        |r: &&&Row| matches!(r.workload, Workload::Decode | Workload::Prefill) && !via_server(r);
    let peers = || in_run.iter().filter(|r| r.engine != "memra");
    let peer = peers()
        .find(engine_level)
        .or_else(|| peers().next())
        .map(|r| {
            format!(
                "{} {}",
                r.engine,
                r.version.as_deref().unwrap_or("(version not recorded)")
            )
        })
        .unwrap_or_default();
    let commit = in_run
        .iter()
        .find_map(|r| r.commit.clone())
        .unwrap_or_else(|| "(commit not recorded)".into());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Run `{run}` on {} ({}): memra {commit} and {peer}, same model files, batch 1.\n",
        first.device.name,
        latest_time(rows, run)
    );
    let _ = writeln!(
        s,
        "| model | memra decode tok/s | peer decode tok/s | ratio | decode % of roofline (memra / peer) | memra prefill tok/s | peer prefill tok/s | ratio |\n|---|---|---|---|---|---|---|---|"
    );
    let mut models: Vec<String> = Vec::new();
    for r in &in_run {
        let m = r.model_label();
        if matches!(r.workload, Workload::Decode | Workload::Prefill)
            && !models.contains(&m)
            && wanted(r.workload, &m)
        {
            models.push(m);
        }
    }
    for m in &models {
        let md = find(true, m, Workload::Decode);
        let pd = md.and_then(|x| decode_peer(&in_run, x));
        let (mp, pp) = (
            find(true, m, Workload::Prefill),
            find(false, m, Workload::Prefill),
        );
        let _ = writeln!(
            s,
            "| {m} | {} | {} | {} | {} | {} | {} | {} |",
            cell(md),
            cell(pd.as_ref()),
            ratio(md, pd.as_ref(), false),
            roof::pair(rows, md.copied(), pd),
            cell(mp),
            cell(pp),
            ratio(mp, pp, false)
        );
    }
    for w in [
        Workload::TtftCold,
        Workload::TtftCached,
        Workload::Load,
        Workload::VisionEncode,
        Workload::VisionTtft,
    ] {
        let mut seen: Vec<String> = Vec::new();
        for r in in_run
            .iter()
            .filter(|r| r.workload == w && r.engine == "memra")
        {
            let m = r.model_label();
            if seen.contains(&m) || !wanted(w, &m) {
                continue;
            }
            seen.push(m.clone());
            let p = find(false, &m, w);
            // Compare like with like: a peer measured through its server against memra's
            // server rows when the run has them (`memra-bench ttft --server`).
            let through_server =
                |x: &Row| x.source.as_deref().is_some_and(|s| s.starts_with("server"));
            let r = match p.filter(|p| through_server(p)) {
                Some(_) => in_run
                    .iter()
                    .find(|x| {
                        x.engine == "memra"
                            && x.workload == w
                            && x.model_label() == m
                            && through_server(x)
                    })
                    .copied()
                    .unwrap_or(r),
                None => r,
            };
            let what = match w {
                Workload::Load => format!(
                    "{} streaming clients through the server, {m}",
                    r.batch.unwrap_or(0)
                ),
                Workload::VisionEncode => format!("vision_encode, {m}"),
                Workload::VisionTtft => {
                    format!(
                        "vision_ttft ms, a {}-token prompt with one image, {m}",
                        r.prompt.unwrap_or(0)
                    )
                }
                _ => format!(
                    "{} {} ms, {m}{}",
                    w.name(),
                    r.prompt.unwrap_or(0),
                    if through_server(r) {
                        " (through the servers)"
                    } else {
                        ""
                    }
                ),
            };
            let _ = writeln!(
                s,
                "| {what} | {} {} | {} {} | {} | | | | |",
                cell(Some(&r)),
                r.unit,
                cell(p),
                r.unit,
                ratio(
                    Some(&r),
                    p,
                    !matches!(w, Workload::Load | Workload::VisionEncode)
                )
            );
        }
    }
    s
}

type Latest<'a> =
    BTreeMap<(String, String, Workload, Option<u64>, Option<u64>, String), (usize, &'a Row)>;

fn opt(v: &Option<u64>) -> String {
    v.map_or("—".into(), |v| v.to_string())
}

/// The most recent valid memra row per (device, model, workload, prompt, batch, KV format),
/// newest run last.
fn latest_memra(rows: &[&Row]) -> String {
    let mut latest: Latest = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        if r.engine != "memra" || r.workload == Workload::CopyBandwidth {
            continue;
        }
        let key = (
            r.device.name.clone(),
            r.model_label(),
            r.workload,
            r.prompt,
            r.batch,
            r.kv_dtype.clone().unwrap_or_default(),
        );
        let newer = latest
            .get(&key)
            .is_none_or(|(j, old)| (old.time.as_str(), *j) <= (r.time.as_str(), i));
        if newer {
            latest.insert(key, (i, r));
        }
    }
    let mut s = String::from(
        "| device | model | workload | batch | prompt | KV | memra | % of roofline | run |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for ((dev, model, w, prompt, batch, kv), (_, r)) in &latest {
        let kv = if kv.is_empty() { "—" } else { kv.as_str() };
        // The roofline is decode's (a step's bytes over its time); other workloads: blank.
        let roofline = match w {
            Workload::Decode => roof::fmt_percent(roof::percent(rows, r, r)),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "| {dev} | {model} | {} | {} | {} | {kv} | {} {} | {roofline} | `{}` |",
            w.name(),
            opt(batch),
            opt(prompt),
            cell(Some(r)),
            r.unit,
            r.run
        );
    }
    s
}

/// The context before a decode row's measured tokens: its depth, or its prompt at depth 0
/// (memra's `--prompt 512` and llama-bench's `-p 0 -d 512` both decode after 512 tokens).
fn ctx(r: &Row) -> Option<u64> {
    r.depth.filter(|&d| d > 0).or(r.prompt)
}

/// The peer's engine-level decode row (not through a server) of `in_run` that measured what
/// memra's decode row `m` did: the same model, context and KV format (a row without a KV format
/// matches any).
fn decode_peer<'a>(in_run: &[&'a Row], m: &Row) -> Option<&'a Row> {
    in_run.iter().copied().find(|p| {
        p.engine != "memra"
            && p.workload == Workload::Decode
            && p.model_label() == m.model_label()
            && ctx(p) == ctx(m)
            && (p.kv_dtype.is_none() || m.kv_dtype.is_none() || p.kv_dtype == m.kv_dtype)
            && !via_server(p)
    })
}

/// Whether a row was measured through a server (`memra-bench ttft|decode --server`, load).
fn via_server(r: &Row) -> bool {
    r.source.as_deref().is_some_and(|s| s.starts_with("server"))
}

/// The decode-at-depth table of one run, when its peer has depth rows: memra and the peer
/// matched on (model, KV format, context before the measured tokens: the depth, or memra's prompt
/// at depth 0).
fn depth_table(rows: &[&Row], run: &str) -> String {
    let decode: Vec<&Row> = rows
        .iter()
        .filter(|r| r.run == run && r.workload == Workload::Decode)
        .copied()
        .collect();
    if !decode
        .iter()
        .any(|r| r.engine != "memra" && r.depth.unwrap_or(0) > 0)
    {
        return String::new();
    }
    let mut s = format!(
        "Decode at depth, run `{run}` (context = tokens before the measured ones):\n\n| model | KV | context | memra tok/s | peer tok/s | ratio | % of roofline (memra / peer) |\n|---|---|---|---|---|---|---|\n"
    );
    for m in decode.iter().filter(|r| r.engine == "memra") {
        let peer = decode.iter().find(|p| {
            p.engine != "memra"
                && p.model_label() == m.model_label()
                && p.kv_dtype == m.kv_dtype
                && ctx(p) == ctx(m)
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            m.model_label(),
            m.kv_dtype.as_deref().unwrap_or("—"),
            opt(&ctx(m)),
            cell(Some(m)),
            peer.map_or("—".into(), |p| cell(Some(p))),
            ratio(Some(m), peer, false),
            roof::pair(rows, Some(*m), peer.copied())
        );
    }
    s
}

/// Per side-by-side line (a model's decode / prefill, a server workload of a model), the run
/// whose memra rows of it are the newest among the runs that compare it with a peer (memra's
/// decode with the peer's after the same context, or both engines' prefill, or both engines'
/// row of the server workload); grouped by run, the run of the newest line first.
fn newest_lines<'a>(valid: &[&'a Row]) -> Vec<(&'a str, Vec<String>)> {
    let mut best: BTreeMap<String, (&'a str, &'a str)> = BTreeMap::new();
    for run in side_by_side_runs(valid) {
        let in_run: Vec<&Row> = valid.iter().filter(|r| r.run == run).copied().collect();
        let peer_has = |w: Workload, m: &str| {
            in_run
                .iter()
                .any(|p| p.engine != "memra" && p.workload == w && p.model_label() == m)
        };
        for r in in_run.iter().filter(|r| r.engine == "memra") {
            let m = r.model_label();
            let compared = match r.workload {
                Workload::Decode => {
                    r.depth.unwrap_or(0) == 0 && !via_server(r) && decode_peer(&in_run, r).is_some()
                }
                Workload::Prefill => !via_server(r) && peer_has(Workload::Prefill, &m),
                Workload::TtftCold
                | Workload::TtftCached
                | Workload::Load
                | Workload::VisionEncode
                | Workload::VisionTtft => peer_has(r.workload, &m),
                _ => false,
            };
            if !compared {
                continue;
            }
            let key = line_key(r.workload, &m);
            if best.get(&key).is_none_or(|(t, _)| *t <= r.time.as_str()) {
                best.insert(key, (r.time.as_str(), run));
            }
        }
    }
    let mut groups: Vec<(&'a str, &'a str, Vec<String>)> = Vec::new();
    for (key, (time, run)) in best {
        match groups.iter_mut().find(|g| g.1 == run) {
            Some(g) => {
                g.0 = g.0.max(time);
                g.2.push(key);
            }
            None => groups.push((time, run, vec![key])),
        }
    }
    groups.sort_by(|a, b| b.0.cmp(a.0));
    groups
        .into_iter()
        .map(|(_, run, keys)| (run, keys))
        .collect()
}

/// The README's section (between the markers): per model, its newest comparison with a peer.
pub fn readme_section(valid: &[&Row]) -> String {
    let mut s = String::new();
    let lines = newest_lines(valid);
    if lines.is_empty() {
        s.push_str("No run with memra and a peer recorded yet.\n");
    }
    for (i, (run, keys)) in lines.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&side_by_side(valid, run, Some(keys)));
    }
    if !lines.is_empty() {
        s.push('\n');
        s.push_str(ROOF_NOTE);
    }
    s.push_str(
        "\nThe newest memra numbers (each from its own run; a ratio only ever joins rows of one run):\n\n",
    );
    s.push_str(&latest_memra(valid));
    s.push_str("\nGenerated by `memra-bench report` from reports/data (figures and every run: reports/README.md).\n");
    s
}

/// reports/README.md.
pub fn reports_readme(all: &[Row], valid: &[&Row], figures: &[String]) -> String {
    let mut s = String::from(
        "# Benchmark records\n\nGenerated by `memra-bench report` from the rows in reports/data/*.jsonl \
         (docs/BENCH.md: fields and method); do not edit. Every number is a recorded row; a ratio \
         joins memra and a peer of the SAME run only.\n\n",
    );
    s.push_str(ROOF_NOTE);
    s.push_str("\n## Side by side\n\n");
    let runs = side_by_side_runs(valid);
    if runs.is_empty() {
        s.push_str("No run with memra and a peer recorded yet.\n");
    }
    for run in runs.iter().rev() {
        s.push_str(&side_by_side(valid, run, None));
        s.push('\n');
        let d = depth_table(valid, run);
        if !d.is_empty() {
            s.push_str(&d);
            s.push('\n');
        }
    }
    s.push_str("## The newest memra numbers\n\n");
    s.push_str(&latest_memra(valid));
    s.push_str("\n## Figures\n\n");
    if figures.is_empty() {
        s.push_str("No figure has data yet.\n");
    }
    for f in figures {
        let _ = writeln!(s, "![{f}](figures/{f})\n");
    }
    for (name, what) in crate::report::plot::FIGURES {
        if !figures.iter().any(|f| f == name) {
            let _ = writeln!(s, "- {name} ({what}): no rows recorded yet.");
        }
    }
    s.push_str("\n## Runs\n\n| run | time | device | engines | memra commit | rows | invalid | source |\n|---|---|---|---|---|---|---|---|\n");
    let mut order: Vec<&str> = Vec::new();
    for r in all {
        if !order.contains(&r.run.as_str()) {
            order.push(&r.run);
        }
    }
    for run in order {
        let rs: Vec<&Row> = all.iter().filter(|r| r.run == run).collect();
        let mut engines: Vec<&str> = rs.iter().map(|r| r.engine.as_str()).collect();
        engines.dedup();
        engines.sort_unstable();
        engines.dedup();
        let commit = rs.iter().find_map(|r| r.commit.as_deref()).unwrap_or("—");
        let source = rs.iter().find_map(|r| r.source.as_deref()).unwrap_or("—");
        let time = rs.iter().map(|r| r.time.as_str()).max().unwrap_or("");
        let _ = writeln!(
            s,
            "| `{run}` | {time} | {} | {} | {commit} | {} | {} | {source} |",
            rs[0].device.name,
            engines.join(", "),
            rs.len(),
            rs.iter().filter(|r| !r.valid).count()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(engine: &str, prompt: u64, depth: u64, kv: &str, value: f64) -> Row {
        serde_json::from_value(serde_json::json!({
            "run": "r", "time": "2026-12-03T07:00:00Z",
            "device": {"name": "NVIDIA H200", "driver": "580", "sms": 132},
            "engine": engine, "version": null, "commit": "abc",
            "model": {"file": "q4.gguf", "sha256": "a65e030642f0", "bytes": 1},
            "shape": "llama3-8b", "dtype": "Q4_K_M", "workload": "decode", "batch": 1,
            "prompt": prompt, "gen": 128, "depth": depth, "value": value, "unit": "tok/s",
            "kv_dtype": kv, "runs": 3, "valid": true
        }))
        .unwrap()
    }

    #[test]
    fn decode_pairs_the_peer_that_decoded_after_the_same_context() {
        // memra: a 512-token prompt, then 128 tokens; llama-bench: -p 0 -d 512 -n 128, and a
        // depth-8192 row of each engine.
        let rows = [
            row("memra", 512, 0, "f16", 288.7),
            row("llama.cpp", 0, 8192, "f16", 249.4),
            row("llama.cpp", 0, 512, "q8_0", 270.0),
            row("llama.cpp", 0, 512, "f16", 277.9),
            row("memra", 512, 8192, "f16", 261.6),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        // memra's 512-token decode pairs with the peer's `-d 512` row.
        assert_eq!(
            newest_lines(&refs),
            vec![("r", vec!["llama3-8b Q4_K_M".to_string()])]
        );
        assert_eq!(
            decode_peer(&refs, &rows[0]).and_then(|p| p.value),
            Some(277.9)
        );
        assert_eq!(
            decode_peer(&refs, &rows[4]).and_then(|p| p.value),
            Some(249.4)
        );
        let t = side_by_side(&refs, "r", None);
        assert!(t.contains("| 288.7 | 277.9 | 1.04x |"), "{t}");
        // Without a peer at that context there is no ratio.
        let alone = [
            row("memra", 512, 0, "f16", 288.7),
            row("llama.cpp", 0, 8192, "f16", 249.4),
        ];
        let refs: Vec<&Row> = alone.iter().collect();
        assert!(newest_lines(&refs).is_empty());
    }

    #[test]
    fn the_readme_takes_each_model_from_its_newest_comparison() {
        let at = |run: &str, time: &str, engine: &str, shape: &str, value: f64| Row {
            run: run.into(),
            time: time.into(),
            shape: Some(shape.into()),
            ..row(
                engine,
                if engine == "memra" { 512 } else { 0 },
                if engine == "memra" { 0 } else { 512 },
                "f16",
                value,
            )
        };
        let rows = [
            at("old", "2026-12-03T07:00:00Z", "memra", "llama3-8b", 288.7),
            at(
                "old",
                "2026-12-03T07:00:00Z",
                "llama.cpp",
                "llama3-8b",
                277.9,
            ),
            at("old", "2026-12-03T07:00:01Z", "memra", "gemma3-270m", 349.2),
            at(
                "old",
                "2026-12-03T07:00:01Z",
                "llama.cpp",
                "gemma3-270m",
                967.0,
            ),
            at("new", "2026-12-03T16:00:00Z", "memra", "gemma3-270m", 393.0),
            at(
                "new",
                "2026-12-03T16:00:00Z",
                "llama.cpp",
                "gemma3-270m",
                950.7,
            ),
            // A newer memra row without a peer in its run does not replace a comparison.
            at("alone", "2026-12-03T17:00:00Z", "memra", "llama3-8b", 300.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        assert_eq!(
            newest_lines(&refs),
            vec![
                ("new", vec!["gemma3-270m Q4_K_M".to_string()]),
                ("old", vec!["llama3-8b Q4_K_M".to_string()]),
            ]
        );
        let all = readme_section(&refs);
        let s = &all[..all.find("The newest memra numbers").unwrap()];
        let (new_at, old_at) = (s.find("Run `new`").unwrap(), s.find("Run `old`").unwrap());
        assert!(new_at < old_at, "{s}");
        assert!(
            s.contains("| gemma3-270m Q4_K_M | 393.0 | 950.7 | 0.41x |"),
            "{s}"
        );
        assert!(
            s.contains("| llama3-8b Q4_K_M | 288.7 | 277.9 | 1.04x |"),
            "{s}"
        );
        assert!(!s.contains("349.2") && !s.contains("300.0"), "{s}");
    }

    #[test]
    fn values_are_grouped_by_thousands() {
        assert_eq!(fmt_value(5355.0), "5,355");
        assert_eq!(fmt_value(1234567.4), "1,234,567");
        assert_eq!(fmt_value(243.34), "243.3");
        assert_eq!(fmt_value(-2500.0), "-2,500");
    }
}
