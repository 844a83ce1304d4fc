//! The tile layout of the GPU's v2 products (kernels/cu/wfmt.cuh): a weight matrix of N rows x K
//! columns in GGUF blocks is rewritten once at load into tiles of 16 rows x KT columns whose
//! bytes map straight onto `mma.sync` A fragments, lane by lane. Nothing is lost: [`unpack`]
//! gives back the GGUF bytes, and the tests here prove it for every format and odd shapes.
//!
//! Lane L = 4g + t of a warp holds, per 16-column step, the m16n8k16 A fragment registers
//! r = 0..3 of halves h = 0, 1: (row g + 8 (r & 1), column 8 (r >> 1) + 2t + h). [`spot`] says
//! where each value's code lives; kernels/cu/wfmt.cuh reads it from there.

use super::DType;
use crate::error::{Error, Result};

mod q4k;

/// Geometry of one repacked format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileFormat {
    /// Columns per tile.
    pub kt: usize,
    /// Bytes per tile (16 rows).
    pub tile_bytes: usize,
}

/// The tile format of `dtype`, or `None` when the v2 products do not read it.
pub fn tile_format(dtype: DType) -> Option<TileFormat> {
    let (kt, tile_bytes) = match dtype {
        DType::Q8_0 => (64, 1088),
        DType::Q4_0 => (64, 576),
        DType::Q4_1 => (64, 640),
        DType::Q5_0 => (64, 704),
        DType::Q5_1 => (64, 768),
        DType::Q4_K => (256, 2368),
        DType::Q5_K => (256, 2816),
        DType::Q6_K => (256, 3360),
        DType::F16 | DType::BF16 => (64, 2048),
        _ => return None,
    };
    Some(TileFormat { kt, tile_bytes })
}

/// A matrix in the tile layout.
#[derive(Clone, Debug)]
pub struct Packed {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub format: TileFormat,
    /// Row tiles (`rows` rounded up to 16, over 16).
    pub row_tiles: usize,
    /// Column tiles (`cols` rounded up to `kt`, over `kt`).
    pub col_tiles: usize,
    pub data: Vec<u8>,
}

impl Packed {
    /// Columns including the zero padding up to a whole tile.
    pub fn padded_cols(&self) -> usize {
        self.col_tiles * self.format.kt
    }
}

/// Row and column (within a 16-column step) of lane `lane`, A register `r`, half `h` (the
/// m16n8k16 A fragment).
fn frag16(lane: usize, r: usize, h: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    (g + 8 * (r & 1), 8 * (r >> 1) + 2 * t + h)
}

/// Splits one GGUF block of `dtype` into its codes (written to `codes`, one per value of the
/// block, in column order: the stored integer of a quantized value) and its scale bytes.
fn split_block<'a>(dtype: DType, b: &'a [u8], codes: &mut [u16]) -> &'a [u8] {
    match dtype {
        DType::Q8_0 => {
            for (c, &q) in codes.iter_mut().zip(&b[2..34]) {
                *c = q as u16;
            }
            &b[..2]
        }
        DType::Q4_0 | DType::Q4_1 => {
            let h = if dtype == DType::Q4_0 { 2 } else { 4 };
            let (lo, hi) = codes.split_at_mut(16);
            for ((l, u), &q) in lo.iter_mut().zip(hi).zip(&b[h..h + 16]) {
                *l = (q & 15) as u16;
                *u = (q >> 4) as u16;
            }
            &b[..h]
        }
        DType::Q5_0 | DType::Q5_1 => {
            let h = if dtype == DType::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]);
            let fifth = |j: usize| (((qh >> j) & 1) << 4) as u16;
            let (lo, hi) = codes.split_at_mut(16);
            for (j, ((l, u), &q)) in lo.iter_mut().zip(hi).zip(&b[h + 4..h + 20]).enumerate() {
                *l = (q & 15) as u16 | fifth(j);
                *u = (q >> 4) as u16 | fifth(j + 16);
            }
            &b[..h]
        }
        DType::Q4_K | DType::Q5_K => {
            // Sub-block j (32 values) is the low or high nibbles of qs[32 (j / 2)..][..32] and,
            // for Q5_K, bit j of qh[l] above them.
            let (qh, qs) = if dtype == DType::Q4_K {
                (&[0u8; 32][..], &b[16..144])
            } else {
                (&b[16..48], &b[48..176])
            };
            for (j, sub) in codes.chunks_exact_mut(32).enumerate() {
                let sh = 4 * (j & 1);
                let q = &qs[32 * (j / 2)..][..32];
                for ((c, &lo), &hi) in sub.iter_mut().zip(q).zip(qh) {
                    *c = (((lo >> sh) & 15) | (((hi >> j) & 1) << 4)) as u16;
                }
            }
            &b[..16]
        }
        DType::Q6_K => {
            // Value 128 jj + 32 k + ll: the nibble (k >> 1) of ql[64 jj + 32 (k & 1) + ll] and
            // bits 2 k of qh[32 jj + ll] above it.
            let (ql, qh) = (&b[..128], &b[128..192]);
            for (i, sub) in codes.chunks_exact_mut(32).enumerate() {
                let (jj, k) = (i / 4, i % 4);
                let l = &ql[64 * jj + 32 * (k & 1)..][..32];
                let h = &qh[32 * jj..][..32];
                let (ls, hs) = (4 * (k >> 1), 2 * k);
                for ((c, &lo), &hi) in sub.iter_mut().zip(l).zip(h) {
                    *c = (((lo >> ls) & 15) | (((hi >> hs) & 3) << 4)) as u16;
                }
            }
            &b[192..210]
        }
        _ => unreachable!("split_block: {dtype} has no tile format"),
    }
}

/// The codes of row `r` of a tile row from its GGUF bytes `row` into `codes`, laid out by tile
/// (`[col_tiles][16][kt]`: a tile's 16 rows of `kt` codes together; the columns past the row's
/// values are left as they are), and its scale bytes per block, in GGUF order, into `heads`.
fn row_codes<'a>(
    dtype: DType,
    (row, r): (&'a [u8], usize),
    kt: usize,
    codes: &mut [u16],
    heads: &mut Vec<&'a [u8]>,
) {
    heads.clear();
    let at = |col: usize| (col / kt) * 16 * kt + r * kt + col % kt;
    if dtype.is_float() {
        for (i, chunk) in row.chunks(2 * kt).enumerate() {
            let out = &mut codes[at(i * kt)..][..chunk.len() / 2];
            for (c, b) in out.iter_mut().zip(chunk.chunks_exact(2)) {
                *c = u16::from_le_bytes([b[0], b[1]]);
            }
        }
        return;
    }
    // A block's columns lie in one tile (the block size divides kt).
    let bs = dtype.block_size();
    for (i, b) in row.chunks_exact(dtype.block_bytes()).enumerate() {
        heads.push(split_block(dtype, b, &mut codes[at(i * bs)..][..bs]));
    }
}

/// The inverse of [`split_block`]: one GGUF block from its codes and scale bytes.
fn join_block(dtype: DType, codes: &[u16], head: &[u8], out: &mut Vec<u8>) {
    match dtype {
        DType::Q8_0 => {
            out.extend_from_slice(head);
            out.extend(codes.iter().map(|&c| c as u8));
        }
        DType::Q4_0 | DType::Q4_1 => {
            out.extend_from_slice(head);
            out.extend((0..16).map(|j| (codes[j] | (codes[j + 16] << 4)) as u8));
        }
        DType::Q5_0 | DType::Q5_1 => {
            out.extend_from_slice(head);
            let qh = (0..32).fold(0u32, |qh, j| qh | (((codes[j] >> 4) & 1) as u32) << j);
            out.extend_from_slice(&qh.to_le_bytes());
            out.extend((0..16).map(|j| ((codes[j] & 15) | ((codes[j + 16] & 15) << 4)) as u8));
        }
        DType::Q4_K | DType::Q5_K => {
            out.extend_from_slice(head);
            let mut qh = [0u8; 32];
            let mut qs = [0u8; 128];
            for j in 0..8 {
                for l in 0..32 {
                    let c = codes[32 * j + l] as u8;
                    qs[32 * (j / 2) + l] |= (c & 15) << (4 * (j & 1));
                    qh[l] |= ((c >> 4) & 1) << j;
                }
            }
            if dtype == DType::Q5_K {
                out.extend_from_slice(&qh);
            }
            out.extend_from_slice(&qs);
        }
        DType::Q6_K => {
            let mut ql = [0u8; 128];
            let mut qh = [0u8; 64];
            for (e, &c) in codes.iter().enumerate().take(256) {
                let (jj, k, ll) = (e / 128, (e % 128) / 32, e % 32);
                let c = c as u8;
                ql[64 * jj + ll + 32 * (k & 1)] |= (c & 15) << (4 * (k >> 1));
                qh[32 * jj + ll] |= ((c >> 4) & 3) << (2 * k);
            }
            out.extend_from_slice(&ql);
            out.extend_from_slice(&qh);
            out.extend_from_slice(head);
        }
        _ => unreachable!("join_block: {dtype} has no tile format"),
    }
}

/// Where the code of value (step `s`, `lane`, register `r`, half `h`) of a tile lives: its low
/// bits (byte, shift, bits) and, for 5- and 6-bit codes, its bits above the nibble.
struct Spot {
    lo: (usize, u32, u32),
    hi: Option<(usize, u32, u32)>,
}

fn spot(dtype: DType, s: usize, lane: usize, r: usize, h: usize) -> Spot {
    let i = r + 4 * h; // nibble index in the step's word
    let nib = |base: usize| {
        (
            base + lane * 16 + 4 * (s % 4) + i / 2,
            4 * (i % 2) as u32,
            4,
        )
    };
    match dtype {
        DType::F16 | DType::BF16 => Spot {
            lo: (s * 512 + lane * 16 + r * 4 + h * 2, 0, 16),
            hi: None,
        },
        DType::Q8_0 => Spot {
            lo: ((s / 2) * 512 + lane * 16 + 8 * (s % 2) + 2 * r + h, 0, 8),
            hi: None,
        },
        DType::Q4_0 | DType::Q4_1 => Spot {
            lo: nib(0),
            hi: None,
        },
        DType::Q5_0 | DType::Q5_1 => Spot {
            lo: nib(0),
            hi: Some((512 + lane * 4 + s, i as u32, 1)),
        },
        DType::Q5_K => Spot {
            lo: nib((s / 4) * 512),
            hi: Some((2048 + lane * 16 + s, i as u32, 1)),
        },
        DType::Q6_K => Spot {
            lo: nib((s / 4) * 512),
            hi: Some((
                2048 + lane * 32 + 2 * s + (2 * i) / 8,
                ((2 * i) % 8) as u32,
                2,
            )),
        },
        _ => Spot {
            lo: nib((s / 4) * 512),
            hi: None,
        },
    }
}

/// Byte offsets of the scale bytes of (row, GGUF block within the tile) and their length; for
/// Q6_K the 16 scales then the 2 bytes of d go to two places (see [`write_tile`]).
fn head_spot(dtype: DType, row: usize, blk: usize) -> (usize, usize) {
    match dtype {
        DType::Q8_0 => (1024 + (row * 2 + blk) * 2, 2),
        DType::Q4_0 => (512 + (row * 2 + blk) * 2, 2),
        DType::Q4_1 => (512 + (row * 2 + blk) * 4, 4),
        DType::Q5_0 => (640 + (row * 2 + blk) * 2, 2),
        DType::Q5_1 => (640 + (row * 2 + blk) * 4, 4),
        DType::Q5_K => (2560 + row * 16, 16),
        _ => (3072 + row * 16, 16),
    }
}

/// GGUF blocks per tile (per row) that carry scale bytes.
fn heads_per_tile(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 2,
        DType::F16 | DType::BF16 => 0,
        _ => 1,
    }
}

/// Calls `f(step, lane, r, h, row, col)` for every value slot of a tile.
fn each_slot(f: TileFormat, mut g: impl FnMut(usize, usize, usize, usize, usize, usize)) {
    for s in 0..f.kt / 16 {
        for lane in 0..32 {
            for r in 0..4 {
                for h in 0..2 {
                    let (row, col) = frag16(lane, r, h);
                    g(s, lane, r, h, row, 16 * s + col);
                }
            }
        }
    }
}

fn get_bits(tile: &[u8], (at, shift, bits): (usize, u32, u32)) -> u16 {
    if bits == 16 {
        u16::from_le_bytes([tile[at], tile[at + 1]])
    } else {
        ((tile[at] >> shift) as u16) & ((1u16 << bits) - 1)
    }
}

/// One code's bits in a tile: `tile[at] |= ((code >> rshift) as u8 & mask) << lshift`, with
/// `code` the tile's code at `src` = row * kt + column. A value's low bits and its bits above
/// the nibble are a term each; a 16-bit float's two bytes are two. (Small fields: a tile's
/// terms, up to 8,192, stay in the core's caches.)
struct Term {
    at: u16,
    src: u16,
    rshift: u8,
    mask: u8,
    lshift: u8,
}

/// The terms of every value slot of a `dtype` tile, in [`each_slot`]'s order (each [`spot`]
/// once for the whole repack), but the low nibbles that [`write_nibbles`] writes.
fn terms(dtype: DType, f: TileFormat) -> Vec<Term> {
    let mut v = Vec::with_capacity(32 * f.kt);
    each_slot(f, |s, lane, r, h, row, col| {
        // Tiles are at most 3,360 bytes of 16 x 256 values: both fit 16 bits.
        let src = (row * f.kt + col) as u16;
        let sp = spot(dtype, s, lane, r, h);
        let mut put = |(at, shift, bits): (usize, u32, u32), rshift: u8| {
            let at = at as u16;
            if bits == 16 {
                v.push(Term {
                    at,
                    src,
                    rshift: 0,
                    mask: 0xff,
                    lshift: 0,
                });
                v.push(Term {
                    at: at + 1,
                    src,
                    rshift: 8,
                    mask: 0xff,
                    lshift: 0,
                });
            } else {
                let mask = ((1u16 << bits) - 1) as u8;
                v.push(Term {
                    at,
                    src,
                    rshift,
                    mask,
                    lshift: shift as u8,
                });
            }
        };
        if !nibbles(dtype) {
            put(sp.lo, 0);
        }
        if let Some(hi) = sp.hi {
            put(hi, 4);
        }
    });
    v
}

/// Whether `dtype`'s codes keep their low 4 bits in [`spot`]'s nibble planes (every tile format
/// but Q8_0 and the floats).
fn nibbles(dtype: DType) -> bool {
    !matches!(dtype, DType::Q8_0 | DType::F16 | DType::BF16)
}

/// The nibble planes of a tile from its codes (`codes`: 16 rows of `kt`): [`spot`]'s `nib` as a
/// loop. Byte (s / 4) 512 + 16 lane + 4 (s % 4) + j of step s (16 columns) holds the low nibbles
/// of column 16 s + [0, 8, 1, 9][j] + 2 t of row g (bits 0-3) and row g + 8 (bits 4-7), lane =
/// 4 g + t: the values i = 2 j and 2 j + 1 of the lane's m16n8k16 A fragment.
fn write_nibbles(codes: &[u16], tile: &mut [u8]) {
    const COL: [usize; 4] = [0, 8, 1, 9];
    let kt = codes.len() / 16;
    for s in 0..kt / 16 {
        let base = (s / 4) * 512 + 4 * (s % 4);
        for g in 0..8 {
            let lo = &codes[g * kt + 16 * s..][..16];
            let hi = &codes[(g + 8) * kt + 16 * s..][..16];
            for t in 0..4 {
                let out = &mut tile[base + (4 * g + t) * 16..][..4];
                for (b, c) in out.iter_mut().zip(COL) {
                    let c = c + 2 * t;
                    *b = (lo[c] as u8 & 15) | ((hi[c] as u8 & 15) << 4);
                }
            }
        }
    }
}

/// Writes tile (rt, kt) (zeroed before) from the codes of its 16 rows (`codes`: 16 x kt, zero
/// in the padding rows and columns) and the heads of its `live` rows; `terms`: [`terms`] of the
/// type.
fn write_tile(
    dtype: DType,
    kt: usize,
    (codes, heads, live): (&[u16], &[Vec<&[u8]>], usize),
    terms: &[Term],
    tile: &mut [u8],
) {
    if nibbles(dtype) {
        write_nibbles(codes, tile);
    }
    for t in terms {
        tile[t.at as usize] |= ((codes[t.src as usize] >> t.rshift) as u8 & t.mask) << t.lshift;
    }
    let hpt = heads_per_tile(dtype);
    for (row, rh) in heads.iter().enumerate().take(live) {
        for blk in 0..hpt {
            let Some(head) = rh.get(hpt * kt + blk) else {
                continue;
            };
            if dtype == DType::Q4_K {
                q4k::put_head(tile, row, head);
                continue;
            }
            let (at, len) = head_spot(dtype, row, blk);
            tile[at..at + len].copy_from_slice(&head[..len]);
            if dtype == DType::Q6_K {
                tile[3328 + row * 2..3328 + row * 2 + 2].copy_from_slice(&head[16..18]);
            }
        }
    }
}

/// Reads the codes of row `row` (into `codes`, the tile's columns) and its scale bytes back out
/// of a tile: the inverse of [`write_tile`] for one row.
fn read_row(
    dtype: DType,
    f: TileFormat,
    tile: &[u8],
    row: usize,
    codes: &mut [u16],
) -> Vec<Vec<u8>> {
    each_slot(f, |s, lane, r, h, rr, col| {
        if rr != row {
            return;
        }
        let sp = spot(dtype, s, lane, r, h);
        let hi = sp.hi.map_or(0, |hi| get_bits(tile, hi));
        codes[col] = get_bits(tile, sp.lo) | (hi << 4);
    });
    (0..heads_per_tile(dtype))
        .map(|blk| {
            if dtype == DType::Q4_K {
                return q4k::get_head(tile, row);
            }
            let (at, len) = head_spot(dtype, row, blk);
            let mut h = tile[at..at + len].to_vec();
            if dtype == DType::Q6_K {
                h.extend_from_slice(&tile[3328 + row * 2..3328 + row * 2 + 2]);
            }
            h
        })
        .collect()
}

/// A gate matrix and an up matrix of `ff` rows each (GGUF rows of `row_bytes` in `gate`, `up`)
/// as one matrix of 2 `ff` rows interleaved by 8: rows 16 j .. 16 j + 7 are gate rows 8 j ..
/// 8 j + 7, rows 16 j + 8 .. 16 j + 15 up rows 8 j .. 8 j + 7. A 16-row tile of the products
/// then holds feature 8 j + g's gate in row g and its up in row g + 8, which the mma / wgmma
/// C layout gives one thread (products.cu: the `Outs` GLU_ILV mode, the SwiGLU epilogue). Only
/// rows move, so every output element's arithmetic is the plain fused matrix's. `ff` must be a
/// multiple of 8.
pub fn interleave_glu(gate: &[u8], up: &[u8], ff: usize, row_bytes: usize) -> Result<Vec<u8>> {
    if !ff.is_multiple_of(8)
        || ff.checked_mul(row_bytes) != Some(gate.len())
        || gate.len() != up.len()
    {
        return Err(Error::Quant(format!(
            "interleaved gate/up: {ff} rows of {row_bytes} bytes (a multiple of 8 rows) from {} \
             and {} bytes",
            gate.len(),
            up.len()
        )));
    }
    let mut out = Vec::with_capacity(2 * gate.len());
    let block = 8 * row_bytes;
    for (g, u) in gate.chunks_exact(block).zip(up.chunks_exact(block)) {
        out.extend_from_slice(g);
        out.extend_from_slice(u);
    }
    Ok(out)
}

/// One repack's constants: the GGUF rows in `src` and the tile terms of their type.
struct Job<'a> {
    dtype: DType,
    f: TileFormat,
    src: &'a [u8],
    rows: usize,
    row_bytes: usize,
    padded: usize,
    terms: Vec<Term>,
}

/// A worker's buffers: the 16 rows' codes by tile (`[col_tiles][16][kt]`, zero past a row's
/// values and in the rows past the matrix) and their heads.
type Scratch<'a> = (Vec<u16>, Vec<Vec<&'a [u8]>>);

impl<'a> Job<'a> {
    fn scratch(&self) -> Scratch<'a> {
        (vec![0u16; 16 * self.padded], vec![Vec::new(); 16])
    }

    /// Tile row `rt` into `out` (zeroed).
    fn fill(&self, (codes, heads): &mut Scratch<'a>, rt: usize, out: &mut [u8]) {
        let live = self.rows.saturating_sub(rt * 16).min(16);
        let kt = self.f.kt;
        for (r, h) in heads.iter_mut().enumerate() {
            if r < live {
                let row = &self.src[(rt * 16 + r) * self.row_bytes..][..self.row_bytes];
                row_codes(self.dtype, (row, r), kt, codes, h);
            } else {
                h.clear();
                for tile in codes.chunks_exact_mut(16 * kt) {
                    tile[r * kt..(r + 1) * kt].fill(0);
                }
            }
        }
        let tiles = out.chunks_exact_mut(self.f.tile_bytes);
        for (i, (tile, c)) in tiles.zip(codes.chunks_exact(16 * kt)).enumerate() {
            write_tile(self.dtype, i, (c, heads, live), &self.terms, tile);
        }
    }
}

/// Repacks `rows` x `cols` values of `dtype` stored as GGUF rows in `src`.
pub fn repack(dtype: DType, src: &[u8], rows: usize, cols: usize) -> Result<Packed> {
    let f = tile_format(dtype)
        .ok_or_else(|| Error::Unsupported(format!("no tile format for {dtype}")))?;
    let row_bytes = dtype
        .bytes_for(cols as u64)
        .ok_or_else(|| Error::Quant(format!("{dtype}: {cols} columns is not whole blocks")))?
        as usize;
    if rows.checked_mul(row_bytes) != Some(src.len()) {
        return Err(Error::Quant(format!(
            "{dtype}: {rows} x {cols} needs {} bytes, got {}",
            rows.saturating_mul(row_bytes),
            src.len()
        )));
    }
    let row_tiles = rows.div_ceil(16);
    let col_tiles = cols.div_ceil(f.kt);
    let padded = col_tiles * f.kt;
    let tile_row_bytes = col_tiles * f.tile_bytes;
    let mut data = vec![0u8; row_tiles * tile_row_bytes];
    let job = Job {
        dtype,
        f,
        src,
        rows,
        row_bytes,
        padded,
        terms: terms(dtype, f),
    };
    {
        use rayon::prelude::*;
        data.par_chunks_mut(tile_row_bytes.max(1))
            .enumerate()
            .for_each_init(|| job.scratch(), |s, (rt, out)| job.fill(s, rt, out));
    }
    Ok(Packed {
        dtype,
        rows,
        cols,
        format: f,
        row_tiles,
        col_tiles,
        data,
    })
}

/// The GGUF bytes of `p` (rows in order, padding dropped): the inverse of [`repack`].
pub fn unpack(p: &Packed) -> Result<Vec<u8>> {
    let f = p.format;
    let padded = p.padded_cols();
    let bs = p.dtype.block_size();
    let mut out = Vec::new();
    for row in 0..p.rows {
        let (rt, r) = (row / 16, row % 16);
        let mut codes = vec![0u16; padded];
        let mut heads = Vec::new();
        for kt in 0..p.col_tiles {
            let at = (rt * p.col_tiles + kt) * f.tile_bytes;
            let tile = p
                .data
                .get(at..at + f.tile_bytes)
                .ok_or_else(|| Error::Quant("packed data is truncated".into()))?;
            heads.extend(read_row(
                p.dtype,
                f,
                tile,
                r,
                &mut codes[kt * f.kt..(kt + 1) * f.kt],
            ));
        }
        if p.dtype.is_float() {
            out.extend(codes[..p.cols].iter().flat_map(|c| c.to_le_bytes()));
            continue;
        }
        for b in 0..p.cols / bs {
            let head = heads.get(b).map(|h| h.as_slice()).unwrap_or(&[]);
            join_block(p.dtype, &codes[b * bs..(b + 1) * bs], head, &mut out);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn interleave_glu_puts_a_features_gate_and_up_in_one_tile() {
        // 16 features of 3-byte rows: gate row f = [f, f, f], up row f = [100 + f; 3].
        let (ff, rb) = (16, 3);
        let gate: Vec<u8> = (0..ff).flat_map(|f| [f as u8; 3]).collect();
        let up: Vec<u8> = (0..ff).flat_map(|f| [100 + f as u8; 3]).collect();
        let out = interleave_glu(&gate, &up, ff, rb).unwrap();
        assert_eq!(out.len(), 2 * ff * rb);
        for r in 0..2 * ff {
            let (tile, g) = (r / 16, r % 16);
            let f = (8 * tile + g % 8) as u8;
            let want = if g < 8 { f } else { 100 + f };
            assert_eq!(out[r * rb..(r + 1) * rb], [want; 3], "row {r}");
        }
        // Not a multiple of 8 rows, or the byte counts disagree: an error, not a panic.
        assert!(interleave_glu(&gate[..12 * rb], &up[..12 * rb], 12, rb).is_err());
        assert!(interleave_glu(&gate, &up[..8 * rb], ff, rb).is_err());
        assert!(interleave_glu(&gate, &up, ff, rb + 1).is_err());
    }

    use super::*;

    use crate::testing::pseudo_bytes as bytes;

    /// An expert stack of whole 16-row tiles repacked as one matrix is its experts' repacks one
    /// after the other (the CUDA load repacks a stack in one call: backend/cuda/mat.rs
    /// `repack_parts`).
    #[test]
    fn a_stack_of_whole_tiles_repacks_as_its_experts_one_after_the_other() {
        for (dtype, cols) in [
            (DType::Q4_K, 512),
            (DType::Q6_K, 256),
            (DType::Q8_0, 96),
            (DType::F16, 40),
        ] {
            let (e, rows) = (5, 32);
            let rb = dtype.bytes_for(cols as u64).unwrap() as usize;
            let src = bytes(e * rows * rb, cols as u64);
            let whole = repack(dtype, &src, e * rows, cols).unwrap();
            let mut each = Vec::new();
            for x in 0..e {
                let p = repack(dtype, &src[x * rows * rb..][..rows * rb], rows, cols).unwrap();
                assert_eq!(
                    (p.col_tiles, p.padded_cols()),
                    (whole.col_tiles, whole.padded_cols())
                );
                each.extend_from_slice(&p.data);
            }
            assert!(whole.data == each, "{dtype}");
        }
    }

    #[test]
    fn repack_then_unpack_gives_the_original_blocks() {
        let cases: &[(DType, &[usize])] = &[
            (DType::Q8_0, &[32, 64, 96, 576]),
            (DType::Q4_0, &[32, 64, 160]),
            (DType::Q4_1, &[32, 96, 1536]),
            (DType::Q5_0, &[32, 64, 640]),
            (DType::Q5_1, &[32, 96, 160]),
            (DType::Q4_K, &[256, 768]),
            (DType::Q5_K, &[256, 512]),
            (DType::Q6_K, &[256, 768]),
            (DType::F16, &[1, 17, 64, 100]),
            (DType::BF16, &[2, 64, 130]),
        ];
        for &(dtype, col_list) in cases {
            for &cols in col_list {
                for rows in [1, 15, 16, 17, 33] {
                    let rb = dtype.bytes_for(cols as u64).unwrap() as usize;
                    let src = bytes(rows * rb, (rows * 1000 + cols) as u64);
                    let p = repack(dtype, &src, rows, cols).unwrap();
                    let f = p.format;
                    assert_eq!(
                        p.data.len(),
                        rows.div_ceil(16) * cols.div_ceil(f.kt) * f.tile_bytes
                    );
                    assert_eq!(unpack(&p).unwrap(), src, "{dtype} {rows}x{cols}");
                }
            }
        }
    }

    #[test]
    fn tiles_hold_the_values_where_the_kernels_read_them() {
        // Q8_0: lane 5 = (g 1, t 1); register 3, half h of step 0 = row 9, column 8 + 2 + h: byte
        // 5 * 16 + 2 * 3 + h; step 3 (columns 48..64) lives in the second plane, 8 bytes on.
        let (rows, cols) = (16, 64);
        let rb = DType::Q8_0.block_bytes() * 2;
        let mut src = vec![0u8; rows * rb];
        for r in 0..rows {
            for c in 0..cols {
                let (blk, j) = (c / 32, c % 32);
                src[r * rb + blk * 34 + 2 + j] = (r * 64 + c) as u8;
            }
            src[r * rb..r * rb + 2].copy_from_slice(&(r as u16 + 1).to_le_bytes());
        }
        let p = repack(DType::Q8_0, &src, rows, cols).unwrap();
        for h in 0..2 {
            assert_eq!(p.data[5 * 16 + 6 + h], (9 * 64 + 10 + h) as u8);
            assert_eq!(
                p.data[512 + 5 * 16 + 8 + 6 + h],
                (9 * 64 + 48 + 10 + h) as u8
            );
        }
        // Scale of (row 9, block 0).
        assert_eq!(&p.data[1024 + 9 * 2 * 2..][..2], &10u16.to_le_bytes());
    }

    #[test]
    fn shapes_that_are_not_whole_blocks_are_refused() {
        assert!(repack(DType::Q4_K, &[0u8; 144], 1, 100).is_err());
        assert!(repack(DType::Q8_0, &[0u8; 33], 1, 32).is_err());
        assert!(repack(DType::Q2_K, &[0u8; 84], 1, 256).is_err());
    }
}
