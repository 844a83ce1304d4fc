//! The attention launches of a CUDA device: causal paged attention split by a fixed length in
//! positions (the tensor-core kernels kernels/cu/attn_mma.cu, the CUDA-core split kernels
//! kernels/cu/attention.cu) and the split combine, with their shapes, modes and grids.

use super::device::{Arg, Gpu};
use crate::error::Result;
use crate::kv_format::KvDtype;

/// Where [`Gpu::attention`] also prepares its output for the next product (prep.cuh).
#[derive(Clone, Copy, Debug)]
pub struct AttnPrep {
    pub values: u64,
    pub sums: u64,
    /// Columns per prepared row.
    pub kp: usize,
    pub bf16: bool,
}

/// Positions per attention split (`ATTN_SPLIT` in kernels/cu/attention.cu).
pub const ATTN_SPLIT: usize = 64;

/// Staged K/V buffers of the tensor-core attention over f16 / bf16 caches: two (cp.async; the
/// next split's copy in flight while a split is computed: H200 session 7, decode at depth
/// 32,768 170.0 -> 178.6 tok/s). The kernels gate also runs one (`AttnArgs::stages`): the same
/// bits.
pub const ATTN_STAGES: usize = 2;

/// The most blocks of an attention launch in y (splits: 8,192 positions); more splits loop in
/// their blocks. CUDA graphs launch the grid of the graph's context cap, whose blocks past a row's
/// splits exit at once: a bound keeps those cheap for long-context models.
const ATTN_GRID_Y: usize = 128;

/// Floats of attention scratch per (row, head) for rows whose largest `pos + 1` is `ctx`.
pub fn attn_part_floats(ctx: usize, head_dim: usize) -> usize {
    ctx.max(1).div_ceil(ATTN_SPLIT) * (head_dim + 2)
}

/// Pointers and shapes of one attention launch (rows `0..rows` of the launch).
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub q: u64,
    pub out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    /// The caches' format.
    pub kv: KvDtype,
    pub pos: u64,
    pub row_seq: u64,
    pub table_off: u64,
    pub tables: u64,
    /// Split partials: [`attn_part_floats`]`(ctx, head_dim)` floats per (row, head).
    pub scores: u64,
    /// At least the largest `pos + 1` of the launch's rows.
    pub ctx: usize,
    pub rows: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// Also prepare the output for a product (head_dim a multiple of 32).
    pub prep: Option<AttnPrep>,
    /// Tokens per tile of the tensor-core kernel (0: [`attn_tile_tokens`]). A performance
    /// choice only: a row's bits do not depend on it.
    pub tile_tokens: usize,
    /// The tensor-core kernel's mode (None: [`Gpu::attn_folds`]): fold every split inside the
    /// kernel (one partial per row and head, `scores` needs [`attn_folded_floats`] per row) or
    /// write a partial per split. A performance choice only: a row's bits do not depend on it.
    pub fold: Option<bool>,
    /// Staged K/V buffers of the tensor-core kernel over f16 / bf16 caches (0: [`ATTN_STAGES`];
    /// 1: one, for the kernels gate). A performance choice only.
    pub stages: usize,
    /// Split-mode blocks in y per (tiles, KV head) (0: [`attn_grid_y`]). A performance choice
    /// only.
    pub grid_y: usize,
    /// Sliding window (`AttnParams::window`, > 0): a row at `pos` sees positions
    /// [`attn_window_start`]`..=pos`, on the tensor-core kernels where the launch has one
    /// ([`attn_mma_eligible`]), else the CUDA-core split kernel.
    pub window: Option<usize>,
    /// Image spans (0: none, every text-only launch): per launch row a `(start, end)` u32 pair,
    /// the row's image (a bidirectional span, backend/spans.rs) or `(pos, pos + 1)`; a row sees
    /// `min(window start, start) .. max(pos + 1, end)` (`attn_row_range`, kernels/cu/kvfmt.cuh).
    /// `ctx` must cover every `end`.
    pub spans: u64,
}

/// The first position a row at `pos` sees under `window`: `pos + 1 - window` when that is
/// positive, else 0 (the CPU's backend/cpu/attention.rs; `attn_window_lo` in
/// kernels/cu/kvfmt.cuh for the attention kernels and attn_combine's fold start).
pub fn attn_window_start(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// The first 64-position split a row at `pos` computes under `window` (the splits below it are
/// never computed nor folded; a split's boundaries stay the fixed grid from position 0).
pub fn attn_first_split(pos: usize, window: Option<usize>) -> usize {
    attn_window_start(pos, window) / ATTN_SPLIT
}

/// The most splits one row of a launch computes when its rows' largest `pos + 1` is `ctx`: all
/// of them, or under a window those the window's positions touch (`window` positions starting
/// one short of a split boundary span `(window + 62) / 64 + 1` splits). It sizes the grid only.
pub fn attn_row_splits(ctx: usize, window: Option<usize>) -> usize {
    let all = ctx.max(1).div_ceil(ATTN_SPLIT);
    match window {
        Some(w) => all.min((w + ATTN_SPLIT - 2) / ATTN_SPLIT + 1),
        None => all,
    }
}

/// Whether a launch runs the tensor-core attention: the `attn_mma` family is in use (`kernel`),
/// `group` query heads per KV head fit its 16 mma rows, and it has a kernel for `head_dim` over
/// `kv` ([`attn_mma_kernel`]: head dims 64 and 128, and 256 over f16 / bf16 caches), with or
/// without a sliding window (Gemma 3's local layers: a per-row window mask, the splits below a
/// row's window skipped; since H200 session 13, Gemma 3 270M decode 352 -> 393 tok/s, prefill
/// 20,196 -> 32,802 against the split kernels). Every other launch takes the CUDA-core split
/// kernel. One process uses one family per launch shape: they order the arithmetic differently.
pub fn attn_mma_eligible(
    kernel: &str,
    head_dim: usize,
    group: usize,
    _window: Option<usize>,
    kv: KvDtype,
) -> bool {
    kernel == "attn_mma" && group <= 16 && attn_mma_kernel(head_dim, kv, false).is_some()
}

/// The tensor-core attention kernel for `head_dim` over a `kv` cache, when it has one: split
/// mode (`attn_mma_*`) or, with `fold`, fold mode (`attn_mmaf_*`). head_dim 256: split mode over
/// f16 / bf16 caches only.
pub fn attn_mma_kernel(head_dim: usize, kv: KvDtype, fold: bool) -> Option<String> {
    let mode = if fold { "mmaf" } else { "mma" };
    let has = match head_dim {
        64 | 128 => true,
        256 => !fold && matches!(kv, KvDtype::F16 | KvDtype::Bf16),
        _ => false,
    };
    has.then(|| format!("attn_{mode}_h{head_dim}_{kv}"))
}

/// Dynamic shared memory of a tensor-core attention launch: `stages` buffers of a K and a V tile
/// (64 positions x (head_dim + 8) 16-bit values; kernels/cu/attn_mma.cu).
pub fn attn_mma_smem(head_dim: usize, stages: usize) -> usize {
    stages * 2 * ATTN_SPLIT * (head_dim + 8) * 2
}

/// Split-mode blocks in y for `blocks` blocks in x over `splits` splits: enough to keep
/// `resident` blocks on each of `sms` multiprocessors (each block then walks a contiguous range of
/// splits, the next one's copy in flight), at most [`ATTN_GRID_Y`]. Performance only: a split's
/// partial does not depend on which block computes it.
pub fn attn_grid_y(splits: usize, blocks: usize, sms: usize, resident: usize) -> usize {
    let fill = (sms * resident / blocks.max(1)).max(1);
    splits.clamp(1, ATTN_GRID_Y).min(fill)
}

/// Tokens per tile of the tensor-core attention kernel for a launch of `rows` rows with `group`
/// query heads per KV head: one token per tile for decode-sized launches (more blocks), else as
/// many tokens as fill the 16 mma rows (the KV loads are shared by the tile's tokens).
pub fn attn_tile_tokens(rows: usize, group: usize) -> usize {
    if rows <= 16 {
        1
    } else {
        (16 / group.max(1)).max(1)
    }
}

/// Blocks (4 tiles x one KV head) from which a tensor-core launch folds its splits inside the
/// kernel: enough blocks to fill the GPU without splitting the positions.
pub const ATTN_FOLD_BLOCKS: usize = 128;

/// Partial floats per (row, head) of a fold-mode launch: one folded partial.
pub fn attn_folded_floats(head_dim: usize) -> usize {
    head_dim + 2
}

impl Gpu {
    /// Causal paged attention split by a fixed length in positions: partials per (row, head,
    /// split), then their combination in split order. With a window, only the splits the
    /// window touches are computed and folded.
    pub fn attention(&self, a: &AttnArgs) -> Result<()> {
        if a.head_dim > 256
            || !a.head_dim.is_multiple_of(2)
            || a.n_kv_heads == 0
            || !a.n_heads.is_multiple_of(a.n_kv_heads)
        {
            return Err(self.err(format!(
                "attention: head_dim {} (even, max 256), {} heads over {} KV heads",
                a.head_dim, a.n_heads, a.n_kv_heads
            )));
        }
        // The kernels take the window as a u32, 0 for none.
        let window = match a.window {
            Some(0) => return Err(self.err("attention: a sliding window of 0 positions")),
            w => self.u32_of(w.unwrap_or(0), "attention window")?,
        };
        if a.rows == 0 {
            return Ok(());
        }
        let splits = a.ctx.max(1).div_ceil(ATTN_SPLIT);
        let group = a.n_heads / a.n_kv_heads;
        let mma = self.uses_attn_mma(a.head_dim, group, a.window, a.kv);
        let fold = mma
            && a.fold.unwrap_or_else(|| {
                self.attn_folds(a.rows, a.n_heads, a.n_kv_heads, a.head_dim, a.window)
            });
        let stride = if fold {
            attn_folded_floats(a.head_dim)
        } else {
            attn_part_floats(a.ctx, a.head_dim)
        } as u64;
        let rh = self.u32_of(a.rows * a.n_heads, "attention rows x heads")?;
        // Both kernel families take these first: queries, caches, positions, block tables,
        // the split partials and their stride.
        let lead = [
            Arg::Ptr(a.q),
            Arg::Ptr(a.k_cache),
            Arg::Ptr(a.v_cache),
            Arg::Ptr(a.pos),
            Arg::Ptr(a.row_seq),
            Arg::Ptr(a.table_off),
            Arg::Ptr(a.tables),
            Arg::Ptr(a.scores),
            Arg::U64(stride),
        ];
        let heads = [
            Arg::U32(self.u32_of(a.n_heads, "heads")?),
            Arg::U32(self.u32_of(a.n_kv_heads, "kv heads")?),
        ];
        let tail = [
            Arg::U32(self.u32_of(a.block_size, "block_size")?),
            Arg::F32(a.scale),
        ];
        match attn_mma_kernel(a.head_dim, a.kv, fold).filter(|_| mma) {
            Some(kernel) => {
                let tpt = match a.tile_tokens {
                    0 => attn_tile_tokens(a.rows, group),
                    n => n,
                };
                if tpt * group > 16 {
                    return Err(self.err(format!(
                        "attention: {tpt} tokens per tile x {group} heads exceed the 16 mma rows"
                    )));
                }
                // A block: 4 tiles and one KV head.
                let blocks = a.rows.div_ceil(4 * tpt) * a.n_kv_heads;
                let tiling = [
                    Arg::U32(self.u32_of(a.rows, "attention rows")?),
                    Arg::U32(self.u32_of(tpt, "tokens per tile")?),
                ];
                let stages = match (a.kv, a.stages) {
                    (KvDtype::F16 | KvDtype::Bf16, 0) => ATTN_STAGES,
                    (KvDtype::F16 | KvDtype::Bf16, n) => n.min(2),
                    _ => 1,
                };
                let smem = attn_mma_smem(a.head_dim, stages);
                let stage_arg = [
                    Arg::U32(self.u32_of(stages, "attention stages")?),
                    // Wide: a split-mode block whose tokens fit one tile (batch-1 decode) spreads
                    // each split over its 4 warps (H200 session 7: depth 32,768 178.6 -> 186.3
                    // tok/s; the same bits).
                    Arg::U32(1),
                    Arg::U32(window),
                    Arg::Ptr(a.spans),
                ];
                let args = [&lead[..], &tiling, &heads, &tail, &stage_arg].concat();
                let (name, f) = self
                    .funcs
                    .get_key_value(kernel.as_str())
                    .ok_or_else(|| self.err(format!("kernel {kernel} is not built")))?;
                // Split mode: blocks in y each take a contiguous range of the splits (the grid
                // bounds the parallelism, not the result). Fold mode: a block walks all its splits.
                let force = Some(a.grid_y).filter(|&n| n > 0);
                let ys = match (fold, force) {
                    (true, _) => 1,
                    (false, Some(n)) => splits.clamp(1, ATTN_GRID_Y).min(n),
                    (false, None) => {
                        let resident = self.blocks_per_sm(name, f, smem)?;
                        attn_grid_y(splits, blocks, self.sms as usize, resident)
                    }
                };
                let grid = (
                    self.u32_of(blocks, "attention blocks")?,
                    self.u32_of(ys, "attention splits")?,
                );
                let smem = self.u32_of(smem, "attention shared memory")?;
                self.launch_fn(f, name, grid, 128, smem, &args)?;
            }
            None => {
                // At most ATTN_GRID_Y blocks per (row, head); each loops over its splits (from
                // its window's first split; an image row's positions may start below its window).
                let bound = if a.spans == 0 { a.window } else { None };
                let ys = attn_row_splits(a.ctx, bound).min(ATTN_GRID_Y);
                let ys = self.u32_of(ys, "attention splits")?;
                let kernel = format!("attn_split_{}", a.kv);
                let head_dim = [Arg::U32(self.u32_of(a.head_dim, "head_dim")?)];
                let last = [Arg::U32(window), Arg::Ptr(a.spans)];
                let args = [&lead[..], &heads, &head_dim, &tail, &last].concat();
                self.launch(&kernel, (rh, ys), 128, &args)?;
            }
        }
        let prep = a.prep;
        if prep.is_some() && !a.head_dim.is_multiple_of(32) {
            return Err(self.err("attention: fused preparation needs head_dim % 32 == 0"));
        }
        let args = [
            Arg::Ptr(a.scores),
            Arg::Ptr(a.out),
            Arg::Ptr(a.pos),
            Arg::U64(stride),
            Arg::U32(self.u32_of(a.rows, "rows")?),
            Arg::U32(self.u32_of(a.n_heads, "heads")?),
            Arg::U32(self.u32_of(a.head_dim, "head_dim")?),
            Arg::Ptr(prep.map_or(0, |p| p.values)),
            Arg::Ptr(prep.map_or(0, |p| p.sums)),
            Arg::U32(self.u32_of(prep.map_or(0, |p| p.kp), "kp")?),
            Arg::U32(prep.is_some_and(|p| p.bf16) as u32),
            Arg::U32(fold as u32),
            Arg::U32(window),
            Arg::Ptr(a.spans),
        ];
        self.launch("attn_combine", (rh, 1), 128, &args)
    }

    /// Whether this device runs the tensor-core attention for `head_dim` with `group` query
    /// heads per KV head, `window` and a `kv` cache ([`attn_mma_eligible`]).
    pub fn uses_attn_mma(
        &self,
        head_dim: usize,
        group: usize,
        window: Option<usize>,
        kv: KvDtype,
    ) -> bool {
        attn_mma_eligible(self.attn_kernel, head_dim, group, window, kv)
    }

    /// Whether a launch of `rows` rows folds its splits inside the tensor-core kernel (enough
    /// blocks without splitting positions, [`ATTN_FOLD_BLOCKS`]; `AttnArgs::fold` forces either
    /// mode per launch, for the kernels gate). The callers size the partials with it:
    /// [`attn_folded_floats`] per (row, head). Never for a launch on the split kernel (a partial
    /// per split).
    pub fn attn_folds(
        &self,
        rows: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        window: Option<usize>,
    ) -> bool {
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return false;
        }
        let group = n_heads / n_kv_heads;
        // Fold mode has kernels for every KV format at head dims 64 / 128 (F16 stands for them).
        if attn_mma_kernel(head_dim, KvDtype::F16, true).is_none()
            || !self.uses_attn_mma(head_dim, group, window, KvDtype::F16)
        {
            return false;
        }
        let tpt = attn_tile_tokens(rows, group);
        rows.div_ceil(4 * tpt) * n_kv_heads >= ATTN_FOLD_BLOCKS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::device::check_args;

    #[test]
    fn every_attention_kernel_name_is_a_kernel_with_the_launch_s_arguments() {
        // Gpu::attention's tensor-core launch: 9 lead, rows and tokens per tile, 2 head counts,
        // block size, scale, stages, wide, the window and the image spans.
        let mut args = vec![Arg::Ptr(1); 8];
        args.extend([Arg::U64(130), Arg::U32(4), Arg::U32(4), Arg::U32(32)]);
        args.extend([
            Arg::U32(8),
            Arg::U32(16),
            Arg::F32(0.1),
            Arg::U32(2),
            Arg::U32(1),
            Arg::U32(512),
            Arg::Ptr(0),
        ]);
        for hd in [64, 128, 256] {
            for kv in KvDtype::ALL {
                for fold in [false, true] {
                    let Some(name) = attn_mma_kernel(hd, kv, fold) else {
                        assert!(hd == 256 && (fold || matches!(kv, KvDtype::F32 | KvDtype::Q8_0)));
                        continue;
                    };
                    assert_eq!(check_args(&name, &args), Ok(()), "{name}");
                }
            }
        }
        assert_eq!(attn_mma_kernel(96, KvDtype::F16, true), None);
        assert!(attn_mma_eligible(
            "attn_mma",
            256,
            4,
            Some(512),
            KvDtype::F16
        ));
        assert!(!attn_mma_eligible("attn_mma", 256, 4, None, KvDtype::Q8_0));
        assert!(attn_mma_eligible(
            "attn_mma",
            128,
            4,
            Some(512),
            KvDtype::Q8_0
        ));
        assert!(!attn_mma_eligible("attn_split", 128, 4, None, KvDtype::F16));
    }

    #[test]
    fn split_mode_grid_fills_the_gpu_within_the_splits() {
        // Decode on an 8-KV-head model, 3 blocks resident per SM on 132 SMs: 49 blocks per head.
        assert_eq!(attn_grid_y(125, 8, 132, 3), 49);
        // Fewer splits than that: one block per split.
        assert_eq!(attn_grid_y(9, 8, 132, 3), 9);
        // Never past ATTN_GRID_Y, never 0 (an empty context still launches one block).
        assert_eq!(attn_grid_y(2048, 1, 132, 8), ATTN_GRID_Y);
        assert_eq!(attn_grid_y(0, 8, 132, 3), 1);
        assert_eq!(attn_grid_y(512, 4096, 132, 3), 1);
        // Two buffers of K and V tiles for head_dim 128: 69,632 bytes (past the 48 KiB default).
        assert_eq!(attn_mma_smem(128, 2), 69_632);
        assert_eq!(attn_mma_smem(64, 1), 18_432);
    }

    #[test]
    fn the_split_attention_and_combine_kernels_take_the_launch_s_arguments() {
        // Gpu::attention's split launch: 9 lead, 2 head counts, head_dim, block size and scale,
        // the window, the image spans.
        let mut args = vec![Arg::Ptr(1); 8];
        args.extend([Arg::U64(130), Arg::U32(4), Arg::U32(1), Arg::U32(256)]);
        args.extend([Arg::U32(16), Arg::F32(0.1), Arg::U32(512), Arg::Ptr(0)]);
        for kv in KvDtype::ALL {
            let name = format!("attn_split_{kv}");
            assert_eq!(check_args(&name, &args), Ok(()), "{name}");
        }
        // attn_combine: partials, out, pos, stride, rows, heads, head_dim, the preparation
        // (values, sums, kp, bf16), folded, window, image spans.
        let mut args = vec![Arg::Ptr(1); 3];
        args.extend([Arg::U64(130), Arg::U32(3), Arg::U32(4), Arg::U32(256)]);
        args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0), Arg::U32(0)]);
        args.extend([Arg::U32(0), Arg::U32(512), Arg::Ptr(0)]);
        assert_eq!(check_args("attn_combine", &args), Ok(()));
    }

    const WINDOWS: [Option<usize>; 9] = [
        None,
        Some(1),
        Some(2),
        Some(63),
        Some(64),
        Some(65),
        Some(100),
        Some(512),
        Some(4096),
    ];

    #[test]
    fn a_window_starts_where_the_cpu_s_does_and_its_first_split_holds_it() {
        for pos in 0..700usize {
            for w in WINDOWS {
                // backend/cpu/attention.rs: start = n.saturating_sub(w), n = pos + 1.
                let n = pos + 1;
                let cpu = w.map_or(0, |w| n.saturating_sub(w));
                let lo = attn_window_start(pos, w);
                assert_eq!(lo, cpu, "pos {pos} window {w:?}");
                let s0 = attn_first_split(pos, w);
                // The first split computed holds lo (so it is never empty: lo <= pos), and no
                // position the row sees lies below it.
                assert!(s0 * ATTN_SPLIT <= lo && lo < (s0 + 1) * ATTN_SPLIT);
                assert!(lo <= pos);
                if w.is_none() || w.is_some_and(|w| w >= n) {
                    assert_eq!(s0, 0, "pos {pos} window {w:?}");
                }
            }
        }
    }

    #[test]
    fn the_split_grid_covers_every_row_s_window() {
        for ctx in 1..600usize {
            for w in WINDOWS {
                let need = (0..ctx)
                    .map(|pos| pos / ATTN_SPLIT + 1 - attn_first_split(pos, w))
                    .max()
                    .unwrap_or(0);
                let ys = attn_row_splits(ctx, w);
                assert!(need <= ys, "ctx {ctx} window {w:?}: {need} > {ys}");
                // Tight once the context holds a worst-placed window.
                if w.is_none_or(|w| ctx >= w + 2 * ATTN_SPLIT) {
                    assert_eq!(need, ys, "ctx {ctx} window {w:?}");
                }
            }
        }
    }

    #[test]
    fn windowed_attention_runs_the_tensor_core_kernels_where_they_exist() {
        let f16 = KvDtype::F16;
        for hd in [64, 128, 256] {
            for w in [None, Some(1), Some(64), Some(512), Some(1 << 20)] {
                assert!(attn_mma_eligible("attn_mma", hd, 4, w, f16));
                assert!(!attn_mma_eligible("attn_split", hd, 4, w, f16));
            }
        }
        // head_dim 256: f16 / bf16 caches only.
        assert!(attn_mma_eligible("attn_mma", 256, 4, None, KvDtype::Bf16));
        assert!(!attn_mma_eligible("attn_mma", 256, 4, None, KvDtype::F32));
        assert!(!attn_mma_eligible(
            "attn_mma",
            256,
            4,
            Some(8),
            KvDtype::Q8_0
        ));
        // More than 16 query heads per KV head, or a head dim without a kernel.
        assert!(!attn_mma_eligible("attn_mma", 64, 32, None, f16));
        assert!(!attn_mma_eligible("attn_mma", 96, 4, None, f16));
    }

    /// The split kernels' windowed arithmetic, emulated on the host in f64: partials per
    /// 64-position split from the window's first split (positions below the window skipped),
    /// folded as attn_combine from that split, equal the direct softmax over the window.
    #[test]
    fn folding_the_window_s_splits_is_the_window_s_softmax() {
        let score = |p: usize| ((p * 37 % 101) as f64 - 50.0) / 7.0;
        let value = |p: usize| ((p * 53 % 89) as f64 - 44.0) / 9.0;
        for pos in [
            0usize, 1, 62, 63, 64, 65, 127, 128, 200, 511, 512, 600, 1000,
        ] {
            for w in WINDOWS {
                let lo = attn_window_start(pos, w);
                let direct = {
                    let m = (lo..=pos).map(score).fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = (lo..=pos).map(|p| (score(p) - m).exp()).collect();
                    let l: f64 = e.iter().sum();
                    (lo..=pos).zip(&e).map(|(p, e)| e * value(p)).sum::<f64>() / l
                };
                let (mut mm, mut ll, mut oo) = (f64::NEG_INFINITY, 0.0, 0.0);
                for split in attn_first_split(pos, w)..=pos / ATTN_SPLIT {
                    let p0 = split * ATTN_SPLIT;
                    let ps = p0.max(lo)..=(p0 + ATTN_SPLIT - 1).min(pos);
                    assert!(
                        !ps.is_empty(),
                        "pos {pos} window {w:?}: empty split {split}"
                    );
                    let m = ps.clone().map(score).fold(f64::NEG_INFINITY, f64::max);
                    let l: f64 = ps.clone().map(|p| (score(p) - m).exp()).sum();
                    let o: f64 = ps.map(|p| (score(p) - m).exp() * value(p)).sum();
                    let mn = mm.max(m);
                    let (a, b) = ((mm - mn).exp(), (m - mn).exp());
                    (mm, ll, oo) = (mn, ll * a + l * b, oo * a + o * b);
                }
                let folded = oo / ll;
                assert!((folded - direct).abs() < 1e-9, "pos {pos} window {w:?}");
            }
        }
    }
}
