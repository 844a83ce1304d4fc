//! `memra-verify golden`: plain greedy decoding's logits on fixed prompts, stored per device
//! class (the CPU; a CUDA architecture with the profile values that enter its arithmetic) as a
//! hash of every generated position's logits bytes plus sampled values (the top 5), under
//! verify/golden/. The gate regenerates them and requires the same bytes: any change of a
//! kernel's, the CPU's or the loader's arithmetic shows up here, even one that keeps every
//! exactness gate green. `--record --reason TEXT` re-records deliberately (the reason and the
//! commit are kept in the file).

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use memra_engine::backend::Backend;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::spec::Prompt;

/// Sampled values kept per position (the top logits, exact f32).
pub const SAMPLES: usize = 5;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PromptGolden {
    pub name: String,
    pub prompt_ids: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Per generated position: the first 16 hex digits of the SHA-256 of its logits'
    /// little-endian f32 bytes.
    pub logits_sha256: Vec<String>,
    /// Per generated position: the top [`SAMPLES`] `(id, logit)`.
    pub top: Vec<Vec<(u32, f32)>>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Golden {
    /// The model's file (or folder) name and an identity hash of its bytes.
    pub model: String,
    pub model_id: String,
    /// The device class the values belong to (see [`device_class`]).
    pub class: String,
    /// The backend's profile line when recorded (CUDA), for reading.
    pub profile: Option<String>,
    /// Unix seconds.
    pub recorded: u64,
    pub commit: Option<String>,
    pub reason: String,
    pub max_tokens: usize,
    pub prompts: Vec<PromptGolden>,
}

/// The device class of a backend: `cpu`, or for CUDA the architecture and the profile values
/// that enter the arithmetic (multiprocessors and warps per SM set each matrix's K segments;
/// the attention kernel), then the KV cache format, e.g. `compute_90a-132sm-w16-attn_mma-kvbf16`.
pub fn device_class(b: &dyn Backend) -> String {
    format!("{}-kv{}", compute_class(b), b.kv_dtype())
}

fn compute_class(b: &dyn Backend) -> String {
    let Some(p) = b.profile() else {
        return "cpu".into();
    };
    let words: Vec<&str> = p.split_whitespace().collect();
    let after = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .and_then(|i| words.get(i + 1))
            .map(|s| s.trim_end_matches([';', ',']).to_string())
    };
    let value = |key: &str| {
        words
            .iter()
            .find_map(|x| x.strip_prefix(key))
            .map(|s| s.trim_end_matches([';', ',']).to_string())
    };
    match (
        after("profile"),
        value("sms="),
        value("warps/sm="),
        after("attention"),
    ) {
        (Some(arch), Some(sms), Some(w), Some(attn)) => format!("{arch}-{sms}sm-w{w}-{attn}"),
        // A profile line of another shape: its hash keeps classes apart.
        _ => format!("profile-{}", &hex(&Sha256::digest(p.as_bytes()))[..12]),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// An identity hash of a model: its size, first and last 4 MiB (a folder: every file's name
/// and size, and the same of each file), so a re-quantized or edited file gets a new id.
pub fn model_id(path: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let mut files = Vec::new();
    if path.is_dir() {
        let rd = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
        for e in rd {
            let e = e.map_err(|e| Error::io(path, e))?;
            if e.path().is_file() {
                files.push(e.path());
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    const PART: u64 = 4 << 20;
    for f in &files {
        let mut file = std::fs::File::open(f).map_err(|e| Error::io(f, e))?;
        let len = file.metadata().map_err(|e| Error::io(f, e))?.len();
        h.update(f.file_name().map_or(b"" as &[u8], |n| n.as_encoded_bytes()));
        h.update(len.to_le_bytes());
        let mut buf = Vec::new();
        (&mut file)
            .take(PART)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io(f, e))?;
        if len > 2 * PART {
            use std::io::Seek as _;
            file.seek(std::io::SeekFrom::Start(len - PART))
                .map_err(|e| Error::io(f, e))?;
            file.take(PART)
                .read_to_end(&mut buf)
                .map_err(|e| Error::io(f, e))?;
        }
        h.update(&buf);
    }
    Ok(hex(&h.finalize())[..16].to_string())
}

/// The golden file of `model` on `class` under `dir`.
pub fn golden_path(dir: &Path, model: &Path, class: &str) -> PathBuf {
    let stem = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let stem = stem.strip_suffix(".gguf").unwrap_or(&stem);
    dir.join(format!("{stem}.{class}.json"))
}

/// Generates the prompts' golden values on `backend` (greedy, `max_tokens` each, no stop).
pub fn generate_all(
    backend: &mut dyn Backend,
    prompts: &[Prompt],
    max_tokens: usize,
) -> Result<Vec<PromptGolden>> {
    let mut out = Vec::new();
    for p in prompts {
        let mut req = GenRequest::greedy(p.ids.clone(), max_tokens);
        req.keep_logits = true;
        let res = generate(backend, &req, &mut |_| Ok(()))?;
        let logits_sha256 = res
            .logits
            .iter()
            .map(|l| {
                let mut h = Sha256::new();
                for v in l {
                    h.update(v.to_le_bytes());
                }
                hex(&h.finalize())[..16].to_string()
            })
            .collect();
        let top = res
            .logits
            .iter()
            .map(|l| memra_engine::generate::top_k(l, SAMPLES))
            .collect();
        out.push(PromptGolden {
            name: p.name.clone(),
            prompt_ids: p.ids.clone(),
            tokens: res.tokens,
            logits_sha256,
            top,
        });
    }
    Ok(out)
}

/// One prompt's comparison.
pub struct Row {
    pub name: String,
    pub positions: usize,
    /// The first differing position and what differs there.
    pub difference: Option<(usize, String)>,
}

/// Compares regenerated values with the golden ones, prompt by prompt.
pub fn compare(want: &[PromptGolden], got: &[PromptGolden]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, w) in want.iter().enumerate() {
        let Some(g) = got.get(i).filter(|g| g.prompt_ids == w.prompt_ids) else {
            rows.push(Row {
                name: w.name.clone(),
                positions: w.tokens.len(),
                difference: Some((0, "prompt not regenerated".into())),
            });
            continue;
        };
        let n = w.tokens.len().max(g.tokens.len());
        let mut difference = None;
        for k in 0..n {
            let (wt, gt) = (w.tokens.get(k), g.tokens.get(k));
            let (wh, gh) = (w.logits_sha256.get(k), g.logits_sha256.get(k));
            if wt == gt && wh == gh {
                continue;
            }
            let mut what = String::new();
            if wt != gt {
                let _ = write!(what, "token {wt:?} -> {gt:?}; ");
            }
            if wh != gh {
                let _ = write!(what, "logits hash {wh:?} -> {gh:?}");
                if let (Some(a), Some(b)) = (w.top.get(k), g.top.get(k)) {
                    let worst = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| {
                            if x.0 == y.0 {
                                (x.1 as f64 - y.1 as f64).abs()
                            } else {
                                f64::INFINITY
                            }
                        })
                        .fold(0.0f64, f64::max);
                    let _ = write!(what, " (top-{SAMPLES} largest change {worst:.3e})");
                }
            }
            difference = Some((k, what));
            break;
        }
        rows.push(Row {
            name: w.name.clone(),
            positions: w.tokens.len(),
            difference,
        });
    }
    rows
}

pub fn report(rows: &[Row]) -> String {
    let mut s = format!("{:<16} {:>9}  result\n", "prompt", "positions");
    for r in rows {
        let v = match &r.difference {
            None => "identical".to_string(),
            Some((k, what)) => format!("DIFFERS at position {k}: {what}"),
        };
        let _ = writeln!(s, "{:<16} {:>9}  {v}", r.name, r.positions);
    }
    s
}

/// memra's commit: `MEMRA_COMMIT`, else `git rev-parse --short HEAD` here, else none.
pub fn commit() -> Option<String> {
    if let Some(c) = memra_engine::settings::commit() {
        return Some(c);
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    let c = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !c.is_empty()).then_some(c)
}

/// Reads a golden file.
pub fn read(path: &Path) -> Result<Golden> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// Writes a golden file (whole, through a temporary file in the same folder).
pub fn write(path: &Path, g: &Golden) -> Result<()> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    // Pretty, except one line per prompt.
    let ser = |e: serde_json::Error| Error::Input(format!("golden: serializing: {e}"));
    let head = Golden {
        prompts: Vec::new(),
        ..g.clone()
    };
    let lines = g
        .prompts
        .iter()
        .map(|p| serde_json::to_string(p).map(|l| format!("    {l}")))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(ser)?;
    let text = serde_json::to_string_pretty(&head).map_err(ser)?.replace(
        "\"prompts\": []",
        &format!("\"prompts\": [\n{}\n  ]", lines.join(",\n")),
    );
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n").map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}
