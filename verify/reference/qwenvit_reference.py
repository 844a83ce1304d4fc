"""Independent float64 numpy reference of the Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower
(the ViT and its patch merger, Qwen3-VL's deepstack mergers too) read from an mmproj GGUF in
llama.cpp's layout (projectors qwen2vl_merger, qwen2.5vl_merger, qwen3vl_merger).

It shares no code with memra and follows HF transformers' structure, not memra's: the
processor's patch flattening (frames tiled, patches as channel / frame / y / x in merge-block
order), the Conv3d as one product over the stacked frame kernels, the rotary table as HF builds
it (row and column ids permuted into merge-block order, `cat(freqs, freqs)`, `rotate_half`),
Qwen2.5-VL's window attention by reordering the merged tokens into windows (`get_window_index`,
padded windows, `cu_seqlens`) and attending within contiguous segments, then undoing the order
after the merger; Qwen3-VL's learned positions by `fast_pos_embed_interpolate` (linspace over
the grid, four corners). Weights come from `gguf.GGUFReader` (+ `gguf.quants.dequantize`); all
arithmetic is float64.

A video is the processor's video path: its frames stacked (an odd count padded by repeating the
last frame), cut into `grid_t = T / 2` temporal patches of two frames (frame 2k through the
first temporal kernel, 2k+1 through the second), `grid_thw = (grid_t, h, w)`; the whole video
goes through the tower at once as HF runs it: the rotary ids and learned positions repeated per
temporal patch, `cu_seqlens` of `h x w` patches per temporal patch (full-attention layers), the
window index per temporal patch (windowed layers), the merger, the window order undone.

    python3 verify/reference/qwenvit_reference.py MMPROJ IMAGE.rgb:WxH [F0.rgb,F1.rgb,...:WxH ...]

Each IMAGE.rgb holds W x H RGB bytes (row-major; W and H multiples of patch x merge: the
tower's input size, no resizing here); writes IMAGE.rgb.ref.f32 (tokens x width little-endian
float32, width = text_hidden x (1 + deepstack mergers)) beside it. A comma-separated list of
frame files is one video (its rows: grid_t x tokens, temporal patch after temporal patch),
written beside its first frame (F0.rgb.ref.f32).
"""
import math
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

KINDS = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    vals = [f.parts[i] for i in f.data]
    if key in ("clip.vision.image_mean", "clip.vision.image_std", "clip.vision.is_deepstack_layers"):
        return [v[0].item() for v in vals]
    v = vals[0]
    return v.tobytes().decode() if v.dtype == np.uint8 else v.item()


def load(path):
    r = GGUFReader(path)
    kind = field(r, "clip.projector_type")
    if kind not in KINDS:
        raise SystemExit(f"projector {kind!r}: expected one of {KINDS}")
    k = "clip.vision."
    clip_mean = [0.48145466, 0.4578275, 0.40821073]
    clip_std = [0.26862954, 0.26130258, 0.27577711]
    q3 = kind == "qwen3vl_merger"
    hp = dict(
        kind=kind,
        patch=int(field(r, k + "patch_size")),
        hidden=int(field(r, k + "embedding_length")),
        layers=int(field(r, k + "block_count")),
        heads=int(field(r, k + "attention.head_count")),
        eps=float(field(r, k + "attention.layer_norm_epsilon", 1e-6)),
        merge=int(field(r, k + "spatial_merge_size", 2)),
        wa=int(field(r, k + "n_wa_pattern", 0)),
        window=int(field(r, k + "window_size", 112)),
        mean=np.array(field(r, k + "image_mean", [0.5] * 3 if q3 else clip_mean), dtype=np.float64),
        std=np.array(field(r, k + "image_std", [0.5] * 3 if q3 else clip_std), dtype=np.float64),
        deepstack=[i for i, b in enumerate(field(r, k + "is_deepstack_layers", [])) if b],
        act="gelu_tanh" if field(r, "clip.use_gelu", False) else ("silu" if field(r, "clip.use_silu", False) else "quick_gelu"),
    )
    w = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return hp, w


def norm(x, w, name, eps):
    g = w[name + ".weight"]
    b = w.get(name + ".bias")
    if b is None:  # RMSNorm (Qwen2.5-VL)
        return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * g
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def act(x, kind):
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if kind == "quick_gelu":
        return x / (1.0 + np.exp(-1.702 * x))
    raise ValueError(kind)


def linear(x, w, name):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def processor_patches(hp, frames, W, H):
    """HF's Qwen2VLImageProcessor flattening of an image (one frame, tiled to the temporal patch)
    or a video's frames (padded to a multiple of 2 by repeating the last)."""
    p, m = hp["patch"], hp["merge"]
    imgs = []
    for rgb in frames:
        img = rgb.reshape(H, W, 3).astype(np.float64) / 255.0
        imgs.append(((img - hp["mean"]) / hp["std"]).transpose(2, 0, 1))  # (3, H, W)
    x = np.stack(imgs)  # (T, 3, H, W)
    if x.shape[0] % 2:
        x = np.concatenate([x, np.repeat(x[-1:], 2 - x.shape[0] % 2, axis=0)])
    gt, gh, gw = x.shape[0] // 2, H // p, W // p
    x = x.reshape(gt, 2, 3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, gh/m, gw/m, m, m, C, T, p, p)
    return x.reshape(gt * gh * gw, 3 * 2 * p * p), gt, gh, gw


def rot_pos_emb(hp, gh, gw):
    m = hp["merge"]
    d = hp["hidden"] // hp["heads"]
    dim = d // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    hpos = np.broadcast_to(np.arange(gh)[:, None], (gh, gw))
    wpos = np.broadcast_to(np.arange(gw)[None, :], (gh, gw))
    order = lambda a: a.reshape(gh // m, m, gw // m, m).transpose(0, 2, 1, 3).reshape(-1)
    ids = np.stack([order(hpos), order(wpos)], axis=-1)  # (N, 2)
    table = np.outer(np.arange(max(gh, gw)), inv_freq)
    return table[ids].reshape(len(ids), -1)  # (N, d/2)


def window_index(hp, gt, gh, gw):
    m, p = hp["merge"], hp["patch"]
    vws = hp["window"] // m // p
    lh, lw = gh // m, gw // m
    index = np.arange(gt * lh * lw).reshape(gt, lh, lw)
    pad_h, pad_w = vws - lh % vws, vws - lw % vws
    nh, nw = (lh + pad_h) // vws, (lw + pad_w) // vws
    padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
    padded = padded.reshape(gt, nh, vws, nw, vws).transpose(0, 1, 3, 2, 4).reshape(gt, nh * nw, vws, vws)
    seqlens = (padded != -100).sum(axis=(2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    idx = flat[flat != -100]
    cu = np.concatenate([[0], np.cumsum(seqlens) * m * m])
    cu = np.unique(cu)  # consecutive duplicates (empty windows) collapse
    return idx, cu


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def attention(hp, w, i, x, cos, sin, cu):
    h, nh = hp["hidden"], hp["heads"]
    d = h // nh
    b = f"v.blk.{i}."
    if b + "attn_qkv.weight" in w:
        qkv = linear(x, w, b + "attn_qkv").reshape(-1, 3, nh, d).transpose(1, 0, 2, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
    else:
        q, k, v = (linear(x, w, b + f"attn_{n}").reshape(-1, nh, d) for n in "qkv")
    q, k = rotate(q, cos[:, None, :], sin[:, None, :]), rotate(k, cos[:, None, :], sin[:, None, :])
    out = np.zeros_like(q)
    for s, e in zip(cu[:-1], cu[1:]):
        qs, ks, vs = (t[s:e].transpose(1, 0, 2) for t in (q, k, v))
        sc = qs @ ks.transpose(0, 2, 1) / math.sqrt(d)
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc = sc / sc.sum(axis=-1, keepdims=True)
        out[s:e] = (sc @ vs).transpose(1, 0, 2)
    return linear(out.reshape(-1, h), w, b + "attn_out")


def mlp(hp, w, i, x):
    b = f"v.blk.{i}."
    if hp["act"] == "silu":
        g = linear(x, w, b + "ffn_gate")
        return linear(g / (1.0 + np.exp(-g)) * linear(x, w, b + "ffn_up"), w, b + "ffn_down")
    return linear(act(linear(x, w, b + "ffn_up"), hp["act"]), w, b + "ffn_down")


def interpolated_positions(hp, w, gh, gw):
    """Qwen3-VL's fast_pos_embed_interpolate for one image (t = 1)."""
    table = w["v.position_embd.weight"]
    n = int(round(math.sqrt(table.shape[0])))
    m = hp["merge"]
    hi, wi = np.linspace(0, n - 1, gh), np.linspace(0, n - 1, gw)
    hf, wf = hi.astype(int), wi.astype(int)
    hc, wc = np.clip(hf + 1, None, n - 1), np.clip(wf + 1, None, n - 1)
    dh, dw = (hi - hf)[:, None], (wi - wf)[None, :]
    idx = [hf[:, None] * n + wf[None, :], hf[:, None] * n + wc[None, :], hc[:, None] * n + wf[None, :], hc[:, None] * n + wc[None, :]]
    wts = [(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw]
    pos = sum(table[i.reshape(-1)] * c.reshape(-1, 1) for i, c in zip(idx, wts))  # raster order
    h = table.shape[1]
    return pos.reshape(gh // m, m, gw // m, m, h).transpose(0, 2, 1, 3, 4).reshape(-1, h)


def merger(hp, w, x, norm_name, fc1, fc2, post_shuffle):
    wide = hp["hidden"] * hp["merge"] ** 2
    if post_shuffle:
        x = norm(x.reshape(-1, wide), w, norm_name, hp["eps"])
    else:
        x = norm(x, w, norm_name, hp["eps"]).reshape(-1, wide)
    return linear(gelu_erf(linear(x, w, fc1)), w, fc2)


def tower(hp, w, frames, W, H):
    cols, gt, gh, gw = processor_patches(hp, frames, W, H)
    h, mm = hp["hidden"], hp["merge"] ** 2
    kernel = np.stack([w["v.patch_embd.weight"], w["v.patch_embd.weight.1"]], axis=2)  # (h, C, T, p, p)
    x = cols @ kernel.reshape(h, -1).T
    if "v.patch_embd.bias" in w:
        x = x + w["v.patch_embd.bias"]
    if "v.position_embd.weight" in w:
        x = x + np.tile(interpolated_positions(hp, w, gh, gw), (gt, 1))
    rpe = np.tile(rot_pos_emb(hp, gh, gw), (gt, 1))
    n = gt * gh * gw
    full = np.arange(gt + 1) * (gh * gw)  # cu_seqlens: one segment per temporal patch
    if hp["wa"] > 0:
        widx, wcu = window_index(hp, gt, gh, gw)
        x = x.reshape(n // mm, mm, h)[widx].reshape(n, h)
        rpe = rpe.reshape(n // mm, mm, -1)[widx].reshape(n, -1)
    emb = np.concatenate([rpe, rpe], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    deep = []
    for i in range(hp["layers"]):
        windowed = hp["wa"] > 0 and (i + 1) % hp["wa"] != 0
        x = x + attention(hp, w, i, norm(x, w, f"v.blk.{i}.ln1", hp["eps"]), cos, sin, wcu if windowed else full)
        x = x + mlp(hp, w, i, norm(x, w, f"v.blk.{i}.ln2", hp["eps"]))
        if i in hp["deepstack"]:
            d = f"v.deepstack.{i}."
            deep.append(merger(hp, w, x, d + "norm", d + "fc1", d + "fc2", True))
    out = merger(hp, w, x, "v.post_ln", "mm.0", "mm.2", False)
    if hp["wa"] > 0:
        back = np.argsort(widx)
        out, deep = out[back], [d[back] for d in deep]
    return np.concatenate([out] + deep, axis=-1)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    hp, w = load(sys.argv[1])
    f = hp["patch"] * hp["merge"]
    for arg in sys.argv[2:]:
        paths, size = arg.rsplit(":", 1)
        paths = paths.split(",")
        W, H = (int(v) for v in size.split("x"))
        if W % f or H % f:
            raise SystemExit(f"{paths[0]}: {W}x{H} is not a multiple of {f}")
        frames = []
        for path in paths:
            rgb = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
            if rgb.size != W * H * 3:
                raise SystemExit(f"{path}: {rgb.size} bytes, expected {W}x{H}x3")
            frames.append(rgb)
        out = tower(hp, w, frames, W, H).astype("<f4")
        out.tofile(paths[0] + ".ref.f32")
        print(f"{paths[0]} ({len(frames)} frames): {out.shape[0]} x {out.shape[1]}")


if __name__ == "__main__":
    main()
