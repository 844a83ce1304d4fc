//! Tokenizer on the `tokenizers` crate: from tokenizer.json (+ tokenizer_config.json) or built from
//! GGUF `tokenizer.ggml.*` metadata (see `gguf_vocab`).
//!
//! - `encode` parses special tokens written in the text (`<|im_start|>` becomes one id) and adds
//!   BOS only when asked (never through the tokenizer.json post-processor).
//! - `decode` skips nothing: special tokens are rendered as their text (`<|im_end|>`); ids outside
//!   the vocabulary are an error. Invalid UTF-8 (a character cut by the end of the ids) decodes
//!   lossily to U+FFFD.
//! - `StreamDecoder` (module `stream`) emits only complete characters while streaming.

mod bytes;
mod gguf_vocab;
mod pretok;
mod stream;

use std::path::Path;
use std::sync::Arc;

pub use stream::StreamDecoder;

use crate::error::{Error, Result};
use crate::formats::gguf::{Gguf, MetaValue};

/// A text <-> token id mapping with the model's special ids.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// `inner` with special tokens encoded as plain text (for user-written message contents).
    plain: Arc<tokenizers::Tokenizer>,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

/// A copy of `t` that encodes special-token text (`<|im_start|>`) as ordinary text.
fn plain_of(t: &tokenizers::Tokenizer) -> tokenizers::Tokenizer {
    let mut p = t.clone();
    p.set_encode_special_tokens(true);
    p
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{what}: {e}"))
}

impl Tokenizer {
    /// Loads tokenizer.json; BOS/EOS/add_bos come from tokenizer_config.json when given, else from
    /// well-known special token names and the post-processor.
    pub fn from_hf_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Tokenizer> {
        let bytes = std::fs::read(tokenizer_json).map_err(|e| Error::io(tokenizer_json, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| tok_err(&tokenizer_json.display().to_string(), e))?;
        let config = match tokenizer_config_json {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| tok_err(&p.display().to_string(), e))?;
                Some(v)
            }
            None => None,
        };
        Self::from_hf_parts(inner, config.as_ref())
    }

    fn from_hf_parts(
        inner: tokenizers::Tokenizer,
        config: Option<&serde_json::Value>,
    ) -> Result<Tokenizer> {
        let vocab_size = inner.get_vocab_size(true);
        let lookup = |field: &str| -> Result<Option<u32>> {
            let Some(v) = config.and_then(|c| c.get(field)) else {
                return Ok(None);
            };
            let name = match v {
                serde_json::Value::Null => return Ok(None),
                serde_json::Value::String(s) => s.as_str(),
                serde_json::Value::Object(o) => match o.get("content") {
                    Some(serde_json::Value::String(s)) => s.as_str(),
                    _ => {
                        return Err(Error::Tokenizer(format!(
                            "tokenizer_config.json {field} has no string \"content\""
                        )));
                    }
                },
                _ => {
                    return Err(Error::Tokenizer(format!(
                        "tokenizer_config.json {field} must be a string or an object"
                    )));
                }
            };
            inner.token_to_id(name).map(Some).ok_or_else(|| {
                Error::Tokenizer(format!(
                    "tokenizer_config.json {field} {name:?} is not in the vocabulary"
                ))
            })
        };
        let first_known = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let bos = match lookup("bos_token")? {
            Some(id) => Some(id),
            None if config.is_some_and(|c| c.get("bos_token").is_some()) => None,
            None => first_known(&["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"]),
        };
        let eos = match lookup("eos_token")? {
            Some(id) => Some(id),
            None => first_known(&["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"]),
        };
        let add_bos = match config.and_then(|c| c.get("add_bos_token")) {
            Some(serde_json::Value::Bool(b)) => *b,
            _ => {
                // Does the post-processor add BOS?
                let with = inner
                    .encode_fast("a", true)
                    .map_err(|e| tok_err("encode", e))?;
                bos.is_some() && with.get_ids().first().copied() == bos
            }
        };
        let added = inner.get_added_tokens_decoder();
        let mut stop_ids: Vec<u32> = eos.into_iter().collect();
        for name in gguf_vocab::END_OF_TURN_TOKENS {
            if let Some(id) = inner.token_to_id(name)
                && added.get(&id).is_some_and(|t| t.special)
                && !stop_ids.contains(&id)
            {
                stop_ids.push(id);
            }
        }
        Ok(Tokenizer {
            plain: Arc::new(plain_of(&inner)),
            inner: Arc::new(inner),
            vocab_size,
            bos,
            eos,
            add_bos,
            stop_ids,
        })
    }

    /// Builds the tokenizer from an opened GGUF file's metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        Self::from_gguf_metadata(|k| g.get(k))
    }

    /// Builds the tokenizer from GGUF metadata looked up by key (tests pass hand-made metadata).
    pub fn from_gguf_metadata<'a>(
        get: impl Fn(&str) -> Option<&'a MetaValue>,
    ) -> Result<Tokenizer> {
        let b = gguf_vocab::build(get)?;
        Ok(Tokenizer {
            plain: Arc::new(plain_of(&b.inner)),
            inner: Arc::new(b.inner),
            vocab_size: b.vocab_size,
            bos: b.bos,
            eos: b.eos,
            add_bos: b.add_bos,
            stop_ids: b.stop_ids,
        })
    }

    /// Token ids for `text`; special tokens written in the text are matched whole.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| tok_err("encode", e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos {
            let bos = self.bos.ok_or_else(|| {
                Error::Tokenizer("BOS requested but the tokenizer has no BOS token".into())
            })?;
            ids.push(bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Token ids for `text` with special-token text encoded as ordinary text: what a user wrote
    /// can never become a control token.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .plain
            .encode_fast(text, false)
            .map_err(|e| tok_err("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids for a rendered chat prompt: the template's own markup with special tokens
    /// parsed, each of `contents` (found in order in `rendered`) as plain text
    /// ([`Tokenizer::encode_plain`]). A content the template changed (so it is not found as
    /// written) is looked for trimmed; one not found even then is left to the markup (special
    /// tokens parsed), as with templates that rewrite message text.
    pub fn encode_chat(&self, rendered: &str, contents: &[&str]) -> Result<Vec<u32>> {
        Ok(self.encode_chat_split(rendered, contents, None)?.0)
    }

    /// [`Tokenizer::encode_chat`] for contents holding media markers: each content is split at
    /// `marker` and its pieces are encoded as plain text; returns the ids and, per marker in
    /// order, the index in the ids where the media goes. A marker the template dropped is not
    /// counted (the caller checks the count).
    pub fn encode_chat_media(
        &self,
        rendered: &str,
        contents: &[&str],
        marker: &str,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        self.encode_chat_split(rendered, contents, Some(marker))
    }

    /// Both of the above: the contents split at `marker` when there is one.
    fn encode_chat_split(
        &self,
        rendered: &str,
        contents: &[&str],
        marker: Option<&str>,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        let (mut ids, mut at_media) = (Vec::new(), Vec::new());
        let mut at = 0usize;
        for c in contents {
            let c = if rendered[at..].contains(*c) {
                *c
            } else {
                c.trim()
            };
            if c.is_empty() {
                continue;
            }
            let Some(off) = rendered[at..].find(c) else {
                continue;
            };
            ids.extend(self.encode(&rendered[at..at + off], false)?);
            let pieces: Vec<&str> = match marker {
                Some(m) => c.split(m).collect(),
                None => vec![c],
            };
            for (k, piece) in pieces.into_iter().enumerate() {
                if k > 0 {
                    at_media.push(ids.len());
                }
                if !piece.is_empty() {
                    ids.extend(self.encode_plain(piece)?);
                }
            }
            at += off + c.len();
        }
        ids.extend(self.encode(&rendered[at..], false)?);
        Ok((ids, at_media))
    }

    /// The id of a vocabulary entry spelled exactly `piece` (special tokens included).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// Text for `ids`, special tokens included as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Error::Tokenizer(format!(
                "token id {bad} is out of range (vocabulary has {} tokens)",
                self.vocab_size
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err("decode", e))
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether prompts should start with BOS (GGUF add_bos_token / HF config or post-processor).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// EOS plus the end-of-turn special tokens present in the vocabulary, without duplicates.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The vocabulary entry for `id` as stored (byte-level pieces keep their `Ġ` form); for
    /// special tokens this is their text, e.g. BOS/EOS strings for chat templates.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The raw bytes `id` adds to the output (not UTF-8 on their own when the token holds part of
    /// a character); `None` outside the vocabulary. For logprobs: OpenAI's `bytes`.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        bytes::token_bytes(&self.inner, id)
    }

    /// tokenizer.json content for this tokenizer (BOS is not added by a post-processor: add_bos
    /// belongs in tokenizer_config.json).
    pub fn to_hf_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| tok_err("serializing tokenizer.json", e))
    }

    /// The added tokens marked special (`<|im_end|>`): control tokens, never produced by
    /// ordinary text. Ascending.
    pub fn special_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn inner(&self) -> &Arc<tokenizers::Tokenizer> {
        &self.inner
    }
}
