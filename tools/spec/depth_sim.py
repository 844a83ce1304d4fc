#!/usr/bin/env python3
"""Offline replay of the engine's speculation depth policy on recorded generations: the n-gram
drafter (ngram_sim.propose) with the engine's per-sequence controller (engine/src/spec/
control.rs, ported line for line), before and after choosing each draft's depth from the length
of the suffix match that proposed it.

A step of K drafts costs 1 + r*K plain steps (r fixed, as SpecConfig::row_cost_permille fixes
it); the result is tokens per unit of step time (plain decoding = 1.0). Generations are replayed
in file order, one after the other (a model-wide acceptance table carries over between them).

Usage: tools/spec/depth_sim.py FILE   (prints the markdown table of reports/spec/
ngram-sampled-cpu.md, "Depth from the match length": grounded kinds and all kinds, greedy and
sampled, r = 0.03, 0.1, 0.3)
"""
import json
import sys

from ngram_sim import propose

# control.rs
DECAY = 0.7
MAX_BACKOFF = 64


def best_depth(p, r, k_max):
    p, r = min(max(p, 0.0), 1.0), max(r, 0.0)
    best, best_k, tokens, pk = 0.0, 1, 1.0, 1.0
    for k in range(1, max(k_max, 1) + 1):
        pk *= p
        tokens += pk
        v = tokens / (1.0 + r * k)
        if v > best * (1.0 + 1e-6):
            best, best_k = v, k
    return best_k


class SpecControl:
    def __init__(self, k_max):
        self.k_max = max(k_max, 1)
        self.kc = self.k_max
        self.hits, self.tries, self.off, self.backoff = 1.0, 1.0, 0, 4

    def k(self):
        return 0 if self.off > 0 else self.kc

    def depth(self, r):
        k = self.k()
        return 0 if k == 0 else best_depth(self.rate(), r, k)

    def backing_off(self):
        return self.off > 0

    def plain_step(self):
        if self.off > 0:
            self.off -= 1
            if self.off == 0:
                self.kc = 1
                if self.rate() < 0.5:
                    self.hits, self.tries = 0.5, 1.0

    def verified(self, drafted, accepted, r):
        if drafted == 0:
            return self.plain_step()
        rejected = int(accepted < drafted)
        self.hits = DECAY * self.hits + accepted
        self.tries = DECAY * self.tries + accepted + rejected
        if accepted == drafted:
            self.kc = min(self.kc + 1, self.k_max)
            self.backoff = 4
        elif accepted == 0:
            self.kc = max(self.kc // 2, 1)
        if self.rate() < r:
            self.off = self.backoff
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)

    def rate(self):
        return self.hits / self.tries if self.tries > 0 else 1.0


# The match-length table (engine/src/spec/control.rs MatchRates): priors from the offline
# acceptance by match length (reports/spec/ngram-sampled-cpu.md), greedy and sampled.
PRIORS = {False: [0.31, 0.60, 0.70, 0.97], True: [0.35, 0.54, 0.61, 0.88]}


class MatchRates:
    def __init__(self, sampled, decay, weight):
        self.decay = decay
        self.rate = [[p * weight, weight] for p in PRIORS[sampled]]

    def p(self, m):
        h, t = self.rate[min(max(m, 1), 4) - 1]
        return h / t if t > 0 else 0.0

    def learn(self, m, hits, tries):
        b = self.rate[min(max(m, 1), 4) - 1]
        b[0] = self.decay * b[0] + hits
        b[1] = self.decay * b[1] + tries


def replay(seqs, r, k, policy, sampled, scope="model", decay=0.98, weight=4.0,
           ceiling=False):
    """policy "control": today's engine (the controller's depth for every draft); "match": the
    depth from the match length (best_depth under the table's p, capped by k, room and, with
    `ceiling`, the controller's ceiling; the controller still backs off)."""
    tokens, time = 0, 0.0
    table = MatchRates(sampled, decay, weight)
    for prompt, out in seqs:
        if scope == "seq":
            table = MatchRates(sampled, decay, weight)
        ctl = SpecControl(k)
        full, n = prompt + out, len(prompt)
        while n < len(full):
            room = len(full) - n - 1
            d, m = [], 0
            if not ctl.backing_off():
                if policy == "control":
                    ask = min(ctl.depth(r), room)
                else:
                    ask = min(ctl.k() if ceiling else k, room)
                if ask > 0:
                    d, m = propose(full[:n], ask)
                    if d and policy == "match":
                        d = d[:best_depth(table.p(m), r, ask)]
            a = 0
            while a < len(d) and d[a] == full[n + a]:
                a += 1
            ctl.verified(len(d), a, r)
            if d and policy == "match":
                table.learn(m, a, a + (a < len(d)))
            time += 1 + r * len(d)
            n += a + 1
            tokens += a + 1
    return tokens / time


def load(path, mode, kinds):
    seqs = []
    for line in open(path):
        d = json.loads(line)
        if d["mode"] == mode and (kinds is None or d["kind"] in kinds):
            seqs.append((d["prompt"], d["tokens"]))
    return seqs


GROUNDED = "code_edit,rag_quote,json_extract"


if __name__ == "__main__":
    # before: today's engine (the controller's depth, K = 4); after: the engine's rule (the
    # depth from the match length, a model-wide table, K = DEFAULT_K = 8). The other columns
    # are the variants measured against it (and dropped): the controller alone at K = 8, the
    # rule capped by the controller's ceiling too, and a table per sequence.
    print("| kinds | decoding | r | before (K=4) | after (K=8) | after/before "
          "| controller K=8 | rule + ceiling | rule, table per sequence |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for kinds in (GROUNDED, None):
        for mode in ("greedy", "sampled"):
            seqs = load(sys.argv[1], mode, kinds.split(",") if kinds else None)
            s = mode == "sampled"
            for r in (0.03, 0.1, 0.3):
                before = replay(seqs, r, 4, "control", s)
                after = replay(seqs, r, 8, "match", s)
                c8 = replay(seqs, r, 8, "control", s)
                ceil = replay(seqs, r, 8, "match", s, ceiling=True)
                per_seq = replay(seqs, r, 8, "match", s, scope="seq")
                name = f"grounded ({len(seqs)})" if kinds else f"all ({len(seqs)})"
                print(f"| {name} | {mode} | {r} | {before:.3f} | {after:.3f} | "
                      f"{after / before:.3f} | {c8:.3f} | {ceil:.3f} | {per_seq:.3f} |")
