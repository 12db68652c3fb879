"""Malformed model output is never returned as a clean-looking result: each case is flagged."""

from __future__ import annotations

import json

import pytest
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.errors import EncodingError
from sglang_ds41.encoding.parse import parse_ids, parse_text
from sglang_ds41.encoding.stream import BARE_BLOCK_BEGIN, StreamParser, seeded_tool_call_ids

from .parse_oracle import D, model_ids

TOOLS = ParsingOptions(thinking=False, parse_tool_calls=True)
CHAT = ParsingOptions(thinking=False)
GOOD = f'<{D} invoke name="ok">\n<{D} parameter name="a" string="true">x</{D} parameter>\n</{D} invoke>'


def parse_block(*invokes: str, finish: str = "stop"):
    text = f"<{D} calls>\n" + "\n".join(invokes) + f"\n</{D} calls>"
    return parse_text(text, TOOLS, finish)


def only_bad_call(message, problem: str):
    bad = [c for c in message.tool_calls if not c.valid]
    assert len(bad) == 1, message
    assert any(problem in p for p in bad[0].problems), bad[0].problems
    assert all(c.valid for c in message.tool_calls if c.name == "ok")
    assert not message.valid


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("not json", "not valid JSON"),
        ("NaN", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1,", "not valid JSON"),
    ],
)
def test_raw_value_that_is_not_json_invalidates_the_call(value, problem):
    p = f'<{D} parameter name="x" string="false">{value}</{D} parameter>'
    bad = f'<{D} invoke name="f">\n{p}\n</{D} invoke>'
    message = parse_block(GOOD, bad)
    assert message.tool_calls[1].arguments == '{"x": ' + value + "}"  # the official text, kept
    only_bad_call(message, problem)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_value_nested_past_pythons_recursion_limit_invalidates_the_call(depth):
    """Model output is untrusted: arrays nested past what `json.loads` can recurse through are
    a flagged call, in one shot and streamed, never a RecursionError."""
    value = "[" * depth + "]" * depth
    p = f'<{D} parameter name="x" string="false">{value}</{D} parameter>'
    bad = f'<{D} invoke name="f">\n{p}\n</{D} invoke>'
    only_bad_call(parse_block(GOOD, bad), "nested too deeply")
    parser = StreamParser(TOOLS, tool_call_id=seeded_tool_call_ids(0))
    parser.feed_text(f"<{D} calls>\n{GOOD}\n{bad}\n</{D} calls>")
    assert [c.valid for c in parser.closed_calls()] == [True, False]


def test_duplicate_keys_invalidate_the_call():
    p = f'<{D} parameter name="a" string="false">1</{D} parameter>'
    message = parse_block(f'<{D} invoke name="f">\n{p}\n{p}\n</{D} invoke>')
    assert message.tool_calls[0].arguments == '{"a": 1, "a": 1}'
    only_bad_call(message, "duplicate parameter name 'a'")


def test_call_cut_by_max_tokens_is_flagged_as_truncated():
    text = f'<{D} calls>\n{GOOD}\n<{D} invoke name="f">\n<{D} parameter name="city" string="true">Par'
    message = parse_text(text, TOOLS, "length")
    assert message.finish_reason == "length"
    assert message.tool_calls[1].arguments == '{"city": "Par'
    only_bad_call(message, "call truncated at max_tokens")


def test_unclosed_invoke_at_stop_is_flagged():
    message = parse_text(f'<{D} calls>\n<{D} invoke name="f">\n', TOOLS, "stop")
    assert message.tool_calls[0].problems[0] == "unclosed invoke"


@pytest.mark.parametrize(
    "invoke",
    [
        f'<{D} invoke name="f" extra="1">\n</{D} invoke>',
        f'<{D} invoke name="f">{{"a": 1}}</{D} invoke>',
        f'<{D} invoke name="f">\nstray words\n</{D} invoke>',
    ],
)
def test_unknown_attributes_or_bodies_in_an_invoke_are_flagged(invoke):
    message = parse_block(GOOD, invoke)
    assert message.tool_calls[1].arguments == "{}"
    only_bad_call(message, "unexpected text inside the invoke")


def test_unknown_parameter_attribute_is_flagged():
    p = f'<{D} parameter name="a" kind="x" string="true">v</{D} parameter>'
    message = parse_block(f'<{D} invoke name="f">\n{p}\n</{D} invoke>')
    assert json.loads(message.tool_calls[0].arguments) == {"a": "v"}
    only_bad_call(message, "unexpected attribute text in parameter 'a'")


def test_parameter_name_with_a_space_is_flagged():
    p = f'<{D} parameter name="a b" string="true">v</{D} parameter>'
    message = parse_block(f'<{D} invoke name="f">\n{p}\n</{D} invoke>')
    assert message.tool_calls[0].arguments == '{"a: "v"}'  # upstream cuts the key at the space
    only_bad_call(message, "not a quoted name")


def test_single_quoted_invoke_is_dropped_but_reported():
    message = parse_block(GOOD, f"<{D} invoke name='f'>\n</{D} invoke>")
    assert [c.name for c in message.tool_calls] == ["ok"]
    assert any("ignored text in the tool-call block" in p for p in message.problems)
    assert not message.valid


def test_text_after_the_block_is_reported():
    message = parse_text(f"<{D} calls>\n{GOOD}\n</{D} calls>\nAnything else?", TOOLS)
    assert message.content == ""
    assert any("discarded" in p for p in message.problems)


def test_whitespace_after_the_block_is_fine():
    message = parse_text(f"Sure\n\n<{D} calls>\n{GOOD}\n</{D} calls>\n\n", TOOLS)
    assert message.valid and message.content == "Sure" and message.finish_reason == "tool_calls"


@pytest.mark.parametrize("options", [TOOLS, ParsingOptions(thinking=True, parse_tool_calls=True)])
def test_a_dsml_id_without_its_lt_opens_the_block_and_is_reported(options):
    """parse.py difference 5: the id only begins a tag, so the block after it is parsed as calls
    (never left in content or reasoning as DSML), whichever stage it comes in."""
    prefix = "" if options is TOOLS else "hmm</think>"
    ids = model_ids(f"{prefix}Sure\n\n{D} calls>\n{GOOD}\n</{D} calls>")
    message = parse_ids(ids, options)
    assert message.content == "Sure" and "DSML" not in message.reasoning_content
    assert [(c.name, c.arguments, c.valid) for c in message.tool_calls] == [("ok", '{"a": "x"}', True)]
    assert BARE_BLOCK_BEGIN in message.problems and not message.valid
    for stray_text in (f"Sure {D} then text", f"Sure </{D} calls>"):  # no "<", a stray closing tag
        stray = parse_ids(model_ids(stray_text), TOOLS)
        assert stray.content == "Sure " and BARE_BLOCK_BEGIN in stray.problems, stray_text
    # Without tools the id is text, as spelled text always is (text mode cannot tell them apart).
    assert parse_ids(model_ids(f"Sure {D} then"), CHAT).content == f"Sure {D} then"
    assert parse_text(f"Sure {D} calls>", TOOLS).content == f"Sure {D} calls>"


def test_ids_are_reproducible_with_a_seed_and_shaped_like_upstream():
    one = parse_block(GOOD, GOOD)
    assert [c.id[:8] for c in one.tool_calls] == ["call_00_", "call_01_"]
    assert all(len(c.id) == 8 + 24 and c.id[8:].isalnum() for c in one.tool_calls)
    a = parse_text(f"<{D} calls>\n{GOOD}", TOOLS, tool_call_id=seeded_tool_call_ids(7))
    b = parse_text(f"<{D} calls>\n{GOOD}", TOOLS, tool_call_id=seeded_tool_call_ids(7))
    assert a.tool_calls[0].id == b.tool_calls[0].id


def test_bad_inputs_raise_encoding_errors():
    with pytest.raises(EncodingError, match="finish_reason"):
        parse_text("x", TOOLS, "tool_calls")
    with pytest.raises(EncodingError, match="not in the tokenizer"):
        parse_ids([10**7], TOOLS)
    with pytest.raises(EncodingError, match="integers"):
        parse_ids(["a"], TOOLS)
    with pytest.raises(EncodingError, match="got a string"):
        parse_ids("abc", TOOLS)


def test_openai_shape():
    message = parse_text(
        f"r</think>Sure\n\n<{D} calls>\n{GOOD}\n</{D} calls>", ParsingOptions(parse_tool_calls=True)
    )
    out = message.to_openai()
    assert out["role"] == "assistant" and out["content"] == "Sure" and out["reasoning_content"] == "r"
    (tool_call,) = out["tool_calls"]
    assert tool_call["type"] == "function"
    assert tool_call["function"] == {"name": "ok", "arguments": '{"a": "x"}'}
    assert "tool_calls" not in parse_text("hi", TOOLS).to_openai()
