"""Multi-turn scripts of the scripted model (`Script.then`), on prompts from the official renderer."""

import json

import pytest
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.checkpoint.scripted import (
    DEFAULT_SCRIPTS,
    INVOICE_JSON_TEXT,
    WEATHER_CALCULATOR_TRIGGER,
    Script,
    dsml_calls,
    script_ids,
    scripts_config,
)
from tests.backend.test_scripted import generate, official_ids

EOS, THINK_END = Special.EOS.id, Special.THINK_END.id
SCRIPT = {s.name: s for s in DEFAULT_SCRIPTS}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
        },
    }
    for name, arg in (("get_weather", "city"), ("calculate", "expression"))
]


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_dsml_calls_is_what_the_official_renderer_writes_for_parallel_calls():
    calls = [call("a", "get_weather", {"city": "Paris"}), call("b", "calculate", {"expression": "1 + 2"})]
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "a", "content": "x"},
        {"role": "tool", "tool_call_id": "b", "content": "y"},
    ]
    ids = official_ids(history, thinking=False, tools=TOOLS)
    block = script_ids(dsml_calls(("get_weather", {"city": "Paris"}), ("calculate", {"expression": "1 + 2"})))
    assert any(ids[i : i + len(block)] == block for i in range(len(ids) - len(block) + 1))


def test_dsml_calls_writes_non_string_values_as_json():
    text = dsml_calls(("f", {"n": 3, "ok": False}))
    assert '<｜DSML｜ parameter name="n" string="false">3</｜DSML｜ parameter>' in text
    assert '<｜DSML｜ parameter name="ok" string="false">false</｜DSML｜ parameter>' in text


def weather_loop(turns: int, thinking: bool) -> list[dict]:
    """The weather-calculator conversation after `turns` assistant turns (each answered)."""
    steps = [
        [call("c0", "get_weather", {"city": "Paris"}), call("c1", "get_weather", {"city": "Oslo"})],
        [call("c2", "calculate", {"expression": "(18.5 + 4.0) / 2"})],
    ]
    messages = [{"role": "user", "content": f"{WEATHER_CALCULATOR_TRIGGER} average of Paris and Oslo?"}]
    for calls in steps[:turns]:
        messages.append({"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "1"} for c in calls]
    return messages


@pytest.mark.parametrize("thinking", [False, True])
def test_a_chain_writes_its_turns_in_order_then_the_default(thinking):
    script = SCRIPT["weather-calculator"]
    expected = [(script.reasoning, script.content), *script.then, (SCRIPT["default"].reasoning,
                                                                   SCRIPT["default"].content)]
    for turns, (reasoning, content) in enumerate(expected):
        if turns > 2:  # past the scripted turns: a further tool round gets the default answer
            messages = weather_loop(2, thinking)
            messages += [{"role": "assistant", "content": "x", "reasoning_content": "r"},
                         {"role": "user", "content": "and now?"}]
        else:
            messages = weather_loop(turns, thinking)
        out = generate(official_ids(messages, thinking, tools=TOOLS))
        want = [*script_ids(content), EOS]
        assert out == ([*script_ids(reasoning), THINK_END, *want] if thinking else want), turns


def test_a_trigger_in_the_last_user_turn_wins_over_an_earlier_chain():
    messages = [*weather_loop(1, False), {"role": "user", "content": "[script:json] now a person"}]
    out = generate(official_ids(messages, False, tools=TOOLS))
    assert out == [*script_ids(SCRIPT["json"].content), EOS]


def test_invoice_script_is_valid_json():
    assert json.loads(INVOICE_JSON_TEXT)["currency"] == "EUR"


def test_scripts_without_followups_have_an_empty_then():
    config = scripts_config([Script("x", "[x]", "r", "c"), Script("d", None, "r", "d")])
    assert [s["then"] for s in config] == [[], []]


def test_a_raw_value_is_written_verbatim_as_a_non_string_parameter():
    from sglang_ds41.checkpoint.scripted import RawValue

    text = dsml_calls(("f", {"x": RawValue("{oops")}))
    assert '<｜DSML｜ parameter name="x" string="false">{oops</｜DSML｜ parameter>' in text
