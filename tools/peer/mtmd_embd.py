#!/usr/bin/env python3
"""llama.cpp mtmd's embeddings of one RGB image (any tower, any size), to compare a tower's
rows with memra's or a numpy reference's (docs/VERIFY.md, "The Qwen ViT").

    python3 tools/peer/mtmd_embd.py TEXT.gguf MMPROJ.gguf IMAGE.rgb WxH [--threads 2]

IMAGE.rgb holds W x H RGB bytes (row-major). Give a size the tower takes as is (for the Qwen
ViT: multiples of patch x merge within mtmd's own token limits, 8..4096), or mtmd resizes it.
Writes mtmd_get_output_embd's rows to IMAGE.rgb.mtmd.f32 (little-endian f32, tokens x n_embd)
and prints the token count. Needs llama-cpp-python 0.3.36 (tools/peer/install.sh); TEXT is any
text GGUF of the tower's output width (mtmd checks it).
"""
import argparse
import ctypes
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("mmproj")
    ap.add_argument("image")
    ap.add_argument("size", help="WxH")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        import llama_cpp as L
        from llama_cpp import mtmd_cpp as M
    except ImportError:
        print("llama_cpp is not installed: run tools/peer/install.sh", file=sys.stderr)
        return 2
    w, h = (int(v) for v in a.size.split("x"))
    rgb = open(a.image, "rb").read()
    if len(rgb) != w * h * 3:
        print(f"{a.image}: {len(rgb)} bytes, not {w}x{h}x3", file=sys.stderr)
        return 2
    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, None)
    M.mtmd_log_set(quiet, None)
    M.mtmd_helper_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(a.text.encode(), mp)
    if not model:
        print(f"llama.cpp could not load {a.text}", file=sys.stderr)
        return 1
    vp = M.mtmd_context_params_default()
    vp.use_gpu = False
    vp.n_threads = a.threads
    vp.print_timings = False
    vp.warmup = False
    vp.flash_attn_type = 0  # the tower's attention in f32
    mctx = M.mtmd_init_from_file(a.mmproj.encode(), model, vp)
    if not mctx:
        print(f"mtmd refused {a.mmproj}", file=sys.stderr)
        return 1
    n_embd = L.llama_model_n_embd(model)
    data = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
    bmp = M.mtmd_bitmap_init(w, h, data)
    part = M.mtmd_input_part(text=None, bitmap=bmp)
    parts = (ctypes.POINTER(M.mtmd_input_part) * 1)(ctypes.pointer(part))
    chunks = M.mtmd_input_chunks_init()
    if M.mtmd_tokenize_from_parts(mctx, chunks, parts, 1, False) != 0:
        print("mtmd_tokenize_from_parts failed", file=sys.stderr)
        return 1
    for i in range(M.mtmd_input_chunks_size(chunks)):
        c = M.mtmd_input_chunks_get(chunks, i)
        if M.mtmd_input_chunk_get_type(c) != M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            continue
        n = M.mtmd_input_chunk_get_n_tokens(c)
        if M.mtmd_encode_chunk(mctx, c) != 0:
            print("mtmd_encode_chunk failed", file=sys.stderr)
            return 1
        with open(a.image + ".mtmd.f32", "wb") as f:
            f.write(ctypes.string_at(M.mtmd_get_output_embd(mctx), n * n_embd * 4))
        print(f"{a.image}: {n} tokens x {n_embd}")
        return 0
    print("mtmd made no image chunk", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
