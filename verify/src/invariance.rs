//! `memra-verify invariance`: the same rows give the same logits and KV bytes, bit for bit,
//! whatever else is in the step (M = 1..max_m, random filler rows at random depths) and however
//! the prompt is chunked (1, 7, 64, whole), on any backend. A model with a recurrent state per
//! sequence (qwen3next) gets fillers that start their sequences (position 0, a block each):
//! a row deeper in a sequence needs that sequence's state.

use memra_engine::Result;
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::models::random::splitmix;

use crate::case::same_bits;

/// Outcome of the gate.
#[derive(Debug, Default)]
pub struct InvReport {
    pub checks: usize,
    pub failures: Vec<String>,
}

struct Run<'a> {
    b: &'a mut dyn Backend,
    seed: u64,
    stream: u64,
    next_block: u32,
    filler_table: Vec<u32>,
    /// Recurrent-state model: fillers at position 0, filler `i` in block `filler_table[i]`.
    fresh_fillers: bool,
}

impl Run<'_> {
    fn rand(&mut self, n: u64) -> u64 {
        self.stream += 1;
        splitmix(self.seed, 7, self.stream) % n.max(1)
    }

    fn alloc(&mut self, n: usize) -> Result<Vec<u32>> {
        let start = self.next_block;
        self.next_block += n as u32;
        if self.next_block as usize > self.b.kv_blocks() {
            return Err(memra_engine::Error::Input(format!(
                "invariance needs more than {} KV blocks",
                self.b.kv_blocks()
            )));
        }
        Ok((start..self.next_block).collect())
    }

    /// `n` filler rows at distinct random positions of the shared filler table, each its own
    /// sequence (index 1..), random tokens, random want_logits.
    fn fillers(&mut self, n: usize) -> Vec<StepRow> {
        let cap = (self.filler_table.len() * self.b.kv_block_size()) as u64;
        let vocab = self.b.config().vocab as u64;
        let mut used = Vec::new();
        let mut rows = Vec::new();
        while rows.len() < n && (used.len() as u64) < cap {
            if self.fresh_fillers {
                rows.push(StepRow {
                    token: self.rand(vocab) as u32,
                    pos: 0,
                    seq: rows.len() + 1,
                    want_logits: self.rand(2) == 0,
                });
                continue;
            }
            let pos = self.rand(cap) as u32;
            if used.contains(&pos) {
                continue;
            }
            used.push(pos);
            rows.push(StepRow {
                token: self.rand(vocab) as u32,
                pos,
                seq: rows.len() + 1,
                want_logits: self.rand(2) == 0,
            });
        }
        rows
    }

    /// Runs `target` rows (sequence 0, table `table`, in order) mixed with `n_fill` fillers at
    /// random places; returns the logits of the target rows that want them.
    fn step_mixed(
        &mut self,
        target: &[StepRow],
        table: &[u32],
        n_fill: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let fill = self.fillers(n_fill);
        let mut rows = Vec::with_capacity(target.len() + fill.len());
        let mut is_target = Vec::new();
        let (mut ti, mut fi) = (0, 0);
        while ti < target.len() || fi < fill.len() {
            let take_target = fi >= fill.len() || (ti < target.len() && self.rand(2) == 0);
            if take_target {
                rows.push(target[ti]);
                is_target.push(true);
                ti += 1;
            } else {
                rows.push(fill[fi]);
                is_target.push(false);
                fi += 1;
            }
        }
        let mut tables = vec![table.to_vec()];
        match self.fresh_fillers {
            true => tables.extend(self.filler_table[..fill.len()].iter().map(|&b| vec![b])),
            false => tables.extend(std::iter::repeat_n(self.filler_table.clone(), fill.len())),
        }
        let out = self.b.step(&StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: rows.clone(),
            block_tables: tables,
            state_slots: Vec::new(),
        })?;
        let mut logits = out.logits.into_iter();
        let mut mine = Vec::new();
        for (r, t) in rows.iter().zip(is_target) {
            if r.want_logits {
                let l = logits.next().unwrap_or_default();
                if t {
                    mine.push(l);
                }
            }
        }
        Ok(mine)
    }

    /// Prefills `prompt` into `table` in chunks of `chunk`, with fillers when `fill`; returns
    /// the logits of every position.
    fn prefill(
        &mut self,
        prompt: &[u32],
        table: &[u32],
        chunk: usize,
        fill: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let mut all = Vec::new();
        for (ci, c) in prompt.chunks(chunk).enumerate() {
            let rows: Vec<StepRow> = c
                .iter()
                .enumerate()
                .map(|(i, &t)| StepRow {
                    token: t,
                    pos: (ci * chunk + i) as u32,
                    seq: 0,
                    want_logits: true,
                })
                .collect();
            let n_fill = if fill { 1 + self.rand(8) as usize } else { 0 };
            all.extend(self.step_mixed(&rows, table, n_fill)?);
        }
        Ok(all)
    }

    fn kv(&self, table: &[u32]) -> Result<Vec<Vec<u8>>> {
        table.iter().map(|&b| self.b.kv_block_bytes(b)).collect()
    }
}

/// Runs the gate on `backend` with a random prompt of `prompt_len` tokens and batches up to
/// `max_m` rows.
pub fn run(
    backend: &mut dyn Backend,
    seed: u64,
    prompt_len: usize,
    max_m: usize,
) -> Result<InvReport> {
    let bs = backend.kv_block_size();
    let vocab = backend.config().vocab as u64;
    let backend_recurrent = backend.config().arch.is_recurrent();
    let prompt: Vec<u32> = (0..prompt_len as u64)
        .map(|i| (splitmix(seed, 3, i) % vocab) as u32)
        .collect();
    let nb = prompt_len.div_ceil(bs);
    let mut r = Run {
        b: backend,
        seed,
        stream: 0,
        next_block: 0,
        filler_table: Vec::new(),
        fresh_fillers: backend_recurrent,
    };
    r.filler_table = r.alloc(filler_blocks(bs, backend_recurrent))?;
    let mut rep = InvReport::default();
    let ref_table = r.alloc(nb)?;
    let reference = r.prefill(&prompt, &ref_table, prompt_len, false)?;
    let ref_kv = r.kv(&ref_table)?;
    for chunk in [1, 7, 64, prompt_len] {
        for fill in [false, true] {
            let table = r.alloc(nb)?;
            let got = r.prefill(&prompt, &table, chunk, fill)?;
            let what = format!(
                "prefill chunk {chunk}{}",
                if fill { " + random rows" } else { "" }
            );
            rep.checks += 1;
            if let Some(p) =
                (0..prompt_len).find(|&p| !got.get(p).is_some_and(|g| same_bits(g, &reference[p])))
            {
                rep.failures
                    .push(format!("{what}: logits of position {p} differ"));
            }
            rep.checks += 1;
            if r.kv(&table)? != ref_kv {
                rep.failures.push(format!("{what}: KV bytes differ"));
            }
        }
    }
    // The last prompt row again, inside batches of M rows.
    let last = prompt_len - 1;
    let target = [StepRow {
        token: prompt[last],
        pos: last as u32,
        seq: 0,
        want_logits: true,
    }];
    for m in 1..=max_m {
        let got = r.step_mixed(&target, &ref_table, m - 1)?;
        rep.checks += 1;
        if !got.first().is_some_and(|g| same_bits(g, &reference[last])) {
            rep.failures.push(format!(
                "M={m}: logits of the target row differ from the reference"
            ));
        }
        rep.checks += 1;
        if r.kv(&ref_table)? != ref_kv {
            rep.failures
                .push(format!("M={m}: KV bytes of the target sequence changed"));
        }
    }
    Ok(rep)
}

/// KV blocks of the fillers' table: 64 positions' worth, or one per filler (up to 64) for a
/// recurrent-state model.
fn filler_blocks(bs: usize, recurrent: bool) -> usize {
    match recurrent {
        true => 64,
        false => 64usize.div_ceil(bs).max(1) + 1,
    }
}

/// KV blocks [`run`] needs for a prompt of `prompt_len` at block size `bs` (recurrent: a
/// recurrent-state model's fillers).
pub fn blocks_needed(prompt_len: usize, bs: usize, recurrent: bool) -> usize {
    filler_blocks(bs, recurrent) + 9 * prompt_len.div_ceil(bs)
}
