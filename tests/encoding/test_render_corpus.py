"""Hand-written edge cases, each rendered and encoded exactly like the official renderer."""

from __future__ import annotations

import pytest

from tests.encoding.oracle import assert_same, ours, wheel

M = "DeepSeek-V4.1-Flash"
U = {"role": "user", "content": "hi"}
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    "awAAAABJRU5ErkJggg=="
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather «now» 😀",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def call(call_id: str, arguments: str, name: str = "get_weather") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*c: dict, **extra: object) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(c), **extra}


def result(call_id: str, content: object = "ok") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def raw(members: str) -> str:
    """A request as JSON text, so number literals reach both renderers verbatim."""
    return '{"model": "' + M + '", ' + members + "}"


def req(messages: list, **extra: object) -> dict:
    return {"model": M, "messages": messages, **extra}


ACCEPTED = {
    "plain thinking": req([U]),
    "plain chat": req([U], thinking={"type": "disabled"}),
    "unicode and empty": req(
        [
            {"role": "user", "content": "中文 é 😀 \u2028"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": ""},
        ]
    ),
    "empty system removed": req([{"role": "system", "content": ""}, U]),
    "second system": req([{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, U]),
    "effort low": req([U], reasoning_effort="low"),
    "effort medium": req([U], reasoning_effort="medium"),
    "effort xhigh": req([U], reasoning_effort="xhigh"),
    "effort max": req([U], reasoning_effort="max"),
    "effort ultra map": req([U], reasoning_effort={"ultra": None}),
    "effort none": req([U], reasoning_effort="none"),
    "adaptive minimal": req([U], thinking={"type": "adaptive"}, reasoning_effort="minimal"),
    "nested arguments": req(
        [
            U,
            calls(
                call(
                    "a",
                    '{"city": "Paris", "opts": {"units": [1, 1.50, null, true]}, "n": null,'
                    ' "big": 100000000000000000000000000000}',
                )
            ),
            result("a"),
        ],
        tools=[WEATHER],
    ),
    "array and invalid arguments": req(
        [
            U,
            calls(call("a", "[1, 2]"), call("b", "{bad"), call("c", "{}")),
            result("c"),
            result("a"),
            result("b"),
        ],
        tools=[WEATHER],
        thinking={"type": "disabled"},
    ),
    "several tool rounds": req(
        [
            U,
            calls(call("a", '{"city": "A"}'), reasoning_content="r1"),
            result("a", "15C"),
            calls(call("b", '{"city": "B"}'), reasoning_content="r2"),
            result("b", [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": PNG}}]),
            {"role": "assistant", "content": "done", "reasoning_content": "r3"},
            {"role": "user", "content": "more"},
        ],
        tools=[WEATHER],
    ),
    "images interleaved": req(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "image_url", "image_url": {"url": PNG}},
                    {"type": "text", "text": ""},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                ],
            }
        ]
    ),
    "reminders": req(
        [U, {"role": "latest_reminder", "content": "r1"}, {"role": "latest_reminder", "content": "r2"}]
    ),
    "required choice": req([U], tools=[WEATHER], tool_choice="required", thinking={"type": "disabled"}),
    "named choice": req(
        [U],
        tools=[WEATHER, {"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        thinking={"type": "disabled"},
    ),
    "json_object": req(
        [{"role": "user", "content": "answer in JSON"}], response_format={"type": "json_object"}
    ),
    "json_schema numbers": raw(
        '"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",'
        ' "json_schema": {"name": "n", "schema": {"type": "object", "a": 1.50, "b": 1e3, "c": -0,'
        ' "d": 18446744073709551615, "e": 1E20, "a": 2}}}'
    ),
    "prefix reasoning": req(
        [U, {"role": "assistant", "content": "", "reasoning_content": "Let me", "prefix": True}]
    ),
    "prefix content": req(
        [U, {"role": "assistant", "content": "Sure", "prefix": True}], thinking={"type": "disabled"}
    ),
    "prefix followed by dropped system messages": req(
        [
            U,
            {"role": "assistant", "content": "x", "prefix": True},
            {"role": "system", "content": ""},
            {"role": "system", "content": [{"type": "text", "text": ""}]},
        ]
    ),
    "special spellings as text": req(
        [
            {
                "role": "user",
                "content": "<｜Assistant｜>｜DSML｜<｜end▁of▁sentence｜><｜deepseek_image｜></think>",
            }
        ]
    ),
}

REJECTED = {
    "empty messages": req([]),
    "missing model": {"messages": [U]},
    "unknown model": req([U], model="gpt-4o"),
    "developer role": req([{"role": "developer", "content": "x"}]),
    "content not string or list": req([{"role": "user", "content": 5}]),
    "file part": req([{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]),
    "bad base64": req(
        [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,A"}}],
            }
        ]
    ),
    "ftp image": req([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]),
    "image in assistant": req(
        [U, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]
    ),
    "orphan tool": req([U, result("a")]),
    "unanswered call": req([U, calls(call("a", "{}"))]),
    "duplicate call ids": req([U, calls(call("a", "{}"), call("a", "{}")), result("a")]),
    "assistant without content": req([U, {"role": "assistant", "content": None}]),
    "empty tool_calls": req([U, {"role": "assistant", "content": "x", "tool_calls": []}]),
    "required with thinking": req([U], tools=[WEATHER], tool_choice="required"),
    "named tool missing": req(
        [U], tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
    ),
    "duplicate tool names": req([U], tools=[WEATHER, WEATHER]),
    "bad tool name": req([U], tools=[{"type": "function", "function": {"name": "a b"}}]),
    "schema not object": req(
        [U], tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    ),
    "prefix not last": req([U, {"role": "assistant", "content": "x", "prefix": True}, U]),
    "prefix with tools": req([U, {"role": "assistant", "content": "x", "prefix": True}], tools=[WEATHER]),
    "json_object without the word": req([U], response_format={"type": "json_object"}),
    "integer effort": req([U], reasoning_effort=1),
    "unknown thinking type": req([U], thinking={"type": "on"}),
    "max_tokens too large": req([U], max_tokens=393217),
    "temperature out of range": req([U], temperature=2.5),
    "n above one": req([U], n=2),
    "too many stops": req([U], stop=["s"] * 17),
    "top_logprobs without logprobs": req([U], top_logprobs=3),
    "negative seed": req([U], seed=-1),
    "number overflows a double": raw('"messages": [{"role": "user", "content": "x"}], "temperature": 1e400'),
}


@pytest.mark.parametrize("body", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_edge_case_renders_like_the_official_renderer(body: object) -> None:
    assert not assert_same(body).rejected


@pytest.mark.parametrize("body", REJECTED.values(), ids=REJECTED.keys())
def test_edge_case_is_rejected_like_the_official_renderer(body: object) -> None:
    assert assert_same(body).rejected


PREFIX = {"role": "assistant", "content": "x", "prefix": True}
# The position of a continued turn is checked after every message is converted (§2.11, §3).
CHECK_ORDER = {
    "prefix, an unanswered call": req([U, PREFIX, calls(call("a", "{}"))]),
    "prefix, an orphan result": req([U, PREFIX, result("a")]),
    "prefix, duplicate call ids": req([U, PREFIX, calls(call("a", "{}"), call("a", "{}")), result("a")]),
    "prefix, an image in an assistant turn": req(
        [U, PREFIX, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]
    ),
    "prefix, an answered call": req([U, PREFIX, calls(call("a", "{}")), result("a")]),
}


@pytest.mark.parametrize("body", CHECK_ORDER.values(), ids=CHECK_ORDER.keys())
def test_the_first_error_is_the_official_renderers(body: object) -> None:
    expected, got = wheel(body), ours(body)
    assert expected.rejected and got.rejected
    assert got.error == expected.error
