//! Structured output on llguidance: a grammar (a JSON schema, any JSON object, or a Lark
//! grammar) compiled once per (grammar, tokenizer) and kept in a bounded cache
//! ([`Grammars`]); each constrained request walks its own copy ([`Constraint`]).
//!
//! Exactness (EXACTNESS.md): a row's mask is a function of the grammar and the tokens that row's
//! request generated, nothing else, so a constrained request gives the same bytes alone,
//! batched, chunked, prefix-cached and speculative. The engine applies the mask on the host
//! (`sampling::apply_mask`) before the keyed sampler picks.

mod cache;
mod tokenv;

use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

use cache::Lru;

/// Compiled grammars kept per model.
pub const CACHE_ENTRIES: usize = 64;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// JSON valid under this schema (`response_format: json_schema`, tool arguments).
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (`%json{...}` embeds a schema).
    Lark(String),
}

/// JSON is written compactly with a space after `,` and `:` (as models write it), with no
/// free whitespace a weak model could fill forever. A schema's own `x-guidance` wins.
pub fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ",
                "key_separator": ": "}),
        );
    }
    schema
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_layout(s.clone())),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }

    /// The cache key: the spec's canonical text.
    fn key(&self) -> String {
        match self {
            GrammarSpec::JsonObject => "object".into(),
            GrammarSpec::JsonSchema(s) => format!("schema:{s}"),
            GrammarSpec::Lark(g) => format!("lark:{g}"),
        }
    }
}

/// A compiled grammar: the matcher at its start, cloned for each request.
pub struct Grammar {
    start: Matcher,
    vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

impl Grammar {
    /// A fresh walk through the grammar for one request.
    pub fn start(&self) -> Constraint {
        Constraint {
            m: self.start.clone(),
            vocab: self.vocab,
        }
    }
}

/// The compiler and cache of one model's grammars.
pub struct Grammars {
    tok: Tokenizer,
    factory: OnceLock<std::result::Result<Arc<ParserFactory>, String>>,
    cache: Mutex<Lru<Arc<Grammar>>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

fn grammar_err(e: impl std::fmt::Display) -> Error {
    let mut m = e.to_string();
    if m.len() > 240 {
        let mut cut = 240;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
        m.push_str("...");
    }
    Error::Input(format!("the grammar does not compile: {m}"))
}

impl Grammars {
    pub fn new(tok: &Tokenizer) -> Grammars {
        Grammars {
            tok: tok.clone(),
            factory: OnceLock::new(),
            cache: Mutex::new(Lru::new(CACHE_ENTRIES)),
        }
    }

    /// The parser factory, built on first use (the token trie over the whole vocabulary).
    fn factory(&self) -> Result<&Arc<ParserFactory>> {
        self.factory
            .get_or_init(|| {
                let env = tokenv::tok_env(&self.tok);
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .as_ref()
            .map_err(|e| Error::Input(format!("structured output is unavailable: {e}")))
    }

    /// The compiled `spec`, from the cache or compiled now. A grammar llguidance cannot
    /// compile is an `Error::Input` naming the problem.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        let key = spec.key();
        if let Some(g) = self.cache.lock().ok().and_then(|mut c| c.get(&key)) {
            return Ok(g);
        }
        let factory = self.factory()?.clone();
        let top = spec.top_level();
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let m = Matcher::new(factory.create_parser(top));
            match m.get_error() {
                Some(e) => Err(e),
                None => Ok(m),
            }
        }));
        let start = match built {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(grammar_err(e)),
            Err(_) => return Err(grammar_err("the grammar compiler failed on it")),
        };
        let g = Arc::new(Grammar {
            start,
            vocab: self.tok.vocab_size(),
        });
        if let Ok(mut c) = self.cache.lock() {
            c.put(key, g.clone());
        }
        Ok(g)
    }

    /// Grammars in the cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// One request's position in its grammar.
pub struct Constraint {
    m: Matcher,
    vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

/// A vocabulary bitmask: bit `t % 32` of word `t / 32` allows token `t`.
pub type Mask = Vec<u32>;

/// Whether `mask` allows `token`.
pub fn allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|w| w >> (token % 32) & 1 == 1)
}

impl Constraint {
    /// The tokens allowed next: only the end-of-sequence ids once the grammar is complete.
    pub fn mask(&mut self) -> Result<Mask> {
        let v = self.m.compute_mask_or_eos().map_err(grammar_err)?;
        let mut words: Vec<u32> = v.as_slice().to_vec();
        words.resize(self.vocab.div_ceil(32), 0);
        Ok(words)
    }

    /// Moves past `token` (a token the last mask allowed).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.m
            .consume_token(token)
            .map_err(|e| Error::Input(format!("token {token} breaks the grammar: {e}")))
    }

    /// The masks of a row and of each drafted row after it: mask `j` is the one plain decoding
    /// would use after `drafts[..j]`. Where a draft is not allowed, the rows after it get the
    /// same mask as its own (their picks are never kept: acceptance stops at that draft).
    /// The constraint is back where it started afterwards.
    pub fn masks_along(&mut self, drafts: &[u32]) -> Result<Vec<Mask>> {
        let mut out = Vec::with_capacity(drafts.len() + 1);
        let mut walked = 0;
        let mut ok = true;
        for j in 0..=drafts.len() {
            if !ok {
                let last = out.last().cloned().unwrap_or_default();
                out.push(last);
                continue;
            }
            let mask = self.mask()?;
            ok = drafts
                .get(j)
                .is_some_and(|&d| allows(&mask, d) && !self.m.is_stopped())
                && self.m.consume_token(drafts[j]).is_ok();
            if ok {
                walked += 1;
            }
            out.push(mask);
        }
        if walked > 0 {
            self.m.rollback(walked).map_err(grammar_err)?;
        }
        Ok(out)
    }

    /// Whether the grammar is complete (only end of sequence may follow).
    pub fn is_done(&self) -> bool {
        self.m.is_stopped()
    }
}

#[cfg(test)]
mod tests;
