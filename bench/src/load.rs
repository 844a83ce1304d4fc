//! `memra-bench load`: a bounded loopback load test of a running memra-server (a benchmark):
//! C concurrent clients, each making R streaming chat completions one after another. Checks
//! every stream is well formed (data chunks, one finish_reason, usage, `[DONE]`) and reports
//! errors and the aggregate generated tok/s.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use memra_engine::error::{Error, Result};

/// What to send.
#[derive(Clone, Debug)]
pub struct LoadArgs {
    /// host:port of the server (loopback).
    pub addr: String,
    pub model: String,
    pub clients: usize,
    pub requests: usize,
    pub max_tokens: usize,
    pub api_key: Option<String>,
}

/// The outcome.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub requests: usize,
    pub errors: usize,
    pub malformed: usize,
    pub completion_tokens: usize,
    pub wall_s: f64,
    pub aggregate_tok_s: f64,
    pub first_error: Option<String>,
}

fn body(model: &str, i: usize, max_tokens: usize) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": format!("Tell me a short story about the number {i}.")}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// One streaming request over HTTP/1.1 (Connection: close); returns completion tokens.
fn one(args: &LoadArgs, i: usize) -> std::result::Result<usize, String> {
    let mut s = TcpStream::connect(&args.addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(300))).ok();
    let b = body(&args.model, i, args.max_tokens);
    let auth = args
        .api_key
        .as_ref()
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{b}",
        args.addr,
        b.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| format!("read: {e}"))?;
    if !status.contains(" 200") {
        return Err(format!("status {}", status.trim()));
    }
    let (mut finishes, mut done, mut usage) = (0, false, None);
    for line in r.lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: serde_json::Value =
            serde_json::from_str(data).map_err(|e| format!("bad chunk JSON: {e}"))?;
        if v.get("error").is_some() {
            return Err(format!("error chunk: {data}"));
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = u.get("completion_tokens").and_then(|t| t.as_u64());
        }
        let fr = &v["choices"][0]["finish_reason"];
        if fr.is_string() {
            finishes += 1;
        }
    }
    match (done, finishes, usage) {
        (true, 1, Some(n)) => Ok(n as usize),
        _ => Err(format!(
            "malformed stream: [DONE] {done}, finish_reason chunks {finishes}, usage {usage:?}"
        )),
    }
}

/// Runs the load and returns the report (errors are counted, not returned).
pub fn run(args: &LoadArgs) -> Result<LoadReport> {
    if args.clients == 0 || args.requests == 0 {
        return Err(Error::Input("--clients and --requests must be > 0".into()));
    }
    let t0 = Instant::now();
    let handles: Vec<_> = (0..args.clients)
        .map(|c| {
            let a = args.clone();
            std::thread::spawn(move || {
                (0..a.requests)
                    .map(|r| one(&a, c * a.requests + r))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut rep = LoadReport {
        clients: args.clients,
        requests: args.clients * args.requests,
        ..Default::default()
    };
    for h in handles {
        let results = h
            .join()
            .map_err(|_| Error::Input("a client thread panicked".into()))?;
        for r in results {
            match r {
                Ok(n) => rep.completion_tokens += n,
                Err(e) => {
                    if e.starts_with("malformed") {
                        rep.malformed += 1;
                    } else {
                        rep.errors += 1;
                    }
                    rep.first_error.get_or_insert(e);
                }
            }
        }
    }
    rep.wall_s = t0.elapsed().as_secs_f64();
    rep.aggregate_tok_s = rep.completion_tokens as f64 / rep.wall_s.max(1e-9);
    Ok(rep)
}
