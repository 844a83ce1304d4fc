//! The engine's error type: every error a user can cause names the problem and where it is.

use std::path::PathBuf;

/// Result alias for the engine crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A GGUF file is malformed; `what` names the field, `offset` the byte position.
    #[error("invalid GGUF file {path}: {what} (at byte offset {offset})")]
    Gguf {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A safetensors file or HF folder is malformed.
    #[error("invalid safetensors model {path}: {what}")]
    Safetensors { path: PathBuf, what: String },
    /// Model configuration is missing a value or holds an unusable one.
    #[error("model config: {0}")]
    Config(String),
    /// Weights do not match what the architecture expects (missing tensor, wrong shape).
    #[error("model weights: {0}")]
    Weights(String),
    /// Block-format (quantization) errors: unsupported type, length not a multiple of the block.
    #[error("tensor data: {0}")]
    Quant(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    /// A request or command-line input is invalid.
    #[error("invalid input: {0}")]
    Input(String),
    /// A backend failed while running a step.
    #[error("backend {backend}: {what}")]
    Backend { backend: String, what: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl Error {
    /// An I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
