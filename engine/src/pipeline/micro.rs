//! Micro-batches (`--pp-micro N`): a step's rows cut into up to N consecutive runs of whole
//! sequences, so that the stages of a pipeline on two devices work at once (stage 0 runs
//! micro-batch j + 1 while stage 1 runs micro-batch j; backend.rs orders the work).
//!
//! A sequence's rows (a prefill chunk, a verify step's drafts) are never cut apart and the
//! batch's row order is kept: a micro-batch is rows `a..b` of the step. Exactness: every op is
//! row-invariant (a row's values depend only on its own sequence, EXACTNESS.md), so a row
//! gives the same bits in any micro-batch; the merged outputs are in the step's row order.

use std::borrow::Cow;
use std::ops::Range;

use crate::backend::{StepBatch, StepRow};

/// One micro-batch of a step.
#[derive(Clone, Debug)]
pub struct Micro<'a> {
    /// Its rows in the step.
    pub rows: Range<usize>,
    /// Its entries among the step's rows that want logits (the `select`, `logprobs` and
    /// output entries).
    pub want: Range<usize>,
    /// The rows as a step of their own: sequences renumbered in order of appearance (their
    /// block tables and state slots with them), given embeddings and M-RoPE positions moved
    /// with their rows. The step itself when it is not cut.
    pub batch: Cow<'a, StepBatch>,
}

/// Where a step may be cut: after row `k - 1` for each `k` in the result (`0 < k < rows`),
/// when no sequence has rows on both sides.
pub fn cut_points(batch: &StepBatch) -> Vec<usize> {
    let rows = &batch.rows;
    let mut last = vec![0usize; batch.block_tables.len()];
    for (i, r) in rows.iter().enumerate() {
        if let Some(l) = last.get_mut(r.seq) {
            *l = i;
        }
    }
    let mut reach = 0;
    let mut cuts = Vec::new();
    for (k, r) in rows.iter().enumerate() {
        if k > 0 && reach < k {
            cuts.push(k);
        }
        reach = reach.max(last.get(r.seq).copied().unwrap_or(k));
    }
    cuts
}

/// `batch` cut into at most `n` micro-batches of whole sequences, as even in rows as the
/// sequences allow (each cut the allowed one nearest its share). One micro-batch (the step,
/// not copied) when `n <= 1` or the step holds one sequence.
pub fn split(batch: &StepBatch, n: usize) -> Vec<Micro<'_>> {
    let len = batch.rows.len();
    let allowed = if n > 1 { cut_points(batch) } else { Vec::new() };
    let mut cuts: Vec<usize> = Vec::new();
    for j in 1..n {
        let target = (j * len + n / 2) / n;
        let prev = cuts.last().copied().unwrap_or(0);
        let best = allowed
            .iter()
            .copied()
            .filter(|&c| c > prev)
            .min_by_key(|&c| c.abs_diff(target));
        if let Some(c) = best {
            cuts.push(c);
        }
    }
    if cuts.is_empty() {
        let want = batch.rows.iter().filter(|r| r.want_logits).count();
        return vec![Micro {
            rows: 0..len,
            want: 0..want,
            batch: Cow::Borrowed(batch),
        }];
    }
    let mut bounds = vec![0];
    bounds.extend(cuts);
    bounds.push(len);
    let mut want_before = 0;
    bounds
        .windows(2)
        .map(|w| {
            let rows = w[0]..w[1];
            let want = batch.rows[rows.clone()]
                .iter()
                .filter(|r| r.want_logits)
                .count();
            let m = Micro {
                want: want_before..want_before + want,
                batch: Cow::Owned(sub_batch(batch, rows.clone())),
                rows,
            };
            want_before += want;
            m
        })
        .collect()
}

/// Rows `rows` of `batch` as a step of their own (see [`Micro::batch`]).
fn sub_batch(batch: &StepBatch, rows: Range<usize>) -> StepBatch {
    let mut seqs: Vec<usize> = Vec::new();
    let mut out_rows = Vec::with_capacity(rows.len());
    for r in &batch.rows[rows.clone()] {
        let seq = match seqs.iter().position(|&s| s == r.seq) {
            Some(i) => i,
            None => {
                seqs.push(r.seq);
                seqs.len() - 1
            }
        };
        out_rows.push(StepRow { seq, ..*r });
    }
    let block_tables = seqs
        .iter()
        .map(|&s| batch.block_tables.get(s).cloned().unwrap_or_default())
        .collect();
    // A step without state slots uses slot `i` for sequence `i` (backend/state.rs): the
    // renumbered sequences keep their slots by naming them.
    let state_slots = match batch.state_slots.is_empty() {
        true => seqs.iter().map(|&s| s as u32).collect(),
        false => seqs
            .iter()
            .filter_map(|&s| batch.state_slots.get(s).copied())
            .collect(),
    };
    let embeds = batch
        .embeds
        .iter()
        .filter(|e| rows.contains(&e.row))
        .map(|e| crate::backend::RowEmbed {
            row: e.row - rows.start,
            ..e.clone()
        })
        .collect();
    let mrope = batch.mrope.get(rows.clone()).map(<[_]>::to_vec);
    StepBatch {
        rows: out_rows,
        block_tables,
        state_slots,
        embeds,
        mrope: mrope.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seqs: &[usize]) -> StepBatch {
        let n = seqs.iter().max().map_or(0, |m| m + 1);
        StepBatch {
            rows: seqs
                .iter()
                .enumerate()
                .map(|(i, &seq)| StepRow {
                    token: i as u32,
                    pos: i as u32,
                    seq,
                    want_logits: i % 2 == 0,
                })
                .collect(),
            block_tables: (0..n).map(|s| vec![s as u32]).collect(),
            state_slots: (0..n).map(|s| 10 + s as u32).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn cuts_fall_between_whole_sequences() {
        assert_eq!(cut_points(&batch(&[0, 0, 1, 1, 1, 2])), vec![2, 5]);
        // Sequence 0's rows around sequence 1's: no cut inside.
        assert_eq!(cut_points(&batch(&[0, 1, 0, 2])), vec![3]);
        assert!(cut_points(&batch(&[0, 0, 0])).is_empty());
    }

    #[test]
    fn a_split_keeps_rows_and_renumbers_sequences() {
        let b = batch(&[0, 0, 0, 1, 2, 2, 3]);
        let parts = split(&b, 2);
        assert_eq!(parts.len(), 2);
        // Seven rows: the cut nearest row 4 of those allowed (3, 4, 6).
        assert_eq!(parts[0].rows, 0..4);
        assert_eq!(parts[1].rows, 4..7);
        assert_eq!((parts[0].want.clone(), parts[1].want.clone()), (0..2, 2..4));
        let p1 = &parts[1].batch;
        assert_eq!(p1.block_tables, vec![vec![2], vec![3]]);
        assert_eq!(p1.state_slots, vec![12, 13]);
        let seqs: Vec<usize> = p1.rows.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![0, 0, 1]);
        assert_eq!(p1.rows[0].token, 4);
        // Every row once, in order.
        let toks: Vec<u32> = parts
            .iter()
            .flat_map(|p| p.batch.rows.iter().map(|r| r.token))
            .collect();
        assert_eq!(toks, (0..7).collect::<Vec<u32>>());
        // Four micro-batches of a 4-sequence step; one when asked for one or one sequence.
        assert_eq!(split(&b, 4).len(), 4);
        assert_eq!(split(&b, 8).len(), 4);
        assert!(matches!(split(&b, 1)[0].batch, Cow::Borrowed(_)));
        assert_eq!(split(&batch(&[0, 0, 0]), 2).len(), 1);
        // Without state slots, sequence i's slot is i: the renumbered sequences name theirs.
        let mut b = batch(&[0, 1, 2, 2]);
        b.state_slots.clear();
        let parts = split(&b, 2);
        assert_eq!(parts[1].batch.state_slots, vec![2]);
        assert!(split(&StepBatch::default(), 2).len() == 1);
    }
}
