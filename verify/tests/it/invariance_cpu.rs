//! The invariance gate on the CPU backend (CI): passes for every registered architecture, and catches a
//! backend whose logits depend on the batch.

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, KvDtype, StepBatch, StepOutput};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::models::ARCHS;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_verify::invariance;

pub(crate) fn cpu(arch: Arch) -> CpuBackend {
    let w = random_weights(&tiny_config(arch, 97), 5, DType::Q8_0).expect("weights");
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: invariance::blocks_needed(20, 16, arch.is_recurrent()),
        block_size: 16,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

/// Every KV cache format keeps the gate's meaning: logits and KV bytes bitwise the same under
/// any batch composition and chunking (docs/KV_CACHE.md).
#[test]
fn cpu_backend_is_invariant_in_every_kv_format() {
    for kv in KvDtype::ALL {
        let w = random_weights(&tiny_config(Arch::Llama, 97), 5, DType::Q8_0).expect("weights");
        let opts = CpuOptions {
            threads: 2,
            kv_blocks: invariance::blocks_needed(40, 16, false),
            block_size: 16,
            kv_dtype: kv,
        };
        let mut b = CpuBackend::new(w, &opts).expect("backend");
        assert_eq!(b.kv_dtype(), kv);
        let rep = invariance::run(&mut b, 4, 40, 10).expect("run");
        assert!(rep.checks > 30, "{kv}: only {} checks", rep.checks);
        assert!(rep.failures.is_empty(), "{kv}: {:?}", rep.failures);
    }
}

#[test]
fn cpu_backend_is_invariant() {
    for arch in ARCHS.iter().map(|d| d.arch) {
        let mut b = cpu(arch);
        let rep = invariance::run(&mut b, 3, 20, 12).expect("run");
        assert!(rep.checks > 30, "{arch:?}: only {} checks", rep.checks);
        assert!(rep.failures.is_empty(), "{arch:?}: {:?}", rep.failures);
    }
}

/// The FP8 and NVFP4 checkpoint types (`--tiny llama+fp8`, `qwen3+nvfp4`) through the binary.
#[test]
fn cpu_backend_is_invariant_over_checkpoint_types() {
    for tiny in ["llama+fp8", "qwen3+nvfp4"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-verify"))
            .args([
                "invariance",
                "--device",
                "cpu",
                "--tiny",
                tiny,
                "--max-m",
                "8",
            ])
            .output()
            .expect("run memra-verify");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("ALL GREEN"),
            "{tiny}: {text}"
        );
    }
}

/// Adds a batch-size-dependent rounding error to every logit: not row-invariant.
pub(crate) struct Leaky(pub(crate) CpuBackend);

impl Backend for Leaky {
    fn name(&self) -> String {
        "leaky".into()
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn kv_block_size(&self) -> usize {
        self.0.kv_block_size()
    }
    fn kv_blocks(&self) -> usize {
        self.0.kv_blocks()
    }
    fn step(&mut self, batch: &StepBatch) -> memra_engine::Result<StepOutput> {
        let mut out = self.0.step(batch)?;
        let m = batch.rows.len() as f32;
        for l in out.logits.iter_mut().flatten() {
            *l += 1e-3 * m;
        }
        Ok(out)
    }
    fn kv_block_bytes(&self, block: u32) -> memra_engine::Result<Vec<u8>> {
        self.0.kv_block_bytes(block)
    }
    fn kv_dtype(&self) -> memra_engine::backend::KvDtype {
        self.0.kv_dtype()
    }
}

#[test]
fn batch_dependent_backend_fails_the_gate() {
    let mut b = Leaky(cpu(Arch::Llama));
    let rep = invariance::run(&mut b, 3, 20, 8).expect("run");
    assert!(
        rep.failures.iter().any(|f| f.contains("M=2")),
        "failures: {:?}",
        rep.failures
    );
    assert!(rep.failures.iter().any(|f| f.contains("prefill chunk 1")));
}
