//! kemu: the CUDA vision tower on the CPU. First each kernel of kernels/cu/vision.cu alone
//! against double precision (src/check_kernels.h), then the real host code
//! (`memra_engine::backend::cuda::vision::CudaTower`) launching the real kernels through the
//! emulator ([`Emu`], a `TowerDevice` whose buffers are host memory), against the CPU
//! reference tower: within 1e-5 of the largest value and the same bits on a second run.
//! The Qwen ViT's host code (`CudaQwenTower` in backend/cuda/vision_qwen.rs) the same way
//! against vision/qwenvit.rs `forward`: the three tiny families, square and not, f32 and f16
//! weights, windows of more than one query tile, and wider heads (80, 72).
//! `--wide`: also towers at Gemma 3's, Qwen2.5-VL-7B's and Qwen3-VL-8B's real widths (2 blocks
//! each, f16 weights: some minutes).

use std::ffi::{CString, c_char};

use memra_engine::Result;
use memra_engine::backend::cuda::Arg;
use memra_engine::backend::cuda::vision::{CudaTower, TowerDevice};
use memra_engine::backend::cuda::vision_qwen::CudaQwenTower;
use memra_engine::vision::qwenvit::{self, VitAct};
use memra_engine::vision::random::{random_qwen, random_tower};
use memra_engine::vision::{
    QwenKind, QwenParams, QwenWeights, TowerParams, TowerWeights, VisionTower,
};

unsafe extern "C" {
    fn kemu_run(name: *const c_char, gx: u32, gy: u32, block: u32, a: *const u64, n: u32) -> i32;
    fn kemu_check_kernels() -> i32;
    fn kemu_check_delta() -> i32;
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

/// Every value of `w` rounded to f16 (its matrices then go up as f16).
fn f16_qwen(w: &mut QwenWeights) {
    let r = |v: &mut Vec<f32>| {
        v.iter_mut()
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32())
    };
    r(&mut w.patch_w);
    r(&mut w.patch_b);
    r(&mut w.pos);
    for l in &mut w.layers {
        for v in [
            &mut l.norm1_w,
            &mut l.norm1_b,
            &mut l.q_w,
            &mut l.q_b,
            &mut l.k_w,
            &mut l.k_b,
            &mut l.v_w,
            &mut l.v_b,
            &mut l.o_w,
            &mut l.o_b,
            &mut l.norm2_w,
            &mut l.norm2_b,
            &mut l.up_w,
            &mut l.up_b,
            &mut l.gate_w,
            &mut l.gate_b,
            &mut l.down_w,
            &mut l.down_b,
        ] {
            r(v);
        }
    }
    for m in std::iter::once(&mut w.merger).chain(&mut w.deepstack) {
        for v in [
            &mut m.norm_w,
            &mut m.norm_b,
            &mut m.fc1_w,
            &mut m.fc1_b,
            &mut m.fc2_w,
            &mut m.fc2_b,
        ] {
            r(v);
        }
    }
}

/// The Qwen ViT of shape `p` on two images of each size of `sizes` (`(w, h)`); the number of
/// failures.
fn qwen_case(what: &str, p: &QwenParams, f16: bool, sizes: &[(usize, usize)]) -> usize {
    let mut w = random_qwen(p, 5).expect("random tower");
    if f16 {
        f16_qwen(&mut w);
    }
    let t = CudaQwenTower::new(Emu, p, &w).expect("upload");
    let mut fails = 0;
    for &(iw, ih) in sizes {
        let frames: Vec<Vec<f32>> = (0..2u32)
            .map(|img| {
                (0..3 * iw * ih)
                    .map(|i| {
                        let h = (i as u32)
                            .wrapping_mul(2_654_435_761)
                            .wrapping_add(img * 7919);
                        (h >> 16) as f32 / 32768.0 - 1.0
                    })
                    .collect()
            })
            .collect();
        // A video's frame group: the two frames through the two temporal kernels.
        let pair = [&frames[0][..], &frames[1][..]];
        let got = t.forward_pair(iw, ih, pair).expect("forward_pair");
        let again = t.forward_pair(iw, ih, pair).expect("forward_pair");
        let want = qwenvit::forward_pair(p, &w, iw, ih, pair);
        let same = got
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let e = rel(&got, &want);
        let ok = same && e <= 1e-5;
        fails += usize::from(!ok);
        println!(
            "{:<5} qwen {what} {iw}x{ih} frame pair: vs the CPU tower {e:.3e}, second run {}",
            if ok { "ok" } else { "FAIL" },
            if same { "bit-identical" } else { "DIFFERENT" }
        );
        for (img, px) in frames.iter().enumerate() {
            let got = t.forward(iw, ih, px).expect("forward");
            let again = t.forward(iw, ih, px).expect("forward");
            let want = qwenvit::forward(p, &w, iw, ih, px);
            let same = got
                .iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let e = rel(&got, &want);
            let ok = same && e <= 1e-5;
            fails += usize::from(!ok);
            println!(
                "{:<5} qwen {what} {iw}x{ih} image {img}: {} x {} vs the CPU tower {e:.3e}, \
                 second run {}",
                if ok { "ok" } else { "FAIL" },
                p.tokens(iw, ih),
                p.out_width(),
                if same { "bit-identical" } else { "DIFFERENT" }
            );
        }
    }
    fails
}

fn qwen_cases() -> usize {
    let mut fails = 0;
    let tiny = |k| QwenParams::tiny(k, 40);
    for (name, kind) in [
        ("tiny qwen2vl (d8)", QwenKind::Qwen2Vl),
        ("tiny qwen25vl (d8, windows)", QwenKind::Qwen25Vl),
        ("tiny qwen3vl (d8, positions, deepstack)", QwenKind::Qwen3Vl),
    ] {
        let sizes = [(48, 48), (32, 56)];
        fails += qwen_case(&format!("{name} f32"), &tiny(kind), false, &sizes);
        fails += qwen_case(&format!("{name} f16"), &tiny(kind), true, &sizes[..1]);
    }
    // Windows of 6 x 6 merged tokens: 144 rows, two query tiles over one window's keys.
    let big_windows = QwenParams {
        window: 48,
        ..tiny(QwenKind::Qwen25Vl)
    };
    fails += qwen_case(
        "qwen25vl windows of 144 rows",
        &big_windows,
        false,
        &[(56, 64)],
    );
    // Qwen2.5-VL-7B's head size (80) and patch (14): 112 x 196 pixels, 8 x 14 patches, windows
    // of 2 x 2 merged tokens (the last column narrower).
    let d80 = QwenParams {
        patch_size: 14,
        hidden: 160,
        ffn: 216,
        heads: 2,
        text_hidden: 48,
        window: 56,
        image_size: 112,
        min_pixels: 28 * 28,
        max_pixels: 64 * 28 * 28,
        ..tiny(QwenKind::Qwen25Vl)
    };
    fails += qwen_case("qwen25vl d80", &d80, false, &[(196, 112)]);
    fails += qwen_case("qwen25vl d80 f16", &d80, true, &[(112, 84)]);
    let d80_full = QwenParams {
        kind: QwenKind::Qwen2Vl,
        act: VitAct::QuickGelu,
        wa_pattern: 0,
        ..d80.clone()
    };
    fails += qwen_case("qwen2vl d80", &d80_full, false, &[(84, 140)]);
    // Qwen3-VL-8B's head size (72).
    let d72 = QwenParams {
        hidden: 144,
        ffn: 200,
        heads: 2,
        patch_size: 8,
        text_hidden: 36,
        deepstack: vec![0, 2],
        image_size: 48,
        max_pixels: 96 * 96,
        ..tiny(QwenKind::Qwen3Vl)
    };
    fails += qwen_case("qwen3vl d72", &d72, false, &[(80, 48)]);
    fails
}

fn main() {
    if std::env::args().any(|a| a == "--delta") {
        // SAFETY: no arguments; it runs the emulated kernels on buffers it owns.
        let fails = unsafe { kemu_check_delta() } as usize;
        finish(fails);
    }
    // SAFETY: as above.
    let mut fails = unsafe { kemu_check_kernels() } as usize;
    // SAFETY: as above.
    fails += unsafe { kemu_check_delta() } as usize;
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
    fails += qwen_cases();
    if std::env::args().any(|a| a == "--wide") {
        let wide = TowerParams {
            image_size: 224,
            layers: 2,
            ..TowerParams::gemma3(256)
        };
        fails += tower_case("Gemma 3 widths, 256 patches, 2 blocks, f16", wide, true);
        // Qwen2.5-VL-7B's widths (1280 / 3420, 16 heads of 80), a windowed and a full block:
        // 224 x 168 pixels, 192 patches, windows of 4 x 4 merged tokens cut at the edge.
        let q25 = QwenParams {
            layers: 2,
            wa_pattern: 2,
            ..QwenParams::qwen25vl_7b(1024)
        };
        fails += qwen_case(
            "Qwen2.5-VL-7B widths, 2 blocks, f16",
            &q25,
            true,
            &[(224, 168)],
        );
        // Qwen3-VL-8B's widths (1152 / 4304, 16 heads of 72), the 48 x 48 positions, a
        // deepstack merger: 256 x 192 pixels, 192 patches.
        let q3 = QwenParams {
            layers: 2,
            deepstack: vec![0],
            ..QwenParams::qwen3vl_8b(1024)
        };
        fails += qwen_case(
            "Qwen3-VL-8B widths, 2 blocks, f16",
            &q3,
            true,
            &[(256, 192)],
        );
    }
    finish(fails);
}

fn finish(fails: usize) -> ! {
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
