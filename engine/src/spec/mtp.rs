//! The MTP drafter: the target's own multi-token-prediction layer (models/mtp.rs) drafts from
//! the target's final hidden states.
//!
//! MTP position `i` takes the target's hidden state `h_i` and the token `t_{i+1}` and predicts
//! `t_{i+2}`. For a sequence of `n` tokens (the last one not yet run by the target), the drafter
//! catches its own KV up to MTP position `n - 2` with the target's hidden states (which the
//! caller hands over after every target step, [`Drafter::observe`]); that row's logits give
//! draft 1. Drafts 2..K chain MTP module 0: position `n - 2 + j` takes the MTP layer's own
//! output hidden state of the position before and draft `j` (vLLM's and llama.cpp's choice
//! for checkpoints with one MTP layer; a checkpoint with several still drafts with its first).
//! Each draft is picked as the target will pick (`draft_pick`: the request's penalties, and for
//! a sampled request the same keyed draw). The chained positions' KV is rewritten on the next call: only
//! positions computed from the target's own hidden states and committed tokens are kept, so a
//! rejected draft leaves nothing behind.
//!
//! The MTP layer runs on the target's kind of backend (`device`: the CPU, or a CUDA device with
//! its own runner beside the target's), fed through [`HiddenStep`]: the hidden input rows go
//! up with the step, and only the rows that want logits come back (logits and output state).

use std::collections::{BTreeMap, HashMap};

use super::{DraftReq, Drafter};
use crate::backend::cpu::{CpuBackend, CpuOps, CpuOptions};
use crate::backend::cuda::{CudaBackend, CudaOptions, cuda_available, graphs_default};
use crate::backend::runner::HiddenStep;
use crate::backend::{Device, StepBatch, StepRow};
use crate::error::Result;
use crate::kv::{BlockAllocator, blocks_for};
use crate::models::{ModelWeights, mtp};

const BLOCK: usize = 16;

/// What the drafter holds of one sequence.
#[derive(Default)]
struct MtpSeq {
    blocks: Vec<u32>,
    /// The tokens at positions `0..known.len()` of the target's hidden states received.
    known: Vec<u32>,
    /// Received hidden states not yet used, by position.
    hidden: BTreeMap<usize, Vec<f32>>,
    /// MTP positions `0..done` hold KV computed from the target's hidden states and committed
    /// tokens (the chained positions after them are rewritten by every call).
    done: usize,
}

/// Drafts with the target's MTP layer.
pub struct MtpDrafter {
    backend: Box<dyn HiddenStep>,
    alloc: BlockAllocator,
    seqs: HashMap<u64, MtpSeq>,
}

impl MtpDrafter {
    /// The drafter of `target`'s MTP module 0 on `device` (`auto`: CUDA device 0 when there
    /// is one, as the target's backend); an error naming the missing layers when it has none.
    /// On CUDA the MTP layer runs as CUDA graphs unless `MEMRA_CUDA_GRAPHS=0`.
    pub fn new(target: &ModelWeights, device: Device, threads: usize) -> Result<MtpDrafter> {
        mtp::require(target)?;
        let c = &target.config;
        let blocks = (8 * blocks_for(c.max_ctx, BLOCK)).min(512);
        let cuda = match device {
            Device::Cuda(n) => Some(n),
            Device::Auto if cuda_available() => Some(0),
            Device::Auto | Device::Cpu => None,
        };
        let backend: Box<dyn HiddenStep> = match cuda {
            Some(n) => {
                let opts = CudaOptions {
                    device: n,
                    kv_blocks: blocks,
                    block_size: BLOCK,
                    graphs: graphs_default(),
                    kv_dtype: Default::default(),
                    state_slots: crate::backend::DEFAULT_STATE_SLOTS,
                };
                Box::new(CudaBackend::new_with(target, &opts, mtp::build)?)
            }
            None => {
                let opts = CpuOptions {
                    threads,
                    kv_blocks: blocks,
                    block_size: BLOCK,
                    kv_dtype: Default::default(),
                };
                Box::new(CpuBackend::build_with(
                    CpuOps::new(&opts)?,
                    target,
                    mtp::build,
                )?)
            }
        };
        Ok(MtpDrafter {
            backend,
            alloc: BlockAllocator::new(blocks),
            seqs: HashMap::new(),
        })
    }

    /// The MTP KV positions `id` holds from the target's own states (tests).
    pub fn done(&self, id: u64) -> usize {
        self.seqs.get(&id).map_or(0, |s| s.done)
    }

    /// Makes `id`'s state agree with `tokens`; returns the first MTP position to compute
    /// (positions up to `tokens.len() - 2` must be), or `None` when a hidden state it needs is
    /// missing or the KV pool is short (then no draft this time).
    fn prepare(&mut self, id: u64, tokens: &[u32], k: usize) -> Option<usize> {
        let n = tokens.len();
        let s = self.seqs.get_mut(&id)?;
        let c = s
            .known
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        s.known.truncate(c);
        s.hidden.retain(|&p, _| p < c);
        s.done = s.done.min(c.saturating_sub(1));
        if n < 2 || c + 1 < n {
            return None;
        }
        let start = s.done.min(n - 2);
        if (start..n - 1).any(|p| !s.hidden.contains_key(&p)) {
            return None;
        }
        let need = blocks_for(n + k - 2, BLOCK);
        while s.blocks.len() < need {
            s.blocks.push(self.alloc.alloc()?);
        }
        Some(start)
    }

    /// One MTP step: `rows` of (sequence index, token, position, hidden input); returns the
    /// logits and hidden output of each sequence's last row (rows of one sequence adjacent).
    fn step(
        &mut self,
        rows: &[(usize, u32, usize, Vec<f32>)],
        tables: Vec<Vec<u32>>,
    ) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        let mut batch = StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: Vec::with_capacity(rows.len()),
            block_tables: tables,
            state_slots: Vec::new(),
        };
        let mut input = Vec::new();
        for (j, &(seq, token, pos, ref h)) in rows.iter().enumerate() {
            let last = rows.get(j + 1).is_none_or(|r| r.0 != seq);
            batch.rows.push(StepRow {
                token,
                pos: pos as u32,
                seq,
                want_logits: last,
            });
            input.extend_from_slice(h);
        }
        self.backend.step_hidden(&batch, input)
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> String {
        "mtp".into()
    }

    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
        let ctx = self.backend.config().max_ctx;
        let mut out = vec![Vec::new(); reqs.len()];
        // (request index, draft count, first MTP position to compute).
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let k = r.k.min(ctx.saturating_sub(r.tokens.len()));
            if k == 0 {
                continue;
            }
            match self.prepare(r.id, r.tokens, k) {
                Some(start) => live.push((i, k, start)),
                None => continue,
            }
        }
        // Round 0 catches up with the target's states; later rounds chain their own.
        let mut chain: Vec<Vec<f32>> = vec![Vec::new(); reqs.len()];
        for round in 0.. {
            live.retain(|&(i, k, _)| out[i].len() < k);
            if live.is_empty() {
                break;
            }
            let mut rows: Vec<(usize, u32, usize, Vec<f32>)> = Vec::new();
            let mut tables = Vec::new();
            for (si, &(i, _, start)) in live.iter().enumerate() {
                let r = &reqs[i];
                let s = &self.seqs[&r.id];
                let n = r.tokens.len();
                if round == 0 {
                    for p in start..n - 1 {
                        rows.push((si, r.tokens[p + 1], p, s.hidden[&p].clone()));
                    }
                } else {
                    let t = out[i][round - 1];
                    rows.push((si, t, n - 2 + round, std::mem::take(&mut chain[i])));
                }
                tables.push(s.blocks.clone());
            }
            let res = self.step(&rows, tables)?;
            for (&(i, _, _), (logits, h)) in live.iter().zip(res) {
                let r = &reqs[i];
                let t = super::draft_pick(&logits, r.tokens, &out[i], r.params);
                out[i].push(t);
                chain[i] = h;
                if round == 0 {
                    let r = &reqs[i];
                    let n = r.tokens.len();
                    if let Some(s) = self.seqs.get_mut(&r.id) {
                        s.done = n - 1;
                        // Keep the last state used: a repeated call recomputes that position.
                        s.hidden.retain(|&p, _| p + 2 >= n);
                    }
                }
            }
        }
        Ok(out)
    }

    fn forget(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.alloc.release_all(&s.blocks);
        }
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, id: u64, rows: &[(StepRow, Vec<f32>)]) {
        let s = self.seqs.entry(id).or_default();
        for (r, h) in rows {
            let p = r.pos as usize;
            if p > s.known.len() {
                // A gap (rows this drafter never saw): only earlier positions stay usable.
                continue;
            }
            s.known.truncate(p);
            s.hidden.retain(|&q, _| q < p);
            s.known.push(r.token);
            s.hidden.insert(p, h.clone());
        }
    }
}
