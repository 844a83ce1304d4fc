//! `memra-verify graph`'s lazy-mask step (check 3) on the CPU backend: the code the CUDA gate
//! runs, run where CI can: masks given by the callback give the bits of masks given up front.

use memra_engine::backend::{StepBatch, StepRow};
use memra_engine::config::Arch;
use memra_verify::graph::lazy_and_eager;

use crate::invariance_cpu::cpu;

#[test]
fn lazy_masks_give_the_up_front_bits_on_the_cpu() {
    let mut b = cpu(Arch::Llama);
    // Three sequences: a prefill whose every row picks, two short ones picking at their end.
    let lens = [9usize, 3, 5];
    let rows: Vec<StepRow> = lens
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| {
            (0..n).map(move |p| StepRow {
                token: ((s * 31 + p * 7) % 97) as u32,
                pos: p as u32,
                seq: s,
                want_logits: s == 0 || p + 1 == n,
            })
        })
        .collect();
    let batch = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![vec![0], vec![1], vec![2]],
        state_slots: Vec::new(),
    };
    let mut masked = 0;
    for seed in 0..6 {
        let asked = std::cell::Cell::new(0);
        let busy = || {
            asked.set(asked.get() + 1);
            Ok(false)
        };
        let c = lazy_and_eager(&mut b, seed, &batch, &busy).expect("step");
        assert_eq!(asked.get(), 1, "seed {seed}");
        assert!(!c.overlapped);
        assert_eq!(c.eager.0.len(), 11, "seed {seed}");
        assert_eq!(c.lazy, c.eager, "seed {seed}");
        masked += c.masked;
    }
    assert!(masked >= 20, "only {masked} masked rows");
}
