//! The token environment llguidance needs, built from memra's own tokenizer: every id's raw
//! bytes (special tokens as `0xFF` + their text, so grammar text can never produce them) and the
//! model's end-of-sequence ids (EOS plus end-of-turn), which the grammar allows once it is
//! complete.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

struct MemraTokEnv {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for MemraTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text as the tokenizer encodes it (special-token text stays text); bytes that are not
    /// UTF-8, or a tokenizer failure, fall back to the trie's greedy tokenization.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        std::str::from_utf8(s)
            .ok()
            .and_then(|t| self.tok.encode_plain(t).ok())
            .unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }

    /// Masks are all memra uses; forced-token shortcuts are never taken.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The llguidance environment of `tok`.
pub(crate) fn tok_env(tok: &Tokenizer) -> TokEnv {
    let n = tok.vocab_size();
    let special = tok.special_ids();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            if special.binary_search(&id).is_ok() {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend(tok.token_text(id).unwrap_or_default().into_bytes());
                w
            } else {
                tok.token_bytes(id).unwrap_or_default()
            }
        })
        .collect();
    let stops = tok.stop_ids().to_vec();
    let eos = tok.eos_id().or_else(|| stops.first().copied()).unwrap_or(0);
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_bos = tok.bos_id();
    let mut trie = TokTrie::from(&info, &words);
    if !stops.is_empty() {
        trie = trie.with_eos_tokens(&stops);
    }
    Arc::new(MemraTokEnv {
        trie,
        tok: tok.clone(),
    })
}
