//! The scheduler: continuous batching of every running sequence, chunked prefill interleaved with
//! decode under a per-step token budget, KV-aware admission with prefix-cache hits, preemption
//! when KV runs short, and fairness between tenants. It never touches a device: its output is
//! plain data (a [`StepBatch`] plus which sequences sample), and tests drive it with fake outputs.
//!
//! A step: [`Scheduler::schedule`] -> the backend runs the batch -> [`Scheduler::complete`] ->
//! the engine samples for each `sample` sequence and calls [`Scheduler::append_token`] or
//! [`Scheduler::finish`].

use std::collections::{BTreeMap, HashSet, VecDeque};

use crate::backend::{StepBatch, StepRow};
use crate::kv::{KvManager, blocks_for};
use crate::prefix_cache::{BlockHash, block_hash};

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
    /// sequence holds one of `max_running` state slots (`StepBatch::state_slots`), and prompts
    /// take no prefix-cache hits (a hit would need the state at the hit's end, which the
    /// prefix cache does not hold yet).
    pub recurrent: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch_tokens: 512,
            max_running: 64,
            max_running_per_tenant: 64,
            admit_reserve_blocks: 1,
            recurrent: false,
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
            let h = block_hash(self.hashes.last().copied(), &self.namespace, toks);
            self.hashes.push(h);
        }
    }
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
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvManager) -> Scheduler {
        let free_slots = match cfg.recurrent {
            true => (0..cfg.max_running as u32).rev().collect(),
            false => Vec::new(),
        };
        Scheduler {
            free_slots,
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_hit_tokens: 0,
            preemptions: 0,
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
            computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            published: 0,
            cached_tokens: None,
            preempted: false,
            draft: Vec::new(),
            slot: None,
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
    /// one). The rows count against the step's token budget; the draft is cut to fit, and it is
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

    fn release_blocks(&mut self, mut seq: Seq) -> Seq {
        for b in seq.blocks.drain(..) {
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
        while self.running[idx].blocks.len() < need {
            match self.kv.allocate() {
                Some(b) => self.running[idx].blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_batch_tokens.max(1);
        let mut planned: Vec<(SeqId, usize)> = Vec::new();
        // Decodes first (one row each), then prefill chunks, oldest admission first.
        let mut order: Vec<SeqId> = self
            .running
            .iter()
            .filter(|s| s.remaining() == 1)
            .map(|s| s.id)
            .collect();
        order.extend(
            self.running
                .iter()
                .filter(|s| s.remaining() > 1)
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
            let n = s.wanted().min(budget);
            if n == 0 {
                return None;
            }
            let positions = s.computed + n;
            if self.ensure_blocks(idx, positions) {
                return Some(n);
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
    /// so the last token is always computed (its logits are needed).
    fn admit(&mut self, widx: usize) -> bool {
        let bs = self.kv.block_size();
        let Some(seq) = self.waiting.get_mut(widx) else {
            return false;
        };
        let reusable = match self.cfg.recurrent {
            true => 0,
            false => (seq.tokens.len() - 1) / bs,
        };
        seq.ensure_hashes(reusable, bs);
        let hits: Vec<BlockHash> = seq
            .hashes
            .iter()
            .take(reusable)
            .take_while(|h| self.kv.is_cached(**h))
            .copied()
            .collect();
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
        seq.computed = seq.blocks.len() * bs;
        seq.published = seq.blocks.len();
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(seq.computed);
            self.prefix_hit_tokens += seq.computed as u64;
        }
        seq.preempted = false;
        self.running.push(seq);
        true
    }

    fn build(&self, planned: Vec<(SeqId, usize)>, mut out: SchedulerOutput) -> SchedulerOutput {
        for (id, n) in planned {
            // A planned sequence can be preempted later in the same step: skip it then.
            let Some(s) = self.running.iter().find(|s| s.id == id) else {
                continue;
            };
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
            if s.computed != p.start {
                continue;
            }
            // Draft rows are not part of the sequence until accepted ([`Self::accept_drafts`]).
            s.computed = (p.start + p.len).min(s.tokens.len());
            Self::publish(&mut self.kv, s, bs);
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
        self.kv.check(&all)
    }
}
