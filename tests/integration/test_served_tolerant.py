"""Call spellings models write besides V4.1's, through the real server (scripted model, plain
`openai` client): each arrives in `tool_calls` as the call it means, with the repair named in
the call's `repairs` (docs/ENCODING.md §4.5); what stays ambiguous arrives in
`invalid_tool_calls`; no DSML reaches `content`; streamed equals one-shot.
"""

from __future__ import annotations

import json

import pytest
from sglang_ds41.encoding import stream as parser
from sglang_ds41.encoding import wrapped_arguments

from sglang_ds41.checkpoint import scripted

from .requests import WEATHER_TOOL
from .test_served_tool_calls import ask, assert_no_dsml, client, without_ids  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

SCRIPT = {s.name: s for s in (*scripted.TOLERATED_SCRIPTS, *scripted.AMBIGUOUS_SCRIPTS)}
WEATHER_CALL = ("get_weather", {"city": "Paris", "unit": "c"})
REPAIRS = {
    "v4-name-v41-spacing": [parser.REPAIR_TOOL_CALLS],
    "ascii-dsml": [parser.REPAIR_ASCII],
    "doubled-dsml": [parser.REPAIR_DOUBLED],
    "bare-invoke": [parser.REPAIR_BARE_INVOKE],
    "untyped-parameters": [parser.repair_untyped("city", False), parser.repair_untyped("unit", False)],
    "calls-in-reasoning": [parser.REPAIR_IN_REASONING],
    "wrapped-arguments": [wrapped_arguments.repair("arguments")],
}


@pytest.fixture(scope="module")
def answers(client):  # noqa: F811 (the imported fixture)
    cache: dict = {}

    def get(name: str, stream: bool):
        if (name, stream) not in cache:
            cache[name, stream] = ask(client, SCRIPT[name].trigger, stream=stream, tools=[WEATHER_TOOL])
        return cache[name, stream]

    return get


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize("name", sorted(REPAIRS))
def test_a_tolerated_spelling_arrives_as_the_call_with_its_repair(answers, name, stream):
    message = answers(name, stream)
    [call] = message["tool_calls"]
    assert (call["name"], json.loads(call["arguments"])) == WEATHER_CALL
    assert call["repairs"] == REPAIRS[name]
    assert message["invalid"] == [] and message["finish_reason"] == "tool_calls"
    assert (message["content"] or "") == ""
    assert_no_dsml(message)


def test_a_call_opened_in_the_reasoning_cuts_the_reasoning_there(answers):
    assert answers("calls-in-reasoning", False)["reasoning"] == "I call it now."


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("mixed-dsml", "tool-call block not closed"),
        ("wrapped-misfit", wrapped_arguments.problem("arguments")),
    ],
)
def test_an_ambiguous_one_arrives_in_invalid_tool_calls(answers, name, error, stream):
    message = answers(name, stream)
    assert message["tool_calls"] == []
    [call] = message["invalid"]
    assert call["function"]["name"] == "get_weather" and error in call["error"]
    assert message["finish_reason"] == "stop"
    assert_no_dsml(message)


@pytest.mark.parametrize("name", sorted(SCRIPT))
def test_streamed_equals_one_shot(answers, name):
    assert without_ids(answers(name, True)) == without_ids(answers(name, False))
