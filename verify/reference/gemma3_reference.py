#!/usr/bin/env python3
"""Independent numpy (float64) reference for Gemma 3 270M (base) loaded from its GGUF file.

Writes verify/fixtures/gemma3-270m-reference.json in the format of the SmolLM2 fixture (see
README.md): per prompt the prompt ids, 32 greedy tokens and the top-64 logits of every step.

It shares no code with the Rust engine: weights are dequantized by gguf-py; the tokenizer is
Google's `sentencepiece` (a BPE ModelProto built from the GGUF pieces, scores and types);
instruct-format prompts are written out here from the Gemma turn format; the forward pass follows
the gemma3 recipe in float64 (see `forward`).

Usage:
  python3 verify/reference/gemma3_reference.py              # regenerate the fixture
  python3 verify/reference/gemma3_reference.py --check      # recompute and compare with the fixture
  python3 verify/reference/gemma3_reference.py --self-test  # KV-cache and sliding-window checks
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from smollm2_reference import (KVCache, compare_with_fixture, format_fixture, rms_norm,
                               sha256_file, tool_versions, top_k)

DEFAULT_MODEL = "/root/.cache/memra/models/gemma-3-270m-q4_k_m.gguf"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO_ROOT, "verify", "fixtures", "gemma3-270m-reference.json")
GENERATOR = "verify/reference/gemma3_reference.py"
TOP_K = 64
N_TOKENS = 32
EOS_ID = 1  # <eos>; reported only
PATTERN = 6  # every 6th layer is global (llama.cpp and transformers hard-code it for gemma3)
LOCAL_BASE = 10000.0

PARAGRAPH = (
    "The history of lighthouses stretches back more than two thousand years. The Pharos of "
    "Alexandria, completed around 280 BC, guided ships into one of the busiest harbours of the "
    "ancient world and stood for centuries before earthquakes brought it down. Medieval towers "
    "burned wood or coal in open braziers, which were smoky and unreliable. In the eighteenth "
    "century oil lamps with polished reflectors made the beams stronger, and in 1822 Augustin "
    "Fresnel designed a lens built from concentric rings of glass that could focus"
)
# Over 512 tokens: the local layers' sliding window drops the oldest positions.
LONG_TEXT = " ".join(f"Chapter {i}. {PARAGRAPH} the light." for i in range(1, 6)) + " Chapter 6."

PROMPTS = [
    {"name": "plain_capital_france", "kind": "plain", "text": "The capital of France is"},
    {"name": "plain_quick_brown_fox", "kind": "plain", "text": "The quick brown fox"},
    {"name": "plain_code_fibonacci", "kind": "plain", "text": "def fibonacci(n):\n"},
    {"name": "plain_spanish", "kind": "plain", "text": "El sol brilla sobre las montañas y el río"},
    {"name": "plain_numbers", "kind": "plain", "text": "1, 2, 3, 4,"},
    {"name": "plain_spaces_newlines", "kind": "plain",
     "text": "Shopping list:\n\n  - eggs\n  - milk\t(2 L)\n  - 日本のお茶 ☕"},
    {"name": "chat_capital_france", "kind": "chat",
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "chat_multi_turn", "kind": "chat",
     "messages": [{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "Hi! My name is Ana."},
                  {"role": "assistant", "content": "Hello Ana! How can I help you today?"},
                  {"role": "user", "content": "What is my name?"}]},
    {"name": "plain_long_sliding_window", "kind": "plain", "text": LONG_TEXT},
]


# ----------------------------------------------------------------------------------------------
# GGUF loading
# ----------------------------------------------------------------------------------------------

class Model:
    """Hyper-parameters, float64 weights and tokenizer metadata of a gemma3 GGUF."""

    def __init__(self, path):
        from gguf import GGUFReader
        from gguf.quants import dequantize

        reader = GGUFReader(path)
        self.meta = {name: field.contents() for name, field in reader.fields.items()}
        meta = self.meta
        if meta.get("general.architecture") != "gemma3":
            raise SystemExit(f"{path}: architecture {meta.get('general.architecture')!r}, expected gemma3")
        a = "gemma3."
        self.n_layer = int(meta[a + "block_count"])
        self.n_embd = int(meta[a + "embedding_length"])
        self.n_ff = int(meta[a + "feed_forward_length"])
        self.n_head = int(meta[a + "attention.head_count"])
        self.n_head_kv = int(meta[a + "attention.head_count_kv"])
        self.head_dim = int(meta[a + "attention.key_length"])
        self.global_base = float(meta[a + "rope.freq_base"])
        self.window = int(meta[a + "attention.sliding_window"])
        self.eps = float(meta[a + "attention.layer_norm_rms_epsilon"])
        self.vocab_size = len(meta["tokenizer.ggml.tokens"])
        self.w = {}
        self.types = {}
        for t in reader.tensors:
            arr = dequantize(t.data, t.tensor_type)
            n_cols = int(t.shape[0])
            self.w[t.name] = np.asarray(arr, dtype=np.float64).reshape(-1, n_cols).squeeze()
            self.types[t.name] = t.tensor_type.name
        if "output.weight" in self.w:
            raise SystemExit("expected tied embeddings (no output.weight)")

    def is_global(self, layer):
        return (layer + 1) % PATTERN == 0

    def check_facts(self):
        expected = {"n_layer": 18, "n_embd": 640, "n_head": 4, "n_head_kv": 1, "head_dim": 256,
                    "n_ff": 2048, "vocab_size": 262144, "global_base": 1000000.0, "window": 512}
        got = {k: getattr(self, k) for k in expected}
        for k, v in expected.items():
            if got[k] != v:
                raise SystemExit(f"model fact {k}: expected {v}, got {got[k]}")
        if abs(self.eps - 1e-6) > 1e-12:
            raise SystemExit(f"rms eps {self.eps}, expected 1e-6")
        # llama.cpp's converter stores Gemma's (1 + w): the attention norms are all far above 0.
        if self.w["blk.0.attn_norm.weight"].min() < 1.0:
            raise SystemExit("blk.0.attn_norm.weight < 1: the GGUF did not fold 1 + w")
        got["eps"] = self.eps
        got["tensor_types"] = sorted(set(self.types.values()))
        return got


# ----------------------------------------------------------------------------------------------
# Forward pass (float64)
# ----------------------------------------------------------------------------------------------

def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope_neox(x, base, positions):
    """Rotate (x[i], x[i + D/2]) of each head by pos * base^(-2i/D). x: (T, H, D)."""
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


def forward(m, tokens, cache, window=None):
    """Runs `tokens` (positions cache.n ..) through the model; returns the last position's
    logits. `window` overrides the local layers' window (the self-test's control run)."""
    T = len(tokens)
    start = cache.n
    pos = np.arange(start, start + T)
    key = np.arange(start + T)
    win = m.window if window is None else window
    causal = key[None, :] > pos[:, None]
    outside = causal | (pos[:, None] - key[None, :] >= win)
    group = m.n_head // m.n_head_kv
    scale = 1.0 / np.sqrt(m.head_dim)  # query_pre_attn_scalar = head_dim = 256 for 270M

    x = m.w["token_embd.weight"][np.asarray(tokens)] * np.sqrt(m.n_embd)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        w = lambda n: m.w[p + n + ".weight"]  # noqa: E731
        glob = m.is_global(i)
        h = rms_norm(x, w("attn_norm"), m.eps)
        q = (h @ w("attn_q").T).reshape(T, m.n_head, m.head_dim)
        k = (h @ w("attn_k").T).reshape(T, m.n_head_kv, m.head_dim)
        v = (h @ w("attn_v").T).reshape(T, m.n_head_kv, m.head_dim)
        q = rms_norm(q, w("attn_q_norm"), m.eps)
        k = rms_norm(k, w("attn_k_norm"), m.eps)
        base = m.global_base if glob else LOCAL_BASE
        q = rope_neox(q, base, pos)
        k = rope_neox(k, base, pos)
        k_all, v_all = cache.append(i, k, v)
        mask = causal if glob else outside
        att = np.empty((T, m.n_head, m.head_dim))
        for hd in range(m.n_head):
            kvh = hd // group
            sc = (q[:, hd, :] @ k_all[:, kvh, :].T) * scale
            sc = np.where(mask, -np.inf, sc)
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            att[:, hd, :] = (sc / sc.sum(axis=-1, keepdims=True)) @ v_all[:, kvh, :]
        o = att.reshape(T, -1) @ w("attn_output").T
        x = x + rms_norm(o, w("post_attention_norm"), m.eps)
        h = rms_norm(x, w("ffn_norm"), m.eps)
        g = gelu_tanh(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)
        x = x + rms_norm(g @ w("ffn_down").T, w("post_ffw_norm"), m.eps)
    cache.n += T
    h = rms_norm(x[-1], m.w["output_norm.weight"], m.eps)
    return m.w["token_embd.weight"] @ h


# ----------------------------------------------------------------------------------------------
# Tokenizer (sentencepiece) and the instruct turn format
# ----------------------------------------------------------------------------------------------

def build_tokenizer(meta):
    """A sentencepiece BPE model from the GGUF pieces; returns (processor, control pieces)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    if meta.get("tokenizer.ggml.model") != "llama":
        raise SystemExit("expected a SentencePiece (llama) vocabulary")
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        raise SystemExit("expected add_space_prefix = false (Gemma)")
    tokens = meta["tokenizer.ggml.tokens"]
    scores = meta["tokenizer.ggml.scores"]
    types = meta["tokenizer.ggml.token_type"]
    unk = int(meta["tokenizer.ggml.unknown_token_id"])
    mp = pb.ModelProto()
    ts = mp.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(tokens)
    ts.byte_fallback = True
    ts.unk_id = unk
    ts.bos_id = int(meta["tokenizer.ggml.bos_token_id"])
    ts.eos_id = int(meta["tokenizer.ggml.eos_token_id"])
    ts.pad_id = int(meta["tokenizer.ggml.padding_token_id"])
    ns = mp.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = False
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
        piece = mp.pieces.add()
        # llama.cpp's converter writes user-defined pieces "pre-normalized" ("▁▁" as two
        # spaces, so that it can match them in raw text); sentencepiece matches them after
        # whitespace escaping, so they get their "▁" back.
        piece.piece = t.replace(" ", "\u2581") if ty == 4 else t
        piece.score = float(s)
        piece.type = pb.ModelProto.SentencePiece.UNKNOWN if i == unk else int(ty)
    sp = spm.SentencePieceProcessor(model_proto=mp.SerializeToString())
    if sp.get_piece_size() != len(tokens):
        raise SystemExit("sentencepiece vocabulary size differs from the GGUF's")
    control = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}
    return sp, control


def encode(sp, control, text):
    """Ids of `text` with control pieces written in it (`<start_of_turn>`) matched whole."""
    ids, rest = [], text
    while rest:
        hits = [(rest.find(c), -len(c), c) for c in ("<start_of_turn>", "<end_of_turn>", "<bos>")
                if c in rest]
        if not hits:
            ids += sp.encode(rest)
            break
        at, _, c = min(hits)
        if at:
            ids += sp.encode(rest[:at])
        ids.append(control[c])
        rest = rest[at + len(c):]
    return ids


def render_chat(messages):
    """The Gemma instruct turn format: system text prefixed to the first user turn,
    `assistant` written `model`, BOS first, a model turn opened at the end."""
    out, prefix = "<bos>", ""
    if messages[0]["role"] == "system":
        prefix = messages[0]["content"] + "\n\n"
        messages = messages[1:]
    for i, msg in enumerate(messages):
        role = "model" if msg["role"] == "assistant" else msg["role"]
        body = (prefix if i == 0 else "") + msg["content"].strip()
        out += f"<start_of_turn>{role}\n{body}<end_of_turn>\n"
    return out + "<start_of_turn>model\n"


def prepare_prompts(model, sp, control):
    bos = int(model.meta["tokenizer.ggml.bos_token_id"])
    out = []
    for p in PROMPTS:
        entry = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "chat":
            entry["messages"] = p["messages"]
            text = render_chat(p["messages"])
            ids = encode(sp, control, text)
        else:
            text = p["text"]
            ids = [bos] + encode(sp, control, text)  # add_bos_token = true
        back = sp.decode([i for i in ids if i not in control.values()])
        plain = text
        for c in ("<bos>", "<start_of_turn>", "<end_of_turn>"):
            plain = plain.replace(c, "")
        if back != plain:
            raise SystemExit(f"{p['name']}: tokenizer round trip changed the text: {back!r}")
        entry["text"] = text
        entry["prompt_ids"] = ids
        out.append(entry)
    return out


def decode(sp, control, ids):
    names = {i: t for t, i in control.items()}
    out, run = "", []
    for i in ids:
        if i in names:
            out += sp.decode(run) + names[i]
            run = []
        else:
            run.append(i)
    return out + sp.decode(run)


# ----------------------------------------------------------------------------------------------
# Generation and fixture
# ----------------------------------------------------------------------------------------------

def generate(model, prompt_ids, n_tokens):
    cache = KVCache(model.n_layer)
    logits = forward(model, prompt_ids, cache)
    tokens, steps = [], []
    for step in range(n_tokens):
        top = top_k(logits, TOP_K)
        steps.append({"top": top,
                      "max_abs_logit": round(float(np.max(np.abs(logits))), 6),
                      "margin": round(float(logits[top[0][0]] - logits[top[1][0]]), 6)})
        nxt = int(np.argmax(logits))
        tokens.append(nxt)
        if step + 1 < n_tokens:
            logits = forward(model, [nxt], cache)
    return tokens, steps


def self_test(model, prompts):
    ids = prompts[0]["prompt_ids"]
    cache = KVCache(model.n_layer)
    a = forward(model, ids, cache)
    nxt = int(np.argmax(a))
    inc = forward(model, [nxt], cache)
    full = forward(model, ids + [nxt], KVCache(model.n_layer))
    d_kv = float(np.max(np.abs(inc - full)))
    print(f"self-test: KV-cache step vs full recompute max |diff| = {d_kv:.3g}")
    long_ids = prompts[-1]["prompt_ids"]
    w = forward(model, long_ids, KVCache(model.n_layer))
    nw = forward(model, long_ids, KVCache(model.n_layer), window=1 << 30)
    d_win = float(np.max(np.abs(w - nw)))
    print(f"self-test: {len(long_ids)}-token prompt, window {model.window} vs none: "
          f"max |logit diff| = {d_win:.3g} (must be > 0: the window is in effect)")
    if d_kv > 1e-9 or len(long_ids) <= model.window or d_win < 1e-6:
        raise SystemExit("self-test FAILED")
    print("self-test OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("MEMRA_GEMMA3_MODEL", DEFAULT_MODEL))
    ap.add_argument("--out", default=FIXTURE)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--self-test", action="store_true", help="KV-cache and sliding-window checks")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="recompute only these prompts; the others are kept from --out")
    args = ap.parse_args()

    if not os.path.exists(args.model):
        raise SystemExit(f"model not found: {args.model} (run tools/fetch-models.sh gemma3)")
    t0 = time.time()
    model = Model(args.model)
    facts = model.check_facts()
    sp, control = build_tokenizer(model.meta)
    prompts = prepare_prompts(model, sp, control)
    print(f"loaded {os.path.basename(args.model)} in {time.time() - t0:.1f}s: {facts}", file=sys.stderr)
    if args.self_test:
        self_test(model, prompts)
        return

    import sentencepiece
    tools = tool_versions()
    tools.pop("tokenizers", None)
    tools.pop("jinja2", None)
    tools["sentencepiece"] = sentencepiece.__version__
    doc = {"model": os.path.basename(args.model), "model_sha256": sha256_file(args.model),
           "generator": GENERATOR, "tools": tools, "top_k": TOP_K, "n_tokens": N_TOKENS,
           "eos_id": EOS_ID, "prompts": []}
    kept = {}
    if args.only:
        with open(args.out, encoding="utf-8") as f:
            kept = {p["name"]: p for p in json.load(f)["prompts"] if p["name"] not in args.only}
    for p in prompts:
        if p["name"] in kept:
            if kept[p["name"]]["prompt_ids"] != p["prompt_ids"]:
                raise SystemExit(f"{p['name']}: prompt ids changed; recompute it too (--only)")
            doc["prompts"].append(kept[p["name"]])
            continue
        t1 = time.time()
        tokens, steps = generate(model, p["prompt_ids"], N_TOKENS)
        p["tokens"] = tokens
        p["completion"] = decode(sp, control, tokens)
        p["steps"] = steps
        doc["prompts"].append(p)
        print(f"{p['name']}: {len(p['prompt_ids'])} prompt tokens, {time.time() - t1:.1f}s, "
              f"first margin {steps[0]['margin']:.4f}, min margin "
              f"{min(s['margin'] for s in steps):.4f}: {p['completion']!r}", file=sys.stderr)
    if args.check:
        if not compare_with_fixture(doc, args.out, 1e-5):
            raise SystemExit("check FAILED: recomputed reference differs from the fixture")
        print("check OK")
        return
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(format_fixture(doc))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {time.time() - t0:.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
