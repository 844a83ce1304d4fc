//! Where synthetic or converted tensors go: a GGUF file or an HF folder, tensor by tensor.

use std::path::Path;

use memra_engine::config::Arch;
use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::{GgufDataWriter, GgufWriter};
use memra_engine::formats::safetensors::{HfFolderSpec, HfFolderWriter, TensorDecl};
use memra_engine::models::Role;
use memra_engine::models::roles::expert_name;
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

/// The HF declarations of tensors given as (role, architecture, type, shape): one per tensor,
/// except an expert stack `[n, rows, cols]`, which HF holds as `n` tensors `[rows, cols]`
/// (`...experts.{e}...`). Also returns each tensor's number of HF parts, for [`split_sink`].
pub fn hf_decls(
    tensors: impl Iterator<Item = (Role, Arch, DType, Vec<usize>)>,
) -> (Vec<TensorDecl>, Vec<usize>) {
    let (mut decls, mut parts) = (Vec::new(), Vec::new());
    for (role, arch, dtype, shape) in tensors {
        let name = role.hf_name(arch);
        match (role.is_experts(), shape.split_first()) {
            (true, Some((&n, inner))) => {
                for e in 0..n {
                    decls.push(TensorDecl::new(
                        expert_name(&name, e),
                        dtype,
                        inner.to_vec(),
                    ));
                }
                parts.push(n);
            }
            _ => {
                decls.push(TensorDecl::new(name, dtype, shape));
                parts.push(1);
            }
        }
    }
    (decls, parts)
}

/// Takes tensor i as one buffer and writes it to `inner` as `parts[i]` equal consecutive
/// tensors (an expert stack as one tensor per expert).
struct SplitSink {
    inner: Box<dyn TensorSink>,
    parts: std::vec::IntoIter<usize>,
}

impl TensorSink for SplitSink {
    fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let n = self.parts.next().unwrap_or(1).max(1);
        if !bytes.len().is_multiple_of(n) {
            return Err(Error::Input(format!(
                "{} bytes do not split into {n} experts",
                bytes.len()
            )));
        }
        let per = bytes.len() / n;
        (0..n).try_for_each(|i| self.inner.write_tensor(&bytes[i * per..(i + 1) * per]))
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.inner.finish()
    }
}

/// Wraps `inner` so that tensor i is split into `parts[i]` tensors (see [`hf_decls`]).
pub fn split_sink(inner: Box<dyn TensorSink>, parts: Vec<usize>) -> Box<dyn TensorSink> {
    Box::new(SplitSink {
        inner,
        parts: parts.into_iter(),
    })
}
