//! `memra-verify inspect FILE`: validates a model file or folder the way the engine loads it
//! (header, metadata, every tensor's bounds, dtype and shape, the config, the tokenizer and the
//! chat template) and prints a summary. With `scan`, every tensor is also decoded row by row and
//! its non-finite values are counted (slow on large files). Any problem is an error naming it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use memra_engine::chat::ChatMessage;
use memra_engine::loader::load_model;
use memra_engine::quant::dequantize_row;
use memra_engine::weights::Tensor;
use memra_engine::{Error, Result};

/// What a valid model holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub format: &'static str,
    pub arch: String,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context: usize,
    pub tensors: usize,
    pub params: u64,
    pub weight_bytes: u64,
    /// Tensors per weight type.
    pub dtypes: BTreeMap<String, usize>,
    pub tokenizer_vocab: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Whether a sample text decodes back to itself.
    pub tokenizer_round_trip: bool,
    /// Tokens of a rendered sample conversation, when the model has a chat template.
    pub chat_template_tokens: Option<usize>,
    /// Non-finite values found by the scan (`None`: not scanned).
    pub non_finite: Option<u64>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self;
        writeln!(f, "format        {} ({})", s.format, s.arch)?;
        writeln!(
            f,
            "shape         {} layers, hidden {}, {} heads / {} KV heads x {}, ffn {}",
            s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn
        )?;
        writeln!(
            f,
            "vocab         {} (tokenizer {})",
            s.vocab, s.tokenizer_vocab
        )?;
        writeln!(f, "context       {}", s.context)?;
        let types: Vec<String> = s.dtypes.iter().map(|(k, v)| format!("{k} x{v}")).collect();
        writeln!(
            f,
            "tensors       {} ({:.3} B parameters, {:.2} GB): {}",
            s.tensors,
            s.params as f64 / 1e9,
            s.weight_bytes as f64 / 1e9,
            types.join(", ")
        )?;
        let id = |v: Option<u32>| v.map_or("none".into(), |v| v.to_string());
        writeln!(
            f,
            "tokens        bos {}, eos {}; sample text round trip: {}",
            id(s.bos),
            id(s.eos),
            if s.tokenizer_round_trip {
                "exact"
            } else {
                "differs"
            }
        )?;
        match s.chat_template_tokens {
            Some(n) => writeln!(
                f,
                "chat template renders a sample conversation ({n} tokens)"
            )?,
            None => writeln!(f, "chat template none")?,
        }
        if let Some(n) = s.non_finite {
            writeln!(
                f,
                "scan          every tensor decoded: {n} non-finite values"
            )?;
        }
        Ok(())
    }
}

/// Non-finite values of `t`, decoded row by row.
fn non_finite(t: &Tensor) -> Result<u64> {
    let cols = *t.shape.last().unwrap_or(&1);
    let rows = t.numel() / cols.max(1);
    let rb = t.dtype.bytes_for(cols as u64).ok_or_else(|| {
        Error::Weights(format!("{}: {} columns are not whole blocks", t.name, cols))
    })? as usize;
    let bytes: &[u8] = &t.data;
    let mut row = vec![0f32; cols];
    let mut n = 0u64;
    for r in 0..rows {
        let src = bytes
            .get(r * rb..(r + 1) * rb)
            .ok_or_else(|| Error::Weights(format!("{}: row {r} is past its data", t.name)))?;
        dequantize_row(t.dtype, src, &mut row)?;
        n += row.iter().filter(|x| !x.is_finite()).count() as u64;
    }
    Ok(n)
}

/// Loads and checks `path`; `scan` also decodes every tensor.
pub fn inspect(path: &Path, scan: bool) -> Result<Summary> {
    let m = load_model(path)?;
    let c = &m.config;
    c.validate()?;
    let mut dtypes = BTreeMap::new();
    let (mut params, mut bytes, mut tensors) = (0u64, 0u64, 0usize);
    let mut bad = 0u64;
    for (_, t) in m.weights.iter() {
        let need = t.dtype.bytes_for(t.numel() as u64);
        if need != Some(t.data.len() as u64) {
            return Err(Error::Weights(format!(
                "{}: {} bytes for {:?} {} values",
                t.name,
                t.data.len(),
                t.dtype,
                t.numel()
            )));
        }
        *dtypes.entry(t.dtype.name().to_string()).or_insert(0) += 1;
        params += t.numel() as u64;
        bytes += t.data.len() as u64;
        tensors += 1;
        if scan {
            bad += non_finite(t)?;
        }
    }
    let tok = &m.tokenizer;
    let sample = "Hello, world! 123 ünïcode: 日本語 🦀";
    let ids = tok.encode(sample, false)?;
    if let Some(&bad_id) = ids.iter().find(|&&i| i as usize >= c.vocab) {
        return Err(Error::Tokenizer(format!(
            "the tokenizer gives id {bad_id}, outside the model's {} embeddings",
            c.vocab
        )));
    }
    let round_trip = tok.decode(&ids)? == sample;
    let chat_template_tokens = match &m.chat {
        Some(t) => {
            let msgs = [
                ChatMessage::new("system", "You are a helpful assistant."),
                ChatMessage::new("user", "What is the capital of France?"),
            ];
            let text = t
                .render(&msgs, true)
                .map_err(|e| Error::Input(format!("the chat template: {e}")))?;
            Some(tok.encode(&text, false)?.len())
        }
        None => None,
    };
    Ok(Summary {
        format: if path.is_dir() {
            "HF safetensors"
        } else {
            "GGUF"
        },
        arch: format!("{:?}", c.arch),
        layers: c.n_layers,
        hidden: c.hidden,
        heads: c.n_heads,
        kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        ffn: c.ffn,
        vocab: c.vocab,
        context: c.max_ctx,
        tensors,
        params,
        weight_bytes: bytes,
        dtypes,
        tokenizer_vocab: tok.vocab_size(),
        bos: tok.bos_id(),
        eos: tok.eos_id(),
        tokenizer_round_trip: round_trip,
        chat_template_tokens,
        non_finite: scan.then_some(bad),
    })
}
