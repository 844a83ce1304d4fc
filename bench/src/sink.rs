//! Where synthetic or converted tensors go: a GGUF file or an HF folder, tensor by tensor.

use std::path::Path;

use memra_engine::error::Result;
use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::{GgufDataWriter, GgufWriter};
use memra_engine::formats::safetensors::{HfFolderSpec, HfFolderWriter, TensorDecl};
use memra_engine::quant::DType;

/// A writer taking each declared tensor's bytes in declaration order.
pub trait TensorSink: Send {
    fn write_tensor(&mut self, bytes: &[u8]) -> Result<()>;
    fn finish(self: Box<Self>) -> Result<()>;
}

struct HfSink(HfFolderWriter);

impl TensorSink for HfSink {
    fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        self.0.write_tensor(bytes)
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.0.finish()
    }
}

/// An HF folder sink (into `OUT.tmp`, renamed on finish).
pub fn hf_sink(
    out: &Path,
    spec: &HfFolderSpec,
    decls: Vec<TensorDecl>,
) -> Result<Box<dyn TensorSink>> {
    Ok(Box::new(HfSink(HfFolderWriter::create(out, spec, decls)?)))
}

/// One tensor of a GGUF file to write: name, type, dims in ggml order.
#[derive(Clone, Debug)]
pub struct GgufDecl {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<u64>,
}

/// GGUF data alignment of synthetic and converted files (the format's default).
const ALIGNMENT: u32 = 32;

struct GgufSink(GgufDataWriter);

impl TensorSink for GgufSink {
    fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        self.0.write_tensor(bytes)
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.0.finish()
    }
}

/// A GGUF file sink declaring `meta` and `decls` (into `PATH.tmp`, renamed on finish).
pub fn gguf_sink(
    out: &Path,
    meta: Vec<(String, MetaValue)>,
    decls: &[GgufDecl],
) -> Result<Box<dyn TensorSink>> {
    let mut w = GgufWriter::new(ALIGNMENT);
    for (k, v) in meta {
        w.add_meta(k, v);
    }
    for d in decls {
        w.add_tensor(d.name.clone(), d.dtype, &d.dims)?;
    }
    Ok(Box::new(GgufSink(w.begin(out)?)))
}
