//! Adapter to the engine's streaming GGUF writer.

use std::path::Path;

use memra_engine::error::Result;
use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::{GgufDataWriter, GgufWriter};

use crate::sink::{GgufDecl, TensorSink};

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

/// Declares `meta` and `decls` and opens `out` (as `out.tmp` until finished).
pub fn create(
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
