//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The real SmolLM2-135M-Instruct GGUF (tools/fetch-models.sh puts it there; CI always fetches it).
pub fn real_model() -> PathBuf {
    let p = std::env::var_os("MEMRA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let dir = std::env::var_os("MEMRA_MODELS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/memra/models")
                });
            dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.exists(),
        "test model {} is missing: run tools/fetch-models.sh (tools/test.sh does)",
        p.display()
    );
    p
}

/// A path relative to the repository root.
pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}
