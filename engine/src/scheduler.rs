//! The scheduler: continuous batching of every running sequence, chunked prefill interleaved with
//! decode under a per-step token budget, KV-aware admission with prefix-cache hits, preemption
//! when KV runs short, and fairness between tenants. It never touches a device: its output is
//! plain data (a [`StepBatch`] plus which sequences sample), and tests drive it with fake outputs.
//!
//! A step: [`Scheduler::schedule`] -> the backend runs the batch -> [`Scheduler::complete`] ->
//! the engine samples for each `sample` sequence and calls [`Scheduler::append_token`] or
//! [`Scheduler::finish`].
//!
//! **Recurrent-state models** ([`SchedulerConfig::recurrent`]) keep a state per sequence in a
//! state slot, so a prefix-cache hit also needs the state at the hit's end. Such states are
//! snapshots (ids of a bounded [`SnapshotPool`], the states themselves in the backend) attached
//! to prefix-cache block hashes. A sequence admitted with a prompt of `n` tokens takes one at
//! `P = ((n - 1) / bs) * bs` (the end of the last block a later hit could reuse; none when
//! `P == 0` or it starts there): the prefill chunk that reaches `P` ends exactly at `P`, and
//! that step's [`ScheduledSeq::save`] asks the engine to save the slot's state at `P` after
//! the step; [`Scheduler::complete`] attaches it to the hash of the block ending at `P`. A hit
//! is the deepest cached block `j` (blocks `0..=j` all cached) that carries a snapshot: the
//! sequence starts at `(j + 1) * bs`, its first step's [`ScheduledSeq::restore`] asking the
//! engine to load the snapshot into its slot first. A snapshot is dropped when its block leaves
//! the prefix cache, or reused least recently used first when the pool needs room.

use std::collections::{BTreeMap, HashSet, VecDeque};

use crate::backend::{StepBatch, StepRow};
use crate::kv::{KvManager, blocks_for};
use crate::prefix_cache::{BlockHash, SnapshotPool, block_hash_media};

/// A request's id inside the engine.
pub type SeqId = u64;

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Token rows per step (decode rows and prefill chunks together).
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    pub max_running: usize,
    /// Sequences of one tenant running at once (others of that tenant wait).
    pub max_running_per_tenant: usize,
    /// Free blocks a waiting sequence must leave beyond its prompt to be admitted.
    pub admit_reserve_blocks: usize,
    /// The model keeps recurrent state per sequence (gated DeltaNet layers): each running
    /// sequence holds one of `max_running` state slots (`StepBatch::state_slots`), and a
    /// prefix-cache hit needs a state snapshot at its end (the module documentation).
    pub recurrent: bool,
    /// Recurrent-state snapshots kept for prefix-cache hits (`recurrent` models only): `None`
    /// = `2 * max_running`; `Some(0)` = none (a recurrent model then takes no hits).
    pub state_snapshots: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch_tokens: 512,
            max_running: 64,
            max_running_per_tenant: 64,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        }
    }
}

/// A sequence handed to the scheduler.
#[derive(Clone, Debug)]
pub struct NewSeq {
    pub id: SeqId,
    pub tenant: String,
    /// Prefix-cache namespace ([`crate::prefix_cache::namespace`]).
    pub namespace: Vec<u8>,
    pub prompt: Vec<u32>,
    /// Image rows of the prompt (their hashes key the blocks they touch).
    pub media: Vec<crate::vision::MediaSpan>,
}

#[derive(Debug)]
struct Seq {
    id: SeqId,
    tenant: String,
    namespace: Vec<u8>,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    /// Positions whose KV is in `blocks`.
    computed: usize,
    blocks: Vec<u32>,
    /// Image rows of the prompt (checked by the engine: in order, inside the prompt).
    media: Vec<crate::vision::MediaSpan>,
    /// Chained hashes of the leading full blocks of `tokens` (computed on demand).
    hashes: Vec<BlockHash>,
    /// Leading blocks already published to (or taken from) the prefix cache.
    published: usize,
    /// Prompt tokens served from the prefix cache at first admission.
    cached_tokens: Option<usize>,
    /// Set when preempted: it goes first when admitting.
    preempted: bool,
    /// Draft tokens to check after the last token at its next decode step (speculation).
    draft: Vec<u32>,
    /// Its recurrent-state slot while running ([`SchedulerConfig::recurrent`]).
    slot: Option<u32>,
    /// A prefix hit's snapshot `(id, position)` to load into the slot before its first step
    /// (until that step is planned, the snapshot is pinned).
    restore: Option<(u32, usize)>,
    /// Where to take a state snapshot (its prefill chunks stop there).
    save_at: Option<usize>,
    /// The snapshot id of a save planned in the last step, until [`Scheduler::complete`].
    pending_save: Option<u32>,
}

impl Seq {
    fn remaining(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Rows it wants this step: its uncomputed tokens, plus its draft when it decodes.
    fn wanted(&self) -> usize {
        match self.remaining() {
            1 => 1 + self.draft.len(),
            n => n,
        }
    }

    /// Extends `hashes` to cover the first `n` full blocks.
    fn ensure_hashes(&mut self, n: usize, bs: usize) {
        while self.hashes.len() < n {
            let i = self.hashes.len();
            let Some(toks) = self.tokens.get(i * bs..(i + 1) * bs) else {
                return;
            };
            let h = block_hash_media(
                self.hashes.last().copied(),
                &self.namespace,
                toks,
                &media_keys(&self.media, i * bs, bs),
            );
            self.hashes.push(h);
        }
    }
}

/// `(first prompt position, content hash)` of each image touching the block of `bs`
/// positions at `first`; an image's grid and a video's group times are mixed into its hash
/// (they place the rows of an M-RoPE model: the same rows on another grid, or a video's at
/// another frame rate, are other KV).
fn media_keys(media: &[crate::vision::MediaSpan], first: usize, bs: usize) -> Vec<(u64, u128)> {
    const K: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;
    media
        .iter()
        .filter(|m| m.start < first + bs && m.range().end > first)
        .map(|m| {
            let grid = m.grid.map_or(0, |(r, c)| {
                let g = ((r as u128) << 64) | c as u128 | (1 << 127);
                g.wrapping_mul(K)
            });
            let times = m.times.iter().fold(0u128, |h, &t| {
                (h ^ (t as u128 | (1 << 96)))
                    .wrapping_mul(K)
                    .rotate_left(41)
            });
            (m.start as u64, m.hash ^ grid ^ times)
        })
        .collect()
}

/// The rows of a chunk of at most `n` from position `start` that does not end inside an image
/// (rows of an image attend to all of it, backend/spans.rs, so a step holding some of them
/// holds its last position): `n`, or cut back to the start of the image it would split, or,
/// when it starts inside that image (a prefix-cache hit or the chunk before it ended there),
/// extended to the image's end; `None` (no rows this step) when that passes `budget`. Exact
/// whatever the chunks: chunking never changes a row's bits.
fn chunk_rows(
    media: &[crate::vision::MediaSpan],
    start: usize,
    n: usize,
    budget: usize,
) -> Option<usize> {
    let end = start + n;
    for m in media {
        let r = m.range();
        if r.start < end && end < r.end {
            if r.start > start {
                return Some(r.start - start);
            }
            let need = r.end - start;
            return (need <= budget).then_some(need);
        }
    }
    Some(n)
}

/// The step's embedding rows for a sequence's positions `start..start + n` (its rows are the
/// last `n` of the batch so far).
fn push_embeds(batch: &mut StepBatch, media: &[crate::vision::MediaSpan], start: usize, n: usize) {
    if media.is_empty() {
        return;
    }
    let row0 = batch.rows.len() - n;
    for m in media {
        let r = m.range();
        for pos in r.start.max(start)..r.end.min(start + n) {
            batch.embeds.push(crate::backend::RowEmbed {
                row: row0 + pos - start,
                values: m.embeds.clone(),
                index: pos - m.start,
                width: m.width,
                span: m.start as u32..r.end as u32,
            });
        }
    }
}

/// The step's M-RoPE positions for a sequence's positions `start..start + n` (its rows are the
/// last `n` of the batch so far): once a sequence with images is in the step, every row has
/// them (plain `(pos, pos, pos)` for the rows of sequences without images).
fn push_mrope(batch: &mut StepBatch, media: &[crate::vision::MediaSpan], start: usize, n: usize) {
    if media.is_empty() && batch.mrope.is_empty() {
        return;
    }
    let row0 = batch.rows.len() - n;
    while batch.mrope.len() < row0 {
        let p = batch.rows[batch.mrope.len()].pos;
        batch.mrope.push([p; 3]);
    }
    batch
        .mrope
        .extend(crate::vision::mrope::positions(media, start, n));
}

/// A recurrent-state snapshot the engine saves or restores around a step
/// ([`crate::backend::Backend::save_state`], [`crate::backend::Backend::restore_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateOp {
    /// The sequence's state slot.
    pub slot: u32,
    /// The position the snapshot holds the state at.
    pub pos: usize,
    /// The snapshot id.
    pub snap: u32,
}

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: SeqId,
    /// First position computed this step.
    pub start: usize,
    /// Rows this step.
    pub len: usize,
    /// The last row reaches the end of the sequence: its logits pick the next token.
    pub sample: bool,
    /// Draft tokens checked this step (rows after the last token; each row wants logits).
    pub drafts: Vec<u32>,
    /// Before the step: load this snapshot into the slot (`pos == start`, a prefix hit).
    pub restore: Option<StateOp>,
    /// After the step succeeded: save the slot's state at `pos` (`start + len`) as this
    /// snapshot; [`Scheduler::complete`] attaches it ([`Scheduler::drop_snapshot`] when the
    /// save failed).
    pub save: Option<StateOp>,
}

/// The plan of one step: the backend batch (sequence `i` of the batch is `seqs[i]`) and the
/// sequences preempted to make room.
#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    pub batch: StepBatch,
    pub seqs: Vec<ScheduledSeq>,
    pub preempted: Vec<SeqId>,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Takes sequence `id` out of the plan (its rows, block table, state slot and entry; the
    /// other sequences renumbered), e.g. when its snapshot could not be restored. Returns
    /// whether it was there.
    pub fn remove_seq(&mut self, id: SeqId) -> bool {
        let Some(i) = self.seqs.iter().position(|p| p.id == id) else {
            return false;
        };
        self.seqs.remove(i);
        if i < self.batch.block_tables.len() {
            self.batch.block_tables.remove(i);
        }
        if i < self.batch.state_slots.len() {
            self.batch.state_slots.remove(i);
        }
        self.batch.rows.retain(|r| r.seq != i);
        for r in &mut self.batch.rows {
            if r.seq > i {
                r.seq -= 1;
            }
        }
        true
    }
}

/// Per-tenant counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantLoad {
    pub waiting: usize,
    pub running: usize,
}

/// Continuous-batching scheduler over one model's KV pool.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    waiting: VecDeque<Seq>,
    /// In admission order (the last is the most recently admitted).
    running: Vec<Seq>,
    prefix_hit_tokens: u64,
    preemptions: u64,
    /// Free recurrent-state slots (the lowest last, so it is taken first).
    free_slots: Vec<u32>,
    /// Recurrent-state snapshots attached to prefix-cache blocks (capacity 0 unless the
    /// model is recurrent and the prefix cache is on).
    snaps: SnapshotPool,
    /// Running sequences whose next chunk, an image, did not fit what the last step left of
    /// its budget: they are planned first next step (under steady decode load an image could
    /// otherwise wait for ever; the engine refuses images larger than the whole budget).
    held: Vec<SeqId>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, mut kv: KvManager) -> Scheduler {
        let free_slots = match cfg.recurrent {
            true => (0..cfg.max_running as u32).rev().collect(),
            false => Vec::new(),
        };
        let snapshots = match cfg.recurrent && kv.caching() {
            true => cfg.state_snapshots.unwrap_or(2 * cfg.max_running.max(1)),
            false => 0,
        };
        kv.track_evictions(snapshots > 0);
        Scheduler {
            free_slots,
            snaps: SnapshotPool::new(snapshots),
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_hit_tokens: 0,
            preemptions: 0,
            held: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Prompt tokens served from the prefix cache so far.
    pub fn prefix_hit_tokens(&self) -> u64 {
        self.prefix_hit_tokens
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The recurrent-state snapshot pool's capacity (0: recurrent models take no hits).
    pub fn snapshot_capacity(&self) -> usize {
        self.snaps.capacity()
    }

    /// Recurrent-state snapshots saved and attached to prefix-cache blocks.
    pub fn snapshots(&self) -> usize {
        self.snaps.attached()
    }

    /// Drops snapshot `snap` whatever it holds: its save or restore failed in the backend, so
    /// no later hit may use it.
    pub fn drop_snapshot(&mut self, snap: u32) {
        self.snaps.release(snap);
    }

    /// Waiting and running sequences per tenant.
    pub fn tenant_loads(&self) -> BTreeMap<String, TenantLoad> {
        let mut m: BTreeMap<String, TenantLoad> = BTreeMap::new();
        for s in &self.waiting {
            m.entry(s.tenant.clone()).or_default().waiting += 1;
        }
        for s in &self.running {
            m.entry(s.tenant.clone()).or_default().running += 1;
        }
        m
    }

    /// Whether a sequence of `positions` positions can ever fit in the pool (with the reserve).
    pub fn fits_ever(&self, positions: usize) -> bool {
        blocks_for(positions, self.kv.block_size()) + self.cfg.admit_reserve_blocks
            <= self.kv.total()
    }

    /// Queues a new sequence (at the back).
    pub fn add(&mut self, s: NewSeq) {
        self.waiting.push_back(Seq {
            id: s.id,
            tenant: s.tenant,
            namespace: s.namespace,
            tokens: s.prompt,
            media: s.media,
            computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            published: 0,
            cached_tokens: None,
            preempted: false,
            draft: Vec::new(),
            slot: None,
            restore: None,
            save_at: None,
            pending_save: None,
        });
    }

    fn find(&self, id: SeqId) -> Option<&Seq> {
        self.running
            .iter()
            .find(|s| s.id == id)
            .or_else(|| self.waiting.iter().find(|s| s.id == id))
    }

    /// Prompt and generated tokens of a sequence.
    pub fn tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.find(id).map(|s| s.tokens.as_slice())
    }

    /// Prompt tokens served from the prefix cache (0 until admitted).
    pub fn cached_tokens(&self, id: SeqId) -> usize {
        self.find(id).and_then(|s| s.cached_tokens).unwrap_or(0)
    }

    /// Running sequences whose next step is a decode step (one token to compute): those that
    /// can check a draft.
    pub fn decoding(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .filter(|s| s.remaining() == 1)
            .map(|s| s.id)
            .collect()
    }

    /// Whether the sequence is running (admitted, holding KV).
    pub fn is_running(&self, id: SeqId) -> bool {
        self.running.iter().any(|s| s.id == id)
    }

    /// Appends a sampled token to a running sequence.
    pub fn append_token(&mut self, id: SeqId, token: u32) -> bool {
        match self.running.iter_mut().find(|s| s.id == id) {
            Some(s) => {
                s.tokens.push(token);
                true
            }
            None => false,
        }
    }

    /// Sets the draft a running sequence checks at its next decode step (replacing any earlier
    /// one). The rows count against the step's token budget; the draft is cut to fit, left out
    /// when the KV pool is short of a block for it (nobody is preempted for a draft), and
    /// dropped when the step runs or the sequence is preempted.
    pub fn set_draft(&mut self, id: SeqId, draft: Vec<u32>) -> bool {
        match self.running.iter_mut().find(|s| s.id == id) {
            Some(s) => {
                s.draft = draft;
                true
            }
            None => false,
        }
    }

    /// After a step that checked drafts: `accepted` of them were accepted and their tokens
    /// appended (with the token after them). Their KV, written by the step, becomes part of the
    /// sequence; full blocks of accepted tokens are published to the prefix cache.
    pub fn accept_drafts(&mut self, id: SeqId, accepted: usize) {
        let bs = self.kv.block_size();
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return;
        };
        s.computed = (s.computed + accepted).min(s.tokens.len().saturating_sub(1));
        Self::publish(&mut self.kv, s, bs);
    }

    /// Publishes `s`'s full computed blocks not yet published.
    fn publish(kv: &mut KvManager, s: &mut Seq, bs: usize) {
        let full = (s.computed / bs).min(s.blocks.len());
        s.ensure_hashes(full, bs);
        for j in s.published..full.min(s.hashes.len()) {
            kv.publish(s.hashes[j], s.blocks[j]);
        }
        s.published = full.max(s.published);
    }

    /// Removes a sequence (finished or cancelled), wherever it is, freeing its blocks.
    /// Returns whether it existed.
    pub fn finish(&mut self, id: SeqId) -> bool {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            match self.waiting.remove(i) {
                Some(s) => s,
                None => return false,
            }
        } else {
            return false;
        };
        self.release_blocks(seq);
        true
    }

    /// Releases a sequence's blocks, its last block first: cached ones join the prefix cache's
    /// LRU list tail first, so eviction takes the end of a cached prefix before its head and
    /// what is left stays a hit (a chain without its head is unreachable).
    fn release_blocks(&mut self, mut seq: Seq) -> Seq {
        for b in seq.blocks.drain(..).rev() {
            // The accounting is exact by construction; an error here is a scheduler bug that
            // `check` (and the property tests) report.
            let _ = self.kv.release(b);
        }
        seq.computed = 0;
        seq.published = 0;
        seq.draft.clear();
        if let Some(slot) = seq.slot.take() {
            self.free_slots.push(slot);
        }
        seq.restore = None;
        seq.save_at = None;
        if let Some(id) = seq.pending_save.take() {
            self.snaps.release(id);
        }
        seq
    }

    /// Frees a running sequence's blocks and puts it at the front of the queue; it recomputes
    /// its tokens when readmitted (exact: same rows, same positions).
    fn preempt(&mut self, idx: usize) -> SeqId {
        let seq = self.running.remove(idx);
        let mut seq = self.release_blocks(seq);
        seq.preempted = true;
        let id = seq.id;
        self.waiting.push_front(seq);
        self.preemptions += 1;
        id
    }

    /// Gives `running[idx]` blocks for its first `positions` positions; `false` when the pool is
    /// exhausted.
    fn ensure_blocks(&mut self, idx: usize, positions: usize) -> bool {
        let need = blocks_for(positions, self.kv.block_size());
        let mut ok = true;
        while self.running[idx].blocks.len() < need {
            match self.kv.allocate() {
                Some(b) => self.running[idx].blocks.push(b),
                None => {
                    ok = false;
                    break;
                }
            }
        }
        // A snapshot goes with its block out of the prefix cache.
        for h in self.kv.take_evicted() {
            self.snaps.drop_hash(h);
        }
        ok
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_batch_tokens.max(1);
        let mut planned: Vec<(SeqId, usize)> = Vec::new();
        // Images held back last step first, then decodes (one row each), then prefill chunks,
        // oldest admission first.
        let held = std::mem::take(&mut self.held);
        let mut order: Vec<SeqId> = held
            .iter()
            .copied()
            .filter(|id| {
                self.running
                    .iter()
                    .any(|s| s.id == *id && s.remaining() > 1)
            })
            .collect();
        order.extend(
            self.running
                .iter()
                .filter(|s| s.remaining() == 1)
                .map(|s| s.id),
        );
        order.extend(
            self.running
                .iter()
                .filter(|s| s.remaining() > 1 && !held.contains(&s.id))
                .map(|s| s.id),
        );
        for id in order {
            if budget == 0 {
                break;
            }
            if let Some(n) = self.plan_running(id, budget, &planned, &mut out.preempted) {
                planned.push((id, n));
                budget -= n;
            }
        }
        while budget > 0 && self.running.len() < self.cfg.max_running.max(1) {
            let Some(widx) = self.pick_waiting() else {
                break;
            };
            if !self.admit(widx) {
                break;
            }
            let id = self.running.last().map(|s| s.id).unwrap_or_default();
            let Some(n) = self.plan_running(id, budget, &planned, &mut out.preempted) else {
                break;
            };
            planned.push((id, n));
            budget -= n;
        }
        self.build(planned, out)
    }

    /// Rows for running sequence `id` within `budget`, preempting the most recently admitted
    /// unplanned sequence (possibly `id` itself) while KV is short.
    fn plan_running(
        &mut self,
        id: SeqId,
        budget: usize,
        planned: &[(SeqId, usize)],
        preempted: &mut Vec<SeqId>,
    ) -> Option<usize> {
        loop {
            let idx = self.running.iter().position(|s| s.id == id)?;
            let s = &self.running[idx];
            let mut n = s.wanted().min(budget);
            // A chunk stops at the position of a snapshot to take.
            if let Some(p) = s.save_at
                && s.computed < p
            {
                n = n.min(p - s.computed);
            }
            // Nor inside an image (its rows attend to the whole image).
            let Some(rows) = chunk_rows(&s.media, s.computed, n, budget) else {
                if !self.held.contains(&id) {
                    self.held.push(id);
                }
                return None;
            };
            n = rows;
            if n == 0 {
                return None;
            }
            let positions = s.computed + n;
            let decode = s.remaining() == 1;
            if self.ensure_blocks(idx, positions) {
                return Some(n);
            }
            // Short of KV for a draft: the draft goes, nobody is preempted for it.
            if decode && n > 1 && self.ensure_blocks(idx, positions - (n - 1)) {
                return Some(1);
            }
            // The most recently admitted of: this sequence and those not planned this step.
            let victim = self
                .running
                .iter()
                .rposition(|v| v.id != id && !planned.iter().any(|(p, _)| *p == v.id))
                .map_or(idx, |o| o.max(idx));
            preempted.push(self.preempt(victim));
            if victim == idx {
                return None;
            }
        }
    }

    /// The waiting sequence to admit next: a preempted one at the front first, else the oldest
    /// of the tenant with the fewest running sequences (tenants at their limit wait).
    fn pick_waiting(&self) -> Option<usize> {
        let front = self.waiting.front()?;
        let mut running: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &self.running {
            *running.entry(s.tenant.as_str()).or_default() += 1;
        }
        let load = |t: &str| running.get(t).copied().unwrap_or(0);
        let limit = self.cfg.max_running_per_tenant.max(1);
        if front.preempted && load(&front.tenant) < limit {
            return Some(0);
        }
        let mut best: Option<(usize, usize)> = None;
        let mut seen: HashSet<&str> = HashSet::new();
        for (i, s) in self.waiting.iter().enumerate() {
            if !seen.insert(s.tenant.as_str()) {
                continue;
            }
            let l = load(&s.tenant);
            if l >= limit {
                continue;
            }
            if best.is_none_or(|(bl, _)| l < bl) {
                best = Some((l, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Moves `waiting[widx]` to running if its uncached prompt plus the reserve fits, taking its
    /// prefix-cache hits. Only blocks strictly before the last token's block boundary are reused,
    /// so the last token is always computed (its logits are needed). A recurrent model's hit
    /// ends at the deepest of those blocks that carries a state snapshot (none without one),
    /// and the sequence takes a snapshot at the end of the last reusable block when it computes
    /// past a hit.
    fn admit(&mut self, widx: usize) -> bool {
        let bs = self.kv.block_size();
        let Some(seq) = self.waiting.get_mut(widx) else {
            return false;
        };
        let reusable = (seq.tokens.len() - 1) / bs;
        seq.ensure_hashes(reusable, bs);
        let mut hits: Vec<BlockHash> = seq
            .hashes
            .iter()
            .take(reusable)
            .take_while(|h| self.kv.is_cached(**h))
            .copied()
            .collect();
        let mut snap = None;
        if self.cfg.recurrent {
            let deepest = hits
                .iter()
                .enumerate()
                .rev()
                .find_map(|(j, h)| self.snaps.get(*h).map(|id| (j, id)));
            hits.truncate(deepest.map_or(0, |(j, _)| j + 1));
            snap = deepest.map(|(_, id)| id);
        }
        let idle_hits = hits.iter().filter(|h| self.kv.is_cached_idle(**h)).count();
        let need = blocks_for(seq.tokens.len(), bs) - hits.len() + self.cfg.admit_reserve_blocks;
        if need > self.kv.available().saturating_sub(idle_hits) {
            return false;
        }
        if self.cfg.recurrent && self.free_slots.is_empty() {
            return false;
        }
        let Some(mut seq) = self.waiting.remove(widx) else {
            return false;
        };
        if self.cfg.recurrent {
            seq.slot = self.free_slots.pop();
        }
        for h in &hits {
            match self.kv.acquire_cached(*h) {
                Some(b) => seq.blocks.push(b),
                None => break,
            }
        }
        if self.cfg.recurrent {
            match snap {
                // The whole hit: its state comes from the snapshot.
                Some(id) if seq.blocks.len() == hits.len() => {
                    self.snaps.touch(id);
                    seq.restore = Some((id, hits.len() * bs));
                }
                // No state for a part of a hit: computed from position 0.
                _ => {
                    for b in seq.blocks.drain(..).rev() {
                        let _ = self.kv.release(b);
                    }
                }
            }
        }
        seq.computed = seq.blocks.len() * bs;
        seq.published = seq.blocks.len();
        if self.snaps.capacity() > 0 {
            let p = reusable * bs;
            if p > seq.computed && self.snaps.get(seq.hashes[reusable - 1]).is_none() {
                seq.save_at = Some(p);
            }
        }
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(seq.computed);
            self.prefix_hit_tokens += seq.computed as u64;
        }
        seq.preempted = false;
        self.running.push(seq);
        true
    }

    fn build(&mut self, planned: Vec<(SeqId, usize)>, mut out: SchedulerOutput) -> SchedulerOutput {
        let bs = self.kv.block_size();
        // Snapshots a sequence is yet to restore, or restores before this step, stay.
        let mut pinned: Vec<u32> = self
            .running
            .iter()
            .filter_map(|s| s.restore.map(|r| r.0))
            .collect();
        for (id, n) in planned {
            // A planned sequence can be preempted later in the same step: skip it then.
            let Some(idx) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let (mut restore, mut save) = (None, None);
            let s = &mut self.running[idx];
            if let (Some(slot), Some((snap, pos))) = (s.slot, s.restore.take()) {
                restore = Some(StateOp { slot, pos, snap });
            }
            if let (Some(slot), Some(pos)) = (s.slot, s.save_at)
                && s.computed + n == pos
            {
                s.save_at = None;
                let hash = s.hashes[pos / bs - 1];
                if self.snaps.get(hash).is_none()
                    && let Some(snap) = self.snaps.reserve(hash, &pinned)
                {
                    s.pending_save = Some(snap);
                    pinned.push(snap);
                    save = Some(StateOp { slot, pos, snap });
                }
            }
            let s = &self.running[idx];
            let i = out.seqs.len();
            let start = s.computed;
            let len = s.tokens.len();
            let sample = start + n >= len;
            let drafts = s.draft[..(start + n).saturating_sub(len)].to_vec();
            for pos in start..start + n {
                out.batch.rows.push(StepRow {
                    token: if pos < len {
                        s.tokens[pos]
                    } else {
                        drafts[pos - len]
                    },
                    pos: pos as u32,
                    seq: i,
                    want_logits: sample && pos + 1 >= len,
                });
            }
            push_embeds(&mut out.batch, &s.media, start, n);
            push_mrope(&mut out.batch, &s.media, start, n);
            out.batch.block_tables.push(s.blocks.clone());
            if let Some(slot) = s.slot {
                out.batch.state_slots.push(slot);
            }
            out.seqs.push(ScheduledSeq {
                id,
                start,
                len: n,
                sample,
                drafts,
                restore,
                save,
            });
        }
        out
    }

    /// Records that the planned rows ran: advances each sequence over its own tokens (not its
    /// drafts) and publishes its newly full blocks to the prefix cache.
    pub fn complete(&mut self, out: &SchedulerOutput) {
        let bs = self.kv.block_size();
        for p in &out.seqs {
            let Some(s) = self.running.iter_mut().find(|s| s.id == p.id) else {
                continue;
            };
            s.draft.clear();
            let pending = s.pending_save.take();
            if s.computed != p.start {
                if let Some(id) = pending {
                    self.snaps.release(id);
                }
                continue;
            }
            // Draft rows are not part of the sequence until accepted ([`Self::accept_drafts`]).
            s.computed = (p.start + p.len).min(s.tokens.len());
            Self::publish(&mut self.kv, s, bs);
            // The saved state belongs to the block ending at its position, now published.
            if let Some(id) = pending {
                let at_block = p.save.filter(|v| v.snap == id && v.pos == s.computed);
                let cached = at_block.is_some_and(|v| self.kv.is_cached(s.hashes[v.pos / bs - 1]));
                if !(cached && self.snaps.attach(id)) {
                    self.snaps.release(id);
                }
            }
        }
    }

    /// Checks that no block is leaked or double counted (tests).
    pub fn check(&self) -> Result<(), String> {
        if let Some(s) = self.waiting.iter().find(|s| !s.blocks.is_empty()) {
            return Err(format!("waiting sequence {} holds blocks", s.id));
        }
        let mut all = Vec::new();
        for s in &self.running {
            if s.blocks.len() < blocks_for(s.computed, self.kv.block_size()) {
                return Err(format!("sequence {} computed past its blocks", s.id));
            }
            all.extend_from_slice(&s.blocks);
        }
        if self.cfg.recurrent {
            let mut slots: Vec<u32> = self.free_slots.clone();
            for s in &self.running {
                slots.push(
                    s.slot
                        .ok_or(format!("running sequence {} has no state slot", s.id))?,
                );
            }
            slots.sort_unstable();
            if slots != (0..self.cfg.max_running as u32).collect::<Vec<_>>() {
                return Err(format!("state slots leaked or doubled: {slots:?}"));
            }
        }
        self.check_snapshots()?;
        self.kv.check(&all)
    }

    /// The snapshot invariants: every attached snapshot's block is in the prefix cache; a
    /// reserved id belongs to exactly one running sequence's planned save; a sequence to
    /// restore holds the snapshot's blocks and starts at its position.
    fn check_snapshots(&self) -> Result<(), String> {
        let bs = self.kv.block_size();
        self.snaps.check()?;
        if let Some(s) = self
            .waiting
            .iter()
            .find(|s| s.restore.is_some() || s.pending_save.is_some() || s.save_at.is_some())
        {
            return Err(format!("waiting sequence {} holds a snapshot", s.id));
        }
        for (id, h) in self.snaps.attached_ids() {
            if !self.kv.is_cached(h) {
                return Err(format!("snapshot {id}: its block left the prefix cache"));
            }
        }
        let mut pending: Vec<u32> = self.running.iter().filter_map(|s| s.pending_save).collect();
        pending.sort_unstable();
        if pending != self.snaps.pending_ids().collect::<Vec<_>>() {
            return Err(format!("reserved snapshots {pending:?} leaked or doubled"));
        }
        for s in &self.running {
            if let Some((id, pos)) = s.restore {
                let want = pos
                    .checked_sub(1)
                    .and_then(|p| s.hashes.get(p / bs))
                    .copied();
                if self.snaps.hash_of(id).is_none() || self.snaps.hash_of(id) != want {
                    return Err(format!("sequence {}: snapshot {id} is not its hit's", s.id));
                }
                if s.computed != pos || s.blocks.len() * bs < pos {
                    return Err(format!(
                        "sequence {}: restores {pos} at {}",
                        s.id, s.computed
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_rows, media_keys};
    use crate::vision::MediaSpan;

    #[test]
    fn a_video_s_times_are_part_of_its_key() {
        let video = |times: Vec<u32>| MediaSpan {
            start: 2,
            embeds: vec![0f32; 8].into(),
            width: 1,
            hash: 7,
            grid: Some((2, 2)),
            times,
        };
        let key = |m: &MediaSpan| media_keys(std::slice::from_ref(m), 0, 4);
        // The same frames at the same rate: the same key; at another rate (Qwen2.5-VL's
        // times) or as an image of the same grid: others.
        assert_eq!(key(&video(vec![0, 4])), key(&video(vec![0, 4])));
        assert_ne!(key(&video(vec![0, 4])), key(&video(vec![0, 2])));
        assert_ne!(key(&video(vec![0, 1])), key(&video(vec![1, 0])));
        let mut image = video(Vec::new());
        image.embeds = vec![0f32; 4].into();
        assert_ne!(key(&image), key(&video(vec![0])));
        // A block the video does not touch has no key of it.
        assert!(media_keys(&[video(vec![0, 4])], 12, 4).is_empty());
    }

    #[test]
    fn a_chunk_never_ends_inside_an_image() {
        // Images at 5..14 and 14..16 of a prompt.
        let img = |start, rows| MediaSpan {
            start,
            embeds: vec![0f32; rows].into(),
            width: 1,
            hash: 0,
            grid: None,
            times: Vec::new(),
        };
        let media = [img(5, 9), img(14, 2)];
        // Ends outside or at an image's boundary: unchanged.
        assert_eq!(chunk_rows(&media, 0, 5, 64), Some(5));
        assert_eq!(chunk_rows(&media, 0, 14, 64), Some(14));
        assert_eq!(chunk_rows(&media, 3, 30, 64), Some(30));
        // Would end inside: cut back to the image's start.
        assert_eq!(chunk_rows(&media, 0, 7, 7), Some(5));
        assert_eq!(chunk_rows(&media, 14, 1, 1), None);
        // Starts inside (a prefix hit): extended to its end within the budget, else no rows.
        assert_eq!(chunk_rows(&media, 8, 2, 6), Some(6));
        assert_eq!(chunk_rows(&media, 8, 2, 5), None);
        assert_eq!(chunk_rows(&media, 5, 4, 9), Some(9));
        // Without images: unchanged.
        assert_eq!(chunk_rows(&[], 8, 2, 5), Some(2));
    }
}
