//! The CUDA backend. Weight products (mat.rs) are the v2 tensor-core kernels over weights
//! repacked at load (products.rs, tuned by the device profile, profile.rs) for the types they
//! read, else the v1 CUDA-core kernels over the stored GGUF blocks; every product computes a row
//! with the same arithmetic at every M (EXACTNESS.md). Activations, norms and the KV cache are
//! f32.
//!
//! The op interface (ops.rs) runs each op as one or a few kernels on the one stream and fuses
//! the composite ops (RMSNorm / SwiGLU / attention + activation preparation, RoPE + KV write,
//! the residual add in the product); step.rs sets up a step's rows and reads results back; a
//! step of up to 64 rows runs as a CUDA graph per row bucket (graph.rs; `CudaOptions::graphs`);
//! tokens are picked on the device (select.rs); the mixture-of-experts FFN routes and runs its
//! experts on the device (moe.rs); the MTP drafter's hidden input rows are uploaded and copied
//! in (hidden.rs); `MEMRA_PROFILE_OPS=1` times the ops of plain steps (opprof.rs).

mod attention;
pub mod delta;
mod device;
mod graph;
mod hidden;
pub mod link;
pub mod load_stats;
mod mat;
pub mod moe;
mod opprof;
mod ops;
pub mod plan;
pub mod products;
pub mod profile;
pub mod select;
mod step;
pub mod vision;
pub mod vision_kernels;
pub mod vision_qwen;

pub use attention::{
    ATTN_SPLIT, AttnArgs, AttnPrep, attn_first_split, attn_folded_floats, attn_mma_eligible,
    attn_mma_kernel, attn_part_floats, attn_row_splits, attn_tile_tokens, attn_window_start,
};
pub use device::{
    Arg, Gpu, RopeKvArgs, RopePos, TOPK_MAX, device_count, kernel_supports, quiet_catch,
};
pub use graph::BUCKETS;
pub use mat::{Mat, Mats, Products, Use};

use cudarc::driver::CudaSlice;

use super::runner::Runner;
use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::models::ModelWeights;
use crate::ops::Rows;
use crate::ops::rope::Rope;

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
    /// The KV cache's element format.
    pub kv_dtype: KvDtype,
    /// Recurrent-state slots (a model with gated DeltaNet layers: one per running sequence).
    pub state_slots: usize,
}

/// Whether CUDA graphs are on by default: yes, unless `MEMRA_CUDA_GRAPHS=0` (settings.rs).
pub fn graphs_default() -> bool {
    crate::settings::cuda_graphs()
}

/// True when a CUDA driver and at least one device are present. Never panics.
pub fn cuda_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

/// (free, total) bytes of CUDA device `device`'s memory, read through a driver context only
/// (no kernel is built: cheaper than [`Gpu::open`]). Never panics.
pub fn device_memory(device: usize) -> Result<(usize, usize)> {
    device::open_context(device)?
        .mem_get_info()
        .map_err(|e| Error::Backend {
            backend: format!("cuda:{device}"),
            what: format!("memory info: {e:?}"),
        })
}

/// One declared activation and its device buffer (capacity: the class's rows).
struct DevAct {
    name: &'static str,
    width: usize,
    rows: Rows,
    buf: Option<CudaSlice<f32>>,
}

/// One KV cache layer: `[block][slot]` rows of `width` values in the cache's [`KvDtype`]
/// (`row` bytes each), one block beyond `kv_blocks` for the inert rows of graph buckets.
struct KvLayer {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    width: usize,
    row: usize,
}

/// A RoPE table and its device copy (`[pos][half]` cos and sin, `CudaOps::rope_len` positions).
struct RopeTable {
    rope: Rope,
    cos: Option<CudaSlice<f32>>,
    sin: Option<CudaSlice<f32>>,
}

/// The op interface on one CUDA device.
pub struct CudaOps {
    gpu: Gpu,
    products: Products,
    /// Query heads and head size (the attention scratch per row).
    n_heads: usize,
    head_dim: usize,
    /// The model's context length (bounds the graphs' positions).
    max_ctx: usize,
    kv: Vec<KvLayer>,
    kv_dtype: KvDtype,
    kv_blocks: usize,
    block_size: usize,
    acts: Vec<DevAct>,
    /// Allocated rows per class (Step, Head) and the rows of the current step.
    cap: [usize; 2],
    rows: [usize; 2],
    ropes: Vec<RopeTable>,
    /// Positions covered by the RoPE tables.
    rope_len: usize,
    /// The current step's row metadata and attention score scratch.
    meta: step::Meta,
    scores: (u64, usize),
    /// Buffers of a plain step (kept alive until the next one).
    plain: Option<step::PlainBufs>,
    graphs_on: bool,
    graph: Option<graph::GraphState>,
    /// Bumped whenever a buffer a captured graph reads is reallocated.
    layout_epoch: u64,
    /// Per-op device times of plain steps (`MEMRA_PROFILE_OPS=1`), printed when dropped.
    prof: Option<opprof::OpProf>,
    /// The model's expert parameters and hidden size (a mixture-of-experts model).
    moe_cfg: Option<(crate::config::MoeParams, usize)>,
    /// The MoE op's scratch activations, declared with the first expert stack.
    moe_acts: Option<MoeActs>,
    /// The grouped expert products' offsets ([`moe::MoeBufs::offs`]), allocated with the first
    /// expert stack (before any graph capture).
    moe_offs: Option<CudaSlice<u32>>,
    /// The model's hidden size (the width of the hidden input rows, hidden.rs).
    hidden: usize,
    /// The hidden input rows of the MTP forward (hidden.rs).
    hidden_in: hidden::HiddenIn,
    /// The current step's given embedding rows (image input, [`crate::ops::Ops::inject`]);
    /// a step with some runs plainly, never as a graph (hidden.rs).
    embeds: Vec<crate::backend::RowEmbed>,
    /// Gated DeltaNet layers' states and the step's plan (delta.rs).
    states: delta::States,
}

/// Scratch activations of the MoE op, `k` = experts per row ([`moe::MoeBufs`]): per step row,
/// the k expert ids, k weights and k places of the grouped path's sorted pairs (`route`), the k
/// gate and k up rows, the k down rows.
#[derive(Clone, Copy, Debug)]
struct MoeActs {
    k: usize,
    route: crate::ops::Act,
    gate: crate::ops::Act,
    up: crate::ops::Act,
    y: crate::ops::Act,
}

/// The CUDA backend: the generic runner over the CUDA ops.
pub type CudaBackend = Runner<CudaOps>;

impl Runner<CudaOps> {
    /// Uploads `weights` to device `opts.device`, allocates the KV cache. Fails before any upload
    /// (and before the kernels are built) when a tensor type has no kernel or the model does not
    /// fit in the free device memory (plan.rs: weights as stored on the device, the KV pool and
    /// working space).
    pub fn new(weights: ModelWeights, opts: &CudaOptions) -> Result<CudaBackend> {
        // FP8 / NVFP4 checkpoints run on the F16 (or BF16) products, dequantized at load.
        let weights = match weights.dequantize_hf_only()? {
            Some(w) => {
                drop(weights);
                w
            }
            None => weights,
        };
        preflight(&weights, opts)?;
        plan::check_fits(&weights, opts)?;
        open_runner(&weights, opts, |ops| Runner::build(ops, &weights))
    }

    /// Pipeline stage `stage` of `weights` on device `opts.device` (crate::pipeline): its
    /// layers, the embedding on the first stage, the head on the last. The pipeline's memory
    /// plan (pipeline/plan.rs) has checked it fits beside the device's other stages.
    pub fn new_stage(
        weights: &ModelWeights,
        opts: &CudaOptions,
        stage: &crate::models::Stage,
    ) -> Result<CudaBackend> {
        preflight(weights, opts)?;
        open_runner(weights, opts, |ops| {
            Runner::build_stage(ops, weights, stage)
        })
    }

    /// [`CudaBackend::new`] with another forward pass over the same weights (an MTP layer's,
    /// models/mtp.rs, which uploads a few of them). No memory plan: the plan counts every
    /// tensor of `weights`; an allocation that fails says so.
    pub fn new_with(
        weights: &ModelWeights,
        opts: &CudaOptions,
        build: crate::models::BuildFn<CudaOps>,
    ) -> Result<CudaBackend> {
        let widened = weights.dequantize_hf_only()?;
        let weights = widened.as_ref().unwrap_or(weights);
        preflight(weights, opts)?;
        open_runner(weights, opts, |ops| Runner::build_with(ops, weights, build))
    }

    /// The tuned parameters in use.
    pub fn profile(&self) -> &profile::Profile {
        &self.ops().products.profile
    }

    /// The device this backend runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.ops().gpu
    }

    /// Turns CUDA graphs on or off (for A/B runs and `memra-verify graph`).
    pub fn set_graphs(&mut self, on: bool) {
        self.ops_mut().graphs_on = on;
    }

    /// Whether steps may run as CUDA graphs.
    pub fn graphs(&self) -> bool {
        self.ops().graphs_on
    }

    /// (captures, replays) so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        self.ops().graph_counts()
    }
}

/// The checks made before anything is uploaded: options, tensor types, KV format.
fn preflight(weights: &ModelWeights, opts: &CudaOptions) -> Result<()> {
    let c = &weights.config;
    if opts.block_size == 0 || opts.kv_blocks == 0 {
        return Err(Error::Input(
            "KV block size and block count must be > 0".into(),
        ));
    }
    let unsupported = weights
        .iter()
        .map(|(_, t)| t)
        .find(|t| t.shape.len() >= 2 && !kernel_supports(t.dtype));
    if let Some(t) = unsupported {
        return Err(Error::Unsupported(format!(
            "CUDA backend: tensor `{}` is {}; supported types: {}",
            t.name,
            t.dtype,
            memra_kernels::WEIGHT_TYPES.join(", ")
        )));
    }
    opts.kv_dtype.check_width(c.n_kv_heads * c.head_dim)
}

/// Opens the device, builds `build`'s forward pass over `weights` on it (uploads), compiles the
/// product variants (never inside a graph capture).
fn open_runner(
    weights: &ModelWeights,
    opts: &CudaOptions,
    build: impl FnOnce(CudaOps) -> Result<CudaBackend>,
) -> Result<CudaBackend> {
    let c = &weights.config;
    let gpu = Gpu::open(opts.device)?;
    let profile = profile::Profile::for_device(&gpu);
    let ops = CudaOps {
        gpu,
        products: Products::new(true, profile),
        n_heads: c.n_heads,
        head_dim: c.head_dim,
        max_ctx: c.max_ctx,
        kv: Vec::new(),
        kv_dtype: opts.kv_dtype,
        kv_blocks: opts.kv_blocks,
        block_size: opts.block_size,
        acts: Vec::new(),
        cap: [0; 2],
        rows: [0; 2],
        ropes: Vec::new(),
        rope_len: 0,
        meta: step::Meta::default(),
        scores: (0, 0),
        plain: None,
        graphs_on: opts.graphs,
        graph: None,
        layout_epoch: 0,
        prof: opprof::OpProf::when(crate::settings::profile_ops()),
        moe_cfg: c.moe.map(|p| (p, c.hidden)),
        moe_acts: None,
        moe_offs: None,
        hidden: c.hidden,
        hidden_in: hidden::HiddenIn::default(),
        embeds: Vec::new(),
        states: delta::States::new(opts.state_slots),
    };
    let runner = build(ops)?;
    let (g, p) = (&runner.ops().gpu, &runner.ops().products);
    if p.v2 {
        for l in p.profile.all_launches() {
            g.variant("products", &l.defines())?;
        }
        g.variant("products", &[])?;
    }
    g.sync()?;
    Ok(runner)
}

fn class(r: Rows) -> usize {
    match r {
        Rows::Step => 0,
        Rows::Head => 1,
    }
}

impl CudaOps {
    /// The CUDA device this backend runs on.
    pub fn device_ordinal(&self) -> usize {
        self.gpu.ctx.ordinal()
    }

    /// Makes every activation of class `r` hold at least `rows` rows (capacity rounded up to a
    /// power of two; growing reallocates them all and invalidates captured graphs).
    fn reserve(&mut self, r: Rows, rows: usize) -> Result<()> {
        let i = class(r);
        if rows <= self.cap[i] {
            return Ok(());
        }
        let cap = rows.next_power_of_two();
        self.gpu.sync()?;
        for a in self.acts.iter_mut().filter(|a| a.rows == r) {
            a.buf = None;
            a.buf = Some(self.gpu.zeros::<f32>(cap * a.width)?);
        }
        // Prepared activations: head rows never outnumber step rows.
        if r == Rows::Step {
            self.products.reserve(&self.gpu, cap)?;
        }
        self.cap[i] = cap;
        self.layout_epoch += 1;
        Ok(())
    }

    /// Marks the end of op `label` for the op profile (plain steps only).
    fn tick(&self, label: &'static str) {
        if let Some(p) = self.prof.as_ref().filter(|_| !self.graphs_on) {
            p.tick(&self.gpu, label);
        }
    }

    /// Makes the RoPE tables cover positions `0..=max_pos` (angles computed on the host in f64
    /// exactly as the CPU backend's).
    fn ensure_rope(&mut self, max_pos: usize) -> Result<()> {
        if max_pos < self.rope_len {
            return Ok(());
        }
        let len = (max_pos + 1).next_power_of_two().max(256);
        for t in &mut self.ropes {
            let half = t.rope.half();
            let mut cos = Vec::with_capacity(len * half);
            let mut sin = Vec::with_capacity(len * half);
            for p in 0..len {
                let (c, s) = t.rope.cos_sin(p as u32);
                cos.extend_from_slice(&c);
                sin.extend_from_slice(&s);
            }
            t.cos = Some(self.gpu.upload(&cos)?);
            t.sin = Some(self.gpu.upload(&sin)?);
        }
        self.rope_len = len;
        self.layout_epoch += 1;
        Ok(())
    }
}
