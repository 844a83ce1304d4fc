//! The CPU backend's paged KV storage: per layer, K and V as `[block][slot]` rows of `width`
//! values (n_kv_heads * head_dim of that layer) in the cache's [`KvDtype`].

use crate::error::{Error, Result};
use crate::kv_format::KvDtype;

struct Layer {
    width: usize,
    /// Bytes per row.
    row: usize,
    k: Vec<u8>,
    v: Vec<u8>,
}

pub struct KvStore {
    pub block_size: usize,
    pub blocks: usize,
    pub dtype: KvDtype,
    layers: Vec<Layer>,
}

/// `n` zero bytes, or None when the allocator refuses them. Zeroed by the allocator (a large
/// block comes as fresh pages from the OS): the pool's pages cost memory once its sequences
/// write them, not at load (a pool sized for 64 contexts took 11.8 GB of RAM at once when it was
/// filled with zeros by hand).
fn zeroed(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: the layout's size is n > 0; alloc_zeroed returns null or n zeroed bytes with u8's
    // alignment from the global allocator, which is what Vec::from_raw_parts(p, n, n) requires
    // (length n initialized, capacity n).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}

impl KvStore {
    pub fn new(blocks: usize, block_size: usize, dtype: KvDtype) -> KvStore {
        KvStore {
            block_size,
            blocks,
            dtype,
            layers: Vec::new(),
        }
    }

    /// Allocates one more layer of `width` values per position; returns its index.
    pub fn add_layer(&mut self, width: usize) -> Result<usize> {
        self.dtype.check_width(width)?;
        let row = self.dtype.row_bytes(width);
        let n = self
            .blocks
            .checked_mul(self.block_size)
            .and_then(|v| v.checked_mul(row))
            .ok_or_else(|| Error::Input("KV cache size overflows".into()))?;
        let zeros = || -> Result<Vec<u8>> {
            zeroed(n).ok_or_else(|| {
                Error::Input(format!(
                    "cannot allocate the KV cache: {} MiB for one layer's K or V ({} blocks); \
                     lower --kv-blocks or free memory",
                    n >> 20,
                    self.blocks
                ))
            })
        };
        let (k, v) = (zeros()?, zeros()?);
        self.layers.push(Layer { width, row, k, v });
        Ok(self.layers.len() - 1)
    }

    fn range(&self, layer: usize, block: u32, slot: usize) -> std::ops::Range<usize> {
        let row = self.layers[layer].row;
        let o = (block as usize * self.block_size + slot) * row;
        o..o + row
    }

    /// Stores one position's K and V.
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let r = self.range(layer, block, slot);
        let dt = self.dtype;
        let l = &mut self.layers[layer];
        dt.encode(k, &mut l.k[r.clone()]);
        dt.encode(v, &mut l.v[r]);
    }

    /// Values `cols` of one position's K (`v == false`) or V, as f32, into `out`.
    pub fn read(
        &self,
        layer: usize,
        block: u32,
        slot: usize,
        v: bool,
        cols: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let r = self.range(layer, block, slot);
        let l = &self.layers[layer];
        let data = if v { &l.v } else { &l.k };
        self.dtype.decode(&data[r], l.width, cols, out);
    }

    /// The bytes of one block: every layer's K, then every layer's V.
    pub fn block_bytes(&self, block: u32) -> Vec<u8> {
        let part = |l: &Layer, kv: &Vec<u8>| {
            let n = self.block_size * l.row;
            let s = block as usize * n;
            kv[s..s + n].to_vec()
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
        // 2^49 bytes (512 TiB): the allocation fails and says so instead of aborting.
        let mut kv = KvStore::new(1 << 40, 16, KvDtype::F32);
        match kv.add_layer(64) {
            Err(Error::Input(m)) => assert!(m.contains("cannot allocate the KV cache"), "{m}"),
            other => panic!("expected a clean error, got {:?}", other.map(|_| ())),
        }
        let mut kv = KvStore::new(usize::MAX / 2, 16, KvDtype::Bf16);
        assert!(kv.add_layer(64).is_err(), "size overflow");
        let mut kv = KvStore::new(4, 16, KvDtype::Q8_0);
        assert!(kv.add_layer(8).is_err(), "q8_0 needs whole blocks of 32");
        assert_eq!(kv.add_layer(64).unwrap(), 0);
    }

    #[test]
    fn a_new_pool_reads_zeros() {
        for n in [0usize, 1, 4096, 3 << 20] {
            let v = zeroed(n).expect("allocates");
            assert_eq!((v.len(), v.capacity()), (n, n));
            assert!(v.iter().all(|&b| b == 0));
        }
        let mut kv = KvStore::new(3, 16, KvDtype::F32);
        kv.add_layer(64).unwrap();
        assert!(kv.block_bytes(2).iter().all(|&b| b == 0));
    }

    #[test]
    fn rows_round_trip_in_every_format() {
        let k: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        for dt in KvDtype::ALL {
            let mut kv = KvStore::new(2, 4, dt);
            kv.add_layer(64).unwrap();
            kv.write(0, 1, 3, &k, &v);
            let mut out = vec![0f32; 16];
            kv.read(0, 1, 3, false, 32..48, &mut out);
            assert_eq!(out, dt.round_trip(&k)[32..48], "{dt} K");
            kv.read(0, 1, 3, true, 0..16, &mut out);
            assert_eq!(out, dt.round_trip(&v)[..16], "{dt} V");
            // Block 1 holds the row; block 0 is untouched.
            assert!(kv.block_bytes(0).iter().all(|&b| b == 0));
            assert_eq!(kv.block_bytes(1).len(), 2 * 4 * dt.row_bytes(64));
        }
    }
}
