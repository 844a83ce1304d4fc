//! `memra-bench kernels`: the device microbenchmark of the v2 products. For each weight type and
//! shape: correctness first (sampled outputs against an f64 CPU reference, and every row
//! bitwise equal across M and launch geometries), then the median time per M with achieved GB/s
//! and TFLOP/s, next to the copy bandwidth measured in the same run.
//!
//! Kernel sources may come from `$MEMRA_KERNEL_DIR` and geometries from `--launches`, so one GPU
//! call sweeps many variants without a Rust rebuild.

use std::fmt::Write as _;

use rayon::prelude::*;

use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::products::{ActBuf, ActKind, PMat};
use memra_engine::backend::cuda::profile::{Launch, Profile, WS_STAGES, WS_STAGES_3WG, WS_WGS};
use memra_engine::error::{Error, Result};
use memra_engine::quant::{self, DType};

use crate::kblocks::{Q4_K_BYTES, fill_q4_k, fill_q6_k};
use crate::rng::{draw, normalish};

/// What to measure.
#[derive(Clone, Debug)]
pub struct KernelArgs {
    pub device: usize,
    pub dtypes: Vec<DType>,
    /// (N, K) pairs.
    pub shapes: Vec<(usize, usize)>,
    pub ms: Vec<usize>,
    /// Extra geometries to check and time besides the profile's.
    pub launches: Vec<Launch>,
    pub reps: usize,
    /// Bytes of weight copies to rotate through when timing (defeats the L2 cache).
    pub rotate_bytes: usize,
}

/// One timed case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub dtype: String,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub launch: String,
    pub nseg: u32,
    pub us_median: f64,
    pub us_min: f64,
    pub gb_s: f64,
    pub tflop_s: f64,
}

/// The whole report.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub device: String,
    pub profile: String,
    pub copy_gb_s: f64,
    pub rows: Vec<Row>,
    /// Per (dtype, shape): max |y - ref| / max |ref| over the sampled outputs.
    pub errors: Vec<(String, usize, usize, f64)>,
    /// Descriptions of any bitwise differences across M or geometry (must be empty).
    pub mismatches: Vec<String>,
}

/// Parses `nt,rpb,s|n|m|w|x|x3` items separated by `;` (s = split K over warps, n = the
/// register-tiled product, m = the shared-memory product, w = the warpgroup product: sm_90a,
/// `profile::WGMMA_TYPES`; x / x3 = the warp-specialized product with two / three computing
/// warpgroups: F16 / BF16).
pub fn parse_launches(s: &str) -> Result<Vec<Launch>> {
    s.split(';')
        .filter(|x| !x.trim().is_empty())
        .map(|item| {
            let p: Vec<&str> = item.split(',').map(|x| x.trim()).collect();
            let bad = || {
                Error::Input(format!(
                    "--launches item `{item}`: expected nt,rpb,s|n|m|w|x|x3"
                ))
            };
            if p.len() != 3 {
                return Err(bad());
            }
            let nt: u32 = p[0].parse().map_err(|_| bad())?;
            let rpb: u32 = p[1].parse().map_err(|_| bad())?;
            let ok = match p[2] {
                "w" => matches!(nt, 8 | 16) && rpb == 1,
                "x" | "x3" => nt == 16 && rpb == 1,
                "s" | "n" | "m" => matches!(nt, 1 | 2 | 4 | 8) && (1..=8).contains(&rpb),
                _ => false,
            };
            if !ok {
                return Err(bad());
            }
            let (stages, wgs) = match p[2] {
                "x" => (WS_STAGES, WS_WGS),
                "x3" => (WS_STAGES_3WG, 3),
                _ => (0, 0),
            };
            Ok(Launch {
                nt,
                rpb,
                split_k: p[2] == "s",
                smem: matches!(p[2], "m" | "w" | "x" | "x3"),
                wg: matches!(p[2], "w" | "x" | "x3"),
                ws: matches!(p[2], "x" | "x3"),
                stages,
                wgs,
            })
        })
        .collect()
}

/// Random GGUF rows of `dtype`: `n` x `k`, values of std ~0.02.
pub fn random_matrix(dtype: DType, n: usize, k: usize, seed: u64) -> Result<Vec<u8>> {
    let rb = dtype
        .bytes_for(k as u64)
        .ok_or_else(|| Error::Input(format!("{dtype}: {k} columns is not whole blocks")))?
        as usize;
    let mut out = vec![0u8; n * rb];
    let std = 0.02f32;
    out.par_chunks_mut(rb)
        .enumerate()
        .try_for_each(|(r, row)| {
            let key = draw(seed, r as u64);
            match dtype {
                DType::Q4_K => fill_q4_k(key, 0, std, row),
                DType::Q6_K => fill_q6_k(key, 0, std, row),
                DType::Q5_K => {
                    let mut q4 = vec![0u8; row.len() / 176 * Q4_K_BYTES];
                    fill_q4_k(key, 0, std / 2.0, &mut q4);
                    for (b, (dst, src)) in row
                        .chunks_exact_mut(176)
                        .zip(q4.chunks_exact(144))
                        .enumerate()
                    {
                        dst[..16].copy_from_slice(&src[..16]);
                        for (i, h) in dst[16..48].iter_mut().enumerate() {
                            *h = draw(key ^ 0x55, (b * 32 + i) as u64) as u8;
                        }
                        dst[48..].copy_from_slice(&src[16..]);
                    }
                }
                _ => {
                    let vals: Vec<f32> = (0..k).map(|i| normalish(key, i as u64) * std).collect();
                    row.copy_from_slice(&quant::quantize(dtype, &vals)?);
                }
            }
            Ok::<(), Error>(())
        })?;
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Device-to-device copy bandwidth (bytes read + written per second), 1 GiB buffers.
pub fn copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 1usize << 28;
    let a = gpu.zeros::<f32>(n)?;
    let mut b = gpu.zeros::<f32>(n)?;
    let mut times = Vec::new();
    for i in 0..6 {
        let t = gpu.time_ms(|| {
            gpu.stream
                .memcpy_dtod(&a, &mut b)
                .map_err(|e| gpu.err(format!("copy: {e:?}")))
        })?;
        if i > 0 {
            times.push(t as f64);
        }
    }
    Ok(2.0 * (n * 4) as f64 / (median(&mut times) * 1e-3) / 1e9)
}

/// Everything for one (dtype, shape).
struct Case<'a> {
    gpu: &'a Gpu,
    profile: &'a Profile,
    dtype: DType,
    n: usize,
    k: usize,
    copies: Vec<PMat>,
    act: ActBuf,
    x: Vec<f32>,
    /// Dequantized weight rows sampled for the reference check.
    sample: Vec<(usize, Vec<f32>)>,
}

impl Case<'_> {
    fn run(&self, w: &PMat, m: usize, l: Launch, y: u64) -> Result<()> {
        self.gpu.product(w, &self.act, y, None, m, l)
    }

    fn outputs(&self, m: usize, l: Launch) -> Result<Vec<f32>> {
        let y = self.gpu.zeros::<f32>(m * self.n)?;
        self.gpu.fill(self.gpu.ptr(&y), f32::NAN, m * self.n)?;
        self.run(&self.copies[0], m, l, self.gpu.ptr(&y))?;
        self.gpu.download(&y)
    }
}

fn make_case<'a>(
    gpu: &'a Gpu,
    profile: &'a Profile,
    a: &KernelArgs,
    dtype: DType,
    n: usize,
    k: usize,
) -> Result<Case<'a>> {
    let mmax = a.ms.iter().copied().max().unwrap_or(1);
    let raw = random_matrix(dtype, n, k, 0x5eed ^ (n * 31 + k) as u64)?;
    let packed = memra_engine::quant::repack::repack(dtype, &raw, n, k)?;
    let ncopies = (a.rotate_bytes / packed.data.len().max(1)).clamp(1, 16);
    let copies = (0..ncopies)
        .map(|_| gpu.upload_tiles(profile, &packed))
        .collect::<Result<Vec<_>>>()?;
    let rb = raw.len() / n;
    let sample: Vec<(usize, Vec<f32>)> = (0..48)
        .map(|i| {
            if i < 16 {
                i
            } else {
                (draw(7, i as u64) as usize) % n
            }
        })
        .filter(|&r| r < n)
        .map(|r| {
            let mut v = vec![0f32; k];
            quant::dequantize_row(dtype, &raw[r * rb..(r + 1) * rb], &mut v).map(|_| (r, v))
        })
        .collect::<Result<_>>()?;
    let x: Vec<f32> = (0..mmax * k).map(|i| normalish(99, i as u64)).collect();
    let xd = gpu.upload(&x)?;
    let act = gpu.act_buf(ActKind::of(dtype), mmax, copies[0].kp, true)?;
    gpu.prepare(gpu.ptr(&xd), &act, mmax, k)?;
    gpu.sync()?;
    Ok(Case {
        gpu,
        profile,
        dtype,
        n,
        k,
        copies,
        act,
        x,
        sample,
    })
}

/// Checks and times every case; returns the report and a printable table.
pub fn run(a: &KernelArgs) -> Result<(Report, String)> {
    let gpu = Gpu::open(a.device)?;
    let profile = Profile::for_device(&gpu);
    let mut rep = Report {
        device: format!("{} ({}, {} SMs)", gpu.name, gpu.arch, gpu.sms),
        profile: profile.describe(),
        copy_gb_s: copy_bandwidth(&gpu)?,
        ..Default::default()
    };
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{} | copy {:.0} GB/s\n{}",
        rep.device, rep.copy_gb_s, rep.profile
    );
    let _ = writeln!(
        table,
        "{:<5} {:>6} {:>6} {:>4} {:>8} {:>4} {:>9} {:>8} {:>7}",
        "dtype", "N", "K", "M", "launch", "nseg", "us", "GB/s", "TFLOP/s"
    );
    let mmax = a.ms.iter().copied().max().unwrap_or(1);
    for &dtype in &a.dtypes {
        for &(n, k) in &a.shapes {
            if dtype.bytes_for(k as u64).is_none() {
                let _ = writeln!(table, "{dtype} {n}x{k}: skipped (K is not whole blocks)");
                continue;
            }
            let c = make_case(&gpu, &profile, a, dtype, n, k)?;
            check_case(&c, a, mmax, &mut rep)?;
            time_case(&c, a, &mut rep, &mut table)?;
        }
    }
    let _ = writeln!(table, "reference error (max |y - ref| / max |ref|):");
    for (d, n, k, e) in &rep.errors {
        let _ = writeln!(table, "  {d} {n}x{k}: {e:.2e}");
    }
    let _ = writeln!(
        table,
        "bitwise across M and geometries: {}",
        if rep.mismatches.is_empty() {
            "ALL EQUAL".to_string()
        } else {
            format!("{} MISMATCHES", rep.mismatches.len())
        }
    );
    Ok((rep, table))
}

fn geometries(p: &Profile, a: &KernelArgs, w: &PMat) -> Vec<Launch> {
    let mut v: Vec<Launch> = p.all_launches();
    v.extend(a.launches.iter().copied());
    v.dedup();
    v.into_iter()
        .filter(|l| !l.split_k || 32 * l.rpb * w.nseg <= l.max_threads())
        .filter(|l| l.fits(w.dtype, p.smem_max))
        .collect()
}

fn check_case(c: &Case, a: &KernelArgs, mmax: usize, rep: &mut Report) -> Result<()> {
    let w = &c.copies[0];
    let base = c.outputs(mmax, c.profile.launch(mmax, c.dtype, c.n))?;
    // Reference: sampled rows n, the first 4 tokens, f64.
    let mut worst = 0f64;
    let mut scale = 0f64;
    for m in 0..mmax.min(4) {
        let x = &c.x[m * c.k..(m + 1) * c.k];
        for (r, wrow) in &c.sample {
            let refv: f64 = wrow.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
            let got = base[m * c.n + r] as f64;
            if !got.is_finite() {
                worst = f64::INFINITY;
            }
            worst = worst.max((got - refv).abs());
            scale = scale.max(refv.abs());
        }
    }
    rep.errors.push((
        c.dtype.name().into(),
        c.n,
        c.k,
        if scale > 0.0 { worst / scale } else { worst },
    ));
    for &m in &a.ms {
        for l in geometries(c.profile, a, w) {
            let y = c.outputs(m, l)?;
            let same = y
                .iter()
                .zip(&base[..m * c.n])
                .all(|(p, q)| p.to_bits() == q.to_bits());
            if !same {
                let first = y
                    .iter()
                    .zip(&base)
                    .position(|(p, q)| p.to_bits() != q.to_bits())
                    .unwrap_or(0);
                rep.mismatches.push(format!(
                    "{} {}x{} M={m} {}: first differing element {first} ({} vs {} at M={mmax})",
                    c.dtype,
                    c.n,
                    c.k,
                    l.name(),
                    y[first],
                    base[first]
                ));
            }
        }
    }
    Ok(())
}

fn time_case(c: &Case, a: &KernelArgs, rep: &mut Report, table: &mut String) -> Result<()> {
    let w0 = &c.copies[0];
    let y = c
        .gpu
        .zeros::<f32>(a.ms.iter().copied().max().unwrap_or(1) * c.n)?;
    let yp = c.gpu.ptr(&y);
    let wbytes = w0.data.len() as f64;
    for &m in &a.ms {
        let mut geos = vec![c.profile.launch(m, c.dtype, c.n)];
        for l in geometries(c.profile, a, w0) {
            if !geos.contains(&l) && (!l.split_k || m <= 32 * l.nt as usize) {
                geos.push(l);
            }
        }
        for l in geos {
            for w in c.copies.iter().take(2) {
                c.run(w, m, l, yp)?;
            }
            let mut t = Vec::with_capacity(a.reps);
            for i in 0..a.reps {
                let w = &c.copies[i % c.copies.len()];
                t.push(c.gpu.time_ms(|| c.run(w, m, l, yp))? as f64 * 1e3);
            }
            let med = median(&mut t);
            let row = Row {
                dtype: c.dtype.name().into(),
                n: c.n,
                k: c.k,
                m,
                launch: l.name(),
                nseg: w0.nseg,
                us_median: med,
                us_min: t[0],
                gb_s: wbytes / (med * 1e-6) / 1e9,
                tflop_s: 2.0 * (m * c.n * c.k) as f64 / (med * 1e-6) / 1e12,
            };
            let _ = writeln!(
                table,
                "{:<5} {:>6} {:>6} {:>4} {:>8} {:>4} {:>9.1} {:>8.0} {:>7.1}",
                row.dtype,
                row.n,
                row.k,
                row.m,
                row.launch,
                row.nseg,
                row.us_median,
                row.gb_s,
                row.tflop_s
            );
            rep.rows.push(row);
        }
    }
    Ok(())
}
