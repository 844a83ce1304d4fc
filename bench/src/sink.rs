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

/// The HF tensors of one 2-D matrix `name` of type `dtype`: the matrix itself, or for the
/// checkpoint types the codes and their scales (an HF `fp8` checkpoint: `weight` F8_E4M3 and
/// `weight_scale_inv` per 128 x 128 block; ModelOpt NVFP4: `weight` U8 pairs, `weight_scale`
/// F8_E4M3 per 16, `weight_scale_2` and `input_scale` F32), in the order [`checkpoint_bytes`]
/// (crate::generate) concatenates them.
pub fn matrix_decls(name: String, dtype: DType, shape: Vec<usize>) -> Vec<TensorDecl> {
    let stem = name.strip_suffix(".weight").unwrap_or(&name).to_string();
    let nk = match shape[..] {
        [n, k] => Some((n, k)),
        _ => None,
    };
    match (dtype, nk) {
        (DType::FP8, Some((n, k))) => vec![
            TensorDecl::raw_bytes(name, "F8_E4M3", shape),
            TensorDecl::new(
                format!("{stem}.weight_scale_inv"),
                DType::F32,
                vec![n.div_ceil(FP8_CKPT_BLOCK), k.div_ceil(FP8_CKPT_BLOCK)],
            ),
        ],
        (DType::NVFP4, Some((n, k))) => vec![
            TensorDecl::raw_bytes(name, "U8", vec![n, k / 2]),
            TensorDecl::raw_bytes(format!("{stem}.weight_scale"), "F8_E4M3", vec![n, k / 16]),
            TensorDecl::new(format!("{stem}.weight_scale_2"), DType::F32, vec![]),
            TensorDecl::new(format!("{stem}.input_scale"), DType::F32, vec![]),
        ],
        _ => vec![TensorDecl::new(name, dtype, shape)],
    }
}

/// The block of an HF `fp8` checkpoint's `weight_block_size` that synth and convert write.
pub const FP8_CKPT_BLOCK: usize = 128;

/// The HF declarations of tensors given as (role, architecture, type, shape): one per tensor,
/// except an expert stack `[n, rows, cols]`, which HF holds as `n` tensors `[rows, cols]`
/// (`...experts.{e}...`), and the checkpoint types, whose matrices come with their scales
/// ([`matrix_decls`]). Also returns each tensor's HF parts (their byte sizes), for
/// [`split_sink`].
pub fn hf_decls(
    tensors: impl Iterator<Item = (Role, Arch, DType, Vec<usize>)>,
) -> Result<(Vec<TensorDecl>, Vec<Vec<u64>>)> {
    let (mut decls, mut parts) = (Vec::new(), Vec::new());
    for (role, arch, dtype, shape) in tensors {
        let name = role.hf_name(arch);
        let mine = match (role.is_experts(), shape.split_first()) {
            (true, Some((&n, inner))) => (0..n)
                .flat_map(|e| matrix_decls(expert_name(&name, e), dtype, inner.to_vec()))
                .collect(),
            _ => matrix_decls(name, dtype, shape),
        };
        let sizes = mine
            .iter()
            .map(|d| d.nbytes())
            .collect::<Result<Vec<u64>>>()?;
        decls.extend(mine);
        parts.push(sizes);
    }
    Ok((decls, parts))
}

/// Takes tensor i as one buffer and writes it to `inner` as the consecutive tensors of
/// `parts[i]` bytes each (an expert stack as one tensor per expert, a quantized matrix as its
/// codes and scales).
struct SplitSink {
    inner: Box<dyn TensorSink>,
    parts: std::vec::IntoIter<Vec<u64>>,
}

impl TensorSink for SplitSink {
    fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let sizes = self
            .parts
            .next()
            .unwrap_or_else(|| vec![bytes.len() as u64]);
        if sizes.iter().sum::<u64>() != bytes.len() as u64 {
            return Err(Error::Input(format!(
                "{} bytes do not split into HF tensors of {sizes:?} bytes",
                bytes.len()
            )));
        }
        let mut at = 0usize;
        for n in sizes {
            let end = at + n as usize;
            self.inner.write_tensor(&bytes[at..end])?;
            at = end;
        }
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.inner.finish()
    }
}

/// Wraps `inner` so that tensor i is split into the HF tensors of `parts[i]` (see [`hf_decls`]).
pub fn split_sink(inner: Box<dyn TensorSink>, parts: Vec<Vec<u64>>) -> Box<dyn TensorSink> {
    Box::new(SplitSink {
        inner,
        parts: parts.into_iter(),
    })
}
