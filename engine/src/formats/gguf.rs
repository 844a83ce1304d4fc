//! GGUF reader over mmap (versions 2 and 3, split files). Every size read from the file is checked.
//!
//! API contract (implementation pending): see the doc comments.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::quant::DType;
use crate::weights::{Bytes, Tensor};

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
}

impl Gguf {
    /// Opens a GGUF file. A path named `*-00001-of-0000N.gguf` opens all N parts.
    pub fn open(path: &Path) -> Result<Gguf> {
        let _ = (&path, &Error::Unsupported(String::new()));
        Err(Error::Unsupported("GGUF reader not implemented yet".into()))
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
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
            map: self.maps[t.file].clone(),
            start: t.offset as usize,
            len: t.nbytes as usize,
        };
        Tensor::new(t.name.clone(), t.dtype, t.shape(), data).ok()
    }
}
