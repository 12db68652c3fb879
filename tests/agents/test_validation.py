"""Schemas validated as declared: the draft of `$schema`, formats asserted, references resolved at
setup (remote ones refused there), NaN/Infinity and numbers beyond a double refused, tool
arguments against the tool's own schema."""

from __future__ import annotations

import pytest
from sglang_ds41.agents import Agent, AgentConfigError, Runner, Tool, function_tool
from sglang_ds41.agents.output import OutputSpec
from sglang_ds41.agents.testing import Reply, by_turn
from sglang_ds41.agents.tools import PreparedCall

DRAFT7 = "http://json-schema.org/draft-07/schema#"


def test_an_omitted_optional_argument_is_a_correct_call():
    @function_tool
    def search(query: str, limit: int = 10) -> str:
        return f"{query}:{limit}"

    assert search.parameters["required"] == ["query", "limit"]  # what the grammar is given
    prepared = search.prepare("c1", '{"query": "x"}')
    assert isinstance(prepared, PreparedCall)
    assert prepared.kwargs == {"query": "x", "limit": 10}
    nulled = search.prepare("c2", '{"query": "x", "limit": null}')
    assert isinstance(nulled, PreparedCall) and nulled.kwargs == {"query": "x", "limit": 10}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_numbers(constant):
    @function_tool
    def scale(factor: float) -> float:
        return factor

    message = scale.prepare("c", f'{{"factor": {constant}}}')
    assert isinstance(message, str) and "not valid JSON" in message and constant.lstrip("-") in message
    spec = OutputSpec.of({"type": "object", "properties": {"x": {"type": "number"}}})
    value, problem = spec.validate(f'{{"x": {constant}}}')
    assert value is None and "not valid JSON" in problem


def test_the_runner_and_the_renderer_refuse_an_overflowing_number_in_the_same_words():
    from sglang_ds41.encoding import render_request
    from sglang_ds41.encoding.errors import EncodingError

    words = "the number 1e400 is beyond the range of a double"
    with pytest.raises(EncodingError) as rendered:
        render_request('{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}')
    spec = OutputSpec.of({"type": "object", "properties": {"x": {"type": "number"}}})
    value, problem = spec.validate('{"x": 1e400}')
    assert words in str(rendered.value) and value is None and words in problem


def test_arguments_nest_at_most_as_deep_as_serde_reads_them():
    """128 levels of lists and objects are arguments; 129 are not (serde_json's limit), nor
    100,000 (past `json.loads`' own recursion): a message for the model, never a RecursionError."""
    tool = tuple_tool({"type": "object"})
    assert isinstance(tool.prepare("c", '{"x": ' + "[" * 127 + "]" * 127 + "}"), PreparedCall)
    for depth in (128, 100_000):
        message = tool.prepare("c", '{"x": ' + "[" * depth + "]" * depth + "}")
        assert isinstance(message, str) and "nested deeper than 128 levels" in message


def test_an_integer_longer_than_python_reads_is_a_message_not_a_crash():
    """Integers stay whole (no float rounding) up to Python's digit limit; past it `int()` raised
    ValueError out of `prepare` and `OutputSpec.validate`, ending the run."""
    tool = tuple_tool({"type": "object"})
    kept = tool.prepare("c", '{"x": ' + "9" * 4300 + "}")
    assert isinstance(kept, PreparedCall) and kept.kwargs["x"] == int("9" * 4300)
    message = tool.prepare("c", '{"x": -' + "9" * 5000 + "}")
    assert message == (
        "Error: the arguments for t are not valid JSON (an integer of 5,000 digits (at most 4,300 are read))."
    )
    value, problem = OutputSpec.of({"type": "object"}).validate('{"n": ' + "1" * 5000 + "}")
    assert value is None and "an integer of 5,000 digits" in problem


def tuple_tool(schema: dict) -> Tool:
    return Tool(name="t", description="", parameters=schema, fn=lambda **kw: kw, strict=False)


def test_a_draft_7_schema_is_validated_by_draft_7_rules():
    # Draft 7: an `items` list types positions and `additionalItems: false` closes the tuple.
    schema = {
        "$schema": DRAFT7,
        "type": "object",
        "properties": {"pair": {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}},
    }
    tool = tuple_tool(schema)
    assert isinstance(tool.prepare("c", '{"pair": [1]}'), PreparedCall)
    message = tool.prepare("c", '{"pair": [1, 2]}')
    assert isinstance(message, str) and "pair" in message
    # The same schema as 2020-12 is not valid (`items` must be one schema), found at setup.
    with pytest.raises(AgentConfigError, match="not a valid draft 2020-12 schema at /properties/pair/items"):
        tuple_tool({k: v for k, v in schema.items() if k != "$schema"})


def test_formats_are_asserted():
    spec = OutputSpec.of(
        {
            "type": "object",
            "properties": {"day": {"type": "string", "format": "date"}, "at": {"format": "date-time"}},
        }
    )
    assert spec.validate('{"day": "2024-02-29", "at": "1998-12-31T23:59:60Z"}')[1] is None
    _, problem = spec.validate('{"day": "2023-02-29"}')
    assert problem is not None and "/day" in problem and "date" in problem


def test_in_document_ids_anchors_and_urns_resolve():
    spec = OutputSpec.of(
        {
            "$id": "urn:example:order",
            "$defs": {"money": {"$anchor": "money", "type": "number", "minimum": 0}},
            "type": "object",
            "properties": {"total": {"$ref": "urn:example:order#money"}},
        }
    )
    assert spec.validate('{"total": 3}')[1] is None
    assert spec.validate('{"total": -3}')[1] is not None


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"$ref": "https://example.com/order.json"}, "'https://example.com/order.json', a document outside"),
        ({"$ref": "#/$defs/missing"}, "pointer '/$defs/missing' leads nowhere"),
        ({"$ref": "#nowhere"}, "no anchor 'nowhere'"),
        ({"$schema": "https://example.com/my-draft"}, "unknown $schema 'https://example.com/my-draft'"),
        # Python's named group, not ECMA-262 (which writes (?<name>...))
        ({"type": "object", "properties": {"a": {"pattern": "(?P<n>x)"}}}, "/properties/a/pattern"),
    ],
)
def test_unusable_output_schemas_are_refused_when_the_agent_is_built(schema, expected):
    with pytest.raises(AgentConfigError) as error:
        Agent(name="a", output_type=schema)
    assert expected in str(error.value)


def test_a_remote_reference_in_a_tool_schema_is_refused_at_setup():
    schema = {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}
    with pytest.raises(
        AgentConfigError, match=r"tool 't' parameters: \$ref 'other.json#/x' at /properties/a/\$ref"
    ):
        tuple_tool(schema)


@pytest.mark.parametrize("number", ["1e400", "-1E+999", "2.5e308"])
def test_a_number_beyond_a_double_never_reaches_a_tool_as_infinity(serve, number):
    seen: list = []

    @function_tool
    def scale(factor: float) -> str:
        """Scale by a factor."""
        seen.append(factor)
        return "ok"

    script = [Reply(tool_calls=[("scale", f'{{"factor": {number}}}')]), Reply(content="done")]
    server = serve(by_turn(script), validate=False)
    agent = Agent(name="a", tools=[scale], thinking=False)
    result = Runner.run_sync(agent, "Scale it.", base_url=server.base_url)
    answer = next(m["content"] for m in result.messages if m["role"] == "tool")
    assert seen == []
    assert f"the number {number} is beyond the range of a double" in answer
    spec = OutputSpec.of({"type": "object", "properties": {"x": {"type": "number"}}})
    value, problem = spec.validate(f'{{"x": {number}}}')
    assert value is None and number in problem
