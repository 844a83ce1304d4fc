//! The traffic store: n-gram drafts learned from the traffic (SuffixDecoding's idea, Arctic
//! Inference / vLLM). The generated tokens of finished sequences are kept, per scope, in a
//! bounded store with an index from each n-gram (n = [`MIN_N`]..=[`MAX_N`] tokens) to the latest
//! position that followed it. Where a sequence's own context has no n-gram match of 2 or more
//! tokens, the engine asks the store ([`TrafficStore::propose`]): the longest suffix of the
//! sequence (4, 3, then 2 tokens) found in the scope proposes the tokens that followed its
//! latest occurrence, up to `k`, never past the end of the sequence they came from.
//!
//! This is the policy tools/spec/global_sim.py replayed (reports/spec/ngram-sampled-cpu.md, "A
//! cross-request n-gram table on the larger corpus"): the index holds the outputs of finished
//! requests (not their prompts: the replay indexed outputs, and with prompts too it measured no
//! better on grounded requests and slightly worse on the others, while long grounded prompts
//! would fill the store many times faster); a request never drafts from itself through the
//! store (it is fed when the sequence ends, never while it runs).
//!
//! Scopes: drafts never change output bytes, but acceptance changes speed, so a store shared
//! between tenants would let one tenant's timing tell whether a continuation occurred in
//! another's requests. A scope is the prefix cache's namespace ([`crate::prefix_cache::
//! namespace`]: the tenant and the request's `cache_salt`), so the store keeps apart exactly
//! what the prefix cache keeps apart, and each model has its own store. Lookups and feeds never
//! see another scope's tokens; what scopes share is the capacity (the least recently used
//! scope gives up its oldest tokens first), as they share the KV pool of the prefix cache.
//!
//! Bounds: at most [`CAPACITY`] tokens in all of a model's scopes together, each with up to
//! `MAX_N - MIN_N + 1` index entries (about 70 MB of host memory when full). A lookup costs
//! O(n + k) (a hash of each suffix tried, a check of the n tokens found, the k copied), a fed
//! token O(n), an evicted token O(n).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Most tokens a model's store holds, all scopes together.
pub const CAPACITY: usize = 1 << 20;
/// Shortest suffix looked up (the engine consults the store only where the sequence's own
/// context has no match of this length).
pub const MIN_N: usize = 2;
/// Longest suffix looked up (tried first).
pub const MAX_N: usize = 4;

/// The index's keys are hashes already ([`key`]): used as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Index = HashMap<u64, u64, BuildHasherDefault<KeyHasher>>;

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The index key of the `n`-gram `tokens` (a collision costs a lost or refused entry, never a
/// wrong draft: a hit is checked against the stored tokens).
fn key(n: usize, tokens: impl Iterator<Item = u32>) -> u64 {
    let golden = 0x9e37_79b9_7f4a_7c15u64;
    tokens.fold(mix(n as u64 ^ golden), |h, t| {
        mix(h ^ u64::from(t).wrapping_add(golden))
    })
}

/// One scope's tokens: positions `tail..tail + toks.len()` of everything ever fed to it.
#[derive(Default)]
struct Scope {
    toks: VecDeque<u32>,
    /// Whether the token at each position ends the sequence it came from.
    last: VecDeque<bool>,
    /// The position of `toks[0]`.
    tail: u64,
    /// n-gram key -> the latest position that followed that n-gram, inside one sequence.
    index: Index,
    /// The store's clock when the scope was last fed or read (least recently used evicts first).
    used_at: u64,
}

impl Scope {
    fn head(&self) -> u64 {
        self.tail + self.toks.len() as u64
    }

    /// The token at position `p`, if the scope still holds it.
    fn token(&self, p: u64) -> Option<u32> {
        let i = usize::try_from(p.checked_sub(self.tail)?).ok()?;
        self.toks.get(i).copied()
    }

    /// The key of the `n` tokens from position `p`, if the scope holds them all.
    fn key_at(&self, p: u64, n: usize) -> Option<u64> {
        if p < self.tail || p + n as u64 > self.head() {
            return None;
        }
        let i = (p - self.tail) as usize;
        Some(key(n, self.toks.range(i..i + n).copied()))
    }

    /// Appends one sequence's tokens, indexing each n-gram inside it by the position that
    /// follows it (a later occurrence replaces an earlier one).
    fn append(&mut self, seq: &[u32]) {
        for (i, &t) in seq.iter().enumerate() {
            let p = self.head();
            self.toks.push_back(t);
            self.last.push_back(false);
            for n in MIN_N..=MAX_N.min(i) {
                if let Some(k) = self.key_at(p - n as u64, n) {
                    self.index.insert(k, p);
                }
            }
        }
        if let Some(l) = self.last.back_mut() {
            *l = true;
        }
    }

    /// Drops the oldest token and the index entries of the n-grams that start at it (an entry
    /// that a later occurrence replaced stays).
    fn pop_oldest(&mut self) {
        let a = self.tail;
        for n in MIN_N..=MAX_N {
            let follower = a + n as u64;
            if follower >= self.head() {
                break;
            }
            if let Some(k) = self.key_at(a, n)
                && self.index.get(&k) == Some(&follower)
            {
                self.index.remove(&k);
            }
        }
        self.toks.pop_front();
        self.last.pop_front();
        self.tail += 1;
        // Give memory back once a scope has shrunk well below what it held.
        if self.toks.capacity() > 4 * self.toks.len() + 4096 {
            self.toks.shrink_to_fit();
            self.last.shrink_to_fit();
        }
        if self.index.capacity() > 4 * self.index.len() + 4096 {
            self.index.shrink_to_fit();
        }
    }

    /// The longest suffix of `context` (MAX_N..=MIN_N tokens) the scope holds, and up to `k`
    /// tokens that followed its latest occurrence, up to the end of that sequence.
    fn propose(&self, context: &[u32], k: usize) -> (Vec<u32>, usize) {
        let len = context.len();
        for n in (MIN_N..=MAX_N).rev() {
            if n > len {
                continue;
            }
            let suffix = &context[len - n..];
            let Some(&at) = self.index.get(&key(n, suffix.iter().copied())) else {
                continue;
            };
            let Some(from) = at.checked_sub(n as u64) else {
                continue;
            };
            let same = (0..n).all(|i| self.token(from + i as u64) == Some(suffix[i]));
            if !same {
                continue;
            }
            let mut out = Vec::with_capacity(k.min(crate::spec::MAX_K));
            let mut p = at;
            while out.len() < k {
                let Some(t) = self.token(p) else { break };
                out.push(t);
                if self.last[(p - self.tail) as usize] {
                    break;
                }
                p += 1;
            }
            if !out.is_empty() {
                return (out, n);
            }
        }
        (Vec::new(), 0)
    }
}

/// A model's traffic store: its scopes, at most `capacity` tokens in all.
pub struct TrafficStore {
    capacity: usize,
    scopes: HashMap<Vec<u8>, Scope>,
    /// Tokens held, all scopes.
    used: usize,
    clock: u64,
}

impl Default for TrafficStore {
    fn default() -> Self {
        TrafficStore::new(CAPACITY)
    }
}

impl TrafficStore {
    /// A store of at most `capacity` tokens (at least `MAX_N + 1`).
    pub fn new(capacity: usize) -> TrafficStore {
        TrafficStore {
            capacity: capacity.max(MAX_N + 1),
            scopes: HashMap::new(),
            used: 0,
            clock: 0,
        }
    }

    /// Tokens held, all scopes.
    pub fn len(&self) -> usize {
        self.used
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Tokens held by `scope`.
    pub fn scope_len(&self, scope: &[u8]) -> usize {
        self.scopes.get(scope).map_or(0, |s| s.toks.len())
    }

    /// Scopes holding tokens.
    pub fn scopes(&self) -> usize {
        self.scopes.len()
    }

    /// Index entries held, all scopes (at most `MAX_N - MIN_N + 1` per token).
    pub fn entries(&self) -> usize {
        self.scopes.values().map(|s| s.index.len()).sum()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A finished sequence's tokens (its output), into `scope`. A sequence too short to hold
    /// an n-gram and the token after it adds nothing; one longer than the store keeps its last
    /// `capacity` tokens. Room is made by dropping the oldest tokens of the least recently used
    /// scope (this one last).
    pub fn feed(&mut self, scope: &[u8], tokens: &[u32]) {
        if tokens.len() <= MIN_N {
            return;
        }
        let tokens = &tokens[tokens.len().saturating_sub(self.capacity)..];
        let now = self.tick();
        self.scopes.entry(scope.to_vec()).or_default().used_at = now;
        while self.used + tokens.len() > self.capacity {
            let Some(victim) = self
                .scopes
                .iter()
                .filter(|(_, s)| !s.toks.is_empty())
                .min_by_key(|(_, s)| s.used_at)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            let over = self.used + tokens.len() - self.capacity;
            let Some(s) = self.scopes.get_mut(&victim) else {
                break;
            };
            let drop = over.min(s.toks.len());
            for _ in 0..drop {
                s.pop_oldest();
            }
            self.used -= drop;
            if s.toks.is_empty() && victim.as_slice() != scope {
                self.scopes.remove(&victim);
            }
        }
        if let Some(s) = self.scopes.get_mut(scope) {
            s.append(tokens);
            self.used += tokens.len();
        }
    }

    /// Up to `k` tokens continuing `context` from `scope`'s tokens, with the length of the
    /// suffix match that proposed them (`MIN_N..=MAX_N`; 0 with no proposal).
    pub fn propose(&mut self, scope: &[u8], context: &[u32], k: usize) -> (Vec<u32>, usize) {
        if k == 0 {
            return (Vec::new(), 0);
        }
        let now = self.tick();
        match self.scopes.get_mut(scope) {
            Some(s) => {
                s.used_at = now;
                s.propose(context, k)
            }
            None => (Vec::new(), 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_length_and_order() {
        assert_ne!(key(2, [1, 2].into_iter()), key(2, [2, 1].into_iter()));
        assert_ne!(key(2, [1, 2].into_iter()), key(3, [1, 2].into_iter()));
        assert_eq!(
            key(3, [4, 5, 6].into_iter()),
            key(3, vec![4, 5, 6].into_iter())
        );
    }

    #[test]
    fn short_sequences_and_empty_asks_add_and_give_nothing() {
        let mut s = TrafficStore::new(64);
        s.feed(b"a", &[1, 2]);
        assert!(s.is_empty());
        assert_eq!(s.scopes(), 0);
        s.feed(b"a", &[1, 2, 3]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.propose(b"a", &[1, 2], 4), (vec![3], 2));
        assert_eq!(s.propose(b"a", &[1, 2], 0), (Vec::new(), 0));
        assert_eq!(s.propose(b"a", &[2], 4), (Vec::new(), 0));
        assert_eq!(s.propose(b"a", &[], 4), (Vec::new(), 0));
        assert_eq!(s.propose(b"b", &[1, 2], 4), (Vec::new(), 0));
    }
}
