//! Byte-level BPE pre-tokenizers named by GGUF `tokenizer.ggml.pre`, as regex splits.
//!
//! The patterns follow llama.cpp's table (llama-vocab.cpp) for each name: each regex splits the
//! pieces left by the previous one, and both the matches and the gaps between them become pieces
//! (HF `Split` with the `Isolated` behaviour). Where llama.cpp rewrites a case-insensitive group by
//! hand, the original `(?i:...)` form from the model's tokenizer.json is used (same language).

use crate::error::{Error, Result};

/// GPT-2's pattern (with the trailing `\s+` of HF's ByteLevel; llama.cpp leaves that gap unmatched,
/// which gives the same pieces).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3: digits in groups of up to three, a non-letter may lead a word, newlines kept together.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: as Llama 3 but single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Every digit on its own (the first split of `smollm`, `starcoder`, ...).
const DIGIT: &str = r"\p{N}";

/// How one named pre-tokenizer splits text before BPE.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in order, each splitting the pieces of the previous (isolated).
    pub regexes: &'static [&'static str],
    /// Whole pre-tokenized words found in the vocabulary skip the merges (Llama 3).
    pub ignore_merges: bool,
}

const SMOLLM_FAMILY: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];
const GPT2_FAMILY: &[&str] = &[
    "gpt2",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "jina-v1-en",
    "jina-v2-es",
    "jina-v2-de",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "granite-docling",
];
const LLAMA3_FAMILY: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
];
const LLAMA3_REGEX_ONLY: &[&str] = &["dbrx", "smaug-bpe"];
const QWEN2_FAMILY: &[&str] = &[
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "hunyuan",
    "megrez",
];

/// The pre-tokenizer for a `tokenizer.ggml.pre` name (`None`: the key is absent).
pub(crate) fn spec_for(pre: Option<&str>) -> Result<PreTokenizerSpec> {
    let spec = |regexes, ignore_merges| PreTokenizerSpec {
        regexes,
        ignore_merges,
    };
    let name = match pre {
        None | Some("default") => {
            // llama.cpp's fallback for byte-level vocabularies without a known pre-tokenizer.
            return Ok(spec(
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
                false,
            ));
        }
        Some(name) => name,
    };
    if SMOLLM_FAMILY.contains(&name) {
        Ok(spec(&[DIGIT, GPT2], false))
    } else if GPT2_FAMILY.contains(&name) {
        Ok(spec(&[GPT2], false))
    } else if LLAMA3_FAMILY.contains(&name) {
        Ok(spec(&[LLAMA3], true))
    } else if LLAMA3_REGEX_ONLY.contains(&name) {
        Ok(spec(&[LLAMA3], false))
    } else if QWEN2_FAMILY.contains(&name) {
        Ok(spec(&[QWEN2], false))
    } else {
        let known: Vec<&str> = [
            SMOLLM_FAMILY,
            GPT2_FAMILY,
            LLAMA3_FAMILY,
            LLAMA3_REGEX_ONLY,
            QWEN2_FAMILY,
        ]
        .concat();
        Err(Error::Tokenizer(format!(
            "unsupported pre-tokenizer {name:?} (tokenizer.ggml.pre); supported: default, {}",
            known.join(", ")
        )))
    }
}
