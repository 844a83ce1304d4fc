//! The draft-model drafter: a smaller model with the target's tokenizer, on the same kind of
//! backend, with its own paged KV. Each draft is picked as the target will pick (`draft_pick`: the
//! request's penalties, and for a sampled request the same keyed draw), batched: one step catches
//! every sequence up to its current tokens (its first draft comes from that step), then one step
//! per further draft carries one row of every sequence still drafting.

use std::collections::HashMap;
use std::path::Path;

use super::{DraftReq, Drafter};
use crate::backend::{Backend, Device, OpenOptions, StepBatch, StepRow, open_backend_opts};
use crate::error::{Error, Result};
use crate::kv::{BlockAllocator, blocks_for};
use crate::models::ModelWeights;

const BLOCK: usize = 16;

/// What the draft model holds of one sequence.
#[derive(Default)]
struct DraftSeq {
    blocks: Vec<u32>,
    /// Tokens whose KV is computed (a prefix of the sequence as last seen, plus drafts).
    tokens: Vec<u32>,
}

/// Drafts with a small model.
pub struct DraftModelDrafter {
    name: String,
    backend: Box<dyn Backend>,
    alloc: BlockAllocator,
    seqs: HashMap<u64, DraftSeq>,
}

impl DraftModelDrafter {
    /// Loads the draft model at `path` and checks its vocabulary against the target's.
    pub fn open(path: &Path, device: Device, threads: usize, target_vocab: usize) -> Result<Self> {
        let w = crate::loader::load_weights(path)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Self::from_weights(w, &name, device, threads, target_vocab)
    }

    /// [`Self::open`], also checking the draft model's tokenizer against the target's (`target`,
    /// when given): the same entry for every id ([`super::check_tokenizers`]).
    pub fn open_checked(
        path: &Path,
        device: Device,
        threads: usize,
        target_vocab: usize,
        target: Option<&crate::tokenizer::Tokenizer>,
    ) -> Result<Self> {
        let named = |e: String| Error::Input(format!("draft model: {e}"));
        super::check_draft_path(path).map_err(|e| named(super::bare(&e)))?;
        let Some(target) = target else {
            return Self::open(path, device, threads, target_vocab);
        };
        let m = crate::loader::load_model(path).map_err(|e| named(super::bare(&e)))?;
        super::check_tokenizers(&m.tokenizer, target).map_err(named)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Self::from_weights(m.weights, &name, device, threads, target_vocab)
    }

    /// A drafter over weights already in memory (tests, synthetic pairs).
    pub fn from_weights(
        w: ModelWeights,
        name: &str,
        device: Device,
        threads: usize,
        target_vocab: usize,
    ) -> Result<Self> {
        let c = &w.config;
        if c.vocab != target_vocab {
            return Err(Error::Input(format!(
                "draft model `{name}` has a vocabulary of {} tokens, the target {target_vocab}: \
                 a draft model must share the target's tokenizer",
                c.vocab
            )));
        }
        // Room for 8 full-context sequences, at most 512 blocks (8,192 positions).
        let blocks = (8 * blocks_for(c.max_ctx, BLOCK)).min(512);
        let opts = OpenOptions {
            kv_blocks: blocks,
            block_size: BLOCK,
            threads,
            graphs: false,
            kv_dtype: Default::default(),
            state_slots: crate::backend::DEFAULT_STATE_SLOTS,
        };
        let mut backend = open_backend_opts(device, w, &opts)?;
        // It drafts one token a step and rewinds to the last accepted one (recurrent state).
        backend.set_state_keep(crate::backend::state::RING - 1);
        Ok(DraftModelDrafter {
            name: format!("draft:{name}"),
            backend,
            alloc: BlockAllocator::new(blocks),
            seqs: HashMap::new(),
        })
    }

    /// Makes `id`'s KV agree with `tokens`: keeps the common prefix, drops the rest (drafts the
    /// target rejected), and gives it blocks for `positions`. `false` when the pool is short.
    fn prepare(&mut self, id: u64, tokens: &[u32], positions: usize) -> bool {
        let s = self.seqs.entry(id).or_default();
        let common = s
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        s.tokens.truncate(common);
        let need = blocks_for(positions, BLOCK);
        while s.blocks.len() < need {
            match self.alloc.alloc() {
                Some(b) => s.blocks.push(b),
                None => return false,
            }
        }
        true
    }
}

impl Drafter for DraftModelDrafter {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn draft(&mut self, reqs: &[DraftReq]) -> Result<Vec<Vec<u32>>> {
        let ctx = self.backend.config().max_ctx;
        let mut out = vec![Vec::new(); reqs.len()];
        // (request index, draft count) of the sequences drafting.
        let mut live: Vec<(usize, usize)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let k = r.k.min(ctx.saturating_sub(r.tokens.len()));
            if k == 0 || r.tokens.is_empty() {
                continue;
            }
            if self.prepare(r.id, r.tokens, r.tokens.len() + k - 1) {
                live.push((i, k));
            } else {
                self.forget(r.id);
            }
        }
        for round in 0.. {
            live.retain(|&(i, k)| out[i].len() < k);
            if live.is_empty() {
                break;
            }
            let mut batch = StepBatch::default();
            for (si, &(i, _)) in live.iter().enumerate() {
                let r = &reqs[i];
                let s = &self.seqs[&r.id];
                // Round 0: every token not yet computed; later: the last draft.
                let have = s.tokens.len();
                let rows: Vec<(usize, u32)> = if round == 0 {
                    (have..r.tokens.len()).map(|p| (p, r.tokens[p])).collect()
                } else {
                    out[i].last().map(|&t| vec![(have, t)]).unwrap_or_default()
                };
                // A sequence fully computed already recomputes its last token (its logits).
                let rows = if rows.is_empty() {
                    vec![(have - 1, r.tokens[have - 1])]
                } else {
                    rows
                };
                let n = rows.len();
                for (j, (p, t)) in rows.into_iter().enumerate() {
                    batch.rows.push(StepRow {
                        token: t,
                        pos: p as u32,
                        seq: si,
                        want_logits: j + 1 == n,
                    });
                }
                batch.block_tables.push(s.blocks.clone());
            }
            let logits = self.backend.step(&batch)?.logits;
            for (&(i, _), l) in live.iter().zip(&logits) {
                let r = &reqs[i];
                let s = self.seqs.entry(r.id).or_default();
                if round == 0 {
                    s.tokens.clear();
                    s.tokens.extend_from_slice(r.tokens);
                } else if let Some(&t) = out[i].last() {
                    s.tokens.push(t);
                }
                let t = super::draft_pick(l, r.tokens, &out[i], r.params);
                out[i].push(t);
            }
        }
        Ok(out)
    }

    fn forget(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.alloc.release_all(&s.blocks);
        }
    }
}
