"""Structured output and forced tool calls in thinking mode, through the real server.

`sglang-ds41 serve` thinks by default (as DeepSeek's API). The plain `openai` client with no
extra body must then get: `parse()` with a pydantic model returning the object, `json_object`
and `json_schema` content that validates, `tool_choice` required and named returning the call,
all after the reasoning, with usage counting the reasoning tokens; and the same with thinking
off (`reasoning_effort="none"`, and DeepSeek's `thinking: {"type": "disabled"}`). The scripted
model writes the same answer whatever the grammar allows, so a grammar that constrained the
reasoning would mask it into garbage (or a length finish) and fail these tests.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.checkpoint import scripted

from .requests import WEATHER_TOOL

pytestmark = pytest.mark.integration

SCRIPT = {s.name: s for s in scripted.DEFAULT_SCRIPTS}
PERSON = json.loads(scripted.PERSON_JSON_TEXT)
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
JSON_ASK = [{"role": "user", "content": f"{scripted.JSON_TRIGGER} Describe a person as JSON."}]
TOOL_ASK = [{"role": "user", "content": f"{scripted.TOOL_TRIGGER} What is the weather in Paris?"}]
# Plain client keyword arguments only: the server default (thinking), and thinking off.
MODES = {"default": {}, "thinking-off": {"reasoning_effort": "none"}}


class Person(pydantic.BaseModel):
    name: str
    age: int
    ok: bool


@pytest.fixture(scope="module")
def client(scripted_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.openai_url, api_key="unused", timeout=300, max_retries=0)


def reasoning_ids(script: str) -> int:
    """The reasoning tokens of a script's answer: its reasoning and the closing `</think>`."""
    return len(scripted.script_ids(SCRIPT[script].reasoning)) + 1


def check_reasoning(mode: str, message, usage, script: str) -> None:
    reasoning = (message.model_extra or {}).get("reasoning_content")
    details = usage.completion_tokens_details
    if mode == "default":
        assert reasoning == SCRIPT[script].reasoning
        assert details.reasoning_tokens == reasoning_ids(script)
    else:
        assert reasoning is None
        assert details is None or not details.reasoning_tokens


@pytest.mark.parametrize("mode", sorted(MODES))
def test_parse_with_a_pydantic_model_returns_the_object(client, mode):
    completion = client.beta.chat.completions.parse(
        model="default", messages=JSON_ASK, response_format=Person, **MODES[mode]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.parsed == Person(**PERSON)
    check_reasoning(mode, choice.message, completion.usage, "json")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}}],
    ids=["json_object", "json_schema"],
)
def test_json_content_validates(client, mode, response_format):
    completion = client.chat.completions.create(
        model="default", messages=JSON_ASK, response_format=response_format, **MODES[mode]
    )
    message = completion.choices[0].message
    value = json.loads(message.content)
    jsonschema.validate(value, PERSON_SCHEMA)
    assert value == PERSON
    check_reasoning(mode, message, completion.usage, "json")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_forced_tool_choice_returns_the_call(client, mode, tool_choice):
    completion = client.chat.completions.create(
        model="default", messages=TOOL_ASK, tools=[WEATHER_TOOL], tool_choice=tool_choice, **MODES[mode]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
    assert not choice.message.content
    check_reasoning(mode, choice.message, completion.usage, "tool")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_streamed_json_schema_and_usage(client, mode):
    stream = client.chat.completions.create(
        model="default",
        messages=JSON_ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
        stream=True,
        stream_options={"include_usage": True},
        **MODES[mode],
    )
    content, reasoning, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
    assert json.loads("".join(content)) == PERSON
    details = usage.completion_tokens_details
    if mode == "default":
        assert "".join(reasoning) == SCRIPT["json"].reasoning
        assert details.reasoning_tokens == reasoning_ids("json")
    else:
        assert "".join(reasoning) == ""
        assert details is None or not details.reasoning_tokens


EXTRA = ("thinking", "reasoning_budget")  # not `create` arguments: sent in the extra body
HELLO = [{"role": "user", "content": "Hello"}]


def prompt_ids(client, body: dict) -> list[int]:
    """The prompt ids the server rendered for `body` (SGLang's return_prompt_token_ids)."""
    completion = client.chat.completions.create(
        model="default",
        max_tokens=1,
        extra_body={"return_prompt_token_ids": True, **{k: v for k, v in body.items() if k in EXTRA}},
        **{k: v for k, v in body.items() if k not in EXTRA},
    )
    return completion.choices[0].model_extra["prompt_token_ids"]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": HELLO},
        {"messages": HELLO, "reasoning_effort": "none"},
        {"messages": HELLO, "reasoning_effort": "low"},
        {"messages": HELLO, "reasoning_effort": "max"},
        {"messages": HELLO, "thinking": {"type": "disabled"}},
        {"messages": HELLO, "thinking": {"type": "disabled"}, "reasoning_effort": "high"},
        {"messages": HELLO, "thinking": {"type": "enabled"}, "reasoning_effort": "none"},
        {"messages": HELLO, "reasoning_budget": 30},
        {"messages": HELLO, "reasoning_budget": 30, "reasoning_effort": "low"},
        {"messages": JSON_ASK, "tools": [WEATHER_TOOL], "thinking": {"type": "disabled"}},
    ],
    ids=[
        "default", "effort-none", "effort-low", "effort-max", "thinking-disabled",
        "disabled-ignores-effort", "enabled-effort-none", "budget", "budget-over-effort", "tools-disabled",
    ],
)
def test_the_server_renders_thinking_as_deepseeks_api_does(client, body):
    """The prompt ids equal our encoder's for the same body (DeepSeek's `thinking` field,
    `reasoning_effort` and our `reasoning_budget`, thinking on when none is given)."""
    expected = encode_prompt(render_request({"model": "DeepSeek-V4.1-Flash", **body}))
    assert prompt_ids(client, body) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"thinking": {"type": "sometimes"}}, "thinking.type: unknown variant string 'sometimes'"),
        ({"reasoning_budget": 0}, "reasoning_budget must be an integer from 1 to 100"),
        ({"reasoning_budget": 30, "thinking": {"type": "disabled"}}, "reasoning_budget needs thinking mode"),
    ],
)
def test_bad_thinking_fields_are_a_400_that_says_why(client, extra, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="default", messages=HELLO, max_tokens=1, extra_body=extra)
