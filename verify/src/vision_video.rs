//! `memra-verify vision --family qwen2vl|qwen25vl|qwen3vl`, the video case: a video of 3 frames
//! (two frame groups, the last frame repeated) at 1.5 fps through the tower's video path
//! (`VisionTower::encode_video`, on the gate's device) against a reference ([`VideoRef`]):
//!
//! - the numpy reference's video path (verify/reference/qwenvit_reference.py: the processor's
//!   frame stacking and `grid_thw`, the whole video through the tower at once as HF runs it)
//!   within the tolerance; then, on the family's M-RoPE text model (`--family`'s tiny qwen2vl /
//!   qwen3vl), the video's positions equal to HF's `get_rope_index` for videos and one step's
//!   logits within the tolerance of verify/reference/qwenvl_text_reference.py's;
//! - or, for a tower on a CUDA device without python (`--reference none`), the CPU tower's
//!   video path (`encode_video_cpu`) within the CUDA tower's tolerance and a second encoding on
//!   the device bit-identical (the images' comparison, vision_rows.rs);
//!
//! and greedy tokens of a video prompt fed memra's rows vs the reference's: equal (on a CUDA
//! device also, informative, a CPU engine's fed memra's rows: the CUDA M-RoPE kernels at the
//! video's temporal positions; the positions themselves are the host's, from the spans).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Device, KvDtype};
use memra_engine::config::Arch;
use memra_engine::error::{Error, Result};
use memra_engine::loader::Model;
use memra_engine::models::random::random_weights;
use memra_engine::quant::DType;
use memra_engine::request::ValidRequest;
use memra_engine::testing::tiny_gguf::{gguf_meta, write_model};
use memra_engine::vision::video::{self, Clock, Layout};
use memra_engine::vision::{ImageTokens, MediaSpan, QwenKind, QwenParams, VisionTower, mrope};

use crate::vision_qwen::{main_rows, test_image};
use crate::vision_rows::{Against, on_device};
use crate::vision_text::{SOFT, VOCAB, config, f32s, step, text_reference};

/// The video's frames and the rate they are sent at (every frame kept).
pub const FRAMES: usize = 3;
pub const FPS: f64 = 1.5;
/// The video placeholder of the text check's vocabulary.
const VIDEO: u32 = 6;

/// What the video case measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VideoReport {
    pub frames: usize,
    pub groups: usize,
    /// The frames' input size and the video's rows.
    pub size: (usize, usize),
    pub tokens: usize,
    /// Qwen2-VL / Qwen2.5-VL: each group's temporal position; Qwen3-VL: empty (a span per
    /// group after its timestamp, `seconds`).
    pub times: Vec<u32>,
    pub seconds: Vec<f64>,
    /// What the rows were checked against: `numpy` (its video path), or `cpu tower` (the
    /// tower on a CUDA device against its CPU video path).
    pub reference: String,
    /// max |memra - ref| / max |ref| over the video's rows, and its largest allowed.
    pub rel_error: f32,
    pub tolerance: f32,
    /// Against the CPU tower: a second encoding on the device gave the same bits.
    pub repeat_equal: Option<bool>,
    /// The text model (an M-RoPE family's) against numpy: positions equal to HF's, logits'
    /// error.
    pub positions_equal: Option<bool>,
    pub text_rel_error: Option<f32>,
    /// Greedy tokens of the video prompt fed memra's rows equal those fed the reference's.
    pub tokens_equal: bool,
    /// On a device other than the CPU (informative: the GPU keeps its own arithmetic): a CPU
    /// engine's greedy tokens of the video prompt fed memra's rows equal the device's (the
    /// device's M-RoPE kernels at the video's temporal positions).
    pub cpu_tokens_equal: Option<bool>,
}

impl VideoReport {
    /// The gate's line for the video.
    pub fn summary(&self) -> String {
        let yes = |b: bool, y: &'static str, n: &'static str| if b { y } else { n };
        let against = match self.reference.as_str() {
            "numpy" => "the numpy reference",
            _ => "the CPU tower",
        };
        let mut then = String::new();
        if let Some(same) = self.repeat_equal {
            then += &format!(
                "; a second encoding {}",
                yes(same, "bit-identical", "DIFFERENT")
            );
        }
        if let (Some(p), Some(e)) = (self.positions_equal, self.text_rel_error) {
            let p = yes(p, "equal to", "DIFFERENT from");
            then += &format!("; text model positions {p} HF's, logits {e:.2e} apart");
        }
        then += &format!(
            "; greedy tokens {}",
            yes(self.tokens_equal, "equal", "DIFFERENT")
        );
        if let Some(same) = self.cpu_tokens_equal {
            let same = yes(same, "equal", "different");
            then += &format!(" (a CPU engine's, informative: {same})");
        }
        let (w, h) = self.size;
        format!(
            "vision: video of {} frames {w}x{h} ({} groups, {} tokens; times {:?}, timestamps \
             {:?}) vs {against}: {:.2e} of the largest value (tolerance {:.0e}){then}",
            self.frames,
            self.groups,
            self.tokens,
            self.times,
            self.seconds,
            self.rel_error,
            self.tolerance,
        )
    }
}

/// What the video's rows are checked against.
#[derive(Clone, Copy)]
pub enum VideoRef<'a> {
    /// The numpy reference's video path (python), and the family's M-RoPE text model against
    /// the numpy text reference: positions (HF's rule), logits.
    Numpy { python: &'a str, mmproj: &'a Path },
    /// The CPU tower's video path (`encode_video_cpu`), for a tower on a CUDA device: encoded
    /// twice with the same bits.
    CpuTower,
}

/// What the case needs from the gate.
pub struct VideoArgs<'a> {
    pub reference: VideoRef<'a>,
    pub tower: &'a VisionTower,
    /// The gate's text model (each call a fresh copy: an engine owns its model), and its
    /// engines' device.
    pub model: &'a dyn Fn() -> Result<Model>,
    pub device: Device,
    pub max_tokens: usize,
    pub dir: &'a Path,
}

/// Runs the case; `failures` gets what failed against `tol`.
pub fn check(a: VideoArgs<'_>, tol: f32, failures: &mut Vec<String>) -> Result<VideoReport> {
    let q = a
        .tower
        .qwen_params()
        .ok_or_else(|| Error::Input("the video case is the Qwen ViT's".into()))?;
    let f = q.factor();
    let s = a.tower.image_size();
    let (w, h) = a
        .tower
        .input_size(s + 2 * f, s.saturating_sub(3 * f).max(f))?;
    let frames: Vec<Vec<u8>> = (0..FRAMES)
        .map(|k| test_image(w, h, 20 + k as u32))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(|v| &v[..]).collect();
    let clock = Clock {
        indices: (0..FRAMES).collect(),
        fps: FPS,
        sampled_fps: FPS,
    };
    let lay = video::layout(q.kind, &clock, q.tokens_per_second);
    let grid = a.tower.grid_for(w, h);
    let mut rep = VideoReport {
        frames: FRAMES,
        groups: video::pairs(FRAMES).len(),
        size: (w, h),
        tolerance: tol,
        ..Default::default()
    };
    match &lay {
        Layout::OneSpan { times } => rep.times = times.clone(),
        Layout::PerGroup { seconds } => rep.seconds = seconds.clone(),
    }
    let item = |_| "video".to_string();
    let (ours, theirs) = match a.reference {
        VideoRef::Numpy { python, mmproj } => {
            let ours = a.tower.encode_video(w, h, &refs)?;
            let theirs = reference(python, mmproj, &frames, (w, h), a.dir)?;
            let cmp = Against {
                what: "the tower's rows differ from the numpy reference's",
                item: &item,
                tol,
            };
            rep.rel_error = cmp.errors(&[&ours], &[&theirs], failures)[0];
            rep.reference = "numpy".into();
            (ours, theirs)
        }
        VideoRef::CpuTower => {
            let theirs = a.tower.encode_video_cpu(w, h, &refs)?;
            let cmp = Against {
                what: "the CUDA tower's rows differ from the CPU tower's",
                item: &item,
                tol,
            };
            let encode = || Ok(vec![a.tower.encode_video(w, h, &refs)?]);
            let d = on_device(&encode, &[&theirs], "video", &cmp, failures)?;
            (rep.rel_error, rep.repeat_equal) = (d.errors[0], Some(d.repeat_equal));
            rep.reference = "cpu tower".into();
            let ours = d.rows.into_iter().next().unwrap_or_default();
            (ours, theirs)
        }
    };
    rep.tokens = ours.len() / a.tower.out_width();
    let vl = (a.model)()?.config.arch;
    if let (VideoRef::Numpy { python, .. }, true) = (a.reference, vl.is_vl()) {
        let (same, e) = text(python, vl, q, &lay, &ours, grid, a.dir)?;
        if !same {
            failures.push(format!(
                "video: {} M-RoPE positions differ from HF's get_rope_index",
                vl.gguf_name()
            ));
        }
        if e.is_nan() || e > tol {
            failures.push(format!(
                "video: {} logits differ from the numpy text reference by {e:.2e} of the \
                 largest (tolerance {tol:.0e})",
                vl.gguf_name()
            ));
        }
        (rep.positions_equal, rep.text_rel_error) = (Some(same), Some(e));
    }
    if ours.len() != theirs.len() {
        // Failed above (an infinite error): no prompt holds both.
        return Ok(rep);
    }
    let fed = tokens(&a, &lay, grid, &ours, &theirs)?;
    (rep.tokens_equal, rep.cpu_tokens_equal) = (fed.equal, fed.cpu_engine);
    if !rep.tokens_equal {
        failures.push("video: greedy tokens differ fed memra's rows and the reference's".into());
    }
    Ok(rep)
}

/// The numpy reference's rows of the video.
fn reference(
    python: &str,
    mmproj: &Path,
    frames: &[Vec<u8>],
    (w, h): (usize, usize),
    dir: &Path,
) -> Result<Vec<f32>> {
    let mut files = Vec::with_capacity(frames.len());
    for (k, f) in frames.iter().enumerate() {
        let p = dir.join(format!("video{k}.rgb"));
        std::fs::write(&p, f).map_err(|e| Error::io(&p, e))?;
        files.push(p.display().to_string());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/qwenvit_reference.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(mmproj)
        .arg(format!("{}:{w}x{h}", files.join(",")))
        .output()
        .map_err(|e| Error::io(python, e))?;
    if !out.status.success() {
        return Err(Error::Input(format!(
            "the numpy reference failed on the video: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let p = format!("{}.ref.f32", files[0]);
    Ok(f32s(&std::fs::read(&p).map_err(|e| Error::io(&p, e))?))
}

/// A prompt around the video: 3 text tokens, the video (one span, or per group 4 tokens
/// standing for its timestamp and its span), 4 text tokens; its ids and spans. `text(k, n)`
/// gives text ids, `expand(rows)` a span's ids and the offset of its first row.
fn prompt(
    lay: &Layout,
    grid: (usize, usize),
    rows: &Arc<[f32]>,
    width: usize,
    text: impl Fn(usize, usize) -> Vec<u32>,
    expand: impl Fn(usize) -> (Vec<u32>, usize),
) -> (Vec<u32>, Vec<MediaSpan>) {
    let per = grid.0 * grid.1;
    let mut ids = text(0, 3);
    let mut media = Vec::new();
    let mut span = |ids: &mut Vec<u32>, embeds: Arc<[f32]>, times: Vec<u32>| {
        let (toks, first) = expand(embeds.len() / width);
        media.push(MediaSpan {
            start: ids.len() + first,
            embeds,
            width,
            hash: media.len() as u128 + 1,
            grid: Some(grid),
            times,
        });
        ids.extend(toks);
    };
    match lay {
        Layout::OneSpan { times } => span(&mut ids, rows.clone(), times.clone()),
        Layout::PerGroup { seconds } => {
            for g in 0..seconds.len() {
                ids.extend(text(g + 1, 4));
                let part = Arc::from(&rows[g * per * width..(g + 1) * per * width]);
                span(&mut ids, part, Vec::new());
            }
        }
    }
    ids.extend(text(9, 4));
    (ids, media)
}

/// The video prompt's positions and logits on the family's tiny text model against
/// qwenvl_text_reference.py: (positions equal, max |memra - ref| / max |ref|).
fn text(
    python: &str,
    arch: Arch,
    q: &QwenParams,
    lay: &Layout,
    rows: &[f32],
    grid: (usize, usize),
    dir: &Path,
) -> Result<(bool, f32)> {
    let cfg = config(arch, q);
    cfg.validate()?;
    let width = cfg.embed_width();
    let w = random_weights(&cfg, 29, DType::F32)?;
    let gguf = dir.join("video_text.gguf");
    write_model(&w, &gguf_meta(&cfg), &gguf)?;
    let rows: Arc<[f32]> = Arc::from(rows);
    let text = |k: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|j| 10 + ((41 * (k * 7 + j)) % (VOCAB - 10)) as u32)
            .collect()
    };
    let (ids, media) = prompt(lay, grid, &rows, width, text, |n| (vec![VIDEO; n], 0));
    let embeds = dir.join("video_text.rows.f32");
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&embeds, bytes).map_err(|e| Error::io(&embeds, e))?;
    let m = q.merge;
    let rule = match q.kind {
        QwenKind::Qwen2Vl => "qwen2vl",
        QwenKind::Qwen25Vl => "qwen25vl",
        QwenKind::Qwen3Vl => "qwen3vl",
    };
    let groups = video::pairs(FRAMES).len();
    let logits = dir.join("video_text.logits.f32");
    let case = serde_json::json!({
        "ids": ids,
        "image_token_id": SOFT,
        "video_token_id": VIDEO,
        "video_grid_thw": [[groups, grid.0 * m, grid.1 * m]],
        "second_per_grid_ts": [video::TEMPORAL_PATCH as f64 / FPS],
        "tokens_per_second": q.tokens_per_second,
        "rule": rule,
        "spatial_merge_size": m,
        "embeds": embeds,
        "logits": logits,
    });
    let theirs = text_reference(
        python,
        &gguf,
        dir,
        "video_text",
        serde_json::json!([case]),
        " on the video",
    )?;
    let pos = mrope::positions(&media, 0, ids.len());
    let want = &theirs["cases"][0]["positions"];
    let same = (0..3).all(|axis| {
        let got: Vec<u64> = pos.iter().map(|p| p[axis] as u64).collect();
        want[axis].as_array().is_some_and(|v| {
            v.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>() == Some(got)
        })
    });
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 64,
        block_size: 16,
        kv_dtype: KvDtype::F32,
    };
    let mut b = CpuBackend::new(w, &opts)?;
    let mine: Vec<f32> = step(&mut b, &ids, &media, pos)?
        .into_iter()
        .flatten()
        .collect();
    let r = f32s(&std::fs::read(&logits).map_err(|e| Error::io(&logits, e))?);
    if r.len() != mine.len() {
        return Err(Error::Input(format!(
            "the text reference gave {} logits for the video, memra {}",
            r.len(),
            mine.len()
        )));
    }
    Ok((same, crate::vision_rows::rel_error(&mine, &r)))
}

/// What the video prompt gave.
struct Fed {
    /// Greedy tokens fed memra's rows equal those fed the reference's.
    equal: bool,
    /// On a device other than the CPU (informative): a CPU engine's greedy tokens fed memra's
    /// rows equal the device's.
    cpu_engine: Option<bool>,
}

/// Greedy tokens of the video prompt on the gate's model (its vocabulary's video tokens) fed
/// memra's rows vs the reference's (another hash, so no prefix-cache hit between them); on a
/// device other than the CPU, memra's rows on a CPU engine too.
fn tokens(
    a: &VideoArgs<'_>,
    lay: &Layout,
    grid: (usize, usize),
    ours: &[f32],
    theirs: &[f32],
) -> Result<Fed> {
    let m = (a.model)()?;
    let width = a.tower.out_width();
    let take = m.config.embed_width();
    let vocab = m.config.vocab as u32;
    let toks = ImageTokens::from_tokenizer(&m.tokenizer);
    let text = |k: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|j| (100 + 37 * (k * 11 + j)) as u32 % vocab)
            .collect()
    };
    let greedy = |rows: &[f32], salt: u128, device: Device| -> Result<Vec<u32>> {
        let rows: Arc<[f32]> = Arc::from(main_rows(rows, width, take));
        let (ids, mut media) = prompt(lay, grid, &rows, take, text, |n| toks.expand_video(n));
        media.iter_mut().for_each(|m| m.hash ^= salt);
        let longest = ids.len() + 8;
        let e = crate::vision::engine((a.model)()?, device, 64.max(longest))?;
        let r = ValidRequest {
            media,
            ..memra_engine::testing::text_request(ids, a.max_tokens)
        };
        Ok(crate::vision::run(&e, r)?.0.iter().map(|t| t.0).collect())
    };
    let mine = greedy(ours, 0, a.device)?;
    let cpu_engine = match a.device {
        Device::Cpu => None,
        _ => Some(greedy(ours, 0, Device::Cpu)? == mine),
    };
    Ok(Fed {
        equal: greedy(theirs, 1 << 100, a.device)? == mine,
        cpu_engine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::{CUDA_TOLERANCE, RefChoice, VisionArgs};
    use crate::vision_qwen::Family;

    /// The CPU-tower case (what runs on a CUDA device without python) on the CPU, where both
    /// sides are the CPU tower: every step of it runs (on a GPU only the device's rows and the
    /// CPU engine's comparison differ), with a zero error, the same bits twice, equal tokens.
    #[test]
    fn the_cpu_tower_case_runs_through() {
        let dir = tempfile::tempdir().unwrap();
        for family in [Family::Qwen25vl, Family::Qwen3vl] {
            let a = VisionArgs {
                device: Device::Cpu,
                mmproj: None,
                family,
                model: None,
                python: "/nonexistent/python".into(),
                reference: RefChoice::None,
                images: 1,
                prompts: 1,
                max_tokens: 4,
                tolerance: 1e-4,
                cuda_tolerance: CUDA_TOLERANCE,
            };
            let model = || crate::vision::model(&a);
            let path = dir.path().join("mm.gguf");
            family
                .write_tiny(model().unwrap().config.hidden, &path)
                .unwrap();
            let tower = VisionTower::open(&path).unwrap();
            let args = VideoArgs {
                reference: VideoRef::CpuTower,
                tower: &tower,
                model: &model,
                device: Device::Cpu,
                max_tokens: 4,
                dir: dir.path(),
            };
            let mut f = Vec::new();
            let r = check(args, CUDA_TOLERANCE, &mut f).unwrap();
            assert!(f.is_empty(), "{f:?}");
            assert_eq!(r.reference, "cpu tower");
            assert_eq!((r.groups, r.tokens), (2, 48), "{r:?}");
            assert_eq!(r.rel_error, 0.0);
            assert_eq!(r.tolerance, CUDA_TOLERANCE);
            assert_eq!(r.repeat_equal, Some(true));
            assert!(r.tokens_equal);
            // Neither the numpy text reference nor a second engine ran.
            assert_eq!((r.positions_equal, r.cpu_tokens_equal), (None, None));
            let line = r.summary();
            assert!(line.starts_with("vision: video of 3 frames"), "{line}");
            assert!(
                line.ends_with(
                    "vs the CPU tower: 0.00e0 of the largest value (tolerance 2e-3); a second \
                     encoding bit-identical; greedy tokens equal"
                ),
                "{line}"
            );
        }
    }
}
