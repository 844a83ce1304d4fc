//! GGUF reader over mmap (versions 2 and 3, split files). Every size read from the file is
//! checked against the bytes of the file before it is used or allocated; every problem is an
//! `Error::Gguf` naming the field and its byte offset.

mod cursor;
mod parse;
mod split;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::quant::DType;
use crate::weights::{Bytes, Tensor};

pub use parse::{DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use split::split_path;

/// GGUF metadata value type ids.
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Arrays may nest.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF value type id (see [`value_type`]).
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => value_type::U8,
            MetaValue::I8(_) => value_type::I8,
            MetaValue::U16(_) => value_type::U16,
            MetaValue::I16(_) => value_type::I16,
            MetaValue::U32(_) => value_type::U32,
            MetaValue::I32(_) => value_type::I32,
            MetaValue::F32(_) => value_type::F32,
            MetaValue::Bool(_) => value_type::BOOL,
            MetaValue::Str(_) => value_type::STRING,
            MetaValue::Array(_) => value_type::ARRAY,
            MetaValue::U64(_) => value_type::U64,
            MetaValue::I64(_) => value_type::I64,
            MetaValue::F64(_) => value_type::F64,
        }
    }

    /// The type's name as in the GGUF spec (`u32`, `string`, `array`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// Any non-negative integer value as u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v as i64),
            MetaValue::U16(v) => Some(v as i64),
            MetaValue::U32(v) => Some(v as i64),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any numeric value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor index.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Dimensions in ggml order: `dims[0]` is the fastest-varying (the row length).
    pub dims: Vec<u64>,
    /// Which file of a split model holds the data (0 for a single file).
    pub file: usize,
    /// Absolute byte offset of the data within that file.
    pub offset: u64,
    /// Byte size of the data.
    pub nbytes: u64,
}

impl GgufTensorInfo {
    /// Shape outermost first (numpy order), the reverse of `dims`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An opened GGUF model (one file, or all parts of a split model).
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<GgufTensorInfo>,
    maps: Vec<Arc<memmap2::Mmap>>,
    paths: Vec<PathBuf>,
    alignment: u64,
    data_offset: u64,
}

/// Maps a file read-only.
fn map_file(path: &Path) -> Result<Arc<memmap2::Mmap>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the mapping is read-only; model files are not modified while they are served
    // (the writer replaces files by rename, never in place).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Arc::new(map))
}

impl Gguf {
    /// Opens a GGUF file. A path named `*-00001-of-0000N.gguf` (any part) opens all N parts.
    pub fn open(path: &Path) -> Result<Gguf> {
        match split::split_name(path) {
            Some(name) => split::open_split(path, &name),
            None => {
                let map = map_file(path)?;
                let parsed = parse::parse(&map, path)?;
                split::check_not_split(path, &parsed)?;
                Ok(Gguf::from_parts(
                    path.to_path_buf(),
                    vec![(path.to_path_buf(), map, parsed)],
                ))
            }
        }
    }

    /// Parses a GGUF file held in memory (copied into an anonymous mapping); `path` only names
    /// it in errors. Split metadata is not followed.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Gguf> {
        let parsed = parse::parse(bytes, path)?;
        let mut anon =
            memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| Error::io(path, e))?;
        if let Some(dst) = anon.get_mut(..bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        let map = Arc::new(anon.make_read_only().map_err(|e| Error::io(path, e))?);
        Ok(Gguf::from_parts(
            path.to_path_buf(),
            vec![(path.to_path_buf(), map, parsed)],
        ))
    }

    /// Assembles a model from parsed parts (metadata, version and alignment from the first).
    fn from_parts(path: PathBuf, parts: Vec<(PathBuf, Arc<memmap2::Mmap>, parse::Parsed)>) -> Gguf {
        let mut g = Gguf {
            path,
            version: 0,
            metadata: Vec::new(),
            tensors: Vec::new(),
            maps: Vec::with_capacity(parts.len()),
            paths: Vec::with_capacity(parts.len()),
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
        };
        for (i, (p, map, parsed)) in parts.into_iter().enumerate() {
            if i == 0 {
                g.version = parsed.version;
                g.metadata = parsed.metadata;
                g.alignment = parsed.alignment;
                g.data_offset = parsed.data_offset;
            }
            g.tensors.extend(parsed.tensors.into_iter().map(|mut t| {
                t.file = i;
                t
            }));
            g.maps.push(map);
            g.paths.push(p);
        }
        g
    }

    /// The files of the model (one, or each part of a split model in order).
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The data alignment of the (first) file.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the tensor data section of the (first) file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A metadata value that must be a non-negative integer fitting in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u64().and_then(|v| u32::try_from(v).ok())
    }

    /// A metadata value that must be a non-negative integer.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// A numeric metadata value as f64.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An array-of-strings metadata value (`None` if absent or any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_str())
            .collect()
    }

    /// The tensor index, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's data, borrowed from the mapping (no copy).
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        let t = self.tensor_info(name)?;
        let data = Bytes::Mapped {
            map: self.maps.get(t.file)?.clone(),
            start: usize::try_from(t.offset).ok()?,
            len: usize::try_from(t.nbytes).ok()?,
        };
        Tensor::new(t.name.clone(), t.dtype, t.shape(), data).ok()
    }

    /// A tensor's raw bytes, borrowed from the mapping.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor_info(name)?;
        let start = usize::try_from(t.offset).ok()?;
        let end = start.checked_add(usize::try_from(t.nbytes).ok()?)?;
        self.maps.get(t.file)?.get(start..end)
    }
}
