//! The launches of a `rope_kv` case (fused_check.rs, mrope_check.rs): Q and K rotated (their
//! heads RMS-normed first with `norm`) and K and V written to the caches, either in one
//! `rope_kv(_norm)(_mrope)_<fmt>` launch or composed of the kernels it fuses; the result is Q,
//! K and both caches as bytes, for comparing the two bit for bit.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::{Gpu, RopeKvArgs, RopePos};
use memra_engine::ops::rope::Rope;

use crate::case::{bytes_of, rand_vec};

/// The heads' norm epsilon.
const EPS: f32 = 1e-6;

/// The `[position][half]` cos and sin tables of `rope` over positions `0..len`.
pub(crate) fn tables(rope: &Rope, len: u32) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..len {
        let (c, s) = rope.cos_sin(p);
        cos.extend(c);
        sin.extend(s);
    }
    (cos, sin)
}

/// A case's values: `rows` rows of `heads` Q heads and `kv_heads` K and V heads of `hd`,
/// `rot` rotated pairs per head ([`Dims`]), and the q and k norms' weights (`hd` each).
pub(crate) struct Heads {
    pub dims: Dims,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub norms: [Vec<f32>; 2],
}

impl Heads {
    /// Random values from streams `st` (Q), `st + 1` (K), `st + 2` (V) (scale 3) and `st + 3`,
    /// `st + 4` (the q and k norms, scale 1.5).
    pub fn random(seed: u64, st: u64, dims: Dims) -> Heads {
        let (rows, heads, kv_heads, hd, _) = dims;
        Heads {
            dims,
            q: rand_vec(seed, st, rows * heads * hd, 3.0),
            k: rand_vec(seed, st + 1, rows * kv_heads * hd, 3.0),
            v: rand_vec(seed, st + 2, rows * kv_heads * hd, 3.0),
            norms: [
                rand_vec(seed, st + 3, hd, 1.5),
                rand_vec(seed, st + 4, hd, 1.5),
            ],
        }
    }
}

/// `(rows, q heads, kv heads, head_dim, rotated pairs)`.
pub(crate) type Dims = (usize, usize, usize, usize, usize);

/// Where the rows go: their positions (one a row; M-RoPE: three a row, with the sections'
/// words), the cos / sin tables, each row's cache slot of `slots`.
pub(crate) struct Table {
    pub pos: Vec<u32>,
    pub sections: Option<[u32; 4]>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub slot: Vec<u32>,
    pub slots: usize,
}

/// Q, K and both `kv` caches as bytes after the case's launches: `fused`, one `rope_kv`
/// launch (with `norm`, the heads' norms in it); else the composition: with `norm`, `rms_norm`
/// of the q heads and of the k heads then `rope_kv`, without, `rope` of Q and of K then
/// `kv_write`.
pub(crate) fn rope_kv_bytes(
    g: &Gpu,
    c: &Heads,
    t: &Table,
    kv: KvDtype,
    (norm, fused): (bool, bool),
) -> Result<Vec<u8>> {
    let (rows, heads, kv_heads, hd, rot) = c.dims;
    let kw = kv_heads * hd;
    let rb = kv.row_bytes(kw);
    let (dp, dc, ds, dslot) = (
        g.upload(&t.pos)?,
        g.upload(&t.cos)?,
        g.upload(&t.sin)?,
        g.upload(&t.slot)?,
    );
    let (dqn, dkn, dv) = (
        g.upload(&c.norms[0])?,
        g.upload(&c.norms[1])?,
        g.upload(&c.v)?,
    );
    let pos = match t.sections {
        Some(sections) => RopePos::M {
            pos3: g.ptr(&dp),
            sections,
        },
        None => g.ptr(&dp).into(),
    };
    let (dq, dk) = (g.upload(&c.q)?, g.upload(&c.k)?);
    let (kc, vc) = (g.zeros::<u8>(t.slots * rb)?, g.zeros::<u8>(t.slots * rb)?);
    let (pq, pk) = (g.ptr(&dq), g.ptr(&dk));
    if norm && !fused {
        g.rms_norm(pq, g.ptr(&dqn), pq, rows * heads, hd, EPS)?;
        g.rms_norm(pk, g.ptr(&dkn), pk, rows * kv_heads, hd, EPS)?;
    }
    if fused || norm {
        g.rope_kv(&RopeKvArgs {
            q: pq,
            k: pk,
            v: g.ptr(&dv),
            pos,
            cos: g.ptr(&dc),
            sin: g.ptr(&ds),
            k_cache: g.ptr(&kc),
            v_cache: g.ptr(&vc),
            slot: g.ptr(&dslot),
            rows,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            rot,
            kv,
            norm: (norm && fused).then(|| (g.ptr(&dqn), g.ptr(&dkn), EPS)),
        })?;
    } else {
        let tabs = (g.ptr(&dc), g.ptr(&ds), rot);
        g.rope(pq, pos, tabs, rows, heads, hd)?;
        g.rope(pk, pos, tabs, rows, kv_heads, hd)?;
        let caches = (g.ptr(&kc), g.ptr(&vc));
        g.kv_write(kv, caches, (pk, g.ptr(&dv)), g.ptr(&dslot), rows, kw)?;
    }
    let mut b = bytes_of(&g.download(&dq)?);
    b.extend(bytes_of(&g.download(&dk)?));
    b.extend(g.download(&kc)?);
    b.extend(g.download(&vc)?);
    Ok(b)
}
