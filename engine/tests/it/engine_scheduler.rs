//! Scheduler unit tests with fake model outputs: budgets, chunked prefill, preemption, tenant
//! fairness, KV-aware admission, cancellation, prefix-cache hits, evictions and namespaces.

use memra_engine::kv::KvManager;
use memra_engine::prefix_cache::namespace;
use memra_engine::scheduler::{NewSeq, Scheduler, SchedulerConfig, SchedulerOutput, SeqId};

fn sched(blocks: usize, bs: usize, cfg: SchedulerConfig) -> Scheduler {
    Scheduler::new(cfg, KvManager::new(blocks, bs, true))
}

fn cfg(budget: usize, running: usize, per_tenant: usize, reserve: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens: budget,
        max_running: running,
        max_running_per_tenant: per_tenant,
        admit_reserve_blocks: reserve,
        recurrent: false,
        state_snapshots: None,
    }
}

fn seq(id: SeqId, tenant: &str, prompt: Vec<u32>) -> NewSeq {
    NewSeq {
        media: Vec::new(),
        id,
        tenant: tenant.into(),
        namespace: namespace(tenant, None),
        prompt,
    }
}

/// Schedules, "runs" (fake), completes, and appends token `1000 + id` to every sampled sequence.
fn step(s: &mut Scheduler) -> SchedulerOutput {
    let out = s.schedule();
    s.complete(&out);
    for p in out.seqs.iter().filter(|p| p.sample) {
        assert!(s.append_token(p.id, 1000 + p.id as u32));
    }
    s.check().unwrap();
    out
}

fn rows_of(out: &SchedulerOutput, id: SeqId) -> usize {
    out.seqs.iter().find(|p| p.id == id).map_or(0, |p| p.len)
}

#[test]
fn token_budget_chunks_prefill_and_puts_decodes_first() {
    let mut s = sched(64, 4, cfg(8, 8, 8, 0));
    s.add(seq(1, "a", (0..10).collect()));
    s.add(seq(2, "a", (0..5).map(|t| t + 50).collect()));
    let o = step(&mut s);
    assert_eq!(o.batch.rows.len(), 8);
    assert_eq!(rows_of(&o, 1), 8);
    assert!(!o.seqs[0].sample);
    // Rows are the prompt in position order with only the last row of a sampled seq wanting logits.
    assert_eq!(o.batch.rows[3].pos, 3);
    assert!(o.batch.rows.iter().all(|r| !r.want_logits));
    let o = step(&mut s);
    assert_eq!((rows_of(&o, 1), rows_of(&o, 2)), (2, 5));
    assert_eq!(o.batch.rows.len(), 7);
    assert_eq!(o.batch.rows.iter().filter(|r| r.want_logits).count(), 2);
    // Both decode now: one row each, decodes first.
    let o = step(&mut s);
    assert_eq!((rows_of(&o, 1), rows_of(&o, 2)), (1, 1));
    assert_eq!(s.tokens(1).unwrap().len(), 12);
    // Every row's block is in its table.
    for r in &o.batch.rows {
        assert!(o.batch.block_tables[r.seq].len() > r.pos as usize / 4);
    }
}

#[test]
fn decodes_are_not_starved_by_a_long_prefill() {
    let mut s = sched(64, 4, cfg(6, 8, 8, 0));
    s.add(seq(1, "a", vec![1, 2, 3]));
    step(&mut s);
    s.add(seq(2, "a", (0..40).collect()));
    for _ in 0..5 {
        let o = step(&mut s);
        assert_eq!(rows_of(&o, 1), 1, "the decode runs every step");
        assert!(o.batch.rows.len() <= 6);
    }
}

#[test]
fn an_image_prefill_is_not_starved_by_decodes() {
    // Budget 8: four decoding sequences leave 4 rows, and an image of 6 rows is prefilled in
    // one step (its rows attend to all of it). Held back once, it goes first the next step.
    // Every step holding the image's sequence carries M-RoPE positions for all its rows: the
    // image's grid positions for its rows, `(pos, pos, pos)` for the others'.
    let mut s = sched(256, 4, cfg(8, 8, 8, 0));
    for id in 1..=4 {
        s.add(seq(id, "a", vec![1, 2]));
    }
    step(&mut s);
    let image = memra_engine::vision::MediaSpan {
        start: 2,
        embeds: vec![0f32; 6].into(),
        width: 1,
        hash: 7,
        grid: Some((2, 3)),
        times: Vec::new(),
    };
    let media = vec![image];
    s.add(NewSeq {
        media: media.clone(),
        ..seq(9, "b", (0..10).collect())
    });
    let mrope_ok = |o: &memra_engine::scheduler::SchedulerOutput| {
        let b = &o.batch;
        if !o.seqs.iter().any(|q| q.id == 9) {
            return b.mrope.is_empty();
        }
        b.mrope.len() == b.rows.len()
            && b.rows.iter().zip(&b.mrope).all(|(r, m)| {
                let id = o.seqs[r.seq].id;
                let want = match id {
                    9 => memra_engine::vision::mrope::position(&media, r.pos as usize),
                    _ => [r.pos; 3],
                };
                *m == want
            })
    };
    let mut image_step = None;
    for i in 0..6 {
        let o = step(&mut s);
        assert!(o.batch.rows.len() <= 8);
        assert!(mrope_ok(&o), "{:?}", o.batch.mrope);
        if rows_of(&o, 9) >= 6 {
            image_step = Some(i);
            break;
        }
    }
    let i = image_step.expect("the image never got a step: four decodes held it back");
    assert!(i <= 2, "the image waited {i} steps");
    // The decodes go on around it.
    let o = step(&mut s);
    assert!((1..=4).all(|id| rows_of(&o, id) == 1), "{:?}", o.seqs);
    assert!(mrope_ok(&o), "{:?}", o.batch.mrope);
    // Past the image, the text of sequence 9 is at its position less 6 - max(2, 3) = 3.
    let r = o.batch.rows.iter().position(|r| o.seqs[r.seq].id == 9);
    if let Some(r) = r {
        let p = o.batch.rows[r].pos;
        assert_eq!(o.batch.mrope[r], [p - 3; 3]);
    }
}

#[test]
fn preemption_frees_the_youngest_and_it_recomputes() {
    // 4 blocks of 4: two sequences of 6 prompt tokens take 2 blocks each.
    let mut s = sched(4, 4, cfg(64, 8, 8, 0));
    s.add(seq(1, "a", (0..6).collect()));
    s.add(seq(2, "b", (10..16).collect()));
    step(&mut s);
    assert_eq!(s.running_len(), 2);
    step(&mut s); // positions 6
    step(&mut s); // positions 7: blocks full
    let o = step(&mut s); // position 8 needs a third block each: none free
    assert_eq!(o.preempted, vec![2]);
    assert!(!s.is_running(2));
    assert_eq!(rows_of(&o, 1), 1);
    assert_eq!(s.waiting_len(), 1);
    // Sequence 2 kept its generated tokens and will recompute them.
    assert_eq!(s.tokens(2).unwrap().len(), 9);
    assert!(s.finish(1));
    let o = step(&mut s);
    assert!(s.is_running(2));
    // Recompute after a prefix-cache hit on its own published first two blocks: only the last
    // row (position 8) runs.
    let p = o.seqs.iter().find(|p| p.id == 2).unwrap();
    assert!(p.sample);
    assert_eq!(p.start + p.len, 9);
    assert_eq!(
        s.cached_tokens(2),
        0,
        "cached_tokens counts the first admission only"
    );
}

#[test]
fn fairness_between_tenants() {
    let mut s = sched(64, 4, cfg(64, 2, 8, 0));
    for i in 0..4 {
        s.add(seq(i, "a", vec![1, 2, 3]));
    }
    s.add(seq(10, "b", vec![4, 5, 6]));
    let o = step(&mut s);
    let ids: Vec<SeqId> = o.seqs.iter().map(|p| p.id).collect();
    assert_eq!(
        ids,
        vec![0, 10],
        "tenant b is admitted before a's second request"
    );
}

#[test]
fn per_tenant_running_limit_makes_the_rest_wait() {
    let mut s = sched(64, 4, cfg(64, 8, 1, 0));
    s.add(seq(1, "a", vec![1, 2]));
    s.add(seq(2, "a", vec![1, 3]));
    s.add(seq(3, "b", vec![1, 4]));
    step(&mut s);
    assert!(s.is_running(1) && s.is_running(3) && !s.is_running(2));
    let loads = s.tenant_loads();
    assert_eq!((loads["a"].running, loads["a"].waiting), (1, 1));
    s.finish(1);
    step(&mut s);
    assert!(s.is_running(2));
}

#[test]
fn admission_waits_for_kv_with_its_reserve() {
    let mut s = sched(6, 4, cfg(64, 8, 8, 1));
    s.add(seq(1, "a", (0..16).collect())); // 4 blocks + 1 reserve of 6
    step(&mut s);
    s.add(seq(2, "a", (100..105).collect())); // 2 blocks + 1 reserve > 2 left
    let o = step(&mut s);
    assert!(!s.is_running(2));
    assert_eq!(rows_of(&o, 2), 0);
    assert!(s.fits_ever(20) && !s.fits_ever(21));
    s.finish(1);
    step(&mut s);
    assert!(s.is_running(2));
}

#[test]
fn cancellation_frees_blocks_anywhere() {
    let mut s = sched(8, 4, cfg(64, 8, 8, 0));
    s.add(seq(1, "a", (0..10).collect()));
    step(&mut s);
    s.add(seq(2, "a", (0..3).collect()));
    assert!(s.kv().used() > 0);
    assert!(s.finish(1));
    assert!(s.finish(2), "a waiting sequence can be cancelled too");
    assert!(!s.finish(2));
    assert_eq!(s.kv().available(), 8);
    assert_eq!(s.kv().used(), 0);
    s.check().unwrap();
    assert!(!s.has_work());
}

#[test]
fn prefix_cache_hit_reuses_full_blocks_but_computes_the_last_token() {
    let mut s = sched(16, 4, cfg(64, 8, 8, 0));
    let prompt: Vec<u32> = (0..9).collect();
    s.add(seq(1, "a", prompt.clone()));
    step(&mut s);
    s.finish(1);
    assert_eq!(s.kv().cached_idle(), 2);
    s.add(seq(2, "a", prompt.clone()));
    let o = step(&mut s);
    assert_eq!(s.cached_tokens(2), 8);
    assert_eq!(o.seqs[0].start, 8);
    assert_eq!(o.seqs[0].len, 1);
    assert_eq!(s.prefix_hit_tokens(), 8);
    // A prompt of exactly two blocks reuses only the first: its last token must be computed.
    s.add(seq(3, "a", prompt[..8].to_vec()));
    let o = step(&mut s);
    let p = o.seqs.iter().find(|p| p.id == 3).unwrap();
    assert_eq!((s.cached_tokens(3), p.start, p.len), (4, 4, 4));
    // Sequences 2 and 3 share block 0 read-only.
    assert_eq!(o.batch.block_tables[0][0], o.batch.block_tables[1][0]);
}

#[test]
fn namespaces_never_share() {
    let mut s = sched(16, 4, cfg(64, 8, 8, 0));
    let prompt: Vec<u32> = (0..9).collect();
    s.add(seq(1, "a", prompt.clone()));
    step(&mut s);
    s.add(seq(2, "b", prompt.clone()));
    let mut salted = seq(3, "a", prompt.clone());
    salted.namespace = namespace("a", Some("salt"));
    s.add(salted);
    s.add(seq(4, "a", prompt.clone()));
    step(&mut s);
    assert_eq!(s.cached_tokens(2), 0);
    assert_eq!(s.cached_tokens(3), 0);
    assert_eq!(s.cached_tokens(4), 8);
}

#[test]
fn idle_cached_blocks_are_evicted_lru_when_kv_is_needed() {
    let mut s = sched(4, 4, cfg(64, 8, 8, 0));
    s.add(seq(1, "a", (0..9).collect()));
    step(&mut s);
    s.finish(1);
    assert_eq!(s.kv().cached_idle(), 2);
    // A different 16-token prompt needs all 4 blocks: both idle cached blocks are evicted.
    s.add(seq(2, "a", (100..116).collect()));
    step(&mut s);
    assert_eq!(s.kv().cached_idle(), 0);
    s.finish(2);
    s.add(seq(3, "a", (0..9).collect()));
    step(&mut s);
    assert_eq!(s.cached_tokens(3), 0, "the evicted prefix is gone");
}

/// A finished sequence's blocks become idle tail first, so eviction takes the end of a cached
/// prefix before its head: what stays cached is still a hit. (Released head first, the first
/// eviction took block 0 and every later block of the chain was cached but unreachable: a
/// repeated long image prompt got no hit at all after a little pressure on the pool.)
#[test]
fn eviction_takes_a_cached_prefix_from_its_tail() {
    let mut s = sched(6, 4, cfg(64, 8, 8, 0));
    let prompt: Vec<u32> = (0..17).collect();
    s.add(seq(1, "a", prompt.clone()));
    step(&mut s);
    s.finish(1);
    assert_eq!(s.kv().cached_idle(), 4);
    // 12 other tokens need 3 blocks: the 2 free ones and one evicted.
    s.add(seq(2, "a", (100..112).collect()));
    step(&mut s);
    assert_eq!(s.kv().cached_idle(), 3);
    s.finish(2);
    s.add(seq(3, "a", prompt));
    let o = step(&mut s);
    assert_eq!(s.cached_tokens(3), 12, "the first 3 blocks are still a hit");
    let p = o.seqs.iter().find(|p| p.id == 3).unwrap();
    assert_eq!((p.start, p.len), (12, 5));
}

#[test]
fn drafts_run_as_rows_but_only_accepted_tokens_are_published() {
    use memra_engine::prefix_cache::chain_hashes;
    let ns = namespace("a", None);
    let mut s = sched(64, 4, cfg(16, 8, 8, 0));
    s.add(seq(1, "a", vec![1, 2, 3]));
    let o = s.schedule();
    s.complete(&o);
    assert!(s.append_token(1, 4)); // tokens 1 2 3 4, computed 3
    // Drafts 5 6 7 8: rows at positions 3..8, all wanting logits.
    assert!(s.set_draft(1, vec![5, 6, 7, 8]));
    let o = s.schedule();
    assert_eq!(o.seqs[0].drafts, vec![5, 6, 7, 8]);
    let toks: Vec<u32> = o.batch.rows.iter().map(|r| r.token).collect();
    assert_eq!(toks, vec![4, 5, 6, 7, 8]);
    assert!(o.batch.rows.iter().all(|r| r.want_logits));
    s.complete(&o);
    // The target picked 5, then 9 (draft 6 rejected): tokens 1..5 then 9.
    assert!(s.append_token(1, 5));
    assert!(s.append_token(1, 9));
    s.accept_drafts(1, 1);
    s.check().unwrap();
    // Block 0 (1 2 3 4) is full and published; block 1 holds 5 (accepted) and rejected rows:
    // neither the drafted block (5 6 7 8) nor anything past the accepted tokens is published.
    let real = chain_hashes(&ns, &[1, 2, 3, 4, 5, 9, 10, 11], 4);
    let drafted = chain_hashes(&ns, &[1, 2, 3, 4, 5, 6, 7, 8], 4);
    assert!(s.kv().is_cached(real[0]));
    assert!(!s.kv().is_cached(drafted[1]));
    // The next step recomputes from the rejection point: one row, token 9 at position 5.
    let o = s.schedule();
    assert_eq!(o.batch.rows.len(), 1);
    assert_eq!((o.batch.rows[0].token, o.batch.rows[0].pos), (9, 5));
    assert!(o.seqs[0].drafts.is_empty(), "a draft is used once");
    s.complete(&o);
    assert!(s.append_token(1, 10));
    let o = s.schedule();
    s.complete(&o);
    assert!(s.append_token(1, 11));
    let o = s.schedule();
    s.complete(&o);
    // 1..4 | 5 9 10 11 full and computed from accepted tokens only: published now.
    assert!(s.kv().is_cached(real[1]));
    assert!(!s.kv().is_cached(drafted[1]));
    s.check().unwrap();
}

#[test]
fn drafts_are_cut_to_the_step_budget() {
    let mut s = sched(64, 4, cfg(3, 8, 8, 0));
    s.add(seq(1, "a", vec![1, 2]));
    let o = s.schedule();
    s.complete(&o);
    assert!(s.append_token(1, 3));
    s.set_draft(1, vec![4, 5, 6, 7]);
    let o = s.schedule();
    assert_eq!(o.batch.rows.len(), 3);
    assert_eq!(o.seqs[0].drafts, vec![4, 5]);
}

#[test]
fn a_draft_short_of_kv_is_left_out_and_preempts_nobody() {
    // 4 blocks of 4: two sequences of 7 tokens hold 2 blocks each, none free.
    let mut s = sched(4, 4, cfg(32, 8, 8, 0));
    s.add(seq(1, "a", (1..=6).collect()));
    s.add(seq(2, "a", (11..=16).collect()));
    let o = step(&mut s);
    assert_eq!(o.seqs.len(), 2);
    assert_eq!(s.kv().available(), 0);
    // Sequence 1 (7 tokens, 6 computed) drafts 4 more: positions 7..10 need a third block.
    assert!(s.set_draft(1, vec![20, 21, 22, 23]));
    let o = step(&mut s);
    assert!(
        o.preempted.is_empty(),
        "preempted {:?} for a draft",
        o.preempted
    );
    assert_eq!(o.seqs.len(), 2);
    assert!(o.seqs.iter().all(|p| p.drafts.is_empty() && p.len == 1));
    // Within its block a draft still runs.
    let mut s = sched(4, 4, cfg(32, 8, 8, 0));
    s.add(seq(1, "a", (1..=4).collect()));
    step(&mut s);
    assert!(s.set_draft(1, vec![20, 21]));
    let o = step(&mut s);
    assert_eq!(o.seqs[0].drafts, vec![20, 21]);
}

// ---- Recurrent-state models: snapshots at the last full block of a prompt, hits there ----

use memra_engine::scheduler::StateOp;

fn rcfg(budget: usize, running: usize, snapshots: Option<usize>) -> SchedulerConfig {
    SchedulerConfig {
        recurrent: true,
        state_snapshots: snapshots,
        ..cfg(budget, running, running, 0)
    }
}

type Planned = (usize, usize, Option<StateOp>, Option<StateOp>);

/// `(start, len, restore, save)` of sequence `id` in a plan (its ops name its own slot).
fn planned(o: &SchedulerOutput, id: SeqId) -> Planned {
    let (i, p) = o
        .seqs
        .iter()
        .enumerate()
        .find(|(_, p)| p.id == id)
        .expect("planned");
    for op in [p.restore, p.save].into_iter().flatten() {
        assert_eq!(op.slot, o.batch.state_slots[i], "the sequence's own slot");
    }
    (p.start, p.len, p.restore, p.save)
}

#[test]
fn recurrent_prompts_snapshot_their_last_full_block_and_hit_there() {
    let mut s = sched(32, 4, rcfg(64, 4, None));
    assert_eq!(s.snapshot_capacity(), 8);
    // 10 tokens, blocks of 4: the snapshot is at 8, the chunk stops there.
    s.add(seq(1, "a", (0..10).collect()));
    let o = step(&mut s);
    let (start, len, restore, save) = planned(&o, 1);
    assert_eq!((start, len, restore), (0, 8, None));
    let save = save.expect("a save at 8");
    assert_eq!(save.pos, 8);
    assert_eq!(s.snapshots(), 1);
    let o = step(&mut s);
    assert_eq!(planned(&o, 1), (8, 2, None, None));
    s.finish(1);
    // The same prompt: a hit of 8 tokens; the snapshot is restored before its first step.
    s.add(seq(2, "a", (0..10).collect()));
    let o = step(&mut s);
    let (start, len, restore, save2) = planned(&o, 2);
    assert_eq!((start, len, save2), (8, 2, None));
    assert_eq!(
        restore,
        Some(StateOp {
            slot: o.batch.state_slots[0],
            pos: 8,
            snap: save.snap
        })
    );
    assert_eq!(s.cached_tokens(2), 8);
    assert_eq!(s.prefix_hit_tokens(), 8);
    // A longer prompt through the same two blocks: the hit at 8, a snapshot of its own at 12.
    s.add(seq(3, "a", (0..14).collect()));
    let o = step(&mut s);
    let (start, len, restore, save) = planned(&o, 3);
    assert_eq!((start, len), (8, 4));
    assert_eq!(restore.map(|r| r.pos), Some(8));
    assert_eq!(save.map(|v| v.pos), Some(12));
    assert_eq!(s.snapshots(), 2);
    assert_eq!(s.cached_tokens(3), 8);
    // Its continuation; then a prompt one block deeper hits at 12.
    step(&mut s);
    s.add(seq(4, "a", (0..15).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 4).2.map(|r| r.pos), Some(12));
    assert_eq!(s.cached_tokens(4), 12);
    // Another tenant shares nothing.
    s.add(seq(5, "b", (0..10).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 5).2, None);
    assert_eq!(s.cached_tokens(5), 0);
}

#[test]
fn recurrent_chunks_end_at_the_snapshot() {
    let mut s = sched(32, 4, rcfg(3, 4, None));
    s.add(seq(1, "a", (0..10).collect()));
    let chunks: Vec<Planned> = (0..4).map(|_| planned(&step(&mut s), 1)).collect();
    let spans: Vec<(usize, usize)> = chunks.iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(spans, vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
    assert!(chunks[0].3.is_none() && chunks[1].3.is_none() && chunks[3].3.is_none());
    assert_eq!(chunks[2].3.map(|v| v.pos), Some(8));
}

#[test]
fn recurrent_short_prompts_take_no_snapshot() {
    let mut s = sched(32, 4, rcfg(64, 4, None));
    // P = 0 for up to one block plus one token: 1, 4 and 3 tokens; 5 tokens snapshot at 4.
    for (id, len) in [(1, 1), (2, 4), (3, 3)] {
        s.add(seq(id, "a", (0..len).collect()));
    }
    s.add(seq(4, "a", (10..15).collect()));
    let o = step(&mut s);
    for id in 1..=3 {
        assert_eq!(planned(&o, id).3, None, "sequence {id}");
    }
    assert_eq!(planned(&o, 4).3.map(|v| v.pos), Some(4));
    assert_eq!(s.snapshots(), 1);
    for id in 1..=4 {
        s.finish(id);
    }
    // A hit needs a snapshot: the 4-token prompt's block is cached but carries none.
    s.add(seq(5, "a", (0..6).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 5).2, None);
    assert_eq!(s.cached_tokens(5), 0);
}

#[test]
fn recurrent_snapshot_pool_is_bounded_and_lru() {
    let mut s = sched(64, 4, rcfg(64, 4, Some(1)));
    s.add(seq(1, "a", (0..10).collect()));
    step(&mut s);
    s.finish(1);
    // Another prompt needs the pool's only id: the first prompt's snapshot goes.
    s.add(seq(2, "a", (50..60).collect()));
    let o = step(&mut s);
    assert!(planned(&o, 2).3.is_some());
    s.finish(2);
    assert_eq!(s.snapshots(), 1);
    // The first prompt's blocks are still cached, its state is not: no hit, a new snapshot.
    s.add(seq(3, "a", (0..10).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 3).2, None);
    assert!(planned(&o, 3).3.is_some());
    assert_eq!(s.cached_tokens(3), 0);
    // A failed save is dropped: no hit on it later.
    let snap = planned(&o, 3).3.unwrap().snap;
    s.drop_snapshot(snap);
    s.check().unwrap();
    assert_eq!(s.snapshots(), 0);
    step(&mut s);
    s.finish(3);
    s.add(seq(4, "a", (0..10).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 4).2, None);
    // No snapshots at all: no hits, no saves.
    let mut s = sched(64, 4, rcfg(64, 4, Some(0)));
    for id in 0..2 {
        s.add(seq(id, "a", (0..10).collect()));
        let o = step(&mut s);
        assert_eq!((planned(&o, id).2, planned(&o, id).3), (None, None));
        assert_eq!(s.cached_tokens(id), 0);
        step(&mut s);
        s.finish(id);
    }
    // Nor without a prefix cache.
    let s = Scheduler::new(rcfg(64, 4, None), KvManager::new(64, 4, false));
    assert_eq!(s.snapshot_capacity(), 0);
}

#[test]
fn recurrent_snapshot_leaves_with_its_block() {
    // 4 blocks of 4: a 9-token prompt leaves 2 cached blocks, the second with a snapshot.
    let mut s = sched(4, 4, rcfg(64, 4, None));
    s.add(seq(1, "a", (0..9).collect()));
    step(&mut s);
    s.finish(1);
    assert_eq!(s.snapshots(), 1);
    // A 16-token prompt takes every block: the cached ones are evicted, the snapshot too.
    s.add(seq(2, "a", (100..116).collect()));
    // Its first chunk (to its own snapshot at 12) takes 3 blocks: block 1 of the first
    // prompt is evicted (a prefix goes from its tail), and its snapshot with it.
    let o = step(&mut s);
    assert_eq!(planned(&o, 2).3.map(|v| v.pos), Some(12));
    assert_eq!(s.snapshots(), 1);
    // The rest takes the last block: block 0 is evicted; the snapshot left is the new one.
    step(&mut s);
    assert_eq!(s.snapshots(), 1);
    s.finish(2);
    s.add(seq(3, "a", (0..9).collect()));
    let o = step(&mut s);
    assert_eq!(planned(&o, 3).2, None);
    assert_eq!(s.cached_tokens(3), 0);
}

#[test]
fn a_sequence_leaves_a_plan_cleanly() {
    let mut s = sched(32, 4, rcfg(64, 4, None));
    s.add(seq(1, "a", (0..5).collect()));
    s.add(seq(2, "b", (0..6).collect()));
    s.add(seq(3, "c", (0..3).collect()));
    let mut o = s.schedule();
    let slots = o.batch.state_slots.clone();
    assert!(o.remove_seq(1));
    assert!(!o.remove_seq(1));
    assert_eq!(o.seqs.iter().map(|p| p.id).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(o.batch.state_slots, slots[1..].to_vec());
    assert_eq!(o.batch.block_tables.len(), 2);
    let seqs: Vec<usize> = o.batch.rows.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [vec![0; 4], vec![1; 3]].concat());
    // The engine ends the removed sequence; the rest completes.
    s.finish(1);
    s.complete(&o);
    s.check().unwrap();
}

#[test]
fn non_recurrent_plans_have_no_state_ops() {
    let mut s = sched(32, 4, cfg(64, 4, 4, 0));
    assert_eq!(s.snapshot_capacity(), 0);
    for round in 0..2 {
        s.add(seq(round, "a", (0..10).collect()));
        let o = step(&mut s);
        assert!(
            o.seqs
                .iter()
                .all(|p| p.restore.is_none() && p.save.is_none())
        );
        assert_eq!(o.seqs[0].len, 10 - 8 * round as usize);
        s.finish(round);
    }
}
