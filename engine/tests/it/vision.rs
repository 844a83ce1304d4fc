//! Image input on the CPU: the Gemma 3 tower (a tiny random one) written as an mmproj GGUF and
//! read back, its independence of the thread count, hostile mmproj files refused; and the
//! engine with a tiny gemma3 whose prompts carry image rows: the rows are really injected, an
//! image request is exact beside text load (and text rows beside it), the same image again is
//! a prefix-cache hit, another image with the same tokens is not.

use crate::common;

use std::sync::Arc;

use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineHandle};
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::Model;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, EventStream, SubmitError, Usage, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;
use memra_engine::vision::random::{random_tower, tiny_tower, write_mmproj};
use memra_engine::vision::{MediaSpan, TowerParams, VisionTower};

const VOCAB: usize = 49152;
const HIDDEN: usize = 64;

/// A 64x64 RGB test pattern that depends on `seed`.
pub fn pattern(seed: u32) -> Vec<u8> {
    common::image(64, 64, seed)
}

#[test]
fn mmproj_file_round_trip_and_shape() {
    let p = TowerParams::tiny(HIDDEN);
    let w = random_tower(&p, 5);
    let mem = VisionTower::new(p, random_tower(&p, 5));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj.gguf");
    write_mmproj(&p, &w, DType::F32, &path).unwrap();
    let file = VisionTower::open(&path).unwrap();
    assert_eq!(file.params(), Some(&p));
    assert_eq!(file.tokens_per_image(), 16);
    let img = pattern(1);
    let a = mem.encode(&img).unwrap();
    let b = file.encode(&img).unwrap();
    assert_eq!(a.len(), 16 * HIDDEN);
    assert!(a.iter().all(|v| v.is_finite()));
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(mem.hash(&img), file.hash(&img));
    assert_ne!(mem.hash(&img), mem.hash(&pattern(2)));
    // F16 weights load too (rounded values, so other bits).
    write_mmproj(&p, &w, DType::F16, &path).unwrap();
    let half = VisionTower::open(&path).unwrap().encode(&img).unwrap();
    let err = a
        .iter()
        .zip(&half)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(err > 0.0 && err < 0.05, "f16 tower differs by {err}");
    // Wrong input sizes are errors, not panics.
    assert!(mem.encode(&img[..100]).is_err());
}

#[test]
fn a_tower_placed_on_the_cpu_is_the_reference() {
    let mut t = tiny_tower(HIDDEN, 9);
    let img = pattern(3);
    let (before, hash) = (t.encode(&img).unwrap(), t.hash(&img));
    t.place(memra_engine::backend::Device::Cpu).unwrap();
    assert_eq!(t.runs_on(), "cpu");
    assert_eq!(
        t.hash(&img),
        hash,
        "the CPU tower's content hash is unchanged"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&t.encode(&img).unwrap()), bits(&before));
    assert_eq!(bits(&t.encode_cpu(&img).unwrap()), bits(&before));
    // A CUDA device that is not there is an error, and the tower stays on the CPU.
    assert!(t.place(memra_engine::backend::Device::Cuda(999)).is_err());
    assert_eq!(t.runs_on(), "cpu");
    assert_eq!(t.hash(&img), hash);
}

#[test]
fn tower_bits_do_not_depend_on_threads() {
    let t = tiny_tower(HIDDEN, 9);
    let img = pattern(3);
    let run = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
            .install(|| t.encode(&img).unwrap())
    };
    let one: Vec<u32> = run(1).iter().map(|v| v.to_bits()).collect();
    let three: Vec<u32> = run(3).iter().map(|v| v.to_bits()).collect();
    assert_eq!(one, three);
}

#[test]
fn hostile_mmproj_files_are_refused() {
    let p = TowerParams::tiny(HIDDEN);
    let w = random_tower(&p, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_mmproj(&p, &w, DType::F32, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    // Truncated files.
    for cut in [8, bytes.len() / 3, bytes.len() - 5] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert!(VisionTower::open(&path).is_err(), "cut at {cut}");
    }
    // Another projector, a patch size that does not divide the image, a missing tensor.
    let write = |meta: Vec<(String, memra_engine::formats::gguf::MetaValue)>, drop: &str| {
        let shapes = p.tensor_shapes();
        let t = w.tensors();
        let bytes: Vec<Vec<u8>> = t
            .iter()
            .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let dims: Vec<Vec<u64>> = shapes
            .iter()
            .map(|(_, s)| s.iter().rev().map(|&d| d as u64).collect())
            .collect();
        let data: Vec<_> = shapes
            .iter()
            .zip(&dims)
            .zip(&bytes)
            .filter(|(((n, _), _), _)| n != drop)
            .map(|(((n, _), d), b)| (n.as_str(), DType::F32, d.as_slice(), b.as_slice()))
            .collect();
        memra_engine::formats::gguf_write::write_gguf(&path, &meta, &data).unwrap();
        VisionTower::open(&path)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    use memra_engine::formats::gguf::MetaValue;
    let mut meta = p.gguf_meta();
    for (k, v) in meta.iter_mut() {
        if k == "clip.projector_type" {
            *v = MetaValue::Str("mlp".into());
        }
    }
    assert!(write(meta, "").contains("gemma3"));
    let mut meta = p.gguf_meta();
    for (k, v) in meta.iter_mut() {
        if k == "clip.vision.patch_size" {
            *v = MetaValue::U32(7);
        }
    }
    assert!(write(meta, "").contains("patch size"));
    let e = write(p.gguf_meta(), "v.blk.1.attn_k.weight");
    assert!(e.contains("v.blk.1.attn_k.weight"), "{e}");
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&Gguf::open(&common::real_model()).unwrap()).unwrap()
}

fn model(arch: Arch) -> Model {
    let config = tiny_config(arch, VOCAB);
    let weights = random_weights(&config, 21, DType::Q8_0).unwrap();
    Model {
        path: "tiny".into(),
        config,
        weights,
        tokenizer: tokenizer(),
        chat: None,
    }
}

fn start(arch: Arch, budget: usize) -> EngineHandle {
    let cfg = common::cpu_engine_config(96, budget);
    Engine::start(
        vec![("tiny".into(), model(arch), cfg)],
        AdmissionLimits::default(),
    )
    .unwrap()
}

/// `pre` text tokens, 16 image rows (placeholder id 0) at index `pre.len()`, then `post`.
fn image_request(pre: &[u32], img: Option<&[u8]>, post: &[u32], seed: u64) -> ValidRequest {
    let tower = tiny_tower(HIDDEN, 9);
    let mut prompt = pre.to_vec();
    prompt.extend(std::iter::repeat_n(0u32, 16));
    prompt.extend_from_slice(post);
    let media = img
        .map(|img| {
            vec![MediaSpan {
                start: pre.len(),
                embeds: Arc::from(tower.encode(img).unwrap()),
                width: HIDDEN,
                hash: tower.hash(img),
                grid: None,
                times: Vec::new(),
            }]
        })
        .unwrap_or_default();
    request(prompt, media, seed)
}

fn request(prompt: Vec<u32>, media: Vec<MediaSpan>, seed: u64) -> ValidRequest {
    ValidRequest {
        model: "tiny".into(),
        params: SamplingParams {
            temperature: if seed == 0 { 0.0 } else { 0.8 },
            seed,
            ..Default::default()
        },
        logprobs: Some(2),
        speculative: true,
        media,
        ..text_request(prompt, 8)
    }
}

/// Token ids, logprob bits and usage of a finished stream.
fn collect(mut s: EventStream) -> (Vec<(u32, u32)>, Usage) {
    let mut out = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => out.push((t.id, t.logprob.map_or(0, f32::to_bits))),
            Some(Event::Text(_)) => {}
            Some(Event::Done { usage, .. }) => return (out, usage),
            Some(Event::Error(e)) => panic!("request failed: {e}"),
            None => panic!("the stream ended without Done"),
        }
    }
}

const PRE: [u32; 6] = [504, 3458, 282, 253, 1345, 28];
const POST: [u32; 5] = [30, 2210, 314, 1431, 47];

#[test]
fn image_rows_are_exact_under_load_and_keyed_in_the_prefix_cache() {
    let (a, b) = (pattern(1), pattern(2));
    let alone = {
        let e = start(Arch::Gemma3, 64);
        collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap())
    };
    let texts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..9 + 5 * i).map(|j| 40 + 17 * j + i).collect())
        .collect();
    let text_alone: Vec<_> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let e = start(Arch::Gemma3, 64);
            collect(
                e.submit(request(t.clone(), Vec::new(), i as u64 + 1))
                    .unwrap(),
            )
        })
        .collect();
    // An 18-token step budget: the prompts are prefilled in chunks beside each other (a
    // chunk never ends inside the 16-row image: its rows attend to all of it).
    let e = start(Arch::Gemma3, 18);
    let mut streams = vec![e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap()];
    for (i, t) in texts.iter().enumerate() {
        streams.push(
            e.submit(request(t.clone(), Vec::new(), i as u64 + 1))
                .unwrap(),
        );
    }
    let mut got: Vec<_> = streams.into_iter().map(collect).collect();
    let img_loaded = got.remove(0);
    assert_eq!(img_loaded.0, alone.0, "the image request beside text load");
    for (i, (g, t)) in got.iter().zip(&text_alone).enumerate() {
        assert_eq!(g.0, t.0, "text request {i} beside an image request");
    }
    // The same image again: its blocks come from the prefix cache, same bits.
    let again = collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap());
    assert_eq!(again.0, alone.0);
    let n = PRE.len() + 16 + POST.len();
    assert_eq!(again.1.cached_tokens, (n - 1) / 4 * 4, "{:?}", again.1);
    // Another image with the same tokens: only the blocks before the image are hits.
    let other = collect(e.submit(image_request(&PRE, Some(&b), &POST, 0)).unwrap());
    assert_eq!(other.1.cached_tokens, PRE.len() / 4 * 4, "{:?}", other.1);
    assert_ne!(other.0, alone.0, "another image, the same output");
    // The same tokens without the image rows: not a hit past the image, other output.
    let none = collect(e.submit(image_request(&PRE, None, &POST, 0)).unwrap());
    assert_eq!(none.1.cached_tokens, PRE.len() / 4 * 4, "{:?}", none.1);
    assert_ne!(none.0, alone.0, "the image rows were not injected");
}

#[test]
fn a_prefix_hit_ending_inside_an_image_gives_the_miss_s_bits() {
    let a = pattern(1);
    // PRE (6 tokens), the image at 6..22, then POST or OTHER: with blocks of 4, the two
    // prompts share blocks 0..5 (positions 0..20), which end inside the image.
    const OTHER: [u32; 5] = [31, 77, 2210, 9, 47];
    let miss = {
        let e = start(Arch::Gemma3, 64);
        collect(e.submit(image_request(&PRE, Some(&a), &OTHER, 0)).unwrap())
    };
    assert_eq!(miss.1.cached_tokens, 0);
    let e = start(Arch::Gemma3, 18);
    collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap());
    let hit = collect(e.submit(image_request(&PRE, Some(&a), &OTHER, 0)).unwrap());
    assert_eq!(hit.1.cached_tokens, 20, "{:?}", hit.1);
    assert_eq!(hit.0, miss.0, "a hit ending inside the image");
}

/// The same image prompt again after another request took part of its evicted blocks: the
/// pool gives up the end of the cached prefix first, so the repeat is still a hit past the
/// image's start (here ending inside the 16-row image, longer than a block and than the
/// window of 4) with the bits of a miss. (The pool used to give up the head first: no hit.)
#[test]
fn a_repeated_image_keeps_its_head_blocks_under_pool_pressure() {
    let a = pattern(1);
    let alone = {
        let e = start(Arch::Gemma3, 64);
        collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap())
    };
    // 12 blocks of 4: the image prompt (27 tokens + 8) leaves 8 full blocks cached and 4
    // free; 20 text tokens + 8 take the 4 free blocks and evict 3 cached ones.
    let cfg = common::cpu_engine_config(12, 18);
    let e = Engine::start(
        vec![("tiny".into(), model(Arch::Gemma3), cfg)],
        AdmissionLimits::default(),
    )
    .unwrap();
    let first = collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap());
    assert_eq!(first.0, alone.0);
    let text: Vec<u32> = (0..20).map(|j| 900 + 13 * j).collect();
    collect(e.submit(request(text, Vec::new(), 0)).unwrap());
    let again = collect(e.submit(image_request(&PRE, Some(&a), &POST, 0)).unwrap());
    assert_eq!(again.1.cached_tokens, 20, "5 blocks kept: {:?}", again.1);
    assert_eq!(again.0, alone.0, "a hit ending inside the image");
}

#[test]
fn an_image_larger_than_the_step_budget_is_refused() {
    let e = start(Arch::Gemma3, 15);
    match e.submit(image_request(&PRE, Some(&pattern(1)), &POST, 0)) {
        Err(SubmitError::Invalid(m)) => assert!(m.contains("step budget"), "{m}"),
        r => panic!("expected a refusal, got {:?}", r.map(|_| ())),
    }
    let e = start(Arch::Gemma3, 16);
    collect(
        e.submit(image_request(&PRE, Some(&pattern(1)), &POST, 0))
            .unwrap(),
    );
}

#[test]
fn image_rows_are_refused_where_they_cannot_go() {
    let img = pattern(4);
    // An architecture that does not inject embeddings.
    let e = start(Arch::Llama, 64);
    match e.submit(image_request(&PRE, Some(&img), &POST, 0)) {
        Err(SubmitError::Invalid(m)) => assert!(m.contains("image"), "{m}"),
        r => panic!("expected a refusal, got {:?}", r.map(|_| ())),
    }
    // Rows past the prompt, overlapping spans, the wrong width.
    let e = start(Arch::Gemma3, 64);
    let good = image_request(&PRE, Some(&img), &POST, 0);
    let mut past = good.clone();
    past.media[0].start = good.prompt.len() - 3;
    let mut overlap = good.clone();
    let mut second = overlap.media[0].clone();
    second.start += 4;
    overlap.media.push(second);
    let mut wide = good.clone();
    wide.media[0].width = HIDDEN * 2;
    for (what, r) in [("past", past), ("overlap", overlap), ("width", wide)] {
        assert!(
            matches!(e.submit(r), Err(SubmitError::Invalid(_))),
            "{what} was accepted"
        );
    }
    // And the engine still serves.
    collect(e.submit(good).unwrap());
}
