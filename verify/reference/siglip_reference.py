"""Independent float64 numpy reference of Gemma 3's vision tower (SigLIP ViT + the pooling
projector) read from an mmproj GGUF in llama.cpp's layout.

It shares no code with memra: weights come from `gguf.GGUFReader` (+ `gguf.quants.dequantize`),
all arithmetic is float64 numpy (the patch convolution as a reshape + product, LayerNorm,
softmax attention, tanh-GELU, the average pool as a reshape + mean, RMSNorm, projection).

    python3 verify/reference/siglip_reference.py MMPROJ IMAGE.rgb [IMAGE.rgb ...]

Each IMAGE.rgb holds image_size x image_size RGB bytes (row-major, the tower's input size: no
resizing here); writes IMAGE.rgb.ref.f32 (tokens x text_hidden little-endian float32) beside it.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    vals = [f.parts[i] for i in f.data]
    if len(vals) == 1 and key not in ("clip.vision.image_mean", "clip.vision.image_std"):
        v = vals[0]
        return v.tobytes().decode() if v.dtype == np.uint8 else v.item()
    return [float(v[0]) for v in vals]


def load(path):
    r = GGUFReader(path)
    if field(r, "clip.projector_type") != "gemma3":
        raise SystemExit("only the gemma3 projector is implemented")
    k = "clip.vision."
    hp = dict(
        size=int(field(r, k + "image_size")),
        patch=int(field(r, k + "patch_size")),
        hidden=int(field(r, k + "embedding_length")),
        layers=int(field(r, k + "block_count")),
        heads=int(field(r, k + "attention.head_count")),
        eps=float(field(r, k + "attention.layer_norm_epsilon", 1e-6)),
        pool=int(field(r, k + "projector.scale_factor", 4)),
        mean=np.array(field(r, k + "image_mean", [0.5] * 3), dtype=np.float64),
        std=np.array(field(r, k + "image_std", [0.5] * 3), dtype=np.float64),
    )
    w = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return hp, w


def layer_norm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def tower(hp, w, rgb):
    s, p, h, nh = hp["size"], hp["patch"], hp["hidden"], hp["heads"]
    g = s // p
    img = rgb.reshape(s, s, 3).astype(np.float64) / 255.0
    img = ((img - hp["mean"]) / hp["std"]).transpose(2, 0, 1)  # (3, s, s)
    cols = img.reshape(3, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
    x = cols @ w["v.patch_embd.weight"].reshape(h, -1).T + w["v.patch_embd.bias"]
    x = x + w["v.position_embd.weight"]
    d = h // nh
    for i in range(hp["layers"]):
        b = lambda n: w[f"v.blk.{i}.{n}"]
        a = layer_norm(x, b("ln1.weight"), b("ln1.bias"), hp["eps"])
        q, k_, v = (a @ b(f"attn_{n}.weight").T + b(f"attn_{n}.bias") for n in "qkv")
        q, k_, v = (t.reshape(-1, nh, d).transpose(1, 0, 2) for t in (q, k_, v))
        sc = q @ k_.transpose(0, 2, 1) / np.sqrt(d)
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc = sc / sc.sum(axis=-1, keepdims=True)
        o = (sc @ v).transpose(1, 0, 2).reshape(-1, h)
        x = x + o @ b("attn_out.weight").T + b("attn_out.bias")
        a = layer_norm(x, b("ln2.weight"), b("ln2.bias"), hp["eps"])
        u = gelu_tanh(a @ b("ffn_up.weight").T + b("ffn_up.bias"))
        x = x + u @ b("ffn_down.weight").T + b("ffn_down.bias")
    x = layer_norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], hp["eps"])
    k = hp["pool"]
    side = g // k
    x = x.reshape(side, k, side, k, h).mean(axis=(1, 3)).reshape(side * side, h)
    x = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + hp["eps"]) * w["mm.soft_emb_norm.weight"]
    return x @ w["mm.input_projection.weight"]


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    hp, w = load(sys.argv[1])
    for path in sys.argv[2:]:
        rgb = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
        if rgb.size != hp["size"] * hp["size"] * 3:
            raise SystemExit(f"{path}: {rgb.size} bytes, expected {hp['size']}^2 x 3")
        out = tower(hp, w, rgb).astype("<f4")
        out.tofile(path + ".ref.f32")
        print(f"{path}: {out.shape[0]} x {out.shape[1]}")


if __name__ == "__main__":
    main()
