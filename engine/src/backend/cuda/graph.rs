//! The step as a CUDA graph, one per bucket of M rows (1, 2, 4, ..., 64). A batch of m rows runs
//! in the smallest bucket >= m; rows m.. are inert (token 0 at position 0 of a private KV block
//! the backend keeps beyond `kv_blocks`; their outputs are never read). All per-step inputs live
//! in fixed device buffers, refreshed by host-to-device copies on the stream before each replay.
//! The graph computes logits for every bucket row (the final norm and output projection are
//! row-invariant), so which rows want logits is not part of the graph.
//!
//! A graph is captured on first use of its bucket and re-captured when a buffer it reads moved
//! (`layout_epoch`: activations grown or RoPE tables extended). The captured kernels are the
//! runner's whole forward pass (`HeadRows::All`: the head over every bucket row). Attention's score stride is the
//! fixed `ctx_cap` (the KV capacity in positions) instead of the batch's largest `pos + 1`; it
//! only lays out scratch, so the rows' bits are those of the plain path (`memra-verify graph`).

use std::collections::HashMap;

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::CudaOps;
use super::step::{Meta, SCORE_FLOATS, u32_of};
use crate::backend::StepBatch;
use crate::backend::exec::HeadRows;
use crate::error::Result;
use crate::ops::Rows;

/// Row counts of the captured graphs.
pub const BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
pub(super) const MAX_BUCKET: usize = 64;

/// A captured graph. `CudaGraph` holds raw driver handles and is not `Send`; it is only used
/// through `&mut CudaBackend`, one thread at a time, which is the external serialization the
/// CUDA documentation asks for.
struct SendGraph(cudarc::driver::CudaGraph);
// SAFETY: see above; the graph is never shared, only moved with its backend.
unsafe impl Send for SendGraph {}

struct Captured {
    epoch: u64,
    graph: SendGraph,
}

/// Fixed buffers of the graphs.
pub(super) struct GraphState {
    /// Positions covered: the attention score stride and the RoPE table length.
    ctx_cap: usize,
    /// Input buffers: tokens, pos, row_seq, slot (MAX_BUCKET each), table_off, tables, the
    /// recurrent-state plan (delta.rs).
    inputs: Vec<CudaSlice<u32>>,
    scores: CudaSlice<f32>,
    graphs: HashMap<usize, Captured>,
    /// Replays and captures so far.
    pub replays: u64,
    pub captures: u64,
}

const TOKENS: usize = 0;
const POS: usize = 1;
const ROW_SEQ: usize = 2;
const SLOT: usize = 3;
const TABLE_OFF: usize = 4;
const TABLES: usize = 5;
const STATE_PLAN: usize = 6;

impl CudaOps {
    /// Positions the graph buffers cover.
    fn graph_ctx_cap(&self) -> usize {
        let kv = self.kv_blocks * self.block_size;
        if self.max_ctx > 0 {
            kv.min(self.max_ctx)
        } else {
            kv
        }
    }

    fn new_graph_state(&self) -> Result<GraphState> {
        let g = &self.gpu;
        let ctx_cap = self.graph_ctx_cap();
        let blocks_per_seq = ctx_cap.div_ceil(self.block_size);
        let sizes = [
            MAX_BUCKET,
            MAX_BUCKET,
            MAX_BUCKET,
            MAX_BUCKET,
            MAX_BUCKET + 1,
            MAX_BUCKET * blocks_per_seq + 1,
            super::delta::plan_words_cap(MAX_BUCKET, MAX_BUCKET),
        ];
        let mut inputs = Vec::with_capacity(sizes.len());
        for n in sizes {
            inputs.push(g.zeros::<u32>(n)?);
        }
        let per_row = self.n_heads * super::attn_part_floats(ctx_cap, self.head_dim);
        let score_rows = (SCORE_FLOATS / per_row.max(1)).clamp(1, MAX_BUCKET);
        Ok(GraphState {
            ctx_cap,
            inputs,
            scores: g.zeros(score_rows * per_row)?,
            graphs: HashMap::new(),
            replays: 0,
            captures: 0,
        })
    }

    /// Runs `pass` over `batch` as the graph of its bucket; `None` when it does not fit one
    /// (more than 64 rows or sequences, or a position beyond the KV capacity): the caller runs
    /// it plainly. `check_batch` has passed. Returns the head rows of `want`: the rows
    /// themselves (the graph computes logits for every row).
    pub(super) fn execute_graph(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Option<Vec<usize>>> {
        let m = batch.rows.len();
        let Some(&bucket) = BUCKETS.iter().find(|&&b| b >= m) else {
            return Ok(None);
        };
        let ctx_cap = self.graph_ctx_cap();
        if batch.block_tables.len() > MAX_BUCKET
            || batch.rows.iter().any(|r| r.pos as usize >= ctx_cap)
        {
            return Ok(None);
        }
        self.reserve(Rows::Step, MAX_BUCKET)?;
        self.reserve(Rows::Head, MAX_BUCKET)?;
        self.ensure_rope(ctx_cap - 1)?;
        let mut gs = match self.graph.take() {
            Some(gs) => gs,
            None => self.new_graph_state()?,
        };
        let r = self.replay(&mut gs, batch, bucket, pass);
        self.graph = Some(gs);
        r?;
        Ok(Some(want.to_vec()))
    }

    /// The host side of the fixed inputs for `batch` padded to `bucket` rows.
    fn graph_inputs(&self, batch: &StepBatch, bucket: usize) -> Result<[Vec<u32>; 7]> {
        let bs = self.block_size;
        let dummy = self.kv_blocks; // the inert rows' private block
        let n_t = batch.block_tables.len();
        // Each table cut to the blocks its rows reach.
        let mut need = vec![0usize; n_t];
        for r in &batch.rows {
            if let Some(n) = need.get_mut(r.seq) {
                *n = (*n).max(r.pos as usize / bs + 1);
            }
        }
        let mut table_off = Vec::with_capacity(n_t + 1);
        let mut tables = Vec::new();
        for (t, &n) in batch.block_tables.iter().zip(&need) {
            table_off.push(u32_of(tables.len(), "block table offset")?);
            tables.extend_from_slice(t.get(..n).unwrap_or(t));
        }
        table_off.push(u32_of(tables.len(), "block table offset")?);
        tables.push(u32_of(dummy, "KV block")?);
        let mut tokens = vec![0u32; bucket];
        let mut pos = vec![0u32; bucket];
        let mut row_seq = vec![u32_of(n_t, "sequence index")?; bucket];
        let mut slot = vec![u32_of(dummy * bs, "KV position index")?; bucket];
        for (i, r) in batch.rows.iter().enumerate() {
            let p = r.pos as usize;
            let block = batch
                .block_tables
                .get(r.seq)
                .and_then(|t| t.get(p / bs))
                .copied()
                .ok_or_else(|| {
                    self.gpu
                        .err(format!("row {i}: no KV block for its position"))
                })?;
            tokens[i] = r.token;
            pos[i] = r.pos;
            row_seq[i] = u32_of(r.seq, "sequence index")?;
            slot[i] = u32_of(block as usize * bs + p % bs, "KV position index")?;
        }
        // Every bucket entry of the plan: inert past the step's sequences.
        let plan = match self.states.layers.is_empty() {
            true => vec![0],
            false => super::delta::plan_words(&self.states.plans, bucket)?,
        };
        Ok([tokens, pos, row_seq, slot, table_off, tables, plan])
    }

    fn replay(
        &mut self,
        gs: &mut GraphState,
        batch: &StepBatch,
        bucket: usize,
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<()> {
        let host = self.graph_inputs(batch, bucket)?;
        let g = &self.gpu;
        for (src, dst) in host.iter().zip(gs.inputs.iter_mut()) {
            if src.len() > dst.len() {
                return Err(g.err(format!(
                    "graph input of {} values exceeds its buffer of {}",
                    src.len(),
                    dst.len()
                )));
            }
            g.stream
                .memcpy_htod(src.as_slice(), dst)
                .map_err(|e| g.err(format!("graph input copy: {e:?}")))?;
        }
        let fresh = gs
            .graphs
            .get(&bucket)
            .is_some_and(|c| c.epoch == self.layout_epoch);
        if !fresh {
            gs.graphs.remove(&bucket);
            let graph = self.capture(gs, bucket, pass)?;
            gs.graphs.insert(
                bucket,
                Captured {
                    epoch: self.layout_epoch,
                    graph: SendGraph(graph),
                },
            );
            gs.captures += 1;
        }
        let g = &self.gpu;
        let c = gs
            .graphs
            .get(&bucket)
            .ok_or_else(|| g.err("graph missing after capture"))?;
        c.graph
            .0
            .launch()
            .map_err(|e| g.err(format!("graph launch (bucket {bucket}): {e:?}")))?;
        gs.replays += 1;
        Ok(())
    }

    /// Records the kernels of a `bucket`-row step (the whole forward pass, the head over every
    /// row) into a graph.
    fn capture(
        &mut self,
        gs: &GraphState,
        bucket: usize,
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<cudarc::driver::CudaGraph> {
        let p = |i: usize| gs.inputs.get(i).map(|b| self.gpu.ptr(b)).unwrap_or(0);
        self.meta = Meta {
            tokens: p(TOKENS),
            pos: p(POS),
            row_seq: p(ROW_SEQ),
            slot: p(SLOT),
            table_off: p(TABLE_OFF),
            tables: p(TABLES),
            ctx: gs.ctx_cap,
            // Steps with image rows never run as graphs (step.rs execute_any).
            spans: 0,
            pos3: 0,
        };
        self.scores = (self.gpu.ptr(&gs.scores), gs.scores.len());
        self.rows = [bucket, bucket];
        self.states.dev = match self.states.layers.is_empty() {
            true => (0, 0),
            false => (p(STATE_PLAN), bucket),
        };
        self.gpu
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.gpu.err(format!("begin graph capture: {e:?}")))?;
        let kernels = pass(self, HeadRows::All);
        // End the capture whatever happened, so the stream leaves capture mode.
        let g = &self.gpu;
        let end = g.stream.end_capture(CUgraphInstantiate_flags(0));
        kernels?;
        end.map_err(|e| g.err(format!("end graph capture: {e:?}")))?
            .ok_or_else(|| g.err("graph capture recorded nothing"))
    }

    /// (captures, replays) so far.
    pub(super) fn graph_counts(&self) -> (u64, u64) {
        self.graph
            .as_ref()
            .map(|gs| (gs.captures, gs.replays))
            .unwrap_or((0, 0))
    }
}
