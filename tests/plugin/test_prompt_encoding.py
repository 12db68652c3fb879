"""The incremental V4.1 prompt encoding hook (plugin/serving/prompt_encoding.py) gives every request the
ids, images and errors of upstream SGLang's own deepseek-recipe adapter."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_ds41.errors import Ds41Error
from sglang_ds41.plugin.serving import prompt_encoding
from tests.encoding.strategies import Request, requests, sessions

EFFORTS = [None, None, None, "low", "max", 0.3, 42, 100, "none"]
TASKS = [None] * 12 + ["action", "query", "domain"]
MODEL = "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def adapters():
    """(ours, upstream's): the same adapter twice, the first served by the hook."""
    from sglang.srt.plugins import load_plugins

    from sglang_ds41.assets import v41_hf_tokenizer
    from sglang_ds41.serve.chat_adapter import recipe_chat_adapter

    load_plugins()
    tokenizer = v41_hf_tokenizer()
    ours, upstream = recipe_chat_adapter(tokenizer), recipe_chat_adapter(tokenizer)
    assert prompt_encoding.encoder_of(ours.deepseek_recipe) is not None
    prompt_encoding._ENCODERS[upstream.deepseek_recipe] = None  # upstream's own encode
    return ours, upstream


def served(adapter, request, thinking: bool) -> tuple[Any, ...]:
    """What `encode_messages` gives for `request` as the chat handler calls it: (ids, image
    URLs), or the error."""
    tools = None
    if request.tools and request.tool_choice != "none":
        tools = [tool.model_dump() for tool in request.tools]
        if not isinstance(request.tool_choice, str):
            wanted = request.tool_choice.function.name
            tools = [tool for tool in tools if tool["function"]["name"] == wanted] or None
    image_data: list = []
    try:
        ids = adapter.encode_messages(
            messages=[], request=request, tools=tools, thinking=thinking, image_data=image_data
        )
    except Exception as error:  # the wheel's refusals (ValueError) and its other failures alike
        return ("error", type(error).__name__, str(error))
    return (ids, [image.url for image in image_data])


def sglang_request(request: Request, extra: dict[str, Any]):
    """`request` as SGLang's request model reads it off the wire (None: a 400 before encoding)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    effort = extra.pop("effort")
    wire = {**json.loads(request.text()), **extra}
    try:
        parsed = ChatCompletionRequest.model_validate_json(json.dumps(wire))
    except ValueError:
        return None
    if effort is not None:
        parsed.reasoning_effort = effort  # as the thinking hook sets a numeric effort
    return parsed


extras = st.fixed_dictionaries(
    {
        "effort": st.sampled_from(EFFORTS),
        "task": st.sampled_from(TASKS),
        "continue_final_message": st.booleans(),
    }
)


def check(adapters, session: list[Request], extra: dict[str, Any], thinking: bool) -> None:
    """Each request of the session served alike by both adapters."""
    ours, upstream = adapters
    for request in session:
        parsed = sglang_request(request, dict(extra))
        if parsed is not None:
            assert served(ours, parsed, thinking) == served(upstream, parsed, thinking)


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions(), extras, st.booleans())
def test_generated_sessions_are_served_as_upstream_serves_them(adapters, session, extra, thinking):
    check(adapters, session, extra, thinking)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions(), extras, st.booleans())
def test_many_generated_sessions_are_served_as_upstream_serves_them(adapters, session, extra, thinking):
    check(adapters, session, extra, thinking)


def test_an_agent_loop_reuses_its_history_and_keeps_upstreams_ids(adapters, monkeypatch):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    ours, upstream = adapters
    encoder = prompt_encoding.encoder_of(ours.deepseek_recipe)
    reused = []
    encode = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda body: reused.append((got := encode(body)).reused) or got)
    tool = {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}
    messages: list[dict] = [{"role": "user", "content": "Count the files."}]
    for n in range(5):
        arguments = {"cmd": f"ls {n}"}  # an object, as SDKs send them: serialized as upstream does
        call = {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": arguments}}
        messages += [
            {"role": "assistant", "content": None, "reasoning_content": "Run it.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} files"},
        ]
        request = ChatCompletionRequest(model="default", messages=messages, tools=[tool])
        assert served(ours, request, True) == served(upstream, request, True)
    assert reused[0] == 0 and all(n > 0 for n in reused[1:]), reused


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests(), st.booleans(), st.booleans(), st.sampled_from([None, 40]), st.data())
def test_recipe_request_is_upstreams_pre_normalize(request, thinking, continue_final, budget, data):
    """Our rewrite of the body for the wheel equals upstream's, also for developer messages
    and object arguments, and leaves the body as it was."""
    from sglang.srt.parser.deepseek_recipe_renderer import BUDGET_TIER, pre_normalize

    wire = json.loads(request.text())
    body = {key: value for key, value in wire.items() if key in ("tools", "tool_choice", "response_format")}
    messages = wire["messages"]
    for message in messages:
        if message["role"] == "system" and data.draw(st.booleans()):
            message["role"] = "developer"
        for call in message.get("tool_calls") or []:
            if data.draw(st.booleans()):
                call["function"]["arguments"] = {"raw": call["function"]["arguments"], "n": [1, 2.5, None]}
    body |= {"messages": messages, "thinking": thinking, "continue_final_message": continue_final}
    before = json.dumps(body)
    expected = pre_normalize(body) | {"model": MODEL}
    if budget is not None:
        expected["reasoning_effort"] = BUDGET_TIER
    assert prompt_encoding.recipe_request(body, MODEL, budget) == expected
    assert json.dumps(body) == before


def test_the_switch_and_the_cache_size():
    assert prompt_encoding.switched_on({})
    assert prompt_encoding.switched_on({prompt_encoding.SWITCH_ENV: "1"})
    assert not prompt_encoding.switched_on({prompt_encoding.SWITCH_ENV: "0"})
    assert not prompt_encoding.switched_on({prompt_encoding.SWITCH_ENV: "off"})
    assert prompt_encoding.cache_bytes({prompt_encoding.CACHE_ENV: "64"}) == 64 << 20
    assert prompt_encoding.cache_bytes({prompt_encoding.CACHE_ENV: "0"}) == 0
    assert prompt_encoding.cache_bytes({}) == 512 << 20
    for bad in ("lots", "nan", "inf", "-1"):
        with pytest.raises(Ds41Error) as error:
            prompt_encoding.cache_bytes({prompt_encoding.CACHE_ENV: bad})
        assert str(error.value).startswith(f"SGLANG_DS41_PROMPT_CACHE_MIB={bad!r}: expected a number of MiB")
    with pytest.raises(Ds41Error) as error:
        prompt_encoding.switched_on({prompt_encoding.SWITCH_ENV: "2"})
    assert str(error.value) == "SGLANG_DS41_INCREMENTAL_ENCODING='2': expected 1 (on) or 0 (off)"


def test_a_tokenizer_without_the_v41_ids_is_left_to_upstream():
    from sglang_ds41.assets import v41_tokenizer

    assert prompt_encoding.unlike_v41(v41_tokenizer()) == []
    shifted = SimpleNamespace(token_to_id=lambda spelling: 7)
    assert "<｜User｜> is 7, not 128803" in prompt_encoding.unlike_v41(shifted)
