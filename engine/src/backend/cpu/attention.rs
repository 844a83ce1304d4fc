//! Causal attention of each query row over its own sequence's paged KV, in position order (K and
//! V read back from the cache's format as f32); rows of a bidirectional image span also see the
//! rest of their image (backend/spans.rs).

use rayon::prelude::*;

use super::kv::KvStore;
use super::ops::dot;
use crate::backend::StepBatch;
use crate::backend::spans::{attn_range, row_spans};
use crate::ops::AttnParams;

/// `q` holds one row of `n_heads * head_dim` per batch row; writes the attention output rows
/// into `out`. Each (row, head) walks its positions (`0..=pos`, or the window's, widened to its
/// image span with `s.spans`: [`attn_range`]) in order: scores, max, exp-sum and the weighted
/// sum of V in that order, so the result is the same whatever the batch or chunking.
pub fn attention(
    pool: &rayon::ThreadPool,
    kv: &KvStore,
    layer: usize,
    batch: &StepBatch,
    q: &[f32],
    s: &AttnParams,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let scale = s.scale;
    let spans = if s.spans {
        row_spans(batch)
    } else {
        Vec::new()
    };
    pool.install(|| {
        out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
            let (ri, h) = (idx / s.n_heads, idx % s.n_heads);
            let row = batch.rows[ri];
            let table = &batch.block_tables[row.seq];
            let qh = &q[(ri * s.n_heads + h) * hd..(ri * s.n_heads + h + 1) * hd];
            let kvh = h / group;
            let span = spans.get(ri).and_then(|x| x.as_ref());
            let r = attn_range(row.pos as usize, s.window, span);
            let (start, n) = (r.start, r.end);
            let cols = kvh * hd..(kvh + 1) * hd;
            let (bs, mut kvbuf) = (kv.block_size, vec![0f32; hd]);
            let mut scores = Vec::with_capacity(n - start);
            for p in start..n {
                kv.read(
                    layer,
                    table[p / bs],
                    p % bs,
                    false,
                    cols.clone(),
                    &mut kvbuf,
                );
                scores.push(dot(qh, &kvbuf) * scale);
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            o.fill(0.0);
            for (p, &w) in (start..n).zip(&scores) {
                kv.read(layer, table[p / bs], p % bs, true, cols.clone(), &mut kvbuf);
                for (oi, &vi) in o.iter_mut().zip(&kvbuf) {
                    *oi += w * vi;
                }
            }
            let inv = 1.0 / sum;
            for oi in o.iter_mut() {
                *oi *= inv;
            }
        });
    });
}
