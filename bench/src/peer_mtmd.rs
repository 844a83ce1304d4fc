//! llama.cpp mtmd's side of `memra-bench vision`: the logs of llama-mtmd-cli runs
//! (tools/device/mtmd_bench.sh: one process per image file, `-n 1`, the same text GGUF, mmproj
//! and PNG files as memra's rows) parsed into `vision_encode` and `vision_ttft` rows.
//!
//! What the vendored llama.cpp (llama-cpp-python 0.3.36) prints, and what is read of it:
//! - tools/mtmd/mtmd-cli.cpp, around `mtmd_batch_encode`:
//!   `encoding mtmd batch, n_chunks = %d (done = %zu, total = %zu)` and
//!   `mtmd batch encoding done in %d ms` (the tower: the image's encode);
//! - src/llama-context.cpp `llama_perf_context_print`:
//!   `prompt eval time = %10.2f ms / %5d tokens (...)`: every decode of more than one token,
//!   the image's rows and the prompt's text (tools/mtmd/mtmd-helper.cpp's
//!   `%s decoded (batch %d/%d) in %lld ms` is the image's share of it).
//!
//! Per run: encode = the batches' ms (and images = their chunks); TTFT = encode + prompt eval
//! (the first token's sampling is not in either; image loading and preprocessing happen before
//! the encode and are not timed). The first run (img-000.png) is the warm-up and is dropped
//! when there are more.

use crate::record::{self, DeviceRef, ModelRef, Row, Workload};
use memra_engine::error::{Error, Result};

/// What one llama-mtmd-cli log says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MtmdLog {
    /// Per encoded batch: (images in it, ms).
    pub batches: Vec<(u64, f64)>,
    /// Per decoded image batch (mtmd-helper): ms.
    pub image_decode_ms: Vec<f64>,
    /// llama_perf_context_print's prompt eval: (ms, tokens).
    pub prompt_eval: Option<(f64, u64)>,
}

impl MtmdLog {
    pub fn encode_ms(&self) -> f64 {
        self.batches.iter().map(|b| b.1).sum()
    }

    pub fn images(&self) -> u64 {
        self.batches.iter().map(|b| b.0).sum()
    }

    /// Encode and prompt eval (ms).
    pub fn ttft_ms(&self) -> Option<f64> {
        self.prompt_eval.map(|(ms, _)| self.encode_ms() + ms)
    }
}

/// The first number in `s` (after leading spaces).
fn number(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

/// Parses one log (stdout and stderr together). Lines may carry a log prefix (timestamps):
/// the phrases are looked for anywhere in a line.
pub fn parse(text: &str) -> MtmdLog {
    let mut log = MtmdLog::default();
    let mut pending: Option<u64> = None;
    for line in text.lines() {
        if let Some(i) = line.find("encoding mtmd batch, n_chunks = ") {
            pending =
                number(&line[i + "encoding mtmd batch, n_chunks = ".len()..]).map(|n| n as u64);
        } else if let Some(i) = line.find("mtmd batch encoding done in ") {
            if let Some(ms) = number(&line[i + "mtmd batch encoding done in ".len()..]) {
                log.batches.push((pending.take().unwrap_or(1), ms));
            }
        } else if line.contains(" decoded (batch ")
            && let Some(i) = line.rfind(") in ")
            && let Some(ms) = number(&line[i + ") in ".len()..])
        {
            log.image_decode_ms.push(ms);
        } else if let Some(i) = line.find("prompt eval time =") {
            let rest = &line[i + "prompt eval time =".len()..];
            let ms = number(rest);
            let tokens = rest
                .find("ms /")
                .and_then(|j| number(&rest[j + "ms /".len()..]));
            if let (Some(ms), Some(t)) = (ms, tokens) {
                log.prompt_eval = Some((ms, t as u64));
            }
        }
    }
    log
}

/// The labels the peer's rows share.
#[derive(Clone, Debug)]
pub struct MtmdRun {
    pub run: String,
    pub device: DeviceRef,
    pub commit: Option<String>,
    pub model: ModelRef,
    pub shape: Option<String>,
    pub dtype: Option<String>,
    pub version: String,
    /// The mmproj file's name (the rows' source remark).
    pub mmproj: String,
}

/// The `vision_encode` and `vision_ttft` rows of the logs (one per run, in run order; `names`
/// name them in errors). The first is dropped as the warm-up when there are more.
pub fn rows(logs: &[(String, MtmdLog)], p: &MtmdRun) -> Result<Vec<Row>> {
    for (name, l) in logs {
        if l.batches.is_empty() {
            return Err(Error::Input(format!(
                "{name}: no `mtmd batch encoding done in N ms` line (not a llama-mtmd-cli log \
                 with an image?)"
            )));
        }
        if l.prompt_eval.is_none() {
            return Err(Error::Input(format!(
                "{name}: no `prompt eval time = ... ms / N tokens` line (llama_perf_context_print)"
            )));
        }
    }
    let timed = match logs.len() {
        0 => return Err(Error::Input("no llama-mtmd-cli log".into())),
        1 => logs,
        _ => &logs[1..],
    };
    let (images, ms): (u64, f64) = timed.iter().fold((0, 0.0), |(n, t), (_, l)| {
        (n + l.images(), t + l.encode_ms())
    });
    let rates: Vec<f64> = timed
        .iter()
        .map(|(_, l)| l.images() as f64 * 1e3 / l.encode_ms().max(1e-9))
        .collect();
    let (_, lo, hi) = record::median_min_max(&rates).unwrap_or((0.0, 0.0, 0.0));
    let ttft: Vec<f64> = timed.iter().filter_map(|(_, l)| l.ttft_ms()).collect();
    let (med, tlo, thi) =
        record::median_min_max(&ttft).ok_or_else(|| Error::Input("no TTFT in the logs".into()))?;
    let per_batch = timed
        .iter()
        .flat_map(|(_, l)| l.batches.iter().map(|b| b.0))
        .max()
        .unwrap_or(1);
    let tokens = timed[0].1.prompt_eval.map(|p| p.1);
    let encode = Row {
        version: Some(p.version.clone()),
        commit: p.commit.clone(),
        model: Some(p.model.clone()),
        shape: p.shape.clone(),
        dtype: p.dtype.clone(),
        batch: Some(per_batch),
        generated: Some(0),
        depth: Some(0),
        value: (ms > 0.0).then(|| images as f64 * 1e3 / ms),
        min: Some(lo),
        max: Some(hi),
        runs: images,
        valid: ms > 0.0,
        source: Some(format!(
            "llama-mtmd-cli -ngl 99 -n 1, mmproj {}: `mtmd batch encoding done in` ms, one \
             process per image",
            p.mmproj
        )),
        ..Row::new(
            p.run.clone(),
            p.device.clone(),
            "llama.cpp",
            Workload::VisionEncode,
            "images/s",
        )
    };
    let ttft_row = Row {
        workload: Workload::VisionTtft,
        batch: Some(1),
        prompt: tokens,
        generated: Some(1),
        value: Some(med),
        unit: "ms".into(),
        min: Some(tlo),
        max: Some(thi),
        runs: ttft.len() as u64,
        valid: true,
        source: Some(format!(
            "llama-mtmd-cli -ngl 99 -n 1, mmproj {}: encode + prompt eval ms",
            p.mmproj
        )),
        ..encode.clone()
    };
    Ok(vec![encode, ttft_row])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as the vendored llama-mtmd-cli prints it (its format strings, values made up).
    pub const SAMPLE: &str = "\
load_hparams: projector:          gemma3
main: loading model: /m/gemma-3-270m-q4_k_m.gguf
WARN: This is an experimental CLI for testing multimodal capability.
encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)
mtmd batch encoding done in 37 ms
decoding image batch 1/1, n_tokens_batch = 256
image decoded (batch 1/1) in 4 ms

 A picture.

llama_perf_sampler_print:    sampling time =       0.02 ms /   272 runs   (    0.00 ms per token, 13600000.00 tokens per second)
llama_perf_context_print:        load time =     312.50 ms
llama_perf_context_print: prompt eval time =       9.85 ms /   271 tokens (    0.04 ms per token, 27512.69 tokens per second)
llama_perf_context_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
llama_perf_context_print:       total time =     450.12 ms /   272 tokens
llama_perf_context_print:    graphs reused =          0
";

    #[test]
    fn the_vendored_format_strings_parse() {
        // The phrases read are those of the vendored sources (checked by hand against
        // tools/mtmd/mtmd-cli.cpp, tools/mtmd/mtmd-helper.cpp, src/llama-context.cpp).
        let l = parse(SAMPLE);
        assert_eq!(l.batches, vec![(1, 37.0)]);
        assert_eq!(l.image_decode_ms, vec![4.0]);
        assert_eq!(l.prompt_eval, Some((9.85, 271)));
        assert_eq!(l.ttft_ms(), Some(46.85));
        // a log prefix (timestamps) does not hide them
        let prefixed: String = SAMPLE
            .lines()
            .map(|x| format!("0.01.234.567 I {x}\n"))
            .collect();
        assert_eq!(parse(&prefixed), l);
    }

    #[test]
    fn rows_drop_the_warm_up_and_take_medians() {
        let log = |enc: u32, pe: f64| {
            parse(
                &SAMPLE
                    .replace("done in 37 ms", &format!("done in {enc} ms"))
                    .replace("=       9.85 ms", &format!("= {pe:10.2} ms")),
            )
        };
        let logs: Vec<(String, MtmdLog)> = [(500, 90.0), (40, 10.0), (50, 10.0), (20, 12.0)]
            .iter()
            .enumerate()
            .map(|(i, &(e, p))| (format!("img-{i:03}.log"), log(e, p)))
            .collect();
        let p = MtmdRun {
            run: "r".into(),
            device: DeviceRef {
                name: "NVIDIA H100".into(),
                driver: None,
                sms: None,
            },
            commit: None,
            model: ModelRef {
                file: "g.gguf".into(),
                sha256: None,
                bytes: None,
            },
            shape: Some("gemma3-270m".into()),
            dtype: Some("Q4_K_M".into()),
            version: "v".into(),
            mmproj: "mm.gguf".into(),
        };
        let r = rows(&logs, &p).unwrap();
        assert_eq!(r[0].workload, Workload::VisionEncode);
        assert_eq!(r[0].runs, 3);
        // 3 images in 110 ms; the fastest 20 ms (50/s), the slowest 50 ms (20/s)
        assert!((r[0].value.unwrap() - 3e3 / 110.0).abs() < 1e-9);
        assert_eq!((r[0].min, r[0].max), (Some(20.0), Some(50.0)));
        assert_eq!(r[1].workload, Workload::VisionTtft);
        // TTFTs 50, 60, 32: median 50
        assert_eq!(r[1].value, Some(50.0));
        assert_eq!((r[1].min, r[1].max), (Some(32.0), Some(60.0)));
        assert_eq!(r[1].prompt, Some(271));
        assert_eq!(r[1].engine, "llama.cpp");
        let e = rows(&[("x.log".into(), parse("nothing"))], &p).unwrap_err();
        assert!(e.to_string().contains("x.log"), "{e}");
    }
}
