#!/usr/bin/env python3
"""Offline n-gram drafting on recorded generations: acceptance by match length and tokens per
unit of step time under a row cost r (a step of K drafts costs 1 + r*K), for drafter variants.

Input: JSON lines {"kind", "mode", "prompt": [ids], "tokens": [ids]} (run-gen --json's prompt_ids
and tokens), e.g. reports/spec/smollm2-cpu-generations.jsonl. Usage: tools/spec/ngram_sim.py
FILE MODE [KIND,...] (MODE greedy or sampled; reports/spec/ngram-sampled-cpu.md has a run).
The drafts are replayed against the recorded tokens, K = 4 every step (no controller): a
variant's numbers compare drafts, not the engine's adaptive depth."""
import collections
import json
import sys


def propose(t, k, max_n=4, min_n=1, window=4096):
    """NgramDrafter::propose: the longest suffix (max_n..min_n) seen before, latest occurrence."""
    n_tok, lo = len(t), max(0, len(t) - window)
    for n in range(max_n, min_n - 1, -1):
        if n >= n_tok:
            continue
        suf = t[n_tok - n:]
        for i in range(n_tok - n - 1, lo - 1, -1):
            if t[i:i + n] == suf:
                return t[i + n:min(i + n + k, n_tok)], n
    return [], 0


def replay(seqs, prop, r, k=4):
    """(tokens per unit of step time, acceptance by match length)."""
    tokens, time, by_n = 0, 0.0, collections.defaultdict(lambda: [0, 0])
    for prompt, out in seqs:
        full, n = prompt + out, len(prompt)
        while n < len(full):
            d, m = prop(full[:n], k)
            a = 0
            while a < len(d) and n + a < len(full) and d[a] == full[n + a]:
                a += 1
            if d:
                by_n[m][0] += a
                by_n[m][1] += a + (a < len(d))
            time += 1 + r * len(d)
            n += a + 1
            tokens += a + 1
    return tokens / time, {m: round(h / max(t, 1), 2) for m, (h, t) in sorted(by_n.items())}


VARIANTS = {
    "latest (engine)": propose,
    "no 1-gram drafts": lambda t, k: propose(t, k, min_n=2),
    "1-gram drafts cut to 1": lambda t, k: (lambda d, m: (d[:1] if m == 1 else d, m))(*propose(t, k)),
}

if __name__ == "__main__":
    kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    seqs = []
    for line in open(sys.argv[1]):
        d = json.loads(line)
        if d["mode"] == sys.argv[2] and (kinds is None or d["kind"] in kinds):
            seqs.append((d["prompt"], d["tokens"]))
    print(f"{len(seqs)} generations")
    for r in (0.03, 0.1, 0.3):
        for name, p in VARIANTS.items():
            s, by_n = replay(seqs, p, r)
            print(f"r={r:<5} {name:<24} {s:.3f} tokens/step-time  acceptance by match length {by_n}")
