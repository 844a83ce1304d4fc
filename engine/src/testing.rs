//! Helpers shared by the test suites of every crate (the binaries never call them).

use std::path::PathBuf;

pub mod fuzz;
pub mod quant_folder;
pub mod tiny_gguf;

/// File name of the default real model (tools/fetch-models.sh).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The real SmolLM2-135M-Instruct GGUF: `MEMRA_TEST_MODEL`, else `$MEMRA_MODELS_DIR/…`, else
/// `~/.cache/memra/models/…`. Panics with the fix (run tools/fetch-models.sh) when it is missing,
/// so a test that needs it fails loudly instead of skipping; CI always fetches it.
pub fn real_model() -> PathBuf {
    let p = crate::settings::var_os("MEMRA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::settings::models_dir().join(DEFAULT_MODEL_FILE));
    assert!(
        p.exists(),
        "test model {} is missing: run tools/fetch-models.sh (tools/test.sh does), or set MEMRA_TEST_MODEL",
        p.display()
    );
    p
}
