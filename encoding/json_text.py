"""JSON with the official renderer's number and key semantics (ENCODING.md §2.6).

The renderer parses JSON with serde_json and prints it the way Python's
`json.dumps(obj, ensure_ascii=False)` does. The differences from plain `json.loads` that
change a prompt:

* integers within [-2**63, 2**64 - 1] stay integers; any other integer literal, `-0` and every
  literal with a fraction or exponent become a float (printed with `repr`: `1.50` -> `1.5`,
  `1e3` -> `1000.0`, `-0` -> `-0.0`, a 30-digit integer -> `1e+29`);
* a number that overflows a double (`1e400`), `NaN`/`Infinity`, lone surrogates and nesting
  deeper than 128 levels are errors;
* a duplicated key keeps its first position and its last value (what a Python dict does).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
MAX_DEPTH = 128
TOO_DEEP = f"JSON nested deeper than {MAX_DEPTH} levels"


class JsonTextError(ValueError):
    """The text is not JSON that serde_json would accept."""


def _parse_int(text: str) -> int | float:
    value = int(text)
    if value == 0 and text.startswith("-"):
        return -0.0
    if INT_MIN <= value <= INT_MAX:
        return value
    return finite_float(text)


def whole_int(text: str) -> int:
    """A JSON integer as a Python int of any size Python reads, for callers that keep big
    integers (the agent runner); one longer than Python's digit limit is an error, not a crash."""
    try:
        return int(text)
    except ValueError:
        limit = sys.get_int_max_str_digits()
        digits = len(text.lstrip("-"))
        raise JsonTextError(f"an integer of {digits:,} digits (at most {limit:,} are read)") from None


def finite_float(text: str) -> float:
    """`json.loads`' `parse_float`: a number a double holds; one that would read as infinity
    (`1e400`) is refused. The agent runner parses model output with it too."""
    value = float(text)
    if math.isinf(value):
        raise JsonTextError(
            f"the number {text[:40]} is beyond the range of a double (it would read as infinity)"
        )
    return value


def reject_constant(name: str) -> Any:
    """`json.loads`' `parse_constant`: NaN, Infinity and -Infinity are not JSON."""
    raise JsonTextError(f"{name} is not a JSON number")


def loads(text: str | bytes) -> Any:
    """Parse JSON text with serde semantics; raises JsonTextError when serde would refuse it."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise JsonTextError(f"not UTF-8: {error}") from None
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=finite_float,
            parse_constant=reject_constant,
        )
    except JsonTextError:
        raise
    except (ValueError, RecursionError) as error:
        raise JsonTextError(str(error)) from None
    check_value(value)
    return value


def check_value(value: Any, depth: int = 0, *, whole_ints: bool = False) -> None:
    """Raise JsonTextError unless `value` is a JSON value serde would hold.

    Used both after `loads` (surrogates, depth) and for request bodies given as Python
    objects, where big integers, NaN and non-string keys can appear directly. `whole_ints`
    lets integers of any size through, for the agent runner, which keeps them (`whole_int`).
    It recurses no deeper than MAX_DEPTH, so it also checks a value `json.loads` read from
    model output nested past what a recursive walk could otherwise follow.
    """
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not whole_ints and not INT_MIN <= value <= INT_MAX:
            raise JsonTextError(f"integer {value} is outside the JSON number range")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JsonTextError(f"{value} is not a finite JSON number")
        return
    if isinstance(value, str):
        _check_string(value)
        return
    if depth >= MAX_DEPTH:
        raise JsonTextError(TOO_DEEP)
    if isinstance(value, (list, tuple)):
        for item in value:
            check_value(item, depth + 1, whole_ints=whole_ints)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise JsonTextError(f"JSON object keys must be strings, got {type(key).__name__}")
            _check_string(key)
            if type(item) is str:  # the common leaf, checked without a call per value
                _check_string(item)
            else:
                check_value(item, depth + 1, whole_ints=whole_ints)
        return
    raise JsonTextError(f"{type(value).__name__} is not a JSON value")


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(text: str) -> int | None:
    """Where `text` holds a lone surrogate (a code point no UTF-8 text can carry), or None."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def _check_string(text: str) -> None:
    at = lone_surrogate_at(text)
    if at is not None:
        raise JsonTextError(f"lone surrogate U+{ord(text[at]):04X} at index {at} of a JSON string")


def dumps(value: Any) -> str:
    """Serialize like Python `json.dumps(value, ensure_ascii=False)` (separators `, ` / `: `)."""
    return json.dumps(value, ensure_ascii=False)


def dumps_compact(value: Any) -> str:
    """Serialize without spaces, for places where only equality of values matters."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
