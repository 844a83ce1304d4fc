//! The CUDA backend, first version: CUDA-core kernels (memra-kernels) that compute each row with
//! the CPU reference's arithmetic order, so results are row-invariant by construction
//! (EXACTNESS.md). Activations, norms and the KV cache are f32; weights stay in their GGUF block
//! format on the device.
//!
//! v2: tokens are picked on the device (`step_select`, select.rs) and a step of up to 64 rows
//! runs as a CUDA graph per row bucket (graph.rs; `CudaOptions::graphs`).

mod device;
mod graph;
mod opprof;
pub mod products;
pub mod profile;
pub mod select;
mod step;

pub use device::{
    ATTN_SPLIT, Arg, AttnArgs, AttnPrep, Gpu, LAZY_MODULES, RopeKvArgs, TOPK_MAX, attn_part_floats,
    device_count, kernel_supports, quiet_catch,
};
pub use graph::BUCKETS;

use cudarc::driver::CudaSlice;

use super::cpu::ops::Rope;
use super::cpu::{CpuBackend, CpuOptions};
use super::{
    Backend, Device, SelectParams, Selected, StepBatch, StepOutput, StepSelected, check_select,
};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::ModelWeights;
use crate::quant::DType;
use crate::weights::Tensor;

/// CUDA backend options.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    /// KV blocks to allocate.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Run steps of up to 64 rows as CUDA graphs.
    pub graphs: bool,
}

/// Whether CUDA graphs are on by default: yes, unless `MEMRA_CUDA_GRAPHS=0`.
pub fn graphs_default() -> bool {
    std::env::var("MEMRA_CUDA_GRAPHS").map_or(true, |v| v != "0")
}

/// Whether the v2 tensor-core products are used for the types they support: yes, unless
/// `MEMRA_CUDA_PRODUCTS=v1` (the v1 CUDA-core kernels for every type, for A/B runs).
pub fn products_v2_default() -> bool {
    std::env::var("MEMRA_CUDA_PRODUCTS").map_or(true, |v| v != "v1")
}

/// True when a CUDA driver and at least one device are present. Never panics.
pub fn cuda_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

/// Opens the backend `device` asks for: `auto` picks CUDA device 0 when available, else the CPU;
/// `cuda:N` without CUDA is an error saying so. `threads` applies to the CPU backend only.
pub fn open_backend(
    device: Device,
    weights: ModelWeights,
    kv_blocks: usize,
    block_size: usize,
    threads: usize,
) -> Result<Box<dyn Backend>> {
    open_backend_opts(
        device,
        weights,
        kv_blocks,
        block_size,
        threads,
        graphs_default(),
    )
}

/// [`open_backend`] with CUDA graphs on or off (ignored by the CPU backend).
pub fn open_backend_opts(
    device: Device,
    weights: ModelWeights,
    kv_blocks: usize,
    block_size: usize,
    threads: usize,
    graphs: bool,
) -> Result<Box<dyn Backend>> {
    let cpu = |w| -> Result<Box<dyn Backend>> {
        let opts = CpuOptions {
            threads,
            kv_blocks,
            block_size,
        };
        Ok(Box::new(CpuBackend::new(w, &opts)?))
    };
    let cuda = |w, n| -> Result<Box<dyn Backend>> {
        let opts = CudaOptions {
            device: n,
            kv_blocks,
            block_size,
            graphs,
        };
        Ok(Box::new(CudaBackend::new(w, &opts)?))
    };
    match device {
        Device::Cpu => cpu(weights),
        Device::Auto if cuda_available() => cuda(weights, 0),
        Device::Auto => cpu(weights),
        Device::Cuda(n) => match device_count() {
            Ok(c) if n < c => cuda(weights, n),
            Ok(c) => Err(Error::Input(format!(
                "--device cuda:{n}: {c} CUDA device(s) present; use --device cpu"
            ))),
            Err(e) => Err(Error::Input(format!(
                "--device cuda:{n}: CUDA is not available ({e}); use --device cpu"
            ))),
        },
    }
}

/// A weight matrix on the device: in the v2 tile layout (`packed`) when the v2 products read
/// its type, and/or in its stored GGUF block format (`data`: the v1 kernels and the embedding).
pub(crate) struct Mat {
    data: Option<CudaSlice<u8>>,
    packed: Option<products::PMat>,
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// One layer's device tensors and KV cache.
pub(crate) struct Layer {
    attn_norm: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    q: Mat,
    k: Mat,
    v: Mat,
    q_bias: Option<CudaSlice<f32>>,
    k_bias: Option<CudaSlice<f32>>,
    v_bias: Option<CudaSlice<f32>>,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    attn_out: Mat,
    gate: Mat,
    up: Mat,
    down: Mat,
    /// Q, K and V as one packed matrix (same type; then `q`, `k`, `v` hold no data).
    qkv: Option<Mat>,
    /// Gate and up as one packed matrix (same type; then `gate`, `up` hold no data).
    gateup: Option<Mat>,
    /// `[block][slot][kv_head][head_dim]` f32.
    k_cache: CudaSlice<f32>,
    v_cache: CudaSlice<f32>,
}

/// Per-step activations, grown as needed (capacity in rows).
#[derive(Default)]
pub(crate) struct Scratch {
    rows: usize,
    bufs: Vec<CudaSlice<f32>>,
    /// Prepared activations of the v2 products, per (kind, K).
    acts: Vec<(products::ActKind, usize, products::ActBuf)>,
}

pub struct CudaBackend {
    gpu: Gpu,
    config: ModelConfig,
    embed: Mat,
    /// `None` when the output shares the embedding.
    output: Option<Mat>,
    out_norm: CudaSlice<f32>,
    layers: Vec<Layer>,
    rope: Rope,
    /// Positions covered by `rope_cos`/`rope_sin` (`[pos][head_dim / 2]`).
    rope_len: usize,
    rope_cos: Option<CudaSlice<f32>>,
    rope_sin: Option<CudaSlice<f32>>,
    kv_blocks: usize,
    block_size: usize,
    scratch: Scratch,
    graphs_on: bool,
    graph: Option<graph::GraphState>,
    /// Bumped whenever a buffer a captured graph reads is reallocated.
    layout_epoch: u64,
    profile: profile::Profile,
    /// Per-op device times of plain steps (`MEMRA_PROFILE_OPS=1`), printed when dropped.
    prof: Option<opprof::OpProf>,
}

/// Working space kept free beyond weights and KV cache.
const RESERVE_BYTES: usize = 256 << 20;

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl CudaBackend {
    /// Uploads `weights` to device `opts.device`, allocates the KV cache. Fails before any upload
    /// when the model does not fit in the free device memory or a tensor type has no kernel.
    pub fn new(weights: ModelWeights, opts: &CudaOptions) -> Result<CudaBackend> {
        let c = weights.config.clone();
        if opts.block_size == 0 || opts.kv_blocks == 0 {
            return Err(Error::Input(
                "KV block size and block count must be > 0".into(),
            ));
        }
        let w = &weights;
        let mut mats: Vec<&Tensor> = vec![&w.embed, &w.output];
        for l in &w.layers {
            mats.extend([&l.q, &l.k, &l.v, &l.attn_out, &l.gate, &l.up, &l.down]);
        }
        if let Some(t) = mats.iter().find(|t| !kernel_supports(t.dtype)) {
            return Err(Error::Unsupported(format!(
                "CUDA backend: tensor `{}` is {}; supported types: {}",
                t.name,
                t.dtype,
                memra_kernels::WEIGHT_TYPES.join(", ")
            )));
        }
        let gpu = Gpu::open(opts.device)?;
        let width = c.n_kv_heads * c.head_dim;
        // One block beyond `kv_blocks` for the inert rows of graph buckets.
        let kv_bytes = (opts.kv_blocks + 1)
            .checked_mul(opts.block_size)
            .and_then(|v| v.checked_mul(width * 4 * 2 * c.n_layers))
            .ok_or_else(|| Error::Input("KV cache size overflows".into()))?;
        let wbytes = w.nbytes();
        let need = wbytes + kv_bytes + RESERVE_BYTES;
        let (free, total) = gpu.mem_info()?;
        if need > free {
            return Err(gpu.err(format!(
                "the model does not fit: it needs {} (weights {} + KV cache {} + {} working \
                 space) but only {} of {} is free",
                gib(need),
                gib(wbytes),
                gib(kv_bytes),
                gib(RESERVE_BYTES),
                gib(free),
                gib(total)
            )));
        }
        let vec = |t: &Tensor| -> Result<CudaSlice<f32>> { gpu.upload(&t.to_f32()?) };
        let opt = |t: &Option<Tensor>| -> Result<Option<CudaSlice<f32>>> {
            t.as_ref().map(vec).transpose()
        };
        let profile = profile::Profile::new(gpu.arch, gpu.sms);
        let v2 = products_v2_default();
        // `gguf`: keep the stored layout too (the embedding table, also when tied to the head).
        let mat_with = |t: &Tensor, gguf: bool| -> Result<Mat> {
            let (rows, cols) = t.rows_cols();
            let packed = if v2 && products::product_supports(t.dtype) {
                Some(gpu.upload_packed(&profile, t.dtype, &t.data, rows, cols)?)
            } else {
                None
            };
            let data = if gguf || packed.is_none() {
                Some(gpu.upload(&t.data)?)
            } else {
                None
            };
            Ok(Mat {
                data,
                packed,
                dtype: t.dtype,
                rows,
                cols,
                row_bytes: t.row_bytes(),
            })
        };
        let mat = |t: &Tensor| mat_with(t, false);
        // Several matrices of one type and width as one packed matrix (rows concatenated).
        let fused = |ts: &[&Tensor]| -> Result<Option<Mat>> {
            let (d, cols) = (ts[0].dtype, ts[0].rows_cols().1);
            let same = ts.iter().all(|t| t.dtype == d && t.rows_cols().1 == cols);
            if !v2 || !same || !products::product_supports(d) {
                return Ok(None);
            }
            let rows: usize = ts.iter().map(|t| t.rows_cols().0).sum();
            let bytes: Vec<u8> = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
            Ok(Some(Mat {
                data: None,
                packed: Some(gpu.upload_packed(&profile, d, &bytes, rows, cols)?),
                dtype: d,
                rows,
                cols,
                row_bytes: ts[0].row_bytes(),
            }))
        };
        // A matrix that lives inside a fused one: shape only.
        let part = |t: &Tensor| {
            let (rows, cols) = t.rows_cols();
            Mat {
                data: None,
                packed: None,
                dtype: t.dtype,
                rows,
                cols,
                row_bytes: t.row_bytes(),
            }
        };
        let cache_len = (opts.kv_blocks + 1) * opts.block_size * width;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in &w.layers {
            let qkv = fused(&[&l.q, &l.k, &l.v])?;
            let gateup = fused(&[&l.gate, &l.up])?;
            let maybe =
                |t: &Tensor, f: &Option<Mat>| if f.is_some() { Ok(part(t)) } else { mat(t) };
            layers.push(Layer {
                attn_norm: vec(&l.attn_norm)?,
                ffn_norm: vec(&l.ffn_norm)?,
                q: maybe(&l.q, &qkv)?,
                k: maybe(&l.k, &qkv)?,
                v: maybe(&l.v, &qkv)?,
                q_bias: opt(&l.q_bias)?,
                k_bias: opt(&l.k_bias)?,
                v_bias: opt(&l.v_bias)?,
                q_norm: opt(&l.q_norm)?,
                k_norm: opt(&l.k_norm)?,
                attn_out: mat(&l.attn_out)?,
                gate: maybe(&l.gate, &gateup)?,
                up: maybe(&l.up, &gateup)?,
                down: mat(&l.down)?,
                qkv,
                gateup,
                k_cache: gpu.zeros(cache_len)?,
                v_cache: gpu.zeros(cache_len)?,
            });
        }
        let shared = std::ptr::eq(w.output.data.as_ptr(), w.embed.data.as_ptr())
            && w.output.data.len() == w.embed.data.len();
        let embed = if shared {
            mat_with(&w.embed, true)?
        } else {
            Mat {
                data: Some(gpu.upload(&w.embed.data)?),
                packed: None,
                dtype: w.embed.dtype,
                rows: w.embed.rows_cols().0,
                cols: w.embed.rows_cols().1,
                row_bytes: w.embed.row_bytes(),
            }
        };
        let output = if shared { None } else { Some(mat(&w.output)?) };
        // Compile the product variants now: never inside a graph capture.
        if v2 {
            for l in profile.all_launches() {
                gpu.variant("products", &l.defines())?;
            }
            gpu.variant("products", &[])?;
        }
        let out_norm = vec(&w.out_norm)?;
        let rope = Rope::new(&c, w.rope_freq_factors.as_deref());
        gpu.sync()?;
        Ok(CudaBackend {
            gpu,
            config: c,
            embed,
            output,
            out_norm,
            layers,
            rope,
            rope_len: 0,
            rope_cos: None,
            rope_sin: None,
            kv_blocks: opts.kv_blocks,
            block_size: opts.block_size,
            scratch: Scratch::default(),
            graphs_on: opts.graphs,
            graph: None,
            layout_epoch: 0,
            profile,
            prof: opprof::OpProf::from_env(),
        })
    }

    /// The device this backend runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The tuned parameters in use.
    pub fn profile(&self) -> &profile::Profile {
        &self.profile
    }

    /// Makes the RoPE tables cover positions `0..=max_pos` (angles computed on the host in f64
    /// exactly as the CPU backend's `Rope::cos_sin`).
    fn ensure_rope(&mut self, max_pos: usize) -> Result<()> {
        if max_pos < self.rope_len {
            return Ok(());
        }
        let len = (max_pos + 1).next_power_of_two().max(256);
        let half = self.config.head_dim / 2;
        let mut cos = Vec::with_capacity(len * half);
        let mut sin = Vec::with_capacity(len * half);
        for p in 0..len {
            let (c, s) = self.rope.cos_sin(p as u32);
            cos.extend_from_slice(&c);
            sin.extend_from_slice(&s);
        }
        self.rope_cos = Some(self.gpu.upload(&cos)?);
        self.rope_sin = Some(self.gpu.upload(&sin)?);
        self.rope_len = len;
        self.layout_epoch += 1;
        Ok(())
    }

    fn check_block(&self, b: u32) -> Result<()> {
        if b as usize >= self.kv_blocks {
            return Err(self.gpu.err(format!("KV block {b} does not exist")));
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.gpu.name.clone()
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_block_size(&self) -> usize {
        self.block_size
    }

    fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput> {
        self.run_step(batch)
    }

    fn step_select(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        let f = self.forward(batch)?;
        let vocab = self.config.vocab;
        let dev: Vec<(usize, SelectParams)> = select
            .iter()
            .zip(&f.rows)
            .filter_map(|(s, &r)| s.map(|s| (r, s)))
            .collect();
        let picked = if dev.is_empty() {
            Vec::new()
        } else {
            let ptr = self.gpu.ptr(self.logits_buf(&f)?);
            select::select_rows(&self.gpu, ptr, vocab, &dev)?
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
        let need: Vec<usize> = (0..select.len()).filter(|&i| tokens[i].is_none()).collect();
        let mut logits = self.download_logits(&f, &need)?.into_iter();
        self.gpu.sync()?;
        let mut rows = Vec::with_capacity(select.len());
        for (s, t) in select.iter().zip(tokens) {
            rows.push(match (t, s) {
                (Some(t), _) => Selected::Token(t),
                (None, Some(s)) => {
                    let l = logits.next().unwrap_or_default();
                    Selected::Token(crate::sampling::sample(&l, s.history, s.params, s.pos))
                }
                (None, None) => Selected::Logits(logits.next().unwrap_or_default()),
            });
        }
        rows_checked(rows, select.len(), &self.gpu)
    }

    fn copy_kv_block(&mut self, src: u32, dst: u32) -> Result<()> {
        self.check_block(src)?;
        self.check_block(dst)?;
        let n = self.block_size * self.config.n_kv_heads * self.config.head_dim;
        for l in &self.layers {
            for cache in [&l.k_cache, &l.v_cache] {
                let p = self.gpu.ptr(cache);
                self.gpu
                    .copy_range(p, src as usize * n, dst as usize * n, n)?;
            }
        }
        self.gpu.sync()
    }

    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>> {
        self.check_block(block)?;
        let n = self.block_size * self.config.n_kv_heads * self.config.head_dim;
        let mut out = Vec::with_capacity(n * 4 * 2 * self.layers.len());
        let ks = self.layers.iter().map(|l| &l.k_cache);
        let vs = self.layers.iter().map(|l| &l.v_cache);
        for cache in ks.chain(vs) {
            let vals = self.gpu.download_range(cache, block as usize * n, n)?;
            out.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
        }
        Ok(out)
    }
}

fn rows_checked(rows: Vec<Selected>, n: usize, g: &Gpu) -> Result<StepSelected> {
    if rows.len() != n {
        return Err(g.err(format!("step_select: {} results for {n} rows", rows.len())));
    }
    Ok(StepSelected { rows })
}
