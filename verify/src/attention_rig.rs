//! One attention launch over uploaded KV caches and block tables, its output and partials
//! poisoned with NaN first (every value read back was written): the launches of the windowed
//! and image-span attention checks (attention_window_check.rs, attention_span_check.rs).

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::{AttnArgs, Gpu, attn_part_floats};

use crate::attention_check::Shape;

/// Uploaded caches and block tables (flat, with offsets): attention launches over them.
pub(crate) struct Rig<'a> {
    pub g: &'a Gpu,
    pub s: &'a Shape,
    pub kv: KvDtype,
    pub dk: u64,
    pub dv: u64,
    pub doff: u64,
    pub dtab: u64,
}

/// One launch's rows (sequence and position each, queries `q`) and how it runs.
pub(crate) struct Launch<'a> {
    pub seq: &'a [u32],
    pub pos: &'a [u32],
    pub q: &'a [f32],
    pub ctx: usize,
    pub window: Option<usize>,
    /// Tokens per tile (0: the default).
    pub tile_tokens: usize,
    /// The tensor-core kernel's mode (None: the default for the launch).
    pub fold: Option<bool>,
    /// Each row's span pair, or none (a null `spans`).
    pub spans: Option<&'a [u32]>,
}

impl Rig<'_> {
    /// The output rows of one launch, in the order of its rows.
    pub fn launch(&self, l: &Launch<'_>) -> Result<Vec<f32>> {
        let (g, s) = (self.g, self.s);
        let rows = l.pos.len();
        let qd = s.n_heads * s.head_dim;
        let (dq, dpos, dseq) = (g.upload(l.q)?, g.upload(l.pos)?, g.upload(l.seq)?);
        let dsp = l.spans.map(|sp| g.upload(sp)).transpose()?;
        let n = rows * qd;
        let dout = g.zeros::<f32>(n)?;
        g.fill(g.ptr(&dout), f32::NAN, n)?;
        let parts = rows * s.n_heads * attn_part_floats(l.ctx, s.head_dim);
        let dsc = g.zeros::<f32>(parts)?;
        // Stale partials must not matter: the splits below a window are never folded.
        g.fill(g.ptr(&dsc), f32::NAN, parts)?;
        let a = AttnArgs {
            q: g.ptr(&dq),
            out: g.ptr(&dout),
            k_cache: self.dk,
            v_cache: self.dv,
            kv: self.kv,
            pos: g.ptr(&dpos),
            row_seq: g.ptr(&dseq),
            table_off: self.doff,
            tables: self.dtab,
            scores: g.ptr(&dsc),
            ctx: l.ctx,
            rows,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            block_size: s.block_size,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            prep: None,
            tile_tokens: l.tile_tokens,
            fold: l.fold,
            stages: 0,
            grid_y: 0,
            window: l.window,
            spans: dsp.as_ref().map_or(0, |d| g.ptr(d)),
        };
        g.attention(&a)?;
        g.download(&dout)
    }
}

/// Poisons `positions` of one sequence's K and V values (`width` a position, blocks of
/// `s.block_size` through `table`) so a read of them shows: NaN, or 1e4 in a Q8_0 cache (which
/// cannot hold NaN: it would read it back as 0).
pub(crate) fn poison(
    s: &Shape,
    kv: KvDtype,
    table: &[u32],
    width: usize,
    (k32, v32): (&mut [f32], &mut [f32]),
    positions: impl IntoIterator<Item = usize>,
) {
    let bad = if kv == KvDtype::Q8_0 { 1e4 } else { f32::NAN };
    for p in positions {
        let row = table[p / s.block_size] as usize * s.block_size + p % s.block_size;
        k32[row * width..(row + 1) * width].fill(bad);
        v32[row * width..(row + 1) * width].fill(bad);
    }
}
