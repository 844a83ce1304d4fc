//! Tokenizer on the `tokenizers` crate: from tokenizer.json or built from GGUF metadata. Pending.
