//! `memra-bench vision`: the vision tower's throughput and the TTFT of a one-image request,
//! through the engine, as measurement rows (issue 38), beside llama.cpp mtmd's
//! ([`crate::peer_mtmd`], tools/device/mtmd_bench.sh) on the same text GGUF, mmproj and image
//! files.
//!
//! - `vision_encode` (images/s): after a warm-up, `images` images of the tower's size encoded
//!   back to back by the tower alone on its device (the CUDA tower on a GPU), each a fresh
//!   content (no embedding cache is consulted: the tower is called directly); the value is
//!   images over the total time, min and max the slowest and fastest image.
//! - `vision_ttft` (ms): a chat prompt (the model's template, else BOS + text) holding one
//!   image, submitted to the engine with a fresh cache salt and a fresh image each run, timed
//!   from the image's RGB (normalization and the tower's encode included) to the first token;
//!   the median of `runs` after one untimed run.
//!
//! The images are deterministic RGB (`image(i)`), written as PNG files `img-NNN.png` into
//! `--images-dir` when given, so that llama.cpp reads the same pixels: image 0 is the warm-up,
//! images 1..=max(images, runs) the timed ones (each side drops its first run).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use memra_engine::backend::Device;
use memra_engine::chat::ChatMessage;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle};
use memra_engine::error::{Error, Result};
use memra_engine::loader::load_model;
use memra_engine::models::random::splitmix;
use memra_engine::request::{Event, ValidRequest};
use memra_engine::testing::text_request;
use memra_engine::vision::{ImageTokens, MediaSpan, VisionTower};

use crate::record::{self, Row, Workload};

/// The user's text of the one-image prompt (llama-mtmd-cli `-p`, the same words).
pub const PROMPT: &str = "Describe this image in one sentence.";

/// llama.cpp's media marker (mtmd_default_marker), also used to split memra's rendered prompt.
pub const MARKER: &str = "<__media__>";

#[derive(Clone, Debug)]
pub struct VisionArgs {
    pub model: PathBuf,
    pub mmproj: PathBuf,
    pub device: Device,
    /// Timed encodes (vision_encode).
    pub images: usize,
    /// Timed one-image requests (vision_ttft).
    pub runs: usize,
    pub run: String,
    pub shape: Option<String>,
    pub dtype: Option<String>,
    /// Write the images here as PNG (img-000.png is the warm-up).
    pub images_dir: Option<PathBuf>,
}

/// A deterministic `size x size` RGB image: smooth gradients under a hashed texture, its
/// content a function of `seed` (every seed another image).
pub fn image(size: usize, seed: u64) -> Vec<u8> {
    let mut rgb = vec![0u8; size * size * 3];
    let s = size.max(1) as u64;
    for y in 0..size as u64 {
        for x in 0..size as u64 {
            let i = (y * s + x) as usize * 3;
            let h = splitmix(38, seed, y * s + x);
            let g = [
                (x * 255 / s) as u8,
                (y * 255 / s) as u8,
                ((x + y + seed * 37) * 127 / s) as u8,
            ];
            for c in 0..3 {
                let noise = (h >> (8 * c)) as u8 & 0x3f;
                rgb[i + c] = g[c].wrapping_add(noise);
            }
        }
    }
    rgb
}

/// Writes `rgb` (`size x size`) as a PNG file.
pub fn write_png(path: &Path, size: usize, rgb: &[u8]) -> Result<()> {
    let img = ::image::RgbImage::from_raw(size as u32, size as u32, rgb.to_vec())
        .ok_or_else(|| Error::Input(format!("{}: not {size}x{size} RGB", path.display())))?;
    img.save_with_format(path, ::image::ImageFormat::Png)
        .map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// The name of image `i`'s file.
pub fn png_name(i: usize) -> String {
    format!("img-{i:03}.png")
}

/// The prompt's ids with the image's tokens in place, and the index of the image's first row.
fn prompt_ids(
    m: &memra_engine::loader::Model,
    tokens: &ImageTokens,
    rows: usize,
) -> Result<(Vec<u32>, usize)> {
    let content = format!("{MARKER}{PROMPT}");
    let (mut ids, at) = match &m.chat {
        Some(t) => {
            let rendered = t.render(&[ChatMessage::new("user", content.clone())], true)?;
            let (ids, at) = m
                .tokenizer
                .encode_chat_media(&rendered, &[&content], MARKER)?;
            let at = *at
                .first()
                .ok_or_else(|| Error::Input("the chat template dropped the image marker".into()))?;
            (ids, at)
        }
        None => {
            let mut ids: Vec<u32> = m.tokenizer.bos_id().into_iter().collect();
            let at = ids.len();
            ids.extend(m.tokenizer.encode_plain(PROMPT)?);
            (ids, at)
        }
    };
    let (img, first) = tokens.expand(rows);
    let start = at + first;
    ids.splice(at..at, img);
    Ok((ids, start))
}

/// The first token's time of one request (from `t0`), waiting for its end.
fn first_token(e: &EngineHandle, r: ValidRequest, t0: Instant) -> Result<f64> {
    let mut s = e
        .submit(r)
        .map_err(|x| Error::Input(format!("submit: {x}")))?;
    let mut first = None;
    loop {
        match s.blocking_recv() {
            Some(Event::Token(_)) => {
                first.get_or_insert(t0.elapsed().as_secs_f64() * 1e3);
            }
            Some(Event::Text(_)) => {}
            Some(Event::Done { .. }) => {
                return first.ok_or_else(|| Error::Input("no token generated".into()));
            }
            Some(Event::Error(m)) => return Err(Error::Input(format!("request failed: {m}"))),
            None => return Err(Error::Input("the stream ended without Done".into())),
        }
    }
}

/// Runs both measurements; returns the rows (vision_encode, vision_ttft).
pub fn run(a: &VisionArgs) -> Result<Vec<Row>> {
    if a.images == 0 || a.runs == 0 {
        return Err(Error::Input(
            "--images and --runs must be at least 1".into(),
        ));
    }
    let mref = record::model_ref(&a.model)?;
    let m = load_model(&a.model)?;
    let mut tower = VisionTower::open(&a.mmproj)?;
    if tower.qwen_params().is_some() {
        return Err(Error::Input(
            "memra-bench vision: Gemma 3's tower only (square images of the tower's size)".into(),
        ));
    }
    let width = tower.out_width();
    if width != m.config.embed_width() {
        return Err(Error::Input(format!(
            "the tower's rows have {width} values, the model's embeddings {}",
            m.config.embed_width()
        )));
    }
    tower.place(a.device)?;
    let size = tower.image_size();
    let rows = tower.tokens_per_image();
    let count = a.images.max(a.runs) + 1;
    let images: Vec<Vec<u8>> = (0..count).map(|i| image(size, i as u64)).collect();
    if let Some(dir) = &a.images_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        for (i, rgb) in images.iter().enumerate() {
            write_png(&dir.join(png_name(i)), size, rgb)?;
        }
    }
    let tokens = ImageTokens::from_tokenizer(&m.tokenizer);
    let (ids, start) = prompt_ids(&m, &tokens, rows)?;
    let mut cfg = EngineConfig {
        device: a.device,
        prefix_cache: true,
        ..EngineConfig::default()
    };
    let limits = AdmissionLimits {
        max_in_flight_per_tenant: 4,
        max_queued: 4,
    };
    cfg.scheduler.max_running = limits.max_in_flight_per_tenant;
    // The image's rows are computed in one step: the budget holds the whole prompt.
    cfg.scheduler.max_batch_tokens = cfg.scheduler.max_batch_tokens.max(ids.len() + 8);
    let engine = Engine::start(vec![("bench".into(), m, cfg)], limits)?;
    let info = engine
        .models()
        .into_iter()
        .next()
        .ok_or_else(|| Error::Input("the engine serves no model".into()))?;
    let (device, _) = crate::speed::device_ref(&info.backend)?;

    // vision_encode: warm-up (twice, image 0), then images 1..=N back to back.
    for _ in 0..2 {
        tower.encode(&images[0])?;
    }
    let mut per = Vec::with_capacity(a.images);
    let t0 = Instant::now();
    for rgb in &images[1..=a.images] {
        let t = Instant::now();
        tower.encode(rgb)?;
        per.push(t.elapsed().as_secs_f64());
    }
    let total = t0.elapsed().as_secs_f64();
    let rates: Vec<f64> = per.iter().map(|s| 1.0 / s.max(1e-12)).collect();
    let (_, lo, hi) = record::median_min_max(&rates).unwrap_or((0.0, 0.0, 0.0));

    // vision_ttft: one untimed request (image 0), then runs on images 1..=R.
    let mut ttft = Vec::with_capacity(a.runs);
    for (i, rgb) in images[..=a.runs].iter().enumerate() {
        let req = |embeds: Vec<f32>| ValidRequest {
            media: vec![MediaSpan {
                start,
                embeds: Arc::from(embeds),
                width,
                hash: tower.hash(rgb),
                grid: None,
                times: Vec::new(),
            }],
            model: "bench".into(),
            tenant: "bench".into(),
            cache_salt: Some(format!("vision-{}-{i}", a.run)),
            ..text_request(ids.clone(), 1)
        };
        let t = Instant::now();
        let embeds = tower.encode(rgb)?;
        let ms = first_token(&engine, req(embeds), t)?;
        if i > 0 {
            ttft.push(ms);
        }
    }
    let (med, tlo, thi) =
        record::median_min_max(&ttft).ok_or_else(|| Error::Input("no TTFT measured".into()))?;

    let mm = a.mmproj.file_name().map_or_else(
        || a.mmproj.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let base = Row {
        commit: record::commit(),
        model: Some(mref),
        shape: a.shape.clone(),
        dtype: a.dtype.clone(),
        batch: Some(1),
        prompt: Some(rows as u64),
        generated: Some(0),
        depth: Some(0),
        value: Some(a.images as f64 / total.max(1e-12)),
        min: Some(lo),
        max: Some(hi),
        runs: a.images as u64,
        source: Some(format!(
            "mmproj {mm}: {size}x{size}, {rows} tokens, tower on {}",
            tower.runs_on()
        )),
        ..Row::new(
            a.run.clone(),
            device,
            "memra",
            Workload::VisionEncode,
            "images/s",
        )
    };
    let ttft_row = Row {
        workload: Workload::VisionTtft,
        prompt: Some(ids.len() as u64),
        generated: Some(1),
        value: Some(med),
        unit: "ms".into(),
        min: Some(tlo),
        max: Some(thi),
        runs: a.runs as u64,
        kv_dtype: Some(info.kv_dtype.to_string()),
        ..base.clone()
    };
    Ok(vec![base, ttft_row])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_deterministic_and_distinct() {
        assert_eq!(image(16, 3), image(16, 3));
        assert_ne!(image(16, 3), image(16, 4));
        assert_eq!(image(16, 0).len(), 16 * 16 * 3);
    }

    #[test]
    fn png_round_trips_the_pixels() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(png_name(7));
        let rgb = image(24, 7);
        write_png(&p, 24, &rgb).unwrap();
        let back = ::image::open(&p).unwrap().to_rgb8();
        assert_eq!(back.dimensions(), (24, 24));
        assert_eq!(back.into_raw(), rgb);
        assert!(p.ends_with("img-007.png"));
    }

    /// The whole workload on the CPU: tiny Gemma 3 (SmolLM2's tokenizer, the test model) and
    /// the tiny random tower; both rows, the PNG files, the report's side-by-side lines.
    #[test]
    fn tiny_gemma3_on_the_cpu() {
        use crate::plan::SynthDType;
        use crate::shapes::Shape;
        use crate::synth::{SynthArgs, TokenizerSource, synth};
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("g3.gguf");
        let tok = TokenizerSource::Gguf(memra_engine::testing::real_model());
        synth(&SynthArgs::new(
            Shape::TinyGemma3,
            SynthDType::F32,
            model.clone(),
            tok,
        ))
        .unwrap();
        let hidden = load_model(&model).unwrap().config.embed_width();
        let mmproj = dir.path().join("mm.gguf");
        crate::synth_mmproj::synth_mmproj(&crate::synth_mmproj::SynthMmproj {
            shape: "tiny".into(),
            text_hidden: hidden,
            seed: 0,
            dtype: "f32".into(),
            out: mmproj.clone(),
        })
        .unwrap();
        let a = VisionArgs {
            model,
            mmproj,
            device: Device::Cpu,
            images: 3,
            runs: 2,
            run: "t".into(),
            shape: Some("tiny-gemma3".into()),
            dtype: Some("F32".into()),
            images_dir: Some(dir.path().join("img")),
        };
        let rows = run(&a).unwrap();
        assert_eq!(rows.len(), 2);
        let (e, t) = (&rows[0], &rows[1]);
        assert_eq!(
            (e.workload, e.unit.as_str(), e.runs),
            (Workload::VisionEncode, "images/s", 3)
        );
        assert_eq!(
            (t.workload, t.unit.as_str(), t.runs),
            (Workload::VisionTtft, "ms", 2)
        );
        assert!(e.value.unwrap() > 0.0 && t.value.unwrap() > 0.0);
        assert!(e.min.unwrap() <= e.max.unwrap() && t.min.unwrap() <= t.value.unwrap());
        // the tiny tower's 16 rows and the prompt's text around them
        assert_eq!(e.prompt, Some(16));
        assert!(t.prompt.unwrap() > 16 + 2, "{:?}", t.prompt);
        assert!(e.source.as_deref().unwrap().contains("64x64"));
        // the warm-up image and max(images, runs) timed ones
        for i in 0..4 {
            let p = dir.path().join("img").join(png_name(i));
            let back = ::image::open(&p).unwrap().to_rgb8().into_raw();
            assert_eq!(back, image(64, i as u64), "{}", p.display());
        }
        assert!(!dir.path().join("img").join(png_name(4)).exists());
        // memra's rows with a peer's of the same run table side by side
        let mut peer = vec![e.clone(), t.clone()];
        for r in &mut peer {
            r.engine = "llama.cpp".into();
            r.value = r.value.map(|v| v * 2.0);
        }
        let all: Vec<Row> = rows.iter().cloned().chain(peer).collect();
        let files = crate::report::render(&all, None).unwrap();
        let md = &files.iter().find(|f| f.0.ends_with("README.md")).unwrap().1;
        assert!(md.contains("| vision_encode, tiny-gemma3 F32 |"), "{md}");
        assert!(md.contains("0.50x"), "{md}");
        assert!(md.contains("| vision_ttft ms, a "), "{md}");
        // nothing to draw in decode.svg from a run of the vision rows alone
        assert!(!files.iter().any(|f| f.0.ends_with("decode.svg")), "{md}");
    }
}
