//! memra-engine: model formats, tokenizer, chat templates, the CPU reference backend and sampling.

pub mod backend;
pub mod chat;
mod chat_const;
mod chat_guard;
pub mod config;
pub mod engine;
pub mod error;
pub mod formats;
pub mod generate;
pub mod grammar;
pub mod kv;
pub mod kv_format;
pub mod loader;
pub mod models;
pub mod ops;
pub mod pipeline;
pub mod prefix_cache;
pub mod quant;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod settings;
pub mod spec;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod tokenizer;
pub mod vision;
pub mod weights;

pub use error::{Error, Result};
