//! The op interface on the device: each op is one kernel launch (or a few, for attention over
//! a bounded score scratch) on the one stream, over the rows of the current step.

use cudarc::driver::CudaSlice;

use super::{AttnArgs, CudaOps, DevAct, KvLayer, Mat, RopeTable, class, mat};
use crate::error::Result;
use crate::ops::rope::Rope;
use crate::ops::{Act, AttnParams, Glu, KvId, Ops, RopeId, Rows};
use crate::weights::Tensor;

impl CudaOps {
    /// The device address of `a`'s buffer.
    pub(super) fn ptr(&self, a: Act) -> Result<u64> {
        let d = &self.acts[a.id];
        d.buf.as_ref().map(|b| self.gpu.ptr(b)).ok_or_else(|| {
            self.gpu
                .err(format!("activation {} is not allocated", d.name))
        })
    }

    /// Rows of the current step in `a`'s class.
    pub(super) fn n(&self, a: Act) -> usize {
        self.rows[class(a.rows)]
    }

    fn kv(&self, kv: KvId) -> Result<&KvLayer> {
        self.kv
            .get(kv.0)
            .ok_or_else(|| self.gpu.err(format!("KV layer {} does not exist", kv.0)))
    }
}

impl Ops for CudaOps {
    type Mat = Mat;
    type Vector = CudaSlice<f32>;

    fn mat(&mut self, t: &Tensor) -> Result<Mat> {
        mat::upload_mat(&self.gpu, t)
    }

    fn vector(&mut self, t: &Tensor) -> Result<CudaSlice<f32>> {
        self.gpu.upload(&t.to_f32()?)
    }

    fn act(&mut self, name: &'static str, width: usize, rows: Rows) -> Act {
        self.acts.push(DevAct {
            name,
            width,
            rows,
            buf: None,
        });
        // New activations are allocated by the next `reserve` of their class.
        self.cap[class(rows)] = 0;
        Act {
            id: self.acts.len() - 1,
            width,
            rows,
        }
    }

    fn rope_table(&mut self, rope: Rope) -> Result<RopeId> {
        self.ropes.push(RopeTable {
            rope,
            cos: None,
            sin: None,
        });
        self.rope_len = 0;
        Ok(RopeId(self.ropes.len() - 1))
    }

    fn kv_layer(&mut self, width: usize) -> Result<KvId> {
        let len = (self.kv_blocks + 1) * self.block_size * width;
        let k = self.gpu.zeros(len)?;
        let v = self.gpu.zeros(len)?;
        self.kv.push(KvLayer { k, v, width });
        Ok(KvId(self.kv.len() - 1))
    }

    fn embed(&mut self, table: &Mat, out: Act) -> Result<()> {
        mat::embed(
            &self.gpu,
            table,
            self.meta.tokens,
            self.ptr(out)?,
            self.n(out),
        )
    }

    fn matmul(&mut self, w: &Mat, x: Act, y: Act) -> Result<()> {
        mat::matmul(&self.gpu, w, self.ptr(x)?, self.ptr(y)?, self.n(y))
    }

    fn rms_norm(
        &mut self,
        x: Act,
        w: &CudaSlice<f32>,
        y: Act,
        group: usize,
        eps: f32,
    ) -> Result<()> {
        if group == 0 || !x.width.is_multiple_of(group) || x.width != y.width {
            return Err(self.gpu.err(format!(
                "rms_norm: width {} -> {}, group {group}",
                x.width, y.width
            )));
        }
        let g = &self.gpu;
        let rows = self.n(y) * (x.width / group);
        g.rms_norm(self.ptr(x)?, g.ptr(w), self.ptr(y)?, rows, group, eps)
    }

    fn add(&mut self, x: Act, y: Act) -> Result<()> {
        let n = self.n(x) * x.width;
        self.gpu.add_in_place(self.ptr(x)?, self.ptr(y)?, n)
    }

    fn add_bias(&mut self, x: Act, b: &CudaSlice<f32>) -> Result<()> {
        let g = &self.gpu;
        g.add_bias(self.ptr(x)?, g.ptr(b), self.n(x), x.width)
    }

    fn glu(&mut self, kind: Glu, gate: Act, up: Act) -> Result<()> {
        match kind {
            Glu::Silu => {
                let n = self.n(gate) * gate.width;
                self.gpu.swiglu(self.ptr(gate)?, self.ptr(up)?, n)
            }
            Glu::GeluTanh => Err(self.gpu.err("GeGLU has no CUDA kernel yet")),
        }
    }

    fn rope(&mut self, x: Act, table: RopeId, head_dim: usize) -> Result<()> {
        let g = &self.gpu;
        let t = self
            .ropes
            .get(table.0)
            .ok_or_else(|| g.err(format!("RoPE table {} does not exist", table.0)))?;
        let (cos, sin) = match (&t.cos, &t.sin) {
            (Some(c), Some(s)) => (g.ptr(c), g.ptr(s)),
            _ => return Err(g.err("RoPE tables missing")),
        };
        let heads = x.width / head_dim.max(1);
        g.rope(
            self.ptr(x)?,
            self.meta.pos,
            cos,
            sin,
            self.n(x),
            heads,
            head_dim,
        )
    }

    fn kv_write(&mut self, kv: KvId, k: Act, v: Act) -> Result<()> {
        let l = self.kv(kv)?;
        let g = &self.gpu;
        let (kc, vc) = (g.ptr(&l.k), g.ptr(&l.v));
        g.kv_write(
            kc,
            vc,
            self.ptr(k)?,
            self.ptr(v)?,
            self.meta.slot,
            self.n(k),
            l.width,
        )
    }

    fn attention(&mut self, kv: KvId, q: Act, out: Act, p: &AttnParams) -> Result<()> {
        if p.window.is_some() {
            return Err(self
                .gpu
                .err("sliding-window attention has no CUDA kernel yet"));
        }
        let l = self.kv(kv)?;
        let g = &self.gpu;
        let (kc, vc) = (g.ptr(&l.k), g.ptr(&l.v));
        let (pq, po) = (self.ptr(q)?, self.ptr(out)?);
        let (m, qd, meta) = (self.n(out), q.width, &self.meta);
        // Split into launches of `chunk` rows to bound the score scratch.
        let per_row = p.n_heads * meta.ctx;
        let chunk = (self.scores.1 / per_row.max(1)).clamp(1, m.max(1));
        let mut r0 = 0;
        while r0 < m {
            let rows = chunk.min(m - r0);
            let a = AttnArgs {
                q: pq + (r0 * qd * 4) as u64,
                out: po + (r0 * qd * 4) as u64,
                k_cache: kc,
                v_cache: vc,
                pos: meta.pos + (r0 * 4) as u64,
                row_seq: meta.row_seq + (r0 * 4) as u64,
                table_off: meta.table_off,
                tables: meta.tables,
                scores: self.scores.0,
                score_stride: meta.ctx,
                rows,
                n_heads: p.n_heads,
                n_kv_heads: p.n_kv_heads,
                head_dim: p.head_dim,
                block_size: self.block_size,
                scale: p.scale,
            };
            g.attention(&a)?;
            r0 += rows;
        }
        Ok(())
    }
}
