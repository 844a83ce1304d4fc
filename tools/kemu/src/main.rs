//! kemu: the CUDA vision tower on the CPU. First each kernel of kernels/cu/vision.cu alone
//! against double precision (src/check_kernels.h), then the real host code
//! (`memra_engine::backend::cuda::vision::CudaTower`) launching the real kernels through the
//! emulator ([`Emu`], a `TowerDevice` whose buffers are host memory), against the CPU
//! reference tower: within 1e-5 of the largest value and the same bits on a second run.
//! `--wide`: also a tower at Gemma 3's real widths (1152 / 4304, 16 heads of 72; 256 patches,
//! 2 blocks: a few minutes).

use std::ffi::{CString, c_char};

use memra_engine::Result;
use memra_engine::backend::cuda::Arg;
use memra_engine::backend::cuda::vision::{CudaTower, TowerDevice};
use memra_engine::vision::random::random_tower;
use memra_engine::vision::{TowerParams, TowerWeights, VisionTower};

unsafe extern "C" {
    fn kemu_run(name: *const c_char, gx: u32, gy: u32, block: u32, a: *const u64, n: u32) -> i32;
    fn kemu_check_kernels() -> i32;
}

/// Host memory as device memory; a launch runs the emulated kernel.
struct Emu;

impl TowerDevice for Emu {
    type F32 = Vec<f32>;
    type U16 = Vec<u16>;
    fn upload_f32(&self, v: &[f32]) -> Result<Vec<f32>> {
        Ok(v.to_vec())
    }
    fn upload_u16(&self, v: &[u16]) -> Result<Vec<u16>> {
        Ok(v.to_vec())
    }
    fn alloc_f32(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![f32::NAN; n.max(1)])
    }
    fn addr_f32(&self, b: &Vec<f32>) -> u64 {
        b.as_ptr() as u64
    }
    fn addr_u16(&self, b: &Vec<u16>) -> u64 {
        b.as_ptr() as u64
    }
    fn write_f32(&self, b: &mut Vec<f32>, v: &[f32]) -> Result<()> {
        b[..v.len()].copy_from_slice(v);
        Ok(())
    }
    fn read_f32(&self, b: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(b.clone())
    }
    fn launch(&self, name: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        let cells: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(v) | Arg::U64(v) => v,
                Arg::U32(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let c = CString::new(name).expect("kernel name");
        let (gx, gy, n) = (grid.0.max(1), grid.1.max(1), cells.len() as u32);
        // SAFETY: the cells are the kernel's arguments; every pointer among them is a live
        // host buffer of the tower (the forward's own checks sized them).
        let rc = unsafe { kemu_run(c.as_ptr(), gx, gy, block, cells.as_ptr(), n) };
        assert_eq!(rc, 0, "kemu has no kernel {name} of {n} arguments");
        Ok(())
    }
    fn label(&self) -> String {
        "kemu".into()
    }
}

fn rel(a: &[f32], r: &[f32]) -> f32 {
    let max = r.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = a.iter().zip(r).fold(0f32, |m, (x, y)| {
        let e = (x - y).abs();
        if e.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(e)
        }
    });
    if a.len() == r.len() {
        d / max
    } else {
        f32::INFINITY
    }
}

fn f16_values(p: &TowerParams, w: &TowerWeights) -> TowerWeights {
    let t = w
        .tensors()
        .iter()
        .map(|t| t.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect())
        .collect();
    TowerWeights::from_tensors(p, t)
}

/// The tower of shape `p` (f16 values: its matrices go up as f16) on two images; the number of
/// failures.
fn tower_case(what: &str, p: TowerParams, f16: bool) -> usize {
    let weights = || {
        let w = random_tower(&p, 11);
        if f16 { f16_values(&p, &w) } else { w }
    };
    let t = CudaTower::new(Emu, &p, &weights()).expect("upload");
    let cpu = VisionTower::new(p, weights());
    let s = p.image_size;
    let mut fails = 0;
    for img in 0..2u32 {
        let px: Vec<f32> = (0..3 * s * s)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(img * 7919);
                (h >> 16) as f32 / 32768.0 - 1.0
            })
            .collect();
        let got = t.forward(&px).expect("forward");
        let again = t.forward(&px).expect("forward");
        let want = cpu.encode_pixels(&px).expect("cpu tower");
        let same = got
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let e = rel(&got, &want);
        let ok = same && e <= 1e-5;
        fails += usize::from(!ok);
        println!(
            "{:<5} tower {what} image {img}: {} x {} vs the CPU tower {e:.3e}, second run {}",
            if ok { "ok" } else { "FAIL" },
            p.tokens_per_image(),
            p.text_hidden,
            if same { "bit-identical" } else { "DIFFERENT" }
        );
    }
    fails
}

fn main() {
    // SAFETY: no arguments; it runs the emulated kernels on buffers it owns.
    let mut fails = unsafe { kemu_check_kernels() } as usize;
    let small = TowerParams {
        image_size: 112,
        patch_size: 14,
        hidden: 144,
        ffn: 200,
        layers: 2,
        heads: 2,
        pool: 2,
        text_hidden: 48,
        ..TowerParams::tiny(48)
    };
    // 144 patches: two query tiles of 128.
    let two_tiles = TowerParams {
        image_size: 168,
        hidden: 80,
        ffn: 130,
        layers: 1,
        heads: 5,
        pool: 3,
        text_hidden: 33,
        ..small
    };
    fails += tower_case("tiny (d8) f32", TowerParams::tiny(64), false);
    fails += tower_case("tiny (d8) f16", TowerParams::tiny(64), true);
    fails += tower_case("d72 f32", small, false);
    fails += tower_case("d72 f16", small, true);
    fails += tower_case("d16, 144 patches", two_tiles, false);
    if std::env::args().any(|a| a == "--wide") {
        let wide = TowerParams {
            image_size: 224,
            layers: 2,
            ..TowerParams::gemma3(256)
        };
        fails += tower_case("Gemma 3 widths, 256 patches, 2 blocks, f16", wide, true);
    }
    println!(
        "kemu: {}",
        if fails == 0 {
            "ALL OK".to_string()
        } else {
            format!("{fails} FAILED")
        }
    );
    std::process::exit(i32::from(fails > 0));
}
