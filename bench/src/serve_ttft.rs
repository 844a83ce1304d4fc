//! `memra-bench ttft|prefill|decode --server ADDR`: a running OpenAI-compatible server
//! (memra-server or llama-server), measured the same way for both: a streaming `POST
//! /v1/completions` with the prompt as token ids, temperature 0; one generated token for ttft
//! and prefill (prompt tokens over the time to the first token, cold), `--gen` tokens with
//! `ignore_eos` for decode (the tokens after the first over the time from the first to the
//! last; the count from the stream's `usage`).
//! Cold runs send a fresh `cache_salt` (memra) and `cache_prompt: false` (llama-server) each;
//! cached runs send the same prompt again with caching on, after one untimed request that fills
//! the cache. A timed run whose first token text differs from the untimed reference run is
//! invalid, as in [`crate::speed`].

use std::io::BufRead as _;

use memra_engine::error::{Error, Result};

use crate::record::{self, DeviceRef, ModelRef, Row, Workload};

/// Where and what to measure.
#[derive(Clone, Debug)]
pub struct ServerTtft {
    /// host:port of the server.
    pub addr: String,
    /// The model name the server serves.
    pub model: String,
    pub api_key: Option<String>,
    /// The rows' engine (`memra`, `llama.cpp`) and version.
    pub engine: String,
    pub version: Option<String>,
    pub device: DeviceRef,
    pub run: String,
    pub runs: usize,
    pub shape: Option<String>,
    pub dtype: Option<String>,
}

/// The request body: token-id prompt, `n` tokens (past EOS when more than one), greedy,
/// streaming with a usage chunk.
fn body(model: &str, prompt: &[u32], salt: Option<&str>, n: usize) -> String {
    let mut v = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "cache_prompt": salt.is_none(),
    });
    if n > 1 {
        v["ignore_eos"] = serde_json::Value::Bool(true);
    }
    if let Some(s) = salt {
        v["cache_salt"] = serde_json::Value::String(s.to_string());
    }
    v.to_string()
}

/// A stream chunk's non-empty choice text and its `usage.completion_tokens`.
pub type Chunk = (Option<String>, Option<usize>);

/// One SSE `data:` payload: `None` for `[DONE]`, else its [`Chunk`]; an error chunk or bad JSON
/// is an error.
pub fn chunk(data: &str) -> std::result::Result<Option<Chunk>, String> {
    if data == "[DONE]" {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(data).map_err(|e| format!("bad chunk JSON: {e}"))?;
    if v.get("error").is_some() {
        return Err(format!("error chunk: {data}"));
    }
    let text = v["choices"][0]["text"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let tokens = v["usage"]["completion_tokens"].as_u64().map(|u| u as usize);
    Ok(Some((text, tokens)))
}

/// One streamed request's timing and text.
struct Streamed {
    /// Seconds from sending to the first and to the last text chunk.
    first: f64,
    last: f64,
    text: String,
    /// `usage.completion_tokens`, else the text chunks.
    tokens: usize,
}

/// One request of `n` tokens, read to the end of its stream.
fn once(a: &ServerTtft, prompt: &[u32], salt: Option<&str>, n: usize) -> Result<Streamed> {
    let fail = |what: String| Error::Input(format!("{}: {what}", a.addr));
    let p = crate::http::post(
        &a.addr,
        "/v1/completions",
        a.api_key.as_deref(),
        &body(&a.model, prompt, salt, n),
    )
    .map_err(fail)?;
    if p.code() != 200 {
        return Err(fail(format!("status {}", p.status)));
    }
    let (t0, mut r) = (p.sent, p.reader);
    // Headers, then the stream.
    let mut line = String::new();
    loop {
        line.clear();
        let n = r
            .read_line(&mut line)
            .map_err(|e| fail(format!("read: {e}")))?;
        if n == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut out = Streamed {
        first: 0.0,
        last: 0.0,
        text: String::new(),
        tokens: 0,
    };
    let (mut chunks, mut usage) = (0usize, None);
    loop {
        line.clear();
        let got = r
            .read_line(&mut line)
            .map_err(|e| fail(format!("read: {e}")))?;
        if got == 0 {
            return Err(fail("the stream ended without [DONE]".into()));
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        let Some((text, tokens)) = chunk(data).map_err(fail)? else {
            break;
        };
        if let Some(t) = text {
            let now = t0.elapsed().as_secs_f64();
            if chunks == 0 {
                out.first = now;
            }
            out.last = now;
            chunks += 1;
            out.text.push_str(&t);
        }
        usage = tokens.or(usage);
    }
    if chunks == 0 {
        return Err(fail("the stream ended before a token".into()));
    }
    out.tokens = usage.unwrap_or(chunks);
    Ok(out)
}

/// What `run_speed` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speed {
    Prefill,
    /// With this many generated tokens.
    Decode(usize),
}

/// Prefill or decode rows (tok/s) through the server: per prompt an untimed reference request,
/// then `runs` cold requests (fresh cache salt, no prompt cache); a run whose text differs from
/// the reference makes the row invalid.
pub fn run_speed(
    a: &ServerTtft,
    mref: &ModelRef,
    prompts: &[(usize, Vec<u32>)],
    what: Speed,
) -> Result<Vec<Row>> {
    if a.runs == 0 {
        return Err(Error::Input("--runs must be at least 1".into()));
    }
    let n = match what {
        Speed::Prefill => 1,
        Speed::Decode(g) if g >= 2 => g,
        Speed::Decode(_) => return Err(Error::Input("--gen must be at least 2 for decode".into())),
    };
    let base = base_row(a, mref, n);
    let mut rows = Vec::new();
    let mut salt = 0u64;
    for (p, ids) in prompts {
        let mut fresh = || {
            salt += 1;
            format!("speed-{}-{salt}", a.run)
        };
        let reference = once(a, ids, Some(&fresh()), n)?;
        let (mut vals, mut ok) = (Vec::new(), true);
        for _ in 0..a.runs {
            let o = once(a, ids, Some(&fresh()), n)?;
            ok &= o.text == reference.text && o.tokens == reference.tokens;
            vals.push(match what {
                Speed::Prefill => *p as f64 / o.first.max(1e-9),
                Speed::Decode(_) => (o.tokens.max(2) - 1) as f64 / (o.last - o.first).max(1e-9),
            });
        }
        let w = match what {
            Speed::Prefill => Workload::Prefill,
            Speed::Decode(_) => Workload::Decode,
        };
        rows.push(Row {
            unit: "tok/s".into(),
            ..measured(&base, w, *p, &vals, ok)
        });
    }
    Ok(rows)
}

/// `base` as workload `w` at prompt `p`: the median, min and max of `vals` (none when `ok` is
/// false: a run's text differed from the reference).
fn measured(base: &Row, w: Workload, p: usize, vals: &[f64], ok: bool) -> Row {
    let mmm = record::median_min_max(vals).filter(|_| ok);
    Row {
        workload: w,
        prompt: Some(p as u64),
        value: mmm.map(|x| x.0),
        min: mmm.map(|x| x.1),
        max: mmm.map(|x| x.2),
        valid: ok,
        ..base.clone()
    }
}

fn base_row(a: &ServerTtft, mref: &ModelRef, generated: usize) -> Row {
    Row {
        version: a.version.clone(),
        commit: record::commit(),
        model: Some(mref.clone()),
        shape: a.shape.clone(),
        dtype: a.dtype.clone(),
        batch: Some(1),
        generated: Some(generated as u64),
        depth: Some(0),
        runs: a.runs as u64,
        source: Some(format!("server {}", a.addr)),
        ..Row::new(
            a.run.clone(),
            a.device.clone(),
            a.engine.clone(),
            Workload::TtftCold,
            "ms",
        )
    }
}

/// TTFT cold and cached rows for `prompt` (token ids) of `p` tokens. With `turn` = (N, vocab),
/// N > 0, each cached run sends the cached prompt plus a fresh N-token turn
/// ([`crate::speed::turn_ids`]) and must give the text of that turn's untimed cold run (fresh
/// salt); its row has `prompt` = p + N and `depth` = p, as the engine's rows.
pub fn run(
    a: &ServerTtft,
    mref: &ModelRef,
    prompts: &[(usize, Vec<u32>)],
    turn: (usize, usize),
) -> Result<Vec<Row>> {
    if a.runs == 0 {
        return Err(Error::Input("--runs must be at least 1".into()));
    }
    let base = base_row(a, mref, 1);
    let mut rows = Vec::new();
    let mut salt = 0u64;
    for (p, ids) in prompts {
        let mut fresh = || {
            salt += 1;
            format!("ttft-{}-{salt}", a.run)
        };
        let reference = once(a, ids, Some(&fresh()), 1)?.text;
        let (mut cold, mut ok_cold) = (Vec::new(), true);
        for _ in 0..a.runs {
            let o = once(a, ids, Some(&fresh()), 1)?;
            ok_cold &= o.text == reference;
            cold.push(o.first * 1e3);
        }
        once(a, ids, None, 1)?; // fills the cache
        let (mut warm, mut ok_warm) = (Vec::new(), true);
        for run in 0..a.runs {
            let (t, want) = if turn.0 == 0 {
                (ids.clone(), reference.clone())
            } else {
                let mut t = ids.clone();
                t.extend(crate::speed::turn_ids(1 + run as u64, turn.0, turn.1));
                let cold = once(a, &t, Some(&fresh()), 1)?.text;
                (t, cold)
            };
            let o = once(a, &t, None, 1)?;
            ok_warm &= o.text == want;
            warm.push(o.first * 1e3);
        }
        rows.push(measured(&base, Workload::TtftCold, *p, &cold, ok_cold));
        let mut r = measured(&base, Workload::TtftCached, *p, &warm, ok_warm);
        if turn.0 > 0 {
            r.prompt = Some((p + turn.0) as u64);
            r.depth = Some(*p as u64);
        }
        rows.push(r);
    }
    Ok(rows)
}

/// The GPU's name and driver from nvidia-smi (the server's device, `cuda:N`, or `auto`: GPU 0
/// when nvidia-smi answers; no CUDA context is opened here), or the CPU.
pub fn device_of(device: &str) -> DeviceRef {
    // `auto`: the server's own default, its first GPU when there is one.
    let id = if device == "auto" {
        Some("0")
    } else {
        device.strip_prefix("cuda:")
    };
    let smi = id.and_then(|id| {
        std::process::Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,driver_version",
                "--format=csv,noheader",
                &format!("--id={id}"),
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    });
    match smi.as_deref().and_then(|s| s.split_once(", ")) {
        Some((name, driver)) => DeviceRef {
            name: name.to_string(),
            driver: Some(driver.to_string()),
            sms: None,
        },
        None => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            DeviceRef {
                name: if device.starts_with("cuda") {
                    device.to_string()
                } else {
                    format!("CPU ({cores} cores)")
                },
                driver: None,
                sms: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_give_text_usage_done_and_errors() {
        assert_eq!(
            chunk("{\"choices\":[{\"text\":\" Paris\",\"index\":0}]}").unwrap(),
            Some((Some(" Paris".to_string()), None))
        );
        assert_eq!(
            chunk("{\"choices\":[],\"usage\":{\"completion_tokens\":7}}").unwrap(),
            Some((None, Some(7)))
        );
        assert_eq!(
            chunk("{\"choices\":[{\"text\":\"\"}]}").unwrap(),
            Some((None, None))
        );
        assert_eq!(chunk("[DONE]").unwrap(), None);
        assert!(chunk("{\"error\":{\"message\":\"x\"}}").is_err());
        assert!(chunk("{nope").is_err());
    }

    #[test]
    fn cold_requests_carry_a_salt_and_no_prompt_cache() {
        let cold: serde_json::Value =
            serde_json::from_str(&body("m", &[1, 2, 3], Some("s1"), 1)).unwrap();
        assert_eq!(cold["cache_salt"], "s1");
        assert_eq!(cold["cache_prompt"], false);
        assert_eq!(cold["prompt"], serde_json::json!([1, 2, 3]));
        let warm: serde_json::Value = serde_json::from_str(&body("m", &[1], None, 1)).unwrap();
        assert!(warm.get("cache_salt").is_none());
        assert_eq!(warm["cache_prompt"], true);
        assert_eq!(warm["max_tokens"], 1);
        assert!(warm.get("ignore_eos").is_none());
        let decode: serde_json::Value = serde_json::from_str(&body("m", &[1], None, 64)).unwrap();
        assert_eq!(
            (
                decode["max_tokens"].as_u64(),
                decode["ignore_eos"].as_bool()
            ),
            (Some(64), Some(true))
        );
        assert_eq!(decode["stream_options"]["include_usage"], true);
    }

    /// A one-thread mock completions server: answers every request with one text chunk that
    /// names the prompt (its length and sum, plus a mark for requests without a salt whose
    /// prompt is longer than `mark_over`) and records (prompt, salted).
    fn mock(mark_over: usize) -> (String, std::sync::mpsc::Receiver<(Vec<u64>, bool)>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut b = vec![0u8; len];
                r.read_exact(&mut b).unwrap();
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                let prompt: Vec<u64> = v["prompt"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                let salted = v.get("cache_salt").is_some();
                let mark = if !salted && prompt.len() > mark_over {
                    "!"
                } else {
                    ""
                };
                let text = format!("{}:{}{mark}", prompt.len(), prompt.iter().sum::<u64>());
                let body = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n\
                     data: {{\"choices\":[{{\"text\":\"{text}\"}}]}}\n\ndata: [DONE]\n\n"
                );
                tx.send((prompt, salted)).unwrap(); // before the answer: no race with the client
                c.write_all(body.as_bytes()).unwrap();
            }
        });
        (addr, rx)
    }

    fn args(addr: String) -> ServerTtft {
        ServerTtft {
            addr,
            model: "m".into(),
            api_key: None,
            engine: "memra".into(),
            version: None,
            device: DeviceRef {
                name: "test".into(),
                driver: None,
                sms: None,
            },
            run: "t".into(),
            runs: 2,
            shape: None,
            dtype: None,
        }
    }

    fn mref() -> ModelRef {
        ModelRef {
            file: "x.gguf".into(),
            sha256: None,
            bytes: None,
        }
    }

    #[test]
    fn a_cached_turn_sends_the_prompt_plus_fresh_turn_tokens_checked_against_its_cold_run() {
        let (addr, rx) = mock(usize::MAX);
        let ids: Vec<u32> = (0..6).map(|i| 100 + i).collect();
        let rows = run(&args(addr), &mref(), &[(6, ids.clone())], (4, 1000)).unwrap();
        let cached = rows
            .iter()
            .find(|r| r.workload == Workload::TtftCached)
            .unwrap();
        assert_eq!((cached.prompt, cached.depth), (Some(10), Some(6)));
        assert!(
            cached.value.is_some(),
            "the turns gave their cold runs' text"
        );
        let reqs: Vec<(Vec<u64>, bool)> = rx.try_iter().collect();
        // Unsalted 10-token requests: the two timed turns, each after the cached prompt, with
        // different turn tokens; each also ran cold (salted) once.
        let turns: Vec<&Vec<u64>> = reqs
            .iter()
            .filter(|(p, s)| !s && p.len() == 10)
            .map(|(p, _)| p)
            .collect();
        assert_eq!(turns.len(), 2);
        assert_ne!(turns[0], turns[1]);
        for t in &turns {
            assert_eq!(
                t[..6],
                ids.iter().map(|&x| x as u64).collect::<Vec<_>>()[..]
            );
            assert!(
                reqs.iter().any(|(p, s)| *s && p == *t),
                "a cold run of the same turn"
            );
        }
    }

    #[test]
    fn a_cached_turn_whose_text_differs_from_its_cold_run_makes_the_row_invalid() {
        let (addr, _rx) = mock(6);
        let ids: Vec<u32> = (0..6).map(|i| 100 + i).collect();
        let rows = run(&args(addr), &mref(), &[(6, ids)], (4, 1000)).unwrap();
        let cached = rows
            .iter()
            .find(|r| r.workload == Workload::TtftCached)
            .unwrap();
        assert!(cached.value.is_none());
        let cold = rows
            .iter()
            .find(|r| r.workload == Workload::TtftCold)
            .unwrap();
        assert!(cold.value.is_some());
    }
}
