"""Streaming gives the one-shot result for every split of the output, in text and token mode."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parse import parse_ids, parse_text
from sglang_ds41.encoding.stream import (
    ContentDelta,
    ReasoningDelta,
    StreamParser,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    seeded_tool_call_ids,
)

from .parse_oracle import D, model_ids, model_outputs

TOOLS = ParsingOptions(thinking=True, parse_tool_calls=True)
SAMPLE = (
    "\n\nLet me think </thi </think>\n\nSure</think>!\n\n"
    f'<{D} calls>\n<{D} invoke name="get_weather">\n'
    f'<{D} parameter name="city" string="true">Pa"ris 猫</{D} parameter>\n'
    f'<{D} parameter name="days" string="false">3</{D} parameter>\n</{D} invoke>\n</{D} calls>'
)


def streamed(pieces, options, finish="stop", ids=False):
    parser = StreamParser(options, tool_call_id=seeded_tool_call_ids(1))
    deltas = []
    for piece in pieces:
        deltas += parser.feed_ids(piece) if ids else parser.feed_text(piece)
    deltas += parser.flush()
    return deltas, parser.finish(finish)


def rebuild(deltas):
    """The message a client assembles from the deltas alone."""
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    calls = {d.index: [d.name, ""] for d in deltas if isinstance(d, ToolCallStart)}
    for d in deltas:
        if isinstance(d, ToolCallArgumentsDelta):
            calls[d.index][1] += d.text
    return reasoning, content, [tuple(c) for c in calls.values()]


def one_shot(text, options, finish="stop"):
    return parse_text(text, options, finish, tool_call_id=seeded_tool_call_ids(1))


def test_every_single_split_of_text_gives_the_one_shot_message():
    expected = one_shot(SAMPLE, TOOLS)
    assert expected.tool_calls[0].arguments == '{"city": "Pa\\"ris 猫", "days": 3}'
    for cut in range(len(SAMPLE) + 1):
        deltas, message = streamed([SAMPLE[:cut], SAMPLE[cut:]], TOOLS)
        assert message == expected, cut
        assert rebuild(deltas) == (
            message.reasoning_content,
            message.content,
            [("get_weather", message.tool_calls[0].arguments)],
        )


def test_every_single_split_of_ids_gives_the_one_shot_message():
    ids = model_ids(SAMPLE)
    expected = parse_ids(ids, TOOLS, tool_call_id=seeded_tool_call_ids(1))
    assert expected == one_shot(SAMPLE, TOOLS)
    for cut in range(len(ids) + 1):
        _, message = streamed([ids[:cut], ids[cut:]], TOOLS, ids=True)
        assert message == expected, cut


def test_character_by_character_streaming_withholds_partial_tags():
    parser = StreamParser(ParsingOptions(thinking=False, parse_tool_calls=True))
    assert parser.feed_text("Hello <｜DS") == [ContentDelta("Hello ")]
    assert parser.feed_text("ML｜ calls>\n") == []
    out = parser.feed_text(f'<{D} invoke name="f">\n</{D} invoke>')
    assert [type(d) for d in out] == [ToolCallStart, ToolCallArgumentsDelta, ToolCallEnd]
    assert parser.finish().finish_reason == "tool_calls"


def test_trailing_newlines_are_held_until_decided():
    parser = StreamParser(ParsingOptions(thinking=True))
    assert parser.feed_text("abc\n\n") == [ReasoningDelta("abc")]
    assert parser.feed_text("</think>x") == [ContentDelta("x")]
    assert parser.finish().reasoning_content == "abc"


def test_a_parser_takes_one_kind_of_input():
    import pytest
    from sglang_ds41.encoding.errors import EncodingError

    parser = StreamParser(TOOLS)
    parser.feed_text("a")
    with pytest.raises(EncodingError, match="either text pieces or token ids"):
        parser.feed_ids([1])


@st.composite
def split_outputs(draw):
    text, options, finish = draw(model_outputs())
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return text, options, finish, pieces


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_outputs())
def test_random_splits_give_the_one_shot_message(case):
    text, options, finish, pieces = case
    expected = one_shot(text, options, finish)
    deltas, message = streamed(pieces, options, finish)
    assert message == expected
    calls = [(c.name, c.arguments) for c in message.tool_calls]
    assert rebuild(deltas) == (message.reasoning_content, message.content, calls)
    ids = model_ids(text)
    cuts = sorted({len(ids) * k // 4 for k in range(5)})
    id_pieces = [ids[a:b] for a, b in itertools.pairwise(cuts)]
    _, from_ids = streamed(id_pieces, options, finish, ids=True)
    assert from_ids == parse_ids(ids, options, finish, tool_call_id=seeded_tool_call_ids(1))
