//! The M-RoPE text models (qwen2vl: Qwen2-VL / Qwen2.5-VL; qwen3vl: Qwen3-VL with deepstack;
//! tiny random) on the CPU: the positions against a port of HF transformers' `get_rope_index`
//! (its chunk-by-chunk structure, not memra's), text-only prompts give plain RoPE's bits, an
//! image moves the text after it; through the engine with a tiny Qwen ViT: the same request
//! under every step budget, beside text load, after a prefix-cache hit past or inside an
//! image and with speculation gives the same tokens and logprob bits; a span without a grid,
//! and GGUF files with missing or bad `rope.dimension_sections`, are refused naming what.

use crate::common;
use crate::common::image;
use crate::common::run_request as run;

use std::sync::Arc;

use memra_engine::backend::Backend;
use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{RowEmbed, StepBatch};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::engine::{EngineConfig, EngineHandle};
use memra_engine::formats::gguf::{Gguf, MetaValue};
use memra_engine::models::random::{random_weights, tiny_config, unit};
use memra_engine::quant::DType;
use memra_engine::request::ValidRequest;
use memra_engine::spec::{DrafterKind, SpecConfig};
use memra_engine::testing::tiny_gguf::{gguf_meta, write_model};
use memra_engine::vision::random::tiny_qwen;
use memra_engine::vision::{MediaSpan, QwenKind, VisionTower, mrope};

const HIDDEN: usize = 64;

/// An image of a prompt: `(start, rows, cols)`.
type Image = (usize, usize, usize);

/// HF's `get_rope_index` for one sequence of `n` tokens whose images start at `start` with
/// `(rows, cols)` merged tokens (one frame each): chunk by chunk, each chunk's positions offset
/// by one past the previous chunk's largest; and the decode delta (`max + 1 - n`).
fn hf_rope_index(n: usize, images: &[Image]) -> (Vec<[i64; 3]>, i64) {
    let mut chunks: Vec<Vec<[i64; 3]>> = Vec::new();
    let top = |c: &Vec<Vec<[i64; 3]>>| {
        c.last()
            .map_or(0, |l| l.iter().flatten().max().map_or(0, |m| m + 1))
    };
    let mut st = 0;
    for &(ed, h, w) in images {
        let text_len = (ed - st) as i64;
        let st_idx = top(&chunks);
        chunks.push((0..text_len).map(|i| [st_idx + i; 3]).collect());
        let mut img = Vec::new();
        for hh in 0..h as i64 {
            for ww in 0..w as i64 {
                img.push([0, hh, ww].map(|v| v + text_len + st_idx));
            }
        }
        chunks.push(img);
        st = ed + h * w;
    }
    if st < n {
        let st_idx = top(&chunks);
        chunks.push((0..(n - st) as i64).map(|i| [st_idx + i; 3]).collect());
    }
    let all: Vec<[i64; 3]> = chunks.into_iter().flatten().collect();
    let max = all.iter().flatten().max().copied().unwrap_or(-1);
    (all, max + 1 - n as i64)
}

fn span(start: usize, rows: usize, cols: usize) -> MediaSpan {
    MediaSpan {
        start,
        embeds: vec![0f32; rows * cols].into(),
        width: 1,
        hash: start as u128,
        grid: Some((rows, cols)),
        times: Vec::new(),
    }
}

#[test]
fn positions_follow_hf_get_rope_index() {
    // (prompt length, images (start, rows, cols)): text around images, an image first, images
    // back to back, tall, wide and one-token images, an image last.
    let cases: [(usize, &[Image]); 6] = [
        (12, &[(3, 2, 3)]),
        (9, &[(0, 3, 2)]),
        (30, &[(2, 4, 1), (6, 1, 5), (13, 2, 2), (20, 1, 1)]),
        (20, &[(4, 4, 4)]),
        (25, &[(1, 2, 6), (15, 3, 3)]),
        (7, &[(1, 1, 1), (3, 2, 2)]),
    ];
    for (n, images) in cases {
        let media: Vec<MediaSpan> = images.iter().map(|&(s, r, c)| span(s, r, c)).collect();
        let (want, delta) = hf_rope_index(n, images);
        let got = mrope::positions(&media, 0, n);
        let got: Vec<[i64; 3]> = got.iter().map(|t| t.map(i64::from)).collect();
        assert_eq!(got, want, "{images:?}");
        // Decode: HF's position + delta; any window of the positions is the same.
        for k in 0..4 {
            let p = (n + k) as i64 + delta;
            assert_eq!(mrope::position(&media, n + k), [p as u32; 3], "{images:?}");
        }
        for s in [1, n / 2, n - 1] {
            assert_eq!(
                mrope::positions(&media, s, n - s),
                mrope::positions(&media, 0, n)[s..]
            );
        }
    }
}

fn cpu(arch: Arch) -> CpuBackend {
    let mut cfg = tiny_config(arch, 300);
    if let Some(v) = cfg.vl.as_mut() {
        v.deepstack = 0;
    }
    let w = random_weights(&cfg, 5, DType::F32).unwrap();
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 16,
        block_size: 4,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).unwrap()
}

/// The logits bits of a prompt of `n` tokens in one step, an image's rows at `img` (injected,
/// `(start, rows, cols)`) with the step's M-RoPE positions when `mrope`.
fn logits(b: &mut CpuBackend, n: usize, img: Option<Image>, mrope: bool) -> Vec<Vec<u32>> {
    let toks: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % 300).collect();
    let table: Vec<u32> = (0..16).collect();
    let mut batch: StepBatch = common::seq_step(&toks, 0..n, &table, Vec::new());
    if let Some((s, r, c)) = img {
        let values: Arc<[f32]> = (0..r * c * HIDDEN).map(|i| unit(3, 1, i as u64)).collect();
        for i in 0..r * c {
            batch.embeds.push(RowEmbed {
                row: s + i,
                values: values.clone(),
                index: i,
                width: HIDDEN,
                span: s as u32..(s + r * c) as u32,
            });
        }
        if mrope {
            batch.mrope = mrope::positions(&[span(s, r, c)], 0, n);
        }
    }
    common::logit_bits(&b.step(&batch).unwrap().logits)
}

/// Text-only, an M-RoPE model is its plain twin (the same weights: the same tensor list) bit for
/// bit; with an image placed by M-RoPE, the image's rows and the text after it differ, the text
/// before does not; positions that are all equal are plain RoPE's.
#[test]
fn text_only_is_plain_rope_and_an_image_moves_what_follows() {
    for (vl, plain) in [(Arch::Qwen2Vl, Arch::Qwen2), (Arch::Qwen3Vl, Arch::Qwen3)] {
        let (mut a, mut b) = (cpu(vl), cpu(plain));
        assert_eq!(
            logits(&mut a, 20, None, false),
            logits(&mut b, 20, None, false)
        );
        let img = Some((3, 2, 3));
        let (mut a, mut b) = (cpu(vl), cpu(plain));
        let (m, p) = (logits(&mut a, 20, img, true), logits(&mut b, 20, img, true));
        assert_eq!(m[..4], p[..4], "{vl:?}: the text and the image's first row");
        for i in 4..20 {
            assert_ne!(m[i], p[i], "{vl:?}: row {i}");
        }
        // The same rows without the step's M-RoPE positions: consecutive positions, the
        // plain model's bits.
        let mut a = cpu(vl);
        assert_eq!(logits(&mut a, 20, img, false), p, "{vl:?}");
    }
}

fn start(arch: Arch, budget: usize, spec: Option<SpecConfig>) -> EngineHandle {
    let cfg = EngineConfig {
        spec,
        ..common::cpu_engine_config(128, budget)
    };
    common::start_tiny(arch, cfg)
}

fn request(prompt: Vec<u32>, media: Vec<MediaSpan>, speculative: bool) -> ValidRequest {
    common::media_request(prompt, media, 12, speculative)
}

/// A prompt of `pad` + 3 text tokens, a wide image, text, a tall image, text: its ids and
/// image spans.
fn prompt(tower: &VisionTower, seed: u32, pad: usize) -> (Vec<u32>, Vec<MediaSpan>) {
    let mut ids: Vec<u32> = (0..pad as u32).map(|j| 50 + j).collect();
    ids.extend([11, 12, 13]);
    let mut media = Vec::new();
    for (k, (w, h)) in [(32, 16), (24, 40)].into_iter().enumerate() {
        let (w, h) = tower.input_size(w, h).unwrap();
        let img = image(w, h, seed + k as u32);
        media.push(MediaSpan {
            start: ids.len(),
            embeds: Arc::from(tower.encode_image(w, h, &img).unwrap()),
            width: tower.out_width(),
            hash: tower.hash_image(w, h, &img),
            grid: Some(tower.grid_for(w, h)),
            times: Vec::new(),
        });
        ids.extend(std::iter::repeat_n(0, tower.tokens_for(w, h)));
        ids.extend((0..5 - k as u32).map(|j| 30 + 7 * j + k as u32));
    }
    (ids, media)
}

/// The same image request under every step budget (prefill chunks cut at the images), beside
/// text load, again after it (a prefix-cache hit past both images: the positions after a hit
/// recomputed from the request's images), a hit ending inside the second image, and with
/// n-gram speculation: the same tokens and logprob bits.
#[test]
fn served_images_are_exact_whatever_the_steps() {
    for (arch, kind) in [
        (Arch::Qwen2Vl, QwenKind::Qwen25Vl),
        (Arch::Qwen3Vl, QwenKind::Qwen3Vl),
    ] {
        let tower = tiny_qwen(kind, HIDDEN, 2).unwrap();
        assert_eq!(
            tower.out_width(),
            common::tiny_model(arch).config.embed_width()
        );
        let (ids, media) = prompt(&tower, 1, 0);
        let big = media.iter().map(|m| m.rows()).max().unwrap();
        let first = start(arch, 128, None);
        let want = run(&first, request(ids.clone(), media.clone(), false));
        // The rows' M-RoPE positions matter: without the grids (one row each) other bits.
        let flat: Vec<MediaSpan> = media
            .iter()
            .cloned()
            .map(|m| MediaSpan {
                grid: Some((1, m.rows())),
                times: Vec::new(),
                ..m
            })
            .collect();
        let other = run(
            &start(arch, 128, None),
            request(ids.clone(), flat.clone(), false),
        );
        assert_ne!(other.0, want.0, "{arch:?}: the grid reaches the positions");
        // The same rows and hashes on another grid are other KV: no prefix-cache hit past
        // the first image's start.
        let regrid = run(&first, request(ids.clone(), flat, false));
        assert_eq!(regrid.0, other.0, "{arch:?}: another grid, a miss's bits");
        assert!(regrid.1 <= media[0].start, "{arch:?}: {} cached", regrid.1);
        for budget in [big, big + 1, big + 7, 64] {
            let e = start(arch, budget, None);
            let got = run(&e, request(ids.clone(), media.clone(), false));
            assert_eq!(got.0, want.0, "{arch:?}: budget {budget}");
            // The same request again: a prefix-cache hit past both images.
            let again = run(&e, request(ids.clone(), media.clone(), false));
            assert_eq!(again.0, want.0, "{arch:?}: budget {budget}, a hit");
            assert!(
                again.1 >= media[1].range().end,
                "{arch:?}: {} cached",
                again.1
            );
        }
        // Beside text load in a small budget.
        let busy = start(arch, big + 4, None);
        let streams: Vec<_> = (0..3)
            .map(|i| {
                let text: Vec<u32> = (0..9 + i).map(|j| 40 + 7 * j as u32).collect();
                busy.submit(request(text, Vec::new(), false)).unwrap()
            })
            .collect();
        assert_eq!(
            run(&busy, request(ids.clone(), media.clone(), false)).0,
            want.0
        );
        drop(streams);
        // A hit ending inside the second image: text put first so that a KV block (4
        // positions) ends two positions before the image's end; the first request shares the
        // prompt up to one token past the image, so the second's hit ends inside the image.
        let end = media[1].range().end;
        let pad = (4 + 2 - end % 4) % 4;
        let (ids_p, media_p) = prompt(&tower, 1, pad);
        let end = media_p[1].range().end;
        assert_eq!((end - 2) % 4, 0);
        let miss = run(
            &start(arch, 64, None),
            request(ids_p.clone(), media_p.clone(), false),
        );
        let e = start(arch, 64, None);
        let mut first = ids_p[..end + 1].to_vec();
        first.push(99);
        run(&e, request(first, media_p.clone(), false));
        let hit = run(&e, request(ids_p.clone(), media_p.clone(), false));
        assert_eq!(hit.1, end - 2, "{arch:?}: cached tokens");
        assert_eq!(hit.0, miss.0, "{arch:?}: a hit inside an image");
        // Speculation (n-gram drafts, checked by the target's rows past the images).
        let spec = SpecConfig {
            row_cost_permille: Some(100),
            ..SpecConfig::new(DrafterKind::Ngram, 4).unwrap()
        };
        let s = start(arch, 64, Some(spec));
        assert_eq!(
            run(&s, request(ids.clone(), media.clone(), true)).0,
            want.0,
            "{arch:?}: spec"
        );
        // A span without a grid is refused.
        let mut bare = media.clone();
        bare[0].grid = None;
        let err = match s.submit(request(ids.clone(), bare, false)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{arch:?}: a span without a grid was taken"),
        };
        assert!(err.contains("grid"), "{err}");
    }
}

/// GGUF files whose `rope.dimension_sections` is missing, not an array, of the wrong length or
/// sum, or with a fourth section are refused naming the key; a good one loads.
#[test]
fn bad_dimension_sections_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Qwen2Vl, Arch::Qwen3Vl] {
        let cfg: ModelConfig = tiny_config(arch, 300);
        let w = random_weights(&cfg, 1, DType::F32).unwrap();
        let key = format!("{}.rope.dimension_sections", arch.gguf_name());
        let ints = |v: &[i32]| MetaValue::Array(v.iter().map(|&x| MetaValue::I32(x)).collect());
        let good = if arch == Arch::Qwen3Vl {
            [4, 2, 2, 0]
        } else {
            [2, 3, 3, 0]
        };
        let cases: [(Option<MetaValue>, &str); 6] = [
            (None, "missing"),
            (Some(MetaValue::U32(8)), "not an array"),
            (Some(ints(&[2, 3])), "three sections"),
            (Some(ints(&[2, 3, 4, 0])), "add up"),
            (Some(ints(&[2, 3, 3, 1])), "fourth section"),
            (Some(ints(&[2, -3, 3, 0])), "not a non-negative integer"),
        ];
        for (value, why) in cases.into_iter().chain([(Some(ints(&good)), "")]) {
            let mut meta: Vec<(String, MetaValue)> = gguf_meta(&cfg)
                .into_iter()
                .filter(|(k, _)| *k != key)
                .collect();
            if let Some(v) = value {
                meta.push((key.clone(), v));
            }
            let path = dir.path().join("m.gguf");
            write_model(&w, &meta, &path).unwrap();
            let g = Gguf::open(&path).unwrap();
            match ModelConfig::from_gguf(&g) {
                Ok(c) if why.is_empty() => assert_eq!(c.vl, cfg.vl),
                Ok(_) => panic!("{arch:?}: {why}: loaded"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(!why.is_empty(), "{arch:?}: the good file: {msg}");
                    assert!(
                        msg.contains(&key) && msg.contains(why),
                        "{arch:?}: {why}: {msg}"
                    );
                }
            }
        }
    }
}
