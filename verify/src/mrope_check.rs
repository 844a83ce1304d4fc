//! The M-RoPE kernels (rope.cu `rope_mrope`, `rope_kv_mrope_<fmt>`, `rope_kv_norm_mrope_<fmt>`;
//! qwen2vl's contiguous sections, qwen3vl's interleaved ones) in the `rope` group of `memra-verify
//! kernels`: `rope_mrope` against the CPU (`Rope::cos_sin_at` and `rope_apply`) at random
//! position triples; the fused launches against `rope_mrope` on Q and K then `kv_write_<fmt>`
//! (and `rms_norm` of the heads first), Q, K and both caches bit for bit, every cache format,
//! whole and partial RoPE; and at equal triples `(p, p, p)` the plain kernels' bits.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cpu::ops;
use memra_engine::backend::cuda::{Gpu, RopePos};
use memra_engine::models::random::splitmix;
use memra_engine::ops::rope::{Rope, Sections};

use crate::case::{Case, bytes_of, compare, rand_vec, same_bytes};
use crate::rope_kv_run::{Heads, Table, rope_kv_bytes, tables};

/// A case that passes when `got` and `want` have the same bits.
fn same_bits(name: &str, shape: String, got: &[u8], want: &[u8]) -> Case {
    same_bytes(name, shape, got, want, "the composed launches")
}

/// Table positions.
const LEN: u32 = 256;

/// Qwen2-VL's contiguous and Qwen3-VL's interleaved sections over `half` pairs (the real
/// models' proportions: [16, 24, 24] and [24, 20, 20] of 64).
fn sections(half: usize) -> [Sections; 2] {
    let (t, h) = (half / 4, 3 * half / 8);
    let (ti, hi) = (half * 3 / 8, half * 5 / 16);
    [
        Sections {
            sizes: [t, h, half - t - h],
            interleaved: false,
        },
        Sections {
            sizes: [ti, hi, half - ti - hi],
            interleaved: true,
        },
    ]
}

/// Random triples (each below [`LEN`]) for `rows` rows.
fn triples(seed: u64, stream: u64, rows: usize) -> Vec<[u32; 3]> {
    (0..rows as u64)
        .map(|r| [0, 1, 2].map(|a| (splitmix(seed, stream, 3 * r + a) % LEN as u64) as u32))
        .collect()
}

pub fn mrope_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    rope_cases(g, seed, out)?;
    fused_cases(g, seed, out)
}

/// `rope_mrope` against the CPU at random triples; at equal ones `rope`'s bits.
fn rope_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, &(rows, heads, hd)) in [(1, 1, 64), (7, 3, 64), (9, 4, 128)].iter().enumerate() {
        for s in sections(hd / 2) {
            let rope = Rope::new(hd, 1.0e6, None, None).with_sections(Some(s));
            let (cos, sin) = tables(&rope, LEN);
            let st = 40_000 + 10 * i as u64 + u64::from(s.interleaved);
            let pos3 = triples(seed, st, rows);
            let x = rand_vec(seed, st + 5, rows * heads * hd, 1.0);
            let mut want = x.clone();
            for (r, row) in want.chunks_exact_mut(heads * hd).enumerate() {
                let (c, sn) = rope.cos_sin_at(pos3[r]);
                ops::rope_apply(row, hd, &c, &sn);
            }
            let flat: Vec<u32> = pos3.iter().flatten().copied().collect();
            let (dx, dp, dc, ds) = (
                g.upload(&x)?,
                g.upload(&flat)?,
                g.upload(&cos)?,
                g.upload(&sin)?,
            );
            let pos = RopePos::M {
                pos3: g.ptr(&dp),
                sections: s.words(),
            };
            let tabs = (g.ptr(&dc), g.ptr(&ds), hd / 2);
            g.rope(g.ptr(&dx), pos, tabs, rows, heads, hd)?;
            let shape = format!("rows={rows} heads={heads} hd={hd} sections={:?}", s.sizes);
            let layout = if s.interleaved {
                "interleaved"
            } else {
                "contiguous"
            };
            out.push(compare(
                &format!("rope_mrope ({layout})"),
                shape.clone(),
                &g.download(&dx)?,
                &want,
                1e-6,
            ));
            // Equal triples: the plain kernel's bits.
            let plain: Vec<u32> = pos3.iter().map(|t| t[0]).collect();
            let same: Vec<u32> = plain.iter().flat_map(|&p| [p; 3]).collect();
            let (dm, dpl, dsame) = (g.upload(&x)?, g.upload(&plain)?, g.upload(&same)?);
            let dplain = g.upload(&x)?;
            let m = RopePos::M {
                pos3: g.ptr(&dsame),
                sections: s.words(),
            };
            g.rope(g.ptr(&dm), m, tabs, rows, heads, hd)?;
            g.rope(g.ptr(&dplain), g.ptr(&dpl), tabs, rows, heads, hd)?;
            out.push(same_bits(
                &format!("rope_mrope == rope at (p, p, p) ({layout})"),
                shape,
                &bytes_of(&g.download(&dm)?),
                &bytes_of(&g.download(&dplain)?),
            ));
        }
    }
    Ok(())
}

/// `rope_kv_mrope_<fmt>` and `rope_kv_norm_mrope_<fmt>` against their compositions.
fn fused_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    // (rows, q heads, kv heads, head_dim, rotated pairs): Qwen2-VL / Qwen3-VL-like heads of 128,
    // a small one, partial RoPE.
    let shapes = [
        (1usize, 8usize, 2usize, 128usize, 64usize),
        (5, 4, 1, 64, 32),
        (3, 4, 2, 64, 16),
    ];
    for (i, &(rows, heads, kv_heads, hd, rot)) in shapes.iter().enumerate() {
        for s in sections(rot) {
            let rope = Rope::new(2 * rot, 1.0e6, None, None).with_sections(Some(s));
            let (cos, sin) = tables(&rope, LEN);
            let st = 41_000 + 10 * i as u64 + u64::from(s.interleaved);
            let table = Table {
                pos: triples(seed, st, rows).into_iter().flatten().collect(),
                sections: Some(s.words()),
                cos,
                sin,
                slot: (0..rows as u32).map(|r| (r * 3 + 1) % 8).collect(),
                slots: 8,
            };
            let c = Heads::random(seed, st + 1, (rows, heads, kv_heads, hd, rot));
            for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0] {
                // `fused`: one rope_kv(_norm)_mrope launch; else the composition.
                let run = |norm: bool, fused: bool| rope_kv_bytes(g, &c, &table, kv, (norm, fused));
                let layout = if s.interleaved {
                    "interleaved"
                } else {
                    "contiguous"
                };
                let shape = format!(
                    "rows={rows} heads={heads}/{kv_heads} hd={hd} rot={rot} kv={kv} {layout}"
                );
                let (want, got) = (run(false, false)?, run(false, true)?);
                out.push(same_bits("rope_kv_mrope", shape.clone(), &got, &want));
                let (want, got) = (run(true, false)?, run(true, true)?);
                out.push(same_bits("rope_kv_norm_mrope", shape, &got, &want));
            }
        }
    }
    Ok(())
}
