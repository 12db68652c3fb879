"""The output parser against the official one (deepseek-recipe 0.2.0 StreamProcessor).

Visible fields (reasoning, content, call names and arguments, finish reason) must equal the
official result; where we deliberately differ (parse.py docstring) the test asserts the flag.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parse import parse_ids, parse_text
from sglang_ds41.encoding.stream import BARE_BLOCK_BEGIN

from .parse_oracle import D, model_ids, model_outputs, plain_bpe, recipe_parse, visible

THINK = ParsingOptions(thinking=True)
CHAT = ParsingOptions(thinking=False)
TOOLS = ParsingOptions(thinking=True, parse_tool_calls=True)
CHAT_TOOLS = ParsingOptions(thinking=False, parse_tool_calls=True)
REQUIRED = ParsingOptions(thinking=False, parse_tool_calls=True, starts_in_tool_calls=True)
JSON = ParsingOptions(thinking=False, parse_json_output=True)
REASONING_PREFIX = ParsingOptions(thinking=True, reasoning_started=True)
CONTENT_PREFIX = ParsingOptions(thinking=True, in_content=True)


def call(name: str, *params: str, v4: bool = False, close: bool = True) -> str:
    tag = "invoke" if v4 else " invoke"
    return f'<{D}{tag} name="{name}">\n' + "\n".join(params) + ("\n" + f"</{D}{tag}>" if close else "")


def param(key: str, value: str, string: bool = True, v4: bool = False) -> str:
    tag = "parameter" if v4 else " parameter"
    kind = "true" if string else "false"
    return f'<{D}{tag} name="{key}" string="{kind}">{value}</{D}{tag}>'


def block(*invokes: str, v4: bool = False) -> str:
    tag = "tool_calls" if v4 else " calls"
    return f"<{D}{tag}>\n" + "\n".join(invokes) + f"\n</{D}{tag}>"


WEATHER = call("get_weather", param("city", "Paris"), param("days", "3", string=False))

# (case id, completion text, options, finish reason, expected: valid / a problem substring)
CORPUS = [
    # reasoning whitespace
    ("reasoning-leading-newlines", "\n\nhmm </think>x", THINK, "stop", True),
    ("reasoning-trailing-newlines", "hmm\n\n</think>x", THINK, "stop", True),
    ("reasoning-trailing-spaces-kept", "hmm \t\n</think>x", THINK, "stop", True),
    ("reasoning-crlf-kept", "\r\nhmm\r\n</think>\r\nx", THINK, "stop", True),
    ("reasoning-unclosed", "\n\nstill thinking\n", THINK, "stop", "inside reasoning"),
    ("reasoning-unclosed-length", "still thinking", THINK, "length", "inside reasoning"),
    ("reasoning-think-start-kept", "<think>r</think>x", THINK, "stop", True),
    ("reasoning-prefix-keeps-newlines", "\n\nmore\n</think>\n\nx", REASONING_PREFIX, "stop", True),
    ("content-prefix-keeps-newlines", "\n\nmore</think>\n\nx", CONTENT_PREFIX, "stop", True),
    # content
    ("content-leading-newlines", "r</think>\n\n x \n\n", THINK, "stop", True),
    ("content-think-end-deleted", "r</think>A1</think>A2", THINK, "stop", True),
    ("content-think-end-then-newlines", "r</think>\n</think>\n\nB", THINK, "stop", True),
    ("chat-think-end-deleted", "Hello</think>World", CHAT, "stop", True),
    ("chat-leading-newlines", "\n \nHello", CHAT, "stop", True),
    ("chat-partial-think-end-flushed", "x</thi", CHAT, "stop", True),
    ("special-ids-verbatim", "r</think>x<｜end▁of▁sentence｜><｜User｜>", THINK, "stop", True),
    ("dsml-without-tools-is-content", "r</think>Sure\n\n" + block(WEATHER), THINK, "stop", True),
    ("ascii-dsml-is-content", "Sure\n\n<|DSML| calls>", CHAT_TOOLS, "stop", True),
    # tool calls
    ("call-basic", "r</think>Sure\n\n\n" + block(WEATHER), TOOLS, "stop", True),
    ("call-no-content", "r</think>\n\n" + block(WEATHER), TOOLS, "stop", True),
    ("call-content-trailing-space", "r</think>Sure \n\n" + block(WEATHER), TOOLS, "stop", True),
    ("call-two", block(WEATHER, call("f")), CHAT_TOOLS, "stop", True),
    ("call-empty-invoke", block(call("f")), CHAT_TOOLS, "stop", True),
    ("call-string-escaped", block(call("f", param("q", 'a "b"\n\\c\t<｜User｜>'))), CHAT_TOOLS, "stop", True),
    (
        "call-raw-number-verbatim",
        block(call("f", param("n", "1E3", False), param("z", "-0", False))),
        CHAT_TOOLS,
        "stop",
        True,
    ),
    (
        "call-raw-json",
        block(call("f", param("o", '{"b":1, "a":[1.50,1e3]}', False))),
        CHAT_TOOLS,
        "stop",
        True,
    ),
    (
        "call-raw-garbage",
        block(call("f", param("x", "not json", False))),
        CHAT_TOOLS,
        "stop",
        "not valid JSON",
    ),
    ("call-raw-nan", block(call("f", param("x", "NaN", False))), CHAT_TOOLS, "stop", "not valid JSON"),
    (
        "call-duplicate-keys",
        block(call("f", param("a", "1", False), param("a", "2", False))),
        CHAT_TOOLS,
        "stop",
        "duplicate",
    ),
    ("call-name-escaped-kept", block(call("f", param("a&quot;b", "1", False))), CHAT_TOOLS, "stop", True),
    ("call-undeclared-name", block(call("no_such_tool")), CHAT_TOOLS, "stop", True),
    ("call-in-reasoning", "thinking\n\n" + block(WEATHER), TOOLS, "stop", True),
    ("call-v4-tags", block(call("f", param("a", "x", v4=True), v4=True), v4=True), CHAT_TOOLS, "stop", True),
    ("call-bare-invoke", "Sure\n\n" + WEATHER, CHAT_TOOLS, "stop", "tool-call block not closed"),
    (
        "call-self-closing",
        f'<{D} calls>\n<{D} invoke name="x"/>\n</{D} calls>',
        CHAT_TOOLS,
        "stop",
        "unexpected text",
    ),
    (
        "call-json-body",
        block(f'<{D} invoke name="f">{{"a": 1}}</{D} invoke>'),
        CHAT_TOOLS,
        "stop",
        "unexpected text",
    ),
    (
        "call-extra-invoke-attribute",
        block(f'<{D} invoke name="f" id="1">\n</{D} invoke>'),
        CHAT_TOOLS,
        "stop",
        "unexpected text",
    ),
    (
        "call-extra-param-attribute",
        block(call("f", f'<{D} parameter name="a" type="s" string="true">x</{D} parameter>')),
        CHAT_TOOLS,
        "stop",
        "unexpected attribute",
    ),
    (
        "call-unknown-string-kind",
        block(call("f", f'<{D} parameter name="a" string="yes">x</{D} parameter>')),
        CHAT_TOOLS,
        "stop",
        "not valid JSON",
    ),
    (
        "call-single-quoted-name",
        block(f"<{D} invoke name='f'>\n</{D} invoke>"),
        CHAT_TOOLS,
        "stop",
        "ignored text",
    ),
    ("call-stray-text-between", block(WEATHER, "junk", call("f")), CHAT_TOOLS, "stop", "ignored text"),
    ("call-text-after-block", block(WEATHER) + "\nBye", CHAT_TOOLS, "stop", "discarded"),
    (
        "call-second-block-discarded",
        block(WEATHER) + "\n\n" + block(call("g")),
        CHAT_TOOLS,
        "stop",
        "discarded",
    ),
    ("call-missing-calls-close", f"<{D} calls>\n" + WEATHER, CHAT_TOOLS, "stop", "not closed"),
    (
        "call-truncated-value",
        block(call("f", param("city", "Paris")))[:-60],
        CHAT_TOOLS,
        "length",
        "truncated at max_tokens",
    ),
    (
        "call-unclosed-invoke-stop",
        f"<{D} calls>\n" + call("f", param("a", "1", False), close=False),
        CHAT_TOOLS,
        "stop",
        "unclosed invoke",
    ),
    (
        "call-cut-in-name",
        f'Hi\n\n<{D} calls>\n<{D} invoke name="get_wea',
        CHAT_TOOLS,
        "length",
        "inside its name",
    ),
    ("partial-tag-withheld", f"Hello <{D} cal", CHAT_TOOLS, "length", "not closed"),
    ("partial-dsml-prefix-flushed", "Hello <｜DSML", CHAT_TOOLS, "stop", True),
    ("required-calls", WEATHER + f"\n</{D} calls>", REQUIRED, "stop", True),
    ("required-plain-text", "I will not call a tool.", REQUIRED, "stop", "ignored text"),
    # json_object
    ("json-fenced", 'Here:\n```json\n{"a": 1}\n```\nBye', JSON, "stop", True),
    ("json-bare-with-tail", 'pre {"a": 1} post', JSON, "stop", True),
    ("json-bare", '{"a":1}', JSON, "stop", True),
    ("json-none", "no json", JSON, "stop", True),
    ("json-array-after-text", "x\n\n[1,2]\n```\nz", JSON, "stop", True),
    ("json-think-end-in-text", 'a</think>b {"x": "</think>"}', JSON, "stop", True),
    (
        "json-then-call",
        "a\n```json\n1\n```\n\n" + block(WEATHER),
        ParsingOptions(thinking=False, parse_json_output=True, parse_tool_calls=True),
        "stop",
        True,
    ),
]


def check_flag(message, expected) -> None:
    problems = list(message.problems) + [p for c in message.tool_calls for p in c.problems]
    if expected is True:
        assert message.valid, problems
    else:
        assert not message.valid
        assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("text", "options", "finish", "expected"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS]
)
def test_text_mode_matches_recipe_and_flags_problems(text, options, finish, expected):
    message = parse_text(text, options, finish)
    assert visible(message) == recipe_parse([text], options, finish)
    check_flag(message, expected)


@pytest.mark.parametrize(
    ("text", "options", "finish", "expected"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS]
)
def test_token_mode_matches_recipe(text, options, finish, expected):
    ids = model_ids(text)
    message = parse_ids(ids, options, finish)
    assert visible(message) == recipe_parse([ids], options, finish, ids=True)
    check_flag(message, expected)


def test_bpe_spelled_markers_stay_text_in_token_mode():
    ids = (
        model_ids("r</think>x")
        + plain_bpe("</think>y")
        + model_ids(f"\n\n<{D} calls>")
        + plain_bpe(f"<{D} x")
    )
    message = parse_ids(ids, TOOLS)
    assert (message.reasoning_content, message.content) == ("r", "x</think>y")
    assert visible(message) == recipe_parse([ids], TOOLS, ids=True)
    text_mode = parse_text("r</think>x</think>y", TOOLS)
    assert text_mode.content == "xy"


def test_bpe_spelled_closing_tag_stays_inside_a_value():
    text = block(call("f", f'<{D} parameter name="a" string="true">v</{D} parameter>'))
    ids = (
        model_ids(text.split("v</")[0] + "v")
        + plain_bpe(f"</{D} parameter>")
        + model_ids("x</" + text.split("v</", 1)[1])
    )
    message = parse_ids(ids, CHAT_TOOLS)
    assert message.tool_calls[0].arguments == '{"a": "v</｜DSML｜ parameter>x"}'
    assert visible(message) == recipe_parse([ids], CHAT_TOOLS, ids=True)


def test_json_spacing_is_chunking_independent_unlike_recipe():
    """Deliberate difference 2: the official result depends on the chunking, ours does not."""
    from sglang_ds41.encoding.stream import StreamParser

    pieces = ["no", " json"]
    parser = StreamParser(JSON)
    for piece in pieces:
        parser.feed_text(piece)
    assert parser.finish().content == " " == recipe_parse(["no json"], JSON)[1]
    assert recipe_parse(pieces, JSON)[1] == "  "


def test_truncated_utf8_keeps_the_text_before_it():
    """Deliberate difference 3: upstream also loses 'x' here; we keep it and report the cut."""
    ids = model_ids("r</think>x") + plain_bpe("🦜")[:1]
    message = parse_ids(ids, THINK, "length")
    assert message.content == "x"
    assert any("UTF-8" in problem for problem in message.problems)
    assert recipe_parse([ids], THINK, "length", ids=True)[1] == ""


def test_a_genuine_replacement_character_is_kept():
    """Deliberate difference 3: upstream's token decoder takes a real U+FFFD at the end for a
    half-written character and drops the text decoded since the last special token."""
    ids = model_ids("a\ufffd")
    assert parse_ids(ids, CHAT, "stop").content == "a\ufffd" == recipe_parse(["a\ufffd"], CHAT, "stop")[1]
    assert recipe_parse([ids], CHAT, "stop", ids=True)[1] == ""


def _differential(case) -> None:
    text, options, finish = case
    from_text = recipe_parse([text], options, finish)
    assert visible(parse_text(text, options, finish)) == from_text
    ids = model_ids(text)
    message = parse_ids(ids, options, finish)
    ours, theirs = visible(message), recipe_parse([ids], options, finish, ids=True)
    if "\ufffd" in text:
        # Difference 3 (above): upstream's token mode loses text around a real U+FFFD; token
        # mode must then give what upstream gives for the text itself.
        theirs = from_text
    same = _squeeze_spaces if options.parse_json_output else (lambda result: result)
    # Known gap (parse.py difference 2): in json_object output upstream's count of blanking spaces
    # around special tokens follows its internal piece batching, which we only approximate.
    if BARE_BLOCK_BEGIN in message.problems:
        # Difference 5: a DSML id that is not part of "<D" opened the block. Upstream must give
        # the same message once one such id is made the opening tag.
        results = _with_tag_restored(text, options, finish, ids="\ufffd" not in text)
        theirs = next((r for r in results if same(r) == same(ours)), results[0] if results else None)
    assert same(ours) == (same(theirs) if theirs is not None else "no DSML id to restore")


def _with_tag_restored(text: str, options: ParsingOptions, finish: str, *, ids: bool) -> list:
    """Upstream's parses of `text` with one DSML that does not follow "<" made the opening tag
    (a "<" put before it; the "</" of a stray closing tag made "<"), one per such DSML."""
    results = []
    at = text.find(D)
    while at >= 0:
        head = text[:at]
        if not head.endswith("<"):
            fixed = (head[:-2] if head.endswith("</") else head) + "<" + text[at:]
            pieces = [model_ids(fixed)] if ids else [fixed]
            results.append(recipe_parse(pieces, options, finish, ids=ids))
        at = text.find(D, at + 1)
    return results


def _squeeze_spaces(result):
    reasoning, content, calls, finish = result
    return reasoning, re.sub(" +", " ", content), calls, finish


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_outputs())
def test_generated_outputs_match_recipe(case):
    _differential(case)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_outputs())
def test_generated_outputs_match_recipe_long(case):
    _differential(case)
