#!/usr/bin/env python3
"""Independent numpy (float64) reference for SmolLM2-135M-Instruct loaded from its GGUF file.

Writes verify/fixtures/smollm2-135m-reference.json: for each named prompt, the prompt token ids,
32 greedy tokens, and the top-64 logits of every step. The Rust `reference` test compares the
engine's CPU backend against this file.

This file shares no code with the Rust engine: weights are dequantized by gguf-py, the tokenizer is
the HuggingFace `tokenizers` byte-level BPE built from the GGUF vocab/merges, chat prompts are
rendered with jinja2 from the GGUF chat template, and RoPE is applied in llama.cpp's "normal" layout
(adjacent pairs) on the q/k weights exactly as stored in the GGUF (the Rust engine un-permutes them
and rotates halves instead).

Usage:
  python3 verify/reference/smollm2_reference.py              # regenerate the fixture
  python3 verify/reference/smollm2_reference.py --check      # recompute and compare with the fixture
  python3 verify/reference/smollm2_reference.py --self-test  # rope-layout cross-check, no fixture
"""

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from importlib import metadata

import numpy as np

DEFAULT_MODEL = "/root/.cache/memra/models/SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO_ROOT, "verify", "fixtures", "smollm2-135m-reference.json")
GENERATOR = "verify/reference/smollm2_reference.py"
TOP_K = 64
N_TOKENS = 32
EOS_ID = 2  # <|im_end|>; reported only: the fixture always generates N_TOKENS tokens

LONG_PARAGRAPH = (
    "The history of lighthouses stretches back more than two thousand years. The Pharos of "
    "Alexandria, completed around 280 BC, guided ships into one of the busiest harbours of the "
    "ancient world and stood for centuries before earthquakes brought it down. Medieval towers "
    "burned wood or coal in open braziers, which were smoky and unreliable. In the eighteenth "
    "century oil lamps with polished reflectors made the beams stronger, and in 1822 Augustin "
    "Fresnel designed a lens built from concentric rings of glass that could focus"
)

PROMPTS = [
    {"name": "chat_capital_france", "kind": "chat",
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "chat_system_sky", "kind": "chat",
     "messages": [{"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
                  {"role": "user", "content": "Why is the sky blue?"}]},
    {"name": "chat_french_germany", "kind": "chat",
     "messages": [{"role": "user", "content": "Quelle est la capitale de l'Allemagne ?"}]},
    {"name": "chat_python_reverse", "kind": "chat",
     "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}]},
    {"name": "chat_multi_turn", "kind": "chat",
     "messages": [{"role": "user", "content": "Hi! My name is Ana."},
                  {"role": "assistant", "content": "Hello Ana! How can I help you today?"},
                  {"role": "user", "content": "What is my name?"}]},
    {"name": "plain_quick_brown_fox", "kind": "plain", "text": "The quick brown fox"},
    {"name": "plain_code_fibonacci", "kind": "plain", "text": "def fibonacci(n):\n"},
    {"name": "plain_spanish", "kind": "plain",
     "text": "El sol brilla sobre las montañas y el río"},
    {"name": "plain_numbers", "kind": "plain", "text": "1, 2, 3, 4,"},
    {"name": "plain_long_paragraph", "kind": "plain", "text": LONG_PARAGRAPH},
]


# ----------------------------------------------------------------------------------------------
# GGUF loading
# ----------------------------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Model:
    """Hyper-parameters, float64 weights and tokenizer metadata read from a llama-architecture GGUF."""

    def __init__(self, path):
        from gguf import GGUFReader
        from gguf.quants import dequantize

        reader = GGUFReader(path)
        self.meta = {name: field.contents() for name, field in reader.fields.items()}
        meta = self.meta
        if meta.get("general.architecture") != "llama":
            raise SystemExit(f"{path}: architecture {meta.get('general.architecture')!r}, expected 'llama'")
        self.n_layer = int(meta["llama.block_count"])
        self.n_embd = int(meta["llama.embedding_length"])
        self.n_ff = int(meta["llama.feed_forward_length"])
        self.n_head = int(meta["llama.attention.head_count"])
        self.n_head_kv = int(meta["llama.attention.head_count_kv"])
        self.head_dim = self.n_embd // self.n_head
        self.rope_base = float(meta["llama.rope.freq_base"])
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.vocab_size = len(meta["tokenizer.ggml.tokens"])

        self.w = {}
        self.types = {}
        for t in reader.tensors:
            arr = dequantize(t.data, t.tensor_type)
            # gguf-py gives rows = ne[1] (output features), columns = ne[0] (input features).
            n_cols = int(t.shape[0])
            self.w[t.name] = np.asarray(arr, dtype=np.float64).reshape(-1, n_cols).squeeze()
            self.types[t.name] = t.tensor_type.name
        self.tied = "output.weight" not in self.w
        self.lm_head = self.w["token_embd.weight"] if self.tied else self.w["output.weight"]

    def check_facts(self):
        """Asserts the architecture facts the task states; returns them for the fixture/README."""
        expected = {"n_layer": 30, "n_embd": 576, "n_head": 9, "n_head_kv": 3, "head_dim": 64,
                    "n_ff": 1536, "vocab_size": 49152, "rope_base": 100000.0, "tied": True}
        got = {k: getattr(self, k) for k in expected}
        for k, v in expected.items():
            if got[k] != v:
                raise SystemExit(f"model fact {k}: expected {v}, got {got[k]}")
        if abs(self.eps - 1e-5) > 1e-9:
            raise SystemExit(f"rms eps {self.eps}, expected 1e-5")
        if int(self.meta.get("llama.rope.dimension_count", self.head_dim)) != self.head_dim:
            raise SystemExit("rope dimension_count differs from head_dim (partial rope unsupported)")
        if self.meta.get("tokenizer.ggml.add_bos_token", False):
            raise SystemExit("GGUF says add_bos_token=true; this reference assumes no BOS")
        if self.w["token_embd.weight"].shape != (self.vocab_size, self.n_embd):
            raise SystemExit(f"token_embd shape {self.w['token_embd.weight'].shape}")
        for i in range(self.n_layer):
            kv = self.n_head_kv * self.head_dim
            shapes = {"attn_q": (self.n_embd, self.n_embd), "attn_k": (kv, self.n_embd),
                      "attn_v": (kv, self.n_embd), "attn_output": (self.n_embd, self.n_embd),
                      "ffn_gate": (self.n_ff, self.n_embd), "ffn_up": (self.n_ff, self.n_embd),
                      "ffn_down": (self.n_embd, self.n_ff)}
            for name, shape in shapes.items():
                got_shape = self.w[f"blk.{i}.{name}.weight"].shape
                if got_shape != shape:
                    raise SystemExit(f"blk.{i}.{name}.weight shape {got_shape}, expected {shape}")
        got["eps"] = self.eps
        got["tensor_types"] = sorted(set(self.types.values()))
        return got


# ----------------------------------------------------------------------------------------------
# Forward pass (float64)
# ----------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * w / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_tables(head_dim, base, positions):
    """cos/sin of shape (len(positions), head_dim//2); pair i rotates at base^(-2i/head_dim)."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def rope_adjacent(x, cos, sin):
    """llama.cpp "normal" RoPE: rotate adjacent pairs (x[2i], x[2i+1]). x: (T, H, D)."""
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_half(x, cos, sin):
    """NEOX-style RoPE: rotate (x[i], x[i+D/2]). Used only by --self-test on un-permuted weights."""
    d2 = x.shape[-1] // 2
    x0 = x[..., :d2]
    x1 = x[..., d2:]
    c = cos[:, None, :]
    s = sin[:, None, :]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


class KVCache:
    def __init__(self, n_layer):
        self.k = [None] * n_layer  # each (T, n_head_kv, head_dim)
        self.v = [None] * n_layer
        self.n = 0

    def append(self, layer, k, v):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = np.concatenate([self.k[layer], k], axis=0)
            self.v[layer] = np.concatenate([self.v[layer], v], axis=0)
        return self.k[layer], self.v[layer]


def forward(model, tokens, cache, rope="adjacent", qk_weights=None):
    """Runs `tokens` (positions cache.n ..) through the model; returns logits of the last position."""
    m = model
    T = len(tokens)
    start = cache.n
    positions = np.arange(start, start + T)
    cos, sin = rope_tables(m.head_dim, m.rope_base, positions)
    apply_rope = rope_adjacent if rope == "adjacent" else rope_half
    group = m.n_head // m.n_head_kv
    scale = 1.0 / np.sqrt(m.head_dim)
    # causal mask over (query t, key s): key position s <= start + t
    key_pos = np.arange(start + T)
    mask = key_pos[None, :] > positions[:, None]

    x = m.w["token_embd.weight"][np.asarray(tokens)]  # (T, n_embd)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        wq = m.w[p + "attn_q.weight"] if qk_weights is None else qk_weights[i][0]
        wk = m.w[p + "attn_k.weight"] if qk_weights is None else qk_weights[i][1]
        h = rms_norm(x, m.w[p + "attn_norm.weight"], m.eps)
        q = (h @ wq.T).reshape(T, m.n_head, m.head_dim)
        k = (h @ wk.T).reshape(T, m.n_head_kv, m.head_dim)
        v = (h @ m.w[p + "attn_v.weight"].T).reshape(T, m.n_head_kv, m.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_all, v_all = cache.append(i, k, v)
        attn = np.empty((T, m.n_head, m.head_dim))
        for hd in range(m.n_head):
            kvh = hd // group
            scores = (q[:, hd, :] @ k_all[:, kvh, :].T) * scale  # (T, S)
            scores = np.where(mask, -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn[:, hd, :] = probs @ v_all[:, kvh, :]
        x = x + attn.reshape(T, m.n_embd) @ m.w[p + "attn_output.weight"].T
        h = rms_norm(x, m.w[p + "ffn_norm.weight"], m.eps)
        gate = h @ m.w[p + "ffn_gate.weight"].T
        up = h @ m.w[p + "ffn_up.weight"].T
        x = x + (silu(gate) * up) @ m.w[p + "ffn_down.weight"].T
    cache.n += T
    h = rms_norm(x[-1], m.w["output_norm.weight"], m.eps)
    return m.lm_head @ h  # (vocab,)


def unpermute_rows(w, n_head):
    """Inverse of llama.cpp convert's q/k row permutation: back to the HF (half-rotation) layout."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


# ----------------------------------------------------------------------------------------------
# Tokenizer and chat template
# ----------------------------------------------------------------------------------------------

def build_tokenizer(meta):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != "smollm":
        raise SystemExit("expected a gpt2 (byte-level BPE) tokenizer with the 'smollm' pre-tokenizer")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    # llama.cpp 'smollm' pre-type: split every digit on its own, then the GPT-2 byte-level regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3: <|im_start|>, <|im_end|>, ...) are matched whole in the text.
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    for s in specials:
        if tok.token_to_id(s.content) != vocab[s.content]:
            raise SystemExit(f"special token {s.content!r} got a new id")
    if tok.get_vocab_size() != len(tokens):
        raise SystemExit(f"tokenizer vocab {tok.get_vocab_size()} != GGUF vocab {len(tokens)}")
    return tok


def render_chat(template_src, messages):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Same environment settings as HuggingFace transformers' apply_chat_template.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template_src).render(messages=messages, add_generation_prompt=True)


# ----------------------------------------------------------------------------------------------
# Generation and fixture
# ----------------------------------------------------------------------------------------------

def top_k(logits, k):
    order = np.argsort(-logits, kind="stable")[:k]  # ties: lower id first
    return [[int(i), round(float(logits[i]), 6)] for i in order]


def generate(model, prompt_ids, n_tokens):
    cache = KVCache(model.n_layer)
    logits = forward(model, prompt_ids, cache)
    tokens, steps = [], []
    for step in range(n_tokens):
        top = top_k(logits, TOP_K)
        nxt = int(np.argmax(logits))  # first maximum = lowest id on ties
        steps.append({"top": top,
                      "max_abs_logit": round(float(np.max(np.abs(logits))), 6),
                      "margin": round(float(logits[top[0][0]] - logits[top[1][0]]), 6)})
        tokens.append(nxt)
        if step + 1 < n_tokens:
            logits = forward(model, [nxt], cache)
    return tokens, steps


def prepare_prompts(model, tok):
    template = model.meta["tokenizer.chat_template"]
    out = []
    for p in PROMPTS:
        entry = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "chat":
            entry["messages"] = p["messages"]
            text = render_chat(template, p["messages"])
        else:
            text = p["text"]
        ids = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        if back != text:
            raise SystemExit(f"{p['name']}: tokenizer round trip changed the text: {back!r}")
        entry["text"] = text
        entry["prompt_ids"] = ids
        out.append(entry)
    return out


def tool_versions():
    import jinja2
    import tokenizers

    return {"python": platform.python_version(), "numpy": np.__version__,
            "gguf": metadata.version("gguf"), "tokenizers": tokenizers.__version__,
            "jinja2": jinja2.__version__}


def format_fixture(doc):
    """JSON with one line per step, so the file stays small and diffs stay readable."""
    lines = ["{"]
    head = [k for k in doc if k != "prompts"]
    for k in head:
        lines.append(f"  {json.dumps(k)}: {json.dumps(doc[k], ensure_ascii=False)},")
    lines.append('  "prompts": [')
    for pi, p in enumerate(doc["prompts"]):
        lines.append("    {")
        for k in p:
            if k == "steps":
                continue
            lines.append(f"      {json.dumps(k)}: {json.dumps(p[k], ensure_ascii=False)},")
        lines.append('      "steps": [')
        for si, s in enumerate(p["steps"]):
            sep = "," if si + 1 < len(p["steps"]) else ""
            lines.append("        " + json.dumps(s, separators=(",", ":")) + sep)
        lines.append("      ]")
        lines.append("    }" + ("," if pi + 1 < len(doc["prompts"]) else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def compare_with_fixture(doc, path, tol):
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    worst = 0.0
    ok = True
    old_by_name = {p["name"]: p for p in old["prompts"]}
    for p in doc["prompts"]:
        o = old_by_name.get(p["name"])
        if o is None or o["prompt_ids"] != p["prompt_ids"] or o["tokens"] != p["tokens"]:
            print(f"MISMATCH {p['name']}: prompt ids or greedy tokens differ")
            ok = False
            continue
        for s_new, s_old in zip(p["steps"], o["steps"]):
            ids_new = [t[0] for t in s_new["top"]]
            ids_old = [t[0] for t in s_old["top"]]
            if ids_new[:1] != ids_old[:1]:
                ok = False
            for (i, a), (j, b) in zip(s_new["top"], s_old["top"]):
                if i == j:
                    worst = max(worst, abs(a - b))
    print(f"check: max |logit diff| vs fixture = {worst:.3g} (tolerance {tol})")
    return ok and worst <= tol


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("MEMRA_TEST_MODEL", DEFAULT_MODEL))
    ap.add_argument("--out", default=FIXTURE)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--self-test", action="store_true",
                    help="check adjacent-pair RoPE on stored weights == half RoPE on un-permuted weights")
    args = ap.parse_args()

    if not os.path.exists(args.model):
        raise SystemExit(f"model not found: {args.model} (run tools/fetch-models.sh)")
    t0 = time.time()
    model = Model(args.model)
    facts = model.check_facts()
    tok = build_tokenizer(model.meta)
    prompts = prepare_prompts(model, tok)
    print(f"loaded {os.path.basename(args.model)} in {time.time() - t0:.1f}s: {facts}", file=sys.stderr)

    if args.self_test:
        qk = [(unpermute_rows(model.w[f"blk.{i}.attn_q.weight"], model.n_head),
               unpermute_rows(model.w[f"blk.{i}.attn_k.weight"], model.n_head_kv))
              for i in range(model.n_layer)]
        ids = prompts[0]["prompt_ids"]
        a = forward(model, ids, KVCache(model.n_layer), rope="adjacent")
        b = forward(model, ids, KVCache(model.n_layer), rope="half", qk_weights=qk)
        c = forward(model, ids, KVCache(model.n_layer), rope="half")  # wrong layout on purpose
        d_ok = float(np.max(np.abs(a - b)))
        d_bad = float(np.max(np.abs(a - c)))
        print(f"self-test: adjacent/stored vs half/un-permuted max |diff| = {d_ok:.3g}; "
              f"half on stored weights (wrong) differs by {d_bad:.3g}")
        # Incremental decoding must match a full recomputation of the longer sequence.
        cache = KVCache(model.n_layer)
        forward(model, ids, cache)
        nxt = int(np.argmax(a))
        inc = forward(model, [nxt], cache)
        full = forward(model, ids + [nxt], KVCache(model.n_layer))
        d_kv = float(np.max(np.abs(inc - full)))
        print(f"self-test: KV-cache step vs full recompute max |diff| = {d_kv:.3g}")
        if d_ok > 1e-9 or d_bad < 1e-3 or d_kv > 1e-9:
            raise SystemExit("self-test FAILED")
        print("self-test OK")
        return

    doc = {"model": os.path.basename(args.model), "model_sha256": sha256_file(args.model),
           "generator": GENERATOR, "tools": tool_versions(), "top_k": TOP_K, "n_tokens": N_TOKENS,
           "eos_id": EOS_ID, "prompts": []}
    for p in prompts:
        t1 = time.time()
        tokens, steps = generate(model, p["prompt_ids"], N_TOKENS)
        p["tokens"] = tokens
        p["completion"] = tok.decode(tokens, skip_special_tokens=False)
        p["steps"] = steps
        doc["prompts"].append(p)
        print(f"{p['name']}: {len(p['prompt_ids'])} prompt tokens, {time.time() - t1:.1f}s, "
              f"first margin {steps[0]['margin']:.4f}, min margin "
              f"{min(s['margin'] for s in steps):.4f}: {p['completion']!r}", file=sys.stderr)

    france = doc["prompts"][0]
    if not france["completion"].startswith("The capital of France is Paris."):
        raise SystemExit(f"correctness check FAILED: France prompt answered {france['completion']!r}")
    print("correctness check OK: France prompt answers 'The capital of France is Paris.'", file=sys.stderr)

    if args.check:
        if not compare_with_fixture(doc, args.out, 1e-5):
            raise SystemExit("check FAILED: recomputed reference differs from the fixture")
        print("check OK")
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(format_fixture(doc))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {time.time() - t0:.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
