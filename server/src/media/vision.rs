//! A served model's vision tower, its image tokens, and a small cache of recent embeddings
//! (keyed by content hash: the same image or video again is not encoded again).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use memra_engine::vision::{ImageTokens, VisionTower};

/// Embeddings kept for images (and videos) seen recently.
const CACHE_IMAGES: usize = 16;

pub struct Vision {
    pub tower: VisionTower,
    pub tokens: ImageTokens,
    cache: Mutex<VecDeque<(u128, Arc<[f32]>)>>,
}

impl Vision {
    pub fn new(tower: VisionTower, tokens: ImageTokens) -> Vision {
        Vision {
            tower,
            tokens,
            cache: Mutex::new(VecDeque::new()),
        }
    }

    /// The content hash, embedding rows and token grid (`VisionTower::grid_for`) of one image
    /// at the tower's input size.
    pub fn embed(&self, px: &super::Pixels) -> memra_engine::Result<super::Embedded> {
        let (w, h, rgb) = (px.width as usize, px.height as usize, &px.rgb);
        let hash = self.tower.hash_image(w, h, rgb);
        let embeds = self.cached(hash, || self.tower.encode_image(w, h, rgb))?;
        Ok(super::Embedded {
            hash,
            embeds,
            grid: self.tower.grid_for(w, h),
            times: Vec::new(),
            video: false,
        })
    }

    /// The same for a video's frames (all of the first one's size; the Qwen ViT's video path,
    /// `VisionTower::encode_video`): its frame groups' rows, each group on the grid of one frame,
    /// the groups at `times` (empty: one frame group, Qwen3-VL's).
    pub fn embed_video(
        &self,
        frames: &[super::Pixels],
        times: Vec<u32>,
    ) -> memra_engine::Result<super::Embedded> {
        let first = frames
            .first()
            .ok_or_else(|| memra_engine::Error::Input("a video needs at least one frame".into()))?;
        let (w, h) = (first.width as usize, first.height as usize);
        let rgb: Vec<&[u8]> = frames.iter().map(|f| &f.rgb[..]).collect();
        let hash = self.tower.hash_video(w, h, &rgb);
        let embeds = self.cached(hash, || self.tower.encode_video(w, h, &rgb))?;
        Ok(super::Embedded {
            hash,
            embeds,
            grid: self.tower.grid_for(w, h),
            times,
            video: true,
        })
    }

    /// The rows of content `hash`: from the cache, else `encode`d and kept.
    fn cached(
        &self,
        hash: u128,
        encode: impl FnOnce() -> memra_engine::Result<Vec<f32>>,
    ) -> memra_engine::Result<Arc<[f32]>> {
        if let Ok(c) = self.cache.lock()
            && let Some((_, e)) = c.iter().find(|(h, _)| *h == hash)
        {
            return Ok(e.clone());
        }
        let e: Arc<[f32]> = encode()?.into();
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_IMAGES {
                c.pop_front();
            }
            c.push_back((hash, e.clone()));
        }
        Ok(e)
    }
}

impl Vision {
    /// Where this tower's images are resized to ([`super::decode_all`]).
    pub fn with_target<T>(&self, f: impl FnOnce(&super::Target<'_>) -> T) -> T {
        let t = &self.tower;
        let size = |w: u32, h: u32| -> Result<(u32, u32), String> {
            let (iw, ih) = t
                .input_size(w as usize, h as usize)
                .map_err(|e| e.to_string())?;
            Ok((iw as u32, ih as u32))
        };
        f(&super::Target {
            size: &size,
            bicubic: t.resample() == memra_engine::vision::Resample::Bicubic,
        })
    }
}
