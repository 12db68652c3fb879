"""Which `$ref`s the official renderer resolves when it compiles a schema, and whether they resolve.

The official renderer compiles each schema with a JSON Schema validator that has no network and
no other documents than the schema itself and its own draft's meta-schemas. It refuses a schema
in two passes (characterised black-box against deepseek-recipe 0.2.0, on the JSON-Schema-Test-Suite
and on probes):

1. *Registry*: every `$ref` in a subschema (the draft's applicator and definition keywords, so
   `$defs` count and `enum` values or unknown keywords do not) that names another document must
   name one the registry holds: the schema's own embedded resources (`$id`, URNs included) or a
   meta-schema of the schema's draft. `$dynamicRef` is not looked at in this pass.
2. *Compile*: starting at the root and following references, every keyword the validator
   compiles for that draft must resolve its `$ref` (and, in 2020-12, its `$dynamicRef`): the
   document must exist, a JSON pointer must point somewhere, an anchor (`$anchor`,
   `$dynamicAnchor`, or a legacy `#name` id) must be defined. Not compiled, so never resolved:
   `$defs`/`definitions` not referenced, `contentSchema`, `if` without `then`/`else` (and
   `then`/`else` without `if`), `additionalItems` without an array `items`, `$recursiveRef`, and in
   draft 7 and older everything beside a `$ref`.

Base URIs, embedded resources and anchors are the `referencing` package's (jsonschema's own
resolver), so `$id` scoping follows each draft's rules.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urldefrag, urljoin

from jsonschema_specifications import REGISTRY as METASCHEMAS
from referencing import Registry, Resource, Specification
from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unresolvable
from referencing.jsonschema import DRAFT4, DRAFT6, DRAFT7, DRAFT201909, DRAFT202012, specification_with

# Where each draft's meta-schemas live; the official registry holds only the schema's own draft's.
_METASCHEMA_PREFIX = {
    DRAFT4.name: "http://json-schema.org/draft-04/",
    DRAFT6.name: "http://json-schema.org/draft-06/",
    DRAFT7.name: "http://json-schema.org/draft-07/",
    DRAFT201909.name: "https://json-schema.org/draft/2019-09/",
    DRAFT202012.name: "https://json-schema.org/draft/2020-12/",
}
_LEGACY = (DRAFT4.name, DRAFT6.name, DRAFT7.name)  # `$ref` overrides its siblings
_FROM_6 = (DRAFT6.name, DRAFT7.name, DRAFT201909.name, DRAFT202012.name)
_FROM_7 = (DRAFT7.name, DRAFT201909.name, DRAFT202012.name)
_FROM_2019 = (DRAFT201909.name, DRAFT202012.name)


class _Refused(Exception):
    """One reference that does not resolve; its message is the request error's text."""


def reference_problem(schema: dict[str, Any]) -> str | None:
    """Why a (meta-schema valid) schema's references keep the official renderer from compiling it."""
    spec = specification_with(schema.get("$schema", ""), default=DRAFT202012)
    root = spec.create_resource(schema)
    registry = _registry(root, spec)
    try:
        _check_documents(root, root.id() or "", registry)
        _compile(schema, registry.resolver(base_uri=(root.id() or "").rstrip("#")), spec, set())
    except _Refused as refused:
        return str(refused)
    except RecursionError:
        return "the schema nests too deeply to be compiled"
    return None


def _registry(root: Resource[Any], spec: Specification[Any]) -> Registry[Any]:
    prefix = _METASCHEMA_PREFIX[spec.name]
    metas = [(uri, METASCHEMAS[uri]) for uri in METASCHEMAS if uri.startswith(prefix)]
    return Registry().with_resources([*metas, (root.id() or "", root)]).crawl()


def _check_documents(resource: Resource[Any], base: str, registry: Registry[Any]) -> None:
    """Pass 1: `$id`s and `$ref`s are URI references; a `$ref` to another document must name one
    the registry holds."""
    contents = resource.contents
    if isinstance(contents, dict):
        for key in ("$id", "$ref"):
            if isinstance(contents.get(key), str):
                _check_uri_reference(contents[key])
    if isinstance(contents, dict) and isinstance(contents.get("$ref"), str):
        document, _ = urldefrag(contents["$ref"])
        if document:
            uri = urljoin(base, document).rstrip("#")
            if uri not in registry:
                raise _Refused(f"Resource {uri!r} is not present in a registry and retrieving it failed")
    for sub in resource.subresources():
        _check_documents(sub, urljoin(base, sub.id()) if sub.id() else base, registry)


# RFC 3986's characters; a scheme starts with a letter and holds letters, digits, + - . only.
_URI_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*")


def _check_uri_reference(text: str) -> None:
    bad = _URI_CHARS.match(text).end()  # type: ignore[union-attr]
    if bad < len(text):
        raise _Refused(f"Invalid URI reference {text!r}: unexpected character at index {bad}")
    head = re.split(r"[/?#]", text, maxsplit=1)[0]
    if ":" in head and not _SCHEME.fullmatch(head.partition(":")[0]):
        raise _Refused(f"Invalid URI reference {text!r}: a scheme must start with a letter")


def _compile(node: Any, resolver: Any, spec: Specification[Any], seen: set[int]) -> None:
    """Pass 2: resolve every reference on the paths the validator compiles.

    `resolver` is already in `node`'s scope (its `$id`, if any, applied).
    """
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen.add(id(node))
    spec = _spec_of(node, spec)
    name = spec.name
    refs = ["$ref"] + (["$dynamicRef"] if name == DRAFT202012.name else [])
    for key in refs:
        if isinstance(node.get(key), str):
            resolved = _lookup(resolver, node[key])
            target_spec = _spec_of(resolved.contents, spec)
            _compile(resolved.contents, resolved.resolver, target_spec, seen)
    if name in _LEGACY and isinstance(node.get("$ref"), str):
        return
    for child in _compiled_children(node, name):
        child_spec = _spec_of(child, spec)
        _compile(child, resolver.in_subresource(child_spec.create_resource(child)), child_spec, seen)


def _lookup(resolver: Any, ref: str) -> Any:
    try:
        return resolver.lookup(ref)
    except PointerToNowhere as error:
        raise _Refused(f"Pointer {error.ref!r} does not exist") from None
    except NoSuchAnchor as error:
        raise _Refused(f"Anchor {error.anchor!r} does not exist") from None
    except ValueError:  # a pointer step into a list that is not a number
        raise _Refused(f"Pointer {ref.partition('#')[2]!r} does not exist") from None
    except Unresolvable:
        raise _Refused(f"Resource {ref!r} is not present in a registry and retrieving it failed") from None


def _spec_of(contents: Any, default: Specification[Any]) -> Specification[Any]:
    if isinstance(contents, dict) and "$schema" in contents:
        return specification_with(contents["$schema"], default=default)
    return default


def _compiled_children(node: dict[str, Any], draft: str) -> list[Any]:
    """The subschemas the validator compiles for this node under `draft`'s keywords."""
    out: list[Any] = []
    for key in ("properties", "patternProperties"):
        if isinstance(node.get(key), dict):
            out.extend(node[key].values())
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            out.extend(node[key])
    out += [node.get("additionalProperties"), node.get("not")]
    items = node.get("items")
    out.extend(items if isinstance(items, list) else [items])
    if isinstance(items, list):
        out.append(node.get("additionalItems"))
    if isinstance(node.get("dependencies"), dict):
        out.extend(node["dependencies"].values())
    if draft in _FROM_6:
        out += [node.get("contains"), node.get("propertyNames")]
    if draft in _FROM_7 and "if" in node and ("then" in node or "else" in node):
        out += [node.get("if"), node.get("then"), node.get("else")]
    if draft in _FROM_2019:
        if isinstance(node.get("dependentSchemas"), dict):
            out.extend(node["dependentSchemas"].values())
        out += [node.get("unevaluatedItems"), node.get("unevaluatedProperties")]
    if draft == DRAFT202012.name and isinstance(node.get("prefixItems"), list):
        out.extend(node["prefixItems"])
    return [child for child in out if isinstance(child, dict)]
