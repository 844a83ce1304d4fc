//! `memra-bench peer import`: llama-bench JSON lines saved by hand (`llama-bench ... -o jsonl >
//! F.jsonl`, typically on the GPU machine inside a lease) become the rows `peer llama.cpp` records
//! ([`crate::peer::peer_rows`]), appended to a rows file under memra's run id. All or nothing:
//! every line of every file is read and checked, and the rows checked against the file's rows,
//! before anything is written.
//!
//! What llama-bench does not print comes from the flags, else from memra's rows of the same run
//! already in the output file (the same lease, the same machine): the model's file name, size
//! and sha256 prefix, shape and weight type, the device's driver and SM count, and memra's commit.

use std::path::{Path, PathBuf};

use memra_engine::error::{Error, Result};

use crate::peer::{LLAMA_BENCH_SOURCE, PeerRow, PeerRun, peer_rows};
use crate::record::{self, DeviceRef, ModelRef, Row};

/// The rows' `source` unless `--source` says otherwise: llama-bench run by hand with the flags
/// `peer llama.cpp` uses, in the lease that measured memra's rows of the run.
pub const DEFAULT_SOURCE: &str = "llama-bench -ngl 99 -fa 1 JSON, same lease as memra";

/// The rows' `version` unless `--version` says otherwise (the peer `peer build` builds).
pub const DEFAULT_VERSION: &str = "llama-cpp-python 0.3.36 (vendored llama.cpp)";

/// What `peer import` reads, labels and writes.
#[derive(Clone, Debug)]
pub struct ImportArgs {
    /// llama-bench `-o jsonl` files.
    pub files: Vec<PathBuf>,
    /// memra's run id of the comparison.
    pub run: String,
    /// The rows file appended to (reports/data/NAME.jsonl).
    pub out: PathBuf,
    /// The GGUF llama-bench measured, when it is here: name, size and sha256 are read from it.
    pub model: Option<PathBuf>,
    /// The model's file name in the rows (default: --model's name, else llama-bench's
    /// `model_filename`).
    pub model_file: Option<String>,
    /// The sha256 prefix (12 hex digits) of a GGUF that is not here.
    pub model_sha256: Option<String>,
    /// The size in bytes of a GGUF that is not here.
    pub model_bytes: Option<u64>,
    pub shape: Option<String>,
    pub dtype: Option<String>,
    /// The KV type the lines must show (`type_k`); the rows' kv_dtype where a line has none.
    pub kv_dtype: Option<String>,
    /// The device's name where a line has no `gpu_info`.
    pub device_name: Option<String>,
    pub driver: Option<String>,
    pub sms: Option<u32>,
    /// memra's commit in the rows.
    pub commit: Option<String>,
    /// The time of rows whose line has no `test_time`.
    pub time: Option<String>,
    /// The rows' version (llama.cpp's build number and commit are added when it reports them).
    pub version: String,
    /// The rows' source (None: [`DEFAULT_SOURCE`], and every line must show `-ngl 99 -fa 1`).
    pub source: Option<String>,
    /// Replace rows of the file that measure the same test instead of refusing them.
    pub replace: bool,
    /// Check and return the rows, write nothing.
    pub dry_run: bool,
}

impl ImportArgs {
    /// The arguments with only the required ones given.
    pub fn new(files: Vec<PathBuf>, run: &str, out: &Path) -> Self {
        ImportArgs {
            files,
            run: run.into(),
            out: out.into(),
            model: None,
            model_file: None,
            model_sha256: None,
            model_bytes: None,
            shape: None,
            dtype: None,
            kv_dtype: None,
            device_name: None,
            driver: None,
            sms: None,
            commit: None,
            time: None,
            version: DEFAULT_VERSION.into(),
            source: None,
            replace: false,
            dry_run: false,
        }
    }
}

/// What an import did.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The rows, in file and line order.
    pub rows: Vec<Row>,
    /// Rows of the file they replaced (`--replace`).
    pub replaced: usize,
    /// What was taken from memra's rows of the run, and other remarks, for stderr.
    pub notes: Vec<String>,
}

/// Two rows measure the same test: run, engine, workload, model, batch, prompt, gen, depth and
/// KV type. The model is the same when shape and dtype are, and the sha256 prefixes (where both
/// rows have one), else the file names.
pub fn same_test(a: &Row, b: &Row) -> bool {
    let same_model = match (&a.model, &b.model) {
        (Some(x), Some(y)) => match (&x.sha256, &y.sha256) {
            (Some(p), Some(q)) => p == q,
            _ => x.file == y.file,
        },
        (None, None) => true,
        _ => false,
    };
    a.run == b.run
        && a.engine == b.engine
        && a.workload == b.workload
        && a.shape == b.shape
        && a.dtype == b.dtype
        && same_model
        && a.batch == b.batch
        && a.prompt == b.prompt
        && a.generated == b.generated
        && a.depth == b.depth
        && a.kv_dtype == b.kv_dtype
}

/// A row's test in words, for errors.
fn describe(r: &Row) -> String {
    let opt = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
    format!(
        "run {} {} {} of {} ({}), prompt {}, gen {}, depth {}, kv {}",
        r.run,
        r.engine,
        r.workload.name(),
        r.model_label(),
        r.model
            .as_ref()
            .map_or("no model file", |m| m.file.as_str()),
        opt(r.prompt),
        opt(r.generated),
        opt(r.depth),
        r.kv_dtype.as_deref().unwrap_or("-"),
    )
}

/// The last component of a path as llama-bench printed it (either separator).
fn base_name(p: &str) -> &str {
    p.rsplit(['/', '\\']).next().unwrap_or(p)
}

/// The rows already in `out` with their line texts (none when the file does not exist).
fn read_out(out: &Path) -> Result<Vec<(String, Option<Row>)>> {
    let text = match std::fs::read_to_string(out) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Input(format!("{}: {e}", out.display()))),
    };
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            if line.trim().is_empty() {
                return Ok((line.to_string(), None));
            }
            let row: Row = serde_json::from_str(line).map_err(|e| {
                Error::Input(format!(
                    "{}:{}: not a measurement row: {e}",
                    out.display(),
                    i + 1
                ))
            })?;
            Ok((line.to_string(), Some(row)))
        })
        .collect()
}

/// Reads, checks and (unless `dry_run`) writes; returns the rows. Nothing is written on error.
pub fn import(a: &ImportArgs) -> Result<Imported> {
    if a.files.is_empty() {
        return Err(Error::Input("no llama-bench JSONL file given".into()));
    }
    let existing = read_out(&a.out)?;
    let mut notes = Vec::new();

    // The files, read once; a first parse gives the model file llama-bench names.
    let mut texts = Vec::new();
    for f in &a.files {
        let t = std::fs::read_to_string(f)
            .map_err(|e| Error::Input(format!("{}: {e}", f.display())))?;
        texts.push((f.display().to_string(), t));
    }
    let placeholder = PeerRun {
        run: a.run.clone(),
        time: String::new(),
        device: DeviceRef {
            name: String::new(),
            driver: None,
            sms: None,
        },
        commit: None,
        model: ModelRef {
            file: String::new(),
            sha256: None,
            bytes: None,
        },
        shape: None,
        dtype: None,
        kv_dtype: None,
        version: String::new(),
        source: String::new(),
    };
    let mut bench_model: Option<(String, String)> = None;
    for (name, t) in &texts {
        for r in peer_rows(t, &placeholder, true, name)? {
            let Some(m) = r.model_filename.as_deref() else {
                continue;
            };
            let here = format!("{name}:{}", r.line);
            match &bench_model {
                Some((b, at)) if base_name(m) != b => {
                    return Err(Error::Input(format!(
                        "{here} measured {m}, {at} measured {b}: one model per import"
                    )));
                }
                Some(_) => {}
                None => bench_model = Some((base_name(m).to_string(), here)),
            }
        }
    }
    let bench_model = bench_model.map(|b| b.0);

    // The model.
    let given_name = a.model_file.clone().or_else(|| {
        a.model
            .as_ref()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    });
    let model = if let Some(p) = &a.model {
        let mut m = record::model_ref(p).map_err(|e| {
            Error::Input(format!(
                "--model: {e} (without the GGUF here: --model-file NAME --model-sha256 HEX \
                 --model-bytes N)"
            ))
        })?;
        if let Some(f) = &a.model_file {
            m.file = f.clone();
        }
        Some(m)
    } else if a.model_sha256.is_some() || a.model_bytes.is_some() {
        let file = given_name.clone().or(bench_model.clone()).ok_or_else(|| {
            Error::Input("the lines name no model file: pass --model-file NAME".into())
        })?;
        Some(ModelRef {
            file,
            sha256: a.model_sha256.clone(),
            bytes: a.model_bytes,
        })
    } else {
        None
    };
    if let (Some(m), Some(b)) = (&model, &bench_model)
        && base_name(&m.file) != b
    {
        notes.push(format!(
            "llama-bench measured {b}; the rows name the model {}",
            m.file
        ));
    }

    // memra's rows of the run in the file: the same model's first, else any.
    let memra: Vec<&Row> = existing
        .iter()
        .filter_map(|(_, r)| r.as_ref())
        .filter(|r| r.run == a.run && r.engine == "memra")
        .collect();
    if memra.is_empty() {
        notes.push(format!(
            "{} holds no memra row of run {}",
            a.out.display(),
            a.run
        ));
    }
    let wanted = given_name.or(bench_model.clone());
    let same_model = memra.iter().copied().find(|r| {
        let Some(rm) = &r.model else { return false };
        match &model {
            Some(m) => match (&m.sha256, &rm.sha256) {
                (Some(p), Some(q)) => p == q,
                _ => m.file == rm.file,
            },
            None => wanted.as_deref() == Some(rm.file.as_str()),
        }
    });
    let model = match (model, same_model.and_then(|r| r.model.clone())) {
        (Some(m), _) => m,
        (None, Some(m)) => {
            notes.push(format!(
                "model {} (sha256 {}, {} bytes) from memra's rows of run {}",
                m.file,
                m.sha256.as_deref().unwrap_or("-"),
                m.bytes.map_or("-".into(), |b| b.to_string()),
                a.run
            ));
            m
        }
        (None, None) => {
            return Err(Error::Input(format!(
                "no model for the rows: {} holds no memra row of run {} for {}; pass --model \
                 FILE.gguf, or --model-file NAME --model-sha256 HEX --model-bytes N",
                a.out.display(),
                a.run,
                wanted
                    .as_deref()
                    .unwrap_or("the model (the lines name none)")
            )));
        }
    };
    // The labels of the model from memra's row of that model only; the machine's and memra's
    // commit from any memra row of the run.
    let from_run = same_model.or(memra.first().copied());
    let pick = |flag: &Option<String>, row: Option<&Row>, get: fn(&Row) -> Option<String>| {
        flag.clone().or_else(|| row.and_then(get))
    };
    let shape = pick(&a.shape, same_model, |r| r.shape.clone());
    let dtype = pick(&a.dtype, same_model, |r| r.dtype.clone());
    let driver = pick(&a.driver, from_run, |r| r.device.driver.clone());
    let commit = pick(&a.commit, from_run, |r| r.commit.clone());
    let device_name = pick(&a.device_name, from_run, |r| Some(r.device.name.clone()));
    let sms = a.sms.or(from_run.and_then(|r| r.device.sms));
    if let Some(r) = from_run {
        let mut took = Vec::new();
        if a.shape.is_none() && shape.is_some() {
            took.push("shape");
        }
        if a.dtype.is_none() && dtype.is_some() {
            took.push("dtype");
        }
        if a.driver.is_none() && driver.is_some() {
            took.push("driver");
        }
        if a.sms.is_none() && sms.is_some() {
            took.push("sms");
        }
        if a.commit.is_none() && commit.is_some() {
            took.push("commit");
        }
        if !took.is_empty() {
            notes.push(format!(
                "{} from memra's row of run {} ({})",
                took.join(", "),
                a.run,
                describe(r)
            ));
        }
    }

    let p = PeerRun {
        run: a.run.clone(),
        time: a.time.clone().unwrap_or_default(),
        device: DeviceRef {
            name: device_name.unwrap_or_default(),
            driver,
            sms,
        },
        commit,
        model,
        shape,
        dtype,
        kv_dtype: a.kv_dtype.clone(),
        version: a.version.clone(),
        source: a.source.clone().unwrap_or_else(|| DEFAULT_SOURCE.into()),
    };

    // The rows, each checked against its line.
    let mut new: Vec<(String, PeerRow)> = Vec::new();
    for (name, t) in &texts {
        for r in peer_rows(t, &p, true, name)? {
            let at = format!("{name}:{}", r.line);
            if r.row.time.is_empty() {
                return Err(Error::Input(format!("{at}: no test_time: pass --time")));
            }
            if r.row.device.name.is_empty() {
                return Err(Error::Input(format!(
                    "{at}: no gpu_info: pass --device-name"
                )));
            }
            if let Some(k) = &a.kv_dtype
                && r.row.kv_dtype.as_ref() != Some(k)
            {
                return Err(Error::Input(format!(
                    "{at}: KV type {} (type_k), not --kv-dtype {k}",
                    r.row.kv_dtype.as_deref().unwrap_or("-")
                )));
            }
            if a.source.is_none()
                && (r.n_gpu_layers.is_some_and(|n| n != 99) || r.flash_attn == Some(false))
            {
                return Err(Error::Input(format!(
                    "{at}: llama-bench ran with -ngl {} -fa {}, not the default source's `{}`: \
                     pass --source",
                    r.n_gpu_layers.map_or("?".into(), |n| n.to_string()),
                    match r.flash_attn {
                        Some(true) => "1",
                        Some(false) => "0",
                        None => "auto",
                    },
                    LLAMA_BENCH_SOURCE
                )));
            }
            if let Some((other, _)) = new.iter().find(|(_, o)| same_test(&o.row, &r.row)) {
                return Err(Error::Input(format!(
                    "{at} and {other} measure the same test ({})",
                    describe(&r.row)
                )));
            }
            new.push((at, r));
        }
    }

    // The rows the file holds already.
    let mut clashes = Vec::new();
    for (i, (_, row)) in existing.iter().enumerate() {
        let Some(row) = row else { continue };
        if let Some((at, _)) = new.iter().find(|(_, n)| same_test(&n.row, row)) {
            clashes.push((i, at.clone(), describe(row)));
        }
    }
    if !clashes.is_empty() && !a.replace {
        let list: Vec<String> = clashes
            .iter()
            .map(|(i, at, d)| {
                format!(
                    "{}:{} already holds {at}'s test ({d})",
                    a.out.display(),
                    i + 1
                )
            })
            .collect();
        return Err(Error::Input(format!(
            "{}; nothing written (--replace replaces them)",
            list.join("; ")
        )));
    }
    let rows: Vec<Row> = new.into_iter().map(|(_, r)| r.row).collect();
    let out = Imported {
        rows,
        replaced: clashes.len(),
        notes,
    };
    if a.dry_run {
        return Ok(out);
    }
    if clashes.is_empty() {
        record::append(&a.out, &out.rows)?;
    } else {
        rewrite(&a.out, &existing, &out.rows)?;
    }
    Ok(out)
}

/// `--replace`: each row of the file that measures an imported row's test becomes that row (the
/// first in place, later ones dropped); the other imported rows are appended. Written to a
/// temporary file beside `out`, then renamed over it.
fn rewrite(out: &Path, existing: &[(String, Option<Row>)], rows: &[Row]) -> Result<()> {
    let mut placed = vec![false; rows.len()];
    let mut text = String::new();
    for (line, row) in existing {
        let hit = row
            .as_ref()
            .and_then(|r| rows.iter().position(|n| same_test(n, r)));
        match hit {
            Some(k) if placed[k] => continue,
            Some(k) => {
                placed[k] = true;
                text.push_str(&record::to_lines(std::slice::from_ref(&rows[k]))?);
            }
            None => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    let rest: Vec<Row> = rows
        .iter()
        .zip(&placed)
        .filter(|(_, p)| !**p)
        .map(|(r, _)| r.clone())
        .collect();
    text.push_str(&record::to_lines(&rest)?);
    let err = |e: std::io::Error| Error::Input(format!("{}: {e}", out.display()));
    let tmp = PathBuf::from(format!("{}.import-tmp", out.display()));
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}
