//! Vision towers: an image becomes rows of soft-token embeddings that replace the embeddings of
//! the image's placeholder tokens in the prompt (docs/SERVING.md, "Images and video").
//!
//! The first (and only) family is Gemma 3's: a SigLIP ViT and its pooling projector (average
//! pool of the patch grid, soft-embedding RMSNorm, projection to the text width), loaded from
//! llama.cpp's `mmproj` GGUF layout ([`mmproj`]). The tower runs beside the engine loop and
//! never inside a step, so it cannot change a text row's bits: on the CPU in f32 (the reference
//! implementation, [`siglip`]), or, after [`VisionTower::place`] on a CUDA device, on the GPU
//! (backend/cuda/vision.rs, checked against the CPU within a tolerance: docs/VERIFY.md). A
//! tower's rows are the same bits every time on its device class; the content hash says which
//! tower computed them.
//!
//! What reaches the engine is a [`MediaSpan`]: where the image's rows sit in the prompt, their
//! values and a content hash that the prefix cache mixes into the hashes of the blocks the span
//! touches (prefix_cache.rs).

pub mod mmproj;
#[cfg(any(test, feature = "test-util"))]
pub mod random;
mod siglip;

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::backend::Device;
use crate::backend::cuda::vision::CudaTower;
use crate::error::{Error, Result};
pub use mmproj::TowerParams;
pub use siglip::TowerWeights;

/// Rows of precomputed embeddings at consecutive prompt positions (one image).
#[derive(Clone, Debug, PartialEq)]
pub struct MediaSpan {
    /// Prompt index of the first row.
    pub start: usize,
    /// `rows x width` values, row-major.
    pub embeds: Arc<[f32]>,
    pub width: usize,
    /// Content hash (of the tower's identity and the pixels it saw).
    pub hash: u128,
}

impl MediaSpan {
    pub fn rows(&self) -> usize {
        self.embeds.len() / self.width.max(1)
    }

    /// Prompt indices `start..start + rows`.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.rows()
    }
}

/// Checks that `spans` lie inside a prompt of `n` tokens, in order, without overlap, each with
/// `width` values per row (the model's hidden size) and at least one row.
pub fn check_spans(spans: &[MediaSpan], n: usize, width: usize) -> Result<()> {
    let mut end = 0;
    for (i, s) in spans.iter().enumerate() {
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

/// The tokens that stand for an image in the prompt: an optional opening token, one
/// placeholder per embedding row (its embedding is replaced), an optional closing token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTokens {
    pub open: Option<u32>,
    pub soft: u32,
    pub close: Option<u32>,
}

impl ImageTokens {
    /// Gemma 3's: `<start_of_image>`, `<image_soft_token>`, `<end_of_image>` where the
    /// vocabulary has them. A vocabulary without a soft token uses the opening token (or id 0)
    /// as the placeholder: its embedding is replaced, so only the cache key (which hashes the
    /// image) sees it.
    pub fn from_tokenizer(tok: &crate::tokenizer::Tokenizer) -> ImageTokens {
        let open = tok.token_id("<start_of_image>");
        let close = tok.token_id("<end_of_image>");
        let soft = tok
            .token_id("<image_soft_token>")
            .or(open)
            .unwrap_or_default();
        ImageTokens { open, soft, close }
    }

    /// The ids of one image of `rows` embeddings, and the offset of its first row in them.
    pub fn expand(&self, rows: usize) -> (Vec<u32>, usize) {
        let mut v = Vec::with_capacity(rows + 2);
        v.extend(self.open);
        let first = v.len();
        v.extend(std::iter::repeat_n(self.soft, rows));
        v.extend(self.close);
        (v, first)
    }
}

/// A loaded tower: its shape and f32 weights, and where it runs.
pub struct VisionTower {
    params: TowerParams,
    weights: TowerWeights,
    /// Hash of the file's tensors and shape.
    id: [u8; 32],
    /// `id`, and the device tower's name when there is one: part of every image's content hash
    /// (rows of the CPU and the CUDA tower differ in their last bits, so they never share one).
    key: [u8; 32],
    /// The tower on a CUDA device ([`VisionTower::place`]); `None`: the CPU.
    cuda: Option<CudaTower>,
}

impl std::fmt::Debug for VisionTower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionTower")
            .field("params", &self.params)
            .field("runs_on", &self.runs_on())
            .finish()
    }
}

impl VisionTower {
    /// Loads an mmproj GGUF file (llama.cpp's layout, projector `gemma3`).
    pub fn open(path: &std::path::Path) -> Result<VisionTower> {
        let g = crate::formats::gguf::Gguf::open(path)?;
        let (params, weights) = mmproj::load(&g)?;
        Ok(Self::new(params, weights))
    }

    pub fn new(params: TowerParams, weights: TowerWeights) -> VisionTower {
        let id = weights.digest(&params);
        VisionTower {
            params,
            weights,
            id,
            key: id,
            cuda: None,
        }
    }

    /// Runs the tower where a model on `device` runs: on CUDA device `n` for `cuda:N` (and for
    /// `auto` when CUDA is there: device 0), else on the CPU. On a CUDA device the weights are
    /// uploaded now and one image's activations allocated (before a backend sizes its KV cache
    /// from the free memory). A tower shape the CUDA kernels do not cover is an error.
    pub fn place(&mut self, device: Device) -> Result<()> {
        let n = match device {
            Device::Cpu => None,
            Device::Auto => crate::backend::cuda::cuda_available().then_some(0),
            Device::Cuda(n) => Some(n),
        };
        self.cuda = match n {
            None => None,
            Some(n) => {
                let gpu = crate::backend::cuda::Gpu::open(n)?;
                Some(CudaTower::new(gpu, &self.params, &self.weights)?)
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

    pub fn params(&self) -> &TowerParams {
        &self.params
    }

    /// Side of the square RGB image [`VisionTower::encode`] takes.
    pub fn image_size(&self) -> usize {
        self.params.image_size
    }

    /// Embedding rows per image.
    pub fn tokens_per_image(&self) -> usize {
        self.params.tokens_per_image()
    }

    /// Width of an embedding row (the text model's hidden size).
    pub fn out_width(&self) -> usize {
        self.params.text_hidden
    }

    /// The content hash of an image as this tower sees it (`rgb`: `image_size^2` RGB pixels).
    pub fn hash(&self, rgb: &[u8]) -> u128 {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update((rgb.len() as u64).to_le_bytes());
        h.update(rgb);
        let d = h.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        u128::from_le_bytes(b)
    }

    /// The tower's input for `rgb` (`image_size^2` pixels, RGB, row-major): channel-major
    /// `[3][size][size]` values `(x / 255 - mean[c]) / std[c]`.
    pub fn pixels(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let s = self.params.image_size;
        if rgb.len() != s * s * 3 {
            return Err(Error::Input(format!(
                "the tower takes {s}x{s} RGB images ({} bytes), got {} bytes",
                s * s * 3,
                rgb.len()
            )));
        }
        let (m, d) = (self.params.mean, self.params.std);
        let mut out = vec![0f32; 3 * s * s];
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                out[c * s * s + i] = (px[c] as f32 / 255.0 - m[c]) / d[c];
            }
        }
        Ok(out)
    }

    /// The embedding rows (`tokens_per_image x out_width`) of one `image_size` square RGB image,
    /// on the tower's device ([`VisionTower::runs_on`]).
    pub fn encode(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let px = self.pixels(rgb)?;
        self.encode_pixels(&px)
    }

    /// [`VisionTower::encode`] on the CPU (the f32 reference), wherever the tower runs.
    pub fn encode_cpu(&self, rgb: &[u8]) -> Result<Vec<f32>> {
        let px = self.pixels(rgb)?;
        Ok(siglip::forward(&self.params, &self.weights, &px))
    }

    /// [`VisionTower::encode`] from the tower's input values ([`VisionTower::pixels`]).
    pub fn encode_pixels(&self, px: &[f32]) -> Result<Vec<f32>> {
        let s = self.params.image_size;
        if px.len() != 3 * s * s {
            return Err(Error::Input(format!(
                "the tower takes 3x{s}x{s} values, got {}",
                px.len()
            )));
        }
        match &self.cuda {
            Some(t) => t.forward(px),
            None => Ok(siglip::forward(&self.params, &self.weights, px)),
        }
    }
}
