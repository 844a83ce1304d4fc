//! Hugging Face safetensors folders: `config.json`, `model.safetensors` or a sharded
//! `model.safetensors.index.json`, and the tokenizer files.
//!
//! Files are memory-mapped; tensors are returned as views into the mapping (no copy).
//! Every header is validated before use (RELIABILITY.md): header length cap, UTF-8 JSON with no
//! duplicate keys, known dtypes, checked element/byte counts, `end - start == nbytes`, offsets
//! contiguous and non-overlapping and covering exactly the data section. The `safetensors` crate
//! then checks the same file again; its errors are wrapped with the file path.
//! Writing ([`SafetensorsWriter`], [`HfFolderWriter`]) streams tensors in order into `PATH.tmp`
//! and renames at the end, so nothing half-written is left under the final name.

pub mod quantized;
mod write;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::DType;
use crate::weights::{Bytes, Tensor};

pub use write::{
    HfFolderSpec, HfFolderWriter, SafetensorsWriter, TensorDecl, shard_plan, write_hf_folder,
    write_safetensors,
};

/// Largest accepted JSON header (the `safetensors` crate's limit too).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Name of the single-file weights.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

fn st_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Safetensors {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// A safetensors dtype name: its size in bits and, when memra can use it, its [`DType`].
fn dtype_info(name: &str) -> Option<(u64, Option<DType>)> {
    Some(match name {
        "F32" => (32, Some(DType::F32)),
        "F16" => (16, Some(DType::F16)),
        "BF16" => (16, Some(DType::BF16)),
        "F64" | "I64" | "U64" | "C64" => (64, None),
        "I32" | "U32" => (32, None),
        "I16" | "U16" => (16, None),
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "F8_E4M3FNUZ"
        | "F8_E5M2FNUZ" => (8, None),
        "F6_E2M3" | "F6_E3M2" => (6, None),
        "F4" => (4, None),
        _ => return None,
    })
}

/// The safetensors name of a dtype memra can write.
pub fn dtype_name(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("F32"),
        DType::F16 => Some("F16"),
        DType::BF16 => Some("BF16"),
        _ => None,
    }
}

/// A JSON object read with its keys in file order; duplicate keys are kept (and rejected by
/// the caller), unlike `serde_json::Map` which silently keeps the last one.
struct OrderedObject(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<OrderedObject, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, serde_json::Value>()? {
                    v.push((k, val));
                }
                Ok(OrderedObject(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses a JSON object, rejecting duplicate keys. `what` names the object in errors.
fn parse_object(path: &Path, text: &[u8], what: &str) -> Result<Vec<(String, serde_json::Value)>> {
    let obj: OrderedObject = serde_json::from_slice(text)
        .map_err(|e| st_err(path, format!("{what} is not a valid JSON object: {e}")))?;
    let mut seen = std::collections::HashSet::new();
    for (k, _) in &obj.0 {
        if !seen.insert(k.as_str()) {
            return Err(st_err(path, format!("{what} has the key `{k}` twice")));
        }
    }
    Ok(obj.0)
}

/// One tensor entry of a safetensors header.
#[derive(Clone, Debug)]
struct Entry {
    dtype_name: String,
    /// `None` for dtypes memra cannot use (integers, FP8, ...).
    dtype: Option<DType>,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    len: usize,
}

/// One memory-mapped `.safetensors` file with a validated header.
pub struct SafetensorsFile {
    pub path: PathBuf,
    map: Arc<memmap2::Mmap>,
    /// Tensors in data order.
    tensors: Vec<(String, Entry)>,
    index: HashMap<String, usize>,
    metadata: Option<HashMap<String, String>>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SafetensorsFile({}, {} tensors)",
            self.path.display(),
            self.tensors.len()
        )
    }
}

fn parse_entry(path: &Path, name: &str, v: &serde_json::Value) -> Result<(Entry, u64, u64)> {
    let field = |f: &str| {
        v.get(f)
            .ok_or_else(|| st_err(path, format!("tensor `{name}` has no `{f}`")))
    };
    let dtype_name = field("dtype")?
        .as_str()
        .ok_or_else(|| st_err(path, format!("tensor `{name}` dtype is not a string")))?;
    let (bits, dtype) = dtype_info(dtype_name).ok_or_else(|| {
        st_err(
            path,
            format!("tensor `{name}` has unknown dtype `{dtype_name}`"),
        )
    })?;
    let shape_v = field("shape")?
        .as_array()
        .ok_or_else(|| st_err(path, format!("tensor `{name}` shape is not an array")))?;
    if shape_v.len() > 8 {
        return Err(st_err(
            path,
            format!("tensor `{name}` has {} dimensions (max 8)", shape_v.len()),
        ));
    }
    let mut shape = Vec::with_capacity(shape_v.len());
    for d in shape_v {
        let d = d
            .as_u64()
            .and_then(|d| usize::try_from(d).ok())
            .ok_or_else(|| {
                st_err(
                    path,
                    format!("tensor `{name}` shape {d} is not a dimension"),
                )
            })?;
        shape.push(d);
    }
    let offs = field("data_offsets")?.as_array();
    let (start, end) = match offs.map(|a| a.as_slice()) {
        Some([s, e]) => match (s.as_u64(), e.as_u64()) {
            (Some(s), Some(e)) => (s, e),
            _ => {
                return Err(st_err(
                    path,
                    format!("tensor `{name}` data_offsets are not integers"),
                ));
            }
        },
        _ => {
            return Err(st_err(
                path,
                format!("tensor `{name}` data_offsets is not [start, end]"),
            ));
        }
    };
    let nbits = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .and_then(|n| n.checked_mul(bits))
        .ok_or_else(|| st_err(path, format!("tensor `{name}` shape {shape:?} overflows")))?;
    if nbits % 8 != 0 {
        return Err(st_err(
            path,
            format!("tensor `{name}` {dtype_name} {shape:?} is not a whole number of bytes"),
        ));
    }
    let nbytes = nbits / 8;
    if end < start || end - start != nbytes {
        return Err(st_err(
            path,
            format!(
                "tensor `{name}` {dtype_name} {shape:?} needs {nbytes} bytes but data_offsets [{start}, {end}] hold {}",
                end as i128 - start as i128
            ),
        ));
    }
    let e = Entry {
        dtype_name: dtype_name.to_string(),
        dtype,
        shape,
        start: 0,
        len: 0,
    };
    Ok((e, start, end))
}

impl SafetensorsFile {
    /// Maps and validates a `.safetensors` file.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let flen = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if flen < 8 {
            return Err(st_err(
                path,
                format!("file is {flen} bytes, too short for the 8-byte header length"),
            ));
        }
        // SAFETY: the mapping is read-only; like every mmap-based loader we rely on the file not
        // being truncated while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let map = Arc::new(map);
        let (tensors, metadata) = Self::parse(path, &map)?;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            tensors,
            index,
            metadata,
        })
    }

    /// Validates a safetensors file held in memory (the fuzz target and its corpus replay): the
    /// header, every tensor's dtype, shape and extent; the tensor names in file order.
    pub fn check_bytes(path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
        let (tensors, _) = Self::parse(path, bytes)?;
        Ok(tensors.into_iter().map(|(n, _)| n).collect())
    }

    #[allow(clippy::type_complexity)]
    fn parse(
        path: &Path,
        buf: &[u8],
    ) -> Result<(Vec<(String, Entry)>, Option<HashMap<String, String>>)> {
        let flen = buf.len() as u64;
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(buf.get(..8).ok_or_else(|| st_err(path, "file too short"))?);
        let n = u64::from_le_bytes(len8);
        if n > MAX_HEADER_BYTES {
            return Err(st_err(
                path,
                format!("header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"),
            ));
        }
        if n > flen - 8 {
            return Err(st_err(
                path,
                format!("header length {n} runs past the end of the {flen}-byte file"),
            ));
        }
        let data_start = 8 + n;
        let data_len = flen - data_start;
        let header = &buf[8..data_start as usize];
        let header = std::str::from_utf8(header)
            .map_err(|e| st_err(path, format!("header is not valid UTF-8: {e}")))?;
        let obj = parse_object(path, header.trim_end().as_bytes(), "header")?;
        let mut metadata = None;
        let mut tensors = Vec::with_capacity(obj.len());
        for (name, v) in obj {
            if name == "__metadata__" {
                let m = v
                    .as_object()
                    .ok_or_else(|| st_err(path, "`__metadata__` is not an object"))?;
                let mut out = HashMap::with_capacity(m.len());
                for (k, v) in m {
                    let s = v.as_str().ok_or_else(|| {
                        st_err(path, format!("`__metadata__` value `{k}` is not a string"))
                    })?;
                    out.insert(k.clone(), s.to_string());
                }
                metadata = Some(out);
                continue;
            }
            let (e, s, end) = parse_entry(path, &name, &v)?;
            tensors.push((name, e, s, end));
        }
        tensors.sort_by_key(|t| (t.2, t.3));
        let mut pos = 0u64;
        let mut prev: Option<&str> = None;
        for (name, _, s, e) in &tensors {
            if *s < pos {
                return Err(st_err(
                    path,
                    format!(
                        "tensor `{name}` data [{s}, {e}) overlaps tensor `{}` (ends at {pos})",
                        prev.unwrap_or("")
                    ),
                ));
            }
            if *s > pos {
                return Err(st_err(
                    path,
                    format!(
                        "gap in the data section before tensor `{name}` (bytes {pos}..{s} belong to no tensor)"
                    ),
                ));
            }
            if *e > data_len {
                return Err(st_err(
                    path,
                    format!(
                        "tensor `{name}` data [{s}, {e}) runs past the end of the {data_len}-byte data section"
                    ),
                ));
            }
            pos = *e;
            prev = Some(name);
        }
        if pos != data_len {
            return Err(st_err(
                path,
                format!("data section is {data_len} bytes but the tensors cover {pos}"),
            ));
        }
        // Second opinion from the reference implementation.
        safetensors::SafeTensors::read_metadata(buf)
            .map_err(|e| st_err(path, format!("rejected by the safetensors crate: {e}")))?;
        let out = tensors
            .into_iter()
            .map(|(name, mut e, s, end)| {
                e.start = (data_start + s) as usize;
                e.len = (end - s) as usize;
                (name, e)
            })
            .collect();
        Ok((out, metadata))
    }

    /// Tensor names in data order.
    pub fn tensor_names(&self) -> Vec<String> {
        self.tensors.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The `__metadata__` map, if any.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// A tensor as stored (any dtype): its dtype name, shape and bytes.
    pub fn raw(&self, name: &str) -> Option<quantized::Raw<'_>> {
        let (_, e) = &self.tensors[*self.index.get(name)?];
        Some(quantized::Raw {
            dtype: &e.dtype_name,
            shape: &e.shape,
            data: Bytes::Mapped {
                map: self.map.clone(),
                start: e.start,
                len: e.len,
            },
        })
    }

    /// A tensor as a view into the mapping; `Ok(None)` if absent, an error for dtypes memra
    /// cannot use.
    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>> {
        let Some(&i) = self.index.get(name) else {
            return Ok(None);
        };
        let (name, e) = &self.tensors[i];
        let dtype = e.dtype.ok_or_else(|| {
            st_err(
                &self.path,
                format!("tensor `{name}` has dtype {}, which memra does not support (F32, F16, BF16; F8_E4M3 and U8 only as the weights of a quantization_config memra reads)", e.dtype_name),
            )
        })?;
        let data = Bytes::Mapped {
            map: self.map.clone(),
            start: e.start,
            len: e.len,
        };
        Tensor::new(name.clone(), dtype, e.shape.clone(), data)
            .map(Some)
            .map_err(|err| st_err(&self.path, err.to_string()))
    }
}

/// A shard file name from an index must be a plain file name inside the model folder.
fn check_shard_name(index_path: &Path, name: &str) -> Result<()> {
    let p = Path::new(name);
    let plain = p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
        && !name.contains('/')
        && !name.contains('\\');
    if name.is_empty() || !plain {
        return Err(st_err(
            index_path,
            format!("shard name `{name}` is not a plain file name in the model folder"),
        ));
    }
    Ok(())
}

/// An opened Hugging Face model folder.
pub struct HfModel {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub config_json: serde_json::Value,
    /// How the quantized weights are stored (`quantization_config`), if any.
    pub scheme: Option<quantized::Scheme>,
    shards: Vec<SafetensorsFile>,
    /// Tensor name -> shard index, in shard then data order.
    names: Vec<(String, usize)>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for HfModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HfModel({}, {} shards, {} tensors)",
            self.dir.display(),
            self.shards.len(),
            self.names.len()
        )
    }
}

/// Reads and parses a JSON file of the folder.
fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    // Duplicate keys are rejected, then the value is parsed normally.
    parse_object(path, &text, "the file")?;
    serde_json::from_slice(&text).map_err(|e| st_err(path, format!("invalid JSON: {e}")))
}

impl HfModel {
    /// Opens `dir`: `config.json` plus `model.safetensors` or the shards named by
    /// `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<HfModel> {
        if !dir.is_dir() {
            return Err(st_err(
                dir,
                "not a directory (an HF model is a folder with config.json and *.safetensors)",
            ));
        }
        let cfg_path = dir.join("config.json");
        if !cfg_path.is_file() {
            return Err(st_err(dir, "no config.json in the folder"));
        }
        let config_json = read_json(&cfg_path)?;
        let config = ModelConfig::from_hf_json(&config_json).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", cfg_path.display())),
            Error::Unsupported(m) => Error::Unsupported(format!("{}: {m}", cfg_path.display())),
            other => other,
        })?;
        let quant_path = dir.join("hf_quant_config.json");
        let quant_json = match quant_path.is_file() {
            true => Some(read_json(&quant_path)?),
            false => None,
        };
        let scheme = quantized::scheme(dir, &config_json, quant_json.as_ref())?;
        let single = dir.join(SINGLE_FILE);
        let index_path = dir.join(INDEX_FILE);
        let (shards, weight_map) = if single.is_file() {
            (vec![SafetensorsFile::open(&single)?], None)
        } else if index_path.is_file() {
            Self::open_index(dir, &index_path)?
        } else {
            return Err(st_err(
                dir,
                format!("neither {SINGLE_FILE} nor {INDEX_FILE} is in the folder"),
            ));
        };
        let mut names = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for (si, shard) in shards.iter().enumerate() {
            for (name, _) in &shard.tensors {
                if let Some(&other) = index.get(name) {
                    return Err(st_err(
                        dir,
                        format!(
                            "tensor `{name}` is in both {} and {}",
                            shards[other].path.display(),
                            shard.path.display()
                        ),
                    ));
                }
                index.insert(name.clone(), si);
                names.push((name.clone(), si));
            }
        }
        if let Some(wm) = weight_map {
            for (name, file) in wm {
                let found = index.get(&name).map(|&si| &shards[si]);
                match found {
                    Some(s)
                        if s.path.file_name().and_then(|f| f.to_str()) == Some(file.as_str()) => {}
                    Some(s) => {
                        return Err(st_err(
                            &index_path,
                            format!(
                                "tensor `{name}` is mapped to {file} but is in {}",
                                s.path.display()
                            ),
                        ));
                    }
                    None => {
                        return Err(st_err(
                            &index_path,
                            format!(
                                "tensor `{name}` is mapped to {file}, which has no such tensor"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(HfModel {
            dir: dir.to_path_buf(),
            config,
            config_json,
            scheme,
            shards,
            names,
            index,
        })
    }

    #[allow(clippy::type_complexity)]
    fn open_index(
        dir: &Path,
        index_path: &Path,
    ) -> Result<(Vec<SafetensorsFile>, Option<Vec<(String, String)>>)> {
        let text = std::fs::read(index_path).map_err(|e| Error::io(index_path, e))?;
        let top = parse_object(index_path, &text, "the index")?;
        let wm = top
            .iter()
            .find(|(k, _)| k == "weight_map")
            .map(|(_, v)| v)
            .ok_or_else(|| st_err(index_path, "index has no `weight_map`"))?;
        let wm_text = serde_json::to_vec(wm).map_err(|e| st_err(index_path, e.to_string()))?;
        let entries = parse_object(index_path, &wm_text, "`weight_map`")?;
        let mut weight_map = Vec::with_capacity(entries.len());
        let mut files: Vec<String> = Vec::new();
        for (name, f) in entries {
            let f = f
                .as_str()
                .ok_or_else(|| {
                    st_err(
                        index_path,
                        format!("`weight_map` entry `{name}` is not a file name"),
                    )
                })?
                .to_string();
            check_shard_name(index_path, &f)?;
            if !files.contains(&f) {
                files.push(f.clone());
            }
            weight_map.push((name, f));
        }
        if files.is_empty() {
            return Err(st_err(index_path, "`weight_map` is empty"));
        }
        files.sort();
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            let p = dir.join(f);
            if !p.is_file() {
                return Err(st_err(
                    index_path,
                    format!("shard {f} named by the index is missing"),
                ));
            }
            shards.push(SafetensorsFile::open(&p)?);
        }
        Ok((shards, Some(weight_map)))
    }

    /// Every tensor name, in shard then data order.
    pub fn tensor_names(&self) -> Vec<String> {
        self.names.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A tensor (by HF name) as a view into its shard's mapping; `Ok(None)` if absent. A
    /// quantized weight of the folder's `quantization_config` comes as its memra type (FP8,
    /// NVFP4), built from its codes and scale tensors (formats/safetensors/quantized.rs).
    pub fn tensor(&self, hf_name: &str) -> Result<Option<Tensor>> {
        let Some(&si) = self.index.get(hf_name) else {
            return Ok(None);
        };
        if let (Some(scheme), Some(raw)) = (self.scheme, self.shards[si].raw(hf_name))
            && quantized::is_quantized(scheme, hf_name, raw.dtype)
        {
            let get = |n: &str| -> Option<quantized::Raw<'_>> { self.raw(n) };
            return quantized::build(&self.dir, scheme, hf_name, raw, &get).map(Some);
        }
        self.shards[si].tensor(hf_name)
    }

    /// A tensor (by HF name) as stored, any dtype.
    pub fn raw(&self, hf_name: &str) -> Option<quantized::Raw<'_>> {
        self.shards[*self.index.get(hf_name)?].raw(hf_name)
    }

    /// The shard files, in the order they were opened.
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    fn file(&self, name: &str) -> Option<PathBuf> {
        let p = self.dir.join(name);
        p.is_file().then_some(p)
    }

    pub fn tokenizer_json(&self) -> Option<PathBuf> {
        self.file("tokenizer.json")
    }

    pub fn tokenizer_config_json(&self) -> Option<PathBuf> {
        self.file("tokenizer_config.json")
    }

    /// A `chat_template.jinja` next to the weights (newer transformers write it there).
    pub fn chat_template_jinja(&self) -> Option<PathBuf> {
        self.file("chat_template.jinja")
    }
}
