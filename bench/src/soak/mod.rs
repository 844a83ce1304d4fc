//! `memra-bench load --soak MINUTES`: a long mixed load against a running server while its
//! memory, open file descriptors and KV blocks are sampled, then a verdict on their trends.
//!
//! The load: `clients` threads issue requests back to back until the time is up, cycling
//! through four kinds (streaming chat, whole chat, streaming completion, whole completion),
//! prompt lengths (`prompt_words`) and three output lengths (a quarter, half and all of
//! `max_tokens`); a `cancel` fraction of the streaming requests hang up after their first
//! tokens. Every `sample_s` seconds the sampler reads /proc/<pid>/status (VmRSS),
//! /proc/<pid>/fd and the server's `/metrics` (`memra_kv_blocks_used` / `_free`,
//! `memra_http_in_flight`). After the load a last `drained` sample is taken once the server is
//! idle (no request in flight, no KV block in use) or 30 s have passed.
//!
//! The samples go to a JSONL file, one [`trend::Sample`] per line; the summary is a least-squares
//! slope per hour of RSS, fds and KV blocks in use over the samples after the warm-up, each
//! "flat" or "growing" against a stated threshold ([`trend::RSS`], [`trend::FDS`], [`trend::KV`]).

pub mod probe;
pub mod trend;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memra_engine::error::{Error, Result};

use trend::{Sample, Trend, Verdict};

/// What to run and where to write.
#[derive(Clone, Debug)]
pub struct SoakArgs {
    pub addr: String,
    pub model: String,
    pub api_key: Option<String>,
    pub clients: usize,
    /// The longest output asked; requests cycle through a quarter, half and all of it.
    pub max_tokens: usize,
    /// Filler words per prompt, cycled (empty: 0, 40 and 200 words).
    pub prompt_words: Vec<usize>,
    /// Fraction (0..=1) of the streaming requests that hang up after their first tokens.
    pub cancel: f64,
    pub minutes: f64,
    pub sample_s: f64,
    /// Samples before this many seconds are left out of the trends.
    pub warmup_s: f64,
    /// The server's pid (None: the process listening on the port of `addr`).
    pub pid: Option<u32>,
    /// The samples (JSONL), the summary (JSON) and the plot (SVG), each optional.
    pub samples_out: Option<PathBuf>,
    pub summary_out: Option<PathBuf>,
    pub plot_out: Option<PathBuf>,
}

/// The four request kinds, in the order requests cycle through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    StreamChat,
    Chat,
    StreamCompletion,
    Completion,
}

impl Kind {
    pub fn of(i: usize) -> Kind {
        [
            Kind::StreamChat,
            Kind::Chat,
            Kind::StreamCompletion,
            Kind::Completion,
        ][i % 4]
    }

    fn streaming(self) -> bool {
        matches!(self, Kind::StreamChat | Kind::StreamCompletion)
    }

    fn chat(self) -> bool {
        matches!(self, Kind::StreamChat | Kind::Chat)
    }
}

/// Counts of the clients' outcomes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Outcomes {
    pub requests: u64,
    pub ok: u64,
    pub cancelled: u64,
    /// 429 / 503: admission control shedding load, not errors.
    pub shed: u64,
    pub errors: u64,
    pub completion_tokens: u64,
    pub first_error: Option<String>,
}

/// The soak's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakSummary {
    pub pid: u32,
    pub minutes: f64,
    pub clients: usize,
    pub warmup_s: f64,
    pub samples: usize,
    pub outcomes: Outcomes,
    pub trends: Vec<Trend>,
    pub verdict: Verdict,
    /// The first load sample and the sample after the drain.
    pub first: Option<Sample>,
    pub drained: Option<Sample>,
}

/// Request `i`'s body and route.
pub fn request(a: &SoakArgs, i: usize) -> (&'static str, String, bool) {
    let kind = Kind::of(i);
    let words = if a.prompt_words.is_empty() {
        [0, 40, 200][(i / 4) % 3]
    } else {
        a.prompt_words[(i / 4) % a.prompt_words.len()]
    };
    let max = a.max_tokens.max(1);
    let max_tokens = [max.div_ceil(4), max.div_ceil(2), max][(i / 4 + i / 12) % 3];
    let filler: Vec<String> = (0..words)
        .map(|w| format!("w{}", (w * 7 + i) % 997))
        .collect();
    let text = if words == 0 {
        format!("Tell me a short story about the number {i}.")
    } else {
        format!(
            "Tell me a short story about the number {i}. Context: {}",
            filler.join(" ")
        )
    };
    let mut body = serde_json::json!({
        "model": a.model,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": kind.streaming(),
    });
    if kind.streaming() {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    let path = if kind.chat() {
        body["messages"] = serde_json::json!([{"role": "user", "content": text}]);
        "/v1/chat/completions"
    } else {
        body["prompt"] = serde_json::json!(text);
        "/v1/completions"
    };
    // Streaming requests are the even ones: i / 2 numbers them.
    let cancel = kind.streaming() && crate::load::in_fraction(i / 2, a.cancel);
    (path, body.to_string(), cancel)
}

/// How one request ended.
#[derive(Debug, PartialEq)]
enum End {
    Ok(u64),
    Cancelled,
    Shed,
    Error(String),
}

/// Checks a whole (non-streaming) response body: one choice with text, usage present.
fn check_whole(body: &str, chat: bool) -> std::result::Result<u64, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("bad response JSON: {e}"))?;
    let c = &v["choices"][0];
    let text = if chat {
        c["message"]["content"].as_str()
    } else {
        c["text"].as_str()
    };
    match (
        text,
        c["finish_reason"].as_str(),
        v["usage"]["completion_tokens"].as_u64(),
    ) {
        (Some(_), Some(_), Some(n)) => Ok(n),
        _ => Err(format!(
            "malformed response: {}",
            body.chars().take(200).collect::<String>()
        )),
    }
}

/// Reads an SSE stream: hangs up after two content chunks when `cancel`, else checks it ends
/// with one finish_reason, usage and `[DONE]`.
fn read_stream(r: impl BufRead, chat: bool, cancel: bool) -> End {
    let (mut chunks, mut finishes, mut usage, mut done) = (0, 0, None, false);
    for line in r.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return End::Error(format!("read: {e}")),
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: serde_json::Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return End::Error(format!("bad chunk JSON: {e}")),
        };
        if v.get("error").is_some() {
            return End::Error(format!("error chunk: {data}"));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            usage = Some(n);
        }
        let c = &v["choices"][0];
        let text = if chat {
            c["delta"]["content"].as_str()
        } else {
            c["text"].as_str()
        };
        if text.is_some_and(|t| !t.is_empty()) {
            chunks += 1;
            if cancel && chunks >= 2 {
                return End::Cancelled; // dropping the connection cancels the request
            }
        }
        if c["finish_reason"].is_string() {
            finishes += 1;
        }
    }
    match (done, finishes, usage) {
        (true, 1, Some(n)) => End::Ok(n),
        // A stream shorter than two chunks finished before the client could hang up.
        _ => End::Error(format!(
            "malformed stream: [DONE] {done}, finish_reason chunks {finishes}, usage {usage:?}"
        )),
    }
}

fn one(a: &SoakArgs, i: usize) -> End {
    let (path, body, cancel) = request(a, i);
    let kind = Kind::of(i);
    let p = match crate::http::post(&a.addr, path, a.api_key.as_deref(), &body) {
        Ok(p) => p,
        Err(e) => return End::Error(e),
    };
    match p.code() {
        200 => {}
        429 | 503 => return End::Shed,
        _ => return End::Error(format!("{path}: status {}", p.status)),
    }
    if kind.streaming() {
        return read_stream(p.reader, kind.chat(), cancel);
    }
    match p.body().and_then(|b| check_whole(&b, kind.chat())) {
        Ok(n) => End::Ok(n),
        Err(e) => End::Error(format!("{path}: {e}")),
    }
}

/// The clients' shared counters.
#[derive(Default)]
struct Counters {
    next: AtomicUsize,
    done: AtomicU64,
    ok: AtomicU64,
    cancelled: AtomicU64,
    shed: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Counters {
    fn count(&self, e: End) {
        match e {
            End::Ok(n) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.tokens.fetch_add(n, Ordering::Relaxed);
            }
            End::Cancelled => _ = self.cancelled.fetch_add(1, Ordering::Relaxed),
            End::Shed => _ = self.shed.fetch_add(1, Ordering::Relaxed),
            End::Error(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut f) = self.first_error.lock() {
                    f.get_or_insert(e);
                }
            }
        }
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn outcomes(&self) -> Outcomes {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Outcomes {
            requests: g(&self.done),
            ok: g(&self.ok),
            cancelled: g(&self.cancelled),
            shed: g(&self.shed),
            errors: g(&self.errors),
            completion_tokens: g(&self.tokens),
            first_error: self.first_error.lock().ok().and_then(|f| f.clone()),
        }
    }
}

/// One sample of the server now.
fn sample(a: &SoakArgs, pid: u32, t0: Instant, phase: &str, c: &Counters) -> Result<Sample> {
    let p = probe::proc_sample(pid).map_err(Error::Input)?;
    let metrics = crate::http::get(&a.addr, "/metrics", a.api_key.as_deref())
        .ok()
        .filter(|(code, _)| *code == 200)
        .map(|(_, t)| t)
        .unwrap_or_default();
    let m = |name: &str| probe::metric(&metrics, name).map(|v| v as u64);
    Ok(Sample {
        t_s: t0.elapsed().as_secs_f64(),
        phase: phase.to_string(),
        rss_bytes: p.rss_bytes,
        fds: p.fds,
        kv_blocks_used: m("memra_kv_blocks_used"),
        kv_blocks_free: m("memra_kv_blocks_free"),
        http_in_flight: m("memra_http_in_flight"),
        requests: c.done.load(Ordering::Relaxed),
        errors: c.errors.load(Ordering::Relaxed),
    })
}

fn check(a: &SoakArgs) -> Result<()> {
    let bad =
        |what: &str, v: f64| Error::Input(format!("{what} {v}: expected a finite number in range"));
    if a.clients == 0 {
        return Err(Error::Input("--clients must be > 0".into()));
    }
    if !(a.minutes > 0.0 && a.minutes.is_finite()) {
        return Err(bad("--soak", a.minutes));
    }
    if !(a.sample_s >= 0.5 && a.sample_s.is_finite()) {
        return Err(bad("--sample-s (>= 0.5)", a.sample_s));
    }
    if !(a.warmup_s >= 0.0 && a.warmup_s < a.minutes * 60.0) {
        return Err(bad("--warmup-s (below the soak's length)", a.warmup_s));
    }
    if !(0.0..=1.0).contains(&a.cancel) {
        return Err(bad("--cancel (0..1)", a.cancel));
    }
    Ok(())
}

/// Runs the soak; writes the samples, summary and plot asked for; returns the summary (an
/// unreachable server or process is an error; request failures are counted).
pub fn run(a: &SoakArgs) -> Result<SoakSummary> {
    check(a)?;
    let pid = match a.pid {
        Some(p) => p,
        None => probe::port_of(&a.addr)
            .ok_or_else(|| Error::Input(format!("--addr {}: no port", a.addr)))
            .and_then(|port| probe::discover_pid(port).map_err(Error::Input))?,
    };
    let mut out = match &a.samples_out {
        Some(p) => {
            if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
            }
            Some(std::fs::File::create(p).map_err(|e| Error::io(p, e))?)
        }
        None => None,
    };
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut samples = vec![sample(a, pid, t0, "load", &counters)?];
    let clients: Vec<_> = (0..a.clients)
        .map(|_| {
            let (a, c, stop) = (a.clone(), counters.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = c.next.fetch_add(1, Ordering::Relaxed);
                    c.count(one(&a, i));
                }
            })
        })
        .collect();
    let end = Duration::from_secs_f64(a.minutes * 60.0);
    let mut next = Duration::from_secs_f64(a.sample_s);
    let mut write = |s: &Sample| -> Result<()> {
        if let Some(f) = out.as_mut() {
            let line = serde_json::to_string(s).unwrap_or_default();
            writeln!(f, "{line}").map_err(|e| Error::Input(format!("writing samples: {e}")))?;
        }
        Ok(())
    };
    write(&samples[0])?;
    while next <= end {
        std::thread::sleep(next.saturating_sub(t0.elapsed()));
        let s = sample(a, pid, t0, "load", &counters);
        let s = match s {
            Ok(s) => s,
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        write(&s)?;
        samples.push(s);
        next += Duration::from_secs_f64(a.sample_s);
    }
    stop.store(true, Ordering::Relaxed);
    for h in clients {
        h.join()
            .map_err(|_| Error::Input("a soak client thread panicked".into()))?;
    }
    let drained = drain(a, pid, t0, &counters)?;
    write(&drained)?;
    samples.push(drained.clone());
    let trends = trend::trends(&samples, a.warmup_s);
    let summary = SoakSummary {
        pid,
        minutes: a.minutes,
        clients: a.clients,
        warmup_s: a.warmup_s,
        samples: samples.len(),
        outcomes: counters.outcomes(),
        verdict: trend::overall(&trends),
        trends,
        first: samples.first().cloned(),
        drained: Some(drained),
    };
    if let Some(p) = &a.summary_out {
        let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
        std::fs::write(p, text + "\n").map_err(|e| Error::io(p, e))?;
    }
    if let Some(p) = &a.plot_out {
        let title = format!(
            "soak: {} clients, {:.0} min, RSS / fds / KV (fit after {:.0} s)",
            a.clients, a.minutes, a.warmup_s
        );
        std::fs::write(p, trend::plot(&samples, a.warmup_s, &title)?)
            .map_err(|e| Error::io(p, e))?;
    }
    Ok(summary)
}

/// Waits (up to 30 s) for the server to go idle, then samples it.
fn drain(a: &SoakArgs, pid: u32, t0: Instant, c: &Counters) -> Result<Sample> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = sample(a, pid, t0, "drained", c)?;
        let idle = s.kv_blocks_used == Some(0) && s.http_in_flight == Some(0);
        if idle || Instant::now() >= until {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The summary as a markdown table (for a report).
pub fn markdown(s: &SoakSummary) -> String {
    let mut t = String::from(
        "| quantity | first after warm-up | last | mean | slope per hour | threshold per hour | verdict |\n|---|---|---|---|---|---|---|\n",
    );
    for tr in &s.trends {
        let (scale, unit) = if tr.metric == "rss_bytes" {
            (1.0 / 1048576.0, " MiB")
        } else {
            (1.0, "")
        };
        let v = |x: f64| format!("{:.1}{unit}", x * scale);
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {:?} |\n",
            tr.metric,
            v(tr.start),
            v(tr.end),
            v(tr.mean),
            tr.slope_per_hour
                .map_or("-".into(), |x| format!("{:+.2}{unit}", x * scale)),
            v(tr.threshold_per_hour),
            tr.verdict
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> SoakArgs {
        SoakArgs {
            addr: "127.0.0.1:1".into(),
            model: "m".into(),
            api_key: None,
            clients: 2,
            max_tokens: 40,
            prompt_words: Vec::new(),
            cancel: 0.5,
            minutes: 1.0,
            sample_s: 10.0,
            warmup_s: 10.0,
            pid: None,
            samples_out: None,
            summary_out: None,
            plot_out: None,
        }
    }

    #[test]
    fn requests_cycle_kinds_lengths_and_cancel_only_streams() {
        let a = args();
        let reqs: Vec<_> = (0..48).map(|i| request(&a, i)).collect();
        let paths: Vec<&str> = reqs[..4].iter().map(|r| r.0).collect();
        assert_eq!(
            paths,
            [
                "/v1/chat/completions",
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/completions"
            ]
        );
        let v: Vec<serde_json::Value> = reqs
            .iter()
            .map(|r| serde_json::from_str(&r.1).unwrap())
            .collect();
        assert_eq!(v[0]["stream"], true);
        assert_eq!(v[1]["stream"], false);
        assert!(v[2]["prompt"].is_string() && v[1]["messages"].is_array());
        let maxes: std::collections::BTreeSet<u64> = v
            .iter()
            .map(|b| b["max_tokens"].as_u64().unwrap())
            .collect();
        assert_eq!(maxes.into_iter().collect::<Vec<_>>(), vec![10, 20, 40]);
        let lens: std::collections::BTreeSet<usize> =
            v.iter().map(|b| b.to_string().len() / 100).collect();
        assert!(lens.len() >= 3, "prompt lengths vary: {lens:?}");
        // Half of the streaming requests hang up; no whole request does.
        let cancels: Vec<usize> = (0..48).filter(|&i| reqs[i].2).collect();
        assert_eq!(cancels.len(), 12);
        assert!(
            cancels
                .iter()
                .all(|&i| Kind::of(i) != Kind::Chat && i % 2 == 0)
        );
    }

    #[test]
    fn streams_and_whole_bodies_are_checked() {
        let good = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n";
        assert_eq!(read_stream(good.as_bytes(), true, false), End::Ok(2));
        assert_eq!(read_stream(good.as_bytes(), true, true), End::Cancelled);
        let cut = &good[..good.find("data: [DONE]").unwrap()];
        assert!(
            matches!(read_stream(cut.as_bytes(), true, false), End::Error(e) if e.contains("[DONE] false"))
        );
        let err = "data: {\"error\":{\"message\":\"x\"}}\n";
        assert!(
            matches!(read_stream(err.as_bytes(), true, false), End::Error(e) if e.contains("error chunk"))
        );
        let text = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":1}}\ndata: [DONE]\n";
        assert_eq!(read_stream(text.as_bytes(), false, false), End::Ok(1));

        let chat = r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"completion_tokens":3}}"#;
        assert_eq!(check_whole(chat, true), Ok(3));
        assert!(check_whole(chat, false).is_err(), "a completion has text");
        assert!(check_whole("not json", true).unwrap_err().contains("JSON"));
    }

    #[test]
    fn bad_arguments_are_refused_before_any_request() {
        let mut a = args();
        a.warmup_s = 60.0;
        assert!(run(&a).unwrap_err().to_string().contains("--warmup-s"));
        a.warmup_s = 0.0;
        a.sample_s = 0.0;
        assert!(run(&a).unwrap_err().to_string().contains("--sample-s"));
        a.sample_s = 1.0;
        a.cancel = 2.0;
        assert!(run(&a).unwrap_err().to_string().contains("--cancel"));
        a.cancel = 0.0;
        // Nothing listens on port 1.
        assert!(run(&a).unwrap_err().to_string().contains("--pid"));
    }

    #[test]
    fn the_markdown_names_each_quantity_and_verdict() {
        let samples: Vec<Sample> = (0..10)
            .map(|i| Sample {
                t_s: i as f64 * 10.0,
                phase: "load".into(),
                rss_bytes: 64 << 20,
                fds: 12,
                kv_blocks_used: Some(0),
                kv_blocks_free: Some(100),
                ..Sample::default()
            })
            .collect();
        let trends = trend::trends(&samples, 0.0);
        let s = SoakSummary {
            pid: 1,
            minutes: 1.5,
            clients: 2,
            warmup_s: 0.0,
            samples: 10,
            outcomes: Outcomes::default(),
            verdict: trend::overall(&trends),
            trends,
            first: None,
            drained: None,
        };
        let md = markdown(&s);
        assert!(
            md.contains(
                "| rss_bytes | 64.0 MiB | 64.0 MiB | 64.0 MiB | +0.00 MiB | 8.0 MiB | Flat |"
            ),
            "{md}"
        );
        assert!(md.contains("| fds | 12.0 |"));
        assert!(md.contains("| kv_blocks_used | 0.0 |"));
    }
}
