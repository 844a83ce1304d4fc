//! Recurrent state per sequence (gated DeltaNet layers, ops::Ops::state_layer): which state
//! slot a sequence uses, where its state stands, and what a step must replay first. Shared by
//! every backend; the backend holds the state itself (per layer, per slot).
//!
//! **The rule** (docs/ARCHITECTURE.md, "Recurrent state"): the delta rule runs per token, in
//! position order, from the state committed for the slot. A step's rows of a sequence cover
//! positions `p..=q`; the slot's state is committed at position `C` (every position `< C`
//! folded in) and its ring holds the per-token inputs of positions `C..W` (`W` = one past the
//! last position an earlier step computed). The step first folds positions `C..p` from the
//! ring (replay), then its own rows, and commits at
//! `C' = max(C, min(p, q + 1 - keep), q + 2 - RING)`: the positions from `C'` stay pending in
//! the ring. So the next step may start anywhere in `C'..=q + 1`, with no copy of the state:
//! the same step again, a speculative verify step rejected after its `a`-th draft resuming at
//! `p + a + 1`, or (with `keep` up to `RING - 1`, [`StateBook::set_keep`]) a draft model
//! rewinding its last drafts, each a step of its own; and the bits of every state and row
//! are the same as if the accepted positions had been computed one per step. With `keep` 0
//! (a target model) a decode step replays one position (the last step's row); with more,
//! up to `keep` positions of the recurrence (not of the products). A step starting at
//! position 0 resets the slot.
//!
//! The convolution keeps the inputs of the last [`CONV_RING`] positions the same way: rows read
//! earlier positions from the ring and positions of their own step from the step's rows.

use super::StepBatch;
use crate::error::{Error, Result};

/// Positions of per-token delta-rule inputs a slot keeps: a step may resume at most
/// `RING - 1` positions before the end of the previous one (speculative rejection).
pub const RING: usize = 16;

/// Positions of convolution inputs a slot keeps (`RING` plus the widest supported kernel's
/// history, so a resumed step still finds its first row's taps).
pub const CONV_RING: usize = RING + MAX_CONV_KERNEL - 1;

/// The widest causal convolution supported.
pub const MAX_CONV_KERNEL: usize = 8;

/// The most state slots a snapshot may be restored into (slot ids below this): a restore
/// grows the backend's slots, and a wild id must not allocate without bound.
pub const MAX_STATE_SLOTS: usize = 1 << 16;

/// One sequence's share of a step, for the state ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqPlan {
    /// Its state slot.
    pub slot: usize,
    /// Its rows in the step, in position order (consecutive positions).
    pub rows: Vec<usize>,
    /// Position of the first row.
    pub first: usize,
    /// Committed position of the slot's state before the step (0 after a reset).
    pub replay_from: usize,
    /// Committed position after the step.
    pub commit_to: usize,
}

impl SeqPlan {
    /// Position of the last row.
    pub fn last(&self) -> usize {
        self.first + self.rows.len() - 1
    }
}

/// Where each slot's state stands (host bookkeeping, the same for every backend).
#[derive(Clone, Debug)]
pub struct StateBook {
    /// Per slot: `Some((committed, written))`, `None` when the slot holds no usable state.
    slots: Vec<Option<(usize, usize)>>,
    /// Positions before a step's last row that stay re-runnable even behind its first row.
    keep: usize,
}

impl StateBook {
    pub fn new(slots: usize) -> StateBook {
        StateBook {
            slots: vec![None; slots],
            keep: 0,
        }
    }

    /// How far behind a step's first row the next step may start: 0 (the default: the same
    /// step again, or anywhere in it) up to `RING - 1` (a draft model, which rewinds its
    /// drafts one step each; every later step then replays up to that many positions). With
    /// 0 a decode step replays one position, the last step's row.
    pub fn set_keep(&mut self, keep: usize) {
        self.keep = keep.min(RING - 1);
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Grows the book to at least `n` slots (new slots hold no state).
    pub fn grow(&mut self, n: usize) {
        if self.slots.len() < n {
            self.slots.resize(n, None);
        }
    }

    /// The plan of `batch` per sequence (in sequence order); an error naming the problem
    /// when the batch names a slot count other than its sequence count, a slot twice, rows
    /// out of order or a first position the slot's state cannot serve. A batch without state
    /// slots uses slot `i` for sequence `i`.
    pub fn plan(&self, batch: &StepBatch) -> Result<Vec<SeqPlan>> {
        let n = batch.block_tables.len();
        if !batch.state_slots.is_empty() && batch.state_slots.len() != n {
            return Err(Error::Input(format!(
                "a recurrent-state model needs one state slot per sequence: {} slots for {n} sequences",
                batch.state_slots.len()
            )));
        }
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, r) in batch.rows.iter().enumerate() {
            rows.get_mut(r.seq)
                .ok_or_else(|| Error::Input(format!("row {i} names sequence {} of {n}", r.seq)))?
                .push(i);
        }
        let mut seen = vec![false; self.slots.len()];
        let mut out = Vec::new();
        for (seq, rows) in rows.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let slot = batch.state_slots.get(seq).map_or(seq, |&s| s as usize);
            if slot >= self.slots.len() {
                return Err(Error::Input(format!(
                    "state slot {slot} of sequence {seq} is outside the backend's {} slots",
                    self.slots.len()
                )));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Error::Input(format!(
                    "state slot {slot} is used by two sequences of one step"
                )));
            }
            let first = batch.rows[rows[0]].pos as usize;
            for (k, &r) in rows.iter().enumerate() {
                if batch.rows[r].pos as usize != first + k {
                    return Err(Error::Input(format!(
                        "sequence {seq}'s rows are not consecutive positions from {first} \
                         (a recurrent-state model computes each sequence in position order)"
                    )));
                }
            }
            let replay_from = match self.slots[slot] {
                _ if first == 0 => 0,
                Some((c, w)) if c <= first && first <= w => c,
                Some((c, w)) => {
                    return Err(Error::Input(format!(
                        "state slot {slot} can resume at positions {c}..={w}, not at {first}"
                    )));
                }
                None => {
                    return Err(Error::Input(format!(
                        "state slot {slot} holds no state; sequence {seq} must start at position 0, not {first}"
                    )));
                }
            };
            let last = first + rows.len() - 1;
            let commit_to = replay_from
                .max(first.min((last + 1).saturating_sub(self.keep)))
                .max((last + 2).saturating_sub(RING));
            out.push(SeqPlan {
                slot,
                rows,
                first,
                replay_from,
                commit_to,
            });
        }
        Ok(out)
    }

    /// Records a step that ran to completion.
    pub fn commit(&mut self, plans: &[SeqPlan]) {
        for p in plans {
            self.slots[p.slot] = Some((p.commit_to, p.last() + 1));
        }
    }

    /// Where slot `slot` stands: `Some((committed, written))`, `None` when it holds no usable
    /// state (or does not exist). A step, or a snapshot
    /// ([`crate::backend::Backend::save_state`]), may start anywhere in `committed..=written`.
    pub fn span(&self, slot: usize) -> Option<(usize, usize)> {
        self.slots.get(slot).copied().flatten()
    }

    /// The committed position a snapshot of slot `slot` at `pos` replays from (its `C`, when
    /// `C <= pos <= W`); an error naming the span otherwise, or when the slot holds no state.
    pub fn save_from(&self, slot: usize, pos: usize) -> Result<usize> {
        match self.span(slot) {
            Some((c, w)) if c <= pos && pos <= w => Ok(c),
            Some((c, w)) => Err(Error::Input(format!(
                "state slot {slot} can be saved at positions {c}..={w}, not at {pos}"
            ))),
            None => Err(Error::Input(format!(
                "state slot {slot} holds no state to save"
            ))),
        }
    }

    /// Records that slot `slot` now holds the state at position `pos` with nothing pending (a
    /// restored snapshot, [`crate::backend::Backend::restore_state`]): its next step starts at
    /// `pos`. Grows the book when needed.
    pub fn set(&mut self, slot: usize, pos: usize) {
        self.grow(slot + 1);
        self.slots[slot] = Some((pos, pos));
    }

    /// Forgets slot `slot`'s state (a restore that failed part-way).
    pub fn clear(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// Forgets the state of the slots of a step that failed part-way (their layers may hold
    /// states of different positions): they must start again at position 0.
    pub fn invalidate(&mut self, plans: &[SeqPlan]) {
        for p in plans {
            self.slots[p.slot] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StepRow;

    fn batch(rows: &[(u32, usize)], slots: Vec<u32>) -> StepBatch {
        let n = rows
            .iter()
            .map(|r| r.1 + 1)
            .max()
            .unwrap_or(0)
            .max(slots.len());
        StepBatch {
            embeds: Vec::new(),
            mrope: Vec::new(),
            rows: rows
                .iter()
                .map(|&(pos, seq)| StepRow {
                    token: 1,
                    pos,
                    seq,
                    want_logits: true,
                })
                .collect(),
            block_tables: vec![vec![0]; n],
            state_slots: slots,
        }
    }

    #[test]
    fn plans_resume_and_refuse() {
        let mut book = StateBook::new(4);
        book.set_keep(RING - 1);
        // A prompt of 20 rows in slot 2: the last RING - 1 positions stay pending.
        let b = batch(&(0..20).map(|p| (p, 0)).collect::<Vec<_>>(), vec![2]);
        let p = book.plan(&b).unwrap();
        assert_eq!(p[0].commit_to, 20 - (RING - 1));
        assert_eq!((p[0].first, p[0].last(), p[0].replay_from), (0, 19, 0));
        book.commit(&p);
        // A verify step at 20..=24, then a rejection resuming at 22, the same step again,
        // then a rewind of a draft model's single-row steps.
        let p = book.plan(&batch(
            &[(20, 0), (21, 0), (22, 0), (23, 0), (24, 0)],
            vec![2],
        ));
        let p = p.unwrap();
        assert_eq!((p[0].replay_from, p[0].commit_to), (5, 10));
        book.commit(&p);
        let p = book.plan(&batch(&[(22, 0)], vec![2])).unwrap();
        assert_eq!((p[0].replay_from, p[0].commit_to), (10, 10));
        book.commit(&p);
        let p = book.plan(&batch(&[(22, 0)], vec![2])).unwrap();
        assert_eq!((p[0].replay_from, p[0].commit_to), (10, 10));
        book.commit(&p);
        for pos in 23..40 {
            let p = book.plan(&batch(&[(pos, 0)], vec![2])).unwrap();
            book.commit(&p);
        }
        let p = book
            .plan(&batch(&[(40 - (RING as u32 - 1), 0)], vec![2]))
            .unwrap();
        assert_eq!(p[0].replay_from, 40 + 1 - RING);
        book.commit(&p);
        // Before the committed position, past the written one, or a fresh slot mid-sequence.
        assert!(
            book.plan(&batch(&[(40 - RING as u32, 0)], vec![2]))
                .is_err()
        );
        assert!(book.plan(&batch(&[(27, 0)], vec![2])).is_err());
        assert!(book.plan(&batch(&[(5, 0)], vec![1])).is_err());
        // Position 0 always resets; two sequences may not share a slot; rows must be in order.
        assert!(book.plan(&batch(&[(0, 0)], vec![2])).is_ok());
        assert!(book.plan(&batch(&[(0, 0), (0, 1)], vec![3, 3])).is_err());
        assert!(book.plan(&batch(&[(0, 0), (2, 0)], vec![3])).is_err());
        assert!(book.plan(&batch(&[(0, 0), (0, 1)], vec![1])).is_err());
        // No slots named: sequence i uses slot i.
        assert_eq!(book.plan(&batch(&[(0, 0)], vec![])).unwrap()[0].slot, 0);
        assert!(book.plan(&batch(&[(0, 0)], vec![4])).is_err());
        book.invalidate(&p);
        assert!(book.plan(&batch(&[(26, 0)], vec![2])).is_err());
    }

    /// The default: a step commits before its first row, so a decode step replays one
    /// position (the last step's), and only the last step can be re-run or resumed inside.
    #[test]
    fn a_target_replays_one_position_when_decoding() {
        let mut book = StateBook::new(1);
        let b = batch(&(0..10).map(|p| (p, 0)).collect::<Vec<_>>(), vec![0]);
        let p = book.plan(&b).unwrap();
        assert_eq!(p[0].commit_to, 0);
        book.commit(&p);
        for pos in 10..14 {
            let p = book.plan(&batch(&[(pos, 0)], vec![0])).unwrap();
            let from = if pos == 10 { 0 } else { pos as usize - 1 };
            assert_eq!((p[0].replay_from, p[0].commit_to), (from, pos as usize));
            book.commit(&p);
        }
        // A verify step 14..=18 rejected after its second draft, then decoding on.
        let p = book.plan(&batch(
            &[(14, 0), (15, 0), (16, 0), (17, 0), (18, 0)],
            vec![0],
        ));
        book.commit(&p.unwrap());
        let p = book.plan(&batch(&[(17, 0)], vec![0])).unwrap();
        assert_eq!((p[0].replay_from, p[0].commit_to), (14, 17));
        book.commit(&p);
        // The same step again is fine; one step further back is not.
        assert!(book.plan(&batch(&[(17, 0)], vec![0])).is_ok());
        assert!(book.plan(&batch(&[(16, 0)], vec![0])).is_err());
    }

    #[test]
    fn span_and_set() {
        let mut book = StateBook::new(2);
        assert_eq!(book.span(0), None);
        assert_eq!(book.span(7), None);
        let p = book
            .plan(&batch(
                &(0..20).map(|p| (p, 0)).collect::<Vec<_>>(),
                vec![1],
            ))
            .unwrap();
        book.commit(&p);
        assert_eq!(book.span(1), Some((20 - (RING - 1), 20)));
        // A restored snapshot at 32 in a slot beyond the book: the next step starts there and
        // nowhere else.
        book.set(5, 32);
        assert_eq!(book.slots(), 6);
        assert_eq!(book.span(5), Some((32, 32)));
        assert!(book.plan(&batch(&[(32, 0)], vec![5])).is_ok());
        assert!(book.plan(&batch(&[(31, 0)], vec![5])).is_err());
        assert!(book.plan(&batch(&[(33, 0)], vec![5])).is_err());
        book.clear(5);
        book.clear(99);
        assert_eq!(book.span(5), None);
    }
}
