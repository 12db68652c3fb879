"""`strict: true` tool parameters -> the canonical schema the prompt shows (ENCODING.md §2.6).

The official renderer does not validate a strict schema as JSON Schema at all (no meta-schema
check, no `$ref` resolution): it reads it into a small typed model and writes that model back.
Whatever the model has no slot for disappears from the prompt, and a value of the wrong type in
a slot rejects the request (400). Rules, characterised black-box against deepseek-recipe 0.2.0:

* A schema is a JSON object with `type`, else `anyOf`, else `$ref` (checked in that order; the
  key's presence decides, even with a null value). Anything else is an error.
* `type` a string: one of object/string/number/integer/boolean/array/null. Output key order:
  - object: `type, properties, additionalProperties: false, required, description`.
    `properties` (absent/null = none) maps names to schemas and keeps their order.
    `additionalProperties` must be absent, null or false. `required` absent/null means all
    properties; otherwise every entry must name a property, appear once, and cover all of
    them; it is rewritten in property order. Only the top-level object may have no properties.
  - string: `type, description, pattern, format, enum` (`enum`: strings only; `format`: one of
    email/hostname/ipv4/ipv6/uuid, also as `{"email": null}` or `{"email": {}}`).
  - number / integer: `type, description, const, default, minimum, maximum, exclusiveMinimum,
    exclusiveMaximum, multipleOf`; number slots take any JSON number, integer slots only
    integers in the i64 range (`1.0` is refused). `enum` is dropped.
  - array: `type, items, description`; `items` is required and is a single schema.
  - boolean / null: `type, description`.
* `type` a list: each entry one of string/number/integer/boolean/null (or `{"string": null}`);
  output `type, description`. Empty and repeated lists are kept.
* `anyOf`: a list of schemas that each have a single `type` name (no type list, `anyOf` or
  `$ref` entry; their own properties and items are full schemas again); output
  `anyOf, description`.
* `$ref`: a string, kept verbatim even when nothing defines it; output `$ref` alone.
* `description` (every form but `$ref`) must be a string or null; null is dropped.
* Every other keyword (title, default on strings, examples, minLength, $defs, ...) is dropped
  without being looked at. Only the slots of the form that was chosen are type-checked.
* The top level must come out as an object schema. For tool parameters it may have no
  properties, and absent/null parameters become
  `{"type": "object", "properties": {}, "additionalProperties": false, "required": []}`.
  A strict `json_schema` response format is checked by the same rules, except that its
  top-level object needs properties and null is refused; its prompt text is not rewritten.

Request-level rules, applied in `request.py`: with `tool_choice: "none"` nothing is checked;
every declared strict tool is rewritten (even one a named choice leaves out); after the named
choice narrows the list, strict and non-strict tools together are refused, and so are strict
tools with any non-null `response_format` (even `text`).
"""

from __future__ import annotations

from typing import Any

from .errors import EncodingError
from .serde_checks import describe

TYPES = ("object", "string", "number", "integer", "boolean", "array", "null")
LIST_TYPES = ("string", "number", "integer", "boolean", "null")
FORMATS = ("email", "hostname", "ipv4", "ipv6", "uuid")
NUMBER_SLOTS = (
    "const", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
)  # fmt: skip
I64 = (-(2**63), 2**63 - 1)


class StrictSchemaError(EncodingError):
    """A strict tool schema the official renderer refuses (always HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=400)


def strict_parameters(schema: Any) -> dict[str, Any]:
    """The canonical form of a strict tool's `parameters` (None when absent)."""
    if schema is None:
        return {"type": "object", "properties": {}, "additionalProperties": False, "required": []}
    return _top_object(schema, "parameters", may_be_empty=True)


def strict_response_schema(schema: Any) -> dict[str, Any]:
    """The canonical form of a strict `json_schema` response format.

    Only its verdict matters for the prompt, which shows the schema as given (§2.10). Unlike
    tool parameters, the top-level object needs properties and a null schema is refused.
    """
    return _top_object(schema, "schema", may_be_empty=False)


def _top_object(schema: Any, path: str, may_be_empty: bool) -> dict[str, Any]:
    result = _schema(schema, path, top=may_be_empty)
    if result.get("type") != "object":
        raise StrictSchemaError(
            f"{path}: the top level of a strict schema must be an object schema"
            f' ("type": "object"), got {_form(result)}'
        )
    return result


def _form(result: dict[str, Any]) -> str:
    if "anyOf" in result:
        return "an anyOf schema"
    if "$ref" in result:
        return "a $ref schema"
    return f"type {result['type']!r}"


def _fail(path: str, problem: str) -> StrictSchemaError:
    return StrictSchemaError(f"{path}: {problem}")


def _schema(node: Any, path: str, top: bool = False) -> dict[str, Any]:
    if not isinstance(node, dict) or not ("type" in node or "anyOf" in node or "$ref" in node):
        raise _fail(path, f"a strict schema needs one of `type`, `anyOf`, `$ref`, got {_shape(node, 'them')}")
    if "type" in node:
        kind = node["type"]
        if isinstance(kind, (list, tuple)):
            types = [_list_type(t, f"{path}.type[{i}]") for i, t in enumerate(kind)]
            return _with_description({"type": types}, node, path)
        return _typed(node, path, top)
    if "anyOf" in node:
        options = node["anyOf"]
        if not isinstance(options, (list, tuple)):
            raise _fail(f"{path}.anyOf", f"expected a list of schemas, got {describe(options)}")
        variants = [_typed(option, f"{path}.anyOf[{i}]") for i, option in enumerate(options)]
        return _with_description({"anyOf": variants}, node, path)
    ref = node["$ref"]
    if not isinstance(ref, str):
        raise _fail(f"{path}.$ref", f"expected a string, got {describe(ref)}")
    return {"$ref": ref}


def _typed(node: Any, path: str, top: bool = False) -> dict[str, Any]:
    """A schema with a single `type` name: the only form an `anyOf` entry may take."""
    if not isinstance(node, dict) or "type" not in node:
        raise _fail(path, f"expected a schema with a `type`, got {_shape(node, 'one')}")
    kind = node["type"]
    if not isinstance(kind, str) or kind not in TYPES:
        raise _fail(f"{path}.type", f"expected one of {', '.join(TYPES)}, got {describe(kind)}")
    return _TYPED[kind](node, path, top)


def _shape(node: Any, missing: str) -> str:
    return f"an object without {missing}" if isinstance(node, dict) else describe(node)


def _with_description(out: dict[str, Any], node: dict[str, Any], path: str) -> dict[str, Any]:
    description = _optional_str(node, "description", path)
    if description is not None:
        out["description"] = description
    return out


def _optional_str(node: dict[str, Any], key: str, path: str) -> str | None:
    value = node.get(key)
    if value is not None and not isinstance(value, str):
        raise _fail(f"{path}.{key}", f"expected a string, got {describe(value)}")
    return value


def _unit_variant(value: Any, names: tuple[str, ...], path: str, empty_map_is_unit: bool) -> str:
    """A serde unit-enum value: "name", or {"name": null} (and {"name": {}} where serde allows)."""
    if isinstance(value, dict):
        if len(value) != 1:
            raise _fail(path, f"expected a single-key map, got a map with {len(value)} keys")
        ((value, unit),) = value.items()
        if not (unit is None or (empty_map_is_unit and unit == {})):
            raise _fail(path, f"expected null after {value!r}, got {describe(unit)}")
    if not isinstance(value, str) or value not in names:
        raise _fail(path, f"expected one of {', '.join(names)}, got {describe(value)}")
    return value


def _list_type(value: Any, path: str) -> str:
    return _unit_variant(value, LIST_TYPES, path, empty_map_is_unit=False)


def _object(node: dict[str, Any], path: str, top: bool) -> dict[str, Any]:
    raw = node.get("properties")
    if raw is not None and not isinstance(raw, dict):
        raise _fail(f"{path}.properties", f"expected a map of schemas, got {describe(raw)}")
    properties = {name: _schema(value, f"{path}.properties.{name}") for name, value in (raw or {}).items()}
    additional = node.get("additionalProperties")
    if additional is not None and not isinstance(additional, bool):
        raise _fail(f"{path}.additionalProperties", f"expected a boolean, got {describe(additional)}")
    if additional:
        raise _fail(f"{path}.additionalProperties", "must not be true in a strict schema")
    required = _required(node.get("required"), properties, path)
    if not properties and not top:
        raise _fail(path, "an object without properties is not allowed below the top level")
    out = {"type": "object", "properties": properties, "additionalProperties": False, "required": required}
    return _with_description(out, node, path)


def _required(raw: Any, properties: dict[str, Any], path: str) -> list[str]:
    if raw is None:
        return list(properties)
    if not isinstance(raw, (list, tuple)):
        raise _fail(f"{path}.required", f"expected a list of strings, got {describe(raw)}")
    seen: set[str] = set()
    for i, name in enumerate(raw):
        if not isinstance(name, str):
            raise _fail(f"{path}.required[{i}]", f"expected a string, got {describe(name)}")
        if name not in properties:
            raise _fail(f"{path}.required", f"{name!r} is not a property of the object")
        if name in seen:
            raise _fail(f"{path}.required", f"{name!r} is listed twice")
        seen.add(name)
    if len(seen) != len(properties):
        missing = ", ".join(repr(name) for name in properties if name not in seen)
        raise _fail(f"{path}.required", f"a strict schema must require every property; missing {missing}")
    return list(properties)


def _string(node: dict[str, Any], path: str, top: bool) -> dict[str, Any]:
    out = _with_description({"type": "string"}, node, path)
    pattern = _optional_str(node, "pattern", path)
    if pattern is not None:
        out["pattern"] = pattern
    if node.get("format") is not None:
        out["format"] = _unit_variant(node["format"], FORMATS, f"{path}.format", empty_map_is_unit=True)
    enum = node.get("enum")
    if enum is not None:
        if not isinstance(enum, (list, tuple)):
            raise _fail(f"{path}.enum", f"expected a list of strings, got {describe(enum)}")
        for i, item in enumerate(enum):
            if not isinstance(item, str):
                raise _fail(f"{path}.enum[{i}]", f"expected a string, got {describe(item)}")
        out["enum"] = list(enum)
    return out


def _numeric(kind: str) -> Any:
    def build(node: dict[str, Any], path: str, top: bool) -> dict[str, Any]:
        out = _with_description({"type": kind}, node, path)
        for slot in NUMBER_SLOTS:
            value = node.get(slot)
            if value is None:
                continue
            if kind == "integer":
                ok = isinstance(value, int) and not isinstance(value, bool) and I64[0] <= value <= I64[1]
                expected = "an integer in the i64 range"
            else:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                expected = "a number"
            if not ok:
                raise _fail(f"{path}.{slot}", f"expected {expected}, got {describe(value)}")
            out[slot] = value
        return out

    return build


def _array(node: dict[str, Any], path: str, top: bool) -> dict[str, Any]:
    if "items" not in node:
        raise _fail(path, "an array schema needs `items`")
    out = {"type": "array", "items": _schema(node["items"], f"{path}.items")}
    return _with_description(out, node, path)


def _plain(kind: str) -> Any:
    def build(node: dict[str, Any], path: str, top: bool) -> dict[str, Any]:
        return _with_description({"type": kind}, node, path)

    return build


_TYPED = {
    "object": _object,
    "string": _string,
    "number": _numeric("number"),
    "integer": _numeric("integer"),
    "boolean": _plain("boolean"),
    "null": _plain("null"),
    "array": _array,
}
