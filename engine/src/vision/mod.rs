//! Vision towers: an image becomes rows of soft-token embeddings that replace the embeddings of
//! the image's placeholder tokens in the prompt (docs/SERVING.md, "Images and video").
//!
//! Two families, loaded from llama.cpp's `mmproj` GGUF layout: Gemma 3's, a SigLIP ViT and its
//! pooling projector (average pool of the patch grid, soft-embedding RMSNorm, projection to the
//! text width; [`mmproj`], [`siglip`]), square images of one size; and the Qwen2-VL /
//! Qwen2.5-VL / Qwen3-VL ViT (2D RoPE, window attention, the 2 x 2 patch merger;
//! [`qwen_mmproj`], [`qwenvit`]), images of any aspect ratio resized to multiples of 28 or 32
//! pixels ([`VisionTower::input_size`]), one token per merged 2 x 2 block of patches. The tower
//! runs beside the engine loop and never inside a step, so it cannot change a text row's bits:
//! on the CPU in f32 (the reference implementation), or, after [`VisionTower::place`] on a
//! CUDA device, on the GPU (backend/cuda/vision.rs, vision_qwen.rs; checked against the CPU
//! within a tolerance: docs/VERIFY.md). A tower's rows are the same bits every time on its device
//! class; the content hash says which tower computed them.
//!
//! What reaches the engine is a [`MediaSpan`]: where the image's rows sit in the prompt, their
//! values and a content hash that the prefix cache mixes into the hashes of the blocks the span
//! touches (prefix_cache.rs).
//!
//! The Qwen ViT also takes video, as the models do ([`video`]): frames two at a time through
//! the temporal patch ([`VisionTower::encode_video`]), a video one span of frame groups
//! (Qwen2-VL, Qwen2.5-VL: [`MediaSpan::times`] places them in time) or a span per group after
//! its timestamp text (Qwen3-VL). Gemma 3's tower has no video path: its frames are images.

pub mod mmproj;
pub mod mrope;
pub mod qwen_mmproj;
pub mod qwenvit;
#[cfg(any(test, feature = "test-util"))]
pub mod random;
mod siglip;
pub mod video;
mod vit_ops;

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::backend::Device;
use crate::backend::cuda::vision::CudaTower;
use crate::backend::cuda::vision_qwen::CudaQwenTower;
use crate::error::{Error, Result};
pub use mmproj::TowerParams;
pub use qwenvit::{QwenKind, QwenParams, QwenWeights};
pub use siglip::TowerWeights;

/// Rows of precomputed embeddings at consecutive prompt positions (one image, or one video's
/// frame groups).
#[derive(Clone, Debug, PartialEq)]
pub struct MediaSpan {
    /// Prompt index of the first row.
    pub start: usize,
    /// `rows x width` values, row-major.
    pub embeds: Arc<[f32]>,
    pub width: usize,
    /// Content hash (of the tower's identity and the pixels it saw).
    pub hash: u128,
    /// The image's token grid `(rows, cols)`, rows in raster order ([`VisionTower::grid_for`]):
    /// where an M-RoPE text model (qwen2vl, qwen3vl) places them ([`mrope`]), which refuses a
    /// span without one. `None`: the tokens are one row. A video's: each frame group's.
    pub grid: Option<(usize, usize)>,
    /// A video's frame groups (Qwen2-VL, Qwen2.5-VL: [`video::Layout::OneSpan`]): the temporal
    /// position of each, from the span's text position (HF's `t_index`), its rows `grid` tokens
    /// group after group. Empty: an image (one group at 0). Part of the prefix-cache key.
    pub times: Vec<u32>,
}

impl MediaSpan {
    pub fn rows(&self) -> usize {
        self.embeds.len() / self.width.max(1)
    }

    /// Frame groups: a video's [`MediaSpan::times`], or the one of an image.
    pub fn groups(&self) -> usize {
        self.times.len().max(1)
    }

    /// Positions the text after the span moves on by: one past its largest M-RoPE offset
    /// (`max(times, rows - 1, cols - 1) + 1` on its grid; HF's `st_idx` after it).
    pub fn advance(&self) -> usize {
        let (r, c) = self.grid.unwrap_or((1, self.rows()));
        let t = self.times.iter().max().copied().unwrap_or(0) as usize;
        t.max(r.saturating_sub(1)).max(c.saturating_sub(1)) + 1
    }

    /// Prompt indices `start..start + rows`.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.rows()
    }
}

/// Checks that `spans` lie inside a prompt of `n` tokens, in order, without overlap, each with
/// `width` values per row (the model's input embedding width) and at least one row, its grid
/// (if any) holding its rows (each frame group's), its times ([`check_times`]) in range.
pub fn check_spans(spans: &[MediaSpan], n: usize, width: usize) -> Result<()> {
    let mut end = 0;
    for (i, s) in spans.iter().enumerate() {
        if let Some((r, c)) = s.grid
            && r.checked_mul(c).and_then(|rc| rc.checked_mul(s.groups())) != Some(s.rows())
        {
            return Err(Error::Input(format!(
                "image {i}: {} frame groups of a grid of {r} x {c} tokens for {} rows",
                s.groups(),
                s.rows()
            )));
        }
        check_times(s.grid, &s.times).map_err(|e| Error::Input(format!("video {i}: {e}")))?;
        if s.width != width || s.embeds.is_empty() || s.embeds.len() % width != 0 {
            return Err(Error::Input(format!(
                "image {i}: {} embedding values of width {} for a model of width {width}",
                s.embeds.len(),
                s.width
            )));
        }
        if s.start < end || s.range().end > n {
            return Err(Error::Input(format!(
                "image {i}: rows {:?} overlap another image or pass the prompt's {n} tokens",
                s.range()
            )));
        }
        end = s.range().end;
    }
    Ok(())
}

/// Whether a video's temporal positions (`times`, its frame groups of `grid` tokens each)
/// stay at or below its rows' sequence positions (so the text after it never runs ahead of
/// them, and tables of the context's positions hold every M-RoPE position:
/// `backend::check_mrope`): group `g` at most `g` groups of rows in, and the text after it
/// moved on by at most its rows ([`MediaSpan::advance`]). Only Qwen2.5-VL's scaled times can
/// fail it: frames of a few tokens at a low frame rate. An image (no times) passes.
pub fn check_times(grid: Option<(usize, usize)>, times: &[u32]) -> std::result::Result<(), String> {
    if times.is_empty() {
        return Ok(());
    }
    let Some((r, c)) = grid else {
        return Err("frame groups without a token grid".into());
    };
    let per = r * c;
    if let Some((g, &t)) = times
        .iter()
        .enumerate()
        .find(|&(g, &t)| t as usize > g * per)
    {
        return Err(format!(
            "frame group {g} at temporal position {t} runs past its {per}-token frames (raise \
             the frame rate or the frame size)"
        ));
    }
    let last = times.iter().max().copied().unwrap_or(0) as usize;
    let advance = last.max(r.saturating_sub(1)).max(c.saturating_sub(1)) + 1;
    if advance > times.len() * per {
        return Err(format!(
            "its temporal positions span {advance} for {} tokens (raise the frame rate or the \
             frame size)",
            times.len() * per
        ));
    }
    Ok(())
}

/// The tokens that stand for an image in the prompt: an optional opening token, one
/// placeholder per embedding row (its embedding is replaced), an optional closing token; a
/// video's placeholder where the vocabulary has one (Qwen's `<|video_pad|>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTokens {
    pub open: Option<u32>,
    pub soft: u32,
    pub close: Option<u32>,
    /// A video row's placeholder (else `soft`).
    pub video: Option<u32>,
}

impl ImageTokens {
    /// Qwen's `<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>` where the vocabulary
    /// has `<|image_pad|>`; else Gemma 3's: `<start_of_image>`, `<image_soft_token>`,
    /// `<end_of_image>` where the vocabulary has them. A vocabulary without a soft token uses
    /// the opening token (or id 0) as the placeholder: its embedding is replaced, so only the
    /// cache key (which hashes the image) sees it.
    pub fn from_tokenizer(tok: &crate::tokenizer::Tokenizer) -> ImageTokens {
        if let Some(soft) = tok.token_id("<|image_pad|>") {
            return ImageTokens {
                open: tok.token_id("<|vision_start|>"),
                soft,
                close: tok.token_id("<|vision_end|>"),
                video: tok.token_id("<|video_pad|>"),
            };
        }
        let open = tok.token_id("<start_of_image>");
        let close = tok.token_id("<end_of_image>");
        let soft = tok
            .token_id("<image_soft_token>")
            .or(open)
            .unwrap_or_default();
        ImageTokens {
            open,
            soft,
            close,
            video: None,
        }
    }

    /// The ids of one image of `rows` embeddings, and the offset of its first row in them.
    pub fn expand(&self, rows: usize) -> (Vec<u32>, usize) {
        self.expand_with(self.soft, rows)
    }

    /// The ids of a video span of `rows` embeddings (`<|vision_start|>`, a `<|video_pad|>` per
    /// row, `<|vision_end|>`), and the offset of its first row in them.
    pub fn expand_video(&self, rows: usize) -> (Vec<u32>, usize) {
        self.expand_with(self.video.unwrap_or(self.soft), rows)
    }

    fn expand_with(&self, soft: u32, rows: usize) -> (Vec<u32>, usize) {
        let mut v = Vec::with_capacity(rows + 2);
        v.extend(self.open);
        let first = v.len();
        v.extend(std::iter::repeat_n(soft, rows));
        v.extend(self.close);
        (v, first)
    }
}

/// How a tower's preprocessing resizes an image to its input size (the family's processor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    /// Gemma 3's processor: bilinear.
    Bilinear,
    /// Qwen's processor: bicubic.
    Bicubic,
}

/// A tower on a CUDA device.
enum DeviceTower {
    Siglip(Box<CudaTower>),
    Qwen(Box<CudaQwenTower>),
}

impl DeviceTower {
    fn label(&self) -> String {
        match self {
            DeviceTower::Siglip(t) => t.label(),
            DeviceTower::Qwen(t) => t.label(),
        }
    }

    /// The rows of an image of `w x h` pixels from its input values.
    fn forward(&self, w: usize, h: usize, px: &[f32]) -> Result<Vec<f32>> {
        match self {
            DeviceTower::Siglip(t) => t.forward(px),
            DeviceTower::Qwen(t) => t.forward(w, h, px),
        }
    }

    /// The rows of a video's frame group (the Qwen ViT only).
    fn forward_pair(&self, w: usize, h: usize, px: [&[f32]; 2]) -> Result<Vec<f32>> {
        match self {
            DeviceTower::Siglip(_) => Err(Error::Unsupported(
                "Gemma 3's tower has no video path".into(),
            )),
            DeviceTower::Qwen(t) => t.forward_pair(w, h, px),
        }
    }
}

/// A tower's family, shape and f32 weights.
enum Family {
    Siglip(TowerParams, TowerWeights),
    Qwen(QwenParams, QwenWeights),
}

/// A loaded tower: its shape and f32 weights, and where it runs.
pub struct VisionTower {
    family: Family,
    /// Hash of the file's tensors and shape.
    id: [u8; 32],
    /// `id`, and the device tower's name when there is one: part of every image's content hash
    /// (rows of the CPU and the CUDA tower differ, so they never share one).
    key: [u8; 32],
    /// The tower on a CUDA device ([`VisionTower::place`]); `None`: the CPU.
    cuda: Option<DeviceTower>,
}

impl std::fmt::Debug for VisionTower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("VisionTower");
        match &self.family {
            Family::Siglip(p, _) => d.field("params", p),
            Family::Qwen(p, _) => d.field("params", p),
        };
        d.field("runs_on", &self.runs_on()).finish()
    }
}

impl VisionTower {
    /// Loads an mmproj GGUF file (llama.cpp's layout; projectors `gemma3`, `qwen2vl_merger`,
    /// `qwen2.5vl_merger`, `qwen3vl_merger`).
    pub fn open(path: &std::path::Path) -> Result<VisionTower> {
        let g = crate::formats::gguf::Gguf::open(path)?;
        match g.get_str("clip.projector_type") {
            Some("gemma3") => {
                let (params, weights) = mmproj::load(&g)?;
                Ok(Self::new(params, weights))
            }
            Some(s) if QwenKind::from_projector(s).is_some() => {
                let kind = QwenKind::from_projector(s).unwrap_or(QwenKind::Qwen25Vl);
                let (params, weights) = qwen_mmproj::load(&g, kind)?;
                Ok(Self::new_qwen(params, weights))
            }
            other => Err(Error::Unsupported(format!(
                "mmproj projector {other:?}: supported are Gemma 3's (`gemma3`) and the Qwen \
                 ViT's (`qwen2vl_merger`, `qwen2.5vl_merger`, `qwen3vl_merger`)"
            ))),
        }
    }

    /// Gemma 3's tower.
    pub fn new(params: TowerParams, weights: TowerWeights) -> VisionTower {
        let id = weights.digest(&params);
        Self::with(Family::Siglip(params, weights), id)
    }

    /// A Qwen ViT.
    pub fn new_qwen(params: QwenParams, weights: QwenWeights) -> VisionTower {
        let id = weights.digest(&params);
        Self::with(Family::Qwen(params, weights), id)
    }

    fn with(family: Family, id: [u8; 32]) -> VisionTower {
        VisionTower {
            family,
            id,
            key: id,
            cuda: None,
        }
    }

    /// Runs the tower where a model on `device` runs: on CUDA device `n` for `cuda:N` (and for
    /// `auto` when CUDA is there: device 0), else on the CPU. On a CUDA device the weights are
    /// uploaded now and one image's activations allocated (before a backend sizes its KV cache
    /// from the free memory; a Qwen ViT's for its largest image). A tower the CUDA kernels do
    /// not cover (a head size without an attention kernel) is an `Unsupported` error and stays
    /// on the CPU.
    pub fn place(&mut self, device: Device) -> Result<()> {
        let n = match device {
            Device::Cpu => None,
            Device::Auto => crate::backend::cuda::cuda_available().then_some(0),
            Device::Cuda(n) => Some(n),
        };
        // Until the new tower stands, the tower runs on the CPU (an error leaves it there).
        self.cuda = None;
        self.key = self.id;
        self.cuda = match (n, &self.family) {
            (None, _) => None,
            (Some(n), Family::Qwen(p, w)) => {
                let gpu = crate::backend::cuda::Gpu::open(n)?;
                Some(DeviceTower::Qwen(Box::new(CudaQwenTower::new(gpu, p, w)?)))
            }
            (Some(n), Family::Siglip(p, w)) => {
                let gpu = crate::backend::cuda::Gpu::open(n)?;
                Some(DeviceTower::Siglip(Box::new(CudaTower::new(gpu, p, w)?)))
            }
        };
        self.key = match &self.cuda {
            None => self.id,
            Some(t) => {
                let mut h = Sha256::new();
                h.update(self.id);
                h.update(b"cuda tower ");
                h.update(t.label().as_bytes());
                h.finalize().into()
            }
        };
        Ok(())
    }

    /// Where [`VisionTower::encode`] runs: `cpu`, or the CUDA device (`cuda:0 (compute_90a)`).
    pub fn runs_on(&self) -> String {
        self.cuda.as_ref().map_or("cpu".into(), |t| t.label())
    }

    /// Gemma 3's tower shape (`None` for a Qwen ViT).
    pub fn params(&self) -> Option<&TowerParams> {
        match &self.family {
            Family::Siglip(p, _) => Some(p),
            Family::Qwen(..) => None,
        }
    }

    /// The Qwen ViT's shape (`None` for Gemma 3's tower).
    pub fn qwen_params(&self) -> Option<&QwenParams> {
        match &self.family {
            Family::Qwen(p, _) => Some(p),
            Family::Siglip(..) => None,
        }
    }

    /// A square RGB image side [`VisionTower::encode`] takes as is (Gemma 3: the only size).
    pub fn image_size(&self) -> usize {
        match &self.family {
            Family::Siglip(p, _) => p.image_size,
            Family::Qwen(p, _) => p.image_size,
        }
    }

    /// The `(width, height)` an image of `w x h` pixels is resized to before encoding: the
    /// square of Gemma 3's tower; the Qwen ViT's multiples of `patch x merge` within its pixel
    /// bounds, aspect ratio kept ([`QwenParams::input_size`]).
    pub fn input_size(&self, w: usize, h: usize) -> Result<(usize, usize)> {
        match &self.family {
            Family::Siglip(p, _) => Ok((p.image_size, p.image_size)),
            Family::Qwen(p, _) => p.input_size(w, h),
        }
    }

    /// How the image is resized to [`VisionTower::input_size`].
    pub fn resample(&self) -> Resample {
        match &self.family {
            Family::Siglip(..) => Resample::Bilinear,
            Family::Qwen(..) => Resample::Bicubic,
        }
    }

    /// Embedding rows of an image of `w x h` pixels (an input size).
    pub fn tokens_for(&self, w: usize, h: usize) -> usize {
        match &self.family {
            Family::Siglip(p, _) => p.tokens_per_image(),
            Family::Qwen(p, _) => p.tokens(w, h),
        }
    }

    /// The token grid `(rows, cols)` of an image of `w x h` pixels (an input size), rows in
    /// raster order: the Qwen ViT's merged patches (`h / (patch * merge)` by `w / (patch *
    /// merge)`); Gemma 3's pooled square.
    pub fn grid_for(&self, w: usize, h: usize) -> (usize, usize) {
        match &self.family {
            Family::Siglip(p, _) => {
                let k = p.grid() / p.pool.max(1);
                (k, k)
            }
            Family::Qwen(p, _) => p.grid(w, h),
        }
    }

    /// Embedding rows of a square image of [`VisionTower::image_size`].
    pub fn tokens_per_image(&self) -> usize {
        let s = self.image_size();
        self.tokens_for(s, s)
    }

    /// Width of an embedding row: the text model's hidden size (Qwen3-VL with deepstack
    /// mergers: that times one plus their number, llama.cpp's layout).
    pub fn out_width(&self) -> usize {
        match &self.family {
            Family::Siglip(p, _) => p.text_hidden,
            Family::Qwen(p, _) => p.out_width(),
        }
    }

    /// The content hash of a square image of [`VisionTower::image_size`].
    pub fn hash(&self, rgb: &[u8]) -> u128 {
        let s = self.image_size();
        self.hash_image(s, s, rgb)
    }

    /// The content hash of an image as this tower sees it (`w x h` RGB pixels, an input size).
    pub fn hash_image(&self, w: usize, h: usize, rgb: &[u8]) -> u128 {
        let mut hs = Sha256::new();
        hs.update(self.key);
        hs.update((w as u64).to_le_bytes());
        hs.update((h as u64).to_le_bytes());
        hs.update((rgb.len() as u64).to_le_bytes());
        hs.update(rgb);
        let d = hs.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        u128::from_le_bytes(b)
    }

    /// The tower's input for a square `rgb` of [`VisionTower::image_size`].
    pub fn pixels(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let s = self.image_size();
        self.pixels_image(s, s, rgb)
    }

    /// The tower's input for `rgb` (`w x h` pixels, RGB, row-major, an input size):
    /// channel-major `[3][h][w]` values `(x / 255 - mean[c]) / std[c]`.
    pub fn pixels_image(&self, w: usize, h: usize, rgb: &[u8]) -> Result<Vec<f32>> {
        let (iw, ih) = self.input_size(w, h)?;
        if (iw, ih) != (w, h) || rgb.len() != w * h * 3 {
            return Err(Error::Input(format!(
                "the tower takes a {w}x{h} image as {iw}x{ih} RGB ({} bytes), got {} bytes",
                iw * ih * 3,
                rgb.len()
            )));
        }
        let (m, d) = match &self.family {
            Family::Siglip(p, _) => (p.mean, p.std),
            Family::Qwen(p, _) => (p.mean, p.std),
        };
        let n = w * h;
        let mut out = vec![0f32; 3 * n];
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                out[c * n + i] = (px[c] as f32 / 255.0 - m[c]) / d[c];
            }
        }
        Ok(out)
    }

    /// The embedding rows (`tokens_per_image x out_width`) of a square RGB image of
    /// [`VisionTower::image_size`], on the tower's device ([`VisionTower::runs_on`]).
    pub fn encode(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let s = self.image_size();
        self.encode_image(s, s, rgb)
    }

    /// The embedding rows (`tokens_for(w, h) x out_width`) of a `w x h` RGB image of an input
    /// size ([`VisionTower::input_size`]), on the tower's device.
    pub fn encode_image(&self, w: usize, h: usize, rgb: &[u8]) -> Result<Vec<f32>> {
        let px = self.pixels_image(w, h, rgb)?;
        match &self.cuda {
            Some(t) => t.forward(w, h, &px),
            None => Ok(self.forward_cpu(w, h, &px)),
        }
    }

    /// [`VisionTower::encode`] on the CPU (the f32 reference), wherever the tower runs.
    pub fn encode_cpu(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let s = self.image_size();
        self.encode_image_cpu(s, s, rgb)
    }

    /// [`VisionTower::encode_image`] on the CPU (the f32 reference), wherever the tower runs.
    pub fn encode_image_cpu(&self, w: usize, h: usize, rgb: &[u8]) -> Result<Vec<f32>> {
        let px = self.pixels_image(w, h, rgb)?;
        Ok(self.forward_cpu(w, h, &px))
    }

    fn forward_cpu(&self, w: usize, h: usize, px: &[f32]) -> Vec<f32> {
        match &self.family {
            Family::Siglip(p, wt) => siglip::forward(p, wt, px),
            Family::Qwen(p, wt) => qwenvit::forward(p, wt, w, h, px),
        }
    }

    /// Whether the tower has a video path ([`VisionTower::encode_video`]): the Qwen ViT's.
    pub fn takes_video(&self) -> bool {
        matches!(self.family, Family::Qwen(..))
    }

    /// The content hash of a video as this tower sees it: its frames (`w x h` RGB each, an
    /// input size) in order.
    pub fn hash_video(&self, w: usize, h: usize, frames: &[&[u8]]) -> u128 {
        let mut hs = Sha256::new();
        hs.update(self.key);
        hs.update(b"video");
        hs.update((w as u64).to_le_bytes());
        hs.update((h as u64).to_le_bytes());
        hs.update((frames.len() as u64).to_le_bytes());
        for f in frames {
            hs.update((f.len() as u64).to_le_bytes());
            hs.update(f);
        }
        let d = hs.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        u128::from_le_bytes(b)
    }

    /// The embedding rows of a video's frames (`w x h` RGB each, an input size; at least one),
    /// on the tower's device: its frame groups' rows one after another ([`video::pairs`]: frames
    /// `2k`, `2k + 1`, the last repeated for an odd count), each `tokens_for(w, h)` rows. The
    /// Qwen ViT only.
    pub fn encode_video(&self, w: usize, h: usize, frames: &[&[u8]]) -> Result<Vec<f32>> {
        self.video_rows(w, h, frames, self.cuda.as_ref())
    }

    /// [`VisionTower::encode_video`] on the CPU (the f32 reference), wherever the tower runs.
    pub fn encode_video_cpu(&self, w: usize, h: usize, frames: &[&[u8]]) -> Result<Vec<f32>> {
        self.video_rows(w, h, frames, None)
    }

    fn video_rows(
        &self,
        w: usize,
        h: usize,
        frames: &[&[u8]],
        dev: Option<&DeviceTower>,
    ) -> Result<Vec<f32>> {
        let Family::Qwen(p, wt) = &self.family else {
            return Err(Error::Unsupported(
                "Gemma 3's tower has no video path (its frames are images)".into(),
            ));
        };
        if frames.is_empty() {
            return Err(Error::Input("a video needs at least one frame".into()));
        }
        let px = frames
            .iter()
            .map(|f| self.pixels_image(w, h, f))
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::with_capacity(px.len().div_ceil(2) * p.tokens(w, h) * p.out_width());
        for [a, b] in video::pairs(px.len()) {
            let pair = [&px[a][..], &px[b][..]];
            out.extend(match dev {
                Some(t) => t.forward_pair(w, h, pair)?,
                None => qwenvit::forward_pair(p, wt, w, h, pair),
            });
        }
        Ok(out)
    }

    /// [`VisionTower::encode`] from the tower's input values of a square image
    /// ([`VisionTower::pixels`]).
    pub fn encode_pixels(&self, px: &[f32]) -> Result<Vec<f32>> {
        let s = self.image_size();
        if px.len() != 3 * s * s {
            return Err(Error::Input(format!(
                "the tower takes 3x{s}x{s} values, got {}",
                px.len()
            )));
        }
        match &self.cuda {
            Some(t) => t.forward(s, s, px),
            None => Ok(self.forward_cpu(s, s, px)),
        }
    }
}
