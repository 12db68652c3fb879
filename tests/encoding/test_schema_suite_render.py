"""The renderer accepts and refuses exactly the JSON Schemas the official renderer does.

Sources: every schema of the official JSON-Schema-Test-Suite (drafts 4, 6, 7, 2019-09, 2020-12,
vendored under tests/agents/data), sent as a `json_schema` response format and, when it is an
object schema, as a tool's parameters; plus probes of the reference rules schema_refs.py
describes (which keywords are compiled, what the registry holds, URI syntax).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .oracle import assert_same

SUITE = Path(__file__).parents[1] / "agents" / "data" / "json-schema-test-suite" / "tests"
MODEL = "DeepSeek-V4.1-Flash"
D7 = "http://json-schema.org/draft-07/schema#"
D4 = "http://json-schema.org/draft-04/schema#"


def _suite_files() -> list[Path]:
    files = sorted(SUITE.rglob("*.json"))
    assert len(files) > 200, f"the vendored suite is missing: {len(files)} files under {SUITE}"
    return files


def response_body(schema: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def tool_body(schema: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
    }


@pytest.mark.parametrize("path", _suite_files(), ids=lambda p: str(p.relative_to(SUITE)))
def test_suite_schemas_get_the_official_verdict(path: Path) -> None:
    for group in json.loads(path.read_text()):
        schema = group["schema"]
        assert_same(response_body(schema), ids=False)
        if isinstance(schema, dict) and schema.get("type") == "object":
            assert_same(tool_body(schema), ids=False)


PROBES: dict[str, Any] = {
    "unreferenced $defs with a dangling pointer": {"$defs": {"a": {"$ref": "#/nope"}}},
    "unreferenced $defs naming another document": {"$defs": {"a": {"$ref": "other.json"}}},
    "a $ref inside an unknown keyword": {"foo": {"$ref": "http://x.y/z"}},
    "a $ref inside an enum value": {"enum": [{"$ref": "http://x.y/z"}]},
    "the draft's own meta-schema": {"$ref": "https://json-schema.org/draft/2020-12/schema"},
    "a vocabulary meta-schema": {"$ref": "https://json-schema.org/draft/2020-12/meta/core"},
    "another draft's meta-schema": {"$ref": "http://json-schema.org/draft-07/schema#"},
    "draft 7 referring to its own meta-schema": {"$schema": D7, "$ref": D7},
    "an $anchor": {"$defs": {"a": {"$anchor": "foo"}}, "$ref": "#foo"},
    "a missing anchor": {"$ref": "#foo"},
    "an $anchor inside an enum is no anchor": {"enum": [{"$anchor": "foo"}], "$ref": "#foo"},
    "a $dynamicRef to a missing pointer": {"$dynamicRef": "#/nope"},
    "a $dynamicRef to another document": {"$dynamicRef": "http://x.y/z"},
    "a URN base": {
        "$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed",
        "$defs": {"a": {"type": "string"}},
        "properties": {"x": {"$ref": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed#/$defs/a"}},
    },
    "a relative $id": {"$id": "http://e.com/r.json", "$defs": {"a": {"$id": "a.json"}}, "$ref": "a.json"},
    "a relative $ref to nothing": {"$id": "http://e.com/r.json", "$ref": "b.json"},
    "a pointer inside an embedded resource": {
        "$id": "http://e.com/r.json",
        "$defs": {"a": {"$id": "a.json", "$defs": {"b": {}}}},
        "$ref": "a.json#/$defs/b",
    },
    "a $ref in 2020-12 dependencies": {"dependencies": {"a": {"$ref": "#/nope"}}},
    "a $ref in contentSchema": {"contentSchema": {"$ref": "#/nope"}},
    "a $ref in if without then": {"if": {"$ref": "#/nope"}},
    "a $ref in if with then": {"if": {"$ref": "#/nope"}, "then": {}},
    "a $ref in additionalItems without items": {"additionalItems": {"$ref": "#/nope"}},
    "draft 7: a $ref's siblings are ignored": {
        "$schema": D7,
        "$ref": "#/definitions/a",
        "definitions": {"a": {}},
        "properties": {"x": {"$ref": "#/nope"}},
    },
    "draft 7: dependentSchemas is unknown": {"$schema": D7, "dependentSchemas": {"a": {"$ref": "#/nope"}}},
    "draft 4: an id": {
        "$schema": D4,
        "definitions": {"a": {"id": "http://e.com/a"}},
        "$ref": "http://e.com/a",
    },
    "a pointer to an enum value compiles it": {"$ref": "#/enum/0", "enum": [{"$ref": "#/nope"}]},
    "a word as a list index": {"$ref": "#/allOf/x", "allOf": [{}]},
    "a space in a $ref": {"$ref": "#/$defs/a b", "$defs": {"a b": {}}},
    "a percent-encoded space": {"$ref": "#/$defs/a%20b", "$defs": {"a b": {}}},
    "an $id without a scheme": {"$id": "::not a uri"},
    "ECMA control escape": {"pattern": "^\\cC$"},
    "escaped backslash before c": {"pattern": "^\\\\cC$"},
    "bad control escape": {"pattern": "\\c1"},
    "Unicode property": {"patternProperties": {"\\p{Letter}": {}}},
    "unknown Unicode property": {"pattern": "\\p{Bogus}"},
}


@pytest.mark.parametrize("schema", PROBES.values(), ids=PROBES.keys())
def test_reference_probes_get_the_official_verdict(schema: Any) -> None:
    assert_same(response_body(schema), ids=False)
