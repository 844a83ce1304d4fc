#!/usr/bin/env python3
"""A cross-request n-gram table replayed on recorded SmolLM2 generations: where the context has no
match of 2 or more tokens, draft from the latest occurrence of the longest suffix (4..2 tokens)
in the OTHER generations' prompts-and-outputs (leave-one-out: a request never sees its own
output). K = 4 every step (ngram_sim.py's replay, no controller); prints tokens per unit of step
time of the table over today's drafter, by kind group, at row costs r 0.03 / 0.1 / 0.3.
Usage: tools/spec/global_sim.py MODE (greedy or sampled); reports/spec/ngram-sampled-cpu.md."""
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ngram_sim import propose, replay

def load(files, mode, kinds=None):
    seqs = []
    for f in files:
        for line in open(f):
            d = json.loads(line)
            if d["mode"] == mode and (kinds is None or d["kind"] in kinds):
                seqs.append((d["kind"], d["prompt"], d["tokens"]))
    return seqs

def build_index(corpus_seqs, n_max=4):
    idx = {}
    for toks in corpus_seqs:
        for n in range(2, n_max + 1):
            for i in range(len(toks) - n):
                idx[(n, tuple(toks[i:i+n]))] = (toks, i + n)   # latest wins
    return idx

def make_global(idx, n_max=4, min_global=2):
    def prop(t, k):
        d, m = propose(t, k)
        if d and m >= 2:
            return d, m
        for n in range(n_max, min_global - 1, -1):
            if n > len(t): continue
            hit = idx.get((n, tuple(t[len(t)-n:])))
            if hit:
                toks, j = hit
                return toks[j:j+k], 10 + n
        return d, m
    return prop

mode = sys.argv[1]
files = ['reports/spec/smollm2-cpu-generations.jsonl', 'reports/spec/smollm2-cpu-generations-more.jsonl']
seqs = load(files, mode)
grounded = {"code_edit", "rag_quote", "extraction"}
for r in (0.03, 0.1, 0.3):
    base_all = []; glob_all = []
    res = collections.defaultdict(lambda: [0.0, 0.0])
    # leave-one-out: the global table holds the other generations' outputs (other requests)
    for i, (kind, p, out) in enumerate(seqs):
        others = [o for j, (_, _, o) in enumerate(seqs) if j != i]
        idx = build_index(others)
        b, _ = replay([(p, out)], propose, r)
        g, _ = replay([(p, out)], make_global(idx), r)
        key = "grounded" if kind in grounded else "other"
        res[key][0] += b * len(out); res[key][1] += g * len(out)
        res["all"][0] += b * len(out); res["all"][1] += g * len(out)
    print(f"r={r}: " + ", ".join(f"{k}: global/latest {v[1]/v[0]:.3f}" for k, v in res.items()))
