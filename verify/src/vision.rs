//! `memra-verify vision`: image input (the engine and the tower on `--device`: on a CUDA
//! device the CUDA tower, on the CPU the f32 reference tower).
//!
//! - `cuda` (on a CUDA device): the CUDA tower's embeddings of every image against the CPU
//!   tower's (max |cuda - cpu| / max |cpu| within `--cuda-tolerance`), and the same bits when
//!   the images are encoded a second time; the CUDA rows are then the gate's own (`ours`);
//! - `reference`: the tower's embeddings of deterministic images against an independent
//!   float64 reference on the same mmproj file: numpy (verify/reference/siglip_reference.py,
//!   python with numpy and gguf) and/or Rust (siglip_f64.rs, no python: the GPU machines),
//!   `--reference numpy|f64|both`; max |memra - ref| / max |ref| per image within the
//!   tolerance of docs/VERIFY.md (with both, the two references within it of each other too);
//! - `tokens`: greedy tokens of image prompts fed memra's embeddings vs fed the reference's
//!   (numpy's when it ran, else the Rust one's): equal;
//! - `serve`: image requests and text requests submitted together to one engine (a step
//!   budget of one image and 4 rows, so prefills are chunked beside each other) give the tokens and logprob bits each
//!   gives alone; the same image again is a prefix-cache hit with the same bits, another image
//!   with the same tokens is not a hit past the image, a hit ending inside an image gives the
//!   bits of a miss (its rows attend to the whole image).
//!
//! The tower is MMPROJ (default: a tiny random one written to a temporary mmproj GGUF); the
//! text model is MODEL (a gemma3 of the tower's output width; default: a tiny random gemma3
//! with SmolLM2's tokenizer).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle, KvBudget};
use memra_engine::error::{Error, Result};
use memra_engine::loader::Model;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::scheduler::SchedulerConfig;
use memra_engine::vision::random::{random_tower, write_mmproj};
use memra_engine::vision::{ImageTokens, MediaSpan, TowerParams, VisionTower};

/// Options of the gate.
#[derive(Clone, Debug)]
pub struct VisionArgs {
    /// Where the engine runs (the tower runs on the CPU either way).
    pub device: Device,
    pub mmproj: Option<PathBuf>,
    pub model: Option<PathBuf>,
    pub python: String,
    /// Which float64 references run.
    pub reference: RefChoice,
    pub images: usize,
    pub prompts: usize,
    pub max_tokens: usize,
    /// Largest max |memra - ref| / max |ref| over one image's embeddings.
    pub tolerance: f32,
    /// Largest max |cuda - cpu| / max |cpu| of the CUDA tower against the CPU tower.
    pub cuda_tolerance: f32,
}

/// The float64 references of the tower the gate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RefChoice {
    /// verify/reference/siglip_reference.py (python with numpy and gguf).
    Numpy,
    /// siglip_f64.rs, in this binary (no python).
    F64,
    /// Both, and each against the other.
    Both,
    /// Neither (a real-size tower, whose float64 references take too long): on a CUDA device
    /// the CPU tower is the reference (the tokens check feeds its rows).
    None,
}

impl RefChoice {
    fn numpy(self) -> bool {
        matches!(self, RefChoice::Numpy | RefChoice::Both)
    }

    fn f64(self) -> bool {
        matches!(self, RefChoice::F64 | RefChoice::Both)
    }
}

/// What the gate measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VisionReport {
    pub image_size: usize,
    pub tokens_per_image: usize,
    /// Per image: max |memra - ref| / max |ref| against the numpy reference (empty when it did
    /// not run).
    pub rel_errors: Vec<f32>,
    /// The same against the Rust float64 reference (empty when it did not run).
    pub rel_errors_f64: Vec<f32>,
    /// With both references: the largest max |f64 - numpy| / max |numpy| over the images.
    pub f64_vs_numpy: Option<f32>,
    /// On a device other than the CPU (informative: the GPU keeps its own arithmetic, so a
    /// near-tie may flip): image prompts whose greedy tokens equal a CPU engine's, and whose
    /// first generated token does.
    pub cpu_tokens_equal: Option<usize>,
    pub cpu_first_tokens_equal: Option<usize>,
    pub tokens_equal: usize,
    pub prompts: usize,
    pub serve_differences: usize,
    pub cached_tokens_same_image: usize,
    pub cached_tokens_other_image: usize,
    /// Cached prompt tokens of a hit that ends inside an image (the same bits as a miss).
    pub cached_tokens_inside_image: usize,
    /// The CPU tower's time per image.
    pub encode_ms_per_image: f64,
    /// Where the gate's rows came from (`cpu`, or the CUDA tower's device).
    pub tower: String,
    /// On a CUDA device, per image: max |cuda - cpu| / max |cpu|.
    pub cuda_vs_cpu: Vec<f32>,
    /// On a CUDA device: a second encoding of every image gave the same bits.
    pub cuda_repeat_equal: Option<bool>,
    /// On a CUDA device: the CUDA tower's time per image (the second encoding).
    pub cuda_encode_ms_per_image: Option<f64>,
    pub failures: Vec<String>,
}

/// A deterministic `size x size` RGB image: gradients and a hash-like texture by `seed`.
pub fn test_image(size: usize, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(size * size * 3);
    for y in 0..size {
        for x in 0..size {
            for c in 0..3u32 {
                let h = (x as u32 * 31 + y as u32 * 17 + c * 7 + seed * 101)
                    .wrapping_mul(2_654_435_761)
                    >> 24;
                let g = ((x + y * (c as usize + 1)) * 255 / (2 * size)) as u32;
                v.push(((h / 2 + g + seed * 40) & 0xff) as u8);
            }
        }
    }
    v
}

fn model(path: Option<&Path>) -> Result<Model> {
    match path {
        Some(p) => memra_engine::loader::load_model(p),
        None => {
            let g = memra_engine::formats::gguf::Gguf::open(&memra_engine::testing::real_model())?;
            let tokenizer = memra_engine::tokenizer::Tokenizer::from_gguf(&g)?;
            let config = tiny_config(Arch::Gemma3, tokenizer.vocab_size());
            let weights = random_weights(&config, 17, DType::Q8_0)?;
            Ok(Model {
                path: "tiny-gemma3".into(),
                config,
                weights,
                tokenizer,
                chat: None,
            })
        }
    }
}

pub(crate) fn engine(m: Model, device: Device, budget: usize) -> Result<EngineHandle> {
    let cfg = EngineConfig {
        device,
        threads: 2,
        block_size: 4,
        kv: KvBudget::Blocks(256),
        kv_dtype: Default::default(),
        scheduler: SchedulerConfig {
            max_batch_tokens: budget,
            max_running: 16,
            max_running_per_tenant: 16,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        },
        prefix_cache: true,
        spec: None,
        pp: Default::default(),
    };
    Engine::start(vec![("m".into(), m, cfg)], AdmissionLimits::default())
}

/// Token ids with logprob bits, and the cached prompt tokens.
pub(crate) type Run = (Vec<(u32, u32)>, usize);

pub(crate) fn run(e: &EngineHandle, r: ValidRequest) -> Result<Run> {
    let mut s = e
        .submit(r)
        .map_err(|e| Error::Input(format!("submit: {e}")))?;
    let mut out = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => out.push((t.id, t.logprob.map_or(0, f32::to_bits))),
            Some(Event::Text(_)) => {}
            Some(Event::Done { usage, .. }) => return Ok((out, usage.cached_tokens)),
            Some(Event::Error(m)) => return Err(Error::Input(format!("request failed: {m}"))),
            None => return Err(Error::Input("the stream ended without Done".into())),
        }
    }
}

/// An image prompt: text `i`, the image's tokens, text `i + 1`.
pub(crate) struct Prompt {
    pub(crate) ids: Vec<u32>,
    pub(crate) start: usize,
}

fn prompt(i: usize, tokens: &ImageTokens, rows: usize, vocab: usize) -> Prompt {
    let text = |k: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|j| (100 + 37 * (k * 11 + j)) as u32 % vocab as u32)
            .collect()
    };
    let mut ids = text(i, 3 + i % 5);
    let (img, first) = tokens.expand(rows);
    let start = ids.len() + first;
    ids.extend(img);
    ids.extend(text(i + 1, 4 + i % 3));
    Prompt { ids, start }
}

pub(crate) fn request(
    p: &Prompt,
    media: Option<(Arc<[f32]>, u128)>,
    width: usize,
    n: usize,
) -> ValidRequest {
    ValidRequest {
        model: "m".into(),
        tenant: "t".into(),
        prompt: p.ids.clone(),
        max_tokens: n,
        params: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: Vec::new(),
        logprobs: Some(1),
        cache_salt: None,
        ignore_eos: true,
        tenant_max_in_flight: None,
        speculative: false,
        grammar: None,
        media: media
            .map(|(embeds, hash)| {
                vec![MediaSpan {
                    start: p.start,
                    embeds,
                    width,
                    hash,
                }]
            })
            .unwrap_or_default(),
    }
}

/// Runs the numpy reference on `images`; returns its embeddings per image.
fn reference(python: &str, mmproj: &Path, images: &[Vec<u8>], dir: &Path) -> Result<Vec<Vec<f32>>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/siglip_reference.py");
    let files: Vec<PathBuf> = (0..images.len())
        .map(|i| dir.join(format!("image{i}.rgb")))
        .collect();
    for (f, img) in files.iter().zip(images) {
        std::fs::write(f, img).map_err(|e| Error::io(f, e))?;
    }
    let out = Command::new(python)
        .arg(&script)
        .arg(mmproj)
        .args(&files)
        .output()
        .map_err(|e| Error::io(python, e))?;
    if !out.status.success() {
        return Err(Error::Input(format!(
            "the numpy reference failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    files
        .iter()
        .map(|f| {
            let p = PathBuf::from(format!("{}.ref.f32", f.display()));
            let b = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
            Ok(b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
        .collect()
}

fn rel_error(a: &[f32], r: &[f32]) -> f32 {
    if a.len() != r.len() {
        return f32::INFINITY;
    }
    let max = r.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    // A NaN anywhere is a NaN error (f32::max would drop it).
    let d = a.iter().zip(r).fold(0f32, |m, (x, y)| {
        let e = (x - y).abs();
        if e.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(e)
        }
    });
    d / max
}

/// Runs the gate.
pub fn check(a: &VisionArgs) -> Result<VisionReport> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let m = model(a.model.as_deref())?;
    if m.config.arch != Arch::Gemma3 {
        return Err(Error::Input(format!(
            "vision: the text model is {}, not gemma3",
            m.config.arch.gguf_name()
        )));
    }
    let mmproj = match &a.mmproj {
        Some(p) => p.clone(),
        None => {
            let p = TowerParams::tiny(m.config.hidden);
            let path = dir.path().join("mmproj.gguf");
            write_mmproj(&p, &random_tower(&p, 7), DType::F32, &path)?;
            path
        }
    };
    let mut tower = VisionTower::open(&mmproj)?;
    if tower.out_width() != m.config.hidden {
        return Err(Error::Input(format!(
            "vision: the tower's rows have {} values, the model's embeddings {}",
            tower.out_width(),
            m.config.hidden
        )));
    }
    let (size, rows, width) = (
        tower.image_size(),
        tower.tokens_per_image(),
        tower.out_width(),
    );
    let tokens = ImageTokens::from_tokenizer(&m.tokenizer);
    let vocab = m.config.vocab;
    let mut rep = VisionReport {
        image_size: size,
        tokens_per_image: rows,
        prompts: a.prompts,
        ..Default::default()
    };
    let images: Vec<Vec<u8>> = (0..a.images).map(|i| test_image(size, i as u32)).collect();
    let t0 = std::time::Instant::now();
    let cpu: Vec<Arc<[f32]>> = images
        .iter()
        .map(|img| tower.encode_cpu(img).map(Arc::from))
        .collect::<Result<_>>()?;
    rep.encode_ms_per_image = t0.elapsed().as_secs_f64() * 1e3 / a.images.max(1) as f64;
    tower.place(a.device)?;
    rep.tower = tower.runs_on();
    let ours = match rep.tower.as_str() {
        "cpu" => cpu.clone(),
        _ => device_rows(&tower, &images, &cpu, a, &mut rep)?,
    };
    let hashes: Vec<u128> = images.iter().map(|i| tower.hash(i)).collect();
    // references
    let numpy = match a.reference.numpy() {
        true => Some(reference(&a.python, &mmproj, &images, dir.path())?),
        false => None,
    };
    let f64s = match a.reference.f64() {
        true => {
            let r = crate::siglip_f64::Reference::open(&mmproj)?;
            Some(
                images
                    .iter()
                    .map(|i| r.embed(i))
                    .collect::<Result<Vec<_>>>()?,
            )
        }
        false => None,
    };
    let mut against = |what: &str, refs: &[Vec<f32>], errs: &mut Vec<f32>| {
        for (i, (o, r)) in ours.iter().zip(refs).enumerate() {
            let e = rel_error(o, r);
            errs.push(e);
            if e.is_nan() || e > a.tolerance {
                rep.failures.push(format!(
                    "image {i}: embeddings differ from the {what} reference by {e:.2e} of the \
                     largest (tolerance {:.0e})",
                    a.tolerance
                ));
            }
        }
    };
    let (mut e_np, mut e_64) = (Vec::new(), Vec::new());
    if let Some(r) = &numpy {
        against("numpy", r, &mut e_np);
    }
    if let Some(r) = &f64s {
        against("Rust float64", r, &mut e_64);
    }
    (rep.rel_errors, rep.rel_errors_f64) = (e_np, e_64);
    if let (Some(n), Some(f)) = (&numpy, &f64s) {
        let d = n
            .iter()
            .zip(f)
            .map(|(n, f)| rel_error(f, n))
            .fold(0f32, |m, e| if e.is_nan() { e } else { m.max(e) });
        rep.f64_vs_numpy = Some(d);
        if d.is_nan() || d > a.tolerance {
            rep.failures.push(format!(
                "the Rust float64 reference differs from numpy's by {d:.2e} of the largest"
            ));
        }
    }
    let refs = numpy
        .or(f64s)
        .unwrap_or_else(|| cpu.iter().map(|r| r.to_vec()).collect());
    // tokens: memra's embeddings vs the reference's, fed to the same model
    let e = engine(model(a.model.as_deref())?, a.device, 64.max(rows + 8))?;
    let prompts: Vec<Prompt> = (0..a.prompts)
        .map(|i| prompt(i, &tokens, rows, vocab))
        .collect();
    let mut on_device = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let k = i % images.len();
        let mine = run(
            &e,
            request(p, Some((ours[k].clone(), hashes[k])), width, a.max_tokens),
        )?;
        on_device.push(mine.0.iter().map(|t| t.0).collect::<Vec<u32>>());
        // Another hash: the reference's rows must not come from the cache of memra's.
        let theirs: Arc<[f32]> = Arc::from(refs[k].clone());
        let r = run(
            &e,
            request(p, Some((theirs, !hashes[k])), width, a.max_tokens),
        )?;
        let (x, y): (Vec<u32>, Vec<u32>) = (
            mine.0.iter().map(|t| t.0).collect(),
            r.0.iter().map(|t| t.0).collect(),
        );
        if x == y {
            rep.tokens_equal += 1;
        } else {
            rep.failures.push(format!(
                "prompt {i}: greedy tokens {x:?} (memra) vs {y:?} (reference rows)"
            ));
        }
    }
    drop(e);
    if a.device != Device::Cpu {
        let c = engine(model(a.model.as_deref())?, Device::Cpu, 64.max(rows + 8))?;
        let (mut all, mut first) = (0, 0);
        for (i, (p, dev)) in prompts.iter().zip(&on_device).enumerate() {
            let k = i % images.len();
            let media = Some((ours[k].clone(), hashes[k]));
            let cpu: Vec<u32> = run(&c, request(p, media, width, a.max_tokens))?
                .0
                .iter()
                .map(|t| t.0)
                .collect();
            all += usize::from(&cpu == dev);
            first += usize::from(cpu.first() == dev.first());
        }
        (rep.cpu_tokens_equal, rep.cpu_first_tokens_equal) = (Some(all), Some(first));
    }
    serve(a, &prompts, &ours, &hashes, width, vocab, &mut rep)?;
    Ok(rep)
}

/// The CUDA tower's rows of `images`: against the CPU tower's (`cpu`), and encoded twice with
/// the same bits.
fn device_rows(
    tower: &VisionTower,
    images: &[Vec<u8>],
    cpu: &[Arc<[f32]>],
    a: &VisionArgs,
    rep: &mut VisionReport,
) -> Result<Vec<Arc<[f32]>>> {
    let encode = || -> Result<Vec<Vec<f32>>> { images.iter().map(|i| tower.encode(i)).collect() };
    let first = encode()?;
    let t0 = std::time::Instant::now();
    let second = encode()?;
    rep.cuda_encode_ms_per_image =
        Some(t0.elapsed().as_secs_f64() * 1e3 / images.len().max(1) as f64);
    let bits = |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    let same = bits(&first) == bits(&second);
    rep.cuda_repeat_equal = Some(same);
    if !same {
        rep.failures
            .push("the CUDA tower gave other bits for the same images the second time".into());
    }
    for (i, (g, c)) in first.iter().zip(cpu).enumerate() {
        let e = rel_error(g, c);
        rep.cuda_vs_cpu.push(e);
        if e.is_nan() || e > a.cuda_tolerance {
            rep.failures.push(format!(
                "image {i}: the CUDA tower's embeddings differ from the CPU tower's by {e:.2e} \
                 of the largest (tolerance {:.0e})",
                a.cuda_tolerance
            ));
        }
    }
    Ok(first.into_iter().map(Arc::from).collect())
}

/// Image and text requests together vs alone; prefix hits on the same image.
fn serve(
    a: &VisionArgs,
    prompts: &[Prompt],
    ours: &[Arc<[f32]>],
    hashes: &[u128],
    width: usize,
    vocab: usize,
    rep: &mut VisionReport,
) -> Result<()> {
    let n = prompts.len().min(6);
    let mut reqs = Vec::new();
    for (i, p) in prompts.iter().take(n).enumerate() {
        let k = i % ours.len();
        reqs.push(request(
            p,
            Some((ours[k].clone(), hashes[k])),
            width,
            a.max_tokens,
        ));
        let text = Prompt {
            ids: (0..5 + 3 * i)
                .map(|j| (300 + 53 * j + i) as u32 % vocab as u32)
                .collect(),
            start: 0,
        };
        reqs.push(request(&text, None, width, a.max_tokens));
    }
    // An image's rows are computed in one step (its rows attend to all of it): the loaded
    // engine's step budget holds one image and a few more rows, so prompts are prefilled in
    // chunks beside each other.
    let rows = ours.first().map_or(0, |e| e.len() / width.max(1));
    let alone: Vec<Run> = reqs
        .iter()
        .map(|r| {
            run(
                &engine(model(a.model.as_deref())?, a.device, 64.max(rows + 8))?,
                r.clone(),
            )
        })
        .collect::<Result<_>>()?;
    let e = engine(model(a.model.as_deref())?, a.device, rows + 4)?;
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| {
            e.submit(r.clone())
                .map_err(|x| Error::Input(format!("submit: {x}")))
        })
        .collect::<Result<_>>()?;
    for (i, (mut s, want)) in streams.into_iter().zip(&alone).enumerate() {
        let mut got = Vec::new();
        loop {
            match s.blocking_recv() {
                Some(Event::Token(t)) => got.push((t.id, t.logprob.map_or(0, f32::to_bits))),
                Some(Event::Text(_)) => {}
                Some(Event::Done { .. }) | None => break,
                Some(Event::Error(m)) => return Err(Error::Input(format!("request {i}: {m}"))),
            }
        }
        if got != want.0 {
            rep.serve_differences += 1;
            rep.failures
                .push(format!("request {i} under load differs from alone"));
        }
    }
    let again = run(&e, reqs[0].clone())?;
    rep.cached_tokens_same_image = again.1;
    if again.0 != alone[0].0 || again.1 < prompts[0].start + 1 {
        rep.failures.push(format!(
            "the same image again: {} cached tokens (want past position {}), same bits {}",
            again.1,
            prompts[0].start,
            again.0 == alone[0].0
        ));
    }
    let mut other = reqs[0].clone();
    let k = 1 % ours.len();
    other.media[0].embeds = ours[k].clone();
    other.media[0].hash = hashes[k] ^ 1;
    let o = run(&e, other)?;
    rep.cached_tokens_other_image = o.1;
    if o.1 > prompts[0].start {
        rep.failures.push(format!(
            "another image with the same tokens: {} cached tokens, past the image at {}",
            o.1, prompts[0].start
        ));
    }
    let media = (ours[0].clone(), hashes[0]);
    hit_inside_image(a, &prompts[0], media, width, vocab, &e, rep)
}

/// A prefix-cache hit that ends inside an image gives the bits of a miss: prompt 0 with text
/// put before it so that a KV block (4 positions) ends two positions before the image's end,
/// and two tails that differ right after the image's next token; the second prompt after the
/// first is a hit of every block up to inside the image.
fn hit_inside_image(
    a: &VisionArgs,
    p0: &Prompt,
    media: (Arc<[f32]>, u128),
    width: usize,
    vocab: usize,
    e: &EngineHandle,
    rep: &mut VisionReport,
) -> Result<()> {
    let rows = media.0.len() / width.max(1);
    let end = p0.start + rows;
    let pad = (4 + 2 - (end + 1) % 4) % 4;
    let mut ids: Vec<u32> = (0..pad)
        .map(|j| (200 + 31 * j) as u32 % vocab as u32)
        .collect();
    ids.extend_from_slice(&p0.ids[..end + 1]);
    let shared = ids.len();
    let (mut first, mut second) = (ids.clone(), ids);
    first.extend_from_slice(&p0.ids[end + 1..]);
    second.extend(p0.ids[end + 1..].iter().map(|t| (t + 1) % vocab as u32));
    let start = p0.start + pad;
    let req = |ids: Vec<u32>| {
        request(
            &Prompt { ids, start },
            Some(media.clone()),
            width,
            a.max_tokens,
        )
    };
    let rows_budget = rows + 4;
    let miss = run(
        &engine(model(a.model.as_deref())?, a.device, rows_budget)?,
        req(second.clone()),
    )?;
    run(e, req(first))?;
    let hit = run(e, req(second))?;
    rep.cached_tokens_inside_image = hit.1;
    let want = shared - 2;
    if hit.1 != want || hit.0 != miss.0 {
        rep.failures.push(format!(
            "a prefix-cache hit ending inside the image (rows {start}..{}): {} cached tokens \
             (want {want}), the miss's bits {}",
            start + rows,
            hit.1,
            hit.0 == miss.0
        ));
    }
    Ok(())
}
