"""The held-out evaluation scores the corpus's own turns as right, scores calls apart by the kind
of value they copy, and counts turns cut at the token limit as not ended."""

import json

import pytest
import torch

from sglang_ds41.cache import trained_tiny_checkpoint
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.training import evaluate as E

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_turn_the_corpus_wrote_gets_full_marks_in_every_kind():
    cases = E.cases(0, 2)
    assert {c.kind for c in cases} == set(E.KINDS)
    report = E.Report()
    for case in cases:
        report.add(case, case.expected | {E.FINISH: "stop"}, E.score(case, case.expected))
    summary = report.summary()
    assert summary.pop("cases") == len(cases)
    assert summary == dict.fromkeys(summary, 1.0), summary


def test_a_turn_cut_at_the_token_limit_has_not_ended():
    model = load_reference(trained_tiny_checkpoint(), dtype=torch.float32)
    cases = E.cases(0, 1)[:3]
    cut = E.evaluate(E.ReferenceCompleter(model, max_new_tokens=2), cases).summary()
    assert cut["ended"] == 0.0
    assert all(v == 0.0 for k, v in cut.items() if k.startswith("call.") or k.startswith("json."))


def _call_case(question: str, name: str, arguments: dict) -> E.Case:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    body = {"messages": [{"role": "user", "content": question}]}
    return E.Case("call", "weather", body, {"tool_calls": [call]})


def test_calls_are_scored_apart_by_whether_they_copy_a_name_or_only_numbers():
    city = _call_case("What is the weather in Richmond?", "get_weather", {"city": "Richmond"})
    wrong = {"tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}]}
    assert E.score(city, city.expected) == {"exact": 1.0, "exact_names": 1.0}
    assert E.score(city, wrong) == {"exact": 0.0, "exact_names": 0.0}
    product = _call_case("Compute 487 * 36.", "calculate", {"expression": "487 * 36"})
    assert E.score(product, product.expected) == {"exact": 1.0, "exact_numbers": 1.0}
    made_up = _call_case("What is the weather there?", "get_weather", {"city": "Richmond"})  # not copied
    assert E.score(made_up, made_up.expected) == {"exact": 1.0}


def test_the_reference_models_output_is_read_as_the_server_reads_it():
    """A call the model never closed (it wrote EOS inside the value, copying the question's
    full stop) is a malformed call on the server, so in the reference too: not a call."""
    from sglang_ds41.encoding import encode_prompt, render_completion
    from sglang_ds41.encoding.conversation import AssistantMessage, ParsingOptions, ToolCall
    from sglang_ds41.encoding.special_tokens import Special

    from sglang_ds41.assets import v41_tokenizer

    call = ToolCall("c1", "calculate", json.dumps({"expression": "17 * 3"}))
    whole = encode_prompt(render_completion(AssistantMessage("", None, (call,)), False))
    assert whole[-1] == Special.EOS.id
    tools = ParsingOptions(thinking=False, parse_tool_calls=True)
    closed = E.served_message(whole, tools)
    assert E.calls_of(closed) == [("calculate", {"expression": "17 * 3"})]
    assert closed[E.FINISH] == "tool_calls" and "invalid_tool_calls" not in closed

    value_end = max(i for i, t in enumerate(whole) if "3" in v41_tokenizer().decode([t]))
    unclosed = E.served_message([*whole[: value_end + 1], Special.EOS.id], tools)
    assert E.calls_of(unclosed) == [] and unclosed[E.FINISH] == "stop"
    [invalid] = unclosed["invalid_tool_calls"]
    assert invalid["function"]["name"] == "calculate" and "not closed" in invalid["error"]

    cut = E.served_message(whole[:-1], tools)  # the whole call, then the token limit: no EOS
    assert cut[E.FINISH] == "length"  # as the server says: a turn cut off has not ended


@pytest.mark.parametrize("kind", ["json_schema", "json_object", "text", None])
def test_a_json_answer_is_read_as_json_output_as_the_server_reads_it(kind):
    """The server reads the answer to either JSON response format as JSON output (upstream's
    DeepSeek-recipe adapter decides so), which keeps a `</think>` the model wrote inside the JSON
    as text; the reference read a `json_schema` answer as plain content and deleted it, so one
    held-out extraction differed from the server's answer by those 8 characters."""
    from sglang.srt.entrypoints.openai import serving_deepseek_recipe as upstream
    from sglang_ds41.encoding import render_request
    from sglang_ds41.encoding.special_tokens import Special

    from sglang_ds41.assets import v41_tokenizer
    from sglang_ds41.plugin.serving.served_output import JSON_RESPONSE_FORMATS

    assert tuple(upstream.JSON_RESPONSE_FORMATS) == JSON_RESPONSE_FORMATS  # our mirror of upstream's rule
    question = {"role": "user", "content": "Extract it as JSON."}
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [question], "thinking": {"type": "disabled"}}
    if kind is not None:
        body["response_format"] = {"type": kind} | (
            {"json_schema": {"name": "A", "schema": {"type": "object"}}} if kind == "json_schema" else {}
        )
    encode = v41_tokenizer().encode
    ids = [*encode('{"a": "x').ids, Special.THINK_END.id, *encode('y"}').ids, Special.EOS.id]
    parsing = E.served_parsing(render_request(body).parsing, body)
    content = E.served_message(ids, parsing)["content"]
    json_output = kind in ("json_schema", "json_object")
    assert content == ('{"a": "x</think>y"}' if json_output else '{"a": "xy"}')
