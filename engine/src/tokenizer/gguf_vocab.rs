//! Building a `tokenizers` tokenizer from GGUF `tokenizer.ggml.*` metadata.
//!
//! - `gpt2`: byte-level BPE from `tokens` + `merges`, pre-tokenized as `tokenizer.ggml.pre` names.
//! - `llama`: SentencePiece-style vocabulary (`tokens` + `scores` + `token_type`) turned into a BPE
//!   whose merges come from the scores (as HF's slow->fast SentencePiece conversion does): every
//!   split `l + r` of a normal piece with both halves in the vocabulary is a merge, ranked by the
//!   piece's score (highest first), ties by the ids of `l` then `r`. `<0xNN>` tokens give byte
//!   fallback; spaces become `▁`, with a `▁` prepended to each run of text when add_space_prefix.
//!
//! Tokens of type CONTROL, USER_DEFINED or UNKNOWN are added tokens, matched whole in the input;
//! special except SentencePiece user-defined pieces, which are text (matched in user text too).

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::pretok;
use crate::error::{Error, Result};
use crate::formats::gguf::MetaValue;

/// GGUF token types (llama.cpp `llama_token_type`).
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_BYTE: i64 = 6;

/// At most this many tokens (the largest real vocabularies hold ~260k).
const MAX_TOKENS: usize = 4 << 20;

/// End-of-turn token strings that stop generation when present as special tokens.
pub(crate) const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
];

/// Everything read from the metadata that the engine-level tokenizer needs.
pub(crate) struct Built {
    pub inner: tokenizers::Tokenizer,
    pub vocab_size: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub stop_ids: Vec<u32>,
}

struct Meta<'a, F: Fn(&str) -> Option<&'a MetaValue>> {
    get: F,
}

impl<'a, F: Fn(&str) -> Option<&'a MetaValue>> Meta<'a, F> {
    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match (self.get)(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a string", v)),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match (self.get)(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a bool", v)),
        }
    }

    /// A token id, checked against the vocabulary size.
    fn token_id(&self, key: &str, n_vocab: usize) -> Result<Option<u32>> {
        let Some(v) = (self.get)(key) else {
            return Ok(None);
        };
        // Some converters write -1 (as a signed int) for "none".
        if v.as_i64() == Some(-1) {
            return Ok(None);
        }
        let id = v
            .as_u64()
            .ok_or_else(|| wrong_type(key, "an unsigned integer", v))?;
        match u32::try_from(id) {
            Ok(id) if (id as usize) < n_vocab => Ok(Some(id)),
            _ => Err(Error::Tokenizer(format!(
                "{key} = {id} is not a token id (vocabulary has {n_vocab} tokens)"
            ))),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [MetaValue]>> {
        match (self.get)(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array", v)),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(arr) = self.array(key)? else {
            return Ok(None);
        };
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| wrong_type(&format!("{key}[{i}]"), "a string", v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn wrong_type(key: &str, want: &str, got: &MetaValue) -> Error {
    let got = match got {
        MetaValue::Str(_) => "a string",
        MetaValue::Array(_) => "an array",
        MetaValue::Bool(_) => "a bool",
        MetaValue::F32(_) | MetaValue::F64(_) => "a float",
        _ => "an integer",
    };
    Error::Tokenizer(format!("metadata {key} must be {want}, found {got}"))
}

/// Builds the tokenizer from GGUF metadata looked up by `get`.
pub(crate) fn build<'a>(get: impl Fn(&str) -> Option<&'a MetaValue>) -> Result<Built> {
    let meta = Meta { get };
    let model = meta
        .str("tokenizer.ggml.model")?
        .ok_or_else(|| Error::Tokenizer("metadata tokenizer.ggml.model is missing".into()))?;
    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| Error::Tokenizer("metadata tokenizer.ggml.tokens is missing".into()))?;
    if tokens.is_empty() || tokens.len() > MAX_TOKENS {
        return Err(Error::Tokenizer(format!(
            "tokenizer.ggml.tokens holds {} tokens (expected 1..={MAX_TOKENS})",
            tokens.len()
        )));
    }
    let n = tokens.len();
    let types = token_types(&meta, n)?;
    let vocab = vocab_map(&tokens)?;

    let mut inner = match model {
        "gpt2" => byte_level_bpe(&meta, &vocab)?,
        "llama" => sentencepiece_bpe(&meta, &tokens, &types, &vocab)?,
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported tokenizer model {other:?} (tokenizer.ggml.model); supported: gpt2, llama"
            )));
        }
    };

    // SentencePiece user-defined pieces (Gemma's "\n\n", "  ", ...) are ordinary text, matched
    // whole even in user-written text (as SentencePiece and llama.cpp do): added, not special.
    let sp_user = |t: i64| model == "llama" && t == TYPE_USER_DEFINED;
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| matches!(**t, TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN))
        .filter(|(_, t)| !sp_user(**t))
        .map(|(tok, _)| AddedToken::from(tok.to_string(), true))
        .collect();
    inner
        .add_special_tokens(special)
        .map_err(|e| Error::Tokenizer(format!("adding special tokens: {e}")))?;
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| sp_user(**t))
        .map(|(tok, _)| AddedToken::from(tok.to_string(), false).normalized(false))
        .collect();
    inner
        .add_tokens(user)
        .map_err(|e| Error::Tokenizer(format!("adding user-defined tokens: {e}")))?;

    let bos = meta.token_id("tokenizer.ggml.bos_token_id", n)?;
    let eos = meta.token_id("tokenizer.ggml.eos_token_id", n)?;
    let mut stop_ids: Vec<u32> = eos.into_iter().collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        stop_ids.extend(meta.token_id(key, n)?);
    }
    for name in END_OF_TURN_TOKENS {
        if let Some(&id) = vocab.get(*name) {
            let ty = types.get(id as usize).copied().unwrap_or(TYPE_NORMAL);
            if matches!(ty, TYPE_CONTROL | TYPE_USER_DEFINED) {
                stop_ids.push(id);
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    stop_ids.retain(|id| seen.insert(*id));
    // Validate the remaining ids even though only BOS/EOS/EOT are used.
    for key in [
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
    ] {
        meta.token_id(key, n)?;
    }
    let add_bos = meta
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(model == "llama" && bos.is_some());
    if add_bos
        && let Some(id) = bos
        && let Some(text) = tokens.get(id as usize)
    {
        // For tokenizer.json consumers (GGUF -> HF conversion); `encode` adds BOS itself.
        inner.with_post_processor(Some(bos_post_processor(text, id)?));
    }
    Ok(Built {
        inner,
        vocab_size: n,
        bos,
        eos,
        add_bos,
        stop_ids,
    })
}

/// A TemplateProcessing post-processor that puts BOS before each sequence.
fn bos_post_processor(bos: &str, id: u32) -> Result<tokenizers::processors::PostProcessorWrapper> {
    let bos_piece = serde_json::json!({"SpecialToken": {"id": bos, "type_id": 0}});
    let seq =
        |s: &str, type_id: u32| serde_json::json!({"Sequence": {"id": s, "type_id": type_id}});
    let json = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [bos_piece, seq("A", 0)],
        "pair": [bos_piece, seq("A", 0), bos_piece, seq("B", 1)],
        "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}},
    });
    serde_json::from_value(json).map_err(|e| Error::Tokenizer(format!("BOS post-processor: {e}")))
}

fn token_types<'a, F: Fn(&str) -> Option<&'a MetaValue>>(
    meta: &Meta<'a, F>,
    n: usize,
) -> Result<Vec<i64>> {
    let key = "tokenizer.ggml.token_type";
    let Some(arr) = meta.array(key)? else {
        return Ok(vec![TYPE_NORMAL; n]);
    };
    if arr.len() != n {
        return Err(Error::Tokenizer(format!(
            "{key} has {} entries but tokenizer.ggml.tokens has {n}",
            arr.len()
        )));
    }
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_i64()
                .ok_or_else(|| wrong_type(&format!("{key}[{i}]"), "an integer", v))
        })
        .collect()
}

fn vocab_map(tokens: &[&str]) -> Result<Vocab> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        if let Some(first) = vocab.insert(tok.to_string(), id as u32) {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.tokens holds {tok:?} twice (ids {first} and {id})"
            )));
        }
    }
    Ok(vocab)
}

fn byte_level_bpe<'a, F: Fn(&str) -> Option<&'a MetaValue>>(
    meta: &Meta<'a, F>,
    vocab: &Vocab,
) -> Result<tokenizers::Tokenizer> {
    let key = "tokenizer.ggml.merges";
    let raw = meta
        .strings(key)?
        .ok_or_else(|| Error::Tokenizer(format!("metadata {key} is missing (gpt2 model)")))?;
    let mut merges: Merges = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        // The separator is the first space after the first character (a piece may be a space).
        let sep = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(at, _)| at);
        let (l, r) = match sep {
            Some(at) => (&m[..at], &m[at + 1..]),
            None => {
                return Err(Error::Tokenizer(format!(
                    "{key}[{i}] = {m:?} is not two tokens separated by a space"
                )));
            }
        };
        for part in [l, r] {
            if !vocab.contains_key(part) {
                return Err(Error::Tokenizer(format!(
                    "{key}[{i}] = {m:?} references unknown token {part:?}"
                )));
            }
        }
        if !vocab.contains_key(&format!("{l}{r}")) {
            return Err(Error::Tokenizer(format!(
                "{key}[{i}] = {m:?} merges into {:?}, which is not in the vocabulary",
                format!("{l}{r}")
            )));
        }
        merges.push((l.to_string(), r.to_string()));
    }
    let spec = pretok::spec_for(meta.str("tokenizer.ggml.pre")?)?;
    let model = BPE::builder()
        .vocab_and_merges(vocab.clone(), merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| Error::Tokenizer(format!("building byte-level BPE: {e}")))?;
    let mut pre: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))?;
        pre.push(PreTokenizerWrapper::Split(split));
    }
    pre.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreSequence::new(pre))));
    tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(tok)
}

fn sentencepiece_bpe<'a, F: Fn(&str) -> Option<&'a MetaValue>>(
    meta: &Meta<'a, F>,
    tokens: &[&str],
    types: &[i64],
    vocab: &Vocab,
) -> Result<tokenizers::Tokenizer> {
    let key = "tokenizer.ggml.scores";
    let scores_raw = meta
        .array(key)?
        .ok_or_else(|| Error::Tokenizer(format!("metadata {key} is missing (llama model)")))?;
    if scores_raw.len() != tokens.len() {
        return Err(Error::Tokenizer(format!(
            "{key} has {} entries but tokenizer.ggml.tokens has {}",
            scores_raw.len(),
            tokens.len()
        )));
    }
    let scores = scores_raw
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            MetaValue::F32(x) => Ok(f64::from(*x)),
            MetaValue::F64(x) => Ok(*x),
            _ => Err(wrong_type(&format!("{key}[{i}]"), "a float", v)),
        })
        .collect::<Result<Vec<f64>>>()?;
    let merges = merges_from_scores(tokens, types, &scores, vocab);
    let n = tokens.len();
    let unk = meta.token_id("tokenizer.ggml.unknown_token_id", n)?;
    let byte_fallback = types.contains(&TYPE_BYTE) || vocab.contains_key("<0x00>");
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.clone(), merges)
        .byte_fallback(byte_fallback)
        .fuse_unk(true);
    if let Some(unk) = unk.and_then(|id| tokens.get(id as usize)) {
        builder = builder.unk_token(unk.to_string());
    }
    let model = builder
        .build()
        .map_err(|e| Error::Tokenizer(format!("building SentencePiece BPE: {e}")))?;
    let add_space_prefix = meta
        .bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| Error::Tokenizer(format!("replace normalizer: {e}")))
    };
    let mut norm = Vec::new();
    if add_space_prefix {
        norm.push(NormalizerWrapper::Prepend(Prepend::new("▁".into())));
    }
    norm.push(NormalizerWrapper::Replace(replace(" ", "▁")?));
    let mut dec = vec![
        DecoderWrapper::Replace(replace("▁", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        dec.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_normalizer(Some(NormalizerWrapper::Sequence(NormSequence::new(norm))))
        .map_err(|e| Error::Tokenizer(format!("normalizer: {e}")))?;
    tok.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(dec))));
    Ok(tok)
}

/// Merges implied by SentencePiece scores: see the module doc.
fn merges_from_scores(tokens: &[&str], types: &[i64], scores: &[f64], vocab: &Vocab) -> Merges {
    let mut ranked: Vec<(f64, u32, u32)> = Vec::new();
    let is_piece = |id: u32| {
        matches!(
            types.get(id as usize).copied(),
            Some(TYPE_NORMAL | TYPE_USER_DEFINED)
        )
    };
    for (id, tok) in tokens.iter().enumerate() {
        if !is_piece(id as u32) {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(f64::NEG_INFINITY);
        for (at, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(at);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r))
                && is_piece(li)
                && is_piece(ri)
            {
                ranked.push((score, li, ri));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let name = |id: u32| tokens.get(id as usize).map(|s| s.to_string());
    ranked
        .into_iter()
        .filter_map(|(_, l, r)| Some((name(l)?, name(r)?)))
        .collect()
}
