#!/usr/bin/env python3
"""A cross-request n-gram table replayed on recorded SmolLM2 generations: where the context has no
match of 2 or more tokens, draft from the latest occurrence of the longest suffix (4..2 tokens)
in the OTHER generations' outputs (leave-one-out: a request never sees its own output; with
`prompts`, their prompts are indexed too, each before its output). Two replays, each the table over today's drafter in tokens per unit of step time:
K = 4 every step (ngram_sim.py's replay), and the engine's rule (depth_sim.py: the controller,
the depth from the match length, K = 8; the table's drafts get their own match-length bucket,
learned like the others from the sampled priors of 1-token matches).
The engine's traffic store (engine/src/spec/traffic.rs) implements the outputs-only policy.
Usage: tools/spec/global_sim.py MODE [prompts] (MODE greedy or sampled);
reports/spec/ngram-sampled-cpu.md."""
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from depth_sim import GROUNDED, MatchRates, SpecControl, best_depth  # noqa: E402
from ngram_sim import propose, replay  # noqa: E402

FILES = ["reports/spec/smollm2-cpu-generations.jsonl", "reports/spec/smollm2-cpu-generations-more.jsonl"]


def build_index(corpus, n_max=4):
    idx = {}
    for toks in corpus:
        for n in range(2, n_max + 1):
            for i in range(len(toks) - n):
                idx[(n, tuple(toks[i:i + n]))] = (toks, i + n)  # the latest occurrence wins
    return idx


def with_table(idx, n_max=4):
    """(drafts, match length; 0 for a draft from the table)."""
    def prop(t, k):
        d, m = propose(t, k)
        if d and m >= 2:
            return d, m
        for n in range(n_max, 1, -1):
            hit = idx.get((n, tuple(t[len(t) - n:]))) if n <= len(t) else None
            if hit:
                toks, j = hit
                return toks[j:j + k], 0
        return d, m
    return prop


def rule_replay(prompt, out, prop, r, k=8):
    """depth_sim.replay's "match" policy for one generation with proposer `prop` (m 0: the
    table's own bucket)."""
    table, own = MatchRates(True, 0.98, 4.0), MatchRates(True, 0.98, 4.0)
    ctl, full, n, tokens, time = SpecControl(k), prompt + out, len(prompt), 0, 0.0
    while n < len(full):
        room, d, m = len(full) - n - 1, [], 0
        if not ctl.backing_off() and min(k, room) > 0:
            d, m = prop(full[:n], min(k, room))
            if d:
                rates = own if m == 0 else table
                d = d[:best_depth(rates.p(max(m, 1)), r, min(k, room))]
        a = 0
        while a < len(d) and d[a] == full[n + a]:
            a += 1
        ctl.verified(len(d), a, r)
        if d:
            (own if m == 0 else table).learn(max(m, 1), a, a + (a < len(d)))
        time += 1 + r * len(d)
        n += a + 1
        tokens += a + 1
    return tokens / time


if __name__ == "__main__":
    mode = sys.argv[1]
    with_prompts = sys.argv[2:] == ["prompts"]
    seqs = []
    for f in FILES:
        for line in open(f):
            d = json.loads(line)
            if d["mode"] == mode:
                seqs.append((d["kind"], d["prompt"], d["tokens"]))
    grounded = set(GROUNDED.split(","))
    print("| r | replay | grounded kinds | all kinds | other kinds |\n|---|---|---:|---:|---:|")
    for r in (0.03, 0.1, 0.3):
        res = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for i, (kind, p, out) in enumerate(seqs):
            prop = with_table(build_index((pr + o if with_prompts else o)
                                          for j, (_, pr, o) in enumerate(seqs) if j != i))
            rows = [replay([(p, out)], propose, r)[0], replay([(p, out)], prop, r)[0],
                    rule_replay(p, out, propose, r), rule_replay(p, out, prop, r)]
            for key in ("grounded" if kind in grounded else "other", "all"):
                for c in range(4):
                    res[key][c] += rows[c] * len(out)
        for name, (a, b) in (("K = 4", (0, 1)), ("engine's rule", (2, 3))):
            cells = [f"{res[key][b] / res[key][a] - 1:+.1%}" for key in ("grounded", "all", "other")]
            print(f"| {r} | {name} | " + " | ".join(cells) + " |")
