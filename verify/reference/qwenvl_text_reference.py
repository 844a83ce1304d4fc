"""Independent float64 numpy reference of the Qwen-VL text models (GGUF architectures qwen2vl:
Qwen2-VL / Qwen2.5-VL's text model; qwen3vl: Qwen3-VL's) fed image rows: M-RoPE positions,
the sectioned rotary embedding and Qwen3-VL's deepstack.

It shares no code with memra and follows HF transformers' structure, not memra's:

- positions by `get_rope_index` (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, images and videos): chunk by
  chunk, the next image or video token found from `st`, each text run `arange + st_idx`, each
  image or video `(t, h, w)` index grids `+ text_len + st_idx`, `st_idx` one past the previous
  chunk's largest position; a video's `t` index: Qwen2-VL the temporal patch, Qwen2.5-VL
  `(arange(t) * second_per_grid_t) * tokens_per_second` in float32 then `.long()`, Qwen3-VL's
  video split into its temporal patches of `t = 1` each (HF's `repeat_interleave`, each one
  after its timestamp text); the decode delta `max + 1 - n`;
- the rotary table as HF builds it: `freqs = inv_freq x positions` per axis (3, n, d/2), then
  Qwen2-VL's `apply_multimodal_rotary_pos_emb` (`cat(freqs, freqs)`, `cos.split(mrope_section
  * 2)`, chunk i from axis i % 3) or Qwen3-VL's `apply_interleaved_mrope` (height at
  `slice(1, 3 * sec[1], 3)`, width at `slice(2, 3 * sec[2], 3)` over the temporal ones), then
  `q * cos + rotate_half(q) * sin`;
- the decoder: Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm before the rotation, GQA,
  causal attention by token index, SwiGLU; deepstack as HF's `_deepstack_process`: after
  decoder layer l < n_deepstack_layers, the image tokens' hidden states += their part l + 1.

Weights come from `gguf.GGUFReader` (+ `gguf.quants.dequantize`); all arithmetic is float64.

    python3 verify/reference/qwenvl_text_reference.py TEXT.gguf CASES.json OUT.json

CASES.json: {"cases": [{"ids": [...], "image_token_id": N, "grid_thw": [[1, H, W], ...]
(patches, as HF's image_grid_thw: merged rows x 2, merged cols x 2), "spatial_merge_size": 2,
"embeds": "rows.f32" (every image's and video's rows in prompt order, little-endian float32,
hidden x (1 + deepstack) values a row), "logits": "out.f32" (written: every position's logits,
n x vocab float32); for videos also "video_token_id", "video_grid_thw" [[T, H, W], ...],
"second_per_grid_ts" [s, ...], "tokens_per_second", "rule" ("qwen2vl" | "qwen25vl" |
"qwen3vl")}]}. OUT.json: {"cases": [{"positions": [[t...], [h...], [w...]], "delta": d}]}.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    vals = [f.parts[i] for i in f.data]
    if len(vals) > 1 or key.endswith("dimension_sections"):
        return [v[0].item() for v in vals]
    v = vals[0]
    return v.tobytes().decode() if v.dtype == np.uint8 else v.item()


def load(path):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch not in ("qwen2vl", "qwen3vl"):
        raise SystemExit(f"architecture {arch!r}: expected qwen2vl or qwen3vl")
    k = arch + "."
    heads = int(field(r, k + "attention.head_count"))
    hidden = int(field(r, k + "embedding_length"))
    hp = dict(
        arch=arch,
        layers=int(field(r, k + "block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(field(r, k + "attention.head_count_kv", heads)),
        head_dim=int(field(r, k + "attention.key_length", hidden // heads)),
        theta=float(field(r, k + "rope.freq_base", 10000.0)),
        eps=float(field(r, k + "attention.layer_norm_rms_epsilon", 1e-6)),
        # HF's mrope_section: the first three (llama.cpp pads them with a 0).
        sections=[int(v) for v in field(r, k + "rope.dimension_sections")][:3],
        deepstack=int(field(r, k + "n_deepstack_layers", 0)),
    )
    w = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return hp, w


def get_rope_index(c):
    """HF's get_rope_index for one sequence with images and videos."""
    ids = [int(t) for t in c["ids"]]
    merge = c["spatial_merge_size"]
    img_tok, vid_tok = c["image_token_id"], c.get("video_token_id", -1)
    images = [list(g) for g in c.get("grid_thw", [])]
    videos = [list(g) for g in c.get("video_grid_thw", [])]
    seconds = list(c.get("second_per_grid_ts", [1.0] * len(videos)))
    rule = c.get("rule", "qwen2vl")
    tps = c.get("tokens_per_second", 2)
    if rule == "qwen3vl":  # repeat_interleave(video_grid_thw, t); t = 1
        videos = [[1, h, w] for t, h, w in videos for _ in range(t)]
    chunks = []
    st, ii, vi = 0, 0, 0
    for _ in range(len(images) + len(videos)):
        ed_i = ids.index(img_tok, st) if ii < len(images) and img_tok in ids[st:] else len(ids) + 1
        ed_v = ids.index(vid_tok, st) if vi < len(videos) and vid_tok in ids[st:] else len(ids) + 1
        if ed_i < ed_v:
            (t, h, w), sec, ed, video = images[ii], 0.0, ed_i, False
            ii += 1
        else:
            (t, h, w), ed, video = videos[vi], ed_v, True
            sec = seconds[vi] if rule == "qwen25vl" else 1.0
            vi += 1
        gt, gh, gw = t, h // merge, w // merge
        text_len = ed - st
        st_idx = chunks[-1].max() + 1 if chunks else 0
        chunks.append(np.broadcast_to(np.arange(text_len), (3, text_len)) + st_idx)
        rng = np.broadcast_to(np.arange(gt)[:, None], (gt, gh * gw))
        if rule == "qwen25vl":
            # int64 range x float32 second_per_grid_t x tokens_per_second, in float32, .long()
            tt = (rng.astype(np.float32) * np.float32(sec)) * np.float32(tps)
            t_index = tt.astype(np.int64).flatten()
        else:
            t_index = rng.flatten()
        h_index = np.broadcast_to(np.arange(gh)[None, :, None], (gt, gh, gw)).flatten()
        w_index = np.broadcast_to(np.arange(gw)[None, None, :], (gt, gh, gw)).flatten()
        chunks.append(np.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st = ed + gt * gh * gw
    if st < len(ids):
        st_idx = chunks[-1].max() + 1 if chunks else 0
        text_len = len(ids) - st
        chunks.append(np.broadcast_to(np.arange(text_len), (3, text_len)) + st_idx)
    pos = np.concatenate(chunks, axis=1)
    return pos, int(pos.max()) + 1 - len(ids)


def rotary(hp, pos):
    """cos, sin (n, head_dim) of HF's M-RoPE for positions (3, n)."""
    d = hp["head_dim"]
    inv_freq = 1.0 / (hp["theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = pos[:, :, None].astype(np.float64) * inv_freq[None, None, :]  # (3, n, d/2)
    sec = hp["sections"]
    if hp["arch"] == "qwen3vl":
        f = freqs[0].copy()
        for dim, offset in ((1, 1), (2, 2)):
            idx = slice(offset, sec[dim] * 3, 3)
            f[:, idx] = freqs[dim][:, idx]
        emb = np.concatenate([f, f], axis=-1)
        return np.cos(emb), np.sin(emb)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (3, n, d)
    cos, sin = np.cos(emb), np.sin(emb)
    bounds = np.cumsum(sec * 2)[:-1]
    pick = lambda x: np.concatenate(
        [m[i % 3] for i, m in enumerate(np.split(x, bounds, axis=-1))], axis=-1)
    return pick(cos), pick(sin)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rms(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def forward(hp, w, ids, media_tokens, rows, pos):
    """Every position's logits: ids with the image and video tokens' embeddings replaced by
    `rows` (deepstack adds into both, HF's `visual_pos_masks`)."""
    n, H = len(ids), hp["hidden"]
    x = w["token_embd.weight"][ids].copy()
    img = np.array([i for i, t in enumerate(ids) if t in media_tokens])
    parts = rows.reshape(len(img), 1 + hp["deepstack"], H)
    x[img] = parts[:, 0]
    cos, sin = rotary(hp, pos)
    nh, nkv, d = hp["heads"], hp["kv_heads"], hp["head_dim"]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(hp["layers"]):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"], hp["eps"])
        q, k, v = (h @ w[p + f"attn_{t}.weight"].T + w.get(p + f"attn_{t}.bias", 0.0) for t in "qkv")
        q, k, v = q.reshape(n, nh, d), k.reshape(n, nkv, d), v.reshape(n, nkv, d)
        if p + "attn_q_norm.weight" in w:
            q = rms(q, w[p + "attn_q_norm.weight"], hp["eps"])
            k = rms(k, w[p + "attn_k_norm.weight"], hp["eps"])
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        out = np.empty((n, nh, d))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kv].T / np.sqrt(d) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, hh] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(n, nh * d) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"], hp["eps"])
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        if l < hp["deepstack"]:
            x[img] = x[img] + parts[:, l + 1]
    x = rms(x, w["output_norm.weight"], hp["eps"])
    head = w.get("output.weight", w["token_embd.weight"])
    return x @ head.T


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    hp, w = load(sys.argv[1])
    cases = json.load(open(sys.argv[2]))["cases"]
    out = []
    for c in cases:
        ids = [int(t) for t in c["ids"]]
        pos, delta = get_rope_index(c)
        rows = np.fromfile(c["embeds"], dtype="<f4").astype(np.float64)
        tokens = {c["image_token_id"], c.get("video_token_id", c["image_token_id"])}
        logits = forward(hp, w, ids, tokens, rows, pos)
        logits.astype("<f4").tofile(c["logits"])
        out.append({"positions": pos.tolist(), "delta": delta})
    json.dump({"cases": out}, open(sys.argv[3], "w"))


if __name__ == "__main__":
    main()
