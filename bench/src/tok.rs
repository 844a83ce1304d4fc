//! HF tokenizer files (tokenizer.json, tokenizer_config.json) from a GGUF's tokenizer metadata.

use memra_engine::error::{Error, Result};
use memra_engine::formats::gguf::Gguf;

/// `tokenizer.json` text and `tokenizer_config.json` value for the tokenizer of `g`.
pub fn hf_tokenizer_files(g: &Gguf) -> Result<(String, serde_json::Value)> {
    let _ = g;
    Err(Error::Unsupported(
        "the tokenizer has not landed yet".into(),
    ))
}
