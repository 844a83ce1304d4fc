"""Structured output and tool calls through the official `openai` client (run by
server/tests/it/real_model.rs against memra-server on SmolLM2-135M, CPU).

Env: MEMRA_TEST_URL (http://host:port), MEMRA_TEST_KEY (an API key), MEMRA_TEST_ALIAS (model).
Exits non-zero on the first failed check.
"""
import json
import os
import sys

import jsonschema
import openai

URL = os.environ["MEMRA_TEST_URL"]
KEY = os.environ["MEMRA_TEST_KEY"]
MODEL = os.environ["MEMRA_TEST_ALIAS"]
client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=300)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["engineer", "artist", "doctor"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "home": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "integer"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "role", "skills", "home"],
}

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def chat(messages, **kw):
    args = dict(model=MODEL, messages=messages, max_tokens=120, temperature=0)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_json_schema():
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    prompts = ["Describe a person.", "Invent a character for a story.", "Who is your favourite scientist?"]
    for i, p in enumerate(prompts):
        kw = {} if i < 2 else {"temperature": 0.9, "seed": 7}
        r = chat([{"role": "user", "content": p}], response_format=fmt, **kw)
        c = r.choices[0]
        assert c.finish_reason == "stop", (p, c)
        v = json.loads(c.message.content)
        jsonschema.validate(v, PERSON)
        assert set(v) <= set(PERSON["properties"]), v  # strict: no extra keys
    # Text completions take response_format too.
    r = client.completions.create(model=MODEL, prompt="A person, as JSON:", max_tokens=120, temperature=0,
                                  extra_body={"response_format": fmt})
    assert r.choices[0].finish_reason == "stop", r
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


def test_json_object():
    for p in ["Reply with a JSON object with one key, answer, holding one word.",
              "Give a JSON object describing a cat with two short fields."]:
        r = chat([{"role": "user", "content": p}], response_format={"type": "json_object"}, max_tokens=60)
        c = r.choices[0]
        text = c.message.content
        assert text.startswith("{"), text
        if c.finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text


def check_call(call, name=None):
    assert call.type == "function"
    assert call.id.startswith("call_"), call.id
    assert call.function.name in SCHEMAS, call
    if name:
        assert call.function.name == name, call
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tools_required_and_named():
    r = chat(ASK, tools=TOOLS, tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.tool_calls, c.message
    for call in c.message.tool_calls:
        check_call(call)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = chat(ASK, tools=TOOLS, tool_choice=named)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert len(c.message.tool_calls) == 1
    check_call(c.message.tool_calls[0], "get_time")
    return r.choices[0].message.tool_calls[0]


def test_streamed_tool_call(expected):
    named = {"type": "function", "function": {"name": "get_time"}}
    stream = chat(ASK, tools=TOOLS, tool_choice=named, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                cur = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                cur["id"] = d.id or cur["id"]
                if d.function:
                    cur["name"] += d.function.name or ""
                    cur["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls", finish
    assert list(calls) == [0], calls
    got = calls[0]
    assert got["id"].startswith("call_"), got
    assert (got["name"], got["arguments"]) == (expected.function.name, expected.function.arguments), (got, expected)


def test_tool_round_trip(call):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "12:30, sunny, 21 degrees celsius"},
    ]
    r = chat(messages, tools=TOOLS, max_tokens=24)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls"), c
    assert c.message.content or c.message.tool_calls, c.message
    r = chat(messages, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls, r


def expect_400(param, messages=ASK, **kw):
    try:
        chat(messages, max_tokens=4, **kw)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == param, (param, e.body)
        return
    raise AssertionError(f"expected a 400 naming {param}")


def test_errors():
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    expect_400("response_format", response_format=bad)
    expect_400("response_format", response_format={"type": "yaml"})
    expect_400("logit_bias", logit_bias={"50": 10})
    expect_400("tool_choice", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    expect_400("tool_choice", tool_choice="required")
    expect_400("messages[1].tool_call_id", messages=ASK + [{"role": "tool", "content": "x"}])


def main():
    test_errors()
    test_json_schema()
    test_json_object()
    call = test_tools_required_and_named()
    test_streamed_tool_call(call)
    test_tool_round_trip(call)
    print("python structured output and tools: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e!r}", file=sys.stderr)
        raise
