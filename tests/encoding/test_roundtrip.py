"""Rendered assistant tool calls parse back to the same calls (names, JSON arguments).

Both renderers are exercised: the official one and ours (`sglang_ds41.encoding`).

The assistant turn is cut out of a rendered conversation whose assistant message carries the
calls. Text mode cannot tell a typed `</｜DSML｜` from a real one, so its strings avoid it;
token mode uses the official prompt encoding, where typed spellings are plain text, and so
takes any string.
"""

from __future__ import annotations

import json
from functools import cache

import deepseek_recipe as dr
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_ds41.encoding import encode_prompt, render_request
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parse import parse_ids, parse_text
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.assets import TOKENIZER_JSON

OPTIONS = ParsingOptions(thinking=True, parse_tool_calls=True)
NASTY = ["</｜DSML｜ parameter>", "｜DSML｜", "</think>", '"', "\n", "<｜end▁of▁sentence｜>", "猫", " "]

keys = st.text(alphabet="abcdefghij_XYZ0123456789-", min_size=1, max_size=8)
names = st.text(alphabet="abcdefghij_.-0123456789", min_size=1, max_size=12)


def strings(nasty: bool) -> st.SearchStrategy[str]:
    base = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
    if not nasty:
        return base.filter(lambda s: "</｜DSML｜" not in s)
    return st.lists(base | st.sampled_from(NASTY), max_size=4).map("".join)


def json_values(nasty: bool):
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(10**12), 10**12)
        | st.floats(allow_nan=False, allow_infinity=False, width=64)
        | strings(nasty)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=6,
    )


def calls(nasty: bool):
    arguments = st.dictionaries(keys, json_values(nasty), max_size=4)
    return st.lists(st.tuples(names, arguments), min_size=1, max_size=3)


def body(tool_calls) -> dict:
    history = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for i, (name, arguments) in enumerate(tool_calls)
    ]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in range(len(tool_calls))]
    return {
        "model": "DeepSeek-V4.1-Flash",
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": history},
            *results,
        ],
    }


@cache
def _encoding():
    return dr.DeepseekV41Encoding().with_special_tokens(dr.SpecialTokens(image="<｜deepseek_image｜>"))


@cache
def _id_encoding():
    return _encoding().with_tokenizer(dr.Tokenizer.from_file(str(TOKENIZER_JSON)))


RENDERERS = ["official", "ours"]


def rendered_turn_text(tool_calls, renderer: str = "official") -> str:
    if renderer == "ours":
        prompt = render_request(body(tool_calls)).prompt.text
    else:
        conversation = dr.ChatCompletionRequest(body(tool_calls)).convert(dr.ConversionOptions()).conversation
        prompt = _encoding().render_conversation(conversation).prompt
    start = prompt.index(Special.ASSISTANT.value) + len(Special.ASSISTANT.value)
    return prompt[start : prompt.index(Special.EOS.value, start)]


def rendered_turn_ids(tool_calls, renderer: str = "official") -> list[int]:
    if renderer == "ours":
        ids = encode_prompt(render_request(body(tool_calls)))
    else:
        conversation = dr.ChatCompletionRequest(body(tool_calls)).convert(dr.ConversionOptions()).conversation
        ids = _id_encoding().encode(conversation)
    start = ids.index(Special.ASSISTANT.id) + 1
    return ids[start : ids.index(Special.EOS.id, start)]


def assert_same_calls(message, tool_calls) -> None:
    assert message.valid, (message.problems, [c.problems for c in message.tool_calls])
    assert message.finish_reason == "tool_calls"
    assert [c.name for c in message.tool_calls] == [name for name, _ in tool_calls]
    for parsed, (_, arguments) in zip(message.tool_calls, tool_calls, strict=True):
        assert json.loads(parsed.arguments) == arguments


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_rendered_example_round_trips(renderer):
    tool_calls = [
        ("get_weather", {"city": "Paris", "days": 3, "opts": {"unit": "C", "x": [1, 2.5, None]}}),
        ("noop", {}),
    ]
    assert rendered_turn_text(tool_calls, renderer).startswith("</think>\n\n<｜DSML｜ calls>\n")
    assert_same_calls(parse_text(rendered_turn_text(tool_calls, renderer), OPTIONS), tool_calls)
    assert_same_calls(parse_ids(rendered_turn_ids(tool_calls, renderer), OPTIONS), tool_calls)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("renderer", RENDERERS)
@given(calls(nasty=False))
def test_random_calls_round_trip_in_text_mode(renderer, tool_calls):
    assert_same_calls(parse_text(rendered_turn_text(tool_calls, renderer), OPTIONS), tool_calls)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("renderer", RENDERERS)
@given(calls(nasty=True))
def test_random_calls_round_trip_in_token_mode(renderer, tool_calls):
    assert_same_calls(parse_ids(rendered_turn_ids(tool_calls, renderer), OPTIONS), tool_calls)
