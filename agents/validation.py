"""JSON Schema validation as the schema declares it, checked once when the agent is built.

Why a module of its own: a schema is validated by the rules of its own `$schema` (draft 4 to
2020-12; 2020-12 when absent), with `format` asserted (jsonschema's format checkers; the
format-nongpl extra supplies uri, date-time, hostname, duration ...), its patterns read as ECMA-262
(ecma_regex.py), and its references resolved
inside the document only (`$defs`, `$id`'d resources, URNs, `$anchor`, `$dynamicRef`) plus the
drafts' own meta-schemas, which ship with jsonschema. Every reference is resolved up front, so a
remote or dangling one is an `AgentConfigError` at setup, never an exception in the middle of a
run. Model output is parsed with NaN and Infinity refused: they are not JSON, and Python's
parser would otherwise hand them to the schema as numbers; so is a number beyond a double's
range (1e400), which it would read as infinity.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urldefrag, urljoin

import jsonschema
from jsonschema import validators
from jsonschema.protocols import Validator
from jsonschema_specifications import REGISTRY as METASCHEMAS
from referencing import Registry, Resource
from referencing.exceptions import NoSuchAnchor, NoSuchResource, PointerToNowhere, Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with
from sglang_ds41.encoding import json_text

from . import ecma_regex
from .bounded_search import Uncheckable
from .errors import AgentConfigError
from .formats import format_checker

_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


class NotJSON(ValueError):
    """Text that is not a JSON value (including NaN / Infinity, which JSON does not have)."""


def loads_strict(text: str) -> Any:
    """`json.loads` that refuses NaN, Infinity and -Infinity, a number too large for a double
    (1e400, which Python would read as infinity), nesting deeper than serde_json's limit
    (`json_text.MAX_DEPTH`, which also keeps the schema validator within Python's recursion
    limit) and strings with a lone surrogate, by the encoding's own rules; integers stay Python
    integers (raises `NotJSON`)."""
    try:
        value = json.loads(
            text,
            parse_constant=json_text.reject_constant,
            parse_float=json_text.finite_float,
            parse_int=json_text.whole_int,
        )
    except json_text.JsonTextError as error:
        raise NotJSON(str(error)) from None
    except json.JSONDecodeError as error:
        raise NotJSON(f"{error.msg} at position {error.pos}") from None
    except RecursionError:  # past Python's own limit (~1,000 levels)
        raise NotJSON(json_text.TOO_DEEP) from None
    try:  # depth and lone surrogates ("\\ud800", which pattern checks cannot read), by serde's rules
        json_text.check_value(value, whole_ints=True)
    except json_text.JsonTextError as error:
        raise NotJSON(str(error)) from None
    return value


@dataclass(frozen=True)
class SchemaValidator:
    """A schema compiled for its declared draft, with every reference already resolved."""

    schema: Any
    draft: str
    _validator: Validator

    @classmethod
    def compile(cls, schema: Any, where: str, *, assert_formats: bool = True) -> SchemaValidator:
        """Check `schema` and its references; `where` names it in errors ("tool 'x' parameters").

        `assert_formats=False` treats `format` as an annotation, as draft 2020-12 does by
        default; the runner always asserts it (an answer whose "date" is no date is wrong).
        """
        if not isinstance(schema, dict | bool):
            raise AgentConfigError(
                f"{where}: a JSON Schema is an object or a boolean, got {type(schema).__name__}"
            )
        validator_class = _validator_class(schema, where)
        try:
            validator_class.check_schema(schema, format_checker=format_checker(validator_class))
        except jsonschema.SchemaError as error:
            at = _pointer(error.absolute_path)
            raise AgentConfigError(
                f"{where}: not a valid {_draft_name(validator_class)} schema at {at}: {error.message}"
            ) from None
        registry = _registry(schema, validator_class)
        _check_references(schema, validator_class, registry, where)
        checker = format_checker(validator_class) if assert_formats else None
        validator = _ecma(validator_class)(schema, registry=registry, format_checker=checker)
        return cls(schema, _draft_name(validator_class), validator)

    def problems(self, instance: Any) -> list[jsonschema.ValidationError]:
        """Every way `instance` fails the schema, in document order of where it fails."""
        try:
            errors = list(self._validator.iter_errors(instance))
        except Uncheckable as error:  # a pattern search given up (ecma_regex.search): one reason
            return [jsonschema.ValidationError(str(error))]
        return sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])


@cache
def _ecma(validator_class: type[Validator]) -> type[Validator]:
    """The draft's validator with its regular expressions read as ECMA-262 (ecma_regex.py)."""
    keywords = dict(ecma_regex.KEYWORDS)
    if "unevaluatedProperties" in validator_class.VALIDATORS:
        keywords |= ecma_regex.UNEVALUATED
    return validators.extend(validator_class, keywords)


def _validator_class(schema: Any, where: str) -> type[Validator]:
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is None:
        return jsonschema.Draft202012Validator
    if not isinstance(declared, str):
        raise AgentConfigError(f"{where}: $schema must be a string, got {type(declared).__name__}")
    found = validators.validator_for({"$schema": declared}, default=None)
    if found is None:
        known = ", ".join(sorted({v.META_SCHEMA["$schema"] for v in _DRAFTS}))
        raise AgentConfigError(f"{where}: unknown $schema {declared!r}; known drafts: {known}")
    return found


_DRAFTS = (
    jsonschema.Draft4Validator,
    jsonschema.Draft6Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft201909Validator,
    jsonschema.Draft202012Validator,
)


def _draft_name(validator_class: type[Validator]) -> str:
    digits = validator_class.__name__.removeprefix("Draft").removesuffix("Validator")
    return f"draft {digits[:4]}-{digits[4:]}" if len(digits) == 6 else f"draft {digits}"


def _registry(schema: Any, validator_class: type[Validator]) -> Registry[Any]:
    """The schema's own resources and the meta-schemas; retrieving anything else is refused."""
    spec = specification_with(validator_class.META_SCHEMA["$schema"], default=DRAFT202012)
    root = spec.create_resource(schema)
    base = (root.id() or "").rstrip("#")
    return Registry().combine(METASCHEMAS).with_resource(base, root).crawl()


def _check_references(
    schema: Any, validator_class: type[Validator], registry: Registry[Any], where: str
) -> None:
    spec = specification_with(validator_class.META_SCHEMA["$schema"], default=DRAFT202012)
    root = spec.create_resource(schema)
    base = (root.id() or "").rstrip("#")
    for node, node_base, path in _subschemas(root, base, ()):
        for key in _REFERENCES:
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            at = _pointer([*path, key])
            document, _ = urldefrag(ref)
            absolute = urljoin(node_base, document).rstrip("#")
            if document and absolute not in registry:
                raise AgentConfigError(
                    f"{where}: {key} {ref!r} at {at} names {absolute!r}, a document outside the "
                    "schema; remote references are never fetched (embed that document in the schema "
                    "with its $id)"
                )
            try:
                registry.resolver(base_uri=node_base).lookup(ref)
            except PointerToNowhere as error:
                raise AgentConfigError(
                    f"{where}: {key} {ref!r} at {at}: pointer {error.ref!r} leads nowhere"
                ) from None
            except NoSuchAnchor as error:
                raise AgentConfigError(
                    f"{where}: {key} {ref!r} at {at}: no anchor {error.anchor!r}"
                ) from None
            except (Unresolvable, NoSuchResource, ValueError):
                raise AgentConfigError(f"{where}: {key} {ref!r} at {at} does not resolve") from None


def _subschemas(
    resource: Resource[Any], base: str, path: tuple[Any, ...]
) -> Iterator[tuple[dict[str, Any], str, tuple[Any, ...]]]:
    """Every subschema (the draft's applicator and definition keywords), its base URI and path."""
    contents = resource.contents
    if not isinstance(contents, dict):
        return
    yield contents, base, path
    subs = {id(sub.contents): sub for sub in resource.subresources() if isinstance(sub.contents, dict)}
    for key, value in contents.items():
        if isinstance(value, dict):
            children = [(value, (key,)), *((v, (key, k)) for k, v in value.items())]
        elif isinstance(value, list):
            children = [(v, (key, i)) for i, v in enumerate(value)]
        else:
            continue
        for child, step in children:
            sub = subs.pop(id(child), None)
            if sub is not None:
                child_base = urljoin(base, sub.id()).rstrip("#") if sub.id() else base
                yield from _subschemas(sub, child_base, (*path, *step))


def _pointer(path: Any) -> str:
    return "/" + "/".join(str(p) for p in path) if path else "(root)"
