"""`strict: true` tools: the schema rewrite and the strict-only request rules match the
official renderer (prompt and token ids, or the rejection's status)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_ds41.encoding.strict_schema import StrictSchemaError, strict_parameters

from tests.encoding.oracle import assert_same, wheel

M = "DeepSeek-V4.1-Flash"
S = {"type": "string"}


def request(parameters: Any, *more_tools: dict[str, Any], strict: Any = True, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": "f", "strict": strict}
    if parameters is not ...:
        function["parameters"] = parameters
    return {
        "model": M,
        "messages": [{"role": "user", "content": "use json"}],
        "tools": [{"type": "function", "function": function}, *more_tools],
        "thinking": {"type": "disabled"},
        **extra,
    }


def prop(schema: Any) -> dict[str, Any]:
    """A top-level object holding `schema` as its only property."""
    return {"type": "object", "properties": {"a": schema}}


def other_tool(strict: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": "g", "parameters": prop(S)}
    if strict is not ...:
        function["strict"] = strict
    return {"type": "function", "function": function}


KITCHEN_SINK_STRING = {
    "examples": ["e"],
    "maxLength": 3,
    "enum": ["a", "b"],
    "format": "email",
    "title": "t",
    "minLength": 1,
    "default": "q",
    "pattern": "^[a-z]+$",
    "description": "d",
    "type": "string",
    "const": "a",
    "contentEncoding": "base64",
}
NUMBER_SLOTS = {
    "multipleOf": 2,
    "exclusiveMaximum": 9,
    "exclusiveMinimum": 0,
    "maximum": 5.5,
    "minimum": -1,
    "default": 3,
    "const": 1e20,
    "description": "n",
    "enum": [3],
    "title": "t",
    "format": "float",
}

ACCEPTED = {
    "minimal object": {"type": "object", "properties": {"a": S}},
    "empty top-level object": {"type": "object", "properties": {}},
    "top-level object without properties": {"type": "object"},
    "properties null": {"type": "object", "properties": None},
    "absent parameters": ...,
    "null parameters": None,
    "required in another order": {
        "type": "object",
        "properties": {"b": S, "a": S, "c": S},
        "required": ["c", "a", "b"],
    },
    "required and additionalProperties null": {
        "type": "object",
        "properties": {"a": S},
        "required": None,
        "additionalProperties": None,
    },
    "additionalProperties false": {"type": "object", "properties": {"a": S}, "additionalProperties": False},
    "root keywords dropped": {
        "description": "D",
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "x",
        "title": "T",
        "default": {},
        "examples": [{}],
        "enum": 3,
        "const": {},
        "minProperties": -1,
        "patternProperties": {"x": S},
        "required": ["a"],
        "additionalProperties": False,
        "properties": {"a": S},
        "type": "object",
        "$defs": {"X": S},
        "definitions": {"Y": S},
        "strict": True,
        "nullable": True,
        "anyOf": 3,
        "$ref": 3,
    },
    "string slots and order": prop(KITCHEN_SINK_STRING),
    "string formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f} for f in ("email", "hostname", "ipv4", "ipv6", "uuid")
        },
    },
    "format as unit map": prop({"type": "string", "format": {"email": None}}),
    "format as empty-map unit": prop({"type": "string", "format": {"uuid": {}}}),
    "string nulls dropped": prop(
        {"type": "string", "format": None, "pattern": None, "enum": None, "description": None}
    ),
    "empty enum and empty description": prop({"type": "string", "enum": [], "description": ""}),
    "number slots and order": prop({"type": "number", **NUMBER_SLOTS}),
    "integer slots": prop({"type": "integer", **NUMBER_SLOTS, "const": -(2**63), "maximum": 2**63 - 1}),
    "number takes u64": prop({"type": "number", "minimum": 2**64 - 1, "maximum": -0.0}),
    "boolean and null": {
        "type": "object",
        "properties": {
            "b": {"type": "boolean", "description": "d", "default": True, "enum": [True], "title": "t"},
            "n": {"type": "null", "description": "d", "default": None},
        },
    },
    "array keeps items only": prop(
        {
            "type": "array",
            "items": {"type": "string", "minLength": 2},
            "minItems": 1,
            "uniqueItems": True,
            "description": "d",
            "prefixItems": [S],
        }
    ),
    "nested objects": prop(
        {
            "type": "object",
            "title": "x",
            "description": "dd",
            "minProperties": 1,
            "properties": {
                "b": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]},
                },
            },
        }
    ),
    "anyOf": prop(
        {
            "anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}],
            "description": "d",
            "title": "t",
            "default": None,
        }
    ),
    "empty anyOf": prop({"anyOf": []}),
    "type wins over anyOf": prop({"type": "string", "anyOf": [S, {"type": "null"}]}),
    "anyOf wins over $ref": prop({"anyOf": [S], "$ref": 3}),
    "type list": prop(
        {"type": ["string", "null"], "description": "d", "minLength": 1, "enum": ["a"], "format": "nope"}
    ),
    "type list edge forms": {
        "type": "object",
        "properties": {
            "e": {"type": []},
            "d": {"type": ["string", "string"]},
            "m": {"type": [{"integer": None}, "boolean"]},
        },
    },
    "$ref kept, $defs dropped": {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/X", "description": 3}},
        "$defs": {"X": prop(S)},
    },
    "dangling and external $ref": {
        "type": "object",
        "properties": {"a": {"$ref": "#/nope"}, "b": {"$ref": "http://x/y"}},
    },
    "non-ascii names": {"type": "object", "properties": {"é 中": S, "": {"type": "integer"}}},
}

REJECTED = {
    "partial required": {"type": "object", "properties": {"a": S, "b": S}, "required": ["a"]},
    "empty required": prop(S) | {"required": []},
    "required names a missing property": {"type": "object", "properties": {"a": S}, "required": ["a", "c"]},
    "duplicate required": {"type": "object", "properties": {"a": S, "b": S}, "required": ["a", "a", "b"]},
    "required not a list": prop(S) | {"required": "a"},
    "required entry not a string": prop(S) | {"required": ["a", 3]},
    "additionalProperties true": prop(S) | {"additionalProperties": True},
    "additionalProperties a schema": prop(S) | {"additionalProperties": S},
    "nested object without properties": prop({"type": "object"}),
    "nested object with empty properties": prop({"type": "object", "properties": {}}),
    "object without properties in anyOf": prop({"anyOf": [{"type": "object", "properties": None}]}),
    "object without properties as items": prop({"type": "array", "items": {"type": "object"}}),
    "nested partial required": prop(
        {"type": "array", "items": {"anyOf": [{"type": "object", "properties": {"z": S}, "required": []}]}}
    ),
    "properties a list": {"type": "object", "properties": []},
    "property not a schema": {"type": "object", "properties": {"a": 3}},
    "empty property schema": prop({}),
    "enum without type": prop({"enum": ["a", "b"]}),
    "const without type": prop({"const": "a"}),
    "unknown type": prop({"type": "String"}),
    "type null": prop({"type": None}),
    "type a number": prop({"type": 3}),
    "type a unit map": prop({"type": {"string": None}}),
    "object in a type list": prop({"type": ["object", "null"]}),
    "array in a type list": prop({"type": ["array"]}),
    "type list entry with empty map": prop({"type": [{"string": {}}]}),
    "type list entry a number": prop({"type": ["string", 3]}),
    "unknown format": prop({"type": "string", "format": "date-time"}),
    "format in capitals": prop({"type": "string", "format": "EMAIL"}),
    "format map with two keys": prop({"type": "string", "format": {"email": None, "uuid": None}}),
    "format map with a value": prop({"type": "string", "format": {"email": 1}}),
    "format map with a list": prop({"type": "string", "format": {"email": []}}),
    "format a number": prop({"type": "string", "format": 3}),
    "enum with a number": prop({"type": "string", "enum": [1, "a"]}),
    "enum a string": prop({"type": "string", "enum": "a"}),
    "pattern a number": prop({"type": "string", "pattern": 3}),
    "description a number": prop({"type": "string", "description": 3}),
    "anyOf description a number": prop({"anyOf": [S], "description": 3}),
    "type list description a number": prop({"type": ["string"], "description": 3}),
    "object description a list": {"type": "object", "properties": {"a": S}, "description": []},
    "integer slot a float": prop({"type": "integer", "minimum": 1.0}),
    "integer slot beyond i64": prop({"type": "integer", "maximum": 2**63}),
    "number slot a boolean": prop({"type": "number", "minimum": True}),
    "number slot a string": prop({"type": "number", "default": "3"}),
    "array without items": prop({"type": "array"}),
    "array items null": prop({"type": "array", "items": None}),
    "array items a list": prop({"type": "array", "items": [S]}),
    "array items true": prop({"type": "array", "items": True}),
    "anyOf null beside $ref": prop({"anyOf": None, "$ref": "#"}),
    "anyOf not a list": prop({"anyOf": S}),
    "$ref null": prop({"$ref": None}),
    "$ref a number": prop({"$ref": 3}),
    "top level a string schema": {"type": "string"},
    "top level anyOf": {"anyOf": [{"type": "object", "properties": {}}]},
    "top level $ref": {"$ref": "#/x"},
    "top level type list": {"type": ["object", "null"]},
    "top level empty": {},
    "top level a list": [],
    "top level a string": "x",
    "top level true": True,
}


@pytest.mark.parametrize("parameters", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_strict_schema_is_rewritten_like_the_official_renderer(parameters: Any) -> None:
    got = assert_same(request(parameters))
    assert not got.rejected


@pytest.mark.parametrize("parameters", REJECTED.values(), ids=REJECTED.keys())
def test_strict_schema_is_rejected_like_the_official_renderer(parameters: Any) -> None:
    got = assert_same(request(parameters))
    assert got.rejected and got.status == 400


def test_strict_false_leaves_the_schema_as_given() -> None:
    schema = prop(KITCHEN_SINK_STRING)
    assert not assert_same(request(schema, strict=False)).rejected
    assert '"minLength": 1' in wheel(request(schema, strict=False), ids=False).prompt  # type: ignore[operator]


def test_strict_schema_skips_json_schema_validation() -> None:
    # Non-strict, `enum: 3` fails meta-schema validation; strict, it is simply dropped.
    schema = prop(S) | {"enum": 3}
    assert assert_same(request(schema, strict=None)).rejected
    assert not assert_same(request(schema)).rejected


REQUEST_LEVEL = {
    "strict with non-strict": request(prop(S), other_tool(...)),
    "strict with strict false": request(prop(S), other_tool(False)),
    "strict with strict null": request(prop(S), other_tool(None)),
    "two strict tools": request(prop(S), other_tool(True)),
    "mixed, but tool_choice none": request(prop(S), other_tool(...), tool_choice="none"),
    "invalid strict schema, but tool_choice none": request({"type": "string"}, tool_choice="none"),
    "mixed, named choice of the non-strict tool": request(
        prop(S), other_tool(...), tool_choice={"type": "function", "function": {"name": "g"}}
    ),
    "mixed, named choice of the strict tool": request(
        prop(S), other_tool(...), tool_choice={"type": "function", "function": {"name": "f"}}
    ),
    "invalid strict schema of a tool not chosen": request(
        prop(S) | {"required": []},
        other_tool(True),
        tool_choice={"type": "function", "function": {"name": "g"}},
    ),
    "mixed, required choice": request(prop(S), other_tool(...), tool_choice="required"),
    "strict with response_format text": request(prop(S), response_format={"type": "text"}),
    "strict with response_format json_object": request(prop(S), response_format={"type": "json_object"}),
    "strict with response_format regex": request(prop(S), response_format={"type": "regex", "regex": "a"}),
    "strict with response_format json_schema": request(
        prop(S), response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": prop(S)}}
    ),
    "strict with response_format null": request(prop(S), response_format=None),
    "non-strict tool chosen, response_format text": request(
        prop(S),
        other_tool(...),
        response_format={"type": "text"},
        tool_choice={"type": "function", "function": {"name": "g"}},
    ),
    "strict tools, response_format, tool_choice none": request(
        prop(S),
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": S}},
        tool_choice="none",
    ),
    "duplicate strict names": request(
        prop(S), {"type": "function", "function": {"name": "f", "strict": True}}
    ),
    "strict in thinking mode": request(prop(S)) | {"thinking": {"type": "enabled"}},
}


@pytest.mark.parametrize("body", REQUEST_LEVEL.values(), ids=REQUEST_LEVEL.keys())
def test_strict_request_rules_match_the_official_renderer(body: dict[str, Any]) -> None:
    assert_same(body)


@pytest.mark.parametrize("strict", [True, False, None])
def test_response_format_schema_is_shown_as_given_whatever_its_strict_flag(strict: Any) -> None:
    schema = {"title": "T", "type": "object", "properties": {"a": {"type": "string", "minLength": 1}}}
    got = assert_same(request(..., strict=None) | {"response_format": json_schema_format(schema, strict)})
    assert (
        '{"title": "T", "type": "object", "properties": {"a": {"type": "string", "minLength": 1}}}'
        in got.prompt
    )  # type: ignore[operator]


def json_schema_format(schema: Any, strict: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "r", "strict": strict, "schema": schema}}


STRICT_RESPONSE_SCHEMAS = {
    "valid": prop({"type": "string", "minLength": 1}),
    "keywords JSON Schema refuses": prop(S) | {"enum": 3, "minProperties": -1},
    "dangling $ref": prop({"$ref": "#/nope"}),
    "partial required": {"type": "object", "properties": {"a": S, "b": S}, "required": ["a"]},
    "additionalProperties true": prop(S) | {"additionalProperties": True},
    "unknown format": prop({"type": "string", "format": "date-time"}),
    "top level not an object": {"type": "string"},
    "top level anyOf": {"anyOf": [{"type": "object", "properties": {"a": S}}]},
    "top level object without properties": {"type": "object"},
    "top level object with empty properties": {"type": "object", "properties": {}},
    "null schema": None,
    "boolean schema": True,
    "nested object without properties": prop({"type": "object"}),
}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("schema", STRICT_RESPONSE_SCHEMAS.values(), ids=STRICT_RESPONSE_SCHEMAS.keys())
def test_strict_response_schema_is_checked_like_the_official_renderer(schema: Any, strict: bool) -> None:
    assert_same(request(..., strict=None) | {"response_format": json_schema_format(schema, strict)})


def test_strict_parameters_names_the_offending_path() -> None:
    with pytest.raises(StrictSchemaError, match=r"parameters\.properties\.a\.items\.format"):
        strict_parameters(prop({"type": "array", "items": {"type": "string", "format": "date"}}))


# --- generated schemas ------------------------------------------------------------------------

EXTRA_KEYWORDS = st.fixed_dictionaries(
    {},
    optional={
        "title": st.sampled_from(["t", 3]),
        "default": st.sampled_from([None, "x", 3, 1.5, True]),
        "examples": st.just(["e"]),
        "minLength": st.sampled_from([1, -1, "x"]),
        "maxItems": st.just(3),
        "minimum": st.sampled_from([0, 1.5, -(2**63), 2**63, "x", None]),
        "maximum": st.sampled_from([10, 1e20, 2**64 - 1]),
        "const": st.sampled_from([None, 1, "c", 2.0]),
        "multipleOf": st.sampled_from([2, 0.5]),
        "enum": st.sampled_from([["a", "b"], [1], [], None]),
        "format": st.sampled_from(["email", "uuid", "date-time", {"ipv4": None}, None]),
        "pattern": st.sampled_from(["^a", None]),
        "$defs": st.just({"X": S}),
        "nullable": st.just(True),
        "description": st.sampled_from(["d", "", None, "«é»\n"]),
    },
)
NAMES = st.sampled_from(["a", "b", "city", "é", "x y", ""])


@st.composite
def strict_schemas(draw: st.DrawFn, depth: int = 0, typed: bool = False) -> Any:
    """A mostly well-formed strict schema at any nesting level, with stray keywords.

    `typed`: an `anyOf` entry, which must name a single type (mostly respected).
    """
    leaf = ["string", "number", "integer", "boolean", "null"]
    if not typed or draw(st.integers(0, 9)) == 0:
        leaf += ["list", "ref"]
    kinds = leaf if depth >= 3 else [*leaf, "object", "object", "array", "anyOf"]
    if typed and "list" not in leaf:
        kinds = [k for k in kinds if k != "anyOf"]
    kind = draw(st.sampled_from(kinds))
    extra = draw(EXTRA_KEYWORDS)
    if kind == "object":
        names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
        properties = {name: draw(strict_schemas(depth + 1)) for name in names}
        node = {"type": "object", "properties": properties}
        required = draw(st.sampled_from(["all", "shuffled", "absent", "partial"]))
        if required == "all":
            node["required"] = names
        elif required == "shuffled":
            node["required"] = draw(st.permutations(names))
        elif required == "partial" and draw(st.integers(0, 3)) == 0:
            node["required"] = names[1:]
        if draw(st.integers(0, 4)) == 0:
            node["additionalProperties"] = draw(st.sampled_from([False, None, True]))
    elif kind == "array":
        node = {"type": "array", "items": draw(strict_schemas(depth + 1))}
    elif kind == "anyOf":
        node = {"anyOf": draw(st.lists(strict_schemas(depth + 1, typed=True), max_size=3))}
    elif kind == "list":
        node = {
            "type": draw(
                st.lists(st.sampled_from(["string", "null", "integer", "number", "boolean"]), max_size=3)
            )
        }
    elif kind == "ref":
        node = {"$ref": "#/$defs/X"}
    else:
        node = {"type": kind}
    if kind in ("number", "integer") and draw(st.booleans()):
        extra.pop("enum", None)  # keep most numeric schemas free of a string enum (not an error anyway)
    if kind == "string" and draw(st.integers(0, 2)):
        extra = {k: v for k, v in extra.items() if k not in ("format", "enum")} | {"format": "email"}
    merged = dict(node)
    for key, value in extra.items():
        if key not in merged:
            merged[key] = value
    order = draw(st.permutations(list(merged)))
    return {key: merged[key] for key in order}


@st.composite
def strict_tool_requests(draw: st.DrawFn) -> dict[str, Any]:
    """One or two strict tools, or (one time in five) a strict json_schema response format."""
    schemas = []
    for _ in range(draw(st.integers(1, 2))):
        names = draw(st.lists(NAMES, max_size=3, unique=True))
        properties = {name: draw(strict_schemas(1)) for name in names}
        schemas.append({"type": "object", "properties": properties} | draw(EXTRA_KEYWORDS))
    body: dict[str, Any] = {"model": M, "messages": [{"role": "user", "content": "hi"}]}
    if draw(st.integers(0, 4)) == 0:
        body["response_format"] = json_schema_format(schemas[0], True)
        return body
    body["tools"] = [
        {"type": "function", "function": {"name": f"t{i}", "strict": True, "parameters": parameters}}
        for i, parameters in enumerate(schemas)
    ]
    return body


SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck)}


@settings(max_examples=200, derandomize=True, **SETTINGS)
@given(strict_tool_requests())
def test_generated_strict_schemas_match_the_official_renderer(body: dict[str, Any]) -> None:
    assert_same(body, ids=False)


@pytest.mark.slow
@settings(max_examples=3_000, **SETTINGS)
@given(strict_tool_requests())
def test_many_generated_strict_schemas_match_the_official_renderer(body: dict[str, Any]) -> None:
    assert_same(body)


RAW_NUMBER_SLOTS = {
    "number literals keep their printed form": '"number", "minimum": 1.50, "maximum": 1e3, "const": -0',
    "integer slot with -0": '"integer", "minimum": -0',
    "integer slot with 1e2": '"integer", "maximum": 1e2',
    "integer slot at i64 min": '"integer", "minimum": -9223372036854775808',
    "integer slot at i64 max": '"integer", "maximum": 9223372036854775807',
    "number slot beyond u64": '"number", "default": 100000000000000000000000000000',
}


@pytest.mark.parametrize("members", RAW_NUMBER_SLOTS.values(), ids=RAW_NUMBER_SLOTS.keys())
def test_number_literals_in_strict_slots_match_the_official_renderer(members: str) -> None:
    """Sent as JSON text, so the literals reach both renderers verbatim."""
    parameters = '{"type": "object", "properties": {"a": {"type": ' + members + "}}}"
    tool = '{"type": "function", "function": {"name": "f", "strict": true, "parameters": ' + parameters + "}}"
    assert_same(f'{{"model": "{M}", "messages": [{{"role": "user", "content": "hi"}}], "tools": [{tool}]}}')


def test_strict_parameters_writes_the_canonical_key_order() -> None:
    schema = {
        "required": ["b", "a"],
        "description": "top",
        "properties": {
            "a": {"format": "uuid", "minLength": 1, "enum": ["x"], "description": "id", "type": "string"},
            "b": {"items": {"type": "integer", "maximum": 3, "enum": [1]}, "type": "array", "minItems": 1},
        },
        "title": "T",
        "type": "object",
    }
    assert strict_parameters(schema) == {
        "type": "object",
        "properties": {
            "a": {"type": "string", "description": "id", "format": "uuid", "enum": ["x"]},
            "b": {"type": "array", "items": {"type": "integer", "maximum": 3}},
        },
        "additionalProperties": False,
        "required": ["a", "b"],
        "description": "top",
    }
    assert list(strict_parameters(schema)) == [
        "type",
        "properties",
        "additionalProperties",
        "required",
        "description",
    ]
    assert list(strict_parameters(schema)["properties"]["a"]) == ["type", "description", "format", "enum"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": S}, "required": []},
        {"type": "object", "properties": {"a": S}, "additionalProperties": True},
        {"type": "string"},
        prop({"anyOf": [{"$ref": "#"}]}),
    ],
)
def test_strict_parameters_refuses_with_a_strict_schema_error(schema: Any) -> None:
    with pytest.raises(StrictSchemaError) as raised:
        strict_parameters(schema)
    assert raised.value.status_code == 400
