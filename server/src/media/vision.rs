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

    /// The content hash and embedding rows of one square image (`image_size` RGB).
    pub fn embed(&self, rgb: &[u8]) -> memra_engine::Result<(u128, Arc<[f32]>)> {
        let hash = self.tower.hash(rgb);
        if let Ok(c) = self.cache.lock()
            && let Some((_, e)) = c.iter().find(|(h, _)| *h == hash)
        {
            return Ok((hash, e.clone()));
        }
        let e: Arc<[f32]> = self.tower.encode(rgb)?.into();
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_IMAGES {
                c.pop_front();
            }
            c.push_back((hash, e.clone()));
        }
        Ok((hash, e))
    }
}
