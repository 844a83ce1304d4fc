//! Bidirectional attention within an image (Gemma 3; HF transformers' `token_type_ids` mask and
//! llama.cpp mtmd's non-causal image batch): a row of an image's soft tokens sees every
//! position of its own image, before and after it; text rows stay causal, and so do image
//! rows towards everything outside their image. On sliding-window layers a row sees the union
//! of its window and its image (HF ORs the image mask into both the full and the sliding mask).
//!
//! The span of a row comes with its given embedding ([`RowEmbed::span`]). A row may see
//! positions past its own only if their K and V are written before its attention runs: the
//! step holds them (every row's K/V of a layer is written before that layer's attention), or
//! an earlier step did. So a step that holds a row of an image must hold the image's last
//! position too ([`check_spans`]); the scheduler never ends a prefill chunk inside an image
//! (scheduler.rs, docs/VERIFY.md "Image spans").

use std::ops::Range;

use super::{RowEmbed, StepBatch};
use crate::error::{Error, Result};

/// The positions `lo..n` a row at `pos` attends to: `..=pos` (from `pos + 1 - window` under a
/// sliding window), widened to the whole of `span` when the row belongs to a bidirectional
/// image span. The CPU attention and the CUDA kernels (`attn_row_range`, kvfmt.cuh) use this
/// rule.
pub fn attn_range(pos: usize, window: Option<usize>, span: Option<&Range<usize>>) -> Range<usize> {
    let n = pos + 1;
    let lo = window.map_or(0, |w| n.saturating_sub(w));
    match span {
        Some(s) => lo.min(s.start)..n.max(s.end),
        None => lo..n,
    }
}

/// Per step row, its image span (`None` for a text row); empty when the step has no given
/// embeddings.
pub fn row_spans(batch: &StepBatch) -> Vec<Option<Range<usize>>> {
    if batch.embeds.is_empty() {
        return Vec::new();
    }
    let mut out = vec![None; batch.rows.len()];
    for e in &batch.embeds {
        if let Some(o) = out.get_mut(e.row) {
            *o = Some(e.span.start as usize..e.span.end as usize);
        }
    }
    out
}

/// Checks the image spans of a step's given embeddings: each holds its row's position, and the
/// step holds the span's last position in the row's sequence (rows of a sequence are in
/// position order, so its last row in the step is at or past it).
pub fn check_spans(batch: &StepBatch) -> Result<()> {
    if batch.embeds.is_empty() {
        return Ok(());
    }
    let mut last = vec![0u32; batch.block_tables.len()];
    for r in &batch.rows {
        if let Some(l) = last.get_mut(r.seq) {
            *l = (*l).max(r.pos);
        }
    }
    for RowEmbed { row, span, .. } in &batch.embeds {
        let Some(r) = batch.rows.get(*row) else {
            continue; // check_embeds reports it
        };
        if !span.contains(&r.pos) {
            return Err(Error::Input(format!(
                "step row {row} at position {} has the image span {span:?}, which does not hold it",
                r.pos
            )));
        }
        let end = last.get(r.seq).copied().unwrap_or(0);
        if end + 1 < span.end {
            return Err(Error::Input(format!(
                "step row {row}: its image spans positions {span:?} but the step ends its \
                 sequence at {end}: a step must hold an image's last position (its rows attend \
                 to the whole image)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_row_sees_its_whole_span_and_its_window() {
        assert_eq!(attn_range(5, None, None), 0..6);
        assert_eq!(attn_range(5, Some(2), None), 4..6);
        assert_eq!(attn_range(5, None, Some(&(3..9))), 0..9);
        // The window and the span: their union (both hold the row).
        assert_eq!(attn_range(5, Some(2), Some(&(3..9))), 3..9);
        assert_eq!(attn_range(8, Some(4), Some(&(7..9))), 5..9);
        assert_eq!(attn_range(8, Some(1), Some(&(8..9))), 8..9);
    }
}
