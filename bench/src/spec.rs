//! `memra-bench spec`: speculative decoding on real request kinds, through memra-server, with
//! speculation on and off.
//!
//! A workload file (JSON lines, bench/workloads/spec.jsonl) holds chat requests of six kinds:
//! `code_edit` (the file in the prompt, the whole edited file back), `rag_quote` (an answer
//! quoting its numbered sources), `json_extract` (a `response_format` JSON schema), `summarize`,
//! `chat` and `multi_turn` (a long conversation resent with its history). The first three are
//! the grounded kinds (the output copies the prompt: where drafting pays most).
//!
//! Every request runs against two models: `on` (a memra-server model that speculates: any
//! model without `+spec=off` in `MEMRA_MODELS`) and `off` (`+spec=off`): one server serving the
//! same file twice (`on=FILE,off=FILE+spec=off`), or two servers (`--addr-off`). Each request is
//! sent greedy and sampled (temperature, top-p, top-k) with the same seed to both, streamed;
//! with one client the two modes alternate request by request (which goes first alternates
//! too), with several clients each mode runs the whole workload as a load of its own, once per
//! `--repeat` round, the first mode alternating round by round. Measured
//! per request: tokens/s (completion tokens over the time to the last token), decode tokens/s
//! (after the first token), time to first token, the drafts accepted and rejected (usage), and
//! whether the two outputs are the same bytes (text, finish reason, token count). With one
//! client /metrics of the `on` model is read around each of its requests: verify steps and the
//! fallback reasons per request kind. Results: rows of [`SpecRow`] (JSON lines) and a markdown
//! table; any output that differs between on and off fails the command.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use memra_engine::error::{Error, Result};

use crate::record::{DeviceRef, ModelRef};

/// The request kinds of a workload, grounded ones first.
pub const KINDS: [&str; 6] = [
    "code_edit",
    "rag_quote",
    "json_extract",
    "summarize",
    "chat",
    "multi_turn",
];

/// Whether requests of `kind` copy from their prompt (edits, quotes, extraction).
pub fn grounded(kind: &str) -> bool {
    matches!(kind, "code_edit" | "rag_quote" | "json_extract")
}

/// One request of the workload.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Item {
    pub id: String,
    pub kind: String,
    /// Chat messages (`role`, `content`), the history of a multi-turn conversation included.
    pub messages: Vec<Value>,
    pub max_tokens: usize,
    /// OpenAI `response_format` (a JSON schema for `json_extract`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
}

/// Reads a workload file: one [`Item`] per line (blank lines and `#` comments skipped); each
/// kind one of [`KINDS`], messages with a role and a string content, ids unique.
pub fn load_workload(path: &Path) -> Result<Vec<Item>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    parse_workload(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// [`load_workload`] of the file's text.
pub fn parse_workload(text: &str) -> std::result::Result<Vec<Item>, String> {
    let mut items: Vec<Item> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", n + 1);
        let it: Item = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        if !KINDS.contains(&it.kind.as_str()) {
            return Err(at(format!(
                "kind `{}`: expected one of {}",
                it.kind,
                KINDS.join(", ")
            )));
        }
        if it.messages.is_empty()
            || it
                .messages
                .iter()
                .any(|m| !m["role"].is_string() || !m["content"].is_string())
        {
            return Err(at("messages must be {\"role\", \"content\"} strings".into()));
        }
        if it.max_tokens == 0 {
            return Err(at("max_tokens must be > 0".into()));
        }
        if items.iter().any(|o| o.id == it.id) {
            return Err(at(format!("id `{}` twice", it.id)));
        }
        items.push(it);
    }
    if items.is_empty() {
        return Err("no request in the workload".into());
    }
    Ok(items)
}

/// A sampling configuration: greedy (temperature 0) or sampled.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sampling {
    /// `greedy`, or `t0.8/p0.9/k40`.
    pub name: String,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
}

impl Sampling {
    pub fn greedy() -> Sampling {
        Sampling {
            name: "greedy".into(),
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        }
    }

    pub fn sampled(temperature: f32, top_p: f32, top_k: usize) -> Sampling {
        Sampling {
            name: format!("t{temperature}/p{top_p}/k{top_k}"),
            temperature,
            top_p,
            top_k,
        }
    }
}

/// Where a mode's requests go.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// host:port of the server.
    pub addr: String,
    /// The model alias.
    pub model: String,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct SpecArgs {
    pub items: Vec<Item>,
    /// The model that speculates, and the one that does not.
    pub on: Target,
    pub off: Target,
    pub samplings: Vec<Sampling>,
    /// Request `i`'s seed is `seed + i` (the same for on and off).
    pub seed: u64,
    /// Concurrent clients per mode (1: the modes alternate request by request).
    pub clients: usize,
    /// Times each request is sent per mode and sampling.
    pub repeat: usize,
    /// Caps every request's max_tokens (0: the workload's).
    pub max_tokens: usize,
    pub api_key: Option<String>,
}

impl SpecArgs {
    /// Where `mode`'s requests go.
    pub fn target(&self, mode: Mode) -> &Target {
        match mode {
            Mode::On => &self.on,
            Mode::Off => &self.off,
        }
    }

    /// One model for both modes: its `off` requests opt out per request.
    pub fn one_model(&self) -> bool {
        self.on == self.off
    }
}

/// Speculation or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Off,
    On,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "on",
        }
    }
}

/// The speculation counters of one model in /metrics (engine totals, or a difference of two).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpecMetrics {
    /// Draft tokens checked and accepted, per drafter.
    pub drafted: BTreeMap<String, f64>,
    pub accepted: BTreeMap<String, f64>,
    pub verify_steps: f64,
    /// Sequence steps without drafts, by reason.
    pub fallbacks: BTreeMap<String, f64>,
}

impl SpecMetrics {
    /// `self - before`.
    pub fn since(&self, before: &SpecMetrics) -> SpecMetrics {
        let sub = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .collect()
        };
        SpecMetrics {
            drafted: sub(&self.drafted, &before.drafted),
            accepted: sub(&self.accepted, &before.accepted),
            verify_steps: self.verify_steps - before.verify_steps,
            fallbacks: sub(&self.fallbacks, &before.fallbacks),
        }
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &SpecMetrics) {
        let add = |a: &mut BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += v;
            }
        };
        add(&mut self.drafted, &o.drafted);
        add(&mut self.accepted, &o.accepted);
        self.verify_steps += o.verify_steps;
        add(&mut self.fallbacks, &o.fallbacks);
    }
}

/// One series of OpenMetrics text: name, labels, value.
fn series(line: &str) -> Option<(&str, BTreeMap<&str, &str>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    let mut map = BTreeMap::new();
    for kv in labels.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=')?;
        map.insert(k, v.trim_matches('"'));
    }
    Some((name, map, value))
}

/// The drafter of `model` (`memra_model_spec_drafter`) and its speculation counters in a
/// /metrics text; the drafter is `None` when the server does not report one (not memra, or
/// an older memra).
pub fn spec_metrics(text: &str, model: &str) -> (Option<String>, SpecMetrics) {
    let mut m = SpecMetrics::default();
    let mut drafter = None;
    for (name, labels, v) in text.lines().filter_map(series) {
        if labels.get("model") != Some(&model) {
            continue;
        }
        let label = |k: &str| labels.get(k).map(|s| s.to_string()).unwrap_or_default();
        match name {
            "memra_model_spec_drafter" if v > 0.0 => drafter = Some(label("drafter")),
            "memra_model_spec_draft_tokens_total" => {
                m.drafted.insert(label("drafter"), v);
            }
            "memra_model_spec_accepted_tokens_total" => {
                m.accepted.insert(label("drafter"), v);
            }
            "memra_model_spec_verify_steps_total" => m.verify_steps = v,
            "memra_model_spec_fallbacks_total" => {
                m.fallbacks.insert(label("reason"), v);
            }
            _ => {}
        }
    }
    (drafter, m)
}

fn scrape(t: &Target, key: Option<&str>) -> Result<(Option<String>, SpecMetrics)> {
    let (code, body) = crate::http::get(&t.addr, "/metrics", key)
        .map_err(|e| Error::Input(format!("GET {}/metrics: {e}", t.addr)))?;
    if code != 200 {
        return Err(Error::Input(format!(
            "GET {}/metrics: status {code}",
            t.addr
        )));
    }
    Ok(spec_metrics(&body, &t.model))
}

/// One request's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub item: usize,
    pub sampling: usize,
    pub rep: usize,
    pub text: String,
    pub finish: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub ttft_ms: f64,
    /// Request sent to the last content chunk.
    pub total_ms: f64,
    /// First content chunk to the last.
    pub decode_ms: f64,
    /// The model's /metrics counters across this request (one client only).
    pub metrics: Option<SpecMetrics>,
    pub error: Option<String>,
}

/// The body of request `(i, s, r)` of `a` in `mode`: item `i` under sampling `s` with seed
/// `a.seed + i`, round `r`, to `mode`'s model; with one model for both modes, the `off` side
/// opts out of speculation per request (`"speculative": false`). Each (sampling, round) has a
/// `cache_salt` of its own, so every item is sent once per prefix-cache namespace: the engine's
/// traffic store (drafts from earlier outputs of the same namespace) never drafts an item from
/// its own earlier output, which real traffic rarely has (reports/spec/ngram-sampled-cpu.md).
pub fn body(a: &SpecArgs, mode: Mode, i: usize, s: usize, r: usize) -> String {
    let salt = format!("memra-bench-spec-s{s}-r{r}");
    let (item, s) = (&a.items[i], &a.samplings[s]);
    let max_tokens = if a.max_tokens > 0 {
        item.max_tokens.min(a.max_tokens)
    } else {
        item.max_tokens
    };
    let mut v = serde_json::json!({
        "model": a.target(mode).model,
        "messages": item.messages,
        "max_tokens": max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": a.seed + i as u64,
        "stream": true,
        "stream_options": {"include_usage": true},
        "cache_salt": salt,
    });
    if s.top_k > 0 {
        v["top_k"] = serde_json::json!(s.top_k);
    }
    if let Some(rf) = &item.response_format {
        v["response_format"] = rf.clone();
    }
    if mode == Mode::Off && a.one_model() {
        v["speculative"] = serde_json::json!(false);
    }
    v.to_string()
}

/// Sends one streaming chat request and reads it to its end.
fn send(t: &Target, key: Option<&str>, body: &str) -> std::result::Result<Sample, String> {
    let t0 = Instant::now();
    let mut p = crate::http::post(&t.addr, "/v1/chat/completions", key, body)?;
    let code = p.code();
    p.headers()?;
    if code != 200 {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut p.reader, &mut rest);
        return Err(format!("status {code}: {}", rest.trim()));
    }
    let mut out = Sample::default();
    let (mut first, mut last, mut done) = (None::<f64>, 0.0f64, false);
    for line in p.reader.lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("bad chunk JSON: {e}: {data}"))?;
        if let Some(e) = v.get("error") {
            return Err(format!("error chunk: {e}"));
        }
        let ch = &v["choices"][0];
        if let Some(c) = ch["delta"]["content"].as_str().filter(|c| !c.is_empty()) {
            let now = t0.elapsed().as_secs_f64() * 1e3;
            first.get_or_insert(now);
            last = now;
            out.text.push_str(c);
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            out.finish = f.to_string();
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |x: &Value| x.as_u64().unwrap_or(0) as usize;
            out.prompt_tokens = n(&u["prompt_tokens"]);
            out.completion_tokens = n(&u["completion_tokens"]);
            out.accepted = n(&u["completion_tokens_details"]["accepted_prediction_tokens"]);
            out.rejected = n(&u["completion_tokens_details"]["rejected_prediction_tokens"]);
        }
    }
    if !done {
        return Err("the stream ended without [DONE]".into());
    }
    let first = first.unwrap_or(last);
    out.ttft_ms = first;
    out.total_ms = last;
    out.decode_ms = last - first;
    Ok(out)
}

/// Every request of a run, by mode.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub off: Vec<Sample>,
    pub on: Vec<Sample>,
    /// Wall time of each mode's phase (several clients) or the sum of its requests' (one).
    pub off_wall_s: f64,
    pub on_wall_s: f64,
    /// The drafter the `on` model reports (`ngram`, `mtp+ngram`, ...).
    pub drafter: Option<String>,
    /// The `on` model's speculation counters across the whole run.
    pub metrics: SpecMetrics,
}

/// The work list: (item, sampling, rep) in order.
fn work(a: &SpecArgs) -> Vec<(usize, usize, usize)> {
    let mut w = Vec::new();
    for s in 0..a.samplings.len() {
        for i in 0..a.items.len() {
            for r in 0..a.repeat.max(1) {
                w.push((i, s, r));
            }
        }
    }
    w
}

fn one(a: &SpecArgs, mode: Mode, (i, s, r): (usize, usize, usize)) -> Sample {
    let b = body(a, mode, i, s, r);
    let mut out = send(a.target(mode), a.api_key.as_deref(), &b).unwrap_or_else(|e| Sample {
        error: Some(e),
        ..Default::default()
    });
    (out.item, out.sampling, out.rep) = (i, s, r);
    out
}

/// Runs the workload through both modes.
pub fn run(a: &SpecArgs) -> Result<Outcome> {
    if a.items.is_empty() || a.samplings.is_empty() || a.clients == 0 {
        return Err(Error::Input(
            "spec: no requests, no sampling configuration or no clients".into(),
        ));
    }
    // The same model for both: the `off` requests send `"speculative": false` (one copy of
    // the weights; memra-server only). Otherwise `off` must be served with +spec=off.
    let one_model = a.one_model();
    let key = a.api_key.as_deref();
    let (drafter, start) = scrape(&a.on, key)?;
    let (off_drafter, _) = if one_model {
        (Some("off".to_string()), start.clone())
    } else {
        scrape(&a.off, key)?
    };
    if one_model && drafter.is_none() {
        return Err(Error::Input(format!(
            "spec: on and off are the same model ({} at {}), which takes the per-request \
             `speculative` switch on memra-server only: serve the peer twice",
            a.on.model, a.on.addr
        )));
    }
    if drafter.as_deref() == Some("off") {
        return Err(Error::Input(format!(
            "spec: the `on` model `{}` does not speculate (+spec=off)",
            a.on.model
        )));
    }
    if off_drafter.as_deref().is_some_and(|d| d != "off") {
        return Err(Error::Input(format!(
            "spec: the `off` model `{}` speculates ({}): serve it with +spec=off",
            a.off.model,
            off_drafter.unwrap_or_default()
        )));
    }
    let list = work(a);
    let mut out = Outcome {
        drafter,
        ..Default::default()
    };
    if a.clients == 1 {
        for (n, &w) in list.iter().enumerate() {
            let order = if n % 2 == 0 {
                [Mode::Off, Mode::On]
            } else {
                [Mode::On, Mode::Off]
            };
            for mode in order {
                if mode == Mode::Off {
                    let s = one(a, mode, w);
                    out.off_wall_s += s.total_ms / 1e3;
                    out.off.push(s);
                    continue;
                }
                // Another server (llama-server) has no memra counters: none per request.
                let memra = out.drafter.is_some();
                let before = if memra {
                    Some(scrape(&a.on, key)?.1)
                } else {
                    None
                };
                let mut s = one(a, mode, w);
                if let Some(before) = before {
                    s.metrics = Some(scrape(&a.on, key)?.1.since(&before));
                }
                out.on_wall_s += s.total_ms / 1e3;
                out.on.push(s);
            }
        }
    } else {
        // One round per repeat, each mode a load of its own; which mode goes first alternates
        // round by round (drift on a shared machine falls on both).
        let rounds = a.repeat.max(1);
        let phases = (0..rounds).flat_map(|r| {
            let order = if r % 2 == 0 {
                [Mode::Off, Mode::On]
            } else {
                [Mode::On, Mode::Off]
            };
            order.map(|m| (r, m))
        });
        for (round, mode) in phases {
            let mine: Vec<_> = list.iter().copied().filter(|w| w.2 == round).collect();
            let queue = Arc::new(Mutex::new(mine.into_iter()));
            let t0 = Instant::now();
            let handles: Vec<_> = (0..a.clients)
                .map(|_| {
                    let (a, q) = (a.clone(), queue.clone());
                    std::thread::spawn(move || {
                        let mut v = Vec::new();
                        while let Some(w) = q.lock().ok().and_then(|mut q| q.next()) {
                            v.push(one(&a, mode, w));
                        }
                        v
                    })
                })
                .collect();
            let mut samples = Vec::new();
            for h in handles {
                samples.extend(
                    h.join()
                        .map_err(|_| Error::Input("a client thread panicked".into()))?,
                );
            }
            let wall = t0.elapsed().as_secs_f64();
            match mode {
                Mode::Off => {
                    out.off.extend(samples);
                    out.off_wall_s += wall;
                }
                Mode::On => {
                    out.on.extend(samples);
                    out.on_wall_s += wall;
                }
            }
        }
        out.off.sort_by_key(|s| (s.sampling, s.item, s.rep));
        out.on.sort_by_key(|s| (s.sampling, s.item, s.rep));
    }
    let (_, end) = scrape(&a.on, key)?;
    out.metrics = end.since(&start);
    Ok(out)
}

/// Whether two outputs are the same bytes (text, finish reason, token count).
pub fn same(a: &Sample, b: &Sample) -> bool {
    a.error.is_none()
        && b.error.is_none()
        && a.text == b.text
        && a.finish == b.finish
        && a.completion_tokens == b.completion_tokens
}

/// One row of results: a request kind (or `grounded` / `all`), a sampling configuration and a
/// mode, over its requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecRow {
    /// One id per invocation.
    pub run: String,
    pub time: String,
    pub device: DeviceRef,
    pub engine: String,
    pub commit: Option<String>,
    pub model: Option<ModelRef>,
    pub shape: Option<String>,
    pub dtype: Option<String>,
    /// Always `spec`.
    pub workload: String,
    /// A kind of [`KINDS`], `grounded` (the first three) or `all`.
    pub kind: String,
    /// `greedy` or `tT/pP/kK`.
    pub sampling: String,
    /// `on` or `off`.
    pub mode: String,
    /// The `on` model's drafter (`ngram`, `mtp+ngram`, ...); `off` for off rows.
    pub drafter: Option<String>,
    pub clients: u64,
    pub requests: u64,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Completion tokens over the time from each request to its last token, summed over the
    /// requests: one stream's speed (several clients: the same per stream).
    pub tok_s: Option<f64>,
    /// The same after the first token.
    pub decode_tok_s: Option<f64>,
    /// Several clients (`all` rows): all completion tokens of the mode, every sampling, over
    /// the wall time of its loads.
    pub aggregate_tok_s: Option<f64>,
    pub ttft_ms_p50: Option<f64>,
    pub ttft_ms_mean: Option<f64>,
    /// Usage: draft tokens accepted and checked, and accepted / checked.
    pub accepted: u64,
    pub drafted: u64,
    pub acceptance: Option<f64>,
    /// /metrics of the `on` model across these requests (one client): sequence steps that
    /// checked drafts, drafts checked per drafter, fallbacks by reason.
    pub verify_steps: Option<f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drafted_by: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallbacks: BTreeMap<String, f64>,
    /// On rows: tok/s on over off of the same requests.
    pub speedup: Option<f64>,
    /// Requests whose on and off outputs are the same bytes, of those compared.
    pub identical: u64,
    pub compared: u64,
    /// Ids of the requests whose outputs differ (`id/sampling/rep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differ: Vec<String>,
    /// No errors, every output identical.
    pub valid: bool,
}

/// What the rows share (who, where, what).
#[derive(Clone, Debug)]
pub struct RowMeta {
    pub run: String,
    /// The server measured: `memra`, or `llama.cpp` (llama-server, its own speculation on and
    /// off).
    pub engine: String,
    pub time: String,
    pub device: DeviceRef,
    pub commit: Option<String>,
    pub model: Option<ModelRef>,
    pub shape: Option<String>,
    pub dtype: Option<String>,
}

fn median(v: &[f64]) -> Option<f64> {
    crate::record::median_min_max(v).map(|m| m.0)
}

/// The rows of an outcome: per sampling, per kind present, then `grounded` and `all`; an off
/// and an on row each.
pub fn rows(a: &SpecArgs, o: &Outcome, meta: &RowMeta) -> Vec<SpecRow> {
    let mut out = Vec::new();
    let mut groups: Vec<String> = KINDS
        .iter()
        .filter(|k| a.items.iter().any(|i| i.kind == **k))
        .map(|k| k.to_string())
        .collect();
    groups.push("grounded".into());
    groups.push("all".into());
    let in_group = |g: &str, s: &Sample| {
        let k = &a.items[s.item].kind;
        g == "all" || (g == "grounded" && grounded(k)) || g == k
    };
    for (si, samp) in a.samplings.iter().enumerate() {
        for g in &groups {
            let pick = |v: &[Sample]| -> Vec<Sample> {
                v.iter()
                    .filter(|s| s.sampling == si && in_group(g, s))
                    .cloned()
                    .collect()
            };
            let (off, on) = (pick(&o.off), pick(&o.on));
            if off.is_empty() && on.is_empty() {
                continue;
            }
            let mut differ = Vec::new();
            let mut identical = 0;
            for s in &on {
                let twin = off.iter().find(|x| (x.item, x.rep) == (s.item, s.rep));
                match twin {
                    Some(x) if same(s, x) => identical += 1,
                    _ => differ.push(format!("{}/{}/{}", a.items[s.item].id, samp.name, s.rep)),
                }
            }
            let compared = on.len() as u64;
            let speed = |v: &[Sample]| {
                let ok: Vec<&Sample> = v.iter().filter(|s| s.error.is_none()).collect();
                let toks: usize = ok.iter().map(|s| s.completion_tokens).sum();
                let ms: f64 = ok.iter().map(|s| s.total_ms).sum();
                let dtoks: usize = ok
                    .iter()
                    .map(|s| s.completion_tokens.saturating_sub(1))
                    .sum();
                let dms: f64 = ok.iter().map(|s| s.decode_ms).sum();
                (
                    (ms > 0.0).then(|| toks as f64 / (ms / 1e3)),
                    (dms > 0.0).then(|| dtoks as f64 / (dms / 1e3)),
                )
            };
            let off_speed = speed(&off).0;
            for (mode, v) in [(Mode::Off, &off), (Mode::On, &on)] {
                let ok: Vec<&Sample> = v.iter().filter(|s| s.error.is_none()).collect();
                let errors = (v.len() - ok.len()) as u64;
                let (tok_s, decode_tok_s) = speed(v);
                let completion: usize = ok.iter().map(|s| s.completion_tokens).sum();
                let wall = if mode == Mode::On {
                    o.on_wall_s
                } else {
                    o.off_wall_s
                };
                // The mode's load ran every sampling at once: all its tokens over its wall time.
                let all: usize = if mode == Mode::On { &o.on } else { &o.off }
                    .iter()
                    .filter(|s| s.error.is_none())
                    .map(|s| s.completion_tokens)
                    .sum();
                let aggregate =
                    (a.clients > 1 && g == "all" && wall > 0.0).then(|| all as f64 / wall);
                let ttft: Vec<f64> = ok.iter().map(|s| s.ttft_ms).collect();
                let accepted: usize = ok.iter().map(|s| s.accepted).sum();
                let drafted: usize = ok.iter().map(|s| s.accepted + s.rejected).sum();
                let mut m = SpecMetrics::default();
                let mut have_metrics = false;
                for s in &ok {
                    if let Some(x) = &s.metrics {
                        m.add(x);
                        have_metrics = true;
                    }
                }
                let on_row = mode == Mode::On;
                out.push(SpecRow {
                    run: meta.run.clone(),
                    time: meta.time.clone(),
                    device: meta.device.clone(),
                    engine: meta.engine.clone(),
                    commit: meta.commit.clone(),
                    model: meta.model.clone(),
                    shape: meta.shape.clone(),
                    dtype: meta.dtype.clone(),
                    workload: "spec".into(),
                    kind: g.clone(),
                    sampling: samp.name.clone(),
                    mode: mode.name().into(),
                    drafter: if on_row {
                        o.drafter.clone()
                    } else {
                        Some("off".into())
                    },
                    clients: a.clients as u64,
                    requests: v.len() as u64,
                    errors,
                    prompt_tokens: ok.iter().map(|s| s.prompt_tokens as u64).sum(),
                    completion_tokens: completion as u64,
                    tok_s,
                    decode_tok_s,
                    aggregate_tok_s: aggregate,
                    ttft_ms_p50: median(&ttft),
                    ttft_ms_mean: (!ttft.is_empty())
                        .then(|| ttft.iter().sum::<f64>() / ttft.len() as f64),
                    accepted: accepted as u64,
                    drafted: drafted as u64,
                    acceptance: (drafted > 0).then(|| accepted as f64 / drafted as f64),
                    verify_steps: have_metrics.then_some(m.verify_steps),
                    drafted_by: m.drafted,
                    fallbacks: m.fallbacks,
                    speedup: match (on_row, tok_s, off_speed) {
                        (true, Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    },
                    identical,
                    compared,
                    differ: if on_row { differ.clone() } else { Vec::new() },
                    valid: errors == 0 && identical == compared,
                });
            }
        }
    }
    out
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The markdown table of `rows` (on rows next to their off rows).
pub fn table(rows: &[SpecRow]) -> String {
    let mut s = String::from(
        "| kind | sampling | requests | tok/s off | tok/s on | speedup | decode tok/s off / on | \
         TTFT p50 ms off / on | accepted / drafted | acceptance | verify steps | fallbacks | \
         identical |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    let mut aggregated = false;
    for on in rows.iter().filter(|r| r.mode == "on") {
        let off = rows
            .iter()
            .find(|r| r.mode == "off" && r.kind == on.kind && r.sampling == on.sampling);
        let fallbacks: Vec<String> = on
            .fallbacks
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect();
        let kind = if matches!(on.kind.as_str(), "grounded" | "all") {
            format!("**{}**", on.kind)
        } else {
            on.kind.clone()
        };
        s.push_str(&format!(
            "| {kind} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {} | {} | {}/{}{} |\n",
            on.sampling,
            on.requests,
            num(off.and_then(|o| o.tok_s), 1),
            num(on.tok_s, 1),
            on.speedup.map_or("-".into(), |x| format!("{x:.2}x")),
            num(off.and_then(|o| o.decode_tok_s), 1),
            num(on.decode_tok_s, 1),
            num(off.and_then(|o| o.ttft_ms_p50), 0),
            num(on.ttft_ms_p50, 0),
            on.accepted,
            on.drafted,
            num(on.acceptance, 2),
            num(on.verify_steps, 0),
            if fallbacks.is_empty() {
                "-".into()
            } else {
                fallbacks.join(", ")
            },
            on.identical,
            on.compared,
            if on.identical == on.compared {
                ""
            } else {
                " **DIFFER**"
            },
        ));
        if let Some(agg) = on.aggregate_tok_s.filter(|_| !aggregated) {
            aggregated = true;
            s.push_str(&format!(
                "| {kind} (aggregate, {} clients, every sampling) | - | {} | {} | {} | {} | | | | | | | |\n",
                on.clients,
                on.requests * rows.iter().filter(|r| r.kind == "all" && r.mode == "on").count() as u64,
                num(off.and_then(|o| o.aggregate_tok_s), 1),
                num(Some(agg), 1),
                match off.and_then(|o| o.aggregate_tok_s) {
                    Some(b) if b > 0.0 => format!("{:.2}x", agg / b),
                    _ => "-".into(),
                },
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_workload_has_every_kind() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/spec.jsonl");
        let items = load_workload(&p).unwrap();
        for k in KINDS {
            assert!(
                items.iter().filter(|i| i.kind == k).count() >= 2,
                "fewer than 2 requests of kind {k}"
            );
        }
        let extract = items.iter().filter(|i| i.kind == "json_extract");
        for i in extract {
            let rf = i
                .response_format
                .as_ref()
                .expect("json_extract has a schema");
            assert_eq!(rf["type"], "json_schema", "{}", i.id);
        }
        assert!(
            items
                .iter()
                .filter(|i| i.kind == "multi_turn")
                .all(|i| i.messages.len() >= 5)
        );
    }

    #[test]
    fn bad_workloads_are_named() {
        let ok = r#"{"id":"a","kind":"chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(parse_workload(ok).unwrap().len(), 1);
        for (text, want) in [
            ("", "no request"),
            (&ok.replace("chat", "poetry"), "kind `poetry`"),
            (
                &ok.replace("\"max_tokens\":4", "\"max_tokens\":0"),
                "max_tokens",
            ),
            (&ok.replace("\"hi\"", "3"), "messages"),
            (&format!("{ok}\n{ok}"), "line 2: id `a` twice"),
            ("{", "line 1"),
        ] {
            let e = parse_workload(text).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn bodies_carry_sampling_seed_and_schema() {
        let it = parse_workload(
            r#"{"id":"a","kind":"json_extract","max_tokens":400,"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#,
        )
        .unwrap()
        .remove(0);
        let target = |model: &str| Target {
            addr: "127.0.0.1:1".into(),
            model: model.into(),
        };
        let mut a = SpecArgs {
            items: vec![it],
            on: target("on"),
            off: target("off"),
            samplings: vec![Sampling::sampled(0.8, 0.9, 40), Sampling::greedy()],
            seed: 7,
            clients: 1,
            repeat: 1,
            max_tokens: 64,
            api_key: None,
        };
        let v: Value = serde_json::from_str(&body(&a, Mode::On, 0, 0, 0)).unwrap();
        assert_eq!(v["model"], "on");
        assert_eq!(v["max_tokens"], 64);
        assert_eq!(v["top_k"], 40);
        assert_eq!(v["seed"], 7);
        assert_eq!(v["response_format"]["type"], "json_object");
        assert_eq!(v["stream"], true);
        assert!(v.get("speculative").is_none());
        a.items[0].response_format = None;
        a.max_tokens = 0;
        let g: Value = serde_json::from_str(&body(&a, Mode::Off, 0, 1, 0)).unwrap();
        assert_eq!(g["temperature"], 0.0);
        assert_eq!(g["max_tokens"], 400);
        assert!(g.get("top_k").is_none() && g.get("response_format").is_none());
        // Two models: each side its own; one model for both: the `off` side opts out.
        assert_eq!(g["model"], "off");
        assert!(g.get("speculative").is_none());
        a.off = a.on.clone();
        let same = |mode| -> Value { serde_json::from_str(&body(&a, mode, 0, 1, 0)).unwrap() };
        assert_eq!(same(Mode::Off)["speculative"], false);
        assert!(same(Mode::On).get("speculative").is_none());
        // A namespace per (sampling, round): an item never drafts from its own earlier output.
        let salt =
            |s, r| body(&a, Mode::On, 0, s, r).parse::<Value>().unwrap()["cache_salt"].clone();
        assert_eq!(salt(1, 0), salt(1, 0));
        assert_ne!(salt(1, 0), salt(0, 0));
        assert_ne!(salt(1, 0), salt(1, 1));
    }

    #[test]
    fn metrics_are_read_per_model() {
        let text = "# HELP x\n\
            memra_model_spec_drafter{model=\"on\",drafter=\"mtp+ngram\"} 1\n\
            memra_model_spec_drafter{model=\"off\",drafter=\"off\"} 1\n\
            memra_model_spec_draft_tokens_total{model=\"on\",drafter=\"mtp\"} 30\n\
            memra_model_spec_draft_tokens_total{model=\"on\",drafter=\"ngram\"} 12\n\
            memra_model_spec_accepted_tokens_total{model=\"on\",drafter=\"ngram\"} 9\n\
            memra_model_spec_verify_steps_total{model=\"on\"} 11\n\
            memra_model_spec_fallbacks_total{model=\"on\",reason=\"load\"} 4\n";
        let (d, m) = spec_metrics(text, "on");
        assert_eq!(d.as_deref(), Some("mtp+ngram"));
        assert_eq!(m.drafted["mtp"], 30.0);
        assert_eq!(m.accepted["ngram"], 9.0);
        assert_eq!(m.verify_steps, 11.0);
        assert_eq!(m.fallbacks["load"], 4.0);
        assert_eq!(spec_metrics(text, "off").0.as_deref(), Some("off"));
        let before = m.clone();
        let (_, mut later) = spec_metrics(text, "on");
        later.verify_steps = 15.0;
        assert_eq!(later.since(&before).verify_steps, 4.0);
        assert_eq!(later.since(&before).drafted["mtp"], 0.0);
    }
}
