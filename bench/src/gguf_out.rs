//! Adapter to the engine's streaming GGUF writer.

use std::path::Path;

use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::MetaValue;

use crate::sink::{GgufDecl, TensorSink};

pub fn create(
    out: &Path,
    meta: Vec<(String, MetaValue)>,
    decls: &[GgufDecl],
) -> Result<Box<dyn TensorSink>> {
    let _ = (out, meta, decls);
    Err(Error::Unsupported(
        "the GGUF writer has not landed yet".into(),
    ))
}
