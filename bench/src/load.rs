//! `memra-bench load`: a bounded loopback load test of a running OpenAI-compatible server (a
//! benchmark): C concurrent clients, each making up to R streaming chat completions one after
//! another. Checks every completed stream is well formed (data chunks, one finish_reason,
//! usage, `[DONE]`) and reports errors, sheds (429/503), the aggregate generated tok/s, and the
//! latency percentiles clients see: time to first token and the gaps between tokens.
//!
//! Mixes: prompt sizes cycle through `prompt_words` (approximate words of filler per request);
//! a `shared_prefix` fraction of requests start with one long common system prompt (prefix-cache
//! reuse); a `cancel` fraction of requests hang up after their first few tokens (counted as
//! cancelled, not as errors); `duration_s` stops issuing new requests after that many seconds.
//!
//! Replicas behind a load balancer (docs/DEPLOY.md): `turns` makes each client's requests
//! multi-turn conversations (each turn resends the history with the replies it got, so a
//! replica holding the conversation's prefix cache serves it from there); `affinity_header`
//! names a request header carrying the conversation's id (`conv-N`, also sent as `user`) for a
//! balancer to hash on; `retries` retries a 429/503 after its `Retry-After` (capped at 10 s).
//! The report adds the prompt tokens served from the cache (`cached_share`), the retries, and
//! the streams cut after their first token.

use std::io::BufRead;
use std::time::Instant;

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
    /// Filler words per prompt, cycled over the requests (empty: the short default prompt).
    pub prompt_words: Vec<usize>,
    /// Fraction (0..=1) of requests that begin with the shared system prompt.
    pub shared_prefix: f64,
    /// Fraction (0..=1) of requests that hang up after their first tokens.
    pub cancel: f64,
    /// Stop issuing requests after this many seconds (0: no bound).
    pub duration_s: f64,
    /// Turns per conversation (1: independent requests).
    pub turns: usize,
    /// A request header carrying the conversation id, for a balancer's consistent hash.
    pub affinity_header: Option<String>,
    /// Times a request answered 429/503 is retried after its Retry-After.
    pub retries: usize,
}

impl LoadArgs {
    /// The plain load: short prompts, no sharing, no cancellations, no time bound.
    pub fn plain(
        addr: String,
        model: String,
        clients: usize,
        requests: usize,
        max_tokens: usize,
    ) -> LoadArgs {
        LoadArgs {
            addr,
            model,
            clients,
            requests,
            max_tokens,
            api_key: None,
            prompt_words: Vec::new(),
            shared_prefix: 0.0,
            cancel: 0.0,
            duration_s: 0.0,
            turns: 1,
            affinity_header: None,
            retries: 0,
        }
    }
}

/// Milliseconds at the 50th, 95th and 99th percentile (nearest rank), and the mean.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub mean: f64,
    pub count: usize,
}

impl Percentiles {
    pub fn of(mut v: Vec<f64>) -> Option<Percentiles> {
        v.retain(|x| x.is_finite());
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            count: v.len(),
        })
    }
}

/// The outcome.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LoadReport {
    pub clients: usize,
    /// Requests issued (fewer than clients x requests when the duration bound stopped them).
    pub requests: usize,
    pub errors: usize,
    pub malformed: usize,
    /// Answered 429 or 503 (admission control shedding load): not errors.
    pub shed: usize,
    /// Hung up on purpose after the first tokens.
    pub cancelled: usize,
    pub completion_tokens: usize,
    pub wall_s: f64,
    pub aggregate_tok_s: f64,
    /// Time to first token (ms) of the requests that got one.
    pub ttft_ms: Option<Percentiles>,
    /// Gaps between consecutive content chunks of a stream (ms).
    pub itl_ms: Option<Percentiles>,
    pub first_error: Option<String>,
    /// Prompt tokens of the completed requests, and how many came from the prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`).
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// cached_tokens / prompt_tokens.
    pub cached_share: f64,
    /// Retries after a 429/503 (each counted once per attempt).
    pub retried: usize,
    /// Errors after the stream's first token (the rest of `errors` came before it).
    pub cut_streams: usize,
}

/// The long system prompt a `shared_prefix` fraction of requests begin with.
fn shared_system() -> String {
    "You are a careful assistant for a library of short stories. ".repeat(24)
}

/// Whether request `i` falls in a fraction `f` of the requests (spread evenly, deterministic).
pub(crate) fn in_fraction(i: usize, f: f64) -> bool {
    let f = f.clamp(0.0, 1.0);
    ((i + 1) as f64 * f).floor() > (i as f64 * f).floor()
}

/// The body of request `i`; `history` holds the conversation's earlier turns (user and
/// assistant messages), `conv` its id when it is one.
fn body(a: &LoadArgs, i: usize, history: &[serde_json::Value], conv: Option<usize>) -> String {
    let mut messages = Vec::new();
    if in_fraction(i, a.shared_prefix) {
        messages.push(serde_json::json!({"role": "system", "content": shared_system()}));
    }
    messages.extend_from_slice(history);
    let mut content = format!("Tell me a short story about the number {i}.");
    if !a.prompt_words.is_empty() {
        let words = a.prompt_words[i % a.prompt_words.len()];
        let filler: Vec<String> = (0..words)
            .map(|w| format!("w{}", (w * 7 + i) % 997))
            .collect();
        content = format!("{content} Context: {}", filler.join(" "));
    }
    messages.push(serde_json::json!({"role": "user", "content": content}));
    let mut v = serde_json::json!({
        "model": a.model,
        "messages": messages,
        "max_tokens": a.max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(c) = conv {
        v["user"] = serde_json::json!(format!("conv-{c}"));
    }
    v.to_string()
}

/// One request's outcome.
#[derive(Debug, Default)]
struct One {
    tokens: usize,
    ttft_ms: Option<f64>,
    gaps_ms: Vec<f64>,
    cancelled: bool,
    /// The reply's text (the next turn's assistant message).
    text: String,
    prompt_tokens: usize,
    cached_tokens: usize,
    retried: usize,
}

/// Why a request did not complete.
#[derive(Debug)]
enum Fail {
    /// 429/503 (after the retries, if any), with its Retry-After seconds.
    Shed(Option<u64>),
    Malformed(String),
    Error(String),
    /// An error after the stream's first token.
    Cut(String),
}

/// Longest wait for a Retry-After.
const MAX_RETRY_WAIT_S: u64 = 10;

/// One request, retried after a 429/503 up to `args.retries` times (TTFT counts from the
/// first attempt, as the client sees it).
fn one_retried(
    args: &LoadArgs,
    i: usize,
    body: &str,
    conv: Option<usize>,
) -> std::result::Result<One, Fail> {
    let t0 = Instant::now();
    let mut retried = 0;
    loop {
        match one(args, i, body, conv, t0) {
            Err(Fail::Shed(after)) if retried < args.retries => {
                retried += 1;
                let s = after.unwrap_or(1).min(MAX_RETRY_WAIT_S);
                std::thread::sleep(std::time::Duration::from_secs(s));
            }
            Ok(mut o) => {
                o.retried = retried;
                return Ok(o);
            }
            Err(e) => return Err(e),
        }
    }
}

/// One streaming request over HTTP/1.1 (Connection: close); times count from `t0`.
fn one(
    args: &LoadArgs,
    i: usize,
    body: &str,
    conv: Option<usize>,
    t0: Instant,
) -> std::result::Result<One, Fail> {
    let err = Fail::Error;
    let conv_id = conv.map(|c| format!("conv-{c}"));
    let headers: Vec<(&str, &str)> = match (&args.affinity_header, &conv_id) {
        (Some(h), Some(c)) => vec![(h.as_str(), c.as_str())],
        _ => Vec::new(),
    };
    let mut p = crate::http::post_with(
        &args.addr,
        "/v1/chat/completions",
        args.api_key.as_deref(),
        &headers,
        body,
    )
    .map_err(err)?;
    let code = p.code();
    let head = p.headers().map_err(err)?;
    match code {
        200 => {}
        429 | 503 => {
            let after = head
                .iter()
                .find(|(k, _)| k == "retry-after")
                .and_then(|(_, v)| v.parse().ok());
            return Err(Fail::Shed(after));
        }
        _ => return Err(err(format!("status {}", p.status))),
    }
    let r = p.reader;
    let cancel_after = in_fraction(i, args.cancel).then_some(2);
    let mut out = One::default();
    let (mut finishes, mut done, mut usage, mut last) = (0, false, None, None::<f64>);
    let mut chunks = 0usize;
    // An error after the first token cuts a stream that had started.
    let fail = |chunks: usize, m: String| {
        if chunks > 0 {
            Fail::Cut(m)
        } else {
            Fail::Error(m)
        }
    };
    for line in r.lines() {
        let line = line.map_err(|e| fail(chunks, format!("read: {e}")))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)
            .map_err(|e| Fail::Malformed(format!("malformed: bad chunk JSON: {e}")))?;
        if v.get("error").is_some() {
            return Err(fail(chunks, format!("error chunk: {data}")));
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = u.get("completion_tokens").and_then(|t| t.as_u64());
            let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0) as usize;
            out.prompt_tokens = n(&u["prompt_tokens"]);
            out.cached_tokens = n(&u["prompt_tokens_details"]["cached_tokens"]);
        }
        let choice = &v["choices"][0];
        if let Some(c) = choice["delta"]["content"]
            .as_str()
            .filter(|c| !c.is_empty())
        {
            out.text.push_str(c);
            let now = t0.elapsed().as_secs_f64() * 1e3;
            match last {
                None => out.ttft_ms = Some(now),
                Some(prev) => out.gaps_ms.push(now - prev),
            }
            last = Some(now);
            chunks += 1;
            if cancel_after.is_some_and(|n| chunks >= n) {
                out.cancelled = true;
                return Ok(out); // dropping the connection cancels the request
            }
        }
        if choice["finish_reason"].is_string() {
            finishes += 1;
        }
    }
    match (done, finishes, usage) {
        (true, 1, Some(n)) => {
            out.tokens = n as usize;
            Ok(out)
        }
        (false, _, _) if chunks > 0 => Err(Fail::Cut(format!(
            "the stream ended after {chunks} chunks without [DONE]"
        ))),
        _ => Err(Fail::Malformed(format!(
            "malformed stream: [DONE] {done}, finish_reason chunks {finishes}, usage {usage:?}"
        ))),
    }
}

/// Runs the load and returns the report (errors are counted, not returned).
pub fn run(args: &LoadArgs) -> Result<LoadReport> {
    if args.clients == 0 || args.requests == 0 {
        return Err(Error::Input("--clients and --requests must be > 0".into()));
    }
    for (what, f) in [
        ("--shared-prefix", args.shared_prefix),
        ("--cancel", args.cancel),
    ] {
        if !(0.0..=1.0).contains(&f) {
            return Err(Error::Input(format!(
                "{what} {f}: expected a fraction from 0 to 1"
            )));
        }
    }
    if args.turns == 0 {
        return Err(Error::Input("--turns must be > 0".into()));
    }
    if let Some(h) = &args.affinity_header
        && (h.is_empty() || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    {
        return Err(Error::Input(format!(
            "--affinity-header `{h}`: expected a header name of letters, digits and `-`"
        )));
    }
    if !(args.duration_s >= 0.0 && args.duration_s.is_finite()) {
        return Err(Error::Input(format!(
            "--duration-s {}: expected seconds >= 0",
            args.duration_s
        )));
    }
    let t0 = Instant::now();
    let handles: Vec<_> = (0..args.clients)
        .map(|c| {
            let a = args.clone();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let mut history: Vec<serde_json::Value> = Vec::new();
                for r in 0..a.requests {
                    if a.duration_s > 0.0 && t0.elapsed().as_secs_f64() >= a.duration_s {
                        break;
                    }
                    let i = c * a.requests + r;
                    if r % a.turns == 0 {
                        history.clear();
                    }
                    let conv =
                        (a.turns > 1).then(|| c * a.requests.div_ceil(a.turns) + r / a.turns);
                    let b = body(&a, i, &history, conv);
                    let res = one_retried(&a, i, &b, conv);
                    if a.turns > 1 {
                        let msgs: serde_json::Value = serde_json::from_str(&b).unwrap_or_default();
                        if let Some(user) = msgs["messages"].as_array().and_then(|m| m.last()) {
                            history.push(user.clone());
                        }
                        let reply = match &res {
                            Ok(o) if !o.text.is_empty() => o.text.clone(),
                            _ => "(no reply)".to_string(),
                        };
                        history.push(serde_json::json!({"role": "assistant", "content": reply}));
                    }
                    v.push(res);
                }
                v
            })
        })
        .collect();
    let mut rep = LoadReport {
        clients: args.clients,
        ..Default::default()
    };
    let (mut ttft, mut gaps) = (Vec::new(), Vec::new());
    for h in handles {
        let results = h
            .join()
            .map_err(|_| Error::Input("a client thread panicked".into()))?;
        for r in results {
            rep.requests += 1;
            match r {
                Ok(o) => {
                    rep.completion_tokens += o.tokens;
                    rep.prompt_tokens += o.prompt_tokens;
                    rep.cached_tokens += o.cached_tokens;
                    rep.retried += o.retried;
                    rep.cancelled += o.cancelled as usize;
                    ttft.extend(o.ttft_ms);
                    gaps.extend(o.gaps_ms);
                }
                Err(Fail::Shed(_)) => rep.shed += 1,
                Err(Fail::Cut(e)) => {
                    rep.errors += 1;
                    rep.cut_streams += 1;
                    rep.first_error.get_or_insert(e);
                }
                Err(Fail::Malformed(e)) => {
                    rep.malformed += 1;
                    rep.first_error.get_or_insert(e);
                }
                Err(Fail::Error(e)) => {
                    rep.errors += 1;
                    rep.first_error.get_or_insert(e);
                }
            }
        }
    }
    rep.wall_s = t0.elapsed().as_secs_f64();
    rep.aggregate_tok_s = rep.completion_tokens as f64 / rep.wall_s.max(1e-9);
    rep.cached_share = rep.cached_tokens as f64 / rep.prompt_tokens.max(1) as f64;
    rep.ttft_ms = Percentiles::of(ttft);
    rep.itl_ms = Percentiles::of(gaps);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|x| x as f64).collect()).unwrap();
        assert_eq!((p.p50, p.p95, p.p99, p.count), (50.0, 95.0, 99.0, 100));
        assert_eq!(p.mean, 50.5);
        let one = Percentiles::of(vec![7.0, f64::NAN]).unwrap();
        assert_eq!((one.p50, one.p99, one.count), (7.0, 7.0, 1));
        assert!(Percentiles::of(vec![]).is_none());
    }

    #[test]
    fn fractions_pick_evenly_spread_requests() {
        let picked = |f: f64| (0..100).filter(|&i| in_fraction(i, f)).count();
        assert_eq!(picked(0.0), 0);
        assert_eq!(picked(0.25), 25);
        assert_eq!(picked(1.0), 100);
        // Every 4th request, not the first quarter.
        let idx: Vec<usize> = (0..12).filter(|&i| in_fraction(i, 0.25)).collect();
        assert_eq!(idx, vec![3, 7, 11]);
    }

    #[test]
    fn bodies_mix_prompt_sizes_and_the_shared_prefix() {
        let mut a = LoadArgs::plain("x".into(), "m".into(), 1, 4, 8);
        a.prompt_words = vec![0, 50];
        a.shared_prefix = 0.5;
        let b: Vec<serde_json::Value> = (0..4)
            .map(|i| serde_json::from_str(&body(&a, i, &[], None)).unwrap())
            .collect();
        let user = |v: &serde_json::Value| {
            let m = v["messages"].as_array().unwrap();
            m[m.len() - 1]["content"].as_str().unwrap().len()
        };
        assert!(user(&b[1]) > user(&b[0]) + 100);
        let systems = b
            .iter()
            .filter(|v| v["messages"][0]["role"] == "system")
            .count();
        assert_eq!(systems, 2);
        assert_eq!(b[0]["stream"], true);
    }

    #[test]
    fn turns_resend_the_history_under_the_conversation_id() {
        let a = LoadArgs::plain("x".into(), "m".into(), 1, 4, 8);
        let history = vec![
            serde_json::json!({"role": "user", "content": "first"}),
            serde_json::json!({"role": "assistant", "content": "reply"}),
        ];
        let v: serde_json::Value = serde_json::from_str(&body(&a, 1, &history, Some(7))).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["content"], "first");
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[2]["role"], "user");
        assert_eq!(v["user"], "conv-7");
        let plain: serde_json::Value = serde_json::from_str(&body(&a, 1, &[], None)).unwrap();
        assert!(plain.get("user").is_none());
    }

    #[test]
    fn bad_turns_and_header_names_are_refused() {
        let mut a = LoadArgs::plain("127.0.0.1:1".into(), "m".into(), 1, 1, 1);
        a.turns = 0;
        assert!(run(&a).unwrap_err().to_string().contains("--turns"));
        a.turns = 2;
        a.affinity_header = Some("x bad: y".into());
        assert!(
            run(&a)
                .unwrap_err()
                .to_string()
                .contains("--affinity-header")
        );
    }

    #[test]
    fn bad_fractions_and_durations_are_refused() {
        let mut a = LoadArgs::plain("127.0.0.1:1".into(), "m".into(), 1, 1, 1);
        a.cancel = 1.5;
        assert!(run(&a).unwrap_err().to_string().contains("--cancel"));
        a.cancel = 0.0;
        a.duration_s = -1.0;
        assert!(run(&a).unwrap_err().to_string().contains("--duration-s"));
    }
}
