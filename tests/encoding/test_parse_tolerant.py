"""A tolerant parse (`ParsingOptions(tolerant=True)`, ENCODING.md §4.5): the call spellings
models write besides V4.1's are read as calls, with the repair named, in text mode, token mode
and streamed; what stays ambiguous is not a valid call; V4.1's own spelling parses as before.

The expected calls come from the official parser (deepseek-recipe) given the same output
rewritten in V4.1's spelling: a repair is right when it reads what the model meant.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parse import parse_ids, parse_text
from sglang_ds41.encoding.stream import (
    REPAIR_ASCII,
    REPAIR_BARE_INVOKE,
    REPAIR_DOUBLED,
    REPAIR_IN_REASONING,
    REPAIR_SPELLED,
    REPAIR_TOOL_CALLS,
    StreamParser,
    repair_untyped,
)
from sglang_ds41.encoding.wrapped_arguments import declared_parameters, problem, repair, unwrap

from .parse_oracle import D, model_ids, model_outputs, plain_bpe, recipe_parse, visible

TOLERANT = ParsingOptions(thinking=True, parse_tool_calls=True, tolerant=True)
CHAT = ParsingOptions(thinking=False, parse_tool_calls=True, tolerant=True)
CANONICAL_CHAT = ParsingOptions(thinking=False, parse_tool_calls=True)
CANONICAL = ParsingOptions(thinking=True, parse_tool_calls=True)


def block(d: str = D, name: str = " calls", close: str | None = None) -> str:
    """A weather call with a string and a JSON parameter, its tags spelled with `d`."""
    return (
        f'<{d}{name}>\n<{d} invoke name="get_weather">\n'
        f'<{d} parameter name="city" string="true">Paris</{d} parameter>\n'
        f'<{d} parameter name="days" string="false">3</{d} parameter>\n'
        f"</{d} invoke>\n</{d}{name if close is None else close}>"
    )


BARE = (
    f'<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">Paris</{D} parameter>\n'
    f"</{D} invoke>"
)
UNTYPED = (
    f'<{D} calls>\n<{D} invoke name="f">\n<{D} parameter name="city">Paris</{D} parameter>\n'
    f'<{D} parameter name="n">42</{D} parameter>\n<{D} parameter name="o">{{"a": [1, 2]}}</{D} parameter>\n'
    f"</{D} invoke>\n</{D} calls>"
)
UNTYPED_AS_V41 = (
    UNTYPED.replace('name="city">', 'name="city" string="true">')
    .replace('name="n">', 'name="n" string="false">')
    .replace('name="o">', 'name="o" string="false">')
)

# (case, output, options, the same output in V4.1's spelling (for the official parser), repairs)
SURE = "r</think>Sure\n\n"
WRAPPED_BARE = f"<{D} calls>\n{BARE}\n</{D} calls>"
TOLERATED = [
    ("v4-name-v41-spacing", SURE + block(name=" tool_calls"), TOLERANT, SURE + block(), [REPAIR_TOOL_CALLS]),
    ("ascii-bars", SURE + block("|DSML|"), TOLERANT, SURE + block(), [REPAIR_ASCII]),
    ("doubled-bars", SURE + block("｜｜DSML｜｜"), TOLERANT, SURE + block(), [REPAIR_DOUBLED]),
    ("ascii-v4-name", "Sure\n\n" + block("|DSML|", " tool_calls"), CHAT, "Sure\n\n" + block(),
     [REPAIR_ASCII, REPAIR_TOOL_CALLS]),
    ("bare-invoke", "Sure\n\n" + BARE, CHAT, "Sure\n\n" + WRAPPED_BARE, [REPAIR_BARE_INVOKE]),
    ("in-reasoning", "I call it.\n\n" + block(), TOLERANT, "I call it.\n\n" + block(), [REPAIR_IN_REASONING]),
    ("bare-invoke-in-reasoning", "I call it.\n\n" + BARE, TOLERANT, "I call it.\n\n" + WRAPPED_BARE,
     [REPAIR_IN_REASONING, REPAIR_BARE_INVOKE]),
    ("untyped-parameters", "Sure\n\n" + UNTYPED, CHAT, "Sure\n\n" + UNTYPED_AS_V41,
     [repair_untyped("city", False), repair_untyped("n", True), repair_untyped("o", True)]),
]  # fmt: skip


def calls_of(message):
    return [(c.name, c.arguments) for c in message.tool_calls]


def check(message, canonical_text, options, repairs):
    canonical = options.__class__(**{**options.__dict__, "tolerant": False})
    reasoning, content, calls, _ = recipe_parse([canonical_text], canonical)
    assert (message.reasoning_content, message.content, calls_of(message)) == (reasoning, content, calls)
    assert message.tool_calls and all(c.valid for c in message.tool_calls), message.diagnostics()
    assert all(list(c.repairs) == repairs for c in message.tool_calls)
    assert message.finish_reason == "tool_calls" and message.valid, message.problems


@pytest.mark.parametrize(("text", "options", "canonical", "repairs"), [c[1:] for c in TOLERATED],
                         ids=[c[0] for c in TOLERATED])  # fmt: skip
def test_each_tolerated_spelling_is_read_as_its_v41_twin(text, options, canonical, repairs):
    check(parse_text(text, options), canonical, options, repairs)
    check(parse_ids(model_ids(text), options), canonical, options, repairs)


@pytest.mark.parametrize(("text", "options", "canonical", "repairs"), [c[1:] for c in TOLERATED],
                         ids=[c[0] for c in TOLERATED])  # fmt: skip
def test_streamed_in_any_pieces_equals_one_shot(text, options, canonical, repairs):
    ids = model_ids(text)
    one_shot = parse_ids(ids, options)
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(ids)), min(4, len(ids) - 1)))
        parser = StreamParser(options)
        for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True):
            parser.feed_ids(ids[a:b])
        streamed = parser.finish()
        assert visible(streamed) == visible(one_shot)
        assert [c.repairs for c in streamed.tool_calls] == [c.repairs for c in one_shot.tool_calls]


def test_doubled_bars_around_the_dsml_token_and_text_pieces_of_its_spelling():
    """Token mode: a bar written on each side of the DSML id, and the canonical tags spelled in
    ordinary text pieces (no DSML id at all)."""
    doubled = parse_ids(model_ids("Sure\n\n" + block(f"｜{D}｜")), CHAT)
    check(doubled, "Sure\n\n" + block(), CHAT, [REPAIR_DOUBLED])
    spelled = parse_ids(plain_bpe("Sure\n\n" + block()), CHAT)
    check(spelled, "Sure\n\n" + block(), CHAT, [REPAIR_SPELLED])


@pytest.mark.parametrize(
    ("case", "text", "problem_part"),
    [
        ("mixed-spellings", "Sure\n\n" + block("|DSML|").replace("</|DSML| calls>", f"</{D} calls>"),
         "not closed"),
        ("v4-name-cut-off", "Sure\n\n" + block(name=" tool_calls")[:-20], "not closed"),
        ("bare-invoke-unclosed", "Sure\n\n" + BARE[: -len(f"</{D} invoke>")], "unclosed invoke"),
    ],
)
def test_what_stays_ambiguous_is_no_valid_call(case, text, problem_part):
    for message in (parse_text(text, CHAT), parse_ids(model_ids(text), CHAT)):
        problems = [*message.problems, *(p for c in message.tool_calls for p in c.problems)]
        assert not message.valid and any(problem_part in p for p in problems), problems
        assert D not in message.content and "DSML" not in message.content


def test_a_bare_invoke_cut_off_by_max_tokens_is_not_complete():
    message = parse_text("Sure\n\n" + BARE, CHAT, "length")
    assert any("not closed" in p for p in message.problems)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_outputs())
def test_without_repairs_a_tolerant_parse_is_the_canonical_one(case):
    """Outputs a tolerant parse repairs nothing in parse exactly as without tolerance (and so as
    the official parser, test_parse_recipe.py); V4.1's own spelling never needs a repair."""
    text, options, finish = case
    tolerant = ParsingOptions(**{**options.__dict__, "tolerant": True})
    for parse, data in ((parse_text, text), (parse_ids, model_ids(text))):
        repaired = parse(data, tolerant, finish)
        if not any(c.repairs for c in repaired.tool_calls):
            assert visible(repaired) == visible(parse(data, options, finish))


V4_TAGS = block(name="tool_calls").replace(" invoke", "invoke").replace(" parameter", "parameter")


@pytest.mark.parametrize("text", [SURE + block(), "r</think>" + V4_TAGS], ids=["v41", "v4"])
def test_v41_and_v4_spellings_need_no_repair(text):
    for message in (parse_text(text, TOLERANT), parse_ids(model_ids(text), TOLERANT)):
        assert message.valid and message.tool_calls and not message.tool_calls[0].repairs
        assert visible(message) == visible(parse_text(text, CANONICAL))


# ---- {"arguments": ...} -------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}  # fmt: skip
FREE = {"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}}
DECLARED = declared_parameters([WEATHER, FREE])


def wrapped(value: str, string: bool = False, key: str = "arguments", name: str = "get_weather"):
    kind = "true" if string else "false"
    text = (f'<{D} calls>\n<{D} invoke name="{name}">\n<{D} parameter name="{key}" string="{kind}">{value}'
            f"</{D} parameter>\n</{D} invoke>\n</{D} calls>")  # fmt: skip
    return parse_text(text, CHAT).tool_calls[0]


@pytest.mark.parametrize("string", [False, True])
@pytest.mark.parametrize("key", ["arguments", "input"])
def test_wrapped_arguments_that_fit_the_tool_are_unwrapped_as_written(string, key):
    call = unwrap(wrapped('{"city": "Paris", "days": 3.50}', string, key), DECLARED)
    assert call.arguments == '{"city": "Paris", "days": 3.50}' and call.valid
    assert call.repairs == (repair(key),)


@pytest.mark.parametrize(
    "call",
    [
        wrapped('{"city": "Paris"}', name="free"),  # a tool without declared parameters takes any key
        wrapped("Paris", string=True, key="city"),  # not wrapped
        parse_text(f'<{D} calls>\n<{D} invoke name="get_weather">\n</{D} invoke>\n</{D} calls>', CHAT)
        .tool_calls[0],  # no arguments
    ],
)
def test_other_calls_are_left_as_they_are(call):
    assert unwrap(call, DECLARED) == call


@pytest.mark.parametrize("value", ['{"town": "Paris"}', "[1]", '"Paris"', "not json at all"])
def test_wrapped_arguments_that_do_not_fit_are_flagged(value):
    call = unwrap(wrapped(value, string=value == "not json at all"), DECLARED)
    assert not call.valid and problem("arguments") in call.problems


def test_a_declared_arguments_parameter_is_no_wrapper():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"arguments": {"type": "object"}}}}}]  # fmt: skip
    call = wrapped('{"city": "Paris"}')
    assert unwrap(call, declared_parameters(tools)) == call
    assert json.loads(call.arguments) == {"arguments": {"city": "Paris"}}
