#!/usr/bin/env python3
"""llama.cpp's logits on a GGUF file, for `memra-verify peer-logits` (docs/VERIFY.md).

    python3 tools/peer/logits.py MODEL.gguf OUT.json [--steps 64] [--threads N]

Runs llama.cpp (the llama-cpp-python package, built from the same vendored source as the
device peer) on 8 fixed prompts, greedy for --steps tokens each, and writes OUT.json (the
prompts' token ids and the generated ids) and OUT.bin (little-endian f32: per prompt, per
generated token, the full logit row that predicted it). llama-cpp-python is installed by
tools/peer/install.sh (a CPU build from the sdist, ~10 minutes on 2 cores).
"""
import argparse
import json
import struct
import sys

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The quick brown fox jumps over the lazy dog.",
    "1, 2, 3, 4, 5,",
    "In machine learning, a transformer is",
    "Dear Sir or Madam, I am writing to",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("llama_cpp is not installed: run tools/peer/install.sh", file=sys.stderr)
        return 2
    m = llama_cpp.Llama(model_path=a.model, n_ctx=512, logits_all=True, verbose=False,
                        n_threads=a.threads, n_batch=512)
    vocab = m.n_vocab()
    bin_path = a.out[:-5] + ".bin" if a.out.endswith(".json") else a.out + ".bin"
    cases = []
    with open(bin_path, "wb") as f:
        for text in PROMPTS:
            m.reset()
            prompt = m.tokenize(text.encode(), add_bos=False)
            m.eval(prompt)
            tokens = []
            for _ in range(a.steps):
                row = list(m.scores[m.n_tokens - 1])
                # The lowest index among equal maxima, as memra's argmax.
                best = max(range(vocab), key=lambda i: (row[i], -i))
                f.write(struct.pack(f"<{vocab}f", *row))
                tokens.append(best)
                m.eval([best])
            cases.append({"text": text, "prompt": prompt, "tokens": tokens})
    with open(a.out, "w") as f:
        json.dump({"peer": f"llama-cpp-python {llama_cpp.__version__}", "model": a.model,
                   "vocab": vocab, "logits": bin_path.rsplit("/", 1)[-1], "cases": cases}, f)
    print(f"wrote {a.out} and {bin_path}: {len(cases)} prompts x {a.steps} steps, vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
