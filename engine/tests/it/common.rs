//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The real SmolLM2-135M-Instruct GGUF.
pub fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

/// A path relative to the repository root.
pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}
