//! memra-server: the OpenAI-compatible HTTP API over the engine's `submit -> EventStream` seam.
//!
//! Layout: `config` (every flag and env var), `engine` (the narrow trait the server needs from
//! the engine), `fake` (a scripted engine for tests), `validation` (JSON -> typed request),
//! `media` (images and video frames -> image tokens and embeddings), `openai` (response shapes), `tools` (tool-call formats), `errors` (the one error -> HTTP mapping), `auth` (keyring),
//! `cache_key` (the gateways' routing key), `metrics`, `sse`, `http` (listener, bodies, drain) and `routes`.

pub mod auth;
pub mod cache_key;
pub mod config;
pub mod engine;
pub mod errors;
#[cfg(feature = "test-util")]
pub mod fake;
pub mod fdlimit;
#[cfg(feature = "test-util")]
pub mod fuzz;
pub mod http;
pub mod keys;
pub mod media;
pub mod metrics;
pub mod openai;
pub mod real;
pub mod routes;
pub mod sse;
pub mod state;
pub mod tools;
pub mod validation;

pub use engine::{Generate, ModelText, ServedModel};
pub use http::serve;
pub use state::{Limits, State};
