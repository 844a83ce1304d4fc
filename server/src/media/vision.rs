//! A served model's vision tower, its image tokens, and a small cache of recent embeddings
//! (keyed by content hash: the same image again is not encoded again).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use memra_engine::vision::{ImageTokens, VisionTower};

/// Embeddings kept for images seen recently.
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
        let grid = self.tower.grid_for(w, h);
        if let Ok(c) = self.cache.lock()
            && let Some((_, e)) = c.iter().find(|(h, _)| *h == hash)
        {
            return Ok((hash, e.clone(), grid));
        }
        let e: Arc<[f32]> = self.tower.encode_image(w, h, rgb)?.into();
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_IMAGES {
                c.pop_front();
            }
            c.push_back((hash, e.clone()));
        }
        Ok((hash, e, grid))
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
