//! Paged KV cache bookkeeping: fixed-size blocks, reference counts, a free list, and the prefix
//! cache's idle blocks (ids only; the memory lives in the backend).
//!
//! A block is in exactly one of three states:
//! - **free**: on the free list, refcount 0, not in the prefix cache;
//! - **in use**: refcount > 0 (one per sequence whose block table holds it);
//! - **idle cached**: refcount 0 but published in the prefix cache, on its LRU list; it is reused
//!   as is by a later cache hit, or evicted (dropped from the cache) when a fresh block is needed.
//!
//! [`KvManager::check`] verifies these invariants (used by the property tests).

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::prefix_cache::{BlockHash, PrefixCache};

/// Number of blocks of `block_size` positions that `positions` positions occupy.
pub fn blocks_for(positions: usize, block_size: usize) -> usize {
    positions.div_ceil(block_size.max(1))
}

/// Bytes one KV block takes on a backend (K and V of every layer in format `kv`); `None` on
/// overflow.
pub fn kv_block_bytes_checked(c: &ModelConfig, block_size: usize, kv: KvDtype) -> Option<usize> {
    let row = c.n_kv_heads.checked_mul(c.head_dim)?;
    block_size
        .checked_mul(kv.row_bytes(row))?
        .checked_mul(2)?
        .checked_mul(c.n_layers)
}

/// [`kv_block_bytes_checked`], saturating.
pub fn kv_block_bytes(c: &ModelConfig, block_size: usize, kv: KvDtype) -> usize {
    kv_block_bytes_checked(c, block_size, kv).unwrap_or(usize::MAX)
}

/// How many KV blocks fit in `free_bytes` after keeping `reserve_bytes` back, using at most
/// `fraction` of what is left, capped at `cap` blocks. At least one block when anything fits.
pub fn kv_blocks_from_memory(
    free_bytes: usize,
    reserve_bytes: usize,
    fraction: f64,
    block_bytes: usize,
    cap: usize,
) -> usize {
    let usable = free_bytes.saturating_sub(reserve_bytes) as f64 * fraction.clamp(0.0, 1.0);
    ((usable / block_bytes.max(1) as f64) as usize).min(cap)
}

/// Reference counts and the free list; exact accounting, double frees are errors.
#[derive(Debug)]
pub struct BlockAllocator {
    refs: Vec<u32>,
    free: Vec<u32>,
    on_free_list: Vec<bool>,
}

impl BlockAllocator {
    pub fn new(blocks: usize) -> BlockAllocator {
        BlockAllocator {
            refs: vec![0; blocks],
            // Pop from the end: hand out low ids first.
            free: (0..blocks as u32).rev().collect(),
            on_free_list: vec![true; blocks],
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn refcount(&self, b: u32) -> u32 {
        self.refs.get(b as usize).copied().unwrap_or(0)
    }

    fn bad(&self, b: u32, what: &str) -> Error {
        Error::Input(format!(
            "KV block {b}: {what} (the pool has {} blocks)",
            self.refs.len()
        ))
    }

    /// Takes a block off the free list with refcount 1.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.on_free_list[b as usize] = false;
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// One more reference to a block that is not on the free list.
    pub fn retain(&mut self, b: u32) -> Result<()> {
        let i = b as usize;
        match self.on_free_list.get(i) {
            None => Err(self.bad(b, "does not exist")),
            Some(true) => Err(self.bad(b, "retained while free")),
            Some(false) => {
                self.refs[i] += 1;
                Ok(())
            }
        }
    }

    /// Drops one reference; returns the references left.
    pub fn release(&mut self, b: u32) -> Result<u32> {
        let i = b as usize;
        match self.refs.get(i) {
            None => Err(self.bad(b, "does not exist")),
            Some(0) => Err(self.bad(b, "released more often than retained (double free)")),
            Some(_) => {
                self.refs[i] -= 1;
                Ok(self.refs[i])
            }
        }
    }

    /// Drops one reference to each of `blocks` and puts those left unreferenced back on the free
    /// list (a sequence's blocks of a private pool, as a drafter's KV).
    pub fn release_all(&mut self, blocks: &[u32]) {
        for &b in blocks {
            if let Ok(0) = self.release(b) {
                let _ = self.push_free(b);
            }
        }
    }

    /// Puts an unreferenced block back on the free list.
    pub fn push_free(&mut self, b: u32) -> Result<()> {
        let i = b as usize;
        match (self.refs.get(i), self.on_free_list.get(i)) {
            (Some(0), Some(false)) => {
                self.on_free_list[i] = true;
                self.free.push(b);
                Ok(())
            }
            (None, _) => Err(self.bad(b, "does not exist")),
            (_, Some(true)) => Err(self.bad(b, "freed twice")),
            _ => Err(self.bad(b, "freed while still referenced")),
        }
    }

    pub fn is_free(&self, b: u32) -> bool {
        self.on_free_list.get(b as usize).copied().unwrap_or(false)
    }
}

/// The block pool of one model: allocator plus prefix cache.
#[derive(Debug)]
pub struct KvManager {
    block_size: usize,
    alloc: BlockAllocator,
    cache: PrefixCache,
    caching: bool,
    /// Hashes evicted from the prefix cache since the last [`KvManager::take_evicted`], kept
    /// only when [`KvManager::track_evictions`] is on (recurrent-state snapshots are attached
    /// to them).
    evicted: Option<Vec<BlockHash>>,
}

impl KvManager {
    /// `caching = false` turns the prefix cache off (blocks go straight back to the free list).
    pub fn new(blocks: usize, block_size: usize, caching: bool) -> KvManager {
        KvManager {
            block_size: block_size.max(1),
            alloc: BlockAllocator::new(blocks),
            cache: PrefixCache::default(),
            caching,
            evicted: None,
        }
    }

    /// Whether the prefix cache is on.
    pub fn caching(&self) -> bool {
        self.caching
    }

    /// Keeps (or stops keeping) the hashes of evicted blocks for [`KvManager::take_evicted`].
    pub fn track_evictions(&mut self, on: bool) {
        self.evicted = on.then(Vec::new);
    }

    /// The hashes evicted from the prefix cache since the last call (none unless tracked).
    pub fn take_evicted(&mut self) -> Vec<BlockHash> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.alloc.total()
    }

    /// Blocks a new allocation can get: free plus idle cached (evictable).
    pub fn available(&self) -> usize {
        self.alloc.num_free() + self.cache.idle_len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn used(&self) -> usize {
        self.total() - self.available()
    }

    /// Idle blocks held by the prefix cache.
    pub fn cached_idle(&self) -> usize {
        self.cache.idle_len()
    }

    pub fn refcount(&self, b: u32) -> u32 {
        self.alloc.refcount(b)
    }

    /// A fresh block (refcount 1): from the free list, else by evicting the least recently used
    /// idle cached block. `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        if let Some(b) = self.alloc.alloc() {
            return Some(b);
        }
        let (b, h) = self.cache.evict_lru_hash()?;
        if let (Some(ev), Some(h)) = (self.evicted.as_mut(), h) {
            ev.push(h);
        }
        // An idle cached block has refcount 0 and is not on the free list.
        self.alloc.push_free(b).ok()?;
        self.alloc.alloc()
    }

    /// The cached block with this hash, retained for a new user.
    pub fn acquire_cached(&mut self, hash: BlockHash) -> Option<u32> {
        if !self.caching {
            return None;
        }
        let b = self.cache.lookup(hash)?;
        self.cache.touch_in_use(b);
        self.alloc.retain(b).ok()?;
        Some(b)
    }

    /// Whether `hash` is cached and idle (a hit on it takes a block out of `available`).
    pub fn is_cached_idle(&self, hash: BlockHash) -> bool {
        self.caching
            && self
                .cache
                .lookup(hash)
                .is_some_and(|b| self.cache.is_idle(b))
    }

    /// Whether `hash` is cached (idle or in use).
    pub fn is_cached(&self, hash: BlockHash) -> bool {
        self.caching && self.cache.lookup(hash).is_some()
    }

    /// Makes a full, written block shareable under `hash` (no-op when the hash is already
    /// cached under another block or caching is off).
    pub fn publish(&mut self, hash: BlockHash, b: u32) {
        if self.caching {
            self.cache.insert(hash, b);
        }
    }

    /// Drops one reference; an unreferenced block goes to the cache's LRU list if cached, else
    /// to the free list.
    pub fn release(&mut self, b: u32) -> Result<()> {
        if self.alloc.release(b)? == 0 {
            if self.cache.contains_block(b) {
                self.cache.make_idle(b);
            } else {
                self.alloc.push_free(b)?;
            }
        }
        Ok(())
    }

    /// Checks the accounting invariants; `in_use` is every block table's blocks (with repeats
    /// for shared blocks). Returns a description of the first violation.
    pub fn check(&self, in_use: &[u32]) -> std::result::Result<(), String> {
        let n = self.total();
        let mut refs = vec![0u32; n];
        for &b in in_use {
            let r = refs
                .get_mut(b as usize)
                .ok_or_else(|| format!("block {b} out of range"))?;
            *r += 1;
        }
        for (b, &want) in refs.iter().enumerate() {
            let b = b as u32;
            let got = self.alloc.refcount(b);
            if got != want {
                return Err(format!(
                    "block {b}: refcount {got}, block tables hold {want}"
                ));
            }
            let free = self.alloc.is_free(b);
            let idle = self.cache.is_idle(b);
            let states = (want > 0) as u8 + free as u8 + idle as u8;
            if states != 1 {
                return Err(format!(
                    "block {b}: in use {}, free {free}, idle cached {idle}",
                    want > 0
                ));
            }
        }
        if self.alloc.num_free() + self.cache.idle_len() + refs.iter().filter(|&&r| r > 0).count()
            != n
        {
            return Err("blocks leaked: free + idle + in use != total".into());
        }
        self.cache.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_free_is_an_error() {
        let mut a = BlockAllocator::new(2);
        let b = a.alloc().unwrap();
        assert_eq!(a.release(b).unwrap(), 0);
        a.push_free(b).unwrap();
        assert!(
            a.release(b)
                .unwrap_err()
                .to_string()
                .contains("double free")
        );
        assert!(a.push_free(b).unwrap_err().to_string().contains("twice"));
        assert!(a.retain(7).is_err());
    }

    #[test]
    fn allocate_evicts_idle_cached_blocks_lru_first() {
        let mut m = KvManager::new(2, 4, true);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        assert!(m.allocate().is_none());
        m.publish(1, a);
        m.publish(2, b);
        m.release(b).unwrap();
        m.release(a).unwrap();
        assert_eq!(m.available(), 2);
        assert_eq!(m.cached_idle(), 2);
        // b became idle first: it is evicted first (and reported when tracked).
        m.track_evictions(true);
        assert_eq!(m.allocate(), Some(b));
        assert!(!m.is_cached(2));
        assert_eq!(m.take_evicted(), vec![2]);
        assert!(m.take_evicted().is_empty());
        assert_eq!(m.acquire_cached(1), Some(a));
        m.check(&[a, b]).unwrap();
    }

    #[test]
    fn memory_sizing_keeps_the_reserve() {
        assert_eq!(kv_blocks_from_memory(1000, 200, 1.0, 100, 99), 8);
        assert_eq!(kv_blocks_from_memory(1000, 200, 0.5, 100, 99), 4);
        assert_eq!(kv_blocks_from_memory(1000, 2000, 1.0, 100, 99), 0);
        assert_eq!(kv_blocks_from_memory(1 << 40, 0, 1.0, 100, 99), 99);
    }
}
