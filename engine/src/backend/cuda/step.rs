//! One step on the device: upload the rows' metadata, run the forward pass (plainly, or as a
//! CUDA graph: graph.rs), read back logits or pick tokens on the device (select.rs).

use cudarc::driver::CudaSlice;

use super::{CudaOps, select};
use crate::backend::exec::{Exec, HeadRows};
use crate::backend::{SelectParams, Selected, StepBatch, StepSelected};
use crate::error::{Error, Result};
use crate::ops::{Act, Rows};

/// Bound on the attention scratch (split partials) of one launch (floats); launches are split
/// by rows.
pub(super) const SCORE_FLOATS: usize = 64 << 20;

/// Row metadata on the device (addresses of u32 arrays).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Meta {
    pub tokens: u64,
    pub pos: u64,
    pub row_seq: u64,
    pub slot: u64,
    pub table_off: u64,
    pub tables: u64,
    /// At least the largest `pos + 1` of the step's rows (sizes the attention scratch), and
    /// the largest end of its image spans.
    pub ctx: usize,
    /// Per row its image span or `(pos, pos + 1)`, a u32 pair ([`super::AttnArgs::spans`]);
    /// 0 for a step without image rows.
    pub spans: u64,
    /// Per row its M-RoPE positions (temporal, height, width; [`StepBatch::mrope`]), three
    /// u32; 0 for a step without them (M-RoPE tables then take `pos`, which is the same).
    pub pos3: u64,
}

/// Owned buffers of a plain (non-graph) step (row metadata, attention scores, gather indices),
/// held until the next step so they outlive the kernels that read them.
pub(super) struct PlainBufs {
    _meta: Vec<CudaSlice<u32>>,
    /// The recurrent-state plan (delta.rs), for a model with DeltaNet layers.
    _plan: Option<CudaSlice<u32>>,
    _scores: Option<CudaSlice<f32>>,
    gather: Option<CudaSlice<u32>>,
}

pub(super) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Input(format!("{what} {v} exceeds u32")))
}

impl CudaOps {
    /// Uploads `batch`'s row metadata; returns the buffers and the largest `pos + 1`.
    fn upload_meta(&self, batch: &StepBatch) -> Result<(Vec<CudaSlice<u32>>, usize)> {
        let bs = self.block_size;
        let mut tokens = Vec::with_capacity(batch.rows.len());
        let mut pos = Vec::with_capacity(batch.rows.len());
        let mut row_seq = Vec::with_capacity(batch.rows.len());
        let mut slot = Vec::with_capacity(batch.rows.len());
        let mut ctx = 0usize;
        for r in &batch.rows {
            let p = r.pos as usize;
            // check_batch ran: the table and block exist.
            let block = batch.block_tables[r.seq][p / bs] as usize;
            tokens.push(r.token);
            pos.push(r.pos);
            row_seq.push(u32_of(r.seq, "sequence index")?);
            slot.push(u32_of(block * bs + p % bs, "KV position index")?);
            ctx = ctx.max(p + 1);
        }
        let mut table_off = Vec::with_capacity(batch.block_tables.len());
        let mut tables = Vec::new();
        for t in &batch.block_tables {
            table_off.push(u32_of(tables.len(), "block table offset")?);
            tables.extend_from_slice(t);
        }
        let g = &self.gpu;
        if tables.is_empty() {
            tables.push(0);
        }
        let mut bufs = Vec::with_capacity(7);
        for v in [&tokens, &pos, &row_seq, &slot, &table_off, &tables] {
            bufs.push(g.upload(v)?);
        }
        // Image rows: every row's (start, end) as the attention kernels read it (buffer 6).
        let spans = crate::backend::spans::row_spans(batch);
        if !spans.is_empty() {
            let mut v = Vec::with_capacity(2 * spans.len());
            for (r, s) in batch.rows.iter().zip(&spans) {
                let s = s.clone().unwrap_or(r.pos as usize..r.pos as usize + 1);
                ctx = ctx.max(s.end);
                v.extend([u32_of(s.start, "image start")?, u32_of(s.end, "image end")?]);
            }
            bufs.push(g.upload(&v)?);
        }
        // M-RoPE positions: three a row (buffer 6, or 7 after the spans).
        if !batch.mrope.is_empty() {
            let v: Vec<u32> = batch.mrope.iter().flatten().copied().collect();
            bufs.push(g.upload(&v)?);
        }
        Ok((bufs, ctx))
    }

    /// As a CUDA graph when enabled and the batch fits a bucket, else plainly (a step with
    /// given embedding rows always plainly: its row copies differ from step to step; so does a
    /// step with M-RoPE positions, whose kernels read them: a graph's launches read `pos`).
    fn execute_any(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Vec<usize>> {
        if self.graphs_on
            && batch.embeds.is_empty()
            && batch.mrope.is_empty()
            && let Some(rows) = self.execute_graph(batch, want, pass)?
        {
            return Ok(rows);
        }
        self.execute_plain(batch, want, pass)
    }

    /// Runs `pass` over `batch` outside any graph, the head on the rows of `want`.
    fn execute_plain(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Vec<usize>> {
        let m = batch.rows.len();
        let (bufs, ctx) = self.upload_meta(batch)?;
        self.reserve(Rows::Step, m)?;
        self.ensure_rope(ctx - 1)?;
        let g = &self.gpu;
        let p = |i: usize| bufs.get(i).map(|b| g.ptr(b)).unwrap_or(0);
        // The optional buffers after the six: the spans (a step with image rows), then the
        // M-RoPE positions.
        let spans = !batch.embeds.is_empty();
        let pos3 = match batch.mrope.is_empty() {
            true => 0,
            false => p(6 + usize::from(spans)),
        };
        self.meta = Meta {
            tokens: p(0),
            pos: p(1),
            row_seq: p(2),
            slot: p(3),
            table_off: p(4),
            tables: p(5),
            ctx,
            spans: if spans { p(6) } else { 0 },
            pos3,
        };
        let per_row = self.n_heads * super::attn_part_floats(ctx, self.head_dim);
        let score_rows = (SCORE_FLOATS / per_row.max(1)).clamp(1, m);
        let scores = g.zeros::<f32>(score_rows * per_row)?;
        self.scores = (g.ptr(&scores), scores.len());
        let plans = &self.states.plans;
        let plan = match plans.is_empty() {
            true => None,
            false => Some(g.upload(&super::delta::plan_words(plans, plans.len())?)?),
        };
        self.states.dev = (plan.as_ref().map_or(0, |b| g.ptr(b)), plans.len());
        self.plain = Some(PlainBufs {
            _meta: bufs,
            _plan: plan,
            _scores: Some(scores),
            gather: None,
        });
        self.rows[0] = m;
        pass(self, HeadRows::Gather(want))?;
        if let Some(p) = &self.prof {
            p.finish_step(m);
        }
        Ok((0..want.len()).collect())
    }
}

impl Exec for CudaOps {
    fn name(&self) -> String {
        self.gpu.name.clone()
    }

    fn profile(&self) -> Option<String> {
        let p = &self.products;
        let products = if p.v2 {
            p.profile.describe()
        } else {
            "products v1".into()
        };
        let launch = if self.gpu.pdl { "pdl" } else { "plain" };
        Some(format!(
            "{products}; attention {}; launches {launch}",
            self.gpu.attn_kernel()
        ))
    }

    fn kv_block_size(&self) -> usize {
        self.block_size
    }

    fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    fn kv_dtype(&self) -> crate::kv_format::KvDtype {
        self.kv_dtype
    }

    /// As a CUDA graph when enabled and the batch fits a bucket, else plainly, with the hidden
    /// input rows checked (hidden.rs). Either way it returns with the pass enqueued on the
    /// stream and not waited for (the inputs go up by stream-ordered copies; the only explicit
    /// synchronizations are before the first kernel, when the activations grow, and the op
    /// profile's with `MEMRA_PROFILE_OPS=1`): the runner computes the step's grammar masks while
    /// the device runs it, and [`Exec::select`]'s read-back is the step's first wait.
    fn execute(
        &mut self,
        batch: &StepBatch,
        want: &[usize],
        pass: &mut dyn FnMut(&mut Self, HeadRows) -> Result<()>,
    ) -> Result<Vec<usize>> {
        self.plan_states(batch)?;
        if let Err(e) = self.begin_hidden_in(batch.rows.len()) {
            self.finish_states(false);
            return Err(e);
        }
        self.embeds.clone_from(&batch.embeds);
        let r = self.execute_any(batch, want, pass);
        self.embeds.clear();
        self.finish_states(r.is_ok());
        self.end_hidden_in();
        r
    }

    fn gather(&mut self, x: Act, rows: &[usize], out: Act) -> Result<()> {
        let n = rows.len();
        self.reserve(Rows::Head, n)?;
        self.rows[1] = n;
        let idx: Vec<u32> = rows
            .iter()
            .map(|&r| u32_of(r, "row index"))
            .collect::<Result<_>>()?;
        let g = &self.gpu;
        let idx = g.upload(&idx)?;
        g.gather_rows(self.ptr(out)?, self.ptr(x)?, g.ptr(&idx), n, x.width)?;
        if let Some(p) = self.plain.as_mut() {
            p.gather = Some(idx);
        }
        Ok(())
    }

    /// One device-to-host copy of the rows from the first to the last of `rows` (logits, or
    /// the final residual rows a step left in its activation).
    fn read_rows(&mut self, x: Act, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
        let (Some(&first), Some(&last)) = (rows.iter().min(), rows.iter().max()) else {
            self.gpu.sync()?;
            return Ok(Vec::new());
        };
        let w = x.width;
        let d = &self.acts[x.id];
        let buf = d.buf.as_ref().ok_or_else(|| {
            self.gpu
                .err(format!("activation {} is not allocated", d.name))
        })?;
        let host = self
            .gpu
            .download_range(buf, first * w, (last + 1 - first) * w)?;
        let out = rows
            .iter()
            .map(|&r| {
                host.get((r - first) * w..(r + 1 - first) * w)
                    .map(|s| s.to_vec())
                    .ok_or_else(|| {
                        self.gpu
                            .err(format!("row {r} beyond activation {}", d.name))
                    })
            })
            .collect();
        self.gpu.sync()?;
        out
    }

    /// Greedy and small-top-k rows, masked (structured-output) ones included, are picked on
    /// the device (select.rs); the others' logits come back and are sampled on the host.
    fn select(
        &mut self,
        logits: Act,
        rows: &[usize],
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        let dev: Vec<(usize, SelectParams)> = select
            .iter()
            .zip(rows)
            .filter_map(|(s, &r)| s.map(|s| (r, s)))
            .collect();
        let picked = if dev.is_empty() {
            Vec::new()
        } else {
            select::select_rows(&self.gpu, self.ptr(logits)?, logits.width, &dev)?
        };
        // Rows that need their logits: `None` rows and host-planned ones.
        let mut picked_iter = picked.into_iter();
        let mut tokens: Vec<Option<u32>> = Vec::with_capacity(select.len());
        for s in select {
            tokens.push(match s {
                Some(_) => picked_iter.next().flatten(),
                None => None,
            });
        }
        let need: Vec<usize> = (0..select.len())
            .filter(|&i| tokens[i].is_none())
            .filter_map(|i| rows.get(i).copied())
            .collect();
        let back = self.read_rows(logits, &need)?;
        // Host-planned rows are sampled together (in parallel when they are many; masked ones
        // by `sample_masked`).
        let mut back_iter = back.iter();
        let jobs: Vec<(&[f32], SelectParams)> = select
            .iter()
            .zip(&tokens)
            .filter(|(_, t)| t.is_none())
            .filter_map(|(s, _)| {
                let l = back_iter.next()?;
                s.map(|s| (l.as_slice(), s))
            })
            .collect();
        let mut host_tokens = crate::backend::pick_on_host(&jobs).into_iter();
        let mut back = back.into_iter();
        let mut out = Vec::with_capacity(select.len());
        for (s, t) in select.iter().zip(tokens) {
            out.push(match (t, s) {
                (Some(t), _) => Selected::Token(t),
                (None, Some(_)) => {
                    back.next();
                    Selected::Token(host_tokens.next().unwrap_or_default())
                }
                (None, None) => Selected::Logits(back.next().unwrap_or_default()),
            });
        }
        if out.len() != select.len() {
            return Err(self.gpu.err(format!(
                "step_select: {} results for {} rows",
                out.len(),
                select.len()
            )));
        }
        Ok(StepSelected { rows: out })
    }

    fn set_state_keep(&mut self, positions: usize) {
        self.states.book.set_keep(positions);
    }

    fn state_snapshots(&self) -> bool {
        !self.states.layers.is_empty()
    }

    fn state_snapshot_capacity(&self) -> Option<usize> {
        Some(super::delta::snapshot_capacity(self.states.book.slots()))
    }

    fn save_state(&mut self, slot: u32, pos: u32, snap: u32) -> Result<()> {
        self.save_snapshot(slot as usize, pos as usize, snap)
    }

    fn restore_state(&mut self, slot: u32, snap: u32) -> Result<u32> {
        self.restore_snapshot(slot as usize, snap)
            .and_then(|p| u32_of(p, "snapshot position"))
    }

    fn set_hidden_in(&mut self, rows: Vec<f32>) -> Result<()> {
        self.upload_hidden_in(rows)
    }

    /// Step activations stay on the device after a step (the runner reads the final residual
    /// rows: the MTP drafter's input).
    fn reads_step_rows(&self) -> bool {
        true
    }

    fn injects_rows(&self) -> bool {
        true
    }

    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        if block as usize >= self.kv_blocks {
            return Err(self.gpu.err(format!("KV block {block} does not exist")));
        }
        let mut out = Vec::new();
        let ks = self.kv.iter().map(|l| (&l.k, l.row));
        let vs = self.kv.iter().map(|l| (&l.v, l.row));
        for (cache, row) in ks.chain(vs) {
            let n = self.block_size * row;
            out.extend(self.gpu.download_range(cache, block as usize * n, n)?);
        }
        Ok(out)
    }
}
