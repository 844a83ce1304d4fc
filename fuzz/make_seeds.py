#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (fuzz/corpus/TARGET/*), deterministically.

File names say what the replay test (engine/tests/it/fuzz_replay.rs, server/tests/it/fuzz_replay.rs)
expects: `ok-*` must be accepted, `bad-*` refused with an error; any other name (a fuzzer finding
added later) must only not crash. Run from the repository root: python3 fuzz/make_seeds.py
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
T_F32 = 0


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, ty, payload):
    return gstr(key) + struct.pack("<I", ty) + payload


def kv_u32(key, v):
    return kv(key, U32, struct.pack("<I", v))


def kv_f32(key, v):
    return kv(key, F32, struct.pack("<f", v))


def kv_str(key, v):
    return kv(key, STR, gstr(v))


def kv_arr(key, ety, elems):
    return kv(key, ARR, struct.pack("<IQ", ety, len(elems)) + b"".join(elems))


def gguf(kvs, tensors, align=32):
    """tensors: (name, dims in ggml order, f32 values)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    infos, data = b"", b""
    for name, dims, vals in tensors:
        data += b"\0" * (-len(data) % align)
        infos += gstr(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", T_F32, len(data))
        data += struct.pack("<%df" % len(vals), *vals)
    out = head + infos
    out += b"\0" * (-len(out) % align)
    return out + data


def vals(n, seed):
    return [((i * 37 + seed * 11) % 17 - 8) / 64.0 for i in range(n)]


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_model(tokens_ok=True, template=CHATML):
    """A 1-layer llama (hidden 8, 2 heads / 1 KV head of 4, ffn 16) with a 20-token byte-level BPE."""
    toks = [c for c in "abcdefghijklmnop"] + ["ab", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    n = len(toks)
    types = [1] * 17 + [3, 3, 3]
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u32("llama.context_length", 64),
        kv_u32("llama.embedding_length", 8),
        kv_u32("llama.block_count", 1),
        kv_u32("llama.feed_forward_length", 16),
        kv_u32("llama.attention.head_count", 2),
        kv_u32("llama.attention.head_count_kv", 1),
        kv_f32("llama.rope.freq_base", 10000.0),
        kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_str("tokenizer.ggml.pre", "gpt2"),
        kv_arr("tokenizer.ggml.tokens", STR, [gstr(t) for t in toks]),
        kv_arr("tokenizer.ggml.token_type", I32, [struct.pack("<i", t) for t in types]),
        kv_arr("tokenizer.ggml.merges", STR, [gstr("a b" if tokens_ok else "a zz")]),
        kv_u32("tokenizer.ggml.eos_token_id", 18),
    ]
    if template is not None:
        kvs.append(kv_str("tokenizer.chat_template", template))
    h, f, kvh, hd = 8, 16, 4, 4
    t = [
        ("token_embd.weight", [h, n], vals(h * n, 1)),
        ("output_norm.weight", [h], [1.0] * h),
        ("blk.0.attn_norm.weight", [h], [1.0] * h),
        ("blk.0.attn_q.weight", [h, h], vals(h * h, 2)),
        ("blk.0.attn_k.weight", [h, kvh], vals(h * kvh, 3)),
        ("blk.0.attn_v.weight", [h, kvh], vals(h * kvh, 4)),
        ("blk.0.attn_output.weight", [h, h], vals(h * h, 5)),
        ("blk.0.ffn_norm.weight", [h], [1.0] * h),
        ("blk.0.ffn_gate.weight", [h, f], vals(h * f, 6)),
        ("blk.0.ffn_up.weight", [h, f], vals(h * f, 7)),
        ("blk.0.ffn_down.weight", [f, h], vals(h * f, 8)),
    ]
    return gguf(kvs, t)


def safetensors(header, data_len):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(data_len)


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    m = tiny_model()
    write("gguf_reader", "ok-tiny-llama.gguf", m)
    write("gguf_reader", "ok-no-template.gguf", tiny_model(template=None))
    write("gguf_reader", "bad-magic.gguf", b"GGUX" + m[4:])
    write("gguf_reader", "bad-truncated.gguf", m[: len(m) - 5])
    write("gguf_reader", "bad-header-only.gguf", m[:40])
    write("gguf_reader", "bad-merge.gguf", tiny_model(tokens_ok=False))
    write("gguf_reader", "bad-template.gguf", tiny_model(template="{% for m in messages %}"))
    write("gguf_reader", "bad-kv-count.gguf", m[:16] + struct.pack("<Q", 2**62) + m[24:])

    f32 = lambda o: {"dtype": "F32", "shape": [2], "data_offsets": [o, o + 8]}
    write("safetensors_header", "ok-two.safetensors",
          safetensors({"__metadata__": {"format": "pt"}, "a": f32(0), "b": f32(8)}, 16))
    write("safetensors_header", "bad-overlap.safetensors",
          safetensors({"a": f32(0), "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12))
    write("safetensors_header", "bad-gap.safetensors",
          safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12))
    write("safetensors_header", "bad-nbytes.safetensors",
          safetensors({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8))
    write("safetensors_header", "bad-dtype.safetensors",
          safetensors({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, 1))
    write("safetensors_header", "bad-header-len.safetensors", struct.pack("<Q", 2**40) + b"{}")
    write("safetensors_header", "bad-json.safetensors", struct.pack("<Q", 6) + b'{"a": ')
    write("safetensors_header", "bad-shape-overflow.safetensors",
          safetensors({"a": {"dtype": "F32", "shape": [2**32, 2**32, 2**32],
                             "data_offsets": [0, 8]}}, 8))

    write("chat_template", "ok-chatml", CHATML + "\0Hello there")
    write("chat_template", "ok-filters",
          "{{ bos_token }}{% for m in messages %}{{ m.role|upper }}: {{ m.content|trim|indent(2) }}"
          "{% if not loop.last %}\n{% endif %}{% endfor %}{{ eos_token }}\0  hi  ")
    write("chat_template", "ok-raise-free-macro",
          "{% macro r(m) %}[{{ m.role }}]{{ m.content }}{% endmacro %}"
          "{% for m in messages %}{{ r(m) }}{% endfor %}\0x")
    write("chat_template", "bad-syntax", "{% for m in messages %}\0x")
    write("chat_template", "bad-endless", "{% for i in range(100000) %}{% for j in range(100000) %}"
          "{% endfor %}{% endfor %}\0x")
    write("chat_template", "bad-huge-output", "{% for i in range(1000) %}{{ 'x' * 100000 }}"
          "{% endfor %}\0x")
    write("chat_template", "bad-indent-bomb", "{{ 'x'|indent(1000000000000) }}\0x")
    write("chat_template", "bad-format-width", "{{ '%01000000000000d'|format(1) }}\0x")
    write("chat_template", "bad-include", "{% include '/etc/passwd' %}\0x")
    write("chat_template", "bad-raise", "{{ raise_exception('no') }}\0x")

    msgs = [{"role": "user", "content": "Hi"}]
    ok = lambda **kw: json.dumps(dict(model="m", **kw))
    write("request_json", "ok-chat.json", ok(messages=msgs, max_tokens=8, temperature=0.7))
    write("request_json", "ok-completion.json", ok(prompt="Once", stop=["\n"], seed=3))
    write("request_json", "ok-completion-ids.json", ok(prompt=[1, 2, 3], logprobs=2))
    write("request_json", "ok-chat-stream.json",
          ok(messages=msgs, stream=True, stream_options={"include_usage": True}))
    write("request_json", "ok-chat-choices.json", ok(messages=msgs, n=3, seed=5))
    write("request_json", "bad-not-json.json", "{\"model\": ")
    write("request_json", "bad-array.json", "[1, 2]")
    write("request_json", "bad-utf8.json", b'{"model": "m", "prompt": "\xff\xfe"}')
    write("request_json", "bad-no-model.json", json.dumps({"messages": msgs}))
    write("request_json", "bad-max-tokens.json", ok(messages=msgs, prompt="x", max_tokens=-1))
    write("request_json", "bad-temperature.json", ok(messages=msgs, prompt="x", temperature=-3))
    write("request_json", "bad-top-p.json", ok(messages=msgs, prompt="x", top_p=7))
    write("request_json", "bad-n.json", ok(messages=msgs, prompt="x", n=17))
    write("request_json", "bad-deep.json", '{"model":"m","messages":' + "[" * 5000 + "]" * 5000 + "}")


if __name__ == "__main__":
    main()
