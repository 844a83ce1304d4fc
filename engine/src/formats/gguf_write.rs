//! GGUF writer (version 3), for synthetic models, conversions and tests.
//!
//! Streaming: declare metadata and tensor infos first ([`GgufWriter`]), then write each tensor's
//! bytes in declaration order ([`GgufDataWriter::write_tensor`]). Files are written as `PATH.tmp`
//! and renamed into place by [`GgufDataWriter::finish`]; a writer dropped before `finish` (an
//! error on the way) removes its temporary files, so nothing half-written remains.
//!
//! Split models ([`GgufWriter::begin_split`]) are written as `PREFIX-00001-of-0000N.gguf` ...,
//! each part a complete GGUF file with `split.no`, `split.count` and `split.tensors.count`;
//! the user metadata goes into the first part.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::formats::gguf::{
    DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MetaValue, split_path,
};
use crate::quant::DType;

const VERSION: u32 = 3;
const KEY_ALIGNMENT: &str = "general.alignment";
const KEY_SPLIT_NO: &str = "split.no";
const KEY_SPLIT_COUNT: &str = "split.count";
const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

fn input_err(what: impl std::fmt::Display) -> Error {
    Error::Input(format!("GGUF writer: {what}"))
}

/// One declared tensor.
#[derive(Clone, Debug)]
struct TensorDecl {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    nbytes: u64,
}

/// Declares the metadata and tensor index of a GGUF file (or split model) before its data.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: u32,
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<TensorDecl>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// A writer with the given data alignment (a power of two; 32 is the GGUF default and is then
    /// not written as `general.alignment`). An invalid alignment is reported by `begin`.
    pub fn new(alignment: u32) -> Self {
        GgufWriter {
            alignment,
            meta: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Adds a metadata entry (written in the order added). Keys are checked by `begin`.
    pub fn add_meta(&mut self, key: impl Into<String>, value: MetaValue) {
        self.meta.push((key.into(), value));
    }

    /// Declares a tensor: `dims` in ggml order (`dims[0]` is the row length).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        dims: &[u64],
    ) -> Result<()> {
        let name = name.into();
        if name.is_empty() {
            return Err(input_err("tensor name is empty"));
        }
        if self.names.contains(&name) {
            return Err(input_err(format!("tensor `{name}` declared twice")));
        }
        if dtype.gguf_id().is_none() {
            return Err(input_err(format!(
                "tensor `{name}` is {dtype}, which GGUF has no type for (dequantize it first)"
            )));
        }
        let (row, rest) = match dims.split_first() {
            Some(split) if dims.len() <= MAX_DIMS as usize => split,
            _ => {
                return Err(input_err(format!(
                    "tensor `{name}` has {} dims, must be 1..={MAX_DIMS}",
                    dims.len()
                )));
            }
        };
        let row = *row;
        if let Some((i, d)) = dims
            .iter()
            .enumerate()
            .find(|&(_, &d)| d == 0 || d > i64::MAX as u64)
        {
            return Err(input_err(format!("tensor `{name}` dim {i} is {d}")));
        }
        if !row.is_multiple_of(dtype.block_size() as u64) {
            return Err(input_err(format!(
                "tensor `{name}` row length {row} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            )));
        }
        let row_bytes = dtype
            .bytes_for(row)
            .ok_or_else(|| input_err(format!("tensor `{name}` byte size overflows")))?;
        let nbytes = rest
            .iter()
            .try_fold(row_bytes, |a, &d| a.checked_mul(d))
            .ok_or_else(|| input_err(format!("tensor `{name}` byte size overflows")))?;
        self.names.insert(name.clone());
        self.tensors.push(TensorDecl {
            name,
            dtype,
            dims: dims.to_vec(),
            nbytes,
        });
        Ok(())
    }

    /// Starts writing one file at `path` (as `path.tmp` until `finish`).
    pub fn begin(self, path: &Path) -> Result<GgufDataWriter> {
        self.validate(false)?;
        let n = self.tensors.len();
        let part = self.plan_part(path.to_path_buf(), self.meta.clone(), 0..n)?;
        Ok(GgufDataWriter::new(self, vec![part]))
    }

    /// Starts writing a split model of `n_parts` files `PREFIX-00001-of-0000N.gguf` ...; tensors
    /// are distributed in declaration order, balanced by bytes (a part may hold none).
    pub fn begin_split(self, prefix: &Path, n_parts: u32) -> Result<GgufDataWriter> {
        self.validate(true)?;
        if n_parts == 0 || n_parts > u16::MAX as u32 {
            return Err(input_err(format!(
                "split part count {n_parts} is not in 1..=65535"
            )));
        }
        let prefix = prefix
            .to_str()
            .ok_or_else(|| input_err(format!("split prefix {} is not UTF-8", prefix.display())))?;
        let ranges = self.distribute(n_parts as usize);
        let total = i32::try_from(self.tensors.len())
            .map_err(|_| input_err("too many tensors for split.tensors.count"))?;
        let mut parts = Vec::with_capacity(ranges.len());
        for (i, range) in ranges.into_iter().enumerate() {
            let mut meta = if i == 0 {
                self.meta.clone()
            } else {
                Vec::new()
            };
            meta.push((KEY_SPLIT_NO.into(), MetaValue::U16(i as u16)));
            meta.push((KEY_SPLIT_COUNT.into(), MetaValue::U16(n_parts as u16)));
            meta.push((KEY_SPLIT_TENSORS.into(), MetaValue::I32(total)));
            let path = split_path(prefix, i as u32 + 1, n_parts);
            parts.push(self.plan_part(path, meta, range)?);
        }
        Ok(GgufDataWriter::new(self, parts))
    }

    /// Checks alignment and metadata keys and values.
    fn validate(&self, split: bool) -> Result<()> {
        if !self.alignment.is_power_of_two() {
            return Err(input_err(format!(
                "alignment {} is not a non-zero power of two",
                self.alignment
            )));
        }
        let mut seen = HashSet::new();
        for (key, value) in &self.meta {
            if key.is_empty() {
                return Err(input_err("metadata key is empty"));
            }
            if !seen.insert(key.as_str()) {
                return Err(input_err(format!("metadata key `{key}` added twice")));
            }
            if split && key.starts_with("split.") {
                return Err(input_err(format!(
                    "metadata key `{key}` is written by the split writer itself"
                )));
            }
            if key == KEY_ALIGNMENT && *value != MetaValue::U32(self.alignment) {
                return Err(input_err(format!(
                    "metadata `{KEY_ALIGNMENT}` {value:?} differs from the writer alignment {}",
                    self.alignment
                )));
            }
            check_value(key, value, 0)?;
        }
        Ok(())
    }

    /// Splits the tensor list into `n` consecutive ranges of about equal bytes.
    fn distribute(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        let total: u128 = self.tensors.iter().map(|t| t.nbytes as u128).sum();
        let count = self.tensors.len();
        let mut part_of = Vec::with_capacity(count);
        let mut before: u128 = 0;
        for (i, t) in self.tensors.iter().enumerate() {
            let p = (before * n as u128)
                .checked_div(total)
                .map_or(i * n / count.max(1), |p| p as usize);
            part_of.push(p.min(n - 1));
            before += t.nbytes as u128;
        }
        (0..n)
            .map(|p| {
                let start = part_of.iter().position(|&q| q >= p).unwrap_or(count);
                let end = part_of.iter().position(|&q| q > p).unwrap_or(count);
                start..end
            })
            .collect()
    }

    /// Serializes a part's header (through the padding before the data) and its tensor offsets.
    fn plan_part(
        &self,
        path: PathBuf,
        mut meta: Vec<(String, MetaValue)>,
        range: std::ops::Range<usize>,
    ) -> Result<PartPlan> {
        let align = self.alignment as u64;
        if align != DEFAULT_ALIGNMENT && !meta.iter().any(|(k, _)| k == KEY_ALIGNMENT) {
            meta.insert(0, (KEY_ALIGNMENT.into(), MetaValue::U32(self.alignment)));
        }
        let tensors = self.tensors.get(range.clone()).unwrap_or(&[]);
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        for (key, value) in &meta {
            put_str(&mut h, key);
            h.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut h, value);
        }
        let mut offset: u64 = 0;
        for t in tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.dtype.ggml_id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = offset
                .checked_add(t.nbytes)
                .and_then(|o| align_up(o, align))
                .ok_or_else(|| input_err(format!("{}: data size overflows", path.display())))?;
        }
        let header_len =
            align_up(h.len() as u64, align).ok_or_else(|| input_err("header size overflows"))?;
        h.resize(header_len as usize, 0);
        Ok(PartPlan {
            tmp: tmp_path(&path),
            path,
            header: h,
            tensors: range,
        })
    }
}

/// Checks that every array is homogeneous and not nested too deeply (as the reader requires).
fn check_value(key: &str, value: &MetaValue, depth: usize) -> Result<()> {
    if let MetaValue::Array(items) = value {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(input_err(format!(
                "metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        if let Some(first) = items.first() {
            let ty = first.type_id();
            if items.iter().any(|v| v.type_id() != ty) {
                return Err(input_err(format!(
                    "metadata `{key}`: array elements of mixed types"
                )));
            }
        }
        for v in items {
            check_value(key, v, depth + 1)?;
        }
    }
    Ok(())
}

fn align_up(v: u64, align: u64) -> Option<u64> {
    Some(v.checked_add(align - 1)? / align * align)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(".tmp");
    PathBuf::from(s)
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

/// Appends a value's encoding (without its type id).
fn put_value(h: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => h.push(*x),
        MetaValue::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => h.push(*x as u8),
        MetaValue::Str(s) => put_str(h, s),
        MetaValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(items) => {
            // An empty array's element type is not known; u8 is as good as any.
            let ety = items.first().map_or(0, |v| v.type_id());
            h.extend_from_slice(&ety.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
    }
}

/// One output file: its header bytes and the range of tensors it holds.
struct PartPlan {
    path: PathBuf,
    tmp: PathBuf,
    header: Vec<u8>,
    tensors: std::ops::Range<usize>,
}

/// Writes the tensor data of a declared GGUF file or split model, in declaration order.
pub struct GgufDataWriter {
    decl: GgufWriter,
    parts: Vec<PartPlan>,
    /// Index of the part whose file is open in `out` (or the next to open).
    part: usize,
    out: Option<BufWriter<File>>,
    /// Number of temporary files created so far (parts `0..created`).
    created: usize,
    next_tensor: usize,
    /// Bytes of tensor `next_tensor` written so far by `write_tensor_chunk`.
    partial: u64,
    finished: bool,
}

impl GgufDataWriter {
    fn new(decl: GgufWriter, parts: Vec<PartPlan>) -> Self {
        GgufDataWriter {
            decl,
            parts,
            part: 0,
            out: None,
            created: 0,
            next_tensor: 0,
            partial: 0,
            finished: false,
        }
    }

    /// The final paths of the files being written.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.parts.iter().map(|p| p.path.clone()).collect()
    }

    fn io(&self, path: &Path, e: std::io::Error) -> Error {
        Error::io(path, e)
    }

    /// Closes the open part (flushed and synced).
    fn close_current(&mut self) -> Result<()> {
        if let Some(out) = self.out.take() {
            let tmp = self
                .parts
                .get(self.part)
                .map(|p| p.tmp.clone())
                .unwrap_or_default();
            let file = out
                .into_inner()
                .map_err(|e| self.io(&tmp, e.into_error()))?;
            file.sync_all().map_err(|e| self.io(&tmp, e))?;
            self.part += 1;
        }
        Ok(())
    }

    /// Opens part `self.part` (`created` must equal it) and writes its header.
    fn open_next(&mut self) -> Result<()> {
        let Some(plan) = self.parts.get(self.part) else {
            return Err(input_err("no split part left to open"));
        };
        let file = File::create(&plan.tmp).map_err(|e| Error::io(&plan.tmp, e))?;
        self.created = self.part + 1;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&plan.header)
            .map_err(|e| Error::io(&plan.tmp, e))?;
        self.out = Some(out);
        Ok(())
    }

    /// Makes the part holding tensor `t` (or, for `None`, every remaining part) open in turn.
    fn advance_to(&mut self, t: Option<usize>) -> Result<()> {
        loop {
            if self.out.is_none() {
                if self.part >= self.parts.len() {
                    return Ok(());
                }
                self.open_next()?;
            }
            let holds = match (t, self.parts.get(self.part)) {
                (Some(t), Some(p)) => p.tensors.contains(&t),
                _ => false,
            };
            if holds {
                return Ok(());
            }
            self.close_current()?;
        }
    }

    /// Writes the next declared tensor's bytes (exactly its declared size), then the padding.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let decl = self.current_decl("write_tensor")?;
        if self.partial != 0 || bytes.len() as u64 != decl.nbytes {
            return Err(input_err(format!(
                "tensor `{}` ({} {:?}) needs {} bytes, got {}",
                decl.name,
                decl.dtype,
                decl.dims,
                decl.nbytes,
                self.partial + bytes.len() as u64
            )));
        }
        self.write_tensor_chunk(bytes)
    }

    /// Streams the next declared tensor in pieces: appends `bytes` to it; once its declared size
    /// is reached the padding follows and the next call starts the next tensor.
    pub fn write_tensor_chunk(&mut self, bytes: &[u8]) -> Result<()> {
        let decl = self.current_decl("write_tensor_chunk")?;
        let (name, nbytes) = (decl.name.clone(), decl.nbytes);
        let total = self.partial + bytes.len() as u64;
        if total > nbytes {
            return Err(input_err(format!(
                "tensor `{name}` needs {nbytes} bytes, got {total} so far"
            )));
        }
        self.advance_to(Some(self.next_tensor))?;
        let align = self.decl.alignment as u64;
        let tmp = self
            .parts
            .get(self.part)
            .map(|p| p.tmp.clone())
            .unwrap_or_default();
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| input_err("no open output file"))?;
        out.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
        self.partial = total;
        if total == nbytes {
            let pad = align_up(nbytes, align).map_or(0, |a| (a - nbytes) as usize);
            out.write_all(&vec![0u8; pad])
                .map_err(|e| Error::io(&tmp, e))?;
            self.next_tensor += 1;
            self.partial = 0;
        }
        Ok(())
    }

    /// The declaration of the tensor to write next.
    fn current_decl(&self, op: &str) -> Result<&TensorDecl> {
        self.decl.tensors.get(self.next_tensor).ok_or_else(|| {
            input_err(format!(
                "{op} called more often than the {} declared tensors",
                self.decl.tensors.len()
            ))
        })
    }

    /// Checks that every declared tensor was written, then moves the files into place.
    pub fn finish(mut self) -> Result<()> {
        if self.next_tensor != self.decl.tensors.len() {
            return Err(input_err(format!(
                "finish after {} of {} tensors (next: `{}`, {} bytes of it written)",
                self.next_tensor,
                self.decl.tensors.len(),
                self.decl
                    .tensors
                    .get(self.next_tensor)
                    .map_or("", |t| t.name.as_str()),
                self.partial
            )));
        }
        self.advance_to(None)?;
        for p in &self.parts {
            std::fs::rename(&p.tmp, &p.path).map_err(|e| Error::io(&p.path, e))?;
        }
        self.finished = true;
        Ok(())
    }
}

impl Drop for GgufDataWriter {
    fn drop(&mut self) {
        if !self.finished {
            self.out = None;
            for p in self.parts.iter().take(self.created) {
                let _ = std::fs::remove_file(&p.tmp);
            }
        }
    }
}

/// One tensor for [`write_gguf`]: name, type, dims in ggml order, bytes.
pub type TensorData<'a> = (&'a str, DType, &'a [u64], &'a [u8]);

fn declare(
    alignment: u32,
    meta: &[(String, MetaValue)],
    tensors: &[TensorData<'_>],
) -> Result<GgufWriter> {
    let mut w = GgufWriter::new(alignment);
    for (k, v) in meta {
        w.add_meta(k.clone(), v.clone());
    }
    for (name, dtype, dims, _) in tensors {
        w.add_tensor(*name, *dtype, dims)?;
    }
    Ok(w)
}

fn write_all(mut d: GgufDataWriter, tensors: &[TensorData<'_>]) -> Result<()> {
    for (_, _, _, bytes) in tensors {
        d.write_tensor(bytes)?;
    }
    d.finish()
}

/// Writes a whole GGUF file (default alignment 32, or `general.alignment` if `meta` sets a u32).
pub fn write_gguf(
    path: &Path,
    meta: &[(String, MetaValue)],
    tensors: &[TensorData<'_>],
) -> Result<()> {
    let w = declare(alignment_of(meta), meta, tensors)?;
    write_all(w.begin(path)?, tensors)
}

/// Writes a split model of `n_parts` files; returns their paths in order.
pub fn write_gguf_split(
    prefix: &Path,
    n_parts: u32,
    meta: &[(String, MetaValue)],
    tensors: &[TensorData<'_>],
) -> Result<Vec<PathBuf>> {
    let w = declare(alignment_of(meta), meta, tensors)?;
    let d = w.begin_split(prefix, n_parts)?;
    let paths = d.paths();
    write_all(d, tensors)?;
    Ok(paths)
}

fn alignment_of(meta: &[(String, MetaValue)]) -> u32 {
    match meta.iter().find(|(k, _)| k == KEY_ALIGNMENT) {
        Some((_, MetaValue::U32(a))) => *a,
        _ => DEFAULT_ALIGNMENT as u32,
    }
}
