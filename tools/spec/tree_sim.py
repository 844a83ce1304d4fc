#!/usr/bin/env python3
"""Offline replay of multi-candidate n-gram drafts (several continuations of one sequence verified
in one step as extra rows) on recorded generations, against today's single chain.

Acceptance is exact for sampled requests too: the target's token at a position is fixed by
(seed, position, logits), and a tree node's logits are those of its path's context, so a draft
node is accepted iff its path equals the recorded tokens. A step that verifies R draft rows
(tree nodes, the root's row not counted) costs 1 + r*R plain steps, as a chain of K drafts costs
1 + r*K in ngram_sim.py / depth_sim.py; the result is tokens per unit of step time (plain = 1.0).

Candidates. `occurrences` lists the earlier occurrences of the context's suffixes, longest suffix
(4..1) first, latest first, one per continuation start (an occurrence of the 3-suffix one token
after an occurrence of the 4-suffix continues the same way), each with its match length m and its
continuation (up to K tokens, cut at the context's end); the first is ngram_sim.propose's draft.
Variants:
  chain      the first occurrence's continuation (the engine's drafter);
  two        that plus the next listed occurrence whose continuation's FIRST token differs;
  tree N     the continuations of up to N listed occurrences merged into a prefix tree;
  next2      the chain plus, at its first token, the second most likely first token of the tree
             (one extra row, a depth-1 branch).
A node's score estimates the chance that it is accepted: P(child | parent accepted) =
sum over the occurrences through the child of w*alpha(m) / sum of w over the occurrences through
the parent that go on, alpha(m) the acceptance of a draft by an m-token match (depth_sim's
MatchRates, the priors of reports/spec/ngram-sampled-cpu.md, learned as the engine learns them
from the first occurrence's chain), w = WEIGHT**m (longer matches count more); the score is the
product down the path (for one chain: alpha(m)**depth, the engine's best_depth model). The kept
nodes are the highest scores (a parent always scores at least its child, so they form a tree):
  fixed      every node up to depth K, at most R rows, every step (no controller);
  rule       the number of rows k <= R (and depth <= K, the room) maximising
             (1 + sum of the k best scores) / (1 + r*k) -- for one chain exactly best_depth --
             with the engine's per-sequence controller (depth_sim.SpecControl) backing off.
The accepted length is the longest kept root path that equals the recorded tokens; a step yields
it plus one (the target's own token after it).

Usage (from tools/spec):
  python3 tree_sim.py FILE [FILE...]            the markdown table of
      reports/spec/ngram-sampled-cpu.md "Multi-candidate drafts (replay)": per data set, kinds
      (grounded, all) and r (0.03, 0.1, 0.3), tokens per step time and mean accepted drafts per step
  python3 tree_sim.py --check FILE              today's chain against ngram_sim.replay (K = 4) and
      depth_sim.replay (rule, K = 8): the numbers must be equal
  python3 tree_sim.py --diag FILE [FILE...]     where the chain's first draft is rejected, how often
      the recorded token is another occurrence's first token (by rank)
  python3 tree_sim.py --oracle FILE [FILE...]   the bound on any choice among the first 1, 2, 16
      occurrences: each step drafts exactly the best one's accepted prefix (no wasted row)
Options: --mode greedy|sampled (default sampled), --kinds KIND,... (default: grounded, then all).
"""
import bisect
import collections
import json
import sys

import depth_sim
import ngram_sim
from depth_sim import GROUNDED, MatchRates, SpecControl

WEIGHT = 4.0


class Index:
    """Positions of every n-gram (n <= max_n) of one sequence, to list the earlier occurrences of
    a context's suffixes without rescanning (the same occurrences as ngram_sim.propose's scan)."""

    def __init__(self, full, max_n=4):
        self.full, self.max_n = full, max_n
        self.pos = [None] + [collections.defaultdict(list) for _ in range(max_n)]
        for n in range(1, max_n + 1):
            for i in range(len(full) - n + 1):
                self.pos[n][tuple(full[i:i + n])].append(i)

    def occurrences(self, p, k, limit, min_n=1, window=4096):
        """[(m, continuation)] for the context full[:p]: longest suffix first, latest first, one
        per continuation start, at most `limit`; continuations of up to k tokens before p."""
        full, lo, seen, out = self.full, max(0, p - window), set(), []
        for n in range(self.max_n, min_n - 1, -1):
            if n >= p:
                continue
            lst = self.pos[n].get(tuple(full[p - n:p]), ())
            j = bisect.bisect_right(lst, p - n - 1) - 1
            while j >= 0 and lst[j] >= lo:
                s = lst[j] + n
                j -= 1
                if s in seen:
                    continue
                seen.add(s)
                out.append((n, full[s:min(s + k, p)]))
                if len(out) >= limit:
                    return out
        return out


def two_chains(occ):
    """The first occurrence and the next one whose continuation's first token differs."""
    for o in occ[1:]:
        if o[1][0] != occ[0][1][0]:
            return [occ[0], o]
    return occ[:1]


def build(occ, alpha, weight=WEIGHT):
    """The prefix tree of the continuations: [(score, depth, order, token, parent)], node 0 the
    root (score 1). Scores as the module's docstring says."""
    nodes = [[1.0, 0, 0, None, -1]]
    kids = [{}]
    through = [list(range(len(occ)))]
    for j, (_, c) in enumerate(occ):
        v = 0
        for tok in c:
            u = kids[v].get(tok)
            if u is None:
                u = len(nodes)
                kids[v][tok] = u
                nodes.append([0.0, nodes[v][1] + 1, u, tok, v])
                kids.append({})
                through.append([])
            through[u].append(j)
            v = u
    w = [weight ** m for m, _ in occ]
    for u in range(1, len(nodes)):  # parents come before children
        v = nodes[u][4]
        d = nodes[v][1]
        den = sum(w[j] for j in through[v] if len(occ[j][1]) > d)
        num = sum(w[j] * alpha(occ[j][0]) for j in through[u])
        nodes[u][0] = nodes[v][0] * num / den
    return nodes


def keep(nodes, rows, depth):
    """The best `rows` nodes of depth <= `depth` by score (ties: shallower, earlier)."""
    cand = sorted((-s, d, o) for s, d, o, _, _ in nodes[1:] if d <= depth)
    return [o for _, _, o in cand[:rows]]


def accepted(nodes, kept, truth):
    """The longest kept root path equal to truth, and whether it ends at a kept leaf."""
    kept = set(kept)
    kids = collections.defaultdict(dict)
    for u in kept:
        kids[nodes[u][4]][nodes[u][3]] = u
    v, a = 0, 0
    while a < len(truth) and truth[a] in kids[v]:
        v = kids[v][truth[a]]
        a += 1
    return a, not kids[v]


def replay(seqs, r, variant, k=8, rows=8, limit=16, policy="rule", sampled=True,
           weight=WEIGHT, decay=0.98, prior_weight=4.0, select_r=None):
    """(tokens per unit of step time, mean accepted drafts per step, mean rows per step).
    variant: chain, two, tree, next2. policy: fixed (every node up to depth k, at most `rows`,
    ngram_sim's replay: no room cap) or rule (module docstring; depth_sim's replay). select_r:
    the row cost the rule sizes the tree with (default r; the step is charged r either way)."""
    select_r = r if select_r is None else select_r
    tokens, time, steps, acc, nrows = 0, 0.0, 0, 0, 0
    table = MatchRates(sampled, decay, prior_weight)
    alpha = table.p
    for prompt, out in seqs:
        full, n = prompt + out, len(prompt)
        ix = Index(full)
        ctl = SpecControl(k)
        while n < len(full):
            room = len(full) - n - 1 if policy == "rule" else k
            kept, nodes, occ = [], None, []
            if policy == "fixed" or not ctl.backing_off():
                depth = min(k, room)
                if depth > 0:
                    occ = ix.occurrences(n, depth, 1 if variant == "chain" else limit)
            if occ:
                base = occ
                if variant == "chain":
                    base = occ[:1]
                elif variant == "two":
                    base = two_chains(occ)
                nodes = build(base, alpha, weight)
                if variant == "next2":
                    # the first chain, plus the best other depth-1 node
                    chain = [u for u in range(1, len(nodes)) if nodes[u][1] <= depth
                             and is_on_first(nodes, u, occ[0][1])]
                    alt = [u for u in range(1, len(nodes)) if nodes[u][1] == 1
                           and nodes[u][3] != occ[0][1][0]]
                    alt = sorted(alt, key=lambda u: -nodes[u][0])[:1]
                    cand = sorted(chain + alt, key=lambda u: (-nodes[u][0], nodes[u][1], u))
                else:
                    cand = keep(nodes, len(nodes), depth)
                cap = min(len(cand), depth if variant == "chain" else rows)
                if policy == "fixed":
                    kept = cand[:cap]
                else:
                    best, best_k, tot = 0.0, 0, 1.0
                    for i in range(cap):
                        tot += nodes[cand[i]][0]
                        v = tot / (1.0 + select_r * (i + 1))
                        if v > best * (1.0 + 1e-6):
                            best, best_k = v, i + 1
                    kept = cand[:best_k]
            truth = full[n:n + (k + 1)]
            a, leaf = accepted(nodes, kept, truth) if kept else (0, True)
            if policy == "rule":
                if kept:
                    # the engine learns its table from the first occurrence's chain
                    m0, c0 = occ[0]
                    d0 = sum(1 for u in kept if is_on_first(nodes, u, c0))
                    h = 0
                    while h < d0 and c0[h] == full[n + h]:
                        h += 1
                    table.learn(m0, h, h + (h < d0))
                ctl.verified(a + (not leaf) if kept else 0, a, r)
            time += 1 + r * len(kept)
            steps += 1
            acc += a
            nrows += len(kept)
            n += a + 1
            tokens += a + 1
    return tokens / time, acc / steps, nrows / steps


def is_on_first(nodes, u, c0):
    """Whether node u lies on the continuation c0 (the first occurrence's chain)."""
    path = []
    while u > 0:
        path.append(nodes[u][3])
        u = nodes[u][4]
    path.reverse()
    return path == list(c0[:len(path)])


def load(paths, mode, kinds):
    seqs = []
    for path in paths:
        seqs += depth_sim.load(path, mode, kinds)
    return seqs


def oracle(seqs, r, limit, k=8):
    """A bound, not a drafter: each step drafts exactly the accepted prefix of the best of the
    first `limit` occurrences (no wasted row, no rejected step); tokens per unit of step time."""
    tokens, time = 0, 0.0
    for prompt, out in seqs:
        full, n = prompt + out, len(prompt)
        ix = Index(full)
        while n < len(full):
            best = 0
            for _, c in ix.occurrences(n, max(min(k, len(full) - n - 1), 1), limit):
                a = 0
                while a < len(c) and n + a < len(full) and c[a] == full[n + a]:
                    a += 1
                best = max(best, a)
            time += 1 + r * best
            tokens += best + 1
            n += best + 1
    return tokens / time


def diag(seqs, k=8, limit=16):
    """Where the chain's first draft is rejected: the rank of the recorded token among the other
    occurrences' distinct first tokens (None: not among them)."""
    ranks, tries, firsts = collections.Counter(), 0, 0
    for prompt, out in seqs:
        full, n = prompt + out, len(prompt)
        ix = Index(full)
        for n in range(len(prompt), len(full)):
            occ = ix.occurrences(n, k, limit)
            if not occ:
                continue
            tries += 1
            if occ[0][1][0] == full[n]:
                firsts += 1
                continue
            distinct = []
            for _, c in occ[1:]:
                if c[0] != occ[0][1][0] and c[0] not in distinct:
                    distinct.append(c[0])
            ranks[distinct.index(full[n]) + 1 if full[n] in distinct else None] += 1
    miss = tries - firsts
    print(f"{tries} positions with a draft; first token right {firsts / tries:.3f}; "
          f"of the {miss} wrong: " + ", ".join(
              f"rank {k}: {v / miss:.3f}" for k, v in sorted(ranks.items(), key=lambda x: str(x[0]))))


VARIANTS = [  # (label, variant, rows, limit)
    ("one chain (engine)", "chain", 8, 1),
    ("chain + 2nd first token", "next2", 9, 16),
    ("two chains", "two", 16, 16),
    ("tree R=8", "tree", 8, 16),
    ("tree R=12", "tree", 12, 16),
    ("tree R=16", "tree", 16, 16),
    ("tree R=32 (N=32)", "tree", 32, 32),
]


def table(paths, mode, kinds_list, policies=("rule", "fixed")):
    print("| data | kinds | variant | policy | r = 0.03 | r = 0.1 | r = 0.3 | accepted/step "
          "(r 0.03 / 0.1) | rows/step (r 0.03 / 0.1) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for kinds in kinds_list:
        seqs = load(paths, mode, kinds.split(",") if kinds else None)
        name = f"{'grounded' if kinds == GROUNDED else kinds or 'all'} ({len(seqs)})"
        for policy in policies:
            base = {}
            for label, variant, rows, limit in VARIANTS:
                cells, accs, rws = [], [], []
                for r in (0.03, 0.1, 0.3):
                    s, a, w = replay(seqs, r, variant, k=8, rows=rows, limit=limit,
                                     policy=policy, sampled=mode == "sampled")
                    if variant == "chain":
                        base[r] = s
                        cells.append(f"{s:.3f}")
                    else:
                        cells.append(f"{s:.3f} ({s / base[r] - 1:+.0%})")
                    accs.append(f"{a:.2f}")
                    rws.append(f"{w:.1f}")
                data = "+".join(p.split("/")[-1].replace("smollm2-cpu-generations", "gen")
                                for p in paths)
                print(f"| {data} | {name} | {label} | {policy}, K=8 | " + " | ".join(cells)
                      + f" | {' / '.join(accs[:2])} | {' / '.join(rws[:2])} |", flush=True)


if __name__ == "__main__":
    args, mode, kinds = sys.argv[1:], "sampled", None
    if "--mode" in args:
        i = args.index("--mode")
        mode = args[i + 1]
        del args[i:i + 2]
    if "--kinds" in args:
        i = args.index("--kinds")
        kinds = args[i + 1]
        del args[i:i + 2]
    if args and args[0] == "--check":
        path = args[1]
        for kk in (GROUNDED, None):
            for md in ("greedy", "sampled"):
                seqs = load([path], md, kk.split(",") if kk else None)
                for r in (0.03, 0.1, 0.3):
                    a = ngram_sim.replay(seqs, ngram_sim.propose, r)[0]
                    b = replay(seqs, r, "chain", k=4, policy="fixed", sampled=md == "sampled")[0]
                    c = depth_sim.replay(seqs, r, 8, "match", md == "sampled")
                    d = replay(seqs, r, "chain", k=8, policy="rule", sampled=md == "sampled")[0]
                    print(f"{'grounded' if kk else 'all'} {md} r={r}: fixed K=4 {a:.3f} {b:.3f}  "
                          f"rule K=8 {c:.3f} {d:.3f}")
    elif args and args[0] == "--oracle":
        for kk in ([kinds] if kinds else [GROUNDED, None]):
            seqs = load(args[1:], mode, kk.split(",") if kk else None)
            for lim in (1, 2, 16):
                print(f"{'grounded' if kk == GROUNDED else kk or 'all'} ({len(seqs)}) best of {lim}: " + "  ".join(
                    f"r={r}: {oracle(seqs, r, lim):.3f}" for r in (0.0, 0.03, 0.1, 0.3)))
    elif args and args[0] == "--diag":
        diag(load(args[1:], mode, kinds.split(",") if kinds else GROUNDED.split(",")))
    else:
        table(args, mode, [kinds] if kinds else [GROUNDED, None])
