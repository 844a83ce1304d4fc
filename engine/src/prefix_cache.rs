//! Prefix cache: full KV blocks keyed by a hash chain, shared read-only between sequences, with
//! LRU eviction of the blocks no sequence references.
//!
//! `hash(block i) = sha256(hash(block i-1), namespace, tokens of block i)`, so a block's hash names
//! its whole prefix. The namespace is the tenant plus the request's `cache_salt`: tenants never
//! share cache entries. A cached block's KV is bit-identical to a recomputed one (same tokens at
//! the same positions on a row-invariant backend), so a hit never changes an output byte.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

/// A block's chained hash (first 128 bits of SHA-256).
pub type BlockHash = u128;

/// The prefix-cache namespace of a request: tenant plus optional salt, unambiguously joined.
pub fn namespace(tenant: &str, cache_salt: Option<&str>) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(tenant.len() as u64).to_le_bytes());
    v.extend_from_slice(tenant.as_bytes());
    if let Some(s) = cache_salt {
        v.push(1);
        v.extend_from_slice(&(s.len() as u64).to_le_bytes());
        v.extend_from_slice(s.as_bytes());
    } else {
        v.push(0);
    }
    v
}

/// The hash of a full block given its parent's hash (`None` for the first block).
pub fn block_hash(parent: Option<BlockHash>, namespace: &[u8], tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    match parent {
        Some(p) => {
            h.update([1u8]);
            h.update(p.to_le_bytes());
        }
        None => h.update([0u8]),
    }
    h.update((namespace.len() as u64).to_le_bytes());
    h.update(namespace);
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
}

/// [`block_hash`] of a block that images touch: each image's first prompt position and content
/// hash follow the tokens, so the same text with another image is another block (and every
/// block after it, through the chain). Without images it is [`block_hash`].
pub fn block_hash_media(
    parent: Option<BlockHash>,
    namespace: &[u8],
    tokens: &[u32],
    media: &[(u64, u128)],
) -> BlockHash {
    if media.is_empty() {
        return block_hash(parent, namespace, tokens);
    }
    let mut ns = namespace.to_vec();
    ns.extend_from_slice(b"\0media");
    for (start, hash) in media {
        ns.extend_from_slice(&start.to_le_bytes());
        ns.extend_from_slice(&hash.to_le_bytes());
    }
    block_hash(parent, &ns, tokens)
}

/// Hashes of the full blocks of `tokens` (a trailing partial block has none).
pub fn chain_hashes(namespace: &[u8], tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    let mut parent = None;
    for chunk in tokens.chunks_exact(block_size.max(1)) {
        let h = block_hash(parent, namespace, chunk);
        out.push(h);
        parent = Some(h);
    }
    out
}

/// Hash -> block map plus the LRU list of idle (unreferenced) cached blocks.
#[derive(Debug, Default)]
pub struct PrefixCache {
    by_hash: HashMap<BlockHash, u32>,
    by_block: HashMap<u32, BlockHash>,
    /// Idle blocks by the tick they became idle (oldest first).
    lru: BTreeMap<u64, u32>,
    idle_tick: HashMap<u32, u64>,
    tick: u64,
}

impl PrefixCache {
    pub fn lookup(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    pub fn contains_block(&self, b: u32) -> bool {
        self.by_block.contains_key(&b)
    }

    pub fn is_idle(&self, b: u32) -> bool {
        self.idle_tick.contains_key(&b)
    }

    pub fn idle_len(&self) -> usize {
        self.lru.len()
    }

    /// Cached blocks (idle or in use).
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Publishes an in-use block under `hash`; ignored if either is already cached.
    pub fn insert(&mut self, hash: BlockHash, b: u32) {
        if self.by_hash.contains_key(&hash) || self.by_block.contains_key(&b) {
            return;
        }
        self.by_hash.insert(hash, b);
        self.by_block.insert(b, hash);
    }

    /// A cached block got a user: it leaves the LRU list.
    pub fn touch_in_use(&mut self, b: u32) {
        if let Some(t) = self.idle_tick.remove(&b) {
            self.lru.remove(&t);
        }
    }

    /// A cached block lost its last user: it joins the LRU list (most recent).
    pub fn make_idle(&mut self, b: u32) {
        if !self.by_block.contains_key(&b) || self.idle_tick.contains_key(&b) {
            return;
        }
        self.tick += 1;
        self.lru.insert(self.tick, b);
        self.idle_tick.insert(b, self.tick);
    }

    /// Drops the least recently idle block from the cache and returns it.
    pub fn evict_lru(&mut self) -> Option<u32> {
        self.evict_lru_hash().map(|(b, _)| b)
    }

    /// [`PrefixCache::evict_lru`], with the hash the block was cached under.
    pub fn evict_lru_hash(&mut self) -> Option<(u32, Option<BlockHash>)> {
        let (_, b) = self.lru.pop_first()?;
        self.idle_tick.remove(&b);
        let h = self.by_block.remove(&b);
        if let Some(h) = h {
            self.by_hash.remove(&h);
        }
        Some((b, h))
    }

    /// Internal consistency of the maps.
    pub fn check(&self) -> Result<(), String> {
        if self.by_hash.len() != self.by_block.len() {
            return Err("prefix cache: hash and block maps differ in size".into());
        }
        for (h, b) in &self.by_hash {
            if self.by_block.get(b) != Some(h) {
                return Err(format!("prefix cache: block {b} maps back to another hash"));
            }
        }
        if self.lru.len() != self.idle_tick.len() {
            return Err("prefix cache: LRU list and idle map differ in size".into());
        }
        for (t, b) in &self.lru {
            if self.idle_tick.get(b) != Some(t) || !self.by_block.contains_key(b) {
                return Err(format!("prefix cache: idle block {b} is inconsistent"));
            }
        }
        Ok(())
    }
}

/// What one snapshot id of a [`SnapshotPool`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Snap {
    Free,
    /// Reserved for a save the engine has been asked for, of the state at the end of the
    /// block with this hash.
    Pending(BlockHash),
    /// Saved: the recurrent state at the end of the block with this hash; `tick` is its last
    /// use (the LRU key).
    Attached {
        hash: BlockHash,
        tick: u64,
    },
}

/// The recurrent-state snapshots of a model with gated DeltaNet layers, attached to prefix-cache
/// blocks: snapshot `id` holds the state at the end of the block whose hash it is attached to
/// (ids only; the states live in the backend, `Backend::save_state`). A bounded pool of ids
/// `0..capacity`, reused least recently used first.
#[derive(Debug, Default)]
pub struct SnapshotPool {
    ids: Vec<Snap>,
    /// Free ids (the lowest last, so it is taken first).
    free: Vec<u32>,
    by_hash: HashMap<BlockHash, u32>,
    /// Attached ids by their last use (oldest first).
    lru: BTreeMap<u64, u32>,
    tick: u64,
}

impl SnapshotPool {
    pub fn new(capacity: usize) -> SnapshotPool {
        let n = capacity.min(u32::MAX as usize) as u32;
        SnapshotPool {
            ids: vec![Snap::Free; n as usize],
            free: (0..n).rev().collect(),
            ..Default::default()
        }
    }

    pub fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Snapshots saved and attached.
    pub fn attached(&self) -> usize {
        self.by_hash.len()
    }

    /// The snapshot attached to the block with hash `hash`.
    pub fn get(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// The hash an attached snapshot belongs to.
    pub fn hash_of(&self, id: u32) -> Option<BlockHash> {
        match self.ids.get(id as usize) {
            Some(Snap::Attached { hash, .. }) => Some(*hash),
            _ => None,
        }
    }

    /// Whether `id` is reserved for a save.
    pub fn is_pending(&self, id: u32) -> bool {
        matches!(self.ids.get(id as usize), Some(Snap::Pending(_)))
    }

    /// A hit on attached snapshot `id`: it becomes the most recently used.
    pub fn touch(&mut self, id: u32) {
        if let Some(Snap::Attached { tick, .. }) = self.ids.get_mut(id as usize) {
            self.lru.remove(tick);
            self.tick += 1;
            *tick = self.tick;
            self.lru.insert(self.tick, id);
        }
    }

    /// Reserves an id for a snapshot of the state at the end of block `hash`: a free id, else
    /// the least recently used attached one outside `pinned` (that snapshot is dropped).
    /// `None` when every id is reserved or pinned.
    pub fn reserve(&mut self, hash: BlockHash, pinned: &[u32]) -> Option<u32> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.lru.values().copied().find(|id| !pinned.contains(id))?;
                self.release(id);
                self.free.pop()?
            }
        };
        self.ids[id as usize] = Snap::Pending(hash);
        Some(id)
    }

    /// The save of reserved id `id` succeeded: it is attached to its block's hash. `false`
    /// (and the id freed) when the id was not reserved or the hash already has a snapshot.
    pub fn attach(&mut self, id: u32) -> bool {
        let Some(&Snap::Pending(hash)) = self.ids.get(id as usize) else {
            return false;
        };
        if self.by_hash.contains_key(&hash) {
            self.release(id);
            return false;
        }
        self.tick += 1;
        self.ids[id as usize] = Snap::Attached {
            hash,
            tick: self.tick,
        };
        self.lru.insert(self.tick, id);
        self.by_hash.insert(hash, id);
        true
    }

    /// Frees `id`, reserved or attached (a failed save or restore, an eviction).
    pub fn release(&mut self, id: u32) {
        let Some(slot) = self.ids.get_mut(id as usize) else {
            return;
        };
        match std::mem::replace(slot, Snap::Free) {
            Snap::Free => return,
            Snap::Pending(_) => {}
            Snap::Attached { hash, tick } => {
                self.lru.remove(&tick);
                self.by_hash.remove(&hash);
            }
        }
        self.free.push(id);
    }

    /// Drops the snapshot attached to `hash` (its block left the prefix cache).
    pub fn drop_hash(&mut self, hash: BlockHash) {
        if let Some(id) = self.get(hash) {
            self.release(id);
        }
    }

    /// Attached ids, in no particular order.
    pub fn attached_ids(&self) -> impl Iterator<Item = (u32, BlockHash)> + '_ {
        self.by_hash.iter().map(|(&h, &id)| (id, h))
    }

    /// Reserved ids.
    pub fn pending_ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.ids.len() as u32).filter(|&id| self.is_pending(id))
    }

    /// Internal consistency: every id is free, reserved or attached exactly once.
    pub fn check(&self) -> Result<(), String> {
        let mut free = vec![false; self.ids.len()];
        for &id in &self.free {
            match self.ids.get(id as usize) {
                Some(Snap::Free) if !free[id as usize] => free[id as usize] = true,
                _ => {
                    return Err(format!(
                        "snapshot {id}: on the free list but in use or twice"
                    ));
                }
            }
        }
        for (id, s) in self.ids.iter().enumerate() {
            let id = id as u32;
            match *s {
                Snap::Free if !free[id as usize] => {
                    return Err(format!("snapshot {id}: free but not on the free list"));
                }
                Snap::Attached { hash, tick }
                    if self.by_hash.get(&hash) != Some(&id) || self.lru.get(&tick) != Some(&id) =>
                {
                    return Err(format!("snapshot {id}: attached but not indexed"));
                }
                _ => {}
            }
        }
        if self.by_hash.len() != self.lru.len() {
            return Err("snapshots: hash index and LRU list differ in size".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_are_namespaced() {
        let ns_a = namespace("a", None);
        let ns_b = namespace("b", None);
        let toks: Vec<u32> = (0..10).collect();
        let ha = chain_hashes(&ns_a, &toks, 4);
        assert_eq!(ha.len(), 2);
        assert_ne!(ha, chain_hashes(&ns_b, &toks, 4));
        assert_ne!(ha, chain_hashes(&namespace("a", Some("")), &toks, 4));
        // Same second block tokens after a different first block: different hash.
        let mut other = toks.clone();
        other[0] = 99;
        let ho = chain_hashes(&ns_a, &other, 4);
        assert_ne!(ha[1], ho[1]);
        assert_eq!(ha[0], block_hash(None, &ns_a, &toks[..4]));
        assert_eq!(ha[1], block_hash(Some(ha[0]), &ns_a, &toks[4..8]));
        // The tenant/salt boundary is unambiguous.
        assert_ne!(namespace("ab", None), namespace("a", Some("b")));
    }

    #[test]
    fn lru_order_and_reuse() {
        let mut c = PrefixCache::default();
        c.insert(10, 0);
        c.insert(11, 1);
        c.insert(12, 1); // block already cached: ignored
        assert_eq!(c.lookup(12), None);
        c.make_idle(0);
        c.make_idle(1);
        c.touch_in_use(0);
        assert_eq!(c.idle_len(), 1);
        c.make_idle(0);
        assert_eq!(c.evict_lru(), Some(1));
        assert_eq!(c.lookup(11), None);
        assert_eq!(c.evict_lru(), Some(0));
        assert_eq!(c.evict_lru(), None);
        assert!(c.is_empty());
        c.check().unwrap();
    }

    #[test]
    fn snapshot_pool_reuses_the_least_recently_used() {
        let mut p = SnapshotPool::new(2);
        let a = p.reserve(100, &[]).unwrap();
        let b = p.reserve(200, &[]).unwrap();
        assert_eq!((a, b), (0, 1));
        // Both reserved: no room.
        assert_eq!(p.reserve(300, &[]), None);
        assert!(p.attach(a) && p.attach(b));
        assert_eq!((p.get(100), p.get(200)), (Some(0), Some(1)));
        // A hit on a makes b the least recently used; pinned, a is taken instead.
        p.touch(a);
        assert_eq!(p.reserve(300, &[b]), Some(a));
        assert_eq!(p.get(100), None);
        assert!(!p.attach(b), "attached already: not reserved");
        // A second snapshot of one block is not attached.
        p.release(a);
        let c = p.reserve(200, &[]).unwrap();
        assert!(!p.attach(c));
        assert_eq!(p.get(200), Some(b));
        p.drop_hash(200);
        assert_eq!(p.get(200), None);
        assert_eq!(p.attached(), 0);
        p.release(7);
        p.check().unwrap();
        assert_eq!(p.pending_ids().count(), 0);
        assert_eq!(SnapshotPool::new(0).reserve(1, &[]), None);
    }
}
