//! Device memory planning: what a model takes on the GPU, computed on the host before anything
//! is allocated, and the check against the free device memory. Pure arithmetic (no driver call)
//! so it is tested on the CPU with made-up free-memory values.
//!
//! The bytes counted, in the layouts the backend uploads (mat.rs `Products::upload_mat`,
//! ops.rs `vector` / `kv_layer`):
//! - a matrix read by products: the v2 tile layout (`quant::repack`) when the v2 products read its
//!   type, else its stored GGUF bytes; a lookup-only embedding table: stored bytes; a tied
//!   embedding table: both; a 1-D tensor (norm, bias): f32;
//! - the KV pool: K and V per layer in the cache's format for `kv_blocks + 1` blocks (one for the
//!   graphs' inert rows);
//! - working space: the step activations for [`STEP_ROWS`] rows and the head's for
//!   [`HEAD_ROWS`], the v2 products' prepared activations, the attention scratch of a plain step
//!   and of the graph state, the RoPE tables (one; gemma3's local and global layers have one each),
//!   plus [`CONTEXT_BYTES`] for kernel modules, the driver and per-step uploads.

use super::attention::ATTN_SPLIT;
use super::step::SCORE_FLOATS;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::models::{ModelWeights, Role};
use crate::quant::DType;
use crate::quant::repack::tile_format;

/// Step rows the working space is planned for: the scheduler's default token budget per step.
pub const STEP_ROWS: usize = 512;
/// Rows the head (logits) is planned for: the largest graph bucket, the default running cap.
pub const HEAD_ROWS: usize = 64;
/// Kernel modules, the driver's own allocations and the small per-step uploads.
pub const CONTEXT_BYTES: usize = 256 << 20;

/// How a tensor is uploaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upload {
    /// f32 (norms, biases).
    Vector,
    /// Read by products only.
    Product,
    /// An embedding table read by lookups only.
    Lookup,
    /// A tied embedding table: lookups and the output product.
    Both,
}

/// One tensor as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub upload: Upload,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Stored bytes (GGUF blocks).
    pub bytes: usize,
}

/// The tensors of `w` and how each is uploaded.
pub fn describe(w: &ModelWeights) -> Vec<TensorDesc> {
    let tied = w.opt(Role::Output).is_none();
    w.iter()
        .map(|(role, t)| {
            let (rows, cols) = t.rows_cols();
            let upload = match role {
                Role::TokenEmbd if tied => Upload::Both,
                Role::TokenEmbd => Upload::Lookup,
                _ if t.shape.len() < 2 => Upload::Vector,
                _ => Upload::Product,
            };
            // FP8 / NVFP4 are uploaded dequantized to F16 (or BF16, the same size):
            // `ModelWeights::dequantize_hf_only` in `CudaBackend::new`.
            let (dtype, bytes) = match DType::HF_ONLY.contains(&t.dtype) {
                true => (DType::F16, t.numel().saturating_mul(2)),
                false => (t.dtype, t.data.len()),
            };
            TensorDesc {
                upload,
                dtype,
                rows,
                cols,
                bytes,
            }
        })
        .collect()
}

/// Bytes of a `rows` x `cols` matrix of `dtype` in the v2 tile layout, or `None` when the
/// layout does not exist for the type.
pub fn packed_bytes(dtype: DType, rows: usize, cols: usize) -> Option<usize> {
    let f = tile_format(dtype)?;
    rows.div_ceil(16)
        .checked_mul(cols.div_ceil(f.kt))?
        .checked_mul(f.tile_bytes)
}

fn overflow(what: &str) -> Error {
    Error::Input(format!("device memory plan: {what} overflows"))
}

/// Bytes the tensors take on the device. `packs(dtype)`: whether products read the type
/// repacked (the v2 products are on and support it).
pub fn weight_bytes(tensors: &[TensorDesc], packs: &dyn Fn(DType) -> bool) -> Result<usize> {
    let mut sum = 0usize;
    for t in tensors {
        let packed = || -> Result<usize> {
            if packs(t.dtype) {
                packed_bytes(t.dtype, t.rows, t.cols).ok_or_else(|| overflow("a packed matrix"))
            } else {
                Ok(0)
            }
        };
        let b = match t.upload {
            Upload::Vector => t
                .rows
                .checked_mul(t.cols)
                .and_then(|n| n.checked_mul(4))
                .ok_or_else(|| overflow("a vector"))?,
            Upload::Lookup => t.bytes,
            Upload::Product if packs(t.dtype) => packed()?,
            Upload::Product => t.bytes,
            Upload::Both => t
                .bytes
                .checked_add(packed()?)
                .ok_or_else(|| overflow("a table"))?,
        };
        sum = sum.checked_add(b).ok_or_else(|| overflow("the weights"))?;
    }
    Ok(sum)
}

/// Bytes of one KV block in format `kv` (every layer, K and V): the engine's one definition.
pub use crate::kv::kv_block_bytes_checked as kv_block_bytes;

/// Bytes of a pool of `kv_blocks` blocks as allocated (one more for the graphs' inert rows).
pub fn kv_bytes(
    c: &ModelConfig,
    kv_blocks: usize,
    block_size: usize,
    kv: KvDtype,
) -> Option<usize> {
    kv_blocks
        .checked_add(1)?
        .checked_mul(kv_block_bytes(c, block_size, kv)?)
}

/// Working space for positions up to `ctx` (see the module doc). Saturating: an absurd config
/// plans an absurd (never fitting) amount instead of wrapping.
pub fn workspace_bytes(c: &ModelConfig, ctx: usize, v2: bool) -> usize {
    let (qd, kvd) = (
        c.n_heads.saturating_mul(c.head_dim),
        c.n_kv_heads.saturating_mul(c.head_dim),
    );
    let mul = |a: usize, b: usize| a.saturating_mul(b);
    // x, h, q, k, v, att, o, gate, up.
    let step_width = [c.hidden, c.hidden, qd, kvd, kvd, qd, c.hidden, c.ffn, c.ffn]
        .iter()
        .fold(0usize, |a, &w| a.saturating_add(w));
    // The MoE op's scratch per row (backend/cuda/moe.rs): k ids, weights and sorted pairs, k
    // gate and up rows, k down rows; and the prepared activations of its k pairs for the down
    // products.
    let (moe_width, moe_prepared) = match c.moe {
        Some(p) if p.n_used > 0 => {
            let k = p.n_used;
            let width = mul(3, k)
                .saturating_add(mul(mul(2, k), p.expert_ffn))
                .saturating_add(mul(k, c.hidden));
            let kp = p.expert_ffn.div_ceil(256).saturating_mul(256);
            let prep = mul(mul(STEP_ROWS, k), mul(kp, 2).saturating_add(kp / 32 * 4));
            (width, if v2 { prep } else { 0 })
        }
        _ => (0, 0),
    };
    let step_width = step_width.saturating_add(moe_width);
    let acts = mul(mul(STEP_ROWS, step_width), 4);
    // head_in, head_norm and logits.
    let head_width = c.hidden.saturating_mul(2).saturating_add(c.vocab);
    let head = mul(mul(HEAD_ROWS, head_width), 4);
    // Prepared activations: per input width (padded to 256 columns) 2 bytes a value and 4
    // bytes of scale per 32 values.
    let prepared = if v2 {
        [c.hidden, qd, c.ffn]
            .iter()
            .map(|k| {
                let kp = k.div_ceil(256).saturating_mul(256);
                mul(STEP_ROWS, mul(kp, 2).saturating_add(kp / 32 * 4))
            })
            .fold(0usize, usize::saturating_add)
    } else {
        0
    };
    // Attention split partials: a plain step's and the graph state's, each bounded by
    // SCORE_FLOATS but never less than one row.
    let part = ctx
        .max(1)
        .div_ceil(ATTN_SPLIT)
        .saturating_mul(c.head_dim.saturating_add(2));
    let per_row = c.n_heads.saturating_mul(part);
    let scratch = |rows: usize| mul(per_row, (SCORE_FLOATS / per_row.max(1)).clamp(1, rows));
    let scores = mul(scratch(STEP_ROWS).saturating_add(scratch(HEAD_ROWS)), 4);
    // cos and sin, positions rounded up to a power of two.
    let rope_pos = ctx
        .saturating_add(1)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX);
    let tables = if c.gemma3.is_some() { 2 } else { 1 };
    let rope = mul(mul(mul(rope_pos.max(256), c.head_dim), 4), tables);
    [
        acts,
        head,
        prepared,
        moe_prepared,
        scores,
        rope,
        CONTEXT_BYTES,
    ]
    .iter()
    .fold(0usize, |a, &b| a.saturating_add(b))
}

/// What a model needs on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePlan {
    pub weights: usize,
    pub kv: usize,
    pub kv_blocks: usize,
    pub block_size: usize,
    pub workspace: usize,
    /// Recurrent state of every slot (a model with gated DeltaNet layers; [`state_bytes`]).
    pub state: usize,
}

impl DevicePlan {
    /// The plan for `tensors` of a model with config `c` and a pool of `kv_blocks`.
    pub fn new(
        c: &ModelConfig,
        tensors: &[TensorDesc],
        packs: &dyn Fn(DType) -> bool,
        kv_blocks: usize,
        block_size: usize,
        kv_dtype: KvDtype,
    ) -> Result<DevicePlan> {
        let v2 = tensors
            .iter()
            .any(|t| t.upload != Upload::Vector && packs(t.dtype));
        let ctx = kv_blocks.saturating_mul(block_size).min(c.max_ctx.max(1));
        Ok(DevicePlan {
            weights: weight_bytes(tensors, packs)?,
            kv: kv_bytes(c, kv_blocks, block_size, kv_dtype)
                .ok_or_else(|| overflow("the KV cache"))?,
            kv_blocks,
            block_size,
            workspace: workspace_bytes(c, ctx, v2),
            state: 0,
        })
    }

    /// Weights + KV cache + working space + recurrent state (saturating).
    pub fn total(&self) -> usize {
        self.weights
            .saturating_add(self.kv)
            .saturating_add(self.workspace)
            .saturating_add(self.state)
    }

    /// KV blocks that would fit in `free` next to the weights, working space and state (0:
    /// none).
    pub fn blocks_that_fit(&self, free: usize) -> usize {
        let per_block = self.kv / (self.kv_blocks + 1).max(1);
        let fixed = self.weights.saturating_add(self.workspace);
        let room = free.saturating_sub(fixed.saturating_add(self.state));
        (room / per_block.max(1)).saturating_sub(1)
    }

    /// Ok when the plan fits in `free` bytes of `device` (`total` bytes); else an error naming
    /// the sizes, the free memory and what to do.
    pub fn check(&self, device: &str, free: usize, total: usize) -> Result<()> {
        let need = self.total();
        if need <= free {
            return Ok(());
        }
        let fit = self.blocks_that_fit(free);
        // A pool too small for one request of a block is no remedy.
        let advice = if fit >= 2 {
            format!(
                "pass fewer KV blocks (--kv-blocks / MEMRA_KV_BLOCKS {fit} would fit), use a \
                 smaller quantization of the model, or free memory on the device"
            )
        } else {
            "use a smaller quantization or a smaller model, or free memory on the device \
             (the weights alone leave no room for a KV cache)"
                .to_string()
        };
        Err(Error::Backend {
            backend: device.to_string(),
            what: format!(
                "the model does not fit in device memory: it needs {} (weights {} as stored on \
                 the device, KV cache {} for {} blocks of {} positions, working space {}{}) \
                 but only {} of {} is free; {advice}",
                gib(need),
                gib(self.weights),
                gib(self.kv),
                self.kv_blocks,
                self.block_size,
                gib(self.workspace),
                match self.state {
                    0 => String::new(),
                    s => format!(", recurrent state {}", gib(s)),
                },
                gib(free),
                gib(total),
            ),
        })
    }
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// `weights`' tensors and the types the v2 products read repacked.
fn described(weights: &ModelWeights) -> (Vec<TensorDesc>, impl Fn(DType) -> bool) {
    (describe(weights), super::products::product_supports)
}

/// The plan of `weights` with a pool of `kv_blocks` and `state_slots` recurrent-state slots
/// on this process's products.
pub fn for_model(
    weights: &ModelWeights,
    (kv_blocks, block_size, kv_dtype): (usize, usize, KvDtype),
    state_slots: usize,
) -> Result<DevicePlan> {
    let (tensors, packs) = described(weights);
    let plan = DevicePlan::new(
        &weights.config,
        &tensors,
        &packs,
        kv_blocks,
        block_size,
        kv_dtype,
    )?;
    Ok(DevicePlan {
        state: state_bytes(&weights.config, state_slots),
        ..plan
    })
}

/// Bytes of the recurrent state of `slots` sequences (gated DeltaNet layers; 0 for other
/// models): per layer and slot, the state, the conv inputs and the kept inputs, and the
/// layer's snapshots (delta.rs).
pub fn state_bytes(c: &ModelConfig, slots: usize) -> usize {
    let Some(p) = c.hybrid else { return 0 };
    let layers = (0..c.n_layers).filter(|&l| !p.is_attention(l)).count();
    layers.saturating_mul(super::delta::layer_bytes(&p.delta(), slots))
}

/// Bytes the weights and the working space (at the full context) take on the device: what
/// must be subtracted from the free memory before sizing a KV pool from it.
pub fn fixed_bytes(weights: &ModelWeights) -> Result<usize> {
    let (tensors, packs) = described(weights);
    fixed_bytes_of(&weights.config, &tensors, &packs)
}

/// [`fixed_bytes`] of described tensors.
pub fn fixed_bytes_of(
    c: &ModelConfig,
    tensors: &[TensorDesc],
    packs: &dyn Fn(DType) -> bool,
) -> Result<usize> {
    let v2 = tensors
        .iter()
        .any(|t| t.upload != Upload::Vector && packs(t.dtype));
    Ok(weight_bytes(tensors, packs)?.saturating_add(workspace_bytes(c, c.max_ctx.max(1), v2)))
}

/// Refuses, before anything is allocated, a model that does not fit in the free memory of
/// device `opts.device` with `opts.kv_blocks` KV blocks; returns the plan when it fits.
pub fn check_fits(weights: &ModelWeights, opts: &super::CudaOptions) -> Result<DevicePlan> {
    let pool = (opts.kv_blocks, opts.block_size, opts.kv_dtype);
    let plan = for_model(weights, pool, opts.state_slots)?;
    let (free, total) = super::device_memory(opts.device)?;
    plan.check(&format!("cuda:{}", opts.device), free, total)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arch;
    use crate::models::random::{random_weights, tiny_config};
    use crate::quant::repack::repack;

    const GIB: usize = 1 << 30;

    fn v2(d: DType) -> bool {
        tile_format(d).is_some()
    }

    fn none(_: DType) -> bool {
        false
    }

    /// A Llama-3-8B-shaped model: 32 layers, hidden 4096, 8 KV heads, FFN 14336, vocab 128256.
    fn llama8b() -> ModelConfig {
        ModelConfig {
            n_layers: 32,
            hidden: 4096,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            vocab: 128256,
            max_ctx: 8192,
            tie_embeddings: false,
            ..tiny_config(Arch::Llama, 128256)
        }
    }

    fn matrix(upload: Upload, dtype: DType, rows: usize, cols: usize) -> TensorDesc {
        let bytes = dtype.bytes_for((rows * cols) as u64).unwrap() as usize;
        TensorDesc {
            upload,
            dtype,
            rows,
            cols,
            bytes,
        }
    }

    fn llama8b_tensors(d: DType) -> Vec<TensorDesc> {
        let c = llama8b();
        let kvd = c.n_kv_heads * c.head_dim;
        let mut v = vec![
            matrix(Upload::Lookup, d, c.vocab, c.hidden),
            matrix(Upload::Product, d, c.vocab, c.hidden),
            matrix(Upload::Vector, DType::F32, 1, c.hidden),
        ];
        for _ in 0..c.n_layers {
            v.push(matrix(Upload::Product, d, c.hidden, c.hidden));
            v.push(matrix(Upload::Product, d, kvd, c.hidden));
            v.push(matrix(Upload::Product, d, kvd, c.hidden));
            v.push(matrix(Upload::Product, d, c.hidden, c.hidden));
            v.push(matrix(Upload::Product, d, c.ffn, c.hidden));
            v.push(matrix(Upload::Product, d, c.ffn, c.hidden));
            v.push(matrix(Upload::Product, d, c.hidden, c.ffn));
            v.push(matrix(Upload::Vector, DType::F32, 1, c.hidden));
            v.push(matrix(Upload::Vector, DType::F32, 1, c.hidden));
        }
        v
    }

    #[test]
    fn packed_sizes_match_the_repacker() {
        let c = tiny_config(Arch::Llama, 96);
        for d in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::F16,
            DType::BF16,
        ] {
            let w = random_weights(&c, 7, d).unwrap();
            for (t, desc) in w.iter().map(|(_, t)| t).zip(describe(&w)) {
                if t.shape.len() < 2 || t.dtype != d {
                    continue;
                }
                let (rows, cols) = t.rows_cols();
                let real = repack(d, &t.data, rows, cols).unwrap().data.len();
                assert_eq!(packed_bytes(d, rows, cols), Some(real), "{} {d}", t.name);
                assert_eq!(
                    (desc.rows, desc.cols, desc.bytes),
                    (rows, cols, t.data.len())
                );
            }
        }
        assert_eq!(packed_bytes(DType::Q2_K, 16, 256), None);
    }

    #[test]
    fn tied_tables_count_twice_and_vectors_as_f32() {
        let c = tiny_config(Arch::Llama, 96); // tied
        let w = random_weights(&c, 7, DType::Q8_0).unwrap();
        let d = describe(&w);
        let embd = d.iter().find(|t| t.upload == Upload::Both).unwrap();
        assert_eq!((embd.rows, embd.cols), (96, 64));
        let one = [embd.clone()];
        assert_eq!(
            weight_bytes(&one, &v2).unwrap(),
            embd.bytes + packed_bytes(DType::Q8_0, 96, 64).unwrap()
        );
        assert_eq!(weight_bytes(&one, &none).unwrap(), embd.bytes);
        let norm = matrix(Upload::Vector, DType::F16, 1, 64);
        assert_eq!(weight_bytes(&[norm], &v2).unwrap(), 256);
        // Without the v2 products the device holds the stored bytes (plus f32 vectors).
        let stored: usize = d
            .iter()
            .map(|t| match t.upload {
                Upload::Vector => t.rows * t.cols * 4,
                _ => t.bytes,
            })
            .sum();
        assert_eq!(weight_bytes(&d, &none).unwrap(), stored);
    }

    #[test]
    fn an_8b_model_is_refused_with_sizes_and_advice() {
        let c = llama8b();
        let t = llama8b_tensors(DType::Q4_K);
        let p = DevicePlan::new(&c, &t, &v2, 4096, 16, KvDtype::F32).unwrap();
        // ~4.6 GB of Q4_K weights repacked, 4097 blocks x 2 MiB of f32 KV.
        assert!(p.weights > 4 * GIB && p.weights < 5 * GIB, "{p:?}");
        assert_eq!(p.kv, 4097 * 16 * 8 * 128 * 4 * 2 * 32);
        assert!(p.workspace > CONTEXT_BYTES && p.workspace < GIB, "{p:?}");
        assert!(p.check("cuda:0", 80 * GIB, 80 * GIB).is_ok());
        assert!(p.check("cuda:0", p.total(), 80 * GIB).is_ok());
        let e = p
            .check("cuda:0", p.total() - 1, 80 * GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit") && e.contains("cuda:0"), "{e}");
        assert!(
            e.contains("--kv-blocks") && e.contains("4095 would fit"),
            "{e}"
        );
        // Free memory below the weights: no KV remedy, a smaller model or quantization.
        let e = p
            .check("cuda:0", 3 * GIB, 24 * GIB)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3.00 GiB of 24.00 GiB is free"), "{e}");
        assert!(e.contains("smaller quantization or a smaller model"), "{e}");
        assert!(!e.contains("--kv-blocks"), "{e}");
        // F16 weights are four times as large.
        let f16 = DevicePlan::new(
            &c,
            &llama8b_tensors(DType::F16),
            &v2,
            4096,
            16,
            KvDtype::F32,
        )
        .unwrap();
        assert!(f16.weights > 14 * GIB, "{f16:?}");
        assert!(f16.check("cuda:0", 16 * GIB, 24 * GIB).is_err());
    }

    #[test]
    fn the_blocks_that_fit_do_fit() {
        let c = llama8b();
        let t = llama8b_tensors(DType::Q8_0);
        for free in [9 * GIB, 12 * GIB, 24 * GIB + 12345, 80 * GIB] {
            let p = DevicePlan::new(&c, &t, &v2, 100_000, 16, KvDtype::F32).unwrap();
            let n = p.blocks_that_fit(free);
            assert!(n > 0, "{free}");
            let q = DevicePlan::new(&c, &t, &v2, n, 16, KvDtype::F32).unwrap();
            assert!(q.check("cuda:0", free, free).is_ok(), "{free}: {n} blocks");
            // The most that fits next to the working space of the full context (a smaller
            // pool covers fewer positions and needs a little less scratch).
            let more = kv_bytes(&c, n + 1, 16, KvDtype::F32).unwrap();
            assert!(p.weights + p.workspace + more > free, "{free}: {n} blocks");
        }
    }

    /// The worker's automatic sizing (engine/worker.rs `kv_blocks`: the free memory less
    /// [`fixed_bytes`], then `kv::kv_blocks_from_memory` with the default 1 GiB reserve and 0.9)
    /// never plans more than the free memory, whatever the free memory is.
    #[test]
    fn auto_sized_pools_never_ask_for_more_than_is_free() {
        let c = llama8b();
        for d in [DType::Q4_K, DType::Q8_0, DType::F16] {
            let t = llama8b_tensors(d);
            let fixed = fixed_bytes_of(&c, &t, &v2).unwrap();
            let block = crate::kv::kv_block_bytes(&c, 16, KvDtype::F32);
            assert_eq!(
                Some(block),
                kv_block_bytes(&c, 16, KvDtype::F32),
                "one definition of a block"
            );
            let cap = 64 * crate::kv::blocks_for(c.max_ctx, 16);
            for free_gib in [1usize, 6, 10, 17, 20, 24, 48, 80, 141] {
                let free = free_gib * GIB + 4097;
                let n = crate::kv::kv_blocks_from_memory(
                    free.saturating_sub(fixed),
                    GIB,
                    0.9,
                    block,
                    cap,
                );
                if n < 2 {
                    continue; // the worker refuses: no memory left for the KV cache
                }
                let p = DevicePlan::new(&c, &t, &v2, n, 16, KvDtype::F32).unwrap();
                assert!(
                    p.check("cuda:0", free, free).is_ok(),
                    "{d} with {free_gib} GiB free: {n} blocks planned {} bytes",
                    p.total()
                );
            }
        }
    }

    #[test]
    fn the_attention_scratch_matches_the_kernels_sizing() {
        for (ctx, hd) in [
            (1usize, 64usize),
            (64, 128),
            (65, 128),
            (8192, 64),
            (131072, 256),
        ] {
            let part = ctx.max(1).div_ceil(ATTN_SPLIT) * (hd + 2);
            assert_eq!(part, super::super::attention::attn_part_floats(ctx, hd));
        }
    }

    #[test]
    fn gemma3_plans_its_second_rope_table() {
        let llama = crate::models::random::tiny_config(crate::config::Arch::Llama, 97);
        let gemma = crate::models::random::tiny_config(crate::config::Arch::Gemma3, 97);
        let ctx = 1000;
        let table = 1024 * llama.head_dim * 4; // cos and sin, positions to a power of two
        let extra = workspace_bytes(&gemma, ctx, true) - workspace_bytes(&llama, ctx, true);
        assert_eq!(extra, table);
    }

    #[test]
    fn absurd_configs_never_wrap() {
        let mut c = llama8b();
        c.n_layers = usize::MAX / 2;
        let t = llama8b_tensors(DType::Q4_K);
        let e = DevicePlan::new(&c, &t, &v2, 16, 16, KvDtype::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("KV cache overflows"), "{e}");
        c = llama8b();
        c.vocab = usize::MAX / 4;
        c.max_ctx = usize::MAX;
        let p = DevicePlan::new(&c, &t, &v2, usize::MAX / 64, 16, KvDtype::F32);
        assert!(p.is_err() || p.unwrap().check("cuda:0", GIB, GIB).is_err());
        let huge = [matrix(Upload::Product, DType::Q8_0, 1 << 20, 1 << 20)];
        let big = weight_bytes(&huge, &none).unwrap();
        assert!(weight_bytes(&[huge[0].clone(), huge[0].clone()], &v2).unwrap() > big);
    }
}
