"""function_tool: schema from type hints and docstrings, argument validation, error texts."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
import pytest
from sglang_ds41.agents import AgentConfigError, ToolContext, function_tool
from sglang_ds41.agents.tools import parse_docstring, result_text


def test_schema_from_hints_and_google_docstring_is_strict_normal_form():
    @function_tool
    def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
        """Get the weather forecast.

        Longer text that the model also sees.

        Args:
            city: The city name,
                e.g. Paris.
            unit: Temperature unit.
            days: How many days.
        """
        return city

    # Hand-written expectation: closed object, all properties required, defaults -> nullable + note.
    assert get_weather.to_openai() == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast. Longer text that the model also sees.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name, e.g. Paris."},
                    "unit": {
                        "anyOf": [{"type": "string", "enum": ["c", "f"]}, {"type": "null"}],
                        "description": 'Temperature unit. Default: "c".',
                    },
                    "days": {
                        "anyOf": [{"type": "integer"}, {"type": "null"}],
                        "description": "How many days. Default: 1.",
                    },
                },
                "additionalProperties": False,
                "required": ["city", "unit", "days"],
            },
        },
    }


def test_null_for_a_defaulted_argument_means_the_default():
    @function_tool
    def f(a: int, b: int = 7) -> int:
        return a + b

    call = f.prepare("c1", '{"a": 1, "b": null}')
    assert call.kwargs == {"a": 1, "b": 7}
    assert f.invoke(call.kwargs, ToolContext("c1", "f")) == 8


class Point(pydantic.BaseModel):
    x: float
    y: float


class Node(pydantic.BaseModel):
    children: list[Node]


def test_nested_models_are_inlined_without_defs():
    @function_tool
    def dist(p: Point, q: Point) -> float:
        return abs(p.x - q.x) + abs(p.y - q.y)

    params = dist.parameters
    assert "$defs" not in str(params) and "$ref" not in str(params)
    assert params["properties"]["p"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "additionalProperties": False,
        "required": ["x", "y"],
    }
    call = dist.prepare("c", '{"p": {"x": 1, "y": 2}, "q": {"x": 4, "y": 6}}')
    assert isinstance(call.kwargs["p"], Point)
    assert dist.invoke(call.kwargs, ToolContext("c", "dist")) == 7


def test_recursive_model_is_refused_with_a_clear_error():
    with pytest.raises(AgentConfigError, match="recursive type 'Node'"):

        @function_tool
        def walk(tree: Node) -> int:
            return 0


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": 1', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('{"a": "x"}', "a: 'x' is not of type 'integer'"),
        ("{}", "'a' is a required property"),
        ('{"a": 1, "zzz": 2}', "Additional properties are not allowed"),
    ],
)
def test_bad_arguments_become_a_short_message_not_an_exception(arguments, expected):
    @function_tool
    def f(a: int) -> int:
        return a

    message = f.prepare("c", arguments)
    assert isinstance(message, str)
    assert message.startswith("Error:") and expected in message
    assert "Traceback" not in message


def test_annotated_field_constraints_reach_the_schema_and_the_check():
    """`Annotated[str, Field(pattern=...)]` is how pydantic, openai-agents and pydantic-ai users
    constrain an argument; the constraints were once dropped with the hints' metadata."""

    @function_tool
    def book(
        code: Annotated[str, pydantic.Field(pattern="^[A-Z]{3}$")],
        seats: Annotated[int, pydantic.Field(ge=1, le=9)],
    ) -> str:
        """Book seats.

        Args:
            code: Airport code.
            seats: How many.
        """
        return f"{code} {seats}"

    properties = book.parameters["properties"]
    assert properties["code"] == {"description": "Airport code.", "type": "string", "pattern": "^[A-Z]{3}$"}
    assert properties["seats"] == {"description": "How many.", "type": "integer", "minimum": 1, "maximum": 9}
    refused = [
        ('{"code": "lis", "seats": 2}', "does not match"),
        ('{"code": "LIS", "seats": 12}', "12 is greater than the maximum of 9"),
    ]
    for arguments, problem in refused:
        message = book.prepare("c", arguments)
        assert isinstance(message, str) and problem in message
    assert not isinstance(book.prepare("c", '{"code": "LIS", "seats": 2}'), str)


def test_annotated_context_and_field_descriptions_and_unreadable_patterns():
    @function_tool
    def note(
        ctx: Annotated[ToolContext, "the run's"], text: Annotated[str, pydantic.Field(description="What.")]
    ) -> str:
        """Note something."""
        return text

    assert note.context_param == "ctx"  # not a parameter the model is asked for
    assert note.parameters["properties"] == {"text": {"description": "What.", "type": "string"}}

    # A lookahead is ECMA-262 but not pydantic's (Rust) regex dialect. (Hints are strings here,
    # `from __future__ import annotations`: the pattern is written out, not a local name.)
    with pytest.raises(AgentConfigError, match=r"tool 'secret': pydantic cannot build .*look-around"):

        @function_tool
        def secret(word: Annotated[str, pydantic.Field(pattern="^(?=.*[0-9]).{8,}$")]) -> str:
            """Keep a word."""
            return word

    @function_tool
    def secret2(
        word: Annotated[str, pydantic.Field(json_schema_extra={"pattern": "^(?=.*[0-9]).{8,}$"})],
    ) -> str:
        """Keep a word."""
        return word

    assert "does not match" in secret2.prepare("c", '{"word": "abcdefgh"}')
    assert not isinstance(secret2.prepare("c", '{"word": "abcdefg1"}'), str)


def test_tool_context_parameter_is_hidden_from_the_schema_and_passed_in():
    @function_tool
    def note(text: str, ctx: ToolContext) -> str:
        return f"{ctx.call_id}:{text}"

    assert list(note.parameters["properties"]) == ["text"]
    call = note.prepare("call_9", '{"text": "hi"}')
    assert note.invoke(call.kwargs, ToolContext("call_9", "note")) == "call_9:hi"


@pytest.mark.parametrize("bad", ["has space", "", "x" * 129, "dot.name"])
def test_tool_names_follow_the_deepseek_pattern(bad):
    def f() -> None:
        return None

    with pytest.raises(AgentConfigError, match="must match"):
        function_tool(f, name=bad)


def test_missing_type_hint_and_var_kwargs_are_config_errors():
    def untyped(a):
        return a

    def varargs(**kw: int) -> None:
        return None

    with pytest.raises(AgentConfigError, match="needs a type hint"):
        function_tool(untyped)
    with pytest.raises(AgentConfigError, match=r"\*args/\*\*kwargs"):
        function_tool(varargs)


def test_sphinx_docstrings_are_read():
    summary, params = parse_docstring("Do it.\n\n:param x: the x value\n:param int y: the y\n:returns: z")
    assert summary == "Do it."
    assert params == {"x": "the x value", "y": "the y"}


def test_result_text_is_text_or_json():
    class M(pydantic.BaseModel):
        a: int

    assert result_text("plain") == "plain"
    assert result_text({"t": 21.5, "ok": True}) == '{"t": 21.5, "ok": true}'
    assert result_text(M(a=1)) == '{"a":1}'
    assert result_text(None) == "null"
