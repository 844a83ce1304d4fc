//! The MTP hand-over check (`memra-verify spec --drafters mtp` on a GPU, verify/src/mtp_check.rs)
//! on the CPU: two CPU sides agree exactly; a target that hands over its rows shifted by one,
//! or an MTP layer that reads zeros instead of the states it was given, fails it.

use memra_engine::backend::cpu::{CpuBackend, CpuOps, CpuOptions};
use memra_engine::backend::runner::HiddenStep;
use memra_engine::backend::{Backend, KvDtype, StepBatch, StepOutput, StepRow};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::models::{ModelWeights, mtp};
use memra_engine::quant::DType;
use memra_verify::mtp_check::{self, MTP_TOL, Side};
use memra_verify::spec::synthetic_prompts;

fn weights() -> ModelWeights {
    let cfg = ModelConfig {
        mtp_layers: 1,
        ..tiny_config(Arch::Llama, 97)
    };
    random_weights(&cfg, 5, DType::Q8_0).expect("weights")
}

fn opts() -> CpuOptions {
    CpuOptions {
        threads: 2,
        kv_blocks: 8,
        block_size: 16,
        ..Default::default()
    }
}

fn target(w: &ModelWeights) -> CpuBackend {
    CpuBackend::new(w.clone(), &opts()).expect("target")
}

fn mtp_layer(w: &ModelWeights) -> CpuBackend {
    CpuBackend::build_with(CpuOps::new(&opts()).expect("ops"), w, mtp::build).expect("mtp")
}

/// Delegates to a CPU backend; `shift` hands each row the next row's hidden state, `zero`
/// gives the MTP layer zeros for hidden inputs.
struct Broken {
    inner: CpuBackend,
    shift: bool,
    zero: bool,
}

impl Backend for Broken {
    fn name(&self) -> String {
        "broken".into()
    }
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn kv_block_size(&self) -> usize {
        self.inner.kv_block_size()
    }
    fn kv_blocks(&self) -> usize {
        self.inner.kv_blocks()
    }
    fn kv_dtype(&self) -> KvDtype {
        self.inner.kv_dtype()
    }
    fn step(&mut self, batch: &StepBatch) -> memra_engine::Result<StepOutput> {
        self.inner.step(batch)
    }
    fn kv_block_bytes(&self, block: u32) -> memra_engine::Result<Vec<u8>> {
        self.inner.kv_block_bytes(block)
    }
    fn keep_hidden(&mut self, on: bool) -> memra_engine::Result<()> {
        self.inner.keep_hidden(on)
    }
    fn take_hidden(&mut self) -> Vec<(StepRow, Vec<f32>)> {
        let mut rows = self.inner.take_hidden();
        if self.shift && rows.len() > 1 {
            let first = rows[0].1.clone();
            for i in 0..rows.len() - 1 {
                rows[i].1 = rows[i + 1].1.clone();
            }
            if let Some(last) = rows.last_mut() {
                last.1 = first;
            }
        }
        rows
    }
}

impl HiddenStep for Broken {
    fn step_hidden(
        &mut self,
        batch: &StepBatch,
        hidden_in: Vec<f32>,
    ) -> memra_engine::Result<Vec<(Vec<f32>, Vec<f32>)>> {
        let h = if self.zero {
            vec![0.0; hidden_in.len()]
        } else {
            hidden_in
        };
        self.inner.step_hidden(batch, h)
    }
}

/// The check with the CPU as reference and `device` (target, MTP layer) under test.
fn check(device_target: &mut dyn Backend, device_mtp: &mut dyn HiddenStep) -> Vec<(String, f64)> {
    let w = weights();
    let (mut t, mut m) = (target(&w), mtp_layer(&w));
    let mut reference = Side {
        target: &mut t,
        mtp: &mut m,
    };
    let mut device = Side {
        target: device_target,
        mtp: device_mtp,
    };
    let cases =
        mtp_check::run(&mut reference, &mut device, &synthetic_prompts(97), "test").expect("check");
    // 3 prompts x 2 device runs (the second a graph replay on CUDA) x (target hidden, mtp
    // logits, mtp hidden out).
    assert_eq!(cases.len(), 18);
    cases
        .iter()
        .filter(|c| !c.ok())
        .map(|c| (format!("{} {}", c.kernel, c.shape), c.rel_err))
        .collect()
}

#[test]
fn two_cpu_sides_agree_exactly() {
    let w = weights();
    let (mut t, mut m) = (target(&w), mtp_layer(&w));
    assert_eq!(check(&mut t, &mut m), vec![]);
}

#[test]
fn a_hand_over_that_shifts_rows_fails() {
    let w = weights();
    let mut t = Broken {
        inner: target(&w),
        shift: true,
        zero: false,
    };
    let bad = check(&mut t, &mut mtp_layer(&w));
    // Only the target's states are off (3 prompts x 2 runs): the MTP layers both read the
    // reference's.
    assert_eq!(bad.len(), 6, "{bad:?}");
    assert!(
        bad.iter()
            .all(|(k, e)| k.starts_with("target hidden") && *e > MTP_TOL)
    );
}

#[test]
fn an_mtp_layer_that_reads_zeros_fails() {
    let w = weights();
    let mut m = Broken {
        inner: mtp_layer(&w),
        shift: false,
        zero: true,
    };
    let bad = check(&mut target(&w), &mut m);
    assert!(
        bad.iter().any(|(k, _)| k.starts_with("mtp logits")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .all(|(k, e)| k.starts_with("mtp") && *e > MTP_TOL)
    );
}
