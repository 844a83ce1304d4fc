#!/usr/bin/env python3
"""llama.cpp mtmd's image embeddings and greedy image prompts, for `memra-verify peer-vision`.

    python3 tools/peer/mtmd.py TEXT.gguf MMPROJ.gguf OUT.json [--images 4] [--prompts 8]
        [--steps 64] [--threads 2] [--flash-attn] [--verbose]

Through llama-cpp-python's ctypes bindings (llama_cpp.mtmd_cpp, llama_cpp; tools/peer/install.sh)
this loads the text model and the mmproj with llama.cpp's own multimodal library (libmtmd) and:

- builds --images deterministic RGB images of the tower's input size (so mtmd's preprocessing
  does no resize: it copies the pixels and normalises (x / 255 - mean) / std, as memra does)
  and writes them to OUT.images.rgb (concatenated, row-major RGB bytes);
- encodes each image alone (mtmd_encode_chunk) and writes mtmd_get_output_embd's rows to
  OUT.embd.f32 (little-endian f32, image after image, tokens x n_embd each);
- runs --prompts image prompts greedy for --steps tokens: fixed text token ids, the image chunk
  (mtmd_helper_eval_chunk_single: one non-causal batch, as mtmd decodes Gemma 3's images), more
  text ids, then greedy steps (the lowest index among equal maxima, as memra's argmax); the
  logit row that picked each token goes to OUT.logits.f32.

The prompts are token ids, not text: the image's open / close markers are added only where the
vocabulary has `<start_of_image>` / `<end_of_image>` as single tokens (the tiny synthetic model
has SmolLM2's vocabulary, which has neither), so both engines see the same ids.
OUT.json names the files beside it and holds every id (docs/VERIFY.md "Against llama.cpp mtmd").
"""
import argparse
import ctypes
import json
import struct
import sys


def image(size: int, seed: int) -> bytes:
    """A deterministic size x size RGB image: gradients and a hash-like texture by seed."""
    out = bytearray()
    for y in range(size):
        for x in range(size):
            for c in range(3):
                h = ((x * 31 + y * 17 + c * 7 + seed * 101) * 2654435761 & 0xFFFFFFFF) >> 24
                g = (x + y * (c + 1)) * 255 // (2 * size)
                out.append((h // 2 + g + seed * 40) & 0xFF)
    return bytes(out)


def text_ids(k: int, n: int, vocab: int) -> list:
    return [(100 + 37 * (k * 11 + j)) % vocab for j in range(n)]


def single_token(llama_cpp, vocab, text: str):
    """The id of `text` when the vocabulary has it as one special token, else None."""
    buf = (llama_cpp.llama_token * 8)()
    raw = text.encode()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, 8, False, True)
    return buf[0] if n == 1 else None


class Peer:
    def __init__(self, a):
        import llama_cpp
        from llama_cpp import mtmd_cpp

        self.L, self.M = llama_cpp, mtmd_cpp
        L, M = llama_cpp, mtmd_cpp
        if not a.verbose:
            # Keep the callback alive as long as the libraries may call it.
            self.quiet = L.llama_log_callback(lambda level, text, data: None)
            L.llama_log_set(self.quiet, None)
            M.mtmd_log_set(self.quiet, None)
            M.mtmd_helper_log_set(self.quiet, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(a.text.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {a.text}")
        cp = L.llama_context_default_params()
        cp.n_ctx = 512
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = a.threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not make a context")
        vp = M.mtmd_context_params_default()
        vp.use_gpu = False
        vp.n_threads = a.threads
        vp.print_timings = False
        vp.warmup = False
        # Without flash attention the tower's attention stays f32 (with it, K and V go to f16).
        vp.flash_attn_type = 1 if a.flash_attn else 0
        self.mctx = M.mtmd_init_from_file(a.mmproj.encode(), self.model, vp)
        if not self.mctx:
            raise SystemExit(f"mtmd refused {a.mmproj} (--verbose shows llama.cpp's log)")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_embd = L.llama_model_n_embd(self.model)

    def image_chunk(self, rgb: bytes, size: int):
        """The image chunk mtmd makes of one bitmap (its marker text chunks are dropped)."""
        L, M = self.L, self.M
        data = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
        bmp = M.mtmd_bitmap_init(size, size, data)
        part = M.mtmd_input_part(text=None, bitmap=bmp)
        parts = (ctypes.POINTER(M.mtmd_input_part) * 1)(ctypes.pointer(part))
        chunks = M.mtmd_input_chunks_init()
        if M.mtmd_tokenize_from_parts(self.mctx, chunks, parts, 1, False) != 0:
            raise SystemExit("mtmd_tokenize_from_parts failed")
        found = None
        for i in range(M.mtmd_input_chunks_size(chunks)):
            c = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(c) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                found = M.mtmd_input_chunk_copy(c)
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bmp)
        if found is None:
            raise SystemExit("mtmd made no image chunk")
        return found

    def encode(self, chunk) -> bytes:
        M = self.M
        if M.mtmd_encode_chunk(self.mctx, chunk) != 0:
            raise SystemExit("mtmd_encode_chunk failed")
        n = M.mtmd_input_chunk_get_n_tokens(chunk)
        ptr = M.mtmd_get_output_embd(self.mctx)
        return ctypes.string_at(ptr, n * self.n_embd * 4)

    def decode(self, ids: list, pos: int, want_last: bool):
        L = self.L
        b = L.llama_batch_init(len(ids), 0, 1)
        b.n_tokens = len(ids)
        for i, t in enumerate(ids):
            b.token[i] = t
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (want_last and i == len(ids) - 1) else 0
        rc = L.llama_decode(self.ctx, b)
        L.llama_batch_free(b)
        if rc != 0:
            raise SystemExit(f"llama_decode failed ({rc})")

    def last_logits(self) -> bytes:
        return ctypes.string_at(self.L.llama_get_logits_ith(self.ctx, -1), self.n_vocab * 4)

    def prompt(self, before: list, chunk, after: list, steps: int, logits_out) -> list:
        L, M = self.L, self.M
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self.decode(before, 0, False)
        new_past = L.llama_pos(0)
        rc = M.mtmd_helper_eval_chunk_single(self.mctx, self.ctx, chunk, len(before), 0, 512,
                                             False, ctypes.byref(new_past))
        if rc != 0:
            raise SystemExit(f"mtmd_helper_eval_chunk_single failed ({rc})")
        pos = new_past.value
        self.decode(after, pos, True)
        pos += len(after)
        tokens = []
        for _ in range(steps):
            raw = self.last_logits()
            row = struct.unpack(f"<{self.n_vocab}f", raw)
            best = max(range(self.n_vocab), key=lambda i: (row[i], -i))
            logits_out.write(raw)
            tokens.append(best)
            self.decode([best], pos, True)
            pos += 1
        return tokens


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("mmproj")
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true",
                    help="the tower's attention with flash attention (f16 K and V)")
    ap.add_argument("--verbose", action="store_true", help="llama.cpp's and mtmd's log on stderr")
    a = ap.parse_args()
    if a.images < 1 or a.prompts < 0 or a.steps < 1:
        print("--images and --steps must be at least 1", file=sys.stderr)
        return 2
    try:
        import llama_cpp
    except ImportError:
        print("llama_cpp is not installed: run tools/peer/install.sh", file=sys.stderr)
        return 2
    p = Peer(a)
    M = p.M
    # The tower's input size (mtmd resizes every image to it; we feed it as is).
    try:
        import gguf
        size = int(gguf.GGUFReader(a.mmproj).fields["clip.vision.image_size"].contents())
    except (ImportError, KeyError, ValueError) as e:
        print(f"{a.mmproj}: cannot read clip.vision.image_size ({e!r}; needs gguf-py)",
              file=sys.stderr)
        return 2
    stem = a.out[:-5] if a.out.endswith(".json") else a.out
    names = {k: f"{stem}.{k}" for k in ("images.rgb", "embd.f32", "logits.f32")}
    images = [image(size, i) for i in range(a.images)]
    with open(names["images.rgb"], "wb") as f:
        for img in images:
            f.write(img)
    chunks = [p.image_chunk(img, size) for img in images]
    rows = M.mtmd_input_chunk_get_n_tokens(chunks[0])
    with open(names["embd.f32"], "wb") as f:
        for c in chunks:
            f.write(p.encode(c))
    opener = single_token(llama_cpp, p.vocab, "<start_of_image>")
    closer = single_token(llama_cpp, p.vocab, "<end_of_image>")
    cases = []
    with open(names["logits.f32"], "wb") as f:
        for i in range(a.prompts):
            before = text_ids(i, 3 + i % 5, p.n_vocab) + ([opener] if opener is not None else [])
            after = ([closer] if closer is not None else []) + text_ids(i + 1, 4 + i % 3, p.n_vocab)
            k = i % len(images)
            tokens = p.prompt(before, chunks[k], after, a.steps, f)
            cases.append({"before": before, "image": k, "after": after, "tokens": tokens})
    for c in chunks:
        M.mtmd_input_chunk_free(c)
    out = {
        "peer": f"llama-cpp-python {llama_cpp.__version__} (mtmd)",
        "text": a.text,
        "mmproj": a.mmproj,
        "vocab": p.n_vocab,
        "width": p.n_embd,
        "image_size": size,
        "tokens_per_image": rows,
        "images": len(images),
        "flash_attn": a.flash_attn,
        "files": {"images": names["images.rgb"].rsplit("/", 1)[-1],
                  "embeddings": names["embd.f32"].rsplit("/", 1)[-1],
                  "logits": names["logits.f32"].rsplit("/", 1)[-1]},
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(f"wrote {a.out}: {len(images)} images of {size}x{size} -> {rows} rows of {p.n_embd}; "
          f"{len(cases)} prompts x {a.steps} steps, vocab {p.n_vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
