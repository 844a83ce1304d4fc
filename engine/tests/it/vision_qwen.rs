//! The Qwen ViT (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, tiny random towers) on the CPU: mmproj
//! round trips, shapes and token counts, the smart resize, thread-count independence, what the
//! window attention and the positions change, hostile files refused; and a tiny qwen2 / qwen3
//! text model serving image rows through the engine (injected, exact under load, keyed in the
//! prefix cache). The towers' values against the numpy reference: `memra-verify vision
//! --family ...` (verify/tests/it/vision.rs).

use crate::common;
use crate::common::run_request as run;
use crate::common::{bits, image};

use std::sync::Arc;

use memra_engine::config::Arch;
use memra_engine::engine::EngineHandle;
use memra_engine::formats::gguf::Gguf;
use memra_engine::quant::DType;
use memra_engine::request::ValidRequest;
use memra_engine::vision::random::{random_qwen, tiny_qwen, write_qwen_mmproj};
use memra_engine::vision::{MediaSpan, QwenKind, QwenParams, VisionTower};

const HIDDEN: usize = 64;
const KINDS: [QwenKind; 3] = [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl];

#[test]
fn mmproj_round_trip_shapes_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    for kind in KINDS {
        let p = QwenParams::tiny(kind, HIDDEN);
        let w = random_qwen(&p, 5).unwrap();
        let path = dir.path().join(format!("{kind:?}.gguf"));
        write_qwen_mmproj(&p, &w, DType::F32, &path).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.get_str("clip.projector_type"), Some(kind.projector()));
        let file = VisionTower::open(&path).unwrap();
        assert_eq!(file.qwen_params(), Some(&p), "{kind:?}");
        assert!(file.params().is_none());
        let mem = VisionTower::new_qwen(p.clone(), w);
        // 48 x 48: 12 x 12 patches, 6 x 6 tokens; 64 x 32: 8 x 4 tokens.
        assert_eq!(file.tokens_per_image(), 36);
        assert_eq!(file.tokens_for(64, 32), 32);
        let width = HIDDEN * (1 + p.deepstack.len());
        assert_eq!(file.out_width(), width);
        for (w, h) in [(48, 48), (64, 32), (16, 40)] {
            let img = image(w, h, 1);
            let a = mem.encode_image(w, h, &img).unwrap();
            let b = file.encode_image(w, h, &img).unwrap();
            assert_eq!(a.len(), file.tokens_for(w, h) * width, "{kind:?} {w}x{h}");
            assert!(a.iter().all(|v| v.is_finite()));
            assert_eq!(bits(&a), bits(&b), "{kind:?} {w}x{h}: file == memory");
            assert_eq!(mem.hash_image(w, h, &img), file.hash_image(w, h, &img));
        }
        // The same bytes as another shape are another image.
        let img = image(64, 32, 3);
        assert_ne!(mem.hash_image(64, 32, &img), mem.hash_image(32, 64, &img));
        // F16 weights load too (rounded values, so other bits).
        write_qwen_mmproj(&p, &random_qwen(&p, 5).unwrap(), DType::F16, &path).unwrap();
        let half = VisionTower::open(&path).unwrap();
        let img = image(48, 48, 2);
        let (a, b) = (mem.encode(&img).unwrap(), half.encode(&img).unwrap());
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            err > 0.0 && err < 0.05,
            "{kind:?}: f16 tower differs by {err}"
        );
        // Inputs that are not an input size, or of the wrong length, are errors.
        assert!(mem.encode_image(50, 48, &image(50, 48, 1)).is_err());
        assert!(mem.encode_image(48, 48, &img[..100]).is_err());
        assert!(mem.encode_image(0, 48, &[]).is_err());
    }
}

#[test]
fn smart_resize_follows_the_processor() {
    // Qwen2.5-VL-7B's factor 28, at most 1024 tokens, at least 4.
    let p = QwenParams::qwen25vl_7b(3584);
    let t = |w, h| p.input_size(w, h).unwrap();
    assert_eq!(t(896, 896), (896, 896));
    assert_eq!(t(640, 480), (644, 476));
    // 1920 x 1080 is 2,073,600 pixels: scaled to at most 802,816, rounding down.
    assert_eq!(t(1920, 1080), (1176, 672));
    assert!(t(1920, 1080).0 * t(1920, 1080).1 <= p.max_pixels);
    // Tiny images are scaled up to at least 56 x 56, rounding up.
    assert_eq!(t(20, 20), (56, 56));
    // Half-way sides round to even multiples (Python's round): 42 / 28 = 1.5 -> 2, 70 -> 2.5 -> 2.
    assert_eq!(t(42, 70), (56, 56));
    assert!(p.input_size(10_000, 10).is_err(), "aspect ratio over 200");
    assert!(p.input_size(0, 10).is_err());
    let q = QwenParams::qwen3vl_8b(4096);
    assert_eq!(q.input_size(1000, 700).unwrap(), (992, 704));
    for (w, h) in [(1, 1), (3000, 17), (17, 3000), (4096, 4096), (333, 777)] {
        for p in [&p, &q] {
            let (iw, ih) = p.input_size(w, h).unwrap();
            assert!(iw % p.factor() == 0 && ih % p.factor() == 0, "{w}x{h}");
            assert!(
                iw * ih <= p.max_pixels && iw * ih >= p.min_pixels,
                "{w}x{h}"
            );
            assert_eq!(p.input_size(iw, ih).unwrap(), (iw, ih), "a fixed point");
        }
    }
}

#[test]
fn tower_bits_do_not_depend_on_threads() {
    for kind in KINDS {
        let t = tiny_qwen(kind, HIDDEN, 9).unwrap();
        let img = image(64, 32, 4);
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| t.encode_image(64, 32, &img).unwrap())
        };
        assert_eq!(bits(&run(1)), bits(&run(3)), "{kind:?}");
    }
}

/// Window attention confines a windowed layer to its window: with every layer windowed, the
/// tokens of one window do not change when pixels of another window do; with full attention
/// (the default pattern's last layer) they do.
#[test]
fn windows_confine_attention_and_positions_matter() {
    let mut p = QwenParams::tiny(QwenKind::Qwen25Vl, HIDDEN);
    p.wa_pattern = 1000; // every layer windowed
    let w = random_qwen(&p, 3).unwrap();
    let windowed = VisionTower::new_qwen(p.clone(), w);
    let full = tiny_qwen(QwenKind::Qwen25Vl, HIDDEN, 3).unwrap();
    let (iw, ih) = (48, 48); // 6 x 6 tokens, windows of 2 x 2 tokens
    let a = image(iw, ih, 1);
    let mut b = a.clone();
    // Change pixels of the bottom-right window only (pixel rows and columns 32..48).
    for y in 32..48 {
        for x in 32..48 {
            b[(y * iw + x) * 3] ^= 0x55;
        }
    }
    let row = |v: &[f32], t: usize| v[t * HIDDEN..(t + 1) * HIDDEN].to_vec();
    let (wa, wb) = (windowed.encode(&a).unwrap(), windowed.encode(&b).unwrap());
    // Token 0 (window 0) is unchanged, token 35 (the changed window) is not.
    assert_eq!(bits(&row(&wa, 0)), bits(&row(&wb, 0)));
    assert_ne!(bits(&row(&wa, 35)), bits(&row(&wb, 35)));
    let (fa, fb) = (full.encode(&a).unwrap(), full.encode(&b).unwrap());
    assert_ne!(
        bits(&row(&fa, 0)),
        bits(&row(&fb, 0)),
        "full attention sees it"
    );
    // The 2D rotary positions matter: a uniform image's tokens differ from each other.
    let flat = vec![128u8; iw * ih * 3];
    let e = full.encode(&flat).unwrap();
    assert_ne!(bits(&row(&e, 0)), bits(&row(&e, 7)));
}

/// A change to a tower's shape.
type Edit = fn(&mut QwenParams);

#[test]
fn hostile_qwen_mmproj_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = QwenParams::tiny(QwenKind::Qwen25Vl, HIDDEN);
    let w = random_qwen(&p, 1).unwrap();
    let path = dir.path().join("mm.gguf");
    write_qwen_mmproj(&p, &w, DType::F32, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in [10, 200, bytes.len() / 2, bytes.len() - 3] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert!(VisionTower::open(&path).is_err(), "cut at {cut}");
    }
    // Shapes the forward cannot run, each refused naming the problem.
    let cases: [(&str, Edit); 5] = [
        ("heads do not divide", |p| p.heads = 5),
        ("multiple of 4", |p| (p.hidden, p.heads) = (24, 4)),
        ("deepstack layers", |p| p.deepstack = vec![7]),
        ("image pixels", |p| p.max_pixels = 1),
        ("patch size", |p| p.patch_size = 0),
    ];
    for (want, edit) in cases {
        let mut q = p.clone();
        edit(&mut q);
        let msg = q.check().unwrap_err().to_string();
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // A missing tensor and a misshapen one, in real files.
    let mut q = p.clone();
    q.text_hidden = 32;
    write_qwen_mmproj(&q, &random_qwen(&q, 1).unwrap(), DType::F32, &path).unwrap();
    assert_eq!(VisionTower::open(&path).unwrap().out_width(), 32);
    let tensors = memra_engine::vision::qwen_mmproj::file_tensors(&p, &w);
    let write = |drop: &str, reshape: Option<&str>| {
        let mut data = Vec::new();
        for (n, s, v) in &tensors {
            if n == drop {
                continue;
            }
            let mut dims: Vec<u64> = s.iter().rev().map(|&d| d as u64).collect();
            let mut vals = v.clone();
            if reshape == Some(n.as_str()) {
                dims = vec![dims.iter().product::<u64>() / 2, 2];
                vals.truncate(dims.iter().product::<u64>() as usize);
            }
            data.push((n.clone(), dims, vals));
        }
        let bytes: Vec<Vec<u8>> = data
            .iter()
            .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let td: Vec<_> = data
            .iter()
            .zip(&bytes)
            .map(|((n, d, _), b)| (n.as_str(), DType::F32, d.as_slice(), b.as_slice()))
            .collect();
        memra_engine::formats::gguf_write::write_gguf(&path, &p.gguf_meta(), &td).unwrap();
        VisionTower::open(&path).unwrap_err().to_string()
    };
    let msg = write("v.blk.1.ffn_gate.weight", None);
    assert!(
        msg.contains("missing tensor v.blk.1.ffn_gate.weight"),
        "{msg}"
    );
    let msg = write("", Some("v.blk.0.attn_k.weight"));
    assert!(msg.contains("v.blk.0.attn_k.weight has shape"), "{msg}");
    let msg = write("mm.2.weight", None);
    assert!(msg.contains("mm.2.weight"), "{msg}");
    // An unknown projector names the supported ones.
    let mut meta = p.gguf_meta();
    meta[1].1 = memra_engine::formats::gguf::MetaValue::Str("qwen2.5o".into());
    let td: Vec<(String, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            let dims = s.iter().rev().map(|&d| d as u64).collect();
            (
                n.clone(),
                dims,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let td: Vec<_> = td
        .iter()
        .map(|(n, d, b)| (n.as_str(), DType::F32, d.as_slice(), b.as_slice()))
        .collect();
    memra_engine::formats::gguf_write::write_gguf(&path, &meta, &td).unwrap();
    let msg = VisionTower::open(&path).unwrap_err().to_string();
    assert!(msg.contains("qwen2.5vl_merger"), "{msg}");
}

fn start(arch: Arch, budget: usize) -> EngineHandle {
    common::start_cpu(arch, 96, budget)
}

fn request(prompt: Vec<u32>, media: Vec<MediaSpan>) -> ValidRequest {
    common::media_request(prompt, media, 6, false)
}

/// A qwen2 / qwen3 text model takes the Qwen ViT's rows: they change what it says, the same
/// request alone and beside text load gives the same bits, the same image again is a
/// prefix-cache hit past the image, another image is not.
#[test]
fn qwen_text_models_serve_image_rows() {
    for (arch, kind) in [
        (Arch::Qwen2, QwenKind::Qwen25Vl),
        (Arch::Qwen3, QwenKind::Qwen2Vl),
    ] {
        let tower = tiny_qwen(kind, HIDDEN, 2).unwrap();
        let (w, h) = (64, 32);
        let rows = tower.tokens_for(w, h);
        let span = |seed: u32, start: usize| {
            let img = image(w, h, seed);
            MediaSpan {
                start,
                embeds: Arc::from(tower.encode_image(w, h, &img).unwrap()),
                width: HIDDEN,
                hash: tower.hash_image(w, h, &img),
                grid: Some(tower.grid_for(w, h)),
                times: Vec::new(),
            }
        };
        let mut prompt: Vec<u32> = vec![11, 12, 13];
        prompt.extend(std::iter::repeat_n(0, rows));
        prompt.extend([21, 22, 23, 24, 25]);
        let e = start(arch, 64);
        let with = run(&e, request(prompt.clone(), vec![span(1, 3)]));
        let without = run(&start(arch, 64), request(prompt.clone(), Vec::new()));
        assert_ne!(with.0, without.0, "{arch:?}: the rows reach the model");
        // The same image again: a hit past the image, the same bits.
        let again = run(&e, request(prompt.clone(), vec![span(1, 3)]));
        assert_eq!(again.0, with.0);
        assert!(again.1 > 3 + rows, "{arch:?}: {} cached", again.1);
        // Another image with the same tokens: no hit past the image's first block.
        let other = run(&e, request(prompt.clone(), vec![span(2, 3)]));
        assert!(other.1 <= 3, "{arch:?}: {} cached", other.1);
        // Beside text load, in a small step budget: the same bits.
        let busy = start(arch, rows + 4);
        let streams: Vec<_> = (0..3)
            .map(|i| {
                let text: Vec<u32> = (0..9 + i).map(|j| 40 + 7 * j as u32).collect();
                busy.submit(request(text, Vec::new())).unwrap()
            })
            .collect();
        assert_eq!(
            run(&busy, request(prompt.clone(), vec![span(1, 3)])).0,
            with.0
        );
        drop(streams);
    }
    // A llama model still refuses image rows.
    let e = start(Arch::Llama, 64);
    let tower = tiny_qwen(QwenKind::Qwen25Vl, HIDDEN, 2).unwrap();
    let img = image(48, 48, 1);
    let span = MediaSpan {
        start: 1,
        embeds: Arc::from(tower.encode(&img).unwrap()),
        width: HIDDEN,
        hash: tower.hash(&img),
        grid: None,
        times: Vec::new(),
    };
    let mut prompt = vec![5u32];
    prompt.extend(std::iter::repeat_n(0, 36));
    assert!(e.submit(request(prompt, vec![span])).is_err());
}
