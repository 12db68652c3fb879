"""The thinking token budget through a real server with the plain `openai` client.

The scripted model reasons for `LONG_REASONING` (97 tokens) before its answer (text, a JSON
person, or a weather call) in the `ponder-*` scripts, and writes whatever the grammar lets
through, so a budget that did not force `</think>` would leave the reasoning whole, and one
that forced it without the answer's grammar following would break the JSON or the call. The
expected reasoning is the script's own ids cut at the budget, decoded by the tokenizer.
"""

from __future__ import annotations

import json

import openai
import pytest

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.checkpoint import scripted

from .requests import WEATHER_TOOL
from .test_structured_thinking import PERSON, PERSON_SCHEMA

pytestmark = pytest.mark.integration

REASONING_IDS = scripted.script_ids(scripted.LONG_REASONING)
TEXT_ANSWER = scripted.PONDER_SCRIPTS[0].content
ASK = {
    "text": [{"role": "user", "content": f"{scripted.PONDER_TEXT_TRIGGER} Think, then greet me."}],
    "json": [{"role": "user", "content": f"{scripted.PONDER_JSON_TRIGGER} A person as JSON."}],
    "tool": [{"role": "user", "content": f"{scripted.PONDER_TOOL_TRIGGER} Weather in Paris?"}],
}
SERVER_DEFAULT = 64  # conftest.scripted_budget_server


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def client(scripted_server) -> openai.OpenAI:
    return client_of(scripted_server)


def cut_reasoning(budget: int) -> str:
    """The script's reasoning as a budget leaves it: `budget` - 1 ids, then the forced `</think>`."""
    return v41_tokenizer().decode(REASONING_IDS[: budget - 1])


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def check_cut(completion, budget: int) -> None:
    message = completion.choices[0].message
    assert (reasoning_of(message) or "") == cut_reasoning(budget)
    assert completion.usage.completion_tokens_details.reasoning_tokens == budget


@pytest.mark.parametrize("budget", [1, 8, 30])
def test_the_reasoning_ends_at_the_budget_and_the_answer_follows(client, budget):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"], extra_body={"thinking_token_budget": budget}
    )
    check_cut(completion, budget)
    assert completion.choices[0].message.content == TEXT_ANSWER
    assert completion.choices[0].finish_reason == "stop"


def test_a_budget_in_chat_template_kwargs_counts_the_same(client):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"],
        extra_body={"chat_template_kwargs": {"thinking_token_budget": 8}},
    )  # fmt: skip
    check_cut(completion, 8)


def test_a_budget_beyond_the_reasoning_changes_nothing(client):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"], extra_body={"thinking_token_budget": 500}
    )
    assert reasoning_of(completion.choices[0].message) == scripted.LONG_REASONING
    assert completion.usage.completion_tokens_details.reasoning_tokens == len(REASONING_IDS) + 1
    assert completion.choices[0].message.content == TEXT_ANSWER


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}}],
    ids=["json_object", "json_schema"],
)
def test_a_json_answer_still_arrives_after_the_cut(client, response_format):
    completion = client.chat.completions.create(
        model="default", messages=ASK["json"], response_format=response_format,
        extra_body={"thinking_token_budget": 8},
    )  # fmt: skip
    check_cut(completion, 8)
    assert json.loads(completion.choices[0].message.content) == PERSON


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_tool_call_still_arrives_after_the_cut(client, tool_choice):
    completion = client.chat.completions.create(
        model="default", messages=ASK["tool"], tools=[WEATHER_TOOL], tool_choice=tool_choice,
        extra_body={"thinking_token_budget": 8},
    )  # fmt: skip
    check_cut(completion, 8)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}


@pytest.mark.parametrize("ask", ["text", "tool"])
def test_streaming_equals_non_streaming(client, ask):
    kwargs = {"model": "default", "messages": ASK[ask], "extra_body": {"thinking_token_budget": 8}}
    if ask == "tool":
        kwargs["tools"] = [WEATHER_TOOL]
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    reasoning, content, calls, usage, finish = [], [], [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning.append(reasoning_of(choice.delta) or "")
            content.append(choice.delta.content or "")
            calls += [(c.function.name, c.function.arguments) for c in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    message = whole.choices[0].message
    assert "".join(reasoning) == reasoning_of(message) == cut_reasoning(8)
    assert "".join(content) == (message.content or "")
    assert calls == [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert finish == whole.choices[0].finish_reason
    reasoning_tokens = whole.usage.completion_tokens_details.reasoning_tokens
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


def test_max_tokens_below_the_budget_wins(client):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"], max_tokens=5, extra_body={"thinking_token_budget": 30}
    )
    assert completion.choices[0].finish_reason == "length"
    assert reasoning_of(completion.choices[0].message) == v41_tokenizer().decode(REASONING_IDS[:5])
    assert not completion.choices[0].message.content


def test_it_composes_with_reasoning_effort_and_budget(client):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"], reasoning_effort="max",
        extra_body={"thinking_token_budget": 8, "reasoning_budget": 90},
    )  # fmt: skip
    check_cut(completion, 8)


def test_with_thinking_off_a_budget_has_nothing_to_cut(client):
    completion = client.chat.completions.create(
        model="default", messages=ASK["text"],
        extra_body={"thinking_token_budget": 8, "thinking": {"type": "disabled"}},
    )  # fmt: skip
    assert reasoning_of(completion.choices[0].message) is None
    assert completion.choices[0].message.content == TEXT_ANSWER


MUST = "must be an integer of at least 1, got"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"thinking_token_budget": 0}, f"thinking_token_budget {MUST} integer `0`"),
        ({"thinking_token_budget": -1}, f"thinking_token_budget {MUST} integer `-1`"),
        ({"thinking_token_budget": "8"}, f"thinking_token_budget {MUST} string '8'"),
        ({"thinking_token_budget": True}, f"thinking_token_budget {MUST} boolean `true`"),
        ({"thinking_token_budget": 2.5}, f"thinking_token_budget {MUST} floating point `2.5`"),
        ({"chat_template_kwargs": {"thinking_token_budget": 0}}, f"kwargs.thinking_token_budget {MUST}"),
        (
            {"thinking_token_budget": 8, "chat_template_kwargs": {"thinking_token_budget": 9}},
            "thinking_token_budget is 8 but chat_template_kwargs.thinking_token_budget is 9",
        ),
    ],
)
def test_a_bad_budget_is_a_400_that_names_the_field(client, extra, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="default", messages=ASK["text"], max_tokens=1, extra_body=extra)


# ---- the server's default (`serve --thinking-token-budget 64`) -------------------------------


@pytest.fixture(scope="module")
def budget_client(scripted_budget_server) -> openai.OpenAI:
    return client_of(scripted_budget_server)


def test_the_server_default_cuts_a_request_that_sends_none(budget_client):
    completion = budget_client.chat.completions.create(model="default", messages=ASK["json"],
                                                       response_format={"type": "json_object"})
    check_cut(completion, SERVER_DEFAULT)
    assert json.loads(completion.choices[0].message.content) == PERSON


def test_the_request_s_budget_wins_over_the_server_default(budget_client):
    for budget in (8, 90):
        completion = budget_client.chat.completions.create(
            model="default", messages=ASK["text"], extra_body={"thinking_token_budget": budget}
        )
        check_cut(completion, budget)


def test_the_server_default_leaves_short_reasoning_alone(budget_client):
    completion = budget_client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": f"{scripted.TOOL_TRIGGER} weather?"}],
        tools=[WEATHER_TOOL],
    )  # fmt: skip
    script = next(s for s in scripted.DEFAULT_SCRIPTS if s.name == "tool")
    assert reasoning_of(completion.choices[0].message) == script.reasoning
    assert completion.choices[0].finish_reason == "tool_calls"
