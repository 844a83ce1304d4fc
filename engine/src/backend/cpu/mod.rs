//! The CPU reference backend: plain f32 Rust, deterministic, the oracle for every kernel.
//!
//! Weights stay in their stored block format and are dequantized row by row into exact f32.
//! Work is split across threads over output features (matmul) or (row, head) pairs (attention)
//! only, never over a reduction, so results are bitwise independent of the thread count, the
//! batch composition and the prefill chunking.

mod attention;
mod kv;
mod matmul;
pub mod ops;

use attention::{AttnShape, attention};
use kv::KvStore;
use matmul::matmul;
use ops::Rope;

use super::{Backend, DumpFn, StepBatch, StepOutput};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::ModelWeights;
use crate::weights::Tensor;

/// CPU backend options.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// KV blocks to allocate.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 0,
            kv_blocks: 64,
            block_size: 16,
        }
    }
}

/// Small per-layer vectors dequantized once at load.
struct LayerVecs {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

pub struct CpuBackend {
    w: ModelWeights,
    vecs: Vec<LayerVecs>,
    out_norm: Vec<f32>,
    rope: Rope,
    kv: KvStore,
    pool: rayon::ThreadPool,
    dump: Option<DumpFn>,
}

fn vec_of(t: &Option<Tensor>) -> Result<Option<Vec<f32>>> {
    t.as_ref().map(|t| t.to_f32()).transpose()
}

fn err(what: String) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        what,
    }
}

impl CpuBackend {
    pub fn new(w: ModelWeights, opts: &CpuOptions) -> Result<CpuBackend> {
        let c = &w.config;
        let vecs = w
            .layers
            .iter()
            .map(|l| {
                Ok(LayerVecs {
                    attn_norm: l.attn_norm.to_f32()?,
                    ffn_norm: l.ffn_norm.to_f32()?,
                    q_bias: vec_of(&l.q_bias)?,
                    k_bias: vec_of(&l.k_bias)?,
                    v_bias: vec_of(&l.v_bias)?,
                    q_norm: vec_of(&l.q_norm)?,
                    k_norm: vec_of(&l.k_norm)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let out_norm = w.out_norm.to_f32()?;
        let rope = Rope::new(c, w.rope_freq_factors.as_deref());
        if opts.block_size == 0 || opts.kv_blocks == 0 {
            return Err(Error::Input(
                "KV block size and block count must be > 0".into(),
            ));
        }
        let kv = KvStore::new(
            c.n_layers,
            opts.kv_blocks,
            opts.block_size,
            c.n_kv_heads * c.head_dim,
        )?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| err(format!("thread pool: {e}")))?;
        Ok(CpuBackend {
            w,
            vecs,
            out_norm,
            rope,
            kv,
            pool,
            dump: None,
        })
    }

    fn check_batch(&self, batch: &StepBatch) -> Result<()> {
        let c = &self.w.config;
        for (i, r) in batch.rows.iter().enumerate() {
            if r.token as usize >= c.vocab {
                return Err(Error::Input(format!(
                    "token id {} is outside the vocabulary (size {})",
                    r.token, c.vocab
                )));
            }
            let table = batch
                .block_tables
                .get(r.seq)
                .ok_or_else(|| err(format!("row {i}: sequence {} has no block table", r.seq)))?;
            let need = r.pos as usize / self.kv.block_size;
            if need >= table.len() {
                return Err(err(format!(
                    "row {i}: position {} is beyond its block table",
                    r.pos
                )));
            }
            if let Some(b) = table[..=need]
                .iter()
                .find(|&&b| b as usize >= self.kv.blocks)
            {
                return Err(err(format!("row {i}: KV block {b} does not exist")));
            }
        }
        Ok(())
    }

    fn emit(&mut self, name: &str, layer: usize, rows: usize, v: &[f32]) {
        if let Some(d) = self.dump.as_mut() {
            d(name, layer, rows, v);
        }
    }

    fn norm_rows(x: &[f32], w: &[f32], eps: f32, width: usize) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        for (o, r) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            ops::rms_norm(r, w, eps, o);
        }
        out
    }

    fn add_bias(x: &mut [f32], b: &Option<Vec<f32>>) {
        if let Some(b) = b {
            for r in x.chunks_exact_mut(b.len()) {
                ops::add_in_place(r, b);
            }
        }
    }

    fn head_norm(x: &mut [f32], w: &Option<Vec<f32>>, eps: f32) {
        if let Some(w) = w {
            for head in x.chunks_exact_mut(w.len()) {
                let src = head.to_vec();
                ops::rms_norm(&src, w, eps, head);
            }
        }
    }

    /// One decoder layer over the batch; `rope[i]` holds row i's (cos, sin), computed once per step.
    fn layer(
        &mut self,
        l: usize,
        batch: &StepBatch,
        rope: &[(Vec<f32>, Vec<f32>)],
        x: &mut [f32],
    ) -> Result<()> {
        let c = self.w.config.clone();
        let m = batch.rows.len();
        let (hd, eps) = (c.head_dim, c.rms_eps);
        let lw = &self.w.layers[l];
        let lv = &self.vecs[l];
        let h = Self::norm_rows(x, &lv.attn_norm, eps, c.hidden);
        let mut q = matmul(&self.pool, &lw.q, &h, m)?;
        let mut k = matmul(&self.pool, &lw.k, &h, m)?;
        let mut v = matmul(&self.pool, &lw.v, &h, m)?;
        Self::add_bias(&mut q, &lv.q_bias);
        Self::add_bias(&mut k, &lv.k_bias);
        Self::add_bias(&mut v, &lv.v_bias);
        Self::head_norm(&mut q, &lv.q_norm, eps);
        Self::head_norm(&mut k, &lv.k_norm, eps);
        let (qw, kw) = (c.n_heads * hd, c.n_kv_heads * hd);
        for (i, row) in batch.rows.iter().enumerate() {
            let (cos, sin) = &rope[i];
            Rope::apply(&mut q[i * qw..(i + 1) * qw], hd, cos, sin);
            Rope::apply(&mut k[i * kw..(i + 1) * kw], hd, cos, sin);
            let p = row.pos as usize;
            let block = batch.block_tables[row.seq][p / self.kv.block_size];
            let slot = p % self.kv.block_size;
            self.kv.write(
                l,
                block,
                slot,
                &k[i * kw..(i + 1) * kw],
                &v[i * kw..(i + 1) * kw],
            );
        }
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
        };
        let attn = attention(&self.pool, &self.kv, l, batch, &q, &shape);
        let o = matmul(&self.pool, &lw.attn_out, &attn, m)?;
        let lw = &self.w.layers[l];
        let lv = &self.vecs[l];
        ops::add_in_place(x, &o);
        let h2 = Self::norm_rows(x, &lv.ffn_norm, eps, c.hidden);
        let mut g = matmul(&self.pool, &lw.gate, &h2, m)?;
        let u = matmul(&self.pool, &lw.up, &h2, m)?;
        ops::swiglu(&mut g, &u);
        let d = matmul(&self.pool, &lw.down, &g, m)?;
        ops::add_in_place(x, &d);
        if self.dump.is_some() {
            for (name, vals) in [
                ("attn_norm", &h),
                ("q", &q),
                ("k", &k),
                ("v", &v),
                ("attn_out", &o),
                ("ffn_norm", &h2),
                ("ffn_out", &d),
                ("l_out", &x.to_vec()),
            ] {
                self.emit(name, l, m, vals);
            }
        }
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn config(&self) -> &ModelConfig {
        &self.w.config
    }

    fn kv_block_size(&self) -> usize {
        self.kv.block_size
    }

    fn kv_blocks(&self) -> usize {
        self.kv.blocks
    }

    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput> {
        self.check_batch(batch)?;
        let hidden = self.w.config.hidden;
        let m = batch.rows.len();
        let mut x = vec![0f32; m * hidden];
        for (row, xr) in batch.rows.iter().zip(x.chunks_exact_mut(hidden)) {
            let e = &self.w.embed;
            crate::quant::dequantize_row(e.dtype, e.row(row.token as usize), xr)?;
        }
        let rope: Vec<_> = batch
            .rows
            .iter()
            .map(|r| self.rope.cos_sin(r.pos))
            .collect();
        for l in 0..self.w.config.n_layers {
            self.layer(l, batch, &rope, &mut x)?;
        }
        let want: Vec<usize> = (0..m).filter(|&i| batch.rows[i].want_logits).collect();
        if want.is_empty() {
            return Ok(StepOutput::default());
        }
        let mut sel = Vec::with_capacity(want.len() * hidden);
        for &i in &want {
            sel.extend_from_slice(&x[i * hidden..(i + 1) * hidden]);
        }
        let hn = Self::norm_rows(&sel, &self.out_norm, self.w.config.rms_eps, hidden);
        let logits = matmul(&self.pool, &self.w.output, &hn, want.len())?;
        let vocab = self.w.config.vocab;
        Ok(StepOutput {
            logits: logits.chunks_exact(vocab).map(|r| r.to_vec()).collect(),
        })
    }

    fn copy_kv_block(&mut self, src: u32, dst: u32) -> Result<()> {
        if src as usize >= self.kv.blocks || dst as usize >= self.kv.blocks {
            return Err(err(format!("copy KV block {src} -> {dst}: no such block")));
        }
        self.kv.copy_block(src, dst);
        Ok(())
    }

    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        if block as usize >= self.kv.blocks {
            return Err(err(format!("KV block {block} does not exist")));
        }
        Ok(self.kv.block_bytes(block))
    }

    fn set_dump(&mut self, dump: Option<DumpFn>) {
        self.dump = dump;
    }
}
