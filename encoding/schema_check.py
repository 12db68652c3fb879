"""JSON Schema checks on tool parameters and `json_schema` response formats.

The official renderer compiles each schema (meta-schema validation, `$ref` resolution, no
network) and, for tool parameters, also requires `"type": "object"`. We reproduce the
decisions with the `jsonschema` package and a local `$ref` walk; messages are our own.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .json_text import dumps_compact

# $schema values the official renderer knows (others: "Unknown meta-schema").
KNOWN_METASCHEMAS = {
    f"{scheme}://json-schema.org/{draft}/schema{hash_}"
    for scheme in ("http", "https")
    for draft in ("draft-04", "draft-06", "draft-07", "draft/2019-09", "draft/2020-12")
    for hash_ in ("", "#")
}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = (
    "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems", "items",
)  # fmt: skip


def schema_problem(schema: Any, *, require_object: bool) -> str | None:
    """Why the official renderer would refuse `schema`, or None.

    Agent loops resend the same tool schemas on every step, and meta-schema validation is the
    most expensive part of rendering, so verdicts are memoised by the schema's exact `repr`.
    """
    try:
        key = (repr(schema), require_object)  # repr keeps int vs str keys and 1 vs 1.0 vs True apart
    except RecursionError:
        return _schema_problem(schema, require_object)
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _MAX_VERDICTS:
            _VERDICTS.pop(next(iter(_VERDICTS)))
        _VERDICTS[key] = _schema_problem(schema, require_object)
    return _VERDICTS[key]


# Pure memoisation (schema text -> verdict): it changes no result, only how often we validate.
_VERDICTS: dict[tuple[str, bool], str | None] = {}
_MAX_VERDICTS = 1024


def _schema_problem(schema: Any, require_object: bool) -> str | None:
    if require_object:
        declared = schema.get("type") if isinstance(schema, dict) else None
        if declared != "object":
            shown = "null" if declared is None else dumps_compact(declared)
            return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: {shown}'."
    if not isinstance(schema, (dict, bool)):
        return f'{dumps_compact(schema)} is not of types "boolean", "object"'
    if isinstance(schema, bool):
        return None
    meta = schema.get("$schema")
    if meta is not None and meta not in KNOWN_METASCHEMAS:
        return f"Unknown meta-schema: {meta!r}"
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import SchemaError

    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as error:
        return error.message
    return _ref_problem(schema, schema)


def _ref_problem(node: Any, root: dict[str, Any]) -> str | None:
    if not isinstance(node, dict):
        return None
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#"):
            return f"Resource {ref!r} is not present in a registry and retrieving it failed"
        if not _pointer_exists(root, ref[1:]):
            return f"Pointer {ref[1:]!r} does not exist"
    children: list[Any] = []
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            children.extend(node[key].values())
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            children.extend(node[key])
    for key in _SCHEMA_VALUES:
        value = node.get(key)
        children.extend(value if key == "items" and isinstance(value, list) else [value])
    for child in children:
        problem = _ref_problem(child, root)
        if problem is not None:
            return problem
    return None


def _pointer_exists(root: Any, pointer: str) -> bool:
    pointer = unquote(pointer)
    if not pointer:
        return True
    if not pointer.startswith("/"):
        return False
    node = root
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True
