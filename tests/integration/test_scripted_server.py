"""The real SGLang server (`sglang-ds41 serve`) on the scripted model, through the `openai` client.

The scripted model emits fixed V4.1 token sequences, so these tests check what the server
does with real tokens: the deepseek-recipe prompt rendering, the `deepseek-v41` reasoning
parser, the `deepseekv41` DSML tool-call parser, streaming, and grammar-constrained JSON.
Expected values come from the script texts and from our independent prompt encoder.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.checkpoint.scripted import DEFAULT_SCRIPTS, JSON_TRIGGER, TOOL_TRIGGER

from .requests import WEATHER_TOOL

pytestmark = pytest.mark.integration

SCRIPT = {s.name: s for s in DEFAULT_SCRIPTS}
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(scripted_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.openai_url, api_key="unused", timeout=120, max_retries=0)


def chat(client, messages, **kwargs):
    return client.chat.completions.create(model="default", messages=messages, temperature=0, **kwargs)


def test_plain_chat_completion_returns_the_default_answer(client):
    reply = chat(client, [{"role": "user", "content": "Hello"}], extra_body=NO_THINKING)
    message = reply.choices[0].message
    assert message.content == SCRIPT["default"].content
    assert not message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


def test_thinking_is_on_by_default_and_the_reasoning_is_split_off(client):
    message = chat(client, [{"role": "user", "content": "Hello"}]).choices[0].message
    assert message.reasoning_content == SCRIPT["default"].reasoning
    assert message.content == SCRIPT["default"].content


def test_streaming_deltas_add_up_to_the_answer(client):
    chunks = list(chat(client, [{"role": "user", "content": "Hello"}], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert len(deltas) > 3
    assert "".join(d.content or "" for d in deltas) == SCRIPT["default"].content
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == SCRIPT["default"].reasoning


@pytest.mark.parametrize("thinking", [False, True])
def test_tools_return_parsed_tool_calls_from_dsml_tokens(client, thinking):
    reply = chat(
        client,
        [{"role": "user", "content": f"{TOOL_TRIGGER} What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        extra_body={"chat_template_kwargs": {"thinking": thinking}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
    assert not choice.message.content
    assert (choice.message.reasoning_content or None) == (SCRIPT["tool"].reasoning if thinking else None)


def test_streamed_tool_call_arguments_add_up(client):
    chunks = chat(
        client,
        [{"role": "user", "content": f"{TOOL_TRIGGER} weather?"}],
        tools=[WEATHER_TOOL],
        stream=True,
        extra_body=NO_THINKING,
    )
    names, arguments = [], ""
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
    assert names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris", "unit": "c"}


def test_repeated_request_still_sees_its_trigger_through_the_prefix_cache(client):
    messages = [{"role": "user", "content": f"{TOOL_TRIGGER} cached prefix test"}]
    for _ in range(2):  # the second prompt is a radix-cache hit up to its last token
        reply = chat(client, messages, tools=[WEATHER_TOOL], extra_body=NO_THINKING)
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather"


def test_json_schema_response_format_returns_valid_json(client):
    reply = chat(
        client,
        [{"role": "user", "content": f"{JSON_TRIGGER} Describe a person."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
        extra_body=NO_THINKING,
    )
    value = json.loads(reply.choices[0].message.content)
    jsonschema.validate(value, PERSON_SCHEMA)
    assert value == json.loads(SCRIPT["json"].content)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "reasoning_effort": "low"},
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL],
         "chat_template_kwargs": {"thinking": False}, "thinking": {"type": "disabled"}},
    ],
    ids=["default", "system-low-effort", "tools-no-thinking"],
)
def test_server_renders_the_prompt_like_our_encoder(client, body):
    """prompt_tokens equals the length of our own V4.1 encoding of the same request."""
    extra = {k: v for k, v in body.items() if k not in ("messages", "tools", "reasoning_effort")}
    kwargs = {k: body[k] for k in ("tools", "reasoning_effort") if k in body}
    reply = chat(client, body["messages"], max_tokens=1, extra_body=extra, **kwargs)
    ours = {k: v for k, v in body.items() if k != "chat_template_kwargs"}
    expected = encode_prompt(render_request({"model": "DeepSeek-V4.1-Flash", **ours}).prompt)
    assert reply.usage.prompt_tokens == len(expected)
