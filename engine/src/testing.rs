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

/// A CPU backend over `w` with a small KV pool (2 threads, 64 blocks of 4 positions): the
/// speculation tests' backend.
pub fn small_cpu(w: crate::models::ModelWeights) -> crate::backend::cpu::CpuBackend {
    let opts = crate::backend::cpu::CpuOptions {
        threads: 2,
        kv_blocks: 64,
        block_size: 4,
        ..Default::default()
    };
    crate::backend::cpu::CpuBackend::new(w, &opts).expect("CPU backend")
}
