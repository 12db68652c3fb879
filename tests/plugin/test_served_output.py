"""`ServedOutput`, the parse behind the V4.1 chat server, fed token ids as the engine sends them.

Expected calls come from the scripts' own (name, arguments) values, rendered to ids by our
V4.1 encoder (`scripted.rendered_ids`); streaming is checked against the one-shot parse for
many chunkings, truncation at every id of a call.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.checkpoint import scripted
from sglang_ds41.plugin.serving.served_output import BLOCK_NOT_CLOSED, ServedOutput, Step
from tests.encoding.parse_oracle import model_ids, model_outputs

SCRIPTS = {s.name: s for s in scripted.ADVERSARIAL_SCRIPTS}
TOOLS = ParsingOptions(thinking=False, parse_tool_calls=True)
THINKING_TOOLS = ParsingOptions(thinking=True, parse_tool_calls=True)


def served_output(options: ParsingOptions, **kw) -> ServedOutput:
    """The served parse with the V4.1 tokenizer, as the server builds it."""
    return ServedOutput(options, tokenizer=v41_tokenizer(), **kw)


def same(a, b) -> bool:
    """JSON values equal with their types (1 != 1.0 != True) and float bits (-0.0 != 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def rendered_value(value):
    """What a value is after rendering: integers beyond 64 bits become doubles (ENCODING.md 2.6)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value <= 2**64 - 1:
        return float(value)
    if isinstance(value, dict):
        return {k: rendered_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rendered_value(v) for v in value]
    return value


def ids_of(name: str, reasoning: str | None = None) -> list[int]:
    script = SCRIPTS[name]
    ids = scripted.content_ids(script.content)
    if reasoning is not None:
        ids = [*scripted.script_ids(reasoning), Special.THINK_END.id, *ids]
    return ids


def run(ids: list[int], options: ParsingOptions, chunks: list[int] | None = None, finish="stop", **kw):
    """Feed `ids` in pieces of the given sizes (all at once when None), then finish."""
    output = served_output(options, **kw)
    total = Step()
    at = 0
    for size in chunks or []:
        merge(total, output.feed(ids[at : at + size]))
        at += size
    merge(total, output.finish(ids[at:], finish))
    return total


def merge(total: Step, step: Step) -> None:
    total.reasoning += step.reasoning
    total.content += step.content
    total.calls += step.calls
    total.invalid_calls += step.invalid_calls


def random_chunks(n: int, rng: random.Random) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.randint(1, 9))
    sizes[-1] -= sum(sizes) - n
    return [s for s in sizes if s]


@pytest.mark.parametrize("name", ["args-strings", "args-values", "args-long"])
def test_adversarial_arguments_come_back_exactly_as_rendered(name):
    script = SCRIPTS[name]
    step = run(ids_of(name, "think first"), THINKING_TOOLS)
    assert step.reasoning == "think first"
    assert step.content == script.content.text
    assert not step.invalid_calls
    assert [c.name for c in step.calls] == [n for n, _ in script.content.calls]
    for (_, arguments), call in zip(script.content.calls, step.calls, strict=True):
        assert same(json.loads(call.arguments), rendered_value(arguments)), (arguments, call.arguments)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_streaming_in_any_chunking_equals_one_shot(name):
    ids = ids_of(name, "r")
    whole = run(ids, THINKING_TOOLS)
    rng = random.Random(name)
    for _ in range(20):
        assert run(ids, THINKING_TOOLS, random_chunks(len(ids), rng)) == whole


def test_calls_are_released_when_their_block_closes():
    ids = ids_of("args-values")
    output = served_output(TOOLS)
    step = output.feed(ids[:-1])
    assert not step.calls  # the block's closing tag is the last id
    step = output.feed(ids[-1:])
    assert len(step.calls) == len(scripted.ADVERSARIAL_VALUES)
    assert output.finish([], "stop") == Step()


def test_broken_json_and_an_unknown_attribute_are_invalid_calls():
    step = run(ids_of("broken-calls"), TOOLS)
    assert [json.loads(c.arguments) for c in step.calls] == [{"value": "fine"}]
    broken, attribute = step.invalid_calls
    assert (broken.position, broken.arguments) == (1, '{"value": {not json}')
    assert "arguments are not valid JSON" in broken.error
    assert (attribute.position, attribute.arguments) == (2, '{"value": "attr"}')
    assert "unexpected attribute text" in attribute.error and "lang" in attribute.error
    assert step.content == ""


def test_a_block_that_never_closes_makes_its_calls_invalid():
    step = run(ids_of("unclosed-block"), TOOLS)
    assert not step.calls
    [call] = step.invalid_calls
    assert json.loads(call.arguments) == {"value": "x"}
    assert call.error == BLOCK_NOT_CLOSED


@pytest.mark.parametrize("streamed", [False, True])
def test_truncation_anywhere_in_the_calls_never_gives_a_valid_call_nor_dsml_content(streamed):
    ids = ids_of("args-long")
    start = len(scripted.script_ids("Writing the file."))
    rng = random.Random(7)
    for end in range(start + 1, len(ids)):
        chunks = random_chunks(end, rng)[:-1] if streamed else None
        step = run(ids[:end], TOOLS, chunks, finish="length")
        assert step.content == "Writing the file."
        assert not step.calls
        for call in step.invalid_calls:
            assert "max_tokens" in call.error
        assert step == run(ids[:end], TOOLS, finish="length")


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Writing.\n\n<", "Writing."),  # cut right before the DSML id: the held "\n\n<" goes
        ("Writing.\n\n", "Writing."),
        ("Hi.\n\n</", "Hi."),  # a stray closing tag opens a block too
        ("x\n<\n\n" + Special.DSML.value, "x\n<"),  # "x\n<" was text before the block began
        ("x <\n\n<" + Special.DSML.value, "x <\n"),
    ],
)
@pytest.mark.parametrize("reasoning", [False, True], ids=["content", "reasoning-as-content"])
def test_a_cut_off_block_start_is_dropped_the_same_for_every_chunking(text, content, reasoning):
    """Also where the block would have opened inside the reasoning, returned as content."""
    ids = scripted.script_ids(text) if Special.DSML.value not in text else _ids_with_dsml(text)
    options, kw = (THINKING_TOOLS, {"separate_reasoning": False}) if reasoning else (TOOLS, {})
    assert run(ids, options, finish="length", **kw).content == content
    for cut in range(1, len(ids)):
        assert run(ids, options, [cut], finish="length", **kw).content == content, cut
    if reasoning:  # separated, the reasoning loses the same cut-off start
        assert run(ids, THINKING_TOOLS, finish="length").reasoning == content


def _ids_with_dsml(text: str) -> list[int]:
    head, tail = text.split(Special.DSML.value)
    return [*scripted.script_ids(head), Special.DSML.id, *(scripted.script_ids(tail) if tail else [])]


def test_the_matched_stop_id_is_not_parsed():
    ids = [*scripted.script_ids("Hello"), Special.EOS.id]
    assert run(ids, TOOLS).content == "Hello<｜end▁of▁sentence｜>"  # an EOS the engine did not match
    output = served_output(TOOLS)
    assert output.finish(ids, "stop", Special.EOS.id).content == "Hello"
    output = served_output(TOOLS)
    assert output.finish(ids, "stop", Special.EOS.id, keep_matched_stop=True).content.endswith("sentence｜>")


@pytest.mark.parametrize("keep", [False, True])
def test_a_stop_string_is_held_back_and_cut(keep):
    ids = scripted.script_ids("one two END")  # the engine stops on the id completing "END"
    for split in range(len(ids)):
        output = served_output(ParsingOptions(thinking=False), stops=["END", "x"])
        first = output.feed(ids[:split])
        last = output.finish(ids[split:], "stop", "END", keep_matched_stop=keep)
        assert "END" not in first.content
        assert first.content + last.content == ("one two END" if keep else "one two ")


def test_reasoning_as_content_and_held_reasoning():
    ids = [*scripted.script_ids("why"), Special.THINK_END.id, *scripted.script_ids("answer")]
    merged = run(ids, THINKING_TOOLS, separate_reasoning=False)
    assert (merged.reasoning, merged.content) == ("", "whyanswer")
    output = served_output(THINKING_TOOLS, stream_reasoning=False)
    early = output.feed(ids[:2])
    assert early.reasoning == ""
    rest = output.finish(ids[2:], "stop")
    assert (rest.reasoning, rest.content) == ("why", "answer")


def test_a_finish_sent_again_changes_nothing():
    output = served_output(TOOLS)
    assert output.finish(scripted.script_ids("hi"), "stop").content == "hi"
    assert output.finish([5, 6], "stop") == Step()
    assert output.num_consumed_tokens == len(scripted.script_ids("hi")) + 2


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_outputs(), st.randoms(use_true_random=False))
@example(
    (f"x\n<\n\n{Special.DSML.value} calls>", TOOLS, "length"), random.Random(1)
)  # text before a cut block
def test_generated_outputs_stream_as_they_parse_at_once(case, rng):
    """Any model output (reasoning, content, well-formed and broken DSML, cut at max_tokens), fed
    as the engine's ids in random chunks, gives the one-shot result."""
    text, options, finish = case
    ids = model_ids(text)
    finish_type = "length" if finish == "length" else "stop"
    whole = run(ids, options, finish=finish_type)
    chunks = random_chunks(len(ids), rng)[:-1] if ids else []
    assert run(ids, options, chunks, finish=finish_type) == whole
    if options.parse_tool_calls and not options.parse_json_output:  # (JSON text is the value's)
        assert Special.DSML.value not in whole.content
