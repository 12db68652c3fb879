"""Hypothesis strategies for OpenAI Chat Completions requests that exercise the V4.1 format.

A generated request is a `Request`: the body as a Python tree that may hold `Raw` number
literals (`1.50`, `1e3`, `-0`, 30-digit integers) and `.text()` that serialises it as JSON text
with those literals verbatim, so serde number semantics are exercised end to end. Most
requests are valid; a minority carry one of the defects the official renderer rejects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

MODEL = "DeepSeek-V4.1-Flash"
SPECIAL_SPELLINGS = [
    "<｜Assistant｜>", "<｜User｜>", "<｜System｜>", "｜DSML｜", "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>", "<｜deepseek_image｜>", "<｜image｜>", "<think>", "</think>",
    "<｜latest_reminder｜>", "<tool_result>", "</tool_result>", '<｜DSML｜ invoke name="x">',
]  # fmt: skip
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


@dataclass(frozen=True)
class Raw:
    """A JSON number literal written exactly as given."""

    literal: str


@dataclass
class Request:
    body: dict[str, Any]

    def text(self) -> str:
        return _dump(self.body)

    def has_raw(self) -> bool:
        # json.dumps writes the marker's NUL as an escape, so look for the escaped form.
        return "\\u0000RAW" in json.dumps(self.body, default=lambda r: "\x00RAW")


def _dump(value: Any) -> str:
    if isinstance(value, Raw):
        return value.literal
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_dump(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_dump(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


# --- leaves -------------------------------------------------------------------------------

_chars = st.characters(codec="utf-8", exclude_categories=("Cs",))
plain_text = st.text(
    alphabet=st.one_of(st.sampled_from("ab \n\t\"'\\<>{}[]:,0123456789中文é😀\u2028\x7f\x01"), _chars),
    max_size=12,
)
texts = st.one_of(
    plain_text,
    st.sampled_from(["", " ", "\n\n", "json", "JSON please", "hello", *SPECIAL_SPELLINGS]),
    st.lists(st.one_of(plain_text, st.sampled_from(SPECIAL_SPELLINGS)), max_size=4).map("".join),
)
raw_numbers = st.sampled_from(
    ["1.50", "1e3", "1E20", "-0", "0.1e1", "1e-7", "100000000000000000000000000000",
     "18446744073709551615", "18446744073709551616", "-9223372036854775808",
     "-9223372036854775809", "3", "-12", "2.5e-3", "1e16", "123456789.125"]
).map(Raw)  # fmt: skip
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), raw_numbers,
    st.floats(allow_nan=False, allow_infinity=False), texts,
)  # fmt: skip
keys = st.one_of(st.sampled_from(["a", "b", "city", "é", "x y", "", "json"]), plain_text)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)


def image_urls() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just(f"data:image/png;base64,{PNG_1X1}"),
        st.sampled_from(
            ["https://example.com/a.png", "http://x", "data:image/jpeg;base64,AAAA",
             "data:image/webp;base64, AA AA ", "data:image/png;base64,AB=="]
        ),
        st.sampled_from(  # rejected by the official renderer
            ["ftp://x/a.png", "a.png", "data:image/png;base64,A", "data:image/bmp;base64,AAAA",
             "data:image/png,abc", "data:image/png;base64,AA=", " http://x"]
        ),
    )  # fmt: skip


def image_part() -> st.SearchStrategy[dict[str, Any]]:
    detail = st.sampled_from([None, "low", "high", "auto", "original"])
    return st.builds(
        lambda url, d: {"type": "image_url", "image_url": {"url": url} | ({"detail": d} if d else {})},
        image_urls(),
        detail,
    )


def content(images: bool = True) -> st.SearchStrategy[Any]:
    text_part = texts.map(lambda t: {"type": "text", "text": t})
    parts = st.one_of(text_part, image_part()) if images else text_part
    return st.one_of(texts, texts, st.lists(parts, max_size=4))


# --- tools --------------------------------------------------------------------------------


def schemas() -> st.SearchStrategy[Any]:
    prop = st.one_of(
        st.just({"type": "string"}),
        st.builds(lambda d: {"type": "number", "default": d}, raw_numbers),
        st.builds(lambda d: {"type": "string", "description": d}, texts),
        st.just({"type": "array", "items": {"type": "integer"}, "minItems": 1}),
        st.builds(lambda e: {"enum": e}, st.lists(json_scalars, min_size=1, max_size=3)),
        st.just({"type": "object", "properties": {"k": {"$ref": "#/$defs/d"}}}),
    )
    good = st.builds(
        lambda props, req, extra: (
            {"type": "object", "properties": props} | ({"required": req} if req else {}) | extra
        ),
        st.dictionaries(keys, prop, max_size=3),
        st.lists(st.sampled_from(["a", "city"]), max_size=2, unique=True),
        st.sampled_from([{}, {"$defs": {"d": {"type": "string"}}}, {"additionalProperties": False}]),
    )
    bad = st.sampled_from([{}, {"type": "string"}, {"type": "object", "minLength": -1}])
    return st.one_of(good, good, good, good, good, st.none(), st.none(), bad)


tool_names = st.sampled_from(["get_weather", "search", "f", "a-b_9"] * 4 + ["bad name", "é", "", "x" * 129])


def tools() -> st.SearchStrategy[list[dict[str, Any]]]:
    def tool(name: str, description: Any, parameters: Any) -> dict[str, Any]:
        function: dict[str, Any] = {"name": name}
        if description is not None:
            function["description"] = description
        if parameters is not None or name == "f":
            function["parameters"] = parameters
        return {"type": "function", "function": function}

    def with_strict(declared: list[dict[str, Any]], strict: Any) -> list[dict[str, Any]]:
        """`strict` on every tool (True/False/None), or "mixed": on the first tool only."""
        if strict != "absent":
            for i, t in enumerate(declared):
                t["function"]["strict"] = (i == 0) if strict == "mixed" else strict
        return declared

    declared = st.lists(
        st.builds(tool, tool_names, st.one_of(st.none(), texts), schemas()),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t["function"]["name"] if len(t["function"]["name"]) > 1 else None,
    )
    strict = st.sampled_from(["absent"] * 6 + [True, True, False, None, "mixed"])
    return st.builds(with_strict, declared, strict)


def arguments() -> st.SearchStrategy[str]:
    return st.one_of(
        st.dictionaries(keys, json_values, max_size=3).map(_dump),
        st.dictionaries(keys, json_values, max_size=3).map(lambda d: " " + _dump(d) + "\n"),
        st.sampled_from(["", "null", "[]", '"s"', "{bad", '{"a":1}{"b":2}', "NaN", "{}", '{"a":1,"a":2}']),
        texts,
    )


# --- conversations ------------------------------------------------------------------------


@st.composite
def tool_round(draw: st.DrawFn, n_ids: list[int]) -> list[dict[str, Any]]:
    """An assistant turn with calls followed by its results in a random order."""
    count = draw(st.integers(1, 3))
    ids = []
    for _ in range(count):
        n_ids[0] += 1
        ids.append(f"call_{n_ids[0]}")
    calls = [
        {
            "id": i,
            "type": "function",
            "function": {
                "name": draw(st.sampled_from(["get_weather", "search", "undeclared"])),
                "arguments": draw(arguments()),
            },
        }
        for i in ids
    ]
    assistant: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
    assistant["content"] = draw(st.one_of(st.none(), texts))
    if draw(st.booleans()):
        assistant["reasoning_content"] = draw(texts)
    results = [{"role": "tool", "tool_call_id": i, "content": draw(content())} for i in ids]
    results = draw(st.permutations(results))
    if draw(st.integers(0, 9)) == 0:  # a defect: a missing or duplicated result
        results = results[1:] if draw(st.booleans()) else results + results[:1]
    return [assistant, *results]


def _turn(draw: st.DrawFn, n_ids: list[int]) -> list[dict[str, Any]]:
    """One step of a conversation: a user, assistant, reminder or system message, or a tool round."""
    kind = draw(st.sampled_from(["user", "user", "assistant", "tools", "reminder", "system"]))
    if kind == "user":
        return [{"role": "user", "content": draw(content())}]
    if kind == "assistant":
        message: dict[str, Any] = {"role": "assistant"}
        message["content"] = draw(st.one_of(texts, content(images=False)))
        if draw(st.booleans()):
            message["reasoning_content"] = draw(st.one_of(st.none(), texts))
        return [message]
    if kind == "tools":
        out = draw(tool_round(n_ids))
        if draw(st.booleans()):
            out.append({"role": "user", "content": draw(texts)})
        return out
    if kind == "reminder":
        return [{"role": "latest_reminder", "content": draw(texts)} for _ in range(draw(st.integers(1, 2)))]
    return [{"role": "system", "content": draw(content())}]


def _prefix(draw: st.DrawFn) -> dict[str, Any]:
    prefix: dict[str, Any] = {"role": "assistant", "content": draw(texts), "prefix": True}
    if draw(st.booleans()):
        prefix["reasoning_content"] = draw(texts)
    return prefix


@st.composite
def messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        out.append({"role": "system", "content": draw(st.one_of(st.just(""), st.just([]), content()))})
    n_ids = [0]
    for _ in range(draw(st.integers(1, 4))):
        out.extend(_turn(draw, n_ids))
    if draw(st.integers(0, 5)) == 0:
        out.append(_prefix(draw))
    return out


@st.composite
def requests(draw: st.DrawFn) -> Request:
    body: dict[str, Any] = {"model": MODEL, "messages": draw(messages())}
    thinking = draw(st.sampled_from([None, "enabled", "disabled", "adaptive", None, "disabled"]))
    if thinking:
        body["thinking"] = {"type": thinking}
    effort = draw(st.one_of(st.none(), st.sampled_from(EFFORTS)))
    if effort is not None:
        body["reasoning_effort"] = {effort: None} if draw(st.integers(0, 4)) == 0 else effort
    declared = draw(st.one_of(st.none(), tools()))
    if declared is not None:
        body["tools"] = declared
    choice = draw(
        st.sampled_from(
            [None, "auto", "none", "required", "named:get_weather", "named:search", "named:missing"]
        )
    )
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice[6:]}} if choice.startswith("named:") else choice
        )
    fmt = draw(st.sampled_from([None, "text", "json_object", "json_schema", "regex"]))
    if fmt == "json_schema":
        spec = {"name": "r", "schema": draw(schemas())}
        if draw(st.integers(0, 3)) == 0:
            spec["strict"] = True
        body["response_format"] = {"type": fmt, "json_schema": spec}
    elif fmt == "regex":
        body["response_format"] = {"type": fmt, "regex": "[a-z]+"}
    elif fmt is not None:
        body["response_format"] = {"type": fmt}
    sampling = (
        {}
        if draw(st.integers(0, 3))
        else draw(
            st.dictionaries(
                st.sampled_from(
                    ["temperature", "top_p", "max_tokens", "n", "presence_penalty", "seed", "stop"]
                ),
                st.one_of(st.integers(-1, 3), st.floats(-0.5, 2.5), st.just(393217), st.just(["a"] * 17)),
                max_size=2,
            )
        )
    )
    body.update(sampling)
    if draw(st.integers(0, 30)) == 0:
        body["model"] = draw(st.sampled_from(["gpt-4o", "deepseek-v4.1-flash"]))
    return Request(body)


AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    for name in ("get_weather", "search")
]


@st.composite
def agent_settings(draw: st.DrawFn) -> dict[str, Any]:
    """What an agent sends besides its messages: valid, as a working client's requests are."""
    body: dict[str, Any] = {"model": MODEL}
    thinking = draw(st.sampled_from([None, "enabled", "disabled"]))
    if thinking:
        body["thinking"] = {"type": thinking}
    effort = draw(st.sampled_from([None, "low", "high", "max"]))
    if effort and thinking != "disabled":
        body["reasoning_effort"] = effort
    if draw(st.integers(0, 3)):
        body["tools"] = AGENT_TOOLS[: draw(st.integers(1, 2))]
        choice = draw(st.sampled_from([None, "auto", "none"]))
        if choice:
            body["tool_choice"] = choice
    if draw(st.integers(0, 5)) == 0:
        body["response_format"] = {"type": "text"}
    return body


@st.composite
def sessions(draw: st.DrawFn) -> list[Request]:
    """Requests of one client in order, as an agent sends them: mostly the previous request's
    messages plus new turns, sometimes with an earlier message edited, the settings changed,
    the last turns dropped (a retry), the same request again, or once a continued final turn. The
    settings are mostly an agent's (valid), sometimes any generated request's."""
    if draw(st.integers(0, 4)):
        body = draw(agent_settings())
    else:
        body = {key: value for key, value in draw(requests()).body.items() if key != "messages"}
    history = draw(messages())
    n_ids = [1000]
    bodies = [Request({**body, "messages": history})]
    for _ in range(draw(st.integers(1, 5))):
        step = draw(st.sampled_from(["extend"] * 6 + ["edit", "settings", "retry", "again", "continue"]))
        if step == "extend":
            history = history + [m for _ in range(draw(st.integers(1, 2))) for m in _turn(draw, n_ids)]
        elif step == "edit" and history:
            at = draw(st.integers(0, len(history) - 1))
            history = [*history[:at], {**history[at], "content": draw(texts)}, *history[at + 1 :]]
        elif step == "settings":
            body = draw(agent_settings())
        elif step == "retry" and len(history) > 1:
            history = history[: draw(st.integers(1, len(history) - 1))]
        elif step == "continue":  # this request only: continue_final_message is per request
            bodies.append(Request({**body, "messages": [*history, _prefix(draw)]}))
            continue
        bodies.append(Request({**body, "messages": history}))
    return bodies
