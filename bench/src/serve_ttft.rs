//! `memra-bench ttft --server ADDR`: time to first token of a running OpenAI-compatible server
//! (memra-server or llama-server), measured the same way for both: a streaming `POST
//! /v1/completions` with the prompt as token ids, one generated token, temperature 0.
//! Cold runs send a fresh `cache_salt` (memra) and `cache_prompt: false` (llama-server) each;
//! cached runs send the same prompt again with caching on, after one untimed request that fills
//! the cache. A timed run whose first token text differs from the untimed reference run is
//! invalid, as in [`crate::speed`].

use std::io::BufRead;

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

/// The request body: token-id prompt, one token, greedy, streaming.
fn body(model: &str, prompt: &[u32], salt: Option<&str>) -> String {
    let mut v = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": true,
        "cache_prompt": salt.is_none(),
    });
    if let Some(s) = salt {
        v["cache_salt"] = serde_json::Value::String(s.to_string());
    }
    v.to_string()
}

/// The text of the first chunk that carries a choice, from an SSE byte stream, and whether the
/// stream ended with `[DONE]`.
pub fn first_text(r: impl BufRead) -> std::result::Result<(Option<String>, bool), String> {
    let mut first = None;
    for line in r.lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return Ok((first, true));
        }
        let v: serde_json::Value =
            serde_json::from_str(data).map_err(|e| format!("bad chunk JSON: {e}"))?;
        if v.get("error").is_some() {
            return Err(format!("error chunk: {data}"));
        }
        if first.is_none()
            && let Some(t) = v["choices"][0]["text"].as_str()
        {
            first = Some(t.to_string());
        }
    }
    Ok((first, false))
}

/// One request: seconds from sending to the first token's chunk, and its text.
fn once(a: &ServerTtft, prompt: &[u32], salt: Option<&str>) -> Result<(f64, String)> {
    let fail = |what: String| Error::Input(format!("{}: {what}", a.addr));
    let p = crate::http::post(
        &a.addr,
        "/v1/completions",
        a.api_key.as_deref(),
        &body(&a.model, prompt, salt),
    )
    .map_err(fail)?;
    if p.code() != 200 {
        return Err(fail(format!("status {}", p.status)));
    }
    let (t0, mut r) = (p.sent, p.reader);
    // Headers, then the stream; the first choice chunk stops the clock.
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
    let mut text = None;
    let mut t_first = 0.0;
    while text.is_none() {
        line.clear();
        let n = r
            .read_line(&mut line)
            .map_err(|e| fail(format!("read: {e}")))?;
        if n == 0 {
            return Err(fail("the stream ended before a token".into()));
        }
        let (t, _) = first_text(line.as_bytes()).map_err(fail)?;
        if t.is_some() {
            t_first = t0.elapsed().as_secs_f64();
            text = t;
        }
    }
    // Drain to the end so the server finishes the request before the next one.
    first_text(&mut r).map_err(fail)?;
    Ok((t_first, text.unwrap_or_default()))
}

/// TTFT cold and cached rows for `prompt` (token ids) of `p` tokens.
pub fn run(a: &ServerTtft, mref: &ModelRef, prompts: &[(usize, Vec<u32>)]) -> Result<Vec<Row>> {
    if a.runs == 0 {
        return Err(Error::Input("--runs must be at least 1".into()));
    }
    let base = Row {
        run: a.run.clone(),
        time: record::now(),
        device: a.device.clone(),
        engine: a.engine.clone(),
        version: a.version.clone(),
        commit: record::commit(),
        model: Some(mref.clone()),
        shape: a.shape.clone(),
        dtype: a.dtype.clone(),
        workload: Workload::TtftCold,
        batch: Some(1),
        prompt: None,
        generated: Some(1),
        depth: Some(0),
        value: None,
        unit: "ms".into(),
        min: None,
        max: None,
        stddev: None,
        weight_gb_s: None,
        runs: a.runs as u64,
        valid: true,
        source: Some(format!("server {}", a.addr)),
    };
    let mut rows = Vec::new();
    let mut salt = 0u64;
    for (p, ids) in prompts {
        let mut fresh = || {
            salt += 1;
            format!("ttft-{}-{salt}", a.run)
        };
        let (_, reference) = once(a, ids, Some(&fresh()))?;
        let (mut cold, mut ok_cold) = (Vec::new(), true);
        for _ in 0..a.runs {
            let (t, text) = once(a, ids, Some(&fresh()))?;
            ok_cold &= text == reference;
            cold.push(t * 1e3);
        }
        once(a, ids, None)?; // fills the cache
        let (mut warm, mut ok_warm) = (Vec::new(), true);
        for _ in 0..a.runs {
            let (t, text) = once(a, ids, None)?;
            ok_warm &= text == reference;
            warm.push(t * 1e3);
        }
        for (w, vals, ok) in [
            (Workload::TtftCold, cold, ok_cold),
            (Workload::TtftCached, warm, ok_warm),
        ] {
            let mmm = record::median_min_max(&vals).filter(|_| ok);
            rows.push(Row {
                workload: w,
                prompt: Some(*p as u64),
                value: mmm.map(|x| x.0),
                min: mmm.map(|x| x.1),
                max: mmm.map(|x| x.2),
                valid: ok,
                ..base.clone()
            });
        }
    }
    Ok(rows)
}

/// The GPU's name and driver from nvidia-smi (the server's device; no CUDA context is opened
/// here), or the CPU.
pub fn device_of(device: &str) -> DeviceRef {
    let smi = device.strip_prefix("cuda:").and_then(|id| {
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
    fn first_text_takes_the_first_choice_chunk() {
        let s = concat!(
            ": comment\n",
            "data: {\"choices\":[{\"text\":\" Paris\",\"index\":0}]}\n\n",
            "data: {\"choices\":[{\"text\":\"!\",\"index\":0}]}\n\n",
            "data: [DONE]\n"
        );
        assert_eq!(
            first_text(s.as_bytes()).unwrap(),
            (Some(" Paris".to_string()), true)
        );
        let (t, done) = first_text("data: {\"usage\":{}}\n".as_bytes()).unwrap();
        assert_eq!((t, done), (None, false));
        assert!(first_text("data: {\"error\":{\"message\":\"x\"}}\n".as_bytes()).is_err());
        assert!(first_text("data: {nope\n".as_bytes()).is_err());
    }

    #[test]
    fn cold_requests_carry_a_salt_and_no_prompt_cache() {
        let cold: serde_json::Value =
            serde_json::from_str(&body("m", &[1, 2, 3], Some("s1"))).unwrap();
        assert_eq!(cold["cache_salt"], "s1");
        assert_eq!(cold["cache_prompt"], false);
        assert_eq!(cold["prompt"], serde_json::json!([1, 2, 3]));
        let warm: serde_json::Value = serde_json::from_str(&body("m", &[1], None)).unwrap();
        assert!(warm.get("cache_salt").is_none());
        assert_eq!(warm["cache_prompt"], true);
        assert_eq!(warm["max_tokens"], 1);
    }
}
