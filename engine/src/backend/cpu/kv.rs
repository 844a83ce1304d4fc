//! The CPU backend's paged KV storage: per layer, K and V as `[block][slot][kv_head][head_dim]` f32.

use crate::error::{Error, Result};

pub struct KvStore {
    pub block_size: usize,
    pub blocks: usize,
    /// Values per position: n_kv_heads * head_dim.
    pub width: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvStore {
    pub fn new(layers: usize, blocks: usize, block_size: usize, width: usize) -> Result<KvStore> {
        let per_layer = blocks
            .checked_mul(block_size)
            .and_then(|v| v.checked_mul(width))
            .ok_or_else(|| Error::Input("KV cache size overflows".into()))?;
        let alloc = |_| vec![0f32; per_layer];
        Ok(KvStore {
            block_size,
            blocks,
            width,
            k: (0..layers).map(alloc).collect(),
            v: (0..layers).map(alloc).collect(),
        })
    }

    fn offset(&self, block: u32, slot: usize) -> usize {
        (block as usize * self.block_size + slot) * self.width
    }

    /// Stores one position's K and V.
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let o = self.offset(block, slot);
        self.k[layer][o..o + self.width].copy_from_slice(k);
        self.v[layer][o..o + self.width].copy_from_slice(v);
    }

    /// K and V of one position (all KV heads).
    pub fn read(&self, layer: usize, block: u32, slot: usize) -> (&[f32], &[f32]) {
        let o = self.offset(block, slot);
        (
            &self.k[layer][o..o + self.width],
            &self.v[layer][o..o + self.width],
        )
    }

    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let n = self.block_size * self.width;
        let (s, d) = (self.offset(src, 0), self.offset(dst, 0));
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.copy_within(s..s + n, d);
        }
    }

    pub fn block_bytes(&self, block: u32) -> Vec<u8> {
        let n = self.block_size * self.width;
        let s = self.offset(block, 0);
        self.k
            .iter()
            .chain(self.v.iter())
            .flat_map(|layer| layer[s..s + n].iter().flat_map(|v| v.to_le_bytes()))
            .collect()
    }
}
