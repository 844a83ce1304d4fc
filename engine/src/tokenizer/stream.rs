//! Incremental detokenization that never emits part of a character.
//!
//! The decoder keeps a window of ids: the last emitted token (context, so that decoders that strip
//! or join across tokens, like SentencePiece's leading `▁`, see their neighbour) and the tokens not
//! yet emitted. After each push it decodes the window; when the text grows past the context's text
//! and does not end in U+FFFD (an incomplete UTF-8 sequence decodes to it), the new part is emitted.
//! A byte-level or `<0xNN>` token that cuts a character is therefore held back until the character
//! is complete. `finish` flushes what is left, lossily.

use std::sync::Arc;

use super::Tokenizer;
use crate::error::{Error, Result};

/// Tokens held back beyond which the text is emitted even if it ends in U+FFFD (a UTF-8
/// character spans at most 4 byte tokens; more means the text itself holds U+FFFD).
const MAX_PENDING: usize = 8;

/// Streams text for ids generated one at a time.
pub struct StreamDecoder {
    tok: Arc<tokenizers::Tokenizer>,
    vocab_size: usize,
    /// Context token(s) followed by pending tokens.
    window: Vec<u32>,
    /// How many ids at the start of `window` were already emitted.
    context: usize,
    /// Decoded text of the context ids.
    context_text: String,
}

impl StreamDecoder {
    pub fn new(tok: &Tokenizer) -> Self {
        StreamDecoder {
            tok: tok.inner().clone(),
            vocab_size: tok.vocab_size(),
            window: Vec::new(),
            context: 0,
            context_text: String::new(),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tok
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    /// Adds one id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        if id as usize >= self.vocab_size {
            return Err(Error::Tokenizer(format!(
                "token id {id} is out of range (vocabulary has {} tokens)",
                self.vocab_size
            )));
        }
        self.window.push(id);
        let text = self.decode(&self.window)?;
        let pending = self.window.len() - self.context;
        let forced = pending >= MAX_PENDING;
        if !forced && (text.ends_with('\u{FFFD}') || text.len() <= self.context_text.len()) {
            return Ok(String::new());
        }
        let new = suffix_after(&text, &self.context_text);
        // Keep the last token as context for the next step.
        let keep = self.window.len() - 1;
        self.window.drain(..keep);
        self.context = 1;
        self.context_text = self.decode(&self.window)?;
        Ok(new)
    }

    /// Flushes the pending text (lossy: an unfinished character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let out = if self.window.len() > self.context {
            match self.decode(&self.window) {
                Ok(text) => suffix_after(&text, &self.context_text),
                Err(_) => String::new(),
            }
        } else {
            String::new()
        };
        self.window.clear();
        self.context = 0;
        self.context_text.clear();
        out
    }
}

/// `text` minus `prefix`; if `text` does not start with it, minus their common prefix.
fn suffix_after(text: &str, prefix: &str) -> String {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest.to_string();
    }
    let common = text
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map(|((at, _), _)| at)
        .unwrap_or_else(|| text.len().min(prefix.len()));
    text.get(common..).unwrap_or_default().to_string()
}
