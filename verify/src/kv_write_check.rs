//! The KV cache writes (`kv_write_<format>`) against the CPU's encoding of the same rows
//! (memra_engine::kv_format): byte for byte, in every format, at scattered slots.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::Gpu;
use memra_engine::models::random::{splitmix, unit};

use crate::case::Case;

pub fn kv_write_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let (rows, width, slots) = (5usize, 192usize, 12usize);
    // Large values too: f16 saturates them, Q8_0 scales its block by them.
    let vals = |s: u64| -> Vec<f32> {
        (0..(rows * width) as u64)
            .map(|i| match i % 97 {
                3 => 1.0e5,
                50 => -7.0e4,
                _ => 3.0 * unit(seed, s, i),
            })
            .collect()
    };
    let (k, v) = (vals(2600), vals(2601));
    // Distinct scattered slots.
    let mut order: Vec<u32> = (0..slots as u32).collect();
    for i in (1..order.len()).rev() {
        let j = (splitmix(seed, 2602, i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let slot = &order[..rows];
    let (dk, dv, ds) = (g.upload(&k)?, g.upload(&v)?, g.upload(slot)?);
    for kv in KvDtype::ALL {
        let rb = kv.row_bytes(width);
        let (ck, cv) = (g.zeros::<u8>(slots * rb)?, g.zeros::<u8>(slots * rb)?);
        g.kv_write(
            kv,
            (g.ptr(&ck), g.ptr(&cv)),
            (g.ptr(&dk), g.ptr(&dv)),
            g.ptr(&ds),
            rows,
            width,
        )?;
        let want = |x: &[f32]| {
            let mut c = vec![0u8; slots * rb];
            for (r, &s) in slot.iter().enumerate() {
                let s = s as usize;
                kv.encode(&x[r * width..(r + 1) * width], &mut c[s * rb..(s + 1) * rb]);
            }
            c
        };
        let mut problem = None;
        for (name, got, x) in [("K", g.download(&ck)?, &k), ("V", g.download(&cv)?, &v)] {
            let w = want(x);
            if let Some(i) = (0..w.len()).find(|&i| got[i] != w[i]) {
                problem.get_or_insert(format!(
                    "{name} byte {i} (slot {}, byte {} of the row) is {}, the CPU's {}",
                    i / rb,
                    i % rb,
                    got[i],
                    w[i]
                ));
            }
        }
        out.push(Case {
            kernel: "kv_write".into(),
            shape: format!("kv={kv} rows={rows} width={width} (bytes)"),
            rel_err: 0.0,
            tol: 0.0,
            problem,
        });
    }
    Ok(())
}
