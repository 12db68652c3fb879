"""The scripted test model's script logic, on prompts rendered by the official renderer."""

import json

import pytest
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.backend.scripted import next_scripted_token
from sglang_ds41.checkpoint.scripted import (
    DEFAULT_SCRIPTS,
    JSON_TRIGGER,
    LONG_REASONING,
    PERSON_JSON_TEXT,
    PONDER_TEXT_TRIGGER,
    TOOL_TRIGGER,
    WEATHER_CALL_TEXT,
    Script,
    script_ids,
    scripted_config,
    scripts_config,
    write_scripted_checkpoint,
)
from sglang_ds41.errors import Ds41Error
from tests.encoding.oracle import wheel

MODEL = "DeepSeek-V4.1-Flash"
EOS, THINK_END = Special.EOS.id, Special.THINK_END.id
SCRIPTS = scripts_config(DEFAULT_SCRIPTS)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        },
    },
}


def official_ids(messages, thinking: bool, **extra) -> list[int]:
    body = {"model": MODEL, "messages": messages, "thinking": {"type": "enabled" if thinking else "disabled"}}
    outcome = wheel({**body, **extra})
    assert not outcome.rejected, outcome.error
    return list(outcome.ids)


def generate(prompt: list[int], limit: int = 200) -> list[int]:
    """Greedy decoding with the scripted model: the ids it emits up to and including EOS."""
    seq = list(prompt)
    for _ in range(limit):
        seq.append(next_scripted_token(seq, SCRIPTS))
        if seq[-1] == EOS:
            return seq[len(prompt) :]
    raise AssertionError("the script did not end")


def test_tool_script_is_the_dsml_block_the_official_renderer_writes_for_that_call():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "Paris", "unit": "c"}'}}
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    ids = official_ids(history, thinking=False, tools=[WEATHER_TOOL])
    block = script_ids(WEATHER_CALL_TEXT)
    assert Special.DSML.id in block
    assert any(ids[i : i + len(block)] == block for i in range(len(ids) - len(block) + 1))


@pytest.mark.parametrize("thinking", [False, True])
def test_trigger_in_the_user_turn_selects_its_script(thinking):
    prompt = official_ids([{"role": "user", "content": f"{TOOL_TRIGGER} weather in Paris?"}], thinking,
                          tools=[WEATHER_TOOL])
    out = generate(prompt)
    content = [*script_ids(WEATHER_CALL_TEXT), EOS]
    if thinking:
        reasoning = script_ids("The user wants the weather; I call get_weather.")
        assert out == [*reasoning, THINK_END, *content]
    else:
        assert out == content


def test_json_script_is_valid_json():
    prompt = official_ids([{"role": "user", "content": f"{JSON_TRIGGER} a person please"}], thinking=False)
    out = generate(prompt)
    assert out == [*script_ids(PERSON_JSON_TEXT), EOS]
    assert json.loads(PERSON_JSON_TEXT) == {"name": "bob", "age": 39, "ok": False}


def test_without_trigger_the_default_script_answers():
    out = generate(official_ids([{"role": "user", "content": "Hello"}], thinking=False))
    assert out == [*script_ids("Hello! I am the scripted test model."), EOS]


def test_trigger_in_an_earlier_user_turn_does_not_repeat_the_call():
    # agent loop: after the tool result (a user turn) the model answers with the default
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": f"{TOOL_TRIGGER} weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    out = generate(official_ids(messages, thinking=False, tools=[WEATHER_TOOL]))
    assert out == [*script_ids("Hello! I am the scripted test model."), EOS]


@pytest.mark.parametrize("cut", [0, 1, 17])
def test_a_think_end_that_cuts_the_reasoning_short_is_followed_by_the_answer(cut):
    prompt = official_ids([{"role": "user", "content": f"{PONDER_TEXT_TRIGGER} think hard"}], thinking=True)
    reasoning = script_ids(LONG_REASONING)
    out = generate([*prompt, *reasoning[:cut], THINK_END])
    assert out == [*script_ids("After much thought: hello."), EOS]
    # reasoning that is not the script's, then </think>: off the script
    assert generate([*prompt, *reasoning[:cut], 42, THINK_END]) == [EOS]


def test_output_that_left_the_script_ends_with_eos():
    prompt = official_ids([{"role": "user", "content": "Hello"}], thinking=False)
    assert next_scripted_token([*prompt, 42, 43], SCRIPTS) == EOS


def test_prompt_without_assistant_header_gets_eos():
    assert next_scripted_token([Special.BOS.id, 1000, 1001], SCRIPTS) == EOS


def test_script_ids_keep_special_spellings_as_single_ids():
    ids = script_ids("a</think>b｜DSML｜c")
    assert ids.count(THINK_END) == 1 and ids.count(Special.DSML.id) == 1


def test_scripts_need_exactly_one_default():
    with pytest.raises(Ds41Error, match="exactly one default"):
        scripts_config([Script("x", "[x]", "", "x")])


def test_checkpoint_has_config_tokenizer_and_a_weight_file(tmp_path):
    out = write_scripted_checkpoint(tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(scripted_config()))
    assert config["architectures"] == ["DeepseekV41ScriptedForCausalLM"]
    assert {p.name for p in out.iterdir()} == {
        "config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"
    }
    with pytest.raises(Ds41Error, match="not empty"):
        write_scripted_checkpoint(out)
