"""JSON Schema's regular expressions with the semantics the schema means: ECMA-262's.

Why: `pattern`, `patternProperties` and the `regex` format name ECMA-262 regular expressions,
with the "u" flag (JSON Schema 2020-12: Validation section 6.3.3, Core section 6.4). Python's `re` is
another dialect: its `\\d`, `\\w` and `\\s` take any Unicode digit, letter or space, and it
refuses valid ECMA patterns (`\\p{Letter}`, `\\cC`) while taking ones ECMA does not have
(`\\Z`, `(?P<name>...)`). The server's grammar reads the schema as ECMA-262, so the client
does too: `regress` (bindings to a Rust ECMA-262 engine). jsonschema calls `re.search` in four
keywords (`pattern`, `patternProperties`, and the properties `additionalProperties` and
`unevaluatedProperties` leave to patterns); `KEYWORDS` replaces them with ECMA-262 ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import regress
from jsonschema import ValidationError
from jsonschema.protocols import Validator
from sglang_ds41.encoding.json_text import lone_surrogate_at

from . import bounded_search

FLAGS = "u"  # Unicode mode: code points, \p{...} properties, strict escapes


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> regress.Regex | None:
    """The pattern compiled as ECMA-262 with the "u" flag; None when it is not one."""
    try:
        return regress.Regex(pattern, FLAGS)
    except (regress.RegressError, UnicodeEncodeError):  # a lone surrogate is no UTF-8 pattern
        return None


def is_pattern(text: str) -> bool:
    """Whether `text` is an ECMA-262 regular expression (the `regex` format)."""
    return compiled(text) is not None


def search(pattern: str, text: str) -> bool:
    """Whether the pattern matches anywhere in `text` (JSON Schema patterns are not anchored).
    The text is the model's, and a backtracking pattern can take exponential time on it, so the
    search runs in a child process that is stopped after `bounded_search.TIMEOUT_S`. Raises
    `bounded_search.Uncheckable` for that, and for a text with a lone surrogate, which the UTF-8
    engine cannot read (`loads_strict` refuses such JSON first): the validation as a whole then
    fails with that one reason, which no `not`, `oneOf` or `if` around the pattern can turn into
    a pass. A pattern that does not compile matches nothing (the schema check refuses it first)."""
    if compiled(pattern) is None:
        return False
    at = lone_surrogate_at(text)
    if at is not None:
        problem = f"{_shown(text)} has a lone surrogate at index {at}; no pattern can read it"
        raise bounded_search.Uncheckable(problem)
    try:
        return bounded_search.search(pattern, text, FLAGS)
    except bounded_search.Uncheckable as error:
        problem = f"{_shown(text)} could not be checked against {pattern!r}: {error}"
        raise bounded_search.Uncheckable(problem) from None


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Validator, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _by_pattern(schema: Any, key: str) -> bool:
    patterns = schema.get("patternProperties", {}) if isinstance(schema, dict) else {}
    return any(search(pattern, key) for pattern in patterns)


def _additional_properties(
    validator: Validator, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    declared = schema.get("properties", {})
    extras = sorted((k for k in instance if k not in declared and not _by_pattern(schema, k)), key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(extra) for extra in extras)
        yield ValidationError(f"Additional properties are not allowed ({names} unexpected)")


def _unevaluated_properties(
    validator: Validator, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    failing = [
        key
        for key in instance
        if key not in evaluated
        and next(validator.descend(instance[key], unevaluated, path=key, schema_path=key), None) is not None
    ]
    if failing:
        names = ", ".join(repr(key) for key in sorted(failing, key=str))
        if unevaluated is False:
            yield ValidationError(f"Unevaluated properties are not allowed ({names} unexpected)")
        else:
            yield ValidationError(f"Unevaluated properties are not valid under the given schema ({names})")


def _evaluated_keys(validator: Validator, instance: dict[str, Any], schema: Any) -> set[str]:
    """The instance's keys some keyword of `schema` (or of a subschema that applies to the
    instance, through references, combinators and conditionals) evaluates successfully."""
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
        ref = schema.get(keyword)
        if isinstance(ref, str):
            resolved = validator._resolver.lookup(ref)  # type: ignore[attr-defined]
            inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(inner, instance, resolved.contents)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        keys |= properties.keys() & instance.keys()
    keys |= {key for key in instance if _by_pattern(schema, key)}
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if keyword in schema:
            keys |= {k for k, v in instance.items() if _valid(validator, v, schema[keyword])}
    for key, subschema in (schema.get("dependentSchemas") or {}).items():
        if key in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "anyOf", "oneOf"):
        for subschema in schema.get(keyword, ()):
            if _valid(validator, instance, subschema):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if _valid(validator, instance, schema["if"]):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            keys |= _evaluated_keys(validator, instance, schema.get("then"))
        else:
            keys |= _evaluated_keys(validator, instance, schema.get("else"))
    return keys


def _valid(validator: Validator, instance: Any, subschema: Any) -> bool:
    return next(validator.descend(instance, subschema), None) is None


KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}
# Only the drafts that have the keyword get it (2019-09 and 2020-12).
UNEVALUATED = {"unevaluatedProperties": _unevaluated_properties}
