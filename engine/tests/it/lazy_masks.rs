//! `Backend::step_select_lazy_masks`, the grammar masks given by a callback once the forward
//! pass is launched (docs/SERVING.md, structured output), against the step it replaces:
//! `step_select_logprobs` with the masks in `select` from the start. One batch mixes
//! constrained and unconstrained rows (greedy, sampled on and off the top-k road, penalties,
//! logprobs, a logits-only row, several picking rows in one sequence as drafts have, masks
//! allowing one token, a few, none); the tokens, logprob bits, logits bits and KV bytes must be
//! the same, through the generic runner (the CPU backend: forward, then masks, then selection)
//! and through the trait's default (masks first). An error from the callback is the step's
//! error and leaves the backend usable.

use std::sync::{Arc, Mutex};

use memra_engine::Error;
use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{
    Backend, DumpFn, KvDtype, SelectParams, Selected, StepBatch, StepMasks, StepOutput, StepRow,
};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::models::random::{random_weights, splitmix, tiny_config};
use memra_engine::quant::DType;
use memra_engine::sampling::SamplingParams;

const VOCAB: usize = 300;
const BLOCKS: usize = 16;

fn backend() -> CpuBackend {
    let w = random_weights(&tiny_config(Arch::Llama, VOCAB), 11, DType::Q8_0).expect("weights");
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: BLOCKS,
        block_size: 16,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

/// The trait's default `step_select_lazy_masks` (and `step_select`, `step_select_logprobs`)
/// over another backend's `step`.
struct Sequential(CpuBackend);

impl Backend for Sequential {
    fn name(&self) -> String {
        "sequential".into()
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
    fn kv_dtype(&self) -> KvDtype {
        self.0.kv_dtype()
    }
    fn step(&mut self, batch: &StepBatch) -> memra_engine::Result<StepOutput> {
        self.0.step(batch)
    }
    fn kv_block_bytes(&self, block: u32) -> memra_engine::Result<Vec<u8>> {
        self.0.kv_block_bytes(block)
    }
}

/// Sequences (prompt length, rows at the end that pick): a prefill whose last row picks, a
/// sequence picking at three rows (a drafted sequence's rows), short ones.
const SEQS: [(usize, usize); 5] = [(6, 1), (4, 1), (7, 3), (3, 1), (2, 1)];

fn tokens(seq: usize, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (splitmix(seq as u64, 1, i) % VOCAB as u64) as u32)
        .collect()
}

fn batch() -> StepBatch {
    let mut rows = Vec::new();
    for (s, &(n, pick)) in SEQS.iter().enumerate() {
        for (p, token) in tokens(s, n).into_iter().enumerate() {
            rows.push(StepRow {
                token,
                pos: p as u32,
                seq: s,
                want_logits: p + pick >= n,
            });
        }
    }
    StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: (0..SEQS.len() as u32).map(|b| vec![b]).collect(),
        state_slots: Vec::new(),
    }
}

fn mask_of(allowed: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut m = vec![0u32; VOCAB.div_ceil(32)];
    for t in allowed {
        m[t as usize / 32] |= 1 << (t % 32);
    }
    m
}

/// What one picking row asks: params index, mask, logprobs; `None`: the row's logits.
type RowSpec = Option<(usize, Option<Vec<u32>>, Option<usize>)>;

/// The picking rows in order (seven: 1 + 1 + 3 + 1 + 1).
fn specs() -> Vec<RowSpec> {
    let dense = mask_of((0..VOCAB as u32).filter(|t| !splitmix(7, 2, *t as u64).is_multiple_of(3)));
    let sparse =
        mask_of((0..VOCAB as u32).filter(|t| splitmix(7, 3, *t as u64).is_multiple_of(40)));
    vec![
        // Prefill end: greedy under a dense mask, with logprobs.
        Some((0, Some(dense.clone()), Some(3))),
        // Unconstrained, sampled (no top-k: the host's road).
        Some((2, None, None)),
        // Drafted rows: one allowed token (greedy with penalties), a sparse mask (top-k 20),
        // a mask allowing nothing (the lowest allowed id rule: 0) with logprobs.
        Some((1, Some(mask_of([137])), None)),
        Some((3, Some(sparse), None)),
        Some((3, Some(vec![0; VOCAB.div_ceil(32)]), Some(2))),
        // The logits.
        None,
        // Unconstrained greedy with logprobs.
        Some((0, None, Some(1))),
    ]
}

fn params() -> Vec<SamplingParams> {
    vec![
        SamplingParams::default(),
        SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            seed: 5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.1,
            top_k: 20,
            top_p: 0.9,
            frequency_penalty: 0.2,
            seed: 6,
            ..Default::default()
        },
    ]
}

fn all_kv(b: &dyn Backend) -> Vec<Vec<u8>> {
    (0..SEQS.len() as u32)
        .map(|i| b.kv_block_bytes(i).expect("kv"))
        .collect()
}

/// Results of one step as bits, and the KV bytes after it.
type Run = (Vec<(u8, Vec<u32>)>, Vec<Vec<u8>>);

/// How [`run`] gives the masks.
#[derive(Clone, Copy, PartialEq)]
enum Masks {
    /// In `select` (`step_select_logprobs`).
    Eager,
    /// From a callback (`step_select_lazy_masks`).
    Lazy,
    /// None at all (`step_select_logprobs`).
    Without,
}

/// Runs the batch on `b`; `log` records the mask callback's call.
fn run(b: &mut dyn Backend, how: Masks, log: &Arc<Mutex<Vec<String>>>) -> Run {
    let batch = batch();
    let params = params();
    let specs = specs();
    let histories: Vec<Vec<u32>> = (0..SEQS.len())
        .flat_map(|s| {
            let (n, pick) = SEQS[s];
            (0..pick).map(move |j| tokens(s, n - pick + 1 + j))
        })
        .collect();
    assert_eq!(histories.len(), specs.len());
    let select: Vec<Option<SelectParams>> = specs
        .iter()
        .zip(&histories)
        .map(|(spec, h)| {
            spec.as_ref().map(|(p, mask, _)| SelectParams {
                params: &params[*p],
                history: h,
                pos: h.len() as u64,
                mask: mask.as_deref().filter(|_| how == Masks::Eager),
            })
        })
        .collect();
    let logprobs: Vec<Option<usize>> = specs.iter().map(|s| s.as_ref().and_then(|s| s.2)).collect();
    let out = if how == Masks::Lazy {
        let masks: StepMasks = specs
            .iter()
            .map(|s| s.as_ref().and_then(|s| s.1.clone()))
            .collect();
        let log = log.clone();
        let mut cb = move || {
            log.lock().unwrap().push("masks".into());
            Ok(masks.clone())
        };
        b.step_select_lazy_masks(&batch, &select, &logprobs, &mut cb)
    } else {
        b.step_select_logprobs(&batch, &select, &logprobs)
    }
    .expect("step");
    (out.rows.iter().map(Selected::bits).collect(), all_kv(b))
}

/// A dump sink that logs the forward's intermediates by name and layer.
fn dump_into(log: &Arc<Mutex<Vec<String>>>) -> DumpFn {
    let log = log.clone();
    Box::new(move |name, layer, _, _| log.lock().unwrap().push(format!("{name}:{layer}")))
}

#[test]
fn lazy_masks_give_the_eager_steps_bits() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let eager = run(&mut backend(), Masks::Eager, &log);
    assert!(log.lock().unwrap().is_empty());

    // The runner (the CPU backend): the whole forward, then the masks, then the selection.
    let mut b = backend();
    let layers = b.config().n_layers;
    b.set_dump(Some(dump_into(&log)));
    let lazy = run(&mut b, Masks::Lazy, &log);
    let log_runner = std::mem::take(&mut *log.lock().unwrap());
    let at = log_runner
        .iter()
        .position(|e| e == "masks")
        .expect("masks asked for");
    assert_eq!(log_runner.iter().filter(|e| *e == "masks").count(), 1);
    assert_eq!(
        at,
        log_runner.len() - 1,
        "a forward intermediate after the masks"
    );
    assert!(
        log_runner.contains(&format!("l_out:{}", layers - 1)),
        "the last layer ran before the masks: {log_runner:?}"
    );

    // The trait's default: masks first, then `step_select_logprobs`.
    let mut seq = Sequential(backend());
    let default = run(&mut seq, Masks::Lazy, &log);
    assert_eq!(*log.lock().unwrap(), vec!["masks".to_string()]);

    assert_eq!(
        lazy, eager,
        "the runner's lazy masks differ from the eager step"
    );
    assert_eq!(
        default, eager,
        "the default lazy masks differ from the eager step"
    );

    // The masks were applied: each masked pick is a token its mask allows (none allowed: 0),
    // the logits row came back whole, the scored rows carry their alternatives.
    let (rows, _) = &eager;
    let specs = specs();
    for (i, (row, spec)) in rows.iter().zip(&specs).enumerate() {
        match spec {
            None => assert_eq!((row.0, row.1.len()), (1, VOCAB), "row {i}"),
            Some((_, mask, lp)) => {
                assert_eq!(row.0, if lp.is_some() { 2 } else { 0 }, "row {i}");
                if let Some(lp) = lp {
                    assert_eq!(row.1.len(), 2 + 2 * lp, "row {i}");
                }
                if let Some(m) = mask {
                    let t = row.1[0];
                    let allowed = m[t as usize / 32] >> (t % 32) & 1 == 1;
                    assert!(
                        allowed || (m.iter().all(|w| *w == 0) && t == 0),
                        "row {i}: {t}"
                    );
                }
            }
        }
    }
    assert_eq!(rows[2].1[0], 137);
    // Without the masks some constrained row picks differently (the masks matter).
    let unmasked = run(&mut backend(), Masks::Without, &log);
    assert_ne!(unmasked.0, eager.0);
    assert_eq!(unmasked.1, eager.1);
}

#[test]
fn a_failing_mask_callback_fails_the_step_and_leaves_the_backend_usable() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let eager = run(&mut backend(), Masks::Eager, &log);
    for mut b in [
        Box::new(backend()) as Box<dyn Backend>,
        Box::new(Sequential(backend())),
    ] {
        let name = b.name();
        let batch = batch();
        let p = SamplingParams::default();
        let want = batch.rows.iter().filter(|r| r.want_logits).count();
        let select: Vec<Option<SelectParams>> = (0..want)
            .map(|_| {
                Some(SelectParams {
                    params: &p,
                    history: &[],
                    pos: 0,
                    mask: None,
                })
            })
            .collect();
        let lp = vec![None; want];
        let mut calls = 0;
        let mut failing = || {
            calls += 1;
            Err(Error::Input("the grammar rejects everything".into()))
        };
        let e = b
            .step_select_lazy_masks(&batch, &select, &lp, &mut failing)
            .unwrap_err();
        assert_eq!(calls, 1, "{name}");
        assert!(e.to_string().contains("rejects everything"), "{name}: {e}");
        // Masks that do not fit the rows: one missing, one for a row that returns logits.
        let mut short = || Ok(vec![None; want - 1]);
        let e = b
            .step_select_lazy_masks(&batch, &select, &lp, &mut short)
            .unwrap_err();
        assert!(e.to_string().contains("masks for"), "{name}: {e}");
        let mut logits_row = vec![None; want];
        logits_row[0] = Some(mask_of([1]));
        let none_first: Vec<Option<SelectParams>> = std::iter::once(None)
            .chain(select[1..].iter().copied())
            .collect();
        let mut onto_logits = || Ok(logits_row.clone());
        let e = b
            .step_select_lazy_masks(&batch, &none_first, &lp, &mut onto_logits)
            .unwrap_err();
        assert!(e.to_string().contains("returns its logits"), "{name}: {e}");
        // Afterwards the same step gives the bits of a backend that never failed (the failed
        // steps wrote the same KV the step rewrites).
        assert_eq!(run(b.as_mut(), Masks::Lazy, &log), eager, "{name}");
    }
}
