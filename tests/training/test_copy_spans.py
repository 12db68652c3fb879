"""`benchmarks/copy_spans.py` (docs/TRAINING.md §7) finds a copied value's ids where the server
writes them and tells an id copy from a re-spelling."""

from __future__ import annotations

import json

from sglang_ds41.encoding.prompt_ids import text_tokenizer
from sglang_ds41.encoding.request import conversation_from_request

from sglang_ds41.training.corpus.samples import turns
from tests.training._benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("copy_spans")


def _call(question: str, name: str, arguments: dict) -> dict:
    return {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
            {"role": "assistant", "content": "Done."},
        ],
        "thinking": {"type": "disabled"},
    }


def _first_run(body: dict) -> tuple[list[int], list[int], str]:
    bench = _benchmark()
    (prompt, completion), _ = turns(conversation_from_request(body))
    (value,), _ = bench.copied_values(body)
    (run, *_) = bench.value_ids(completion, value)
    return prompt, run, value


def test_a_city_in_a_call_is_spelt_with_other_ids_than_in_the_question():
    bench = _benchmark()
    body = _call("What is the weather in Richmond?", "get_weather", {"city": "Richmond"})
    prompt, run, value = _first_run(body)
    tok = text_tokenizer()
    assert value == "Richmond"
    assert run == tok.encode("Richmond", add_special_tokens=False).ids  # the bare word: Rich + mond
    assert tok.encode(" Richmond", add_special_tokens=False).ids[0] in prompt  # the question's one id
    assert not bench.contains(prompt, run)
    assert bench.value_kind(value) == "name"


def test_an_expression_in_a_call_is_a_run_of_the_question_ids():
    bench = _benchmark()
    prompt, run, value = _first_run(_call("Compute 487 * 36.", "calculate", {"expression": "487 * 36"}))
    assert text_tokenizer().decode(run) == "487 * 36"
    assert bench.contains(prompt, run)
    assert bench.value_kind(value) == "number"


def test_values_the_prompt_does_not_hold_are_not_counted():
    bench = _benchmark()
    body = _call("What is the weather there?", "get_weather", {"city": "Richmond"})
    assert bench.copied_values(body) == [[], []]
