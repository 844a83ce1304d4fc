//! `memra-verify vision`: image input (the engine and the tower on `--device`: on a CUDA
//! device the CUDA tower, on the CPU the f32 reference tower).
//!
//! - `cuda` (on a CUDA device): the CUDA tower's embeddings of every image against the CPU
//!   tower's (max |cuda - cpu| / max |cpu| within `--cuda-tolerance`, [`CUDA_TOLERANCE`]: the
//!   CUDA tower's products and attention take f16 inputs), and the same bits when the images
//!   are encoded a second time; the CUDA rows are then the gate's own (`ours`: the tokens,
//!   serving and video checks);
//! - `reference`: the CPU tower's embeddings of deterministic images against an independent
//!   float64 reference on the same mmproj file: numpy (verify/reference/siglip_reference.py;
//!   the Qwen ViT: qwenvit_reference.py; python with numpy and gguf) and/or Rust
//!   (siglip_f64.rs, Gemma 3's tower only, no python: the GPU machines),
//!   `--reference numpy|f64|both`; max |memra - ref| / max |ref| per image within the
//!   tolerance of docs/VERIFY.md (with both, the two references within it of each other too);
//!   the Qwen ViT's images are of several sizes and aspect ratios (vision_qwen.rs);
//! - `tokens`: greedy tokens of image prompts fed memra's embeddings vs fed the reference's
//!   (numpy's when it ran, else the Rust one's): equal;
//! - `video` (the Qwen ViT): a 3-frame video through the tower's video path against the numpy
//!   reference's, its M-RoPE positions and text-model logits against HF's rule; or, on a CUDA
//!   device without numpy (`--reference none`), the CUDA tower's video path against the CPU
//!   tower's as the images are (`--cuda-tolerance`, a second encoding the same bits); its
//!   greedy tokens fed either rows (vision_video.rs);
//! - `serve`: image requests and text requests submitted together to one engine (a step
//!   budget of one image and 4 rows, so prefills are chunked beside each other; a KV pool
//!   that holds them all, so nothing is evicted) give the tokens and logprob bits each gives
//!   alone; the same image again is a prefix-cache hit of every full block before its last
//!   token with the same bits, another image with the same tokens is not a hit past the
//!   image, a hit ending inside an image gives the bits of a miss (its rows attend to the
//!   whole image).
//!
//! The tower is MMPROJ (default: a tiny random one of `--family` written to a temporary mmproj
//! GGUF); the text model is MODEL (a gemma3 for Gemma 3's tower; for the Qwen ViT a qwen2vl or
//! qwen3vl, M-RoPE: each image's rows placed by its token grid; or a plain qwen2 / qwen3; of
//! the tower's output width; default: a tiny random one of the family's architecture with
//! SmolLM2's tokenizer). A Qwen3-VL tower's rows carry its deepstack mergers' values after the
//! main ones: all of them are checked against the reference, and served to a qwen3vl (its
//! deepstack layers add them), the main ones to a plain model.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, Engine, EngineHandle};
use memra_engine::error::{Error, Result};
use memra_engine::loader::Model;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{Event, ValidRequest};
use memra_engine::vision::{ImageTokens, MediaSpan, VisionTower};

pub use crate::vision_qwen::Family;
use crate::vision_qwen::{Image, main_rows};
use crate::vision_rows::{Against, on_device, rel_error};

/// The default largest max |cuda - cpu| / max |cpu| of one image's embeddings (docs/VERIFY.md
/// "The CUDA tower"): the CUDA tower rounds the inputs of its products and attention (and the
/// attention's P) to f16, about 2^-12 of each value, which a float64 emulation puts at 3e-4 ..
/// 7e-4 of the largest value at the end of the tiny random towers and of Gemma 3's real widths
/// (27 blocks); an indexing or masking bug moves values by a good part of the largest.
pub const CUDA_TOLERANCE: f32 = 2e-3;

/// Options of the gate.
#[derive(Clone, Debug)]
pub struct VisionArgs {
    /// Where the engine runs (the tower runs on the CPU either way).
    pub device: Device,
    pub mmproj: Option<PathBuf>,
    /// The synthetic tower's family (without `mmproj`) and the default text model's.
    pub family: Family,
    pub model: Option<PathBuf>,
    pub python: String,
    /// Which float64 references run.
    pub reference: RefChoice,
    pub images: usize,
    pub prompts: usize,
    pub max_tokens: usize,
    /// Largest max |memra - ref| / max |ref| over one image's embeddings (the CPU tower's
    /// against the float64 references).
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
    /// the CPU tower is the reference (the tokens check feeds its rows; the Qwen ViT's video
    /// too).
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
    /// The projector (`gemma3`, `qwen2.5vl_merger`, ...).
    pub projector: String,
    pub image_size: usize,
    pub tokens_per_image: usize,
    /// Per image: its size (width, height) and its rows.
    pub image_sizes: Vec<(usize, usize)>,
    pub image_tokens: Vec<usize>,
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
    /// The Qwen-VL text model against its numpy reference (M-RoPE positions, logits;
    /// vision_text.rs), when the numpy reference runs for a Qwen family.
    pub text: Option<crate::vision_text::TextReport>,
    /// The Qwen ViT's video path (vision_video.rs) against the numpy reference's when it runs,
    /// else on a CUDA device against the CPU tower's.
    pub video: Option<crate::vision_video::VideoReport>,
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
    crate::vision_qwen::test_image(size, size, seed)
}

pub(crate) fn model(a: &VisionArgs) -> Result<Model> {
    match a.model.as_deref() {
        Some(p) => memra_engine::loader::load_model(p),
        None => {
            let g = memra_engine::formats::gguf::Gguf::open(&memra_engine::testing::real_model())?;
            let tokenizer = memra_engine::tokenizer::Tokenizer::from_gguf(&g)?;
            let config = tiny_config(a.family.text_arch(), tokenizer.vocab_size());
            let weights = random_weights(&config, 17, DType::Q8_0)?;
            Ok(Model {
                path: format!("tiny-{}", a.family.text_arch().gguf_name()).into(),
                config,
                weights,
                tokenizer,
                chat: None,
            })
        }
    }
}

/// Positions per KV block of the gate's engines.
const BLOCK: usize = memra_engine::testing::BLOCK_SIZE;

/// KV blocks of the gate's engines (1,024 positions) unless a check needs more.
const POOL_BLOCKS: usize = 256;

pub(crate) fn engine(m: Model, device: Device, budget: usize) -> Result<EngineHandle> {
    engine_with_pool(m, device, budget, POOL_BLOCKS)
}

/// [`engine`] with a pool of `blocks` KV blocks.
fn engine_with_pool(
    m: Model,
    device: Device,
    budget: usize,
    blocks: usize,
) -> Result<EngineHandle> {
    let cfg = memra_engine::testing::engine_config(device, blocks, budget, 16);
    Engine::start(vec![("m".into(), m, cfg)], AdmissionLimits::default())
}

/// Token ids with logprob bits, and the cached prompt tokens.
pub(crate) type Run = (Vec<(u32, u32)>, usize);

pub(crate) use memra_engine::testing::run_request as run;

/// An image prompt: text `i`, the image's tokens, text `i + 1`; the image's token grid.
pub(crate) struct Prompt {
    pub(crate) ids: Vec<u32>,
    pub(crate) start: usize,
    pub(crate) grid: Option<(usize, usize)>,
}

fn prompt(i: usize, tokens: &ImageTokens, grid: (usize, usize), vocab: usize) -> Prompt {
    let rows = grid.0 * grid.1;
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
    Prompt {
        ids,
        start,
        grid: Some(grid),
    }
}

/// The greedy request of `p` (logprobs on), its image `media` (embeddings, hash) if any.
pub(crate) fn request(
    p: &Prompt,
    media: Option<(Arc<[f32]>, u128)>,
    width: usize,
    n: usize,
) -> ValidRequest {
    let media = media.map(|(embeds, hash)| MediaSpan {
        start: p.start,
        embeds,
        width,
        hash,
        grid: p.grid,
        times: Vec::new(),
    });
    memra_engine::testing::media_request(p.ids.clone(), media.into_iter().collect(), n, false)
}

/// Runs the numpy reference of the tower's family on `images`; returns its embeddings per
/// image.
fn reference(
    python: &str,
    mmproj: &Path,
    qwen: bool,
    images: &[Image],
    dir: &Path,
) -> Result<Vec<Vec<f32>>> {
    let name = match qwen {
        true => "reference/qwenvit_reference.py",
        false => "reference/siglip_reference.py",
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    let files: Vec<PathBuf> = (0..images.len())
        .map(|i| dir.join(format!("image{i}.rgb")))
        .collect();
    let mut args = Vec::with_capacity(files.len());
    for (f, img) in files.iter().zip(images) {
        std::fs::write(f, &img.rgb).map_err(|e| Error::io(f, e))?;
        args.push(match qwen {
            true => format!("{}:{}x{}", f.display(), img.w, img.h),
            false => f.display().to_string(),
        });
    }
    let out = Command::new(python)
        .arg(&script)
        .arg(mmproj)
        .args(&args)
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

/// The gate's tower: MMPROJ, or the family's tiny random one written into `dir`.
fn open_tower(a: &VisionArgs, hidden: usize, dir: &Path) -> Result<(PathBuf, VisionTower)> {
    let mmproj = match &a.mmproj {
        Some(p) => p.clone(),
        None => {
            let path = dir.join("mmproj.gguf");
            a.family.write_tiny(hidden, &path)?;
            path
        }
    };
    let tower = VisionTower::open(&mmproj)?;
    Ok((mmproj, tower))
}

/// Runs the gate.
pub fn check(a: &VisionArgs) -> Result<VisionReport> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let m = model(a)?;
    let hidden = m.config.hidden;
    let (mmproj, mut tower) = open_tower(a, hidden, dir.path())?;
    let qwen = tower.qwen_params().is_some();
    let width = tower.out_width();
    // What the text model takes: whole rows (a qwen3vl takes the deepstack values too), or
    // a plain qwen3's main rows of a Qwen3-VL tower.
    let take = crate::vision_qwen::rows_taken(&tower, &m.config)?;
    if qwen && a.reference.f64() {
        return Err(Error::Input(
            "vision: the Rust float64 reference covers Gemma 3's tower only; for the Qwen ViT \
             use --reference numpy (or none)"
                .into(),
        ));
    }
    let images = crate::vision_qwen::images(&tower, a.images)?;
    let mut rep = VisionReport {
        projector: tower
            .qwen_params()
            .map_or("gemma3", |q| q.kind.projector())
            .into(),
        image_size: tower.image_size(),
        tokens_per_image: tower.tokens_per_image(),
        image_sizes: images.iter().map(|i| (i.w, i.h)).collect(),
        image_tokens: images.iter().map(|i| tower.tokens_for(i.w, i.h)).collect(),
        prompts: a.prompts,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let cpu: Vec<Arc<[f32]>> = images
        .iter()
        .map(|i| tower.encode_image_cpu(i.w, i.h, &i.rgb).map(Arc::from))
        .collect::<Result<_>>()?;
    rep.encode_ms_per_image = t0.elapsed().as_secs_f64() * 1e3 / a.images.max(1) as f64;
    tower.place(a.device)?;
    rep.tower = tower.runs_on();
    let full = match rep.tower.as_str() {
        "cpu" => cpu.clone(),
        _ => device_rows(&tower, &images, &cpu, a, &mut rep)?,
    };
    let hashes: Vec<u128> = images
        .iter()
        .map(|i| tower.hash_image(i.w, i.h, &i.rgb))
        .collect();
    // The float64 references check the CPU tower (the CUDA tower is checked against it above).
    let refs = references(a, &mmproj, qwen, &images, &cpu, dir.path(), &mut rep)?
        .unwrap_or_else(|| cpu.iter().map(|r| r.to_vec()).collect());
    let grids: Vec<(usize, usize)> = images.iter().map(|i| tower.grid_for(i.w, i.h)).collect();
    let vl = a.family.text_arch();
    if let (Some(q), true) = (tower.qwen_params(), a.reference.numpy() && vl.is_vl()) {
        let t = crate::vision_text::check(&a.python, vl, q, &cpu, &grids, dir.path())?;
        if !t.positions_equal {
            rep.failures.push(format!(
                "{}: M-RoPE positions differ from HF's get_rope_index",
                vl.gguf_name()
            ));
        }
        if t.rel_error.is_nan() || t.rel_error > a.tolerance {
            rep.failures.push(format!(
                "{}: logits differ from the numpy text reference by {:.2e} of the largest \
                 (tolerance {:.0e})",
                vl.gguf_name(),
                t.rel_error,
                a.tolerance
            ));
        }
        rep.text = Some(t);
    }
    if qwen {
        video(a, &mmproj, &tower, dir.path(), &mut rep)?;
    }
    let ours: Vec<Arc<[f32]>> = full
        .iter()
        .map(|r| Arc::from(main_rows(r, width, take)))
        .collect();
    let refs: Vec<Vec<f32>> = refs.iter().map(|r| main_rows(r, width, take)).collect();
    let tokens = ImageTokens::from_tokenizer(&m.tokenizer);
    let rows: Vec<usize> = rep.image_tokens.clone();
    let prompts: Vec<Prompt> = (0..a.prompts)
        .map(|i| prompt(i, &tokens, grids[i % grids.len()], m.config.vocab))
        .collect();
    let fed = Fed {
        prompts: &prompts,
        ours: &ours,
        hashes: &hashes,
        width: take,
        budget: 64.max(rows.iter().max().copied().unwrap_or(0) + 8),
    };
    tokens_check(a, &fed, &refs, &mut rep)?;
    serve(a, &prompts, &ours, &hashes, take, m.config.vocab, &mut rep)?;
    Ok(rep)
}

/// The Qwen ViT's video case (vision_video.rs) through the gate's tower: against the numpy
/// reference where it runs (on a CUDA device its rows, and the logits they give, carry the
/// CUDA tower's f16 rounding too: `--tolerance` + `--cuda-tolerance`); else, with the tower on
/// a CUDA device, against the CPU tower as the images are (`--cuda-tolerance`); on the CPU
/// without numpy, not at all (the CPU tower against itself).
fn video(
    a: &VisionArgs,
    mmproj: &Path,
    tower: &VisionTower,
    dir: &Path,
    rep: &mut VisionReport,
) -> Result<()> {
    use crate::vision_video::{VideoArgs, VideoRef};
    let cuda = rep.tower != "cpu";
    let (reference, tol) = match (a.reference.numpy(), cuda) {
        (true, _) => {
            let python = &a.python;
            let tol = a.tolerance + if cuda { a.cuda_tolerance } else { 0.0 };
            (VideoRef::Numpy { python, mmproj }, tol)
        }
        (false, true) => (VideoRef::CpuTower, a.cuda_tolerance),
        (false, false) => return Ok(()),
    };
    let args = VideoArgs {
        reference,
        tower,
        model: &|| model(a),
        device: a.device,
        max_tokens: a.max_tokens,
        dir,
    };
    rep.video = Some(crate::vision_video::check(args, tol, &mut rep.failures)?);
    Ok(())
}

/// The tower's rows of each image against the float64 references that run (`rep`'s errors);
/// returns the rows the tokens check feeds (numpy's when it ran, else the Rust one's).
fn references(
    a: &VisionArgs,
    mmproj: &Path,
    qwen: bool,
    images: &[Image],
    ours: &[Arc<[f32]>],
    dir: &Path,
    rep: &mut VisionReport,
) -> Result<Option<Vec<Vec<f32>>>> {
    let numpy = match a.reference.numpy() {
        true => Some(reference(&a.python, mmproj, qwen, images, dir)?),
        false => None,
    };
    let f64s = match a.reference.f64() {
        true => {
            let r = crate::siglip_f64::Reference::open(mmproj)?;
            Some(
                images
                    .iter()
                    .map(|i| r.embed(&i.rgb))
                    .collect::<Result<Vec<_>>>()?,
            )
        }
        false => None,
    };
    let image = |i: usize| format!("image {i}");
    let mut against = |what: &str, refs: &[Vec<f32>]| {
        let what = format!("embeddings differ from the {what} reference");
        let cmp = Against {
            what: &what,
            item: &image,
            tol: a.tolerance,
        };
        cmp.errors(ours, refs, &mut rep.failures)
    };
    let e_np = numpy.as_ref().map(|r| against("numpy", r));
    let e_64 = f64s.as_ref().map(|r| against("Rust float64", r));
    (rep.rel_errors, rep.rel_errors_f64) = (e_np.unwrap_or_default(), e_64.unwrap_or_default());
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
    Ok(numpy.or(f64s))
}

/// The image prompts and the rows fed to them.
struct Fed<'a> {
    prompts: &'a [Prompt],
    ours: &'a [Arc<[f32]>],
    hashes: &'a [u128],
    width: usize,
    /// The step budget of the engines: the largest image and some rows.
    budget: usize,
}

/// Greedy tokens of the image prompts fed memra's rows vs fed the reference's (`refs`); on a
/// device other than the CPU, informative: the same against a CPU engine.
fn tokens_check(
    a: &VisionArgs,
    f: &Fed<'_>,
    refs: &[Vec<f32>],
    rep: &mut VisionReport,
) -> Result<()> {
    let n = f.ours.len();
    let e = engine(model(a)?, a.device, f.budget)?;
    let mut on_device = Vec::with_capacity(f.prompts.len());
    for (i, p) in f.prompts.iter().enumerate() {
        let k = i % n;
        let media = Some((f.ours[k].clone(), f.hashes[k]));
        let mine = run(&e, request(p, media, f.width, a.max_tokens))?;
        on_device.push(mine.0.iter().map(|t| t.0).collect::<Vec<u32>>());
        // Another hash: the reference's rows must not come from the cache of memra's.
        let theirs: Arc<[f32]> = Arc::from(refs[k].clone());
        let r = run(
            &e,
            request(p, Some((theirs, !f.hashes[k])), f.width, a.max_tokens),
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
        let c = engine(model(a)?, Device::Cpu, f.budget)?;
        let (mut all, mut first) = (0, 0);
        for (i, (p, dev)) in f.prompts.iter().zip(&on_device).enumerate() {
            let k = i % n;
            let media = Some((f.ours[k].clone(), f.hashes[k]));
            let cpu: Vec<u32> = run(&c, request(p, media, f.width, a.max_tokens))?
                .0
                .iter()
                .map(|t| t.0)
                .collect();
            all += usize::from(&cpu == dev);
            first += usize::from(cpu.first() == dev.first());
        }
        (rep.cpu_tokens_equal, rep.cpu_first_tokens_equal) = (Some(all), Some(first));
    }
    Ok(())
}

/// The CUDA tower's rows of `images`: against the CPU tower's (`cpu`), and encoded twice with
/// the same bits.
fn device_rows(
    tower: &VisionTower,
    images: &[Image],
    cpu: &[Arc<[f32]>],
    a: &VisionArgs,
    rep: &mut VisionReport,
) -> Result<Vec<Arc<[f32]>>> {
    let encode = || -> Result<Vec<Vec<f32>>> {
        images
            .iter()
            .map(|i| tower.encode_image(i.w, i.h, &i.rgb))
            .collect()
    };
    let cmp = Against {
        what: "the CUDA tower's embeddings differ from the CPU tower's",
        item: &|i| format!("image {i}"),
        tol: a.cuda_tolerance,
    };
    let d = on_device(&encode, cpu, "images", &cmp, &mut rep.failures)?;
    rep.cuda_encode_ms_per_image = Some(d.ms / images.len().max(1) as f64);
    rep.cuda_repeat_equal = Some(d.repeat_equal);
    rep.cuda_vs_cpu = d.errors;
    Ok(d.rows.into_iter().map(Arc::from).collect())
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
            grid: None,
        };
        reqs.push(request(&text, None, width, a.max_tokens));
    }
    // An image's rows are computed in one step (its rows attend to all of it): the loaded
    // engine's step budget holds one image and a few more rows, so prompts are prefilled in
    // chunks beside each other.
    let rows = ours.first().map_or(0, |e| e.len() / width.max(1));
    let alone: Vec<Run> = reqs
        .iter()
        .map(|r| run(&engine(model(a)?, a.device, 64.max(rows + 8))?, r.clone()))
        .collect::<Result<_>>()?;
    // The pool holds every request of the load run and the 4 requests of the checks after it,
    // so no block is ever evicted and the hits below are exact: with real-size images (256
    // rows) 4 image prompts and their texts are more than the default pool's 1,024
    // positions, and evicting the first request's blocks took its hit away.
    let blocks = |n: usize| (n + a.max_tokens).div_ceil(BLOCK);
    let longest = reqs.iter().map(|r| r.prompt.len()).max().unwrap_or(0);
    let held = reqs.iter().map(|r| blocks(r.prompt.len())).sum::<usize>()
        + 4 * blocks(longest + BLOCK)
        + 1;
    let e = engine_with_pool(model(a)?, a.device, rows + 4, POOL_BLOCKS.max(held))?;
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
    // Nothing was evicted: every full block before the last token is a hit.
    let again = run(&e, reqs[0].clone())?;
    rep.cached_tokens_same_image = again.1;
    let want = (prompts[0].ids.len() - 1) / BLOCK * BLOCK;
    if again.0 != alone[0].0 || again.1 != want {
        rep.failures.push(format!(
            "the same image again: {} cached tokens (want {want}, every full block before the \
             last token; the image at {}..{}), same bits {}",
            again.1,
            prompts[0].start,
            prompts[0].start + rows,
            again.0 == alone[0].0
        ));
    }
    // Another image of the same size (its rows negated, another hash).
    let mut other = reqs[0].clone();
    other.media[0].embeds = ours[0].iter().map(|v| -v).collect();
    other.media[0].hash = hashes[0] ^ 1;
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
    let pad = (BLOCK + 2 - (end + 1) % BLOCK) % BLOCK;
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
            &Prompt {
                ids,
                start,
                grid: p0.grid,
            },
            Some(media.clone()),
            width,
            a.max_tokens,
        )
    };
    let rows_budget = rows + 4;
    let miss = run(
        &engine(model(a)?, a.device, rows_budget)?,
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
