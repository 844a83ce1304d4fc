//! Property tests of the scheduler on random arrival / cancel / step sequences: no block is
//! leaked or double freed, budgets hold, and every admitted request finishes. For a
//! recurrent-state model, a fake state per slot (a digest of the tokens folded in) checks that
//! every step starts where its slot's state stands and that a restored snapshot holds exactly
//! the sequence's own prefix. Prompts may hold an image (rows that attend to each other): no
//! chunk ends inside one, and an image under decode load is not starved.

use std::collections::HashMap;

use memra_engine::kv::KvManager;
use memra_engine::prefix_cache::namespace;
use memra_engine::scheduler::{NewSeq, Scheduler, SchedulerConfig, SchedulerOutput, SeqId};
use memra_engine::vision::MediaSpan;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// tenant, shared-prefix choice, prompt length, tokens to generate, an image (start and
    /// rows, folded into the prompt)
    Add(u8, u8, usize, usize, Option<(usize, usize)>),
    Step,
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (
            0u8..3,
            0u8..3,
            1usize..30,
            1usize..8,
            prop::option::weighted(0.3, (0usize..30, 1usize..12)),
        )
            .prop_map(|(t, p, l, g, i)| Op::Add(t, p, l, g, i)),
        4 => Just(Op::Step),
        1 => (0usize..64).prop_map(Op::Cancel),
    ]
}

struct Harness {
    s: Scheduler,
    /// Tokens still to generate per live sequence.
    left: HashMap<SeqId, usize>,
    next: SeqId,
    budget: usize,
    /// Recurrent: the fake state per slot and per snapshot, `(position, digest)`.
    slots: HashMap<u32, (usize, u64)>,
    snaps: HashMap<u32, (usize, u64)>,
    /// Recurrent: every `fail_every`-th save fails (the sequence ends, the snapshot goes).
    fail_every: usize,
    saves: usize,
    /// The image rows of each prompt that has one.
    images: HashMap<SeqId, (usize, usize)>,
}

/// The fake state after folding `tokens` into `d`.
fn fold(d: u64, tokens: impl IntoIterator<Item = u32>) -> u64 {
    tokens.into_iter().fold(d, |d, t| {
        d.wrapping_mul(0x100000001b3).wrapping_add(t as u64 + 1)
    })
}

impl Harness {
    /// Runs the fake recurrent state through a plan: restores, steps, saves.
    fn run_states(&mut self, out: &SchedulerOutput) -> Vec<(SeqId, u32)> {
        let mut failed = Vec::new();
        for (i, p) in out.seqs.iter().enumerate() {
            let slot = out.batch.state_slots[i];
            if let Some(r) = p.restore {
                assert_eq!(
                    (r.slot, r.pos),
                    (slot, p.start),
                    "restore before the first step"
                );
                let snap = *self.snaps.get(&r.snap).expect("restoring a saved snapshot");
                assert_eq!(snap.0, r.pos);
                self.slots.insert(slot, snap);
            }
            let (pos, d) = match p.start {
                0 => (0, 0),
                _ => *self.slots.get(&slot).expect("a state in the slot"),
            };
            assert_eq!(pos, p.start, "a step starts where its slot's state stands");
            let tokens = self.s.tokens(p.id).unwrap();
            assert_eq!(
                d,
                fold(0, tokens[..pos].iter().copied()),
                "the state of its own prefix"
            );
            let rows = out
                .batch
                .rows
                .iter()
                .filter(|r| r.seq == i)
                .map(|r| r.token);
            let after = (p.start + p.len, fold(d, rows));
            self.slots.insert(slot, after);
            if let Some(v) = p.save {
                assert_eq!(
                    (v.slot, v.pos),
                    (slot, after.0),
                    "a save at the chunk's end"
                );
                self.saves += 1;
                match self.saves.is_multiple_of(self.fail_every) {
                    true => failed.push((p.id, v.snap)),
                    false => {
                        self.snaps.insert(v.snap, after);
                    }
                }
            }
        }
        failed
    }

    fn step(&mut self) {
        let out = self.s.schedule();
        let failed = match self.s.config().recurrent {
            true => self.run_states(&out),
            false => Vec::new(),
        };
        assert!(out.batch.rows.len() <= self.budget);
        for p in &out.seqs {
            if let Some(&(lo, hi)) = self.images.get(&p.id) {
                let end = p.start + p.len;
                assert!(
                    !(lo < end && end < hi),
                    "a chunk ends inside an image: {}..{end} vs {lo}..{hi}",
                    p.start
                );
            }
        }
        assert_eq!(out.batch.block_tables.len(), out.seqs.len());
        for r in &out.batch.rows {
            let table = &out.batch.block_tables[r.seq];
            let bs = self.s.kv().block_size();
            assert!(
                (r.pos as usize / bs) < table.len(),
                "row outside its blocks"
            );
        }
        self.s.complete(&out);
        let ended: Vec<SeqId> = failed.iter().map(|f| f.0).collect();
        for (id, snap) in failed {
            // The engine drops the snapshot and ends the sequence.
            self.s.drop_snapshot(snap);
            self.snaps.remove(&snap);
            assert!(self.s.finish(id));
            self.left.remove(&id);
        }
        for p in out
            .seqs
            .iter()
            .filter(|p| p.sample && !ended.contains(&p.id))
        {
            let left = self
                .left
                .get_mut(&p.id)
                .expect("scheduled a finished sequence");
            *left -= 1;
            if *left == 0 {
                assert!(self.s.finish(p.id));
                self.left.remove(&p.id);
            } else {
                // Fake model output: a token that depends on the position only.
                let pos = self.s.tokens(p.id).map_or(0, |t| t.len());
                assert!(self.s.append_token(p.id, (pos % 7) as u32));
            }
        }
        if let Err(e) = self.s.check() {
            panic!("invariant broken: {e}");
        }
    }
}

/// Recurrent-state options: snapshots (`None`: the default count) and how often a save fails.
type Recurrent = Option<(Option<usize>, usize)>;

fn run(ops: Vec<Op>, blocks: usize, bs: usize, budget: usize, caching: bool, rec: Recurrent) {
    let cfg = SchedulerConfig {
        max_batch_tokens: budget,
        max_running: 4,
        max_running_per_tenant: 3,
        admit_reserve_blocks: 1,
        recurrent: rec.is_some(),
        state_snapshots: rec.and_then(|r| r.0),
    };
    let mut h = Harness {
        s: Scheduler::new(cfg, KvManager::new(blocks, bs, caching)),
        left: HashMap::new(),
        next: 0,
        budget,
        slots: HashMap::new(),
        snaps: HashMap::new(),
        fail_every: rec.map_or(usize::MAX, |r| r.1.max(1)),
        saves: 0,
        images: HashMap::new(),
    };
    for o in ops {
        match o {
            Op::Add(t, p, len, n_gen, image) => {
                let tenant = format!("t{t}");
                let prompt: Vec<u32> = (0..len as u32).map(|i| i * 3 + p as u32).collect();
                if !h.s.fits_ever(len + n_gen) {
                    continue; // the engine refuses these at submission
                }
                let image = image.map(|(at, rows)| (at % len, rows.min(len - at % len)));
                if image.is_some_and(|(_, rows)| rows > budget) {
                    continue; // an image larger than the step budget: refused too
                }
                let media: Vec<MediaSpan> = image
                    .map(|(start, rows)| MediaSpan {
                        start,
                        embeds: vec![0f32; rows].into(),
                        width: 1,
                        hash: p as u128,
                        grid: None,
                        times: Vec::new(),
                    })
                    .into_iter()
                    .collect();
                if let Some((start, rows)) = image {
                    h.images.insert(h.next, (start, start + rows));
                }
                h.s.add(NewSeq {
                    media,
                    id: h.next,
                    namespace: namespace(&tenant, None),
                    tenant,
                    prompt,
                });
                h.left.insert(h.next, n_gen);
                h.next += 1;
            }
            Op::Step => h.step(),
            Op::Cancel(i) => {
                let mut live: Vec<SeqId> = h.left.keys().copied().collect();
                live.sort();
                if let Some(&id) = live.get(i % live.len().max(1)) {
                    assert!(h.s.finish(id));
                    h.left.remove(&id);
                    h.s.check().unwrap();
                }
            }
        }
    }
    let mut guard = 0;
    while h.s.has_work() {
        h.step();
        guard += 1;
        assert!(guard < 10_000, "admitted requests did not finish");
    }
    assert!(h.left.is_empty(), "unfinished: {:?}", h.left);
    assert_eq!(h.s.kv().used(), 0);
    assert_eq!(h.s.kv().available(), blocks);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_leaks_and_everything_finishes(
        ops in prop::collection::vec(op(), 1..120),
        blocks in 10usize..40,
        bs in prop::sample::select(vec![1usize, 2, 4, 8]),
        budget in 1usize..40,
        caching in any::<bool>(),
    ) {
        run(ops, blocks, bs, budget, caching, None);
    }

    #[test]
    fn recurrent_snapshots_hold_their_prefix(
        ops in prop::collection::vec(op(), 1..120),
        blocks in 10usize..40,
        bs in prop::sample::select(vec![1usize, 2, 4, 8]),
        budget in 1usize..40,
        snapshots in prop::option::of(0usize..4),
        fail_every in prop::sample::select(vec![3usize, 7, usize::MAX]),
    ) {
        run(ops, blocks, bs, budget, true, Some((snapshots, fail_every)));
    }
}
