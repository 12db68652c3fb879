"""The Responses API through the real server (`sglang-ds41 serve`, scripted model), plain `openai` client.

The same parse as chat completions serves `/v1/responses` (plugin/serving/responses.py): the client must
get exactly the calls rendered as `completed` `function_call` items, and every malformed call
(broken `string="false"` JSON, an unknown attribute, a call cut by `max_output_tokens`) as an
`incomplete` one with its arguments as written; streamed equals one-shot. The server thinks by
default, so the reasoning must come as a reasoning item (not inside the message text), and
`reasoning.effort="none"` turns it off. Negative control: before the plugin served this API the
broken calls came as `completed` items and the reasoning as message text.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from sglang_ds41.checkpoint import scripted
from tests.plugin.test_served_output import rendered_value, same

pytestmark = pytest.mark.integration

SCRIPT = {s.name: s for s in scripted.DEFAULT_SCRIPTS}
TOOLS = [
    {"type": "function", "name": name, "description": "test", "parameters": {"type": "object"}}
    for name in ("echo", "write_file", "get_weather")
]


@pytest.fixture(scope="module")
def client(scripted_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.openai_url, api_key="unused", timeout=300, max_retries=0)


def items(client, trigger: str, *, stream: bool, **kwargs) -> list[dict[str, Any]]:
    """The response's output items (type, and what matters of each), streamed or not."""
    request = dict(model="DeepSeek-V4.1-Flash", input=f"{trigger} go", tools=TOOLS, **kwargs)
    if stream:
        final = None
        for event in client.responses.create(**request, stream=True):
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        assert final is not None
        output = final.output
    else:
        output = client.responses.create(**request).output
    out = []
    for item in output:
        if item.type == "function_call":
            call = {"name": item.name, "arguments": item.arguments, "status": item.status}
            out.append({"type": "call", **call})
        elif item.type == "message":
            out.append({"type": "message", "text": "".join(part.text for part in item.content)})
        elif item.type == "reasoning":
            out.append({"type": "reasoning", "text": "".join(part.text for part in item.content or [])})
    return out


@pytest.fixture(scope="module")
def asked(client):
    cache: dict[tuple, list[dict[str, Any]]] = {}

    def get(trigger: str, stream: bool, **kwargs) -> list[dict[str, Any]]:
        key = (trigger, stream, json.dumps(kwargs, sort_keys=True))
        if key not in cache:
            cache[key] = items(client, trigger, stream=stream, **kwargs)
        return cache[key]

    return get


def calls(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in output if item["type"] == "call"]


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize("name", ["args-strings", "args-values"])
def test_the_client_receives_exactly_the_calls_rendered_as_completed_items(asked, name, stream):
    script = SCRIPT[name]
    output = asked(script.trigger, stream)
    got = calls(output)
    assert [c["status"] for c in got] == ["completed"] * len(script.content.calls)
    assert [c["name"] for c in got] == [n for n, _ in script.content.calls]
    for (_, arguments), call in zip(script.content.calls, got, strict=True):
        assert same(json.loads(call["arguments"]), rendered_value(arguments)), (arguments, call["arguments"])
    assert output[0] == {"type": "reasoning", "text": script.reasoning}


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_malformed_calls_come_as_incomplete_items(asked, stream):
    got = calls(asked(scripted.BROKEN_CALLS_TRIGGER, stream))
    assert got == [
        {"type": "call", "name": "echo", "arguments": '{"value": "fine"}', "status": "completed"},
        {"type": "call", "name": "echo", "arguments": '{"value": {not json}', "status": "incomplete"},
        {"type": "call", "name": "echo", "arguments": '{"value": "attr"}', "status": "incomplete"},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_a_call_cut_by_max_output_tokens_is_incomplete_and_the_text_stays_clean(asked, stream):
    script = SCRIPT["args-long"]
    output = asked(script.trigger, stream, max_output_tokens=60)
    [call] = calls(output)
    assert call["name"] == "write_file" and call["status"] == "incomplete"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["arguments"])
    messages = [item["text"] for item in output if item["type"] == "message"]
    assert messages == [script.content.text]
    assert not any("DSML" in text for text in messages)


@pytest.mark.parametrize("name", ["args-strings", "broken-calls"])
def test_streamed_output_equals_the_one_shot_output(asked, name):
    trigger = SCRIPT[name].trigger
    assert asked(trigger, True) == asked(trigger, False)


def test_reasoning_follows_the_effort_and_never_lands_in_the_message(asked):
    script = SCRIPT["tool"]
    on = asked(script.trigger, False)
    assert on[0] == {"type": "reasoning", "text": script.reasoning}
    assert not [item for item in on if item["type"] == "message" and script.reasoning in item["text"]]
    off = asked(script.trigger, False, reasoning={"effort": "none"})
    assert [item["type"] for item in off] == ["call"]
    assert calls(off) == calls(on)
