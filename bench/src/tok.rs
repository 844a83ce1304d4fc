//! HF tokenizer files (tokenizer.json, tokenizer_config.json) from a GGUF's tokenizer metadata.

use memra_engine::error::Result;
use memra_engine::formats::gguf::Gguf;
use memra_engine::tokenizer::Tokenizer;

/// `tokenizer.json` text and `tokenizer_config.json` value for the tokenizer of `g`:
/// chat template, BOS/EOS/PAD/UNK token strings and `add_bos_token` from the GGUF metadata.
pub fn hf_tokenizer_files(g: &Gguf) -> Result<(String, serde_json::Value)> {
    let tok = Tokenizer::from_gguf(g)?;
    let json = tok.to_hf_json()?;
    let mut v = serde_json::json!({});
    if let Some(t) = g.get("tokenizer.chat_template").and_then(|t| t.as_str()) {
        v["chat_template"] = t.into();
    }
    let id = |k: &str| g.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
    for (key, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token"),
        ("tokenizer.ggml.eos_token_id", "eos_token"),
        ("tokenizer.ggml.padding_token_id", "pad_token"),
        ("tokenizer.ggml.unknown_token_id", "unk_token"),
    ] {
        if let Some(t) = id(key).and_then(|i| tok.token_text(i)) {
            v[field] = t.into();
        }
    }
    v["add_bos_token"] = tok.add_bos_default().into();
    v["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    Ok((json, v))
}
