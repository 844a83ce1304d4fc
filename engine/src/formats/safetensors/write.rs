//! Streaming safetensors and HF-folder writers: declare every tensor first, then write each
//! tensor's bytes in order. Output goes to `PATH.tmp` and is renamed on `finish()`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{INDEX_FILE, SINGLE_FILE, dtype_name, st_err};
use crate::error::{Error, Result};
use crate::quant::DType;
use crate::weights::Tensor;

/// A tensor to be written: name, dtype (F32/F16/BF16) and shape (outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// A one-byte-per-element safetensors dtype written as given (`F8_E4M3`, `U8`: the codes
    /// of quantized checkpoints), instead of `dtype`.
    pub raw: Option<&'static str>,
}

/// The one-byte safetensors dtypes [`TensorDecl::raw_bytes`] takes.
pub const RAW_DTYPES: [&str; 2] = ["F8_E4M3", "U8"];

impl TensorDecl {
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<usize>) -> Self {
        TensorDecl {
            name: name.into(),
            dtype,
            shape,
            raw: None,
        }
    }

    /// A tensor of one byte per element of safetensors dtype `st` (one of [`RAW_DTYPES`]).
    pub fn raw_bytes(name: impl Into<String>, st: &'static str, shape: Vec<usize>) -> Self {
        TensorDecl {
            raw: Some(st),
            ..TensorDecl::new(name, DType::F32, shape)
        }
    }

    /// The safetensors dtype name, if memra can write it.
    fn st_dtype(&self) -> Option<&'static str> {
        match self.raw {
            Some(r) => RAW_DTYPES.contains(&r).then_some(r),
            None => dtype_name(self.dtype),
        }
    }

    /// Byte size of the data, checked.
    pub fn nbytes(&self) -> Result<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .and_then(|n| match self.raw {
                Some(_) => Some(n),
                None => self.dtype.bytes_for(n),
            })
            .ok_or_else(|| {
                Error::Weights(format!(
                    "{}: {:?} {} overflows",
                    self.name, self.shape, self.dtype
                ))
            })
    }
}

/// `path` with `.tmp` appended to its file name.
fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Writes one `.safetensors` file, tensor by tensor, into `PATH.tmp`; `finish` renames it.
/// Dropping an unfinished writer removes the temporary file.
#[derive(Debug)]
pub struct SafetensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    sizes: Vec<(String, u64)>,
    next: usize,
}

impl SafetensorsWriter {
    /// Creates the file and writes its header.
    pub fn create(
        path: &Path,
        decls: &[TensorDecl],
        metadata: Option<&HashMap<String, String>>,
    ) -> Result<SafetensorsWriter> {
        let mut header = serde_json::Map::new();
        if let Some(m) = metadata {
            let m: serde_json::Map<String, serde_json::Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into()))
                .collect();
            header.insert("__metadata__".into(), m.into());
        }
        let mut sizes = Vec::with_capacity(decls.len());
        let mut off = 0u64;
        for d in decls {
            let name = d.st_dtype().ok_or_else(|| {
                Error::Unsupported(format!(
                    "safetensors output of {} tensor `{}` (F32, F16, BF16 only)",
                    d.dtype, d.name
                ))
            })?;
            if d.name == "__metadata__" || header.contains_key(&d.name) {
                return Err(st_err(
                    path,
                    format!("tensor name `{}` given twice or reserved", d.name),
                ));
            }
            let n = d.nbytes()?;
            let end = off
                .checked_add(n)
                .ok_or_else(|| st_err(path, "total size overflows"))?;
            header.insert(
                d.name.clone(),
                serde_json::json!({"dtype": name, "shape": d.shape, "data_offsets": [off, end]}),
            );
            sizes.push((d.name.clone(), n));
            off = end;
        }
        let mut text = serde_json::to_vec(&header).map_err(|e| st_err(path, e.to_string()))?;
        // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
        while text.len() % 8 != 0 {
            text.push(b' ');
        }
        let tmp = tmp_path(path);
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 22, file);
        out.write_all(&(text.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&text))
            .map_err(|e| Error::io(&tmp, e))?;
        Ok(SafetensorsWriter {
            path: path.to_path_buf(),
            tmp,
            out: Some(out),
            sizes,
            next: 0,
        })
    }

    /// The name of the tensor `write_tensor` expects next.
    pub fn next_name(&self) -> Option<&str> {
        self.sizes.get(self.next).map(|(n, _)| n.as_str())
    }

    /// Writes the next declared tensor's bytes (size checked).
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((name, n)) = self.sizes.get(self.next) else {
            return Err(st_err(&self.path, "more tensors written than declared"));
        };
        if bytes.len() as u64 != *n {
            return Err(st_err(
                &self.path,
                format!("tensor `{name}` needs {n} bytes, got {}", bytes.len()),
            ));
        }
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| st_err(&self.path, "writer already finished"))?;
        out.write_all(bytes).map_err(|e| Error::io(&self.tmp, e))?;
        self.next += 1;
        Ok(())
    }

    /// Checks every tensor was written, flushes and renames `PATH.tmp` to `PATH`.
    pub fn finish(mut self) -> Result<()> {
        if self.next != self.sizes.len() {
            return Err(st_err(
                &self.path,
                format!(
                    "only {} of {} tensors were written",
                    self.next,
                    self.sizes.len()
                ),
            ));
        }
        let out = self
            .out
            .take()
            .ok_or_else(|| st_err(&self.path, "writer already finished"))?;
        let file = out
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))?;
        Ok(())
    }
}

impl Drop for SafetensorsWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `tensors` (F32/F16/BF16) to one `.safetensors` file (via `PATH.tmp` + rename).
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let decls: Vec<TensorDecl> = tensors
        .iter()
        .map(|(n, t)| TensorDecl::new(n.clone(), t.dtype, t.shape.clone()))
        .collect();
    let mut w = SafetensorsWriter::create(path, &decls, metadata.as_ref())?;
    for (_, t) in tensors {
        w.write_tensor(&t.data)?;
    }
    w.finish()
}

/// Splits tensors (in order) into shards of at most `max_shard_bytes` each (a tensor larger
/// than the limit gets a shard of its own). Returns the tensor indices of each shard.
pub fn shard_plan(decls: &[TensorDecl], max_shard_bytes: u64) -> Result<Vec<Vec<usize>>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    for (i, d) in decls.iter().enumerate() {
        let n = d.nbytes()?;
        if !cur.is_empty() && cur_bytes.saturating_add(n) > max_shard_bytes {
            shards.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(i);
        cur_bytes = cur_bytes.saturating_add(n);
    }
    if !cur.is_empty() || shards.is_empty() {
        shards.push(cur);
    }
    Ok(shards)
}

/// What goes into an HF folder besides the tensors.
#[derive(Clone, Debug)]
pub struct HfFolderSpec {
    /// `config.json` content.
    pub config_json: serde_json::Value,
    /// `tokenizer.json` content, if any.
    pub tokenizer_json: Option<String>,
    /// `tokenizer_config.json` content, if any.
    pub tokenizer_config_json: Option<serde_json::Value>,
    /// Shard size limit; above it `model-0000i-of-0000N.safetensors` plus an index are written.
    pub max_shard_bytes: u64,
}

/// Writes an HF folder into `OUT.tmp`, streaming tensors in declaration order, and renames it to
/// `OUT` on `finish()`. `OUT` must not exist (or be an empty directory).
#[derive(Debug)]
pub struct HfFolderWriter {
    out: PathBuf,
    tmp: PathBuf,
    decls: Vec<TensorDecl>,
    /// (file name, tensor indices) per shard.
    shards: Vec<(String, Vec<usize>)>,
    shard: usize,
    in_shard: usize,
    cur: Option<SafetensorsWriter>,
    finished: bool,
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

fn pretty(path: &Path, v: &serde_json::Value) -> Result<Vec<u8>> {
    let mut s = serde_json::to_vec_pretty(v).map_err(|e| st_err(path, e.to_string()))?;
    s.push(b'\n');
    Ok(s)
}

impl HfFolderWriter {
    pub fn create(
        out: &Path,
        spec: &HfFolderSpec,
        decls: Vec<TensorDecl>,
    ) -> Result<HfFolderWriter> {
        if out.exists() {
            let empty_dir = out.is_dir()
                && std::fs::read_dir(out)
                    .map_err(|e| Error::io(out, e))?
                    .next()
                    .is_none();
            if !empty_dir {
                return Err(Error::Input(format!(
                    "{} already exists; remove it first",
                    out.display()
                )));
            }
        }
        let mut seen = HashSet::new();
        for d in &decls {
            if !seen.insert(d.name.as_str()) {
                return Err(st_err(out, format!("tensor `{}` declared twice", d.name)));
            }
        }
        let tmp = tmp_path(out);
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let plan = shard_plan(&decls, spec.max_shard_bytes)?;
        let n = plan.len();
        let shards = plan
            .into_iter()
            .enumerate()
            .map(|(i, idx)| {
                let name = if n == 1 {
                    SINGLE_FILE.to_string()
                } else {
                    format!("model-{:05}-of-{n:05}.safetensors", i + 1)
                };
                (name, idx)
            })
            .collect();
        let mut w = HfFolderWriter {
            out: out.to_path_buf(),
            tmp,
            decls,
            shards,
            shard: 0,
            in_shard: 0,
            cur: None,
            finished: false,
        };
        let p = w.tmp.join("config.json");
        write_file(&p, &pretty(&p, &spec.config_json)?)?;
        if let Some(t) = &spec.tokenizer_json {
            write_file(&w.tmp.join("tokenizer.json"), t.as_bytes())?;
        }
        if let Some(tc) = &spec.tokenizer_config_json {
            let p = w.tmp.join("tokenizer_config.json");
            write_file(&p, &pretty(&p, tc)?)?;
        }
        w.open_shard()?;
        Ok(w)
    }

    fn open_shard(&mut self) -> Result<()> {
        let Some((name, idx)) = self.shards.get(self.shard) else {
            return Ok(());
        };
        let decls: Vec<TensorDecl> = idx.iter().map(|&i| self.decls[i].clone()).collect();
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        self.cur = Some(SafetensorsWriter::create(
            &self.tmp.join(name),
            &decls,
            Some(&meta),
        )?);
        self.in_shard = 0;
        Ok(())
    }

    /// The name of the tensor `write_tensor` expects next.
    pub fn next_name(&self) -> Option<&str> {
        self.cur.as_ref().and_then(|c| c.next_name())
    }

    /// Writes the next declared tensor's bytes.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let cur = self
            .cur
            .as_mut()
            .ok_or_else(|| st_err(&self.out, "more tensors written than declared"))?;
        cur.write_tensor(bytes)?;
        self.in_shard += 1;
        let shard_len = self.shards.get(self.shard).map_or(0, |s| s.1.len());
        if self.in_shard == shard_len {
            if let Some(w) = self.cur.take() {
                w.finish()?;
            }
            self.shard += 1;
            self.open_shard()?;
        }
        Ok(())
    }

    /// Writes the index (when sharded) and renames `OUT.tmp` to `OUT`.
    pub fn finish(mut self) -> Result<()> {
        // An empty model has one empty shard still open.
        if self.decls.is_empty()
            && let Some(w) = self.cur.take()
        {
            w.finish()?;
            self.shard += 1;
        }
        if self.cur.is_some() || self.shard < self.shards.len() {
            return Err(st_err(&self.out, "not every declared tensor was written"));
        }
        if self.shards.len() > 1 {
            let mut total = 0u64;
            let mut wm = serde_json::Map::new();
            for (file, idx) in &self.shards {
                for &i in idx {
                    total += self.decls[i].nbytes()?;
                    wm.insert(self.decls[i].name.clone(), file.clone().into());
                }
            }
            let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": wm});
            let p = self.tmp.join(INDEX_FILE);
            write_file(&p, &pretty(&p, &index)?)?;
        }
        if self.out.is_dir() {
            std::fs::remove_dir(&self.out).map_err(|e| Error::io(&self.out, e))?;
        }
        std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for HfFolderWriter {
    fn drop(&mut self) {
        if !self.finished {
            self.cur.take();
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes a whole HF folder from in-memory tensors (F32/F16/BF16).
pub fn write_hf_folder(
    out: &Path,
    spec: &HfFolderSpec,
    tensors: &[(String, Tensor)],
) -> Result<()> {
    let decls = tensors
        .iter()
        .map(|(n, t)| TensorDecl::new(n.clone(), t.dtype, t.shape.clone()))
        .collect();
    let mut w = HfFolderWriter::create(out, spec, decls)?;
    for (_, t) in tensors {
        w.write_tensor(&t.data)?;
    }
    w.finish()
}
