"""Independent FP8 / NVFP4 fixture for memra's checkpoint tests (engine/tests/it/fp8.rs).

Decodes e4m3 (float8_e4m3fn) and e2m1 (float4_e2m1fn) with ml_dtypes, never with memra's
code, and computes the products of two small checkpoints in float64 from their stored codes
and scales exactly as the formats define them:

- HF fp8, weight_block_size [128, 128]: w[n, k] = e4m3(q[n, k]) * scale_inv[n // 128, k // 128]
- ModelOpt NVFP4: w[n, k] = e2m1(q[n, k]) * (e4m3(weight_scale[n, k // 16]) * weight_scale_2)
  with q packed two per byte, element 2i in the low nibble.

Run: pip install ml_dtypes==0.5.4 numpy; python3 verify/reference/fp8_fixture.py OUT.json
(the committed fixture is verify/fixtures/fp8-reference.json).
"""
import json
import sys

import ml_dtypes
import numpy as np

rng = np.random.default_rng(37)


def e4m3_values(codes):
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e2m1_values(nibbles):
    # ml_dtypes stores one float4_e2m1fn per byte, the code in the low 4 bits.
    return np.asarray(nibbles, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def f32_bits(v):
    return [int(b) for b in np.asarray(v, dtype=np.float32).view(np.uint32)]


out = {"ml_dtypes": ml_dtypes.__version__, "numpy": np.__version__}
out["e4m3_bits"] = f32_bits(e4m3_values(np.arange(256)))
out["e2m1_bits"] = f32_bits(e2m1_values(np.arange(16)))

# Rounding: random values in range and every midpoint between neighbouring finite codes.
finite = np.sort(np.unique(np.abs(e4m3_values(np.arange(0, 0x7F)))))
mids = (finite[:-1] + finite[1:]) / 2
xs = np.concatenate([rng.normal(0, 30, 200), mids, -mids, [0.0, 448.0, -448.0, 1e-6]]).astype(np.float32)
out["e4m3_round_in"] = f32_bits(xs)
out["e4m3_round_out"] = [int(c) for c in xs.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)]
f4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
m4 = (f4[:-1] + f4[1:]) / 2
xs4 = np.concatenate([rng.uniform(-6, 6, 100), m4, -m4]).astype(np.float32)
out["e2m1_round_in"] = f32_bits(xs4)
out["e2m1_round_out"] = [int(c) & 0xF for c in xs4.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)]

# An fp8 checkpoint matrix: 130 x 256 (a partial last row block), codes without NaN.
n, k = 130, 256
q = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
q[(q & 0x7F) == 0x7F] = 0x38  # 1.0 instead of NaN
s = rng.uniform(1e-4, 1e-2, size=((n + 127) // 128, (k + 127) // 128)).astype(np.float32)
x = rng.normal(0, 1, k).astype(np.float32)
w = e4m3_values(q.ravel()).reshape(n, k) * np.repeat(np.repeat(s.astype(np.float64), 128, 0), 128, 1)[:n, :k]
out["fp8"] = {
    "n": n, "k": k, "codes": [int(c) for c in q.ravel()], "scale_inv_bits": f32_bits(s.ravel()),
    "x_bits": f32_bits(x), "y": [float(v) for v in w @ x.astype(np.float64)],
}

# An NVFP4 checkpoint matrix: 6 x 64.
n, k = 6, 64
nib = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
sc = rng.integers(0x20, 0x58, size=(n, k // 16), dtype=np.uint8)  # e4m3 codes 2^-3 .. 2^3
g = np.float32(0.0123)
scale = (e4m3_values(sc.ravel()).reshape(n, k // 16).astype(np.float32) * g).astype(np.float64)
w4 = e2m1_values(nib.ravel()).reshape(n, k) * np.repeat(scale, 16, 1)
x4 = rng.normal(0, 1, k).astype(np.float32)
out["nvfp4"] = {
    "n": n, "k": k, "packed": [int(c) for c in packed.ravel()], "scale_codes": [int(c) for c in sc.ravel()],
    "global_bits": f32_bits([g])[0], "x_bits": f32_bits(x4), "y": [float(v) for v in w4 @ x4.astype(np.float64)],
}

with open(sys.argv[1], "w") as f:
    json.dump(out, f, separators=(",", ":"))
