"""JSON Schema checks on tool parameters and `json_schema` response formats.

The official renderer compiles each schema (meta-schema validation, `$ref` resolution, no
network) and, for tool parameters, also requires `"type": "object"`. We reproduce the
decisions with the `jsonschema` package and `schema_refs` (which references the official renderer
follows, and whether they resolve); messages are our own.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import regex

from .json_text import dumps_compact
from .schema_refs import reference_problem

_ESCAPE = re.compile(r"\\(c[A-Za-z]|.)", re.DOTALL)  # escapes left to right, so `\\c` stays literal
_PROPERTY_ESCAPE = re.compile(r"\\[pP]\{")

# $schema values the official renderer knows (others: "Unknown meta-schema").
KNOWN_METASCHEMAS = {
    f"{scheme}://json-schema.org/{draft}/schema{hash_}"
    for scheme in ("http", "https")
    for draft in ("draft-04", "draft-06", "draft-07", "draft/2019-09", "draft/2020-12")
    for hash_ in ("", "#")
}


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
        cls.check_schema(schema, format_checker=_meta_formats())
    except SchemaError as error:
        return error.message
    return reference_problem(schema)


def _ecma_regex(pattern: object) -> bool:
    """A `pattern` (or `patternProperties` key) the official renderer compiles.

    It reads ECMA-262 syntax, which Python's `re` lacks in two places the JSON-Schema-Test-Suite
    uses: control escapes (`\\cC`, rewritten to the character they stand for) and Unicode
    properties (`\\p{Letter}`, read with the `regex` package, which knows the same names). Only
    the verdict matters: the renderer never matches an instance against these patterns.
    """
    if not isinstance(pattern, str):
        return True
    text = _ESCAPE.sub(_plain_control, pattern)
    try:
        if _PROPERTY_ESCAPE.search(text):
            regex.compile(text)
        else:
            re.compile(text)
    except (re.error, regex.error):
        return False
    return True


def _plain_control(match: re.Match[str]) -> str:
    escape = match.group(1)
    if len(escape) == 2 and escape[0] == "c":
        return f"\\x{ord(escape[1].upper()) - 64:02x}"
    return match.group(0)


@cache
def _meta_formats() -> Any:
    """The formats checked while validating a schema against its meta-schema: only `regex`.

    Explicit, so that installing jsonschema's format extras (the agent runner asserts instance
    formats with them) cannot change which schemas the renderer accepts.
    """
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    checker.checks("regex")(_ecma_regex)
    return checker
