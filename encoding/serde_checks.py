"""Field type checks that mirror the official renderer's request deserialisation.

The official renderer deserialises the request body into typed structs before converting it;
a wrong type there is reported without an HTTP status (`status_code=None`), unlike the
semantic checks that follow (400). These helpers keep that split explicit: each raises an
`EncodingError` with `status_code=None` naming the field, what was expected and what was found.
"""

from __future__ import annotations

import struct
from typing import Any

from .errors import EncodingError

_MISSING = object()


def body_error(path: str, message: str) -> EncodingError:
    return EncodingError(f"invalid request body: {path}: {message}", status_code=None)


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def expect_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise body_error(path, f"expected an object, got {describe(value)}")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise body_error(path, f"expected an array, got {describe(value)}")
    return list(value)


def required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise body_error(path, f"missing field `{key}`")
    return obj[key]


def expect_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise body_error(path, f"expected a string, got {describe(value)}")
    return value


def optional_str(value: Any, path: str) -> str | None:
    return None if value is None else expect_str(value, path)


def optional_bool(value: Any, path: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise body_error(path, f"expected a boolean, got {describe(value)}")
    return value


def optional_uint(value: Any, path: str, bits: int) -> int | None:
    """An unsigned integer field (u8/u32/u64): floats such as `1.0` are refused, like serde."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise body_error(path, f"expected u{bits}, got {describe(value)}")
    if not 0 <= value < 2**bits:
        raise body_error(path, f"invalid value: integer `{value}`, expected u{bits}")
    return value


def optional_f32(value: Any, path: str) -> float | None:
    """A 32-bit float field; the value is rounded to f32 as the range checks see it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise body_error(path, f"expected f32, got {describe(value)}")
    return to_f32(float(value))


def to_f32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def expect_enum(value: Any, path: str, variants: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in variants:
        names = ", ".join(f"`{v}`" for v in variants)
        raise body_error(path, f"unknown variant {describe(value)}, expected one of {names}")
    return value
