//! The CPU backend's paged KV storage: per layer, K and V as `[block][slot][width]` f32
//! (`width` = n_kv_heads * head_dim of that layer).

use crate::error::{Error, Result};

struct Layer {
    width: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

pub struct KvStore {
    pub block_size: usize,
    pub blocks: usize,
    layers: Vec<Layer>,
}

impl KvStore {
    pub fn new(blocks: usize, block_size: usize) -> KvStore {
        KvStore {
            block_size,
            blocks,
            layers: Vec::new(),
        }
    }

    /// Allocates one more layer of `width` values per position; returns its index.
    pub fn add_layer(&mut self, width: usize) -> Result<usize> {
        let n = self
            .blocks
            .checked_mul(self.block_size)
            .and_then(|v| v.checked_mul(width))
            .ok_or_else(|| Error::Input("KV cache size overflows".into()))?;
        let zeros = || -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                Error::Input(format!(
                    "cannot allocate the KV cache: {} MiB for one layer's K or V ({} blocks); \
                     lower --kv-blocks or free memory",
                    (n * 4) >> 20,
                    self.blocks
                ))
            })?;
            v.resize(n, 0f32);
            Ok(v)
        };
        let (k, v) = (zeros()?, zeros()?);
        self.layers.push(Layer { width, k, v });
        Ok(self.layers.len() - 1)
    }

    fn range(&self, layer: usize, block: u32, slot: usize) -> std::ops::Range<usize> {
        let w = self.layers[layer].width;
        let o = (block as usize * self.block_size + slot) * w;
        o..o + w
    }

    /// Stores one position's K and V.
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let r = self.range(layer, block, slot);
        let l = &mut self.layers[layer];
        l.k[r.clone()].copy_from_slice(k);
        l.v[r].copy_from_slice(v);
    }

    /// K and V of one position (all KV heads).
    pub fn read(&self, layer: usize, block: u32, slot: usize) -> (&[f32], &[f32]) {
        let r = self.range(layer, block, slot);
        let l = &self.layers[layer];
        (&l.k[r.clone()], &l.v[r])
    }

    /// The bytes of one block: every layer's K, then every layer's V.
    pub fn block_bytes(&self, block: u32) -> Vec<u8> {
        let part = |l: &Layer, kv: &Vec<f32>| {
            let n = self.block_size * l.width;
            let s = block as usize * n;
            kv[s..s + n]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let ks = self.layers.iter().flat_map(|l| part(l, &l.k));
        let vs = self.layers.iter().flat_map(|l| part(l, &l.v));
        ks.chain(vs).collect()
    }
}

#[cfg(test)]
mod alloc_tests {
    use super::*;

    #[test]
    fn a_kv_pool_too_large_for_memory_is_a_clean_error() {
        // 2^50 floats (4 PiB): the allocation fails and says so instead of aborting.
        let mut kv = KvStore::new(1 << 40, 16);
        match kv.add_layer(64) {
            Err(Error::Input(m)) => assert!(m.contains("cannot allocate the KV cache"), "{m}"),
            other => panic!("expected a clean error, got {:?}", other.map(|_| ())),
        }
        let mut kv = KvStore::new(usize::MAX / 2, 16);
        assert!(kv.add_layer(64).is_err(), "size overflow");
        let mut kv = KvStore::new(4, 16);
        assert_eq!(kv.add_layer(8).unwrap(), 0);
    }
}
