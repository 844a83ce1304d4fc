"""memra-server image and video input through the official `openai` client (run by
server/tests/it/vision.rs against a tiny gemma3 with a tiny random vision tower, and with the
argument `video` by server/tests/it/vision_video.rs against tiny Qwen-VL models: the video test
alone).

Env: MEMRA_TEST_URL (http://host:port), MEMRA_TEST_KEY (an API key), MEMRA_TEST_ALIAS (model).
Exits non-zero on the first failed check.
"""
import base64
import os
import struct
import sys
import zlib

import openai

URL = os.environ["MEMRA_TEST_URL"]
KEY = os.environ["MEMRA_TEST_KEY"]
MODEL = os.environ["MEMRA_TEST_ALIAS"]
client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)


def png(w, h, seed):
    """A small RGB PNG (pure Python: zlib + CRC)."""
    rows = b"".join(
        b"\x00" + bytes(((x * 3 + seed) & 255, (y * 5) & 255, ((x ^ y) + seed * 7) & 255)[c]
                        for x in range(w) for c in range(3))
        for y in range(h)
    )

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def ask(content, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0, **kw
    )


def streamed(content):
    text, usage = "", None
    for chunk in ask(content, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
    return text, usage


def test_image():
    content = [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": png(40, 30, 1)}},
    ]
    r = ask(content)
    c = r.choices[0]
    assert c.message.content, r
    assert c.finish_reason in ("stop", "length")
    text, usage = streamed(content)
    assert text == c.message.content, (text, c.message.content)
    assert usage.prompt_tokens == r.usage.prompt_tokens
    # The same image again hits the prefix cache past the image's 16 rows.
    again = ask(content)
    assert again.usage.prompt_tokens_details.cached_tokens > 16, again.usage
    assert again.choices[0].message.content == c.message.content


def test_video():
    frames = [png(24, 24, 10 + i) for i in range(6)]
    content = [{"type": "text", "text": "What happens?"}, {"type": "video", "video": frames, "fps": 2}]
    r = ask(content)
    assert r.choices[0].message.content, r
    text, _ = streamed(content)
    assert text == r.choices[0].message.content


def test_refusals():
    for url in ["data:image/png;base64,AAAA", "https://example.com/cat.png"]:
        try:
            ask([{"type": "image_url", "image_url": {"url": url}}])
        except openai.BadRequestError as e:
            assert e.status_code == 400
            assert e.body and e.body.get("message"), e.body
        else:
            raise AssertionError(f"{url[:30]} was accepted")


if __name__ == "__main__":
    # `video`: the video test alone (a Qwen ViT's model: the model's own video path).
    if sys.argv[1:] == ["video"]:
        test_video()
    else:
        test_image()
        test_video()
        test_refusals()
    print("ok")
