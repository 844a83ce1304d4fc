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
    }
}

fn seq(id: SeqId, tenant: &str, prompt: Vec<u32>) -> NewSeq {
    NewSeq {
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
