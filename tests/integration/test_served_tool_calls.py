"""Tool calls through the real server (`sglang-ds41 serve`, scripted model), plain `openai` client.

The scripted model writes what our V4.1 encoder renders for known calls (`scripted.RenderedCalls`:
DSML tags as special ids, argument text as plain text), so the client must receive exactly those
calls: surrounding whitespace and newlines, DSML and special-token spellings inside strings,
JSON-looking strings, 64-bit edges, unicode, a long file. Malformed calls (broken `string="false"`
JSON, an unknown attribute, an unclosed block, a call cut by `max_tokens`) must arrive in the
`invalid_tool_calls` extension field, never as `tool_calls`, with `content` free of DSML.
Every case runs streamed and not; the streamed deltas must add up to the non-streamed message.
No request carries an extra body: thinking is the server's default (on).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.checkpoint import scripted
from tests.plugin.test_served_output import rendered_value, same

pytestmark = pytest.mark.integration

SCRIPT = {s.name: s for s in scripted.DEFAULT_SCRIPTS}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": "test", "parameters": {"type": "object"}}}
    for name in ("echo", "write_file")
]
DSML_SPELLINGS = (Special.DSML.value, "DSML")


@pytest.fixture(scope="module")
def client(scripted_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.openai_url, api_key="unused", timeout=300, max_retries=0)


def ask(client, trigger: str, *, stream: bool, tools=TOOLS, **kwargs) -> dict[str, Any]:
    """The assistant message (plus finish_reason) as the client sees it, streamed or not; each
    call with the `repairs` the server noted (a tolerant parse's, docs/ENCODING.md §4.5)."""
    messages = [{"role": "user", "content": f"{trigger} go"}]
    if not stream:
        choice = client.chat.completions.create(
            model="default", messages=messages, tools=tools, **kwargs
        ).choices[0]
        message = choice.message
        return {
            "content": message.content,
            "reasoning": (message.model_extra or {}).get("reasoning_content"),
            "tool_calls": [
                {
                    "id": c.id,
                    "name": c.function.name,
                    "arguments": c.function.arguments,
                    "repairs": (c.model_extra or {}).get("repairs", []),
                }
                for c in message.tool_calls or []
            ],
            "invalid": (message.model_extra or {}).get("invalid_tool_calls", []),
            "finish_reason": choice.finish_reason,
        }
    content, reasoning, calls, invalid, finish = [], [], {}, [], None
    for chunk in client.chat.completions.create(
        model="default", messages=messages, tools=tools, stream=True, **kwargs
    ):
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.model_extra or {}
            content.append(delta.content or "")
            reasoning.append(extra.get("reasoning_content") or "")
            invalid += extra.get("invalid_tool_calls") or []
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": "", "repairs": []})
                slot["id"] += call.id or ""
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
                slot["repairs"] += (call.model_extra or {}).get("repairs", [])
            finish = choice.finish_reason or finish
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "invalid": invalid,
        "finish_reason": finish,
    }


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message less the call ids (fresh per response)."""
    return {
        **message,
        "tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in message["tool_calls"]],
        "invalid": [{k: v for k, v in c.items() if k != "id"} for c in message["invalid"]],
    }


def assert_no_dsml(message: dict[str, Any]) -> None:
    for spelling in DSML_SPELLINGS:
        assert spelling not in (message["content"] or "")
        assert spelling not in (message["reasoning"] or "")


@pytest.fixture(scope="module")
def answers(client):
    """Each scripted case asked once streamed and once not (the server is slow; tests share them)."""
    cache: dict[tuple, dict[str, Any]] = {}

    def get(trigger: str, stream: bool, **kwargs) -> dict[str, Any]:
        key = (trigger, stream, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = ask(client, trigger, stream=stream, **kwargs)
        return cache[key]

    return get


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize("name", ["args-strings", "args-values", "args-long"])
def test_the_client_receives_exactly_the_calls_rendered(answers, name, stream):
    script = SCRIPT[name]
    message = answers(script.trigger, stream)
    assert message["finish_reason"] == "tool_calls"
    assert message["reasoning"] == script.reasoning
    assert message["content"] == script.content.text
    assert message["invalid"] == []
    assert [c["name"] for c in message["tool_calls"]] == [name for name, _ in script.content.calls]
    for (_, arguments), call in zip(script.content.calls, message["tool_calls"], strict=True):
        assert same(json.loads(call["arguments"]), rendered_value(arguments)), (arguments, call["arguments"])
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == len(message["tool_calls"])


@pytest.mark.parametrize(
    "name", ["args-strings", "args-values", "args-long", "broken-calls", "unclosed-block", "bare-dsml"]
)
def test_streamed_deltas_add_up_to_the_one_shot_message(answers, name):
    trigger = SCRIPT[name].trigger
    assert without_ids(answers(trigger, True)) == without_ids(answers(trigger, False))


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_broken_json_and_an_unknown_attribute_arrive_flagged_not_as_calls(answers, stream):
    message = answers(scripted.BROKEN_CALLS_TRIGGER, stream)
    assert [json.loads(c["arguments"]) for c in message["tool_calls"]] == [{"value": "fine"}]
    broken, attribute = message["invalid"]
    assert broken["function"] == {"name": "echo", "arguments": '{"value": {not json}'}
    assert "arguments are not valid JSON" in broken["error"]
    assert attribute["function"] == {"name": "echo", "arguments": '{"value": "attr"}'}
    assert "unexpected attribute text" in attribute["error"] and "lang" in attribute["error"]
    assert [c["index"] for c in message["invalid"]] == [0, 1] and broken["type"] == "function"
    assert message["finish_reason"] == "tool_calls"
    assert message["content"] == ""
    assert_no_dsml(message)


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_a_value_nested_past_pythons_recursion_limit_arrives_flagged(answers, stream):
    """Model output is untrusted: arguments nested 1,000 levels deep are an invalid call with
    its reason, the response itself a normal one."""
    message = answers(scripted.DEEP_ARGS_TRIGGER, stream)
    assert message["tool_calls"] == []
    [call] = message["invalid"]
    assert call["function"]["name"] == "echo" and "nested too deeply" in call["error"]
    assert call["function"]["arguments"].count("[") == scripted.DEEP_NESTING
    assert_no_dsml(message)


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_an_unclosed_calls_block_arrives_flagged(answers, stream):
    message = answers(scripted.UNCLOSED_BLOCK_TRIGGER, stream)
    assert message["tool_calls"] == []
    [call] = message["invalid"]
    assert call["function"] == {"name": "echo", "arguments": '{"value": "x"}'}
    assert call["error"] == "tool-call block not closed"
    # no call to run: the turn ended as an answer would (docs/ENCODING.md §4.4)
    assert message["finish_reason"] == "stop"
    assert_no_dsml(message)


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_a_calls_block_without_its_opening_lt_still_arrives_as_the_call(answers, stream):
    message = answers(scripted.BARE_DSML_TRIGGER, stream)
    assert [(c["name"], json.loads(c["arguments"])) for c in message["tool_calls"]] == [
        ("echo", {"value": "fine"})
    ]
    assert message["invalid"] == [] and message["finish_reason"] == "tool_calls"
    assert message["content"] == "Calling."
    assert_no_dsml(message)


def _cuts() -> dict[str, int]:
    """max_tokens that cut the long file's answer: right after the block opens, inside the
    call's name, inside its argument text (output ids: reasoning, `</think>`, content, DSML)."""
    from sglang_ds41.assets import v41_tokenizer

    script = SCRIPT["args-long"]
    start = len(scripted.script_ids(script.reasoning)) + 1
    ids = scripted.content_ids(script.content)
    text = [v41_tokenizer().decode(ids[:k], skip_special_tokens=False) for k in range(len(ids))]
    opened = next(k for k, t in enumerate(text) if t.endswith(Special.DSML.value))
    in_name = next(k for k, t in enumerate(text) if 'name="w' in t)
    in_argument = next(k for k, t in enumerate(text) if 'string="true">    line 000' in t)
    return {"block-opened": start + opened, "in-name": start + in_name, "in-argument": start + in_argument}


CUTS = _cuts()


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize("cut", sorted(CUTS))
def test_a_call_cut_off_by_max_tokens_arrives_flagged_and_content_stays_clean(answers, cut, stream):
    max_tokens = CUTS[cut]
    message = answers(scripted.ARGS_LONG_TRIGGER, stream, max_tokens=max_tokens)
    assert message["finish_reason"] == "length"
    assert message["tool_calls"] == []
    assert message["content"] == "Writing the file."
    assert message["reasoning"] == SCRIPT["args-long"].reasoning
    assert_no_dsml(message)
    for call in message["invalid"]:
        assert "max_tokens" in call["error"]
        with pytest.raises(json.JSONDecodeError):
            json.loads(call["function"]["arguments"])
    if cut == "block-opened":
        assert message["invalid"] == []  # no call begun yet: nothing to report
    else:
        [call] = message["invalid"]
        name = call["function"]["name"]
        if cut == "in-argument":
            assert name == "write_file"
        else:  # the name as far as it was written
            assert name and "write_file".startswith(name) and name != "write_file"
    other = answers(scripted.ARGS_LONG_TRIGGER, not stream, max_tokens=max_tokens)
    assert without_ids(message) == without_ids(other)


# ---- the text endpoints: /parse_function_call and /separate_reasoning ------------------------


def post(server, path: str, body: dict) -> dict:
    import httpx

    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_parse_function_call_keeps_strings_exact_and_flags_malformed_calls(scripted_server):
    """The text endpoint reads V4.1 output as chat does: surrounding whitespace kept, broken JSON
    and an unknown attribute returned with an `error` (upstream returns them as plain calls)."""
    from sglang_ds41.checkpoint.scripted import _raw_invoke

    value = "  two spaces, then a newline\n"
    text = (
        "Calling.\n\n<｜DSML｜ calls>\n"
        + "\n".join(
            [
                _raw_invoke('string="true"', value),
                _raw_invoke('string="false"', "{not json"),
                _raw_invoke('lang="en" string="true"', "attr"),
            ]
        )
        + "\n</｜DSML｜ calls>"
    )
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]
    body = post(
        scripted_server,
        "/parse_function_call",
        {"text": text, "tool_call_parser": "deepseekv41", "tools": tools},
    )
    assert body["normal_text"] == "Calling."
    good, broken, attribute = body["calls"]
    assert good == {"tool_index": 0, "name": "echo", "parameters": json.dumps({"value": value})}
    assert broken["parameters"] == '{"value": {not json}' and "not valid JSON" in broken["error"]
    assert "unexpected attribute text" in attribute["error"] and "lang" in attribute["error"]
    cut = post(
        scripted_server,
        "/parse_function_call",
        {"text": text[:-40], "tool_call_parser": "deepseekv41", "tools": tools},
    )
    assert all("tool-call block not closed" in call["error"] for call in cut["calls"])


def test_separate_reasoning_splits_at_the_think_end_token(scripted_server):
    def split(text: str) -> tuple[str, str]:
        body = post(
            scripted_server, "/separate_reasoning", {"text": text, "reasoning_parser": "deepseek-v41"}
        )
        return body["reasoning_text"], body["text"]

    assert split("<think>weigh it\n</think>\n\nThe answer.") == ("weigh it", "The answer.")
    assert split("plan first</think>Done.") == ("plan first", "Done.")
    assert split("No reasoning here.") == ("", "No reasoning here.")
