"""Arithmetic for calculator tools, safe on model output: numbers, + - * / ** and parentheses.

An expression a model writes is untrusted text. It is parsed, never eval'ed, and what it may
cost is bounded before it is computed: `9 ** 9 ** 9 ** 9` would otherwise run for hours inside
one call of Python's integer power, which holds the interpreter lock, so no tool timeout could
stop it (a thread cannot be interrupted, and the event loop that would time it out never runs
again). Integers stay exact up to `MAX_INT_BITS`; a power whose result would be larger, a float
that overflows, a complex result and a division by zero are refused with a message that tells
the model what was wrong (`ExpressionError`, which the agent runner hands back as the tool's
result).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_LENGTH = 1_000  # characters: also bounds how deeply an expression can nest
MAX_INT_BITS = 4_096  # an integer's size, about 1,233 decimal digits

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ALLOWED = "numbers, + - * / ** and parentheses"
TOO_LARGE_FOR_FLOAT = "a number in the calculation is too large for a float"


class ExpressionError(ValueError):
    """An expression refused, or one without a finite real value; the message says which."""


def evaluate(expression: str) -> Number:
    """The value of `expression`: an int when every step is exact in integers, else a float."""
    if not isinstance(expression, str):
        raise ExpressionError(f"expected the expression as a string, got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise ExpressionError(f"the expression has {len(expression):,} characters; at most {MAX_LENGTH:,}")
    text = expression.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        reason = getattr(error, "msg", None) or str(error) or type(error).__name__
        raise ExpressionError(f"{_quoted(text)} is not an arithmetic expression ({reason})") from None
    try:
        return _value(tree.body, text)
    except RecursionError:
        raise ExpressionError("the expression is nested too deeply") from None
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except OverflowError:
        raise ExpressionError(TOO_LARGE_FOR_FLOAT) from None


def _value(node: ast.expr, text: str) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand, text)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, text), _value(node.right, text)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    found = ast.get_source_segment(text, node) or type(node).__name__
    raise ExpressionError(f"only {ALLOWED} are allowed; found {_quoted(found)}")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse an integer power whose result is certainly over MAX_INT_BITS, before computing it
    (a float power overflows by itself, quickly)."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        at_least = (abs(base).bit_length() - 1) * exponent
        if at_least > MAX_INT_BITS:
            power = f"{_described(base)} ** {_described(exponent)}"
            raise ExpressionError(f"{power} would have more than {MAX_INT_BITS:,} bits; too large")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ExpressionError("the result is not a real number (a negative number to a fractional power)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(TOO_LARGE_FOR_FLOAT)
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"an integer in the calculation has more than {MAX_INT_BITS:,} bits; too large")
    return value


def _described(number: int) -> str:
    return str(number) if number.bit_length() <= 64 else f"a {number.bit_length():,}-bit integer"


def _quoted(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
