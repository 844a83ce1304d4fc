//! The traffic store (engine/src/spec/traffic.rs): n-gram drafts from the outputs of earlier
//! requests of the same scope (tenant and `cache_salt`). The store against a brute-force scan
//! of what it holds, its bounds and its scopes; then in the engine: a request drafts from an
//! earlier request's output of its own tenant only, and its stream is plain decoding's.

use crate::engine_spec::Tokens;
use memra_engine::config::Arch;
use memra_engine::engine::EngineHandle;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::{EventStream, ValidRequest};
use memra_engine::spec::traffic::{MAX_N, MIN_N, TrafficStore};
use memra_engine::spec::{DrafterKind, SpecConfig, SpecCounts};
use memra_engine::testing::text_request;

#[test]
fn traffic_store_proposes_what_followed_up_to_the_sequence_end() {
    let mut s = TrafficStore::new(1000);
    s.feed(b"t", &[1, 2, 3, 4, 5, 6]);
    s.feed(b"t", &[7, 8, 9]);
    assert_eq!(s.len(), 9);
    assert_eq!(s.propose(b"t", &[40, 2, 3], 2), (vec![4, 5], 2));
    // Never past the end of the sequence the match came from (6 ends it, 7 is the next one's).
    assert_eq!(s.propose(b"t", &[40, 2, 3], 16), (vec![4, 5, 6], 2));
    // The last n-gram of a sequence has nothing after it; nor do n-grams across sequences.
    assert_eq!(s.propose(b"t", &[5, 6], 4), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[6, 7], 4), (Vec::new(), 0));
    // A single token is no match (the store starts at MIN_N = 2).
    assert_eq!(MIN_N, 2);
    assert_eq!(s.propose(b"t", &[40, 41, 3], 4), (Vec::new(), 0));
}

#[test]
fn traffic_store_longest_then_latest_match_wins() {
    let mut s = TrafficStore::new(1000);
    // [2, 3] is followed by 9 in the later sequence, [1, 2, 3] by 4 in the earlier one.
    s.feed(b"t", &[1, 2, 3, 4, 5]);
    s.feed(b"t", &[8, 2, 3, 9, 10]);
    assert_eq!(s.propose(b"t", &[0, 1, 2, 3], 2), (vec![4, 5], 3));
    assert_eq!(s.propose(b"t", &[0, 7, 2, 3], 2), (vec![9, 10], 2));
    // A 5-token suffix is looked up as its last MAX_N tokens.
    assert_eq!(MAX_N, 4);
    s.feed(b"t", &[1, 2, 3, 4, 6, 7]);
    assert_eq!(s.propose(b"t", &[0, 1, 2, 3, 4], 3), (vec![6, 7], 4));
    // Latest occurrence inside one sequence too.
    s.feed(b"t", &[20, 21, 22, 20, 21, 23]);
    assert_eq!(s.propose(b"t", &[20, 21], 1), (vec![23], 2));
}

#[test]
fn traffic_store_forgets_what_it_overwrites() {
    let mut s = TrafficStore::new(12);
    s.feed(b"t", &[1, 2, 3, 4, 5, 6]);
    s.feed(b"t", &[10, 11, 12, 13, 14, 15]);
    assert_eq!(s.len(), 12);
    assert_eq!(s.propose(b"t", &[1, 2], 1), (vec![3], 2));
    // Four more tokens push out 1, 2, 3, 4: their n-grams are gone, the rest stay.
    s.feed(b"t", &[30, 31, 32, 33]);
    assert_eq!(s.len(), 12);
    assert_eq!(s.propose(b"t", &[1, 2], 4), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[2, 3, 4], 4), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[4, 5], 4), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[5], 4), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[11, 12], 8), (vec![13, 14, 15], 2));
    assert!(s.entries() <= 3 * s.len());
    // An n-gram that occurs again later keeps its later entry when the earlier one goes.
    let mut s = TrafficStore::new(12);
    s.feed(b"t", &[1, 2, 3, 9]);
    s.feed(b"t", &[1, 2, 7, 8]);
    s.feed(b"t", &[40, 41, 42, 43]);
    assert_eq!(s.propose(b"t", &[1, 2], 2), (vec![7, 8], 2));
    s.feed(b"t", &[50, 51, 52, 53]);
    assert_eq!(s.propose(b"t", &[3], 2), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[1, 2], 2), (vec![7, 8], 2));
    // A sequence longer than the store keeps its tail.
    s.feed(b"t", &(100..120).collect::<Vec<u32>>());
    assert_eq!(s.len(), 12);
    assert_eq!(s.propose(b"t", &[1, 2], 2), (Vec::new(), 0));
    assert_eq!(s.propose(b"t", &[108, 109], 2), (vec![110, 111], 2));
    assert_eq!(s.propose(b"t", &[106, 107], 2), (Vec::new(), 0));
}

#[test]
fn traffic_store_scopes_never_see_each_other() {
    let mut s = TrafficStore::new(20);
    s.feed(b"tenant-1", &[1, 2, 3, 4, 5]);
    assert_eq!(s.propose(b"tenant-1", &[1, 2], 3), (vec![3, 4, 5], 2));
    assert_eq!(s.propose(b"tenant-2", &[1, 2], 3), (Vec::new(), 0));
    s.feed(b"tenant-2", &[1, 2, 9, 9, 9]);
    assert_eq!(s.propose(b"tenant-1", &[1, 2], 3), (vec![3, 4, 5], 2));
    assert_eq!(s.propose(b"tenant-2", &[1, 2], 3), (vec![9, 9, 9], 2));
    assert_eq!(s.scopes(), 2);
    // Capacity is shared: tenant-2's traffic pushes out the oldest tokens of the scope used
    // least recently (tenant-1), which never reads tenant-2's tokens.
    s.feed(b"tenant-2", &(30..44).collect::<Vec<u32>>());
    assert_eq!(s.len(), 20);
    assert_eq!(s.scope_len(b"tenant-1"), 1);
    assert_eq!(s.propose(b"tenant-1", &[1, 2], 3), (Vec::new(), 0));
    assert_eq!(s.propose(b"tenant-1", &[30, 31], 3), (Vec::new(), 0));
    assert_eq!(s.propose(b"tenant-2", &[30, 31], 3), (vec![32, 33, 34], 2));
    s.feed(b"tenant-3", &(60..80).collect::<Vec<u32>>());
    assert_eq!((s.len(), s.scopes()), (20, 1), "emptied scopes are dropped");
    assert_eq!(s.propose(b"tenant-2", &[30, 31], 3), (Vec::new(), 0));
}

/// What the store must propose, by a scan: `held` is what a scope holds (token, sequence), in
/// feed order; the latest occurrence of the longest suffix (MAX_N..=MIN_N) inside one sequence
/// and followed by a token of it.
fn scan(held: &[(u32, usize)], ctx: &[u32], k: usize) -> (Vec<u32>, usize) {
    for n in (MIN_N..=MAX_N).rev() {
        if n > ctx.len() || held.len() <= n {
            continue;
        }
        let suffix = &ctx[ctx.len() - n..];
        let hit = (0..held.len() - n).rev().find(|&i| {
            let seq = held[i].1;
            (0..=n).all(|j| held[i + j].1 == seq) && (0..n).all(|j| held[i + j].0 == suffix[j])
        });
        if let Some(i) = hit {
            let seq = held[i].1;
            let out: Vec<u32> = held[i + n..]
                .iter()
                .take_while(|t| t.1 == seq)
                .take(k)
                .map(|t| t.0)
                .collect();
            return (out, n);
        }
    }
    (Vec::new(), 0)
}

#[test]
fn traffic_store_matches_a_scan_of_what_it_holds_within_its_bounds() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let cap = 300;
    let scopes: [&[u8]; 3] = [b"a", b"b", b"c"];
    let mut s = TrafficStore::new(cap);
    // Everything fed per scope: (token, sequence number).
    let mut fed: Vec<Vec<(u32, usize)>> = vec![Vec::new(); 3];
    let mut checked = 0;
    for seq in 0..400 {
        let sc = rnd(3) as usize;
        let len = rnd(40) as usize;
        // A small vocabulary: many repeated n-grams, many replaced and evicted entries.
        let toks: Vec<u32> = (0..len).map(|_| rnd(5) as u32).collect();
        s.feed(scopes[sc], &toks);
        if len > MIN_N {
            let keep = len.min(cap);
            fed[sc].extend(toks[len - keep..].iter().map(|&t| (t, seq)));
        }
        assert!(s.len() <= cap, "{} > {cap}", s.len());
        let held: Vec<usize> = scopes.iter().map(|sc| s.scope_len(sc)).collect();
        assert_eq!(held.iter().sum::<usize>(), s.len());
        assert!(s.entries() <= (MAX_N - MIN_N + 1) * s.len());
        for (i, sc) in scopes.iter().enumerate() {
            // A scope holds the last tokens fed to it.
            let held = &fed[i][fed[i].len() - held[i]..];
            for _ in 0..8 {
                let ctx: Vec<u32> = (0..rnd(6)).map(|_| rnd(5) as u32).collect();
                let k = 1 + rnd(10) as usize;
                assert_eq!(
                    s.propose(sc, &ctx, k),
                    scan(held, &ctx, k),
                    "scope {i} ctx {ctx:?} k {k}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);
}

// The engine: a tiny random model on the CPU.
const VOCAB: usize = 512;

fn start(spec: Option<SpecConfig>) -> EngineHandle {
    let weights = random_weights(&tiny_config(Arch::Llama, VOCAB), 11, DType::Q8_0).unwrap();
    crate::engine_spec::start_with(weights, spec)
}

fn request(tenant: &str, salt: Option<&str>, speculative: bool) -> ValidRequest {
    let prompt: Vec<u32> = (0..9).map(|j| (j * 37 % 500) as u32 + 3).collect();
    ValidRequest {
        model: "tiny".into(),
        tenant: tenant.into(),
        cache_salt: salt.map(str::to_string),
        logprobs: Some(2),
        speculative,
        ..text_request(prompt, 40)
    }
}

/// The tokens of a stream (engine_spec's `collect`).
fn collect(s: EventStream) -> Tokens {
    crate::engine_spec::collect(s).0
}

/// Runs `req` alone on `e`; its tokens and the model's traffic-store draft counters after it
/// (the worker publishes them after the step that ended the request, when it shows no
/// sequence running: waited for).
fn run(e: &EngineHandle, req: ValidRequest) -> (Tokens, SpecCounts) {
    let toks = collect(e.submit(req).unwrap());
    let t0 = std::time::Instant::now();
    loop {
        let stats = e.stats();
        let m = &stats.models[0];
        if (m.running == 0 && m.waiting == 0) || t0.elapsed().as_secs() >= 5 {
            return (toks, m.spec_by_traffic);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn traffic_drafts_come_from_the_same_tenant_only_and_change_no_byte() {
    let plain = start(None);
    let (want, _) = run(&plain, request("t1", None, false));
    plain.shutdown();
    assert_eq!(want.len(), 40);

    let spec = SpecConfig {
        row_cost_permille: Some(100),
        ..SpecConfig::new(DrafterKind::Ngram, 8).unwrap()
    };
    let e = start(Some(spec));
    // Request A of tenant t1: nothing in the store yet.
    let (a, after_a) = run(&e, request("t1", None, true));
    assert_eq!(a, want, "request A differs from plain decoding");
    assert_eq!(
        after_a,
        SpecCounts::default(),
        "A drafted from an empty store"
    );
    // The same request of tenant t2, of t1 with a cache salt, and of t3 after a t3 request
    // that opted out of speculation (which feeds nothing): A's output is not in their scopes.
    let mut last = after_a;
    for (tenant, salt, first_opts_out) in [("t2", None, false), ("t1", Some("s"), false)]
        .into_iter()
        .chain([("t3", None, true)])
    {
        if first_opts_out {
            let (t, _) = run(&e, request(tenant, salt, false));
            assert_eq!(t, want);
        }
        let (t, c) = run(&e, request(tenant, salt, true));
        assert_eq!(t, want, "{tenant} {salt:?}: differs from plain decoding");
        assert_eq!(
            c, last,
            "{tenant} {salt:?}: drafted from another scope's traffic"
        );
        last = c;
    }
    // Request B of t1: the same continuation, drafted from A's output.
    let (b, after_b) = run(&e, request("t1", None, true));
    assert_eq!(b, want, "request B differs from plain decoding");
    let (d, acc) = (
        after_b.drafted - last.drafted,
        after_b.accepted - last.accepted,
    );
    eprintln!("request B: {acc} of {d} traffic drafts accepted");
    assert!(d > 0, "request B drew no draft from the traffic store");
    assert!(
        acc > 0,
        "no traffic draft accepted: the test proves nothing"
    );
    // t2's own second request drafts from t2's first one.
    let (t2, after) = run(&e, request("t2", None, true));
    assert_eq!(t2, want);
    assert!(
        after.drafted > after_b.drafted,
        "t2 drew nothing from its own scope"
    );
    e.shutdown();
}
