//! Property tests of the scheduler on random arrival / cancel / step sequences: no block is
//! leaked or double freed, budgets hold, and every admitted request finishes.

use std::collections::HashMap;

use memra_engine::kv::KvManager;
use memra_engine::prefix_cache::namespace;
use memra_engine::scheduler::{NewSeq, Scheduler, SchedulerConfig, SeqId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// tenant, shared-prefix choice, prompt length, tokens to generate
    Add(u8, u8, usize, usize),
    Step,
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..3, 0u8..3, 1usize..30, 1usize..8).prop_map(|(t, p, l, g)| Op::Add(t, p, l, g)),
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
}

impl Harness {
    fn step(&mut self) {
        let out = self.s.schedule();
        assert!(out.batch.rows.len() <= self.budget);
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
        for p in out.seqs.iter().filter(|p| p.sample) {
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

fn run(ops: Vec<Op>, blocks: usize, bs: usize, budget: usize, caching: bool) {
    let cfg = SchedulerConfig {
        max_batch_tokens: budget,
        max_running: 4,
        max_running_per_tenant: 3,
        admit_reserve_blocks: 1,
        recurrent: false,
    };
    let mut h = Harness {
        s: Scheduler::new(cfg, KvManager::new(blocks, bs, caching)),
        left: HashMap::new(),
        next: 0,
        budget,
    };
    for o in ops {
        match o {
            Op::Add(t, p, len, n_gen) => {
                let tenant = format!("t{t}");
                let prompt: Vec<u32> = (0..len as u32).map(|i| i * 3 + p as u32).collect();
                if !h.s.fits_ever(len + n_gen) {
                    continue; // the engine refuses these at submission
                }
                h.s.add(NewSeq {
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
        run(ops, blocks, bs, budget, caching);
    }
}
