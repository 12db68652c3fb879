"""JSON Schema helpers: pydantic's schema -> a self-contained, strict-mode compatible schema.

Why a rewrite is needed: strict mode (OpenAI's `strict: true`, and the DeepSeek renderer's
strict normalisation, ENCODING.md §2.6) wants every object closed (`additionalProperties:
false`) with every property required, and the DeepSeek normaliser drops `$defs`, which would
leave `$ref`s dangling. So references are inlined, optional fields become required-but-nullable
(a `null` from the model means "use the default"), and pydantic's `title` noise is removed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import AgentConfigError


def inline_refs(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """Replace every local `#/$defs/X` reference by its definition; recursive models are refused."""
    defs = schema.get("$defs", {})

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(item, stack) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if not ref.startswith("#/$defs/") or name not in defs:
                raise AgentConfigError(f"{where}: unsupported schema reference {ref!r}")
            if name in stack:
                raise AgentConfigError(
                    f"{where}: recursive type {name!r} cannot be inlined; tool and output schemas "
                    "must be finite (no self-referencing models)"
                )
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return walk(merged, (*stack, name))
        return {k: walk(v, stack) for k, v in node.items() if k != "$defs"}

    return walk(schema, ())


def strip_titles(node: Any) -> Any:
    """Drop pydantic's auto-generated `title`s (they cost prompt tokens and say nothing)."""
    if isinstance(node, list):
        return [strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        # A property *named* "title" lives under "properties": keep it, recurse into it.
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = strip_titles(value)
    return out


def _allows_null(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(isinstance(s, dict) and _allows_null(s) for s in schema.get("anyOf", []))


def make_strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Close every object and require all its properties; formerly optional ones become nullable.

    A `default` is moved into the description, since strict mode has no `default` keyword.
    """
    node = copy.deepcopy(schema)
    for key in ("items", "additionalItems", "not"):
        if isinstance(node.get(key), dict):
            node[key] = make_strict(node[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [make_strict(s) if isinstance(s, dict) else s for s in node[key]]
    if node.get("type") == "object" or "properties" in node:
        props = node.get("properties", {})
        required = set(node.get("required", []))
        new_props = {}
        for name, sub in props.items():
            sub = make_strict(sub)
            if name not in required:
                default = sub.pop("default", None)
                note = f"Default: {json.dumps(default, ensure_ascii=False)}."
                description = sub.pop("description", None)
                if not _allows_null(sub):
                    sub = {"anyOf": [sub, {"type": "null"}]}
                sub["description"] = f"{description} {note}" if description else note
            else:
                sub.pop("default", None)
            new_props[name] = sub
        # The DeepSeek normaliser's key order (ENCODING.md §2.6), so the prompt shows this schema.
        rest = {
            k: v
            for k, v in node.items()
            if k not in ("type", "properties", "additionalProperties", "required")
        }
        node = {
            "type": "object",
            "properties": new_props,
            "additionalProperties": False,
            "required": list(new_props),
            **rest,
        }
    return node


def drop_defaulted_nulls(value: Any, loose: dict[str, Any]) -> Any:
    """Undo `make_strict` on a value: a `null` for an optional, non-nullable field means "default"."""
    if isinstance(value, list) and isinstance(loose.get("items"), dict):
        return [drop_defaulted_nulls(v, loose["items"]) for v in value]
    if not isinstance(value, dict) or "properties" not in loose:
        return value
    props, required = loose["properties"], set(loose.get("required", []))
    out = {}
    for key, item in value.items():
        sub = props.get(key)
        if sub is None:
            out[key] = item
        elif item is None and key not in required and not _allows_null(sub):
            continue
        else:
            out[key] = drop_defaulted_nulls(item, sub)
    return out


def clean_model_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """pydantic `model_json_schema()` -> self-contained schema without titles (not yet strict)."""
    return strip_titles(inline_refs(schema, where))
