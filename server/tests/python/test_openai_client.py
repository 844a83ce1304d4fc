"""memra-server against the official `openai` client (run by server/tests/it/real_model.rs).

Env: MEMRA_TEST_URL (http://host:port), MEMRA_TEST_KEY (an API key), MEMRA_TEST_ALIAS (model).
Exits non-zero on the first failed check.
"""
import os
import sys

import openai

URL = os.environ["MEMRA_TEST_URL"]
KEY = os.environ["MEMRA_TEST_KEY"]
MODEL = os.environ["MEMRA_TEST_ALIAS"]
client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)
MSGS = [{"role": "user", "content": "Name three colors."}]


def chat(**kw):
    args = dict(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_chat_non_streaming():
    r = chat()
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content, r
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert r.usage.prompt_tokens > 5
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    assert r.system_fingerprint.startswith("fp_memra_")
    assert r.id.startswith("chatcmpl-")
    return c.message.content


def test_chat_streaming(expected):
    stream = chat(stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == expected, (text, expected)
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0


def test_completions_token_ids():
    ids = [504, 3458, 282, 253, 1345]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.prompt_tokens == len(ids), r.usage
    assert r.choices[0].text, r
    s = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_logprobs():
    r = chat(logprobs=True, top_logprobs=3, max_tokens=5)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # Greedy picks the most likely token.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4, t
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) >= 1
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_seeds():
    a = chat(temperature=1.0, seed=1234, max_tokens=16).choices[0].message.content
    b = chat(temperature=1.0, seed=1234, max_tokens=16).choices[0].message.content
    assert a == b, (a, b)
    others = {chat(temperature=1.0, seed=s, max_tokens=16).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds should not all agree"


def test_choices():
    r = chat(temperature=1.0, seed=1234, max_tokens=16, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2], r
    alone = [chat(temperature=1.0, seed=1234 + i, max_tokens=16).choices[0].message.content for i in range(3)]
    assert [c.message.content for c in r.choices] == alone, (r, alone)
    texts = ["", "", ""]
    for chunk in chat(temperature=1.0, seed=1234, max_tokens=16, n=3, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == alone, (texts, alone)


def test_stop(expected):
    words = expected.split()
    assert len(words) >= 2, expected
    stop = words[1]
    r = chat(stop=[stop])
    out = r.choices[0].message.content
    assert out == expected[: expected.index(stop)], (out, expected, stop)
    assert r.choices[0].finish_reason == "stop"


def test_errors():
    try:
        chat(model="no-such-model")
        raise AssertionError("expected an error")
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.code == "model_not_found", e.body
    try:
        chat(n=17)
        raise AssertionError("expected an error")
    except openai.BadRequestError as e:
        assert e.param == "n", e.body
    bad = openai.OpenAI(base_url=URL + "/v1", api_key="mk-wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("expected an error")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


def main():
    models = [m.id for m in client.models.list().data]
    assert MODEL in models, models
    expected = test_chat_non_streaming()
    test_chat_streaming(expected)
    test_completions_token_ids()
    test_logprobs()
    test_seeds()
    test_choices()
    test_stop(expected)
    test_errors()
    print("python openai client: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e!r}", file=sys.stderr)
        raise
